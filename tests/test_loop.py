"""The turn/step loop, as a pure machine: each test is one ruling, read as a sequence of
``advance(state, happening) -> (state, command, events)``.

The property test at the end plays random scripts (replies, claims, cancels) and checks the
invariants every run must keep; its size grows with ``NOUS_INBOX_STRESS`` (default: small).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_inbox.commands import (
    CLAIMS,
    OPENING,
    CallModel,
    Claim,
    Command,
    EndTurn,
    RunTools,
    ToolSpec,
    round_claims,
    worth_a_round,
)
from nous_inbox.errors import UnexpectedHappeningError
from nous_inbox.events import Event, Nudged, ToolReturned, TurnEnded, Warned
from nous_inbox.happenings import (
    Cancelled,
    ClaimAnswered,
    Failed,
    Happening,
    ModelAnswered,
    Retried,
    ToolsFinished,
    TurnOpened,
    interrupted_result,
)
from nous_inbox.inbox import is_blank
from nous_inbox.loop import CONTINUATION, LoopState, Phase, accepts, advance, new_state
from nous_inbox.message import Message, ToolCall
from nous_inbox.verbs import Target

TURN, STEP = Target.NEXT_TURN, Target.NEXT_STEP
PROMPT = Message.user("tidy the staging logs")
STEER = Message.user("check the staging log instead")
INJECT = Message.user("recall: the deploy is frozen")
BLANK = Message.user("  \n\t")
FINAL = Message.assistant("done")
DEGENERATE = Message.assistant("")
CALL = ToolCall("c1", "read", {"path": "a.log"})
CALLING = Message.assistant(tool_calls=[CALL])
RESULT = Message.tool("42 lines", "c1", name="read")
STRESS = int(os.environ.get("NOUS_INBOX_STRESS", "0") or 0)


def names(events: Sequence[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


def first_request(
    state: LoopState | None = None, turn_msgs: Sequence[Message] = (),
    step_msgs: Sequence[Message] = (),
) -> tuple[LoopState, Command]:
    """Open turn 1 on [PROMPT] and answer both turn-open claims: the loop's first request."""
    state = state or new_state()
    state, command, _ = advance(state, TurnOpened(1, "prompt", [PROMPT]))
    state, command, _ = advance(state, ClaimAnswered(TURN, turn_msgs))
    state, command, _ = advance(state, ClaimAnswered(STEP, step_msgs))
    return state, command


# -- ruling 1: claim points -----------------------------------------------------------------------


def test_a_turn_opens_by_claiming_next_turn_then_next_step_right_before_the_request() -> None:
    state, command, events = advance(new_state(), TurnOpened(1, "prompt", [PROMPT]))
    assert command == Claim(TURN)
    assert names(events) == ["TurnStarted"]
    assert (events[0].turn, events[0].reason) == (1, "prompt")  # type: ignore[union-attr]
    state, command, events = advance(state, ClaimAnswered(TURN, [Message.user("later")]))
    assert command == Claim(STEP) and events == ()
    state, command, events = advance(state, ClaimAnswered(STEP, [STEER]))
    assert isinstance(command, CallModel)
    assert list(command.transcript) == [PROMPT, Message.user("later"), STEER]
    assert names(events) == ["StepStarted", "ModelRequested"]
    assert events[1].count == 3  # type: ignore[union-attr]


def test_later_steps_claim_only_next_step_and_a_mid_tool_message_lands_after_the_result() -> None:
    state, _ = first_request()
    state, command, events = advance(state, ModelAnswered(CALLING))
    assert command == RunTools((CALL,))
    assert names(events) == ["ModelReplied", "ToolCalled"]
    state, command, events = advance(state, ToolsFinished([RESULT]))
    assert command == Claim(STEP)  # not next_turn: that waits for a new turn
    assert names(events) == ["ToolReturned", "StepEnded"]
    state, command, events = advance(state, ClaimAnswered(STEP, [STEER]))
    assert isinstance(command, CallModel)
    assert list(command.transcript)[-3:] == [CALLING, RESULT, STEER]
    assert [(e.turn, e.step) for e in events] == [(1, 2), (1, 2)]  # type: ignore[union-attr]


