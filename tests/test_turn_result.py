"""A prompt's result: the turn it starts or joins, how that turn ended, read back after a restart.

Run against both owners (``tests.owner_faces``): the threaded ``Owner``'s handle has
``result(timeout=)``; the ``AsyncOwner``'s is awaited (the face waits for it from a thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_inbox.events import (
    MessageSent,
    ModelReplied,
    QueueClaimed,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.message import Message, ToolCall
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.turn_ledger import TurnCancelled, TurnFailed, TurnLedger, TurnResult, settled
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from nous_inbox.verbs import Target
from tests.owner_faces import FACES, build

WAIT = 30  # seconds; a generous bound for a wait that should end at once, never a sync sleep


def echo(transcript: Sequence[Message], tools: Any) -> Message:
    return Message.assistant(f"heard: {transcript[-1].content}")


def of_type(store: Any, kind: type) -> list[Any]:
    return [e for e in store.read("s") if isinstance(e, kind)]


@pytest.mark.parametrize("face", FACES)
def test_a_prompts_handle_gives_its_turns_answer_and_seqs(face: str) -> None:
    store = open_store("memory:")
    with build(face, store, "s", Runner(echo)) as owner:
        handle = owner.prompt("what is up?")
        assert isinstance(handle.sent, MessageSent) and handle.seq == handle.sent.seq == 1
        result = handle.result(timeout=WAIT)
    (started,), (ended,) = of_type(store, TurnStarted), of_type(store, TurnEnded)
    assert result == TurnResult(
        turn=1, reason="final", message=Message.assistant("heard: what is up?"),
        output="heard: what is up?", usage=None, first_seq=started.seq, last_seq=ended.seq)
    assert result.text == "heard: what is up?"


@pytest.mark.parametrize("face", FACES)
def test_followups_queued_during_a_turn_join_the_next_one_and_share_its_result(face: str) -> None:
    gate, entered = threading.Event(), threading.Event()

    def model(transcript: Sequence[Message], tools: Any) -> Message:
        if transcript[-1].content == "first":
            entered.set()
            gate.wait(WAIT)
        return Message.assistant(f"answered {len(transcript)}")

    with build(face, open_store("memory:"), "s", Runner(model, offload=True)) as owner:
        first = owner.prompt("first")
        assert entered.wait(WAIT)
        a, b = owner.followup("a"), owner.followup("b")
        gate.set()
        assert first.result(timeout=WAIT).turn == 1
        joined = a.result(timeout=WAIT)
        assert joined == b.result(timeout=WAIT)
        assert joined.turn == 2 and joined.text == "answered 4"


def failing(transcript: Sequence[Message], tools: Any) -> Message:
    raise RuntimeError("the model is down")


@pytest.mark.parametrize("face", FACES)
def test_a_failed_turn_raises_on_its_handle_with_the_recorded_error(face: str) -> None:
    with build(face, open_store("memory:"), "s", Runner(failing)) as owner:
        handle = owner.prompt("go")
        with pytest.raises(TurnFailed, match="the model is down") as raised:
            handle.result(timeout=WAIT)
        with pytest.raises(RuntimeError):
            owner.wait_idle(WAIT)  # the run's failure, as before
    assert raised.value.result is not None and raised.value.result.reason == "error"


@pytest.mark.parametrize("face", FACES)
def test_a_cancelled_turn_raises_on_its_handle(face: str) -> None:
    entered, gate = threading.Event(), threading.Event()

    def slow(transcript: Sequence[Message], tools: Any) -> Message:
        entered.set()
        gate.wait(WAIT)
        return Message.assistant("too late")

    with build(face, open_store("memory:"), "s", Runner(slow, offload=True)) as owner:
        handle = owner.prompt("go")
        assert entered.wait(WAIT)
        assert owner.cancel()
        gate.set()
        with pytest.raises(TurnCancelled, match="turn 1 was cancelled"):
            handle.result(timeout=WAIT)


@pytest.mark.parametrize("face", FACES)
def test_a_result_is_read_back_from_the_log_by_a_new_owner(face: str) -> None:
    store = open_store("memory:")
    with build(face, store, "s", Runner(echo)) as owner:
        first = owner.prompt("one").result(timeout=WAIT)
        seq = owner.prompt("two").seq
        owner.wait_idle(WAIT)
    # Sent before this owner opened: a prompt another process stored, answered by the new owner.
    (waiting,) = store.append("s", [MessageSent(target=Target.NEXT_TURN, wakeup=True,
                                                message=Message.user("three"))])
    with build(face, store, "s", Runner(echo)) as again:
        assert again.turn_result(1) == first
        assert again.turn_handle(seq).result(timeout=WAIT).text == "heard: two"
        assert again.turn_handle(waiting.seq).result(timeout=WAIT).text == "heard: three"
        with pytest.raises(ValueError, match="not a send to next_turn"):
            again.turn_handle(first.first_seq)
        with pytest.raises(LookupError, match="turn 9"):
            again.turn_result(9)


def test_a_handle_waiting_when_its_owner_closes_says_so() -> None:
    store = open_store("memory:")
    owner = Owner(store, "s", Runner(echo), start=False)
    with owner:
        owner.cancel()
    # A prompt queued by another writer, that this closed owner will never run.
    (sent,) = store.append("s", [MessageSent(target=Target.NEXT_TURN, wakeup=False,
                                             message=Message.user("later"))])
    with pytest.raises(RuntimeError, match="closed"):
        owner.turn_handle(sent.seq).result(timeout=WAIT)


def test_an_async_owners_handle_is_awaited_for_the_result_and_keeps_the_stored_send() -> None:
    async def main() -> tuple[TurnResult, int]:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            handle = owner.prompt("go")
            sent = await handle.stored()
            return await handle, sent.seq

    result, seq = asyncio.run(main())
    assert (result.text, result.turn, seq) == ("heard: go", 1, 1)


def test_a_runner_without_run_options_refuses_them_and_stores_nothing() -> None:
    store = open_store("memory:")
    with Owner(store, "s", Runner(echo)) as owner, pytest.raises(TypeError, match="deps"):
        owner.prompt("go", deps=object())
    assert list(store.read("s")) == []


class OptionsRunner:
    """The built-in runner over ``echo``, taking run options as a pydantic-ai ``AgentRunner``
    does: ``seen`` is the options each turn got, read as it opened; no turn opens before
    ``opens`` is set (so the test can queue several sends first)."""

    def __init__(self) -> None:
        self.inner = Runner(echo)
        self.seen: list[dict[str, Any]] = []
        self.opens = threading.Event()

    @staticmethod
    def check_run_options(options: dict[str, Any]) -> None:
        """Takes any."""

    def run_turn(self, port: Any, **how: Any) -> Any:
        assert self.opens.wait(WAIT)
        for event in self.inner.run_turn(port, **how):
            self._note(port, event)
            yield event

    async def arun_turn(self, port: Any, **how: Any) -> Any:
        assert await asyncio.to_thread(self.opens.wait, WAIT)
        async for event in self.inner.arun_turn(port, **how):
            self._note(port, event)
            yield event

    def _note(self, port: Any, event: Any) -> None:
        if type(event) is QueueClaimed and event.target == Target.NEXT_TURN:
            self.seen.append(port.turn_options)


@pytest.mark.parametrize("face", FACES)
def test_a_prompt_with_run_options_gets_a_turn_of_its_own_so_none_are_merged(face: str) -> None:
    runner = OptionsRunner()
    with build(face, open_store("memory:"), "s", runner) as owner:
        handles = {
            "a": owner.prompt("a"), "b": owner.followup("b"),  # no options: one turn
            "c": owner.prompt("c", deps="C"),                  # its own turn
            "d": owner.followup("d"),                          # after it, not beside it
            "e": owner.prompt("e", deps="E"), "f": owner.prompt("f", deps="F"),
        }
        runner.opens.set()  # every send is queued before the first turn opens
        turns = {text: handle.result(timeout=WAIT).turn for text, handle in handles.items()}
    assert turns == {"a": 1, "b": 1, "c": 2, "d": 3, "e": 4, "f": 5}
    assert runner.seen == [{}, {"deps": "C"}, {}, {"deps": "E"}, {"deps": "F"}]


def test_settled_passes_a_final_or_budget_turn_and_raises_for_the_others() -> None:
    base = TurnResult(1, "final", None, None, None, 1, 2)
    assert settled(base) is base
    budget = TurnResult(1, "budget", None, None, None, 1, 2)
    assert settled(budget) is budget
    with pytest.raises(TurnFailed, match="boom"):
        settled(TurnResult(1, "error", None, None, None, 1, 2, error="boom"))


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=12))
def test_the_ledger_finds_each_send_in_the_turn_whose_claim_took_it(plan: list[Any]) -> None:
    # Each round: some followups, then (maybe) a turn that claims all of next_turn.
    events: list[Any] = []
    expected: dict[int, int | None] = {}
    pending: list[int] = []
    turn = 0

    def add(event: Any) -> Any:
        stamped = type(event)(**{**{f: getattr(event, f) for f in event.__struct_fields__},
                                 "seq": len(events) + 1})
        events.append(stamped)
        return stamped

    for sends, runs in plan:
        for i in range(sends):
            sent = add(MessageSent(target=Target.NEXT_TURN, wakeup=True, message=Message.user(str(i))))
            pending.append(sent.seq)
            expected[sent.seq] = None
        if runs:
            turn += 1
            add(TurnStarted(turn=turn))
            if pending:
                add(QueueClaimed(target=Target.NEXT_TURN, count=len(pending)))
            add(ModelReplied(turn=turn, step=1, message=Message.assistant(f"t{turn}")))
            add(TurnEnded(turn=turn, steps=1, reason="final"))
            expected.update({seq: turn for seq in pending})
            pending = []
    ledger = TurnLedger.from_log(events)
    for seq, want in expected.items():
        found = ledger.result_of(seq)
        assert (None if found is None else found.turn) == want
        assert found is None or found.text == f"t{want}"


@pytest.mark.parametrize("face", FACES)
def test_usage_a_model_reports_on_its_replies_is_summed_over_the_turn(face: str) -> None:
    def model(transcript: Sequence[Message], tools: Any) -> Message:
        usage = {"input_tokens": len(transcript) * 10, "output_tokens": 3, "note": "x"}
        if transcript[-1].role == "user":
            return Message.assistant(tool_calls=[ToolCall("c1", "add", {"a": 1, "b": 2})],
                                     metadata={"usage": usage})
        return Message.assistant("3", metadata={"usage": usage})

    def add(a: int, b: int) -> int:
        return a + b

    store = open_store("memory:")
    with build(face, store, "s", Runner(model, [add])) as owner:
        result = owner.prompt("1 + 2?").result(timeout=WAIT)
    assert result.usage == {"input_tokens": 10 + 30, "output_tokens": 6}
    assert of_type(store, TurnEnded)[0].usage == result.usage  # in the log
