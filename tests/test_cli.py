"""The ``nous-inbox`` command: exit statuses, one-line errors, the documented JSON, live sessions."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nous_inbox.cli import main
from nous_inbox.store import open_store

ROOT = Path(__file__).resolve().parent.parent


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:{tmp_path / 'inbox.sqlite'}"


def test_steer_inject_followup_then_show_json_prints_the_documented_shape(url: str) -> None:
    assert cli("inject", "--store", url, "s1", "fyi")[0] == 0
    assert cli("steer", "--store", url, "s1", "go")[0] == 0
    assert cli("followup", "--store", url, "s1", "later")[0] == 0
    status, text = cli("show", "--store", url, "s1", "--json")
    assert status == 0
    shown = json.loads(text)
    assert shown["next_turn"] == [{"role": "user", "content": "later", "wakeup": True}]
    assert shown["next_step"] == [
        {"role": "user", "content": "fyi", "wakeup": False},
        {"role": "user", "content": "go", "wakeup": True},
    ]
    assert shown["wants_wake"] is True


def test_show_log_and_sessions_read_what_was_appended(url: str) -> None:
    cli("steer", "--store", url, "alpha", "one")
    cli("inject", "--store", url, "beta", "two")
    status, text = cli("sessions", "--store", url)
    assert status == 0
    assert text.splitlines() == ["alpha\t1 events", "beta\t1 events"]
    status, text = cli("log", "--store", url, "alpha")
    assert status == 0 and "steer" in text and "one" in text
    status, text = cli("log", "--store", url, "alpha", "--json")
    (line,) = text.splitlines()
    assert json.loads(line)["type"] == "message_sent"
    status, text = cli("show", "--store", url, "beta")
    assert status == 0 and "fyi" not in text and "two" in text and "wants_wake: no" in text


def test_the_default_store_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOUS_INBOX_STORE", f"sqlite:{tmp_path / 'env.sqlite'}")
    assert cli("steer", "s", "hello")[0] == 0
    assert (tmp_path / "env.sqlite").exists()
    assert json.loads(cli("show", "s", "--json")[1])["next_step"][0]["content"] == "hello"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["steer", "only-a-session"],
        ["show"],
        ["run", "s", "--steps", "zero"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(*argv)[0] == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_empty_message_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("steer", "--store", url, "s", "   ")[0] == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "empty" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["show", "--store", "{url}", "nobody"], "no session 'nobody'"),
        (["log", "--store", "{url}", "nobody"], "no session 'nobody'"),
        (["show", "--store", "ftp:x", "s"], "ftp"),
        (["steer", "--store", "{url}", "", "text"], "stream"),
    ],
)
def test_data_errors_exit_1_with_one_line_and_no_traceback(
    url: str, argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = cli(*[a.replace("{url}", url) for a in argv])
    err = capsys.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err


def test_a_corrupt_log_is_a_data_error_naming_the_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.jsonl"
    url = f"file:{path}"
    cli("steer", "--store", url, "s", "one")
    cli("steer", "--store", url, "s", "two")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"seq":1', b'"seq":"x"')
    path.write_bytes(b"".join(lines))
    status, _ = cli("show", "--store", url, "s")
    err = capsys.readouterr().err
    assert status == 1 and "line 2" in err and "Traceback" not in err


def test_tour_walks_through_the_semantics() -> None:
    status, text = cli("tour")
    assert status == 0
    for needle in ("inject is inert", "steer wakes it", "followup waits", "ValueError"):
        assert needle in text


def test_demo_replays_equal_to_the_live_state(url: str) -> None:
    status, text = cli("demo", "--store", url, "--step-seconds", "0")
    assert status == 0, text
    assert "replayed" in text and "equal the live state" in text
    for mode in ("inject", "steer", "followup"):
        assert f"person > {mode}" in text
    (session,) = open_store(url).streams()
    assert session.startswith("demo-")


def test_run_can_be_steered_from_another_process(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        [sys.executable, "-m", "nous_inbox", "run", "--store", url, "s", "--json",
         "--steps", "6", "--step-seconds", "0.3"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )
    assert run.stdout is not None
    events = []
    for line in run.stdout:
        events.append(json.loads(line))
        if events[-1]["type"] == "tool_called":
            break
    steer = subprocess.run(
        [sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s", "read auth.log too"],
        capture_output=True, text=True, cwd=ROOT, env=env,
    )
    assert steer.returncode == 0, steer.stderr
    events.extend(json.loads(line) for line in run.stdout)
    assert run.wait(timeout=60) == 0
    replies = [e["message"]["content"] for e in events if e["type"] == "model_replied"]
    assert any("Noted: 'read auth.log too'" in r for r in replies)
    assert any(e["type"] == "message_sent" and e["message"]["content"] == "read auth.log too"
               for e in events)  # the running owner saw the other process's append


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_replay_draws_a_progress_bar_on_a_terminal_only() -> None:
    from nous_inbox.cli.progress import MIN_EVENTS, with_progress

    terminal, pipe = _Terminal(), io.StringIO()
    assert list(with_progress(range(MIN_EVENTS), MIN_EVENTS, "replaying", terminal)) == list(
        range(MIN_EVENTS)
    )
    assert list(with_progress(range(MIN_EVENTS), MIN_EVENTS, "replaying", pipe)) == list(
        range(MIN_EVENTS)
    )
    drawn = terminal.getvalue()
    assert "replaying [" in drawn and f"{MIN_EVENTS:,}/{MIN_EVENTS:,}" in drawn
    assert drawn.endswith("\n") and "events in" in drawn
    assert pipe.getvalue() == ""
    short = _Terminal()
    assert list(with_progress(range(10), 10, "replaying", short)) == list(range(10))
    assert short.getvalue() == ""  # a short replay is over before a bar could help
