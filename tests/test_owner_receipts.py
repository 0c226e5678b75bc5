"""Receipts and withdraw on both owners: every send can be followed to where it went, and a message
no claim took yet can be taken back.

A send's acknowledgement carries its seq. ``delivered(seq)`` waits until a claim takes the
message into a run (and says which turn and step) or it is withdrawn; ``withdraw(seq)`` takes a
queued message back, recording a ``MessageWithdrawn`` so replay agrees, and answers where a
message already claimed went. The threaded ``Owner`` answers at the call; the ``AsyncOwner``
when awaited, and each of its send verbs' coroutines (and turn handles) has ``delivered()`` too.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nous_inbox import Message, ToolCall, replay
from nous_inbox.events import MessageWithdrawn
from nous_inbox.owner import Owner, TurnError
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.receipts import request_withdraw
from nous_inbox.receipts import Receipt
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store
from nous_inbox.verbs import Target

WAIT = 30  # seconds: a bound for a wait that should end at once, never a sleep
STEP, TURN = Target.NEXT_STEP, Target.NEXT_TURN


class Gate:
    """A tool that, on its first call, says it started and waits to be let go: a run held in
    the middle of step 1, so what is sent meanwhile is queued for step 2."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.go = threading.Event()

    def work(self) -> str:
        """Work on something."""
        self.started.set()
        assert self.go.wait(WAIT)
        return "worked"


def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    if not any(m.role == "tool" for m in transcript):
        return Message.assistant(tool_calls=[ToolCall("c1", "work", {})])
    return Message.assistant(f"heard: {transcript[-1].content}")


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def owner(gate: Gate) -> Iterator[Owner]:
    with Owner(open_store("memory:"), "s", Runner(model, [gate.work])) as held:
        yield held


def _withdrawals(owner: Owner) -> list[MessageWithdrawn]:
    return [e for e in owner.events() if isinstance(e, MessageWithdrawn)]


# -- the threaded Owner -----------------------------------------------------------------------------


def test_a_steer_sent_during_a_tool_is_delivered_to_the_next_step(owner: Owner, gate: Gate) -> None:
    first = owner.steer("start")
    assert gate.started.wait(WAIT)
    later = owner.steer("only a.log")
    assert owner.receipt(later.seq) == Receipt(sent=later.seq, target=STEP, state="queued")
    gate.go.set()
    got = owner.delivered(later.seq, timeout=WAIT)
    assert (got.state, got.turn, got.step) == ("claimed", 1, 2)
    assert (owner.receipt(first.seq).turn, owner.receipt(first.seq).step) == (1, 1)
    assert owner.wait_idle(WAIT)


def test_a_queued_message_is_withdrawn_and_never_reaches_the_model(owner: Owner, gate: Gate) -> None:
    owner.steer("start")
    assert gate.started.wait(WAIT)
    sent = owner.steer("scratch that")
    got = owner.withdraw(sent.seq)
    assert got.state == "withdrawn" and not owner.inbox.has_pending()
    gate.go.set()
    assert owner.wait_idle(WAIT)
    assert "scratch that" not in [m.content for m in owner.transcript]
    assert replay(owner.events()) == owner.session
    assert owner.delivered(sent.seq, timeout=WAIT) == got


def test_a_withdraw_of_a_claimed_message_answers_where_it_went_and_records_nothing(
    owner: Owner, gate: Gate,
) -> None:
    gate.go.set()
    sent = owner.steer("go")
    assert owner.wait_idle(WAIT)
    version = owner.session.version
    got = owner.withdraw(sent.seq)
    assert (got.state, got.turn, got.step) == ("claimed", 1, 1)
    assert owner.session.version == version and _withdrawals(owner) == []


def test_a_second_withdraw_says_withdrawn_and_adds_nothing(owner: Owner) -> None:
    sent = owner.inject("fyi")
    assert owner.withdraw(sent.seq) == owner.withdraw(sent.seq)
    assert len(_withdrawals(owner)) == 1


