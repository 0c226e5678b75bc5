"""``nous-inbox rm``: delete a session, never one an owner holds, never without consent."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nous_inbox.cli import main
from nous_inbox.store import SqliteStore, open_store


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


class _Stdin(io.StringIO):
    def __init__(self, text: str, *, terminal: bool) -> None:
        super().__init__(text)
        self.terminal = terminal

    def isatty(self) -> bool:
        return self.terminal


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    assert cli("steer", "--create", "--store", url, "s", "one")[0] == 0
    assert cli("steer", "--create", "--store", url, "keep", "two")[0] == 0
    return url


@pytest.fixture
def deleting(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A ``delete(stream)`` on the SQLite store, standing in for the stores' own (not written
    yet): it records each call, so a test sees what ``rm`` asked for."""
    deleted: list[str] = []
    monkeypatch.setattr(SqliteStore, "delete", lambda self, stream: deleted.append(stream),
                        raising=False)
    yield deleted


def test_yes_deletes_without_asking(
    url: str, deleting: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin("", terminal=False))
    status, text = cli("rm", "--store", url, "s", "--yes")
    assert status == 0 and text == "deleted session 's' (1 events)\n"
    assert deleting == ["s"]


def test_on_a_terminal_rm_asks_and_deletes_only_on_yes(
    url: str, deleting: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin("n\n", terminal=True))
    assert cli("rm", "--store", url, "s")[0] == 1
    err = capsys.readouterr().err
    assert "delete session 's' (1 events) from SqliteStore(" in err and "[y/N]" in err
    assert err.endswith("nous-inbox rm: 's' kept\n") and deleting == []
    monkeypatch.setattr(sys, "stdin", _Stdin("y\n", terminal=True))
    assert cli("rm", "--store", url, "s")[0] == 0
    assert deleting == ["s"]


def test_without_yes_rm_refuses_a_stdin_that_is_not_a_terminal(
    url: str, deleting: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", _Stdin("y\n", terminal=False))  # not read as an answer
    assert cli("rm", "--store", url, "s")[0] == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stdin is not a terminal: add --yes" in err
    assert deleting == []


def test_without_any_stdin_rm_asks_for_yes(
    url: str, deleting: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", None)  # started with its stdin closed
    assert cli("rm", "--store", url, "s")[0] == 2
    assert "stdin is not a terminal: add --yes" in capsys.readouterr().err
    assert deleting == []


def test_rm_refuses_a_session_an_owner_holds(
    url: str, deleting: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(url) as store, store.own("s"):
        assert cli("rm", "--store", url, "s", "--yes")[0] == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "session 's' is in use (another owner holds stream 's'" in err
    assert "stop its owner first; nothing was deleted" in err
    assert deleting == []


def test_rm_of_a_session_that_does_not_exist_says_so(
    url: str, deleting: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("rm", "--store", url, "typo", "--yes")[0] == 1
    assert "no session 'typo' in this store" in capsys.readouterr().err
    assert deleting == []


def test_a_store_that_cannot_delete_says_so_and_keeps_the_session(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Today no store has ``delete``; once SqliteStore has one, point this at a store without.
    assert cli("rm", "--store", url, "s", "--yes")[0] == 1
    assert "cannot delete a session; nothing was deleted" in capsys.readouterr().err
    with open_store(url, read_only=True) as store:
        assert store.version("s") == 1