def test_several_messages_claimed_at_one_boundary_keep_their_order() -> None:
    batch = [Message.user(f"m{i}") for i in range(5)]
    _, command = first_request(step_msgs=batch)
    assert isinstance(command, CallModel)
    assert list(command.transcript) == [PROMPT, *batch]


# -- ruling 2: the would-be final answer ----------------------------------------------------------


def test_a_final_answer_asks_whether_a_waking_message_is_pending() -> None:
    state, _ = first_request()
    state, command, events = advance(state, ModelAnswered(FINAL))
    assert command == Claim(STEP, wake_only=True)
    assert names(events) == ["ModelReplied", "StepEnded"]


def test_a_message_pending_at_the_final_answer_extends_the_run_by_one_step() -> None:
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(FINAL))
    state, command, events = advance(state, ClaimAnswered(STEP, [STEER]))
    assert isinstance(command, CallModel)
    assert list(command.transcript)[-2:] == [FINAL, STEER]
    assert names(events) == ["StepStarted", "ModelRequested"]
    state, command, events = advance(state, ModelAnswered(Message.assistant("checked it")))
    state, command, events = advance(state, ClaimAnswered(STEP))
    assert command == EndTurn("final")
    assert events[-1] == TurnEnded(turn=1, steps=2, reason="final")


def test_with_nothing_pending_a_final_answer_ends_the_turn() -> None:
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(FINAL))
    state, command, events = advance(state, ClaimAnswered(STEP))
    assert command == EndTurn("final")
    assert names(events) == ["TurnEnded"]
    assert state.phase is Phase.ENDED


# -- the claims table: one claim per boundary, read by every driver --------------------------------


def test_each_boundary_makes_the_claim_the_table_names() -> None:
    assert dict(CLAIMS) == {"turn_opening": Claim(TURN), "step": Claim(STEP),
                            "stop": Claim(STEP, wake_only=True)}
    assert {kind: claim.boundary for kind, claim in CLAIMS.items()} == {
        "turn_opening": "turn_opening", "step": "step", "stop": "stop"}
    assert Claim("next_step", wake_only=True).boundary == "stop"  # the queue given by its name


def test_the_loops_claims_are_the_tables_at_each_boundary() -> None:
    state, command, _ = advance(new_state(max_steps=1), TurnOpened(1, "prompt", [PROMPT]))
    assert command == CLAIMS["turn_opening"]
    state, command, _ = advance(state, ClaimAnswered(TURN))
    assert command == CLAIMS["step"]
    state, _, _ = advance(state, ClaimAnswered(STEP))
    state, command, _ = advance(state, ModelAnswered(CALLING))
    state, command, _ = advance(state, ToolsFinished([RESULT]))
    assert command == CLAIMS["stop"]  # the budget of one is spent: only a waking message
    state, _ = first_request()
    state, command, _ = advance(state, ModelAnswered(FINAL))
    assert command == CLAIMS["stop"]  # a would-be final answer


def test_a_framework_that_does_not_name_its_boundaries_opens_then_claims_plain_steps() -> None:
    # aimu's drain: the first claims what a turn's opening does, each later one a step's,
    # never wake-only (such a driver cannot tell a would-be final answer from a step).
    assert round_claims(first=True) == OPENING == (CLAIMS["turn_opening"], CLAIMS["step"])
    assert round_claims(first=False) == (CLAIMS["step"],)


def test_only_a_message_that_is_not_blank_is_worth_a_round() -> None:
    assert not worth_a_round([]) and not worth_a_round([BLANK, Message.user("\u200b\u2060")])
    assert worth_a_round([BLANK, STEER])


# -- ruling 3: degenerate replies -----------------------------------------------------------------