def test_a_waiter_hears_of_a_withdraw_made_on_another_thread(owner: Owner) -> None:
    sent = owner.inject("fyi")  # no run claims an injection alone: it waits
    answers: list[Receipt] = []
    waiting = threading.Thread(target=lambda: answers.append(owner.delivered(sent.seq, WAIT)))
    waiting.start()
    withdrawn = owner.withdraw(sent.seq)
    waiting.join(WAIT)
    assert answers == [withdrawn]


def test_a_withdraw_from_another_process_reaches_the_owner_and_its_waiter(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'db.sqlite'}"
    with Owner(open_store(url), "s", Runner(model), poll_interval=0.01) as owner:
        sent = owner.inject("fyi")
        with open_store(url) as elsewhere:
            taken = request_withdraw(elsewhere, "s", sent.seq)
        assert owner.delivered(sent.seq, timeout=WAIT) == taken
        assert not owner.inbox.has_pending()


def test_a_wait_on_a_message_still_queued_times_out_saying_so(owner: Owner) -> None:
    sent = owner.inject("fyi")
    with pytest.raises(TimeoutError, match=f"the message sent at seq {sent.seq} of session 's' "
                                           "was still queued after 0.01 s"):
        owner.delivered(sent.seq, timeout=0.01)
    assert owner.receipt(sent.seq).state == "queued"


def test_a_withdrawn_prompt_has_no_turn_and_its_handle_says_why(owner: Owner, gate: Gate) -> None:
    owner.steer("start")
    assert gate.started.wait(WAIT)
    handle = owner.prompt("and then summarize")
    assert owner.withdraw(handle.seq).state == "withdrawn"
    assert handle.delivered(timeout=WAIT).state == "withdrawn"
    gate.go.set()
    assert owner.wait_idle(WAIT)
    with pytest.raises(TurnError, match=f"seq {handle.seq} was withdrawn .*no turn answers it"):
        handle.result(timeout=WAIT)
    assert owner.session.turn == 1


def test_a_receipt_of_what_is_not_a_send_is_refused(owner: Owner, gate: Gate) -> None:
    gate.go.set()
    owner.steer("go")
    assert owner.wait_idle(WAIT)
    with pytest.raises(ValueError, match="seq 2 is a TurnStarted, not a send"):
        owner.receipt(2)
    with pytest.raises(LookupError, match="no event at seq 99"):
        owner.withdraw(99)
    with pytest.raises(TypeError, match="seq must be an int, got str"):
        owner.receipt("1")  # type: ignore[arg-type]


def test_a_closed_owner_refuses_a_withdraw(gate: Gate) -> None:
    owner = Owner(open_store("memory:"), "s", Runner(model, [gate.work]))
    sent = owner.inject("fyi")
    owner.close()
    with pytest.raises(RuntimeError, match="is closed"):
        owner.withdraw(sent.seq)
    assert owner.receipt(sent.seq).state == "queued"


# -- the AsyncOwner ---------------------------------------------------------------------------------


