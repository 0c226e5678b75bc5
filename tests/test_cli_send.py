"""Sending from the command line: TEXT, ``-`` for stdin, ``--file``, a session that must exist."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_inbox.__main__ import main
from nous_inbox.cli.parser import build_parser
from nous_inbox.cli.text import MAX_TEXT_BYTES, message_text
from nous_inbox.cli.usage import UsageError
from nous_inbox.inbox import is_blank
from nous_inbox.message import Message
from nous_inbox.store import open_store

ROOT = Path(__file__).resolve().parent.parent
SENDS = ["steer", "inject", "followup", "prompt"]


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def stdin_of(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def queued(url: str, session: str = "s") -> list[str]:
    shown = json.loads(cli("show", "--store", url, session, "--json")[1])
    return [m["content"] for m in shown["next_turn"] + shown["next_step"]]


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store holding session ``s`` (one inject), so sends without ``--create`` find it."""
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    assert cli("inject", "--create", "--store", url, "s", "first")[0] == 0
    return url


@pytest.mark.parametrize("mode", SENDS)
def test_a_dash_reads_the_text_from_stdin(
    mode: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin_of(monkeypatch, "from stdin\nsecond line ✓\n".encode())
    assert cli(mode, "--store", url, "s", "-")[0] == 0
    assert sorted(queued(url)) == ["first", "from stdin\nsecond line ✓\n"]  # not a literal "-"


@given(st.text(min_size=1).filter(str.strip))
def test_any_text_that_says_something_comes_through_stdin_exactly(text: str) -> None:
    assert message_text(None, "-", io.BytesIO(text.encode())) == text


@given(st.text(alphabet=" \t\n\u00a0\u2003\u200b\u2060\ufeffx", max_size=4))
def test_a_text_is_refused_as_empty_exactly_when_the_core_counts_it_blank(text: str) -> None:
    # One blank rule (ruling 4): the command line asks the core rather than keep its own.
    blank = is_blank([Message.user(text)])
    try:
        message_text(None, "-", io.BytesIO(text.encode()))
    except UsageError as exc:
        assert blank and "empty" in str(exc)
    else:
        assert not blank


def test_a_200_kb_text_goes_through_stdin_of_a_real_process(url: str) -> None:
    text = ("a line of a long pasted log, " * 7 + "\n") * 1000  # about 200 KB
    assert len(text.encode()) > 200_000
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s", "-"],
        input=text, capture_output=True, text=True, cwd=ROOT, env=env,
    )
    assert done.returncode == 0, done.stderr
    assert queued(url)[-1] == text


def test_without_any_stdin_a_text_is_sent_and_a_dash_is_a_usage_error(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A process started with its stdin closed (a daemon's child, `<&-`) has no sys.stdin.
    monkeypatch.setattr(sys, "stdin", None)
    assert cli("steer", "--store", url, "s", "go")[0] == 0
    assert cli("steer", "--store", url, "s", "-")[0] == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "there is no stdin" in err
    assert queued(url) == ["first", "go"]


def test_file_reads_the_text_from_a_file(url: str, tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    note.write_text("read cdn.log next\n")
    assert cli("steer", "--store", url, "s", "--file", str(note))[0] == 0
    assert queued(url)[-1] == "read cdn.log next\n"


@pytest.mark.parametrize(
    ("argv", "data", "expected"),
    [
        (["s", "-"], b"x" * (MAX_TEXT_BYTES + 1), f"larger than {MAX_TEXT_BYTES:,} bytes"),
        (["s", "-"], b"caf\xe9", "not valid UTF-8 (at byte 3)"),
        (["s", "-"], b"  \n\t ", "empty"),
        (["s"], b"", "no message: give TEXT, - to read it from stdin, or --file PATH"),
        (["s", "text", "--file", "x"], b"", "give TEXT or --file PATH, not both"),
    ],
)
def test_a_text_that_cannot_be_sent_is_a_usage_error_naming_its_source(
    url: str, argv: list[str], data: bytes, expected: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stdin_of(monkeypatch, data)
    assert cli("steer", "--store", url, *argv)[0] == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err
    assert queued(url) == ["first"]  # nothing was sent


def test_a_file_that_is_not_there_is_a_data_error_naming_it(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.txt"
    assert cli("steer", "--store", url, "s", "--file", str(missing))[0] == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err


@pytest.mark.parametrize("mode", SENDS)
def test_a_send_to_a_session_that_does_not_exist_says_so_and_sends_nothing(
    mode: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(mode, "--store", url, "typo", "hello")[0] == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no session 'typo' in this store (nothing was sent; --create sends anyway" in err
    with open_store(url, read_only=True) as store:
        assert store.streams() == ["s"]


def test_a_send_to_a_store_that_does_not_exist_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.sqlite"
    assert cli("steer", "--store", f"sqlite:{missing}", "s", "hello")[0] == 1
    assert "--create starts the store" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mode", SENDS)
def test_create_starts_a_new_session(mode: str, url: str) -> None:
    status, text = cli(mode, "--create", "--store", url, "new", "hello")
    assert status == 0 and f"{mode} queued for 'new' as event #1" in text
    assert queued(url, "new") == ["hello"]


def test_a_prompt_is_stored_as_a_waking_next_turn_send(url: str) -> None:
    assert cli("prompt", "--store", url, "s", "survey the logs")[0] == 0
    shown = json.loads(cli("show", "--store", url, "s", "--json")[1])
    assert shown["next_turn"] == [{"role": "user", "content": "survey the logs", "wakeup": True}]


def _every_action(
    parser: argparse.ArgumentParser, path: str
) -> list[tuple[str, argparse.Action]]:
    # argparse offers no public walk of a parser's arguments: ``_actions`` is the only way in.
    found = []
    for action in parser._actions:
        found.append((path, action))
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found.append((f"{path} {choice.dest}", choice))
            for name, sub in action.choices.items():
                found.extend(_every_action(sub, f"{path} {name}"))
    return found


def test_every_argument_of_every_command_has_help() -> None:
    actions = _every_action(build_parser(), "nous-inbox")
    missing = [f"{path}: {action.dest}" for path, action in actions
               if not action.help or action.help == argparse.SUPPRESS]
    assert missing == []
    assert len(actions) > 50  # the walk reached every command's arguments