def test_after_a_degenerate_reply_the_loop_nudges_with_its_own_tagged_message() -> None:
    state, _ = first_request()
    state, command, events = advance(state, ModelAnswered(DEGENERATE))
    assert command == Claim(STEP)  # a plain claim: the run will make this request anyway
    state, command, events = advance(state, ClaimAnswered(STEP))
    assert isinstance(command, CallModel)
    assert command.transcript[-1] == CONTINUATION
    assert CONTINUATION.metadata["provenance"] == "continuation"
    assert names(events) == ["Nudged", "StepStarted", "ModelRequested"]
    assert events[0] == Nudged(turn=1, step=1, message=CONTINUATION)


@pytest.mark.parametrize("pending", [[STEER], [INJECT], [INJECT, STEER]])
def test_a_pending_message_replaces_the_continuation_nudge(pending: list[Message]) -> None:
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(DEGENERATE))
    state, command, events = advance(state, ClaimAnswered(STEP, pending))
    assert isinstance(command, CallModel)
    assert list(command.transcript)[-len(pending):] == pending
    assert CONTINUATION not in command.transcript
    assert "Nudged" not in names(events)
    assert all(not m.metadata for m in pending)  # delivered messages stay plain user messages


def test_a_blank_reply_is_degenerate() -> None:
    state, _ = first_request()
    _, command, _ = advance(state, ModelAnswered(Message.assistant(" \n ")))
    assert command == Claim(STEP)  # not the final-answer check


def test_endless_degenerate_replies_stop_at_the_budget() -> None:
    commands, events = autoplay(lambda step: DEGENERATE, max_steps=3)
    assert commands[-1] == EndTurn("budget")
    assert names(events).count("Nudged") == 2
    assert names(events).count("StepStarted") == 3


def test_a_frameworks_own_retry_is_its_nudge_and_a_pending_message_joins_it() -> None:
    # A framework that answers an empty reply itself (pydantic-ai's retry prompt): its words are
    # recorded as the nudge, and the request it makes claims plainly.
    retry = Message.user("Please return text or call a tool.")
    state, _ = first_request()
    state, command, _ = advance(state, ModelAnswered(DEGENERATE))
    state, command, events = advance(state, Retried(retry))
    assert command == Claim(STEP) and events == (Nudged(turn=1, step=1, message=retry),)
    _, command, events = advance(state, ClaimAnswered(STEP, [INJECT]))
    assert isinstance(command, CallModel) and list(command.transcript)[-2:] == [retry, INJECT]
    assert CONTINUATION not in command.transcript and "Nudged" not in names(events)


def test_a_frameworks_retry_of_a_refused_answer_still_counts_against_the_budget() -> None:
    state, _ = first_request(new_state(1))
    state, command, _ = advance(state, ModelAnswered(FINAL))
    assert command == Claim(STEP, wake_only=True)
    _, command, events = advance(state, Retried(Message.user("Validation failed; try again.")))
    # The budget of one request is spent: only a waking message could refill it.
    assert command == Claim(STEP, wake_only=True) and names(events) == ["Nudged"]


def test_results_that_are_the_answer_make_a_final_answers_boundary() -> None:
    # A framework's output tool: its return ends the run unless a waking message is pending.
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(CALLING))
    state, command, _ = advance(state, ToolsFinished([RESULT], final=True))
    assert command == Claim(STEP, wake_only=True)
    _, command, _ = advance(state, ClaimAnswered(STEP))
    assert command == EndTurn("final")


# -- ruling 4: whitespace -------------------------------------------------------------------------


def test_whitespace_only_messages_are_claimed_but_never_extend_a_run() -> None:
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(FINAL))
    state, command, _events = advance(state, ClaimAnswered(STEP, [BLANK]))
    assert command == EndTurn("final")
    assert state.transcript[-1] == BLANK  # claimed, so in the transcript (as the log says)


def test_whitespace_only_messages_do_not_replace_the_nudge() -> None:
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(DEGENERATE))
    _, command, events = advance(state, ClaimAnswered(STEP, [BLANK]))
    assert isinstance(command, CallModel)
    assert list(command.transcript)[-2:] == [BLANK, CONTINUATION]
    assert "Nudged" in names(events)


