"""``nous-inbox rm``: delete a session, never one an owner holds, never without consent."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from nous_inbox.__main__ import main
from nous_inbox.store import open_store


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


class _Stdin(io.StringIO):
    def __init__(self, text: str, *, terminal: bool) -> None:
        super().__init__(text)
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.fixture(params=["sqlite", "file"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    url = {"sqlite": f"sqlite:{tmp_path / 'inbox.sqlite'}",
           "file": f"file:{tmp_path / 'log.jsonl'}"}[request.param]
    assert cli("steer", "--create", "--store", url, "s", "one")[0] == 0
    assert cli("steer", "--create", "--store", url, "keep", "two")[0] == 0
    return url


def sessions(url: str) -> dict[str, int]:
    with open_store(url, read_only=True) as store:
        return {name: store.version(name) for name in store.streams()}


def test_yes_deletes_without_asking(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin("", terminal=False))
    status, text = cli("rm", "--store", url, "s", "--yes")
    assert status == 0 and text == "deleted session 's' (1 events)\n"
    assert sessions(url) == {"keep": 1}


def test_a_deleted_session_starts_again_from_its_first_event(url: str) -> None:
    assert cli("rm", "--store", url, "s", "--yes")[0] == 0
    status, text = cli("steer", "--create", "--store", url, "s", "again")
    assert status == 0 and text == "steer queued for 's' as event #1\n"


def test_on_a_terminal_rm_asks_and_deletes_only_on_yes(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin("n\n", terminal=True))
    assert cli("rm", "--store", url, "s")[0] == 1
    err = capsys.readouterr().err
    assert "delete session 's' (1 events) from " in err and "[y/N]" in err
    assert err.endswith("nous-inbox rm: 's' kept\n") and sessions(url) == {"keep": 1, "s": 1}
    monkeypatch.setattr(sys, "stdin", _Stdin("y\n", terminal=True))
    assert cli("rm", "--store", url, "s")[0] == 0
    assert sessions(url) == {"keep": 1}


def test_without_yes_rm_refuses_a_stdin_that_is_not_a_terminal(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin("y\n", terminal=False))  # not read as an answer
    assert cli("rm", "--store", url, "s")[0] == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stdin is not a terminal: add --yes" in err
    assert sessions(url) == {"keep": 1, "s": 1}


def test_without_any_stdin_rm_asks_for_yes(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # started with its stdin closed
    assert cli("rm", "--store", url, "s")[0] == 2
    assert "stdin is not a terminal: add --yes" in capsys.readouterr().err
    assert sessions(url) == {"keep": 1, "s": 1}


def test_rm_refuses_a_session_an_owner_holds(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with open_store(url) as store, store.own("s"):
        assert cli("rm", "--store", url, "s", "--yes")[0] == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "session 's' is in use (another owner holds stream 's'" in err
    assert "stop its owner first; nothing was deleted" in err
    assert sessions(url) == {"keep": 1, "s": 1}


def test_rm_of_a_session_that_does_not_exist_says_so(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("rm", "--store", url, "typo", "--yes")[0] == 1
    assert "no session 'typo' in this store" in capsys.readouterr().err
    assert sessions(url) == {"keep": 1, "s": 1}