async def amodel(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    return Message.assistant(f"heard: {transcript[-1].content}")


@pytest.fixture(params=["memory", "sqlite"])
def astore(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    # memory: sends are stored inline (Stored); sqlite: queued on the store worker (QueuedSend)
    return open_store("memory:" if request.param == "memory" else f"sqlite:{tmp_path / 'db'}")


def test_an_async_send_is_followed_to_the_turn_and_step_that_claimed_it(astore: Store) -> None:
    async def main() -> Receipt:
        async with AsyncOwner(astore, "s", Runner(amodel)) as owner:
            return await owner.steer("go").delivered(timeout=WAIT)

    got = asyncio.run(main())
    assert (got.sent, got.state, got.turn, got.step) == (1, "claimed", 1, 1)


def test_an_async_withdraw_takes_a_queued_message_back_and_its_waiter_hears(astore: Store) -> None:
    async def main() -> tuple[Receipt, Receipt, Receipt]:
        async with AsyncOwner(astore, "s", Runner(amodel)) as owner:
            sent = owner.inject("fyi")
            waiting = asyncio.ensure_future(sent.delivered(timeout=WAIT))
            withdrawn = await owner.withdraw((await sent).seq)
            again = await owner.withdraw((await sent).seq)
            assert not owner.inbox.has_pending()
            return withdrawn, await waiting, again

    withdrawn, heard, again = asyncio.run(main())
    assert withdrawn.state == "withdrawn" and heard == withdrawn == again


def test_an_async_prompt_handle_says_where_its_message_went(astore: Store) -> None:
    async def main() -> tuple[Receipt, Receipt]:
        async with AsyncOwner(astore, "s", Runner(amodel)) as owner:
            handle = owner.prompt("hello")
            await handle
            return await handle.delivered(timeout=WAIT), await owner.receipt(handle.seq)

    delivered, asked = asyncio.run(main())
    assert delivered == asked and (delivered.state, delivered.target, delivered.turn) == (
        "claimed", TURN, 1)


def test_an_async_wait_on_a_message_still_queued_times_out_saying_so() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(amodel)) as owner:
            sent = owner.inject("fyi")
            with pytest.raises(TimeoutError, match=r"was still queued after 0\.01 s"):
                await sent.delivered(timeout=0.01)

    asyncio.run(main())


def test_a_refused_async_send_raises_its_error_where_it_is_followed() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(amodel)) as owner:
            with pytest.raises(TypeError, match="wakeup must be a bool"):
                await owner.send("x", "next_step", "yes").delivered()  # type: ignore[arg-type]

    asyncio.run(main())


class _ProbedStore:
    """A store whose whole-log reads, once ``owner`` is set, check from another thread that the
    owner takes a send meanwhile: ``meanwhile`` says, per such read, whether it did."""

    def __init__(self) -> None:
        self.inner = open_store("memory:")
        self.owner: Owner | None = None
        self.meanwhile: list[bool] = []

    def read(self, stream: str, after: int = 0) -> Any:
        owner = self.owner
        if owner is not None and after == 0:
            self.owner = None  # one probe per arming
            sending = threading.Thread(target=owner.inject, args=("meanwhile",))
            sending.start()
            sending.join(WAIT)
            self.meanwhile.append(not sending.is_alive())
        return self.inner.read(stream, after)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("ask", ["receipt", "delivered", "withdraw"])
def test_reading_the_log_for_a_settled_send_does_not_hold_up_the_owner(ask: str) -> None:
    store = _ProbedStore()
    with Owner(store, "s", Runner(model)) as owner:  # type: ignore[arg-type]
        sent = owner.steer("go")
        assert owner.wait_idle(WAIT)  # settled before anyone asked: only the log says where
        store.owner = owner
        got = getattr(owner, ask)(sent.seq)
        assert (got.state, got.turn, got.step) == ("claimed", 1, 1)
        assert store.meanwhile == [True]
        assert [m.content for m, _ in owner.inbox.entries(STEP)] == ["meanwhile"]


@pytest.mark.parametrize("ask", ["result", "turn_result"])
def test_reading_the_log_for_an_earlier_owners_turn_does_not_hold_up_the_owner(ask: str) -> None:
    store = _ProbedStore()
    with Owner(store, "s", Runner(model)) as before:  # type: ignore[arg-type]
        sent = before.prompt("go")
        assert sent.result(timeout=WAIT).turn == 1
    with Owner(store, "s", Runner(model)) as owner:  # type: ignore[arg-type]
        handle = owner.turn_handle(sent.seq)  # a turn this owner never saw: the log says
        store.owner = owner
        got = handle.result(timeout=WAIT) if ask == "result" else owner.turn_result(1)
        assert (got.turn, got.reason) == (1, "final")
        assert store.meanwhile == [True]
        assert [m.content for m, _ in owner.inbox.entries(STEP)] == ["meanwhile"]