def test_whitespace_only_messages_do_not_reset_the_budget() -> None:
    with_blanks, _ = autoplay(lambda step: CALLING, max_steps=2, deliver=lambda c, n: [BLANK])
    assert with_blanks[-1] == EndTurn("budget")
    assert sum(isinstance(c, CallModel) for c in with_blanks) == 2


def test_is_blank() -> None:
    assert is_blank([]) and is_blank([BLANK, Message.user("")])
    assert not is_blank([BLANK, STEER])


# -- ruling 5: the step budget --------------------------------------------------------------------


def autoplay(
    reply: Callable[[int], Message],
    *,
    max_steps: int,
    deliver: Callable[[Claim, int], list[Message]] = lambda claim, step: [],
    added_only: bool = False,
) -> tuple[list[Command], list[Event]]:
    """Run a whole turn: ``reply(step)`` answers each request, ``deliver(claim, step)`` each claim
    after the first request (turn-open claims get nothing). Tools always return RESULT."""
    state = new_state(max_steps, added_only=added_only)
    state, command, events = advance(state, TurnOpened(1, "wake", [PROMPT]))
    commands: list[Command] = [command]
    log: list[Event] = list(events)
    for _ in range(10_000):
        if isinstance(command, EndTurn):
            return commands, log
        happening: Happening
        if isinstance(command, Claim):
            got = deliver(command, state.step) if state.step else []
            happening = ClaimAnswered(command.target, got)
        elif isinstance(command, CallModel):
            happening = ModelAnswered(reply(state.step))
        else:
            assert isinstance(command, RunTools)
            happening = ToolsFinished([Message.tool("ok", c.id) for c in command.calls])
        state, command, events = advance(state, happening)
        commands.append(command)
        log.extend(events)
    raise AssertionError("the turn never ended")


def test_a_run_that_is_never_messaged_ends_after_max_steps_requests() -> None:
    commands, events = autoplay(lambda step: CALLING, max_steps=3)
    assert commands[-1] == EndTurn("budget")
    assert names(events).count("StepStarted") == 3
    assert events[-1] == TurnEnded(turn=1, steps=3, reason="budget")
    assert "Warned" not in names(events)


def test_the_budget_counts_from_the_last_delivered_message() -> None:
    # One steer, claimed before step 3, refills the budget: steps 3, 4, 5 are its own three.
    _commands, events = autoplay(
        lambda step: CALLING, max_steps=3,
        deliver=lambda claim, step: [STEER] if step == 2 else [],
    )
    assert events[-1] == TurnEnded(turn=1, steps=5, reason="budget")


def test_a_waking_message_pending_when_the_budget_is_spent_refills_it() -> None:
    # The budget is spent after step 2; a wake-only claim finds a steer and the run goes on.
    commands, events = autoplay(
        lambda step: CALLING, max_steps=2,
        deliver=lambda claim, step: [STEER] if claim.wake_only and step == 2 else [],
    )
    assert Claim(STEP, wake_only=True) in commands
    assert events[-1] == TurnEnded(turn=1, steps=4, reason="budget")


def test_the_reset_is_capped_at_one_per_permitted_step_with_one_warning() -> None:
    # A source that delivers at every boundary (one that never advances its cursor).
    commands, events = autoplay(lambda step: CALLING, max_steps=2, deliver=lambda c, n: [STEER])
    # step 1, refill, step 2, refill (the cap: 2), step 3, delivered without refill (the one
    # warning), step 4, then the budget is spent and no refill is left.
    assert events[-1] == TurnEnded(turn=1, steps=4, reason="budget")
    warnings = [e for e in events if isinstance(e, Warned)]
    assert len(warnings) == 1
    assert "extended this run's step budget 2 times; refusing further extensions" in (
        warnings[0].text
    )
    # messages are still delivered after the cap: every boundary claimed
    assert sum(isinstance(c, Claim) and c.target is STEP for c in commands) >= 4


