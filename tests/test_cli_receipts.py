"""Receipts and withdraw on the command line: ``steer --wait`` (and every send verb's) says which
turn and step took the message; ``withdraw SESSION SEQ`` takes back one no run claimed yet, and
answers where one already claimed went."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nous_inbox.__main__ import main
from nous_inbox.events import MessageWithdrawn
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.store import open_store

WAIT = 30


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store holding session ``s``, its first event an injection (seq 1) nothing claims."""
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    assert cli("inject", "--create", "--store", url, "s", "fyi") == (
        0, "inject queued for 's' as event #1\n")
    return url


@pytest.fixture
def running(url: str) -> Iterator[Owner]:
    """An owner of ``s`` in this process, watching the store for other writers' sends."""
    def model(transcript: list[Message], tools: list[object]) -> Message:
        return Message.assistant(f"heard: {transcript[-1].content}")

    with Owner(open_store(url), "s", Runner(model), poll_interval=0.01) as owner:
        yield owner


@pytest.mark.parametrize("verb", ["steer", "prompt"])
def test_a_send_with_wait_says_which_turn_and_step_claimed_it(
    url: str, running: Owner, verb: str,
) -> None:
    status, out = cli(verb, "--store", url, "s", "summarize", "--wait", "--timeout", str(WAIT))
    assert status == 0
    queued, went = out.splitlines()
    assert queued == f"{verb} queued for 's' as event #2"
    assert went.startswith("the message sent at seq 2 was claimed by turn 1 for step 1 (event #")


def test_a_send_with_wait_that_no_run_claims_says_it_is_still_queued(url: str) -> None:
    status, out = cli("inject", "--store", url, "s", "later", "--wait", "--timeout", "0")
    assert (status, out.splitlines()[-1]) == (
        1, "the message sent at seq 2 is still queued on next_step")


def test_withdraw_takes_back_a_queued_message_and_a_second_says_the_same(url: str) -> None:
    assert cli("withdraw", "--store", url, "s", "1") == (
        0, "the message sent at seq 1 was withdrawn (event #2)\n")
    assert cli("withdraw", "--store", url, "s", "1") == (
        0, "the message sent at seq 1 was withdrawn (event #2)\n")
    with open_store(url) as store:
        assert [type(e) for e in store.read("s")].count(MessageWithdrawn) == 1
    shown = json.loads(cli("show", "--store", url, "s", "--json")[1])
    assert shown["next_step"] == [] and shown["version"] == 2


def test_withdraw_of_a_claimed_message_says_where_it_went(url: str, running: Owner) -> None:
    sent = running.steer("go")
    running.delivered(sent.seq, timeout=WAIT)
    status, out = cli("withdraw", "--store", url, "s", str(sent.seq), "--json")
    assert status == 1
    answer = json.loads(out)
    assert (answer["state"], answer["turn"], answer["step"]) == ("claimed", 1, 1)


def test_withdraw_reaches_the_owner_holding_the_session(url: str, running: Owner) -> None:
    assert cli("withdraw", "--store", url, "s", "1")[0] == 0
    assert running.delivered(1, timeout=WAIT).state == "withdrawn"
    assert not running.inbox.has_pending()


def test_withdraw_of_what_is_not_a_queued_send_is_an_error_naming_it(
    url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli("withdraw", "--store", url, "s", "9")[0] == 1
    assert "no event at seq 9 (the log ends at seq 1)" in capsys.readouterr().err
    assert cli("withdraw", "--store", url, "nope", "1")[0] == 1
    assert "no session 'nope'" in capsys.readouterr().err


def test_timeout_without_wait_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("steer", "--store", url, "s", "go", "--timeout", "5")[0] == 2
    assert "--timeout must be a number of seconds >= 0 given with --wait" in capsys.readouterr().err
