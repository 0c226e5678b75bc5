"""The owner's rules, sans I/O: what ``OwnerCore`` answers, one rule per test.

The threaded owner's behaviour tests (tests/test_owner.py) drive the same rules through threads
and a store; here each rule is asked directly, with session values built by hand.
"""

from __future__ import annotations

from nous_inbox.events import (
    MessageSent,
    ModelReplied,
    StepStarted,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message, ToolCall
from nous_inbox.owner.core import OwnerCore, Stop, Turn
from nous_inbox.session import Session, replay

STEERED = Session(inbox=Inbox().steer("summarize"))
INJECTED = Session(inbox=Inbox().inject("fyi"))
BLANK = Session(inbox=Inbox().steer("  \n"))


def sent(text: str, wakeup: bool) -> MessageSent:
    return MessageSent(target="next_step", wakeup=wakeup, message=Message.user(text), seq=1)


def test_a_waking_send_worth_a_round_starts_a_run() -> None:
    core = OwnerCore()
    assert core.arrived([sent("summarize", True)], STEERED)
    assert core.running


def test_an_injection_never_starts_a_run_even_with_a_waking_entry_queued() -> None:
    assert not OwnerCore().arrived([sent("fyi", False)], STEERED)


def test_a_blank_waking_message_starts_no_run() -> None:
    core = OwnerCore()
    assert not core.arrived([sent("  \n", True)], BLANK)
    assert not core.wake(BLANK)
    assert not core.running


def test_one_run_at_a_time() -> None:
    core = OwnerCore()
    assert core.wake(STEERED)
    assert not core.wake(STEERED)
    assert not core.arrived([sent("more", True)], STEERED)


def test_the_run_ends_when_nothing_worth_waking_is_left_and_a_new_send_starts_another() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    assert core.next_turn(STEERED, None) == Turn("wake")
    assert core.next_turn(INJECTED, True) == Stop()
    assert not core.running
    assert core.wake(STEERED)


def test_at_run_end_a_steer_still_queued_opens_another_turn() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    core.next_turn(STEERED, None)
    assert core.next_turn(STEERED, True) == Turn("wake")
    assert core.running


def test_a_blank_steer_after_the_last_claim_opens_no_new_turn() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    core.next_turn(STEERED, None)
    assert core.next_turn(BLANK, True) == Stop()


def test_a_prompt_opens_its_turn_as_a_prompt_once() -> None:
    core = OwnerCore()
    core.prompt()
    core.wake(STEERED)
    assert core.next_turn(STEERED, None) == Turn("prompt")
    assert core.next_turn(STEERED, True) == Turn("wake")


PROMPTED = Session(inbox=Inbox().send("summarize", "next_turn", True, seq=1))


def test_a_prompts_turn_is_the_one_that_opens_while_the_prompt_is_queued() -> None:
    core = OwnerCore()
    core.prompt()
    core.prompted(1)
    core.wake(PROMPTED)
    assert core.next_turn(PROMPTED, None) == Turn("prompt")
    claimed = Session(inbox=PROMPTED.inbox.claim("next_turn")[1].steer("more"))
    assert core.next_turn(claimed, True) == Turn("wake")


def test_a_withdrawn_prompt_leaves_the_next_turn_a_wake_whoever_withdrew_it() -> None:
    core = OwnerCore()
    core.prompt()
    core.prompted(1)
    withdrawn = Session(inbox=PROMPTED.inbox.withdraw(1)[1].steer("something else"))
    core.wake(withdrawn)
    assert core.next_turn(withdrawn, None) == Turn("wake")


def test_a_prompt_stored_after_a_turn_opened_still_opens_its_own_turn_as_a_prompt() -> None:
    core = OwnerCore()
    core.prompt()  # the run it wakes opens a turn before the send returns
    core.wake(STEERED)
    assert core.next_turn(STEERED, None) == Turn("prompt")
    core.prompted(1)  # ... and that turn claimed before the prompt was stored
    assert core.next_turn(PROMPTED, True) == Turn("prompt")


def test_a_prompt_refused_unwritten_opens_no_turn_as_a_prompt() -> None:
    core = OwnerCore()
    core.prompt()
    core.prompted(None)
    core.wake(STEERED)
    assert core.next_turn(STEERED, None) == Turn("wake")


def test_a_prompt_that_may_be_stored_opens_the_next_turn_as_a_prompt_once() -> None:
    core = OwnerCore()
    core.prompt()
    core.prompted(None, maybe_stored=True)
    core.wake(STEERED)
    assert core.next_turn(STEERED, None) == Turn("prompt")
    assert core.next_turn(STEERED, True) == Turn("wake")


def test_cancel_wakes_nothing_even_with_a_steer_queued() -> None:
    core = OwnerCore()
    assert not core.cancel()  # nothing is going
    core.wake(STEERED)
    assert core.cancel()
    assert core.next_turn(STEERED, None) == Stop()  # honoured before the first turn too
    assert core.wake(STEERED)  # a later waking send starts a fresh run


def test_a_waking_send_after_the_cancel_starts_the_next_run_as_the_cancelled_one_stops() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    core.next_turn(STEERED, None)
    assert core.cancel()
    assert not core.arrived([sent("and now this", True)], STEERED)  # a run is still going ...
    assert core.next_turn(STEERED, True) == Stop(again=True)  # ... it stops, and says "again"
    assert core.wake(STEERED)


def test_what_was_sent_before_the_cancel_does_not_make_the_run_go_again() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    core.next_turn(STEERED, None)
    between = Session(inbox=STEERED.inbox)  # no turn open: a send here would go again ...
    core.arrived([sent("queued", True)], between)
    core.cancel()  # ... but the cancel comes after it (ruling 9)
    assert core.next_turn(STEERED, True) == Stop()


def test_an_injection_while_the_run_stops_never_makes_it_go_again() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    core.cancel()
    core.arrived([sent("fyi", False)], STEERED)
    assert core.next_turn(STEERED, None) == Stop()


def test_a_waking_send_after_a_failed_turn_ended_starts_the_next_run() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    running = replay([TurnStarted(turn=1, reason="wake", seq=1)])
    core.arrived([sent("while it fails", True)], running)  # the turn is open: it was queued
    ended = running.apply(TurnEnded(turn=1, steps=1, reason="error", error="down", seq=2))
    assert core.failed(ended, RuntimeError("down")) == Stop()  # before the end: waits
    core.wake(STEERED)
    core.arrived([sent("after the end", True)], ended)
    assert core.failed(ended, RuntimeError("down")) == Stop(again=True)


def test_a_closed_owner_never_goes_again() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    core.cancel()
    core.arrived([sent("late", True)], STEERED)
    core.close()
    assert core.next_turn(STEERED, True) == Stop()


def test_a_turn_that_claimed_nothing_stops_the_run_with_a_warning() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    core.next_turn(STEERED, None)
    answer = core.next_turn(STEERED, False)
    assert isinstance(answer, Stop) and isinstance(answer.record[0], Warned)
    assert not core.running


def test_a_closed_owner_starts_nothing_and_cancels_its_run() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    assert core.close()
    assert core.next_turn(STEERED, None) == Stop()
    assert not core.wake(STEERED)


def test_a_failed_run_stops_and_ends_its_open_turn_as_an_error() -> None:
    core = OwnerCore()
    core.wake(STEERED)
    running = replay([TurnStarted(turn=1, reason="wake", seq=1)])
    answer = core.failed(running, RuntimeError("model down"))
    (ended,) = answer.record
    assert isinstance(ended, TurnEnded) and ended.reason == "error"
    assert ended.error == "RuntimeError: model down"
    assert not core.running
    assert core.failed(STEERED, RuntimeError("x")) == Stop()  # no open turn: nothing to record


def test_resuming_closes_a_turn_the_log_shows_open() -> None:
    running = replay([TurnStarted(turn=1, reason="wake", seq=1)])
    (ended,) = OwnerCore().resume(running)
    assert isinstance(ended, TurnEnded) and (ended.turn, ended.reason) == (1, "error")
    assert OwnerCore().resume(STEERED) == []


def test_resuming_answers_the_calls_a_dead_turn_left_open_so_the_transcript_is_well_formed() -> None:
    calls = [ToolCall("c1", "deploy"), ToolCall("c2", "notify")]
    running = replay([
        TurnStarted(turn=1, reason="wake", seq=1), StepStarted(turn=1, step=1, seq=2),
        ModelReplied(turn=1, step=1, message=Message.assistant(tool_calls=calls), seq=3),
        ToolReturned(turn=1, step=1, message=Message.tool("sent", "c2", name="notify"), seq=4),
    ])
    *answers, ended = OwnerCore().resume(running)
    assert [(a.message.tool_call_id, a.message.metadata["error"]) for a in answers  # type: ignore[attr-defined]
            ] == [("c1", "interrupted")]
    assert isinstance(ended, TurnEnded) and ended.reason == "error"