def test_the_cap_warning_comes_even_when_the_budget_is_spent_at_the_cap() -> None:
    _commands, events = autoplay(lambda step: CALLING, max_steps=1, deliver=lambda c, n: [STEER])
    assert events[-1] == TurnEnded(turn=1, steps=2, reason="budget")
    assert names(events).count("Warned") == 1


def test_under_a_framework_bounding_its_own_requests_they_never_spend_the_budget() -> None:
    _commands, events = autoplay(lambda step: CALLING if step < 30 else FINAL, max_steps=2,
                                 added_only=True)
    assert events[-1] == TurnEnded(turn=1, steps=30, reason="final")
    assert "Warned" not in names(events)


def test_under_a_framework_bounding_its_own_requests_a_steers_extensions_spend_it() -> None:
    # Every would-be answer finds a steer: step 1 is the run's own; steps 2 to 5 are added,
    # the budget of two refilled twice (the cap, one warning), then the run ends on its answer.
    _commands, events = autoplay(lambda step: FINAL, max_steps=2, added_only=True,
                                 deliver=lambda claim, step: [STEER])
    assert events[-1] == TurnEnded(turn=1, steps=5, reason="final")
    assert names(events).count("Warned") == 1


def test_under_a_framework_bounding_its_own_requests_the_loops_nudge_spends_it() -> None:
    _commands, events = autoplay(lambda step: DEGENERATE, max_steps=1, added_only=True)
    assert names(events).count("Nudged") == 1
    assert events[-1] == TurnEnded(turn=1, steps=2, reason="budget")


def test_messages_claimed_as_the_turn_opens_do_not_spend_a_reset() -> None:
    state, _ = first_request(turn_msgs=[STEER], step_msgs=[INJECT])
    assert (state.resets, state.steps_left) == (0, state.max_steps - 1)


# -- ruling 8: structured runs --------------------------------------------------------------------


def test_a_structured_run_makes_one_request_and_claims_nothing() -> None:
    spec = ToolSpec("read")
    state = new_state(5, structured=True, tools=[spec])
    state, command, events = advance(state, TurnOpened(1, "prompt", [PROMPT]))
    assert isinstance(command, CallModel) and command.tools == ()
    assert names(events) == ["TurnStarted", "StepStarted", "ModelRequested"]
    state, command, events = advance(state, ModelAnswered(CALLING))  # tool calls: not run
    assert command == EndTurn("final")
    assert names(events) == ["ModelReplied", "StepEnded", "TurnEnded"]


def test_an_unstructured_run_offers_its_tools() -> None:
    spec = ToolSpec("read", "Read a file.")
    _, command = first_request(new_state(tools=[spec]))
    assert isinstance(command, CallModel) and command.tools == (spec,)


# -- ruling 9: cancelling -------------------------------------------------------------------------


def test_cancelling_before_a_claim_ends_the_turn_and_asks_for_nothing_more() -> None:
    state, command, _ = advance(new_state(), TurnOpened(1, "wake", [PROMPT]))
    state, command, events = advance(state, Cancelled())
    assert command == EndTurn("cancelled")
    assert events == (TurnEnded(turn=1, steps=0, reason="cancelled"),)
    with pytest.raises(ValueError, match="no turn is open"):
        advance(state, Cancelled())


def test_cancelling_during_a_request_closes_its_step() -> None:
    state, _ = first_request()
    _, command, events = advance(state, Cancelled())
    assert command == EndTurn("cancelled")
    assert names(events) == ["StepEnded", "TurnEnded"]


def test_cancelling_during_tools_answers_every_pending_call() -> None:
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(CALLING))
    state, _command, events = advance(state, Cancelled())
    assert names(events) == ["ToolReturned", "StepEnded", "TurnEnded"]
    answer = events[0]
    assert isinstance(answer, ToolReturned)
    assert answer.message.tool_call_id == "c1" and answer.message.metadata["error"] == "cancelled"
    assert state.transcript[-1] == answer.message


def test_a_cancel_keeps_the_answers_the_driver_has_and_a_tool_cut_off_is_interrupted() -> None:
    second = ToolCall("c2", "deploy")
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(Message.assistant(tool_calls=[CALL, second])))
    cut = interrupted_result(second, "the turn was cancelled")
    state, _command, events = advance(state, Cancelled([cut, RESULT]))
    assert names(events) == ["ToolReturned", "ToolReturned", "StepEnded", "TurnEnded"]
    assert list(state.transcript[-2:]) == [RESULT, cut]  # in call order
    assert cut.content == "interrupted: the turn was cancelled before this tool answered"


def test_a_cancel_answers_calls_that_share_an_id_each_in_call_order() -> None:
    # a model may repeat a call's id; the driver has the first one's answer when it is cancelled
    twin = ToolCall(CALL.id, CALL.name, {"again": True})
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(Message.assistant(tool_calls=[CALL, twin])))
    state, _command, events = advance(state, Cancelled([RESULT]))
    assert names(events) == ["ToolReturned", "ToolReturned", "StepEnded", "TurnEnded"]
    first, second = (e.message for e in events[:2] if isinstance(e, ToolReturned))
    assert first == RESULT and second.metadata["error"] == "cancelled"


def test_a_cancel_refuses_answers_to_calls_the_loop_is_not_running() -> None:
    state, _ = first_request()
    with pytest.raises(ValueError, match="must be tool Messages answering calls"):
        advance(state, Cancelled([RESULT]))  # in a request: no call is running
    state, _, _ = advance(state, ModelAnswered(CALLING))
    with pytest.raises(ValueError, match="must be tool Messages answering calls"):
        advance(state, Cancelled([RESULT, RESULT]))


def test_a_failure_ends_the_turn_with_reason_error() -> None:
    state, _ = first_request()
    _, command, events = advance(state, Failed("RuntimeError: boom"))
    assert command == EndTurn("error")
    assert events[-1] == TurnEnded(turn=1, steps=1, reason="error", error="RuntimeError: boom")


# -- the machine refuses what does not fit --------------------------------------------------------


def test_a_happening_the_phase_does_not_expect_is_refused_and_state_is_unchanged() -> None:
    state, _ = first_request()
    before = state
    with pytest.raises(ValueError, match="phase 'model' cannot take ToolsFinished"):
        advance(state, ToolsFinished([]))
    assert state == before
    with pytest.raises(ValueError, match="cannot take ClaimAnswered"):
        advance(state, ClaimAnswered(STEP))


# The specification of the table: which happening each phase takes. Everything else is refused.
HAPPENINGS: dict[type, Happening] = {
    TurnOpened: TurnOpened(1, "wake", [PROMPT]),
    ClaimAnswered: ClaimAnswered(STEP),  # the target is fixed per phase in the tests below
    ModelAnswered: ModelAnswered(FINAL),
    ToolsFinished: ToolsFinished([RESULT]),
    Retried: Retried(Message.user("Please answer.")),
    Cancelled: Cancelled(),
    Failed: Failed("boom"),
}
CLAIM_PHASES = [Phase.CLAIM_TURN, Phase.CLAIM_STEP, Phase.CLAIM_NUDGE, Phase.CLAIM_FINAL,
                Phase.CLAIM_BUDGET]
OPEN_PHASES = [*CLAIM_PHASES, Phase.MODEL, Phase.TOOLS]
TAKES: dict[Phase, set[type]] = {
    Phase.NEW: {TurnOpened},
    **{phase: {ClaimAnswered, Cancelled, Failed} for phase in CLAIM_PHASES},
    **{phase: {ClaimAnswered, Retried, Cancelled, Failed}
       for phase in (Phase.CLAIM_STEP, Phase.CLAIM_NUDGE, Phase.CLAIM_FINAL, Phase.CLAIM_BUDGET)},
    Phase.MODEL: {ModelAnswered, Cancelled, Failed},
    Phase.TOOLS: {ToolsFinished, Cancelled, Failed},
    Phase.ENDED: set(),
}
REFUSED = [
    (phase, kind) for phase in Phase for kind in HAPPENINGS if kind not in TAKES[phase]
]


def in_phase(phase: Phase) -> LoopState:
    """A loop brought to ``phase`` by the happenings a driver would report."""
    steps: dict[Phase, tuple[LoopState, list[Happening]]] = {
        Phase.NEW: (new_state(), []),
        Phase.CLAIM_TURN: (new_state(), [TurnOpened(1)]),
        Phase.CLAIM_STEP: (new_state(), [TurnOpened(1), ClaimAnswered(TURN)]),
        Phase.MODEL: (new_state(), [TurnOpened(1), ClaimAnswered(TURN), ClaimAnswered(STEP)]),
        Phase.TOOLS: (new_state(), [TurnOpened(1), ClaimAnswered(TURN), ClaimAnswered(STEP),
                                    ModelAnswered(CALLING)]),
        Phase.CLAIM_NUDGE: (new_state(), [TurnOpened(1), ClaimAnswered(TURN), ClaimAnswered(STEP),
                                          ModelAnswered(DEGENERATE)]),
        Phase.CLAIM_FINAL: (new_state(), [TurnOpened(1), ClaimAnswered(TURN), ClaimAnswered(STEP),
                                          ModelAnswered(FINAL)]),
        Phase.CLAIM_BUDGET: (new_state(1), [TurnOpened(1), ClaimAnswered(TURN), ClaimAnswered(STEP),
                                            ModelAnswered(CALLING), ToolsFinished([RESULT])]),
        Phase.ENDED: (new_state(), [TurnOpened(1), Cancelled()]),
    }
    state, happenings = steps[phase]
    for happening in happenings:
        state = advance(state, happening).state
    assert state.phase is phase
    return state


def fitting(phase: Phase, kind: type) -> Happening:
    if kind is ClaimAnswered:
        return ClaimAnswered(TURN if phase is Phase.CLAIM_TURN else STEP)
    return HAPPENINGS[kind]


def _name(kind: type) -> str:
    # Sets of classes iterate in an order that differs between processes: parametrized in it,
    # two xdist workers would collect different lists.
    return kind.__name__


def test_the_table_lists_exactly_the_specified_transitions() -> None:
    assert {phase: set(accepts(phase)) for phase in Phase} == TAKES


@pytest.mark.parametrize(("phase", "kind"),
                         [(p, k) for p in Phase for k in sorted(TAKES[p], key=_name)],
                         ids=lambda v: getattr(v, "value", getattr(v, "__name__", "")))
def test_every_listed_transition_is_taken(phase: Phase, kind: type) -> None:
    result = advance(in_phase(phase), fitting(phase, kind))
    # it moved on (a claim may repeat; a framework's retry in a budget claim asks again)
    assert result.state.phase is not phase or kind in (ClaimAnswered, Retried)


@pytest.mark.parametrize(("phase", "kind"), REFUSED,
                         ids=lambda v: getattr(v, "value", getattr(v, "__name__", "")))
def test_every_other_pair_is_refused_naming_phase_and_happening(phase: Phase, kind: type) -> None:
    state = in_phase(phase)
    happening = HAPPENINGS[kind]
    with pytest.raises(UnexpectedHappeningError) as refused:
        advance(state, happening)
    message = str(refused.value)
    assert f"phase {phase.value!r}" in message and f"cannot take {kind.__name__}" in message
    assert refused.value.phase == phase.value and refused.value.happening is happening
    assert isinstance(refused.value, ValueError)
    assert state == in_phase(phase)  # nothing changed


def test_a_refusal_says_what_the_phase_takes() -> None:
    with pytest.raises(UnexpectedHappeningError, match=r"\(it takes ToolsFinished or Cancelled "
                       r"or Failed\)"):
        advance(in_phase(Phase.TOOLS), ModelAnswered(FINAL))
    with pytest.raises(UnexpectedHappeningError, match="the turn is over"):
        advance(in_phase(Phase.ENDED), TurnOpened(2))
    with pytest.raises(UnexpectedHappeningError, match="no turn is open to end"):
        advance(in_phase(Phase.NEW), Failed("boom"))


@pytest.mark.parametrize("phase", CLAIM_PHASES, ids=lambda p: p.value)
def test_a_claim_of_the_wrong_queue_is_refused(phase: Phase) -> None:
    state = in_phase(phase)
    wrong = ClaimAnswered(STEP if phase is Phase.CLAIM_TURN else TURN)
    asked = "next_turn" if phase is Phase.CLAIM_TURN else "next_step"
    with pytest.raises(UnexpectedHappeningError, match=f"asked to claim {asked}, got ClaimAnswered"):
        advance(state, wrong)


def test_tool_results_must_answer_the_calls_in_order() -> None:
    state, _ = first_request()
    state, _, _ = advance(state, ModelAnswered(CALLING))
    with pytest.raises(ValueError, match="1 tool call"):
        advance(state, ToolsFinished([]))
    with pytest.raises(ValueError, match="answering call 'c1'"):
        advance(state, ToolsFinished([Message.tool("x", "c9")]))


def test_the_model_must_answer_as_the_assistant() -> None:
    state, _ = first_request()
    with pytest.raises(ValueError, match="assistant Message"):
        advance(state, ModelAnswered(Message.user("hi")))


def test_new_state_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        new_state(0)
    with pytest.raises(TypeError, match="structured"):
        new_state(structured=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tools\[0\]"):
        new_state(tools=["read"])  # type: ignore[list-item]


def test_events_leave_the_loop_unnumbered() -> None:
    _, events = autoplay(lambda step: CALLING if step < 2 else FINAL, max_steps=5)
    assert all(e.seq == 0 and e.at == 0.0 for e in events)


# -- invariants, over random scripts --------------------------------------------------------------

REPLIES = st.sampled_from([FINAL, DEGENERATE, CALLING])
DELIVERIES = st.lists(st.sampled_from([STEER, INJECT, BLANK]), max_size=2)


@settings(max_examples=60 + 40 * STRESS, deadline=None)
@given(
    max_steps=st.integers(1, 4),
    replies=st.lists(REPLIES, min_size=1, max_size=30),
    claims=st.lists(DELIVERIES, max_size=30),
    cancel_at=st.one_of(st.none(), st.integers(0, 40)),
)
def test_every_turn_ends_once_within_its_bound(
    max_steps: int, replies: list[Message], claims: list[list[Message]], cancel_at: int | None
) -> None:
    state, command, events = advance(new_state(max_steps), TurnOpened(1, "wake", [PROMPT]))
    log = list(events)
    moves = 0
    cancelled = False
    while not isinstance(command, EndTurn):
        happening: Happening
        if cancel_at is not None and moves == cancel_at:
            happening, cancelled = Cancelled(), True
        elif isinstance(command, Claim):
            happening = ClaimAnswered(command.target, claims.pop() if claims else [])
        elif isinstance(command, CallModel):
            assert list(command.transcript) == list(state.transcript)
            happening = ModelAnswered(replies[moves % len(replies)])
        else:
            assert isinstance(command, RunTools)
            happening = ToolsFinished([Message.tool("ok", c.id) for c in command.calls])
        state, command, events = advance(state, happening)
        log.extend(events)
        moves += 1
    kinds = names(log)
    ended = log[-1]
    assert isinstance(ended, TurnEnded) and kinds.count("TurnEnded") == 1
    assert ended.steps == kinds.count("StepStarted") == kinds.count("StepEnded")
    assert ended.steps <= max_steps * (max_steps + 1)
    assert kinds.count("Warned") <= 1
    assert (ended.reason == "cancelled") == cancelled
    # every tool call is answered, so the transcript is well-formed for the next turn
    assert kinds.count("ToolCalled") == kinds.count("ToolReturned")
