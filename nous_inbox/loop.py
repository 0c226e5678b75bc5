"""The turn/step loop as a pure state machine: ``advance(state, happening) -> (state, command, events)``.

A turn is a run of steps; a step is one model request and the tools it asks for. Between steps
the loop reads the inbox, so a message sent while the agent works joins its *next* request. This
module decides everything about that and does nothing: no I/O, no threads, no clock. A driver
(``nous_inbox.runner``) performs each command it returns, records the events, and feeds back what
happened. Events leave here with ``seq`` 0; whoever records them numbers them.

>>> from nous_inbox.happenings import ClaimAnswered, ModelAnswered, TurnOpened
>>> from nous_inbox.verbs import Target
>>> from nous_inbox.message import Message
>>> state = new_state(max_steps=5)
>>> state, command, events = advance(state, TurnOpened(turn=1, transcript=[Message.user("hi")]))
>>> command, [type(e).__name__ for e in events]
(Claim(target=<Target.NEXT_TURN: 'next_turn'>), ['TurnStarted'])
>>> state, command, events = advance(state, ClaimAnswered(Target.NEXT_TURN))
>>> state, command, events = advance(state, ClaimAnswered(Target.NEXT_STEP, [Message.user("be brief")]))
>>> [m.content for m in command.transcript], [type(e).__name__ for e in events]
(['hi', 'be brief'], ['StepStarted', 'ModelRequested'])
>>> state, command, events = advance(state, ModelAnswered(Message.assistant("hello")))
>>> command   # a would-be final answer: extend only if a waking message is pending
Claim(target=<Target.NEXT_STEP: 'next_step'>, wake_only=True)
>>> state, command, events = advance(state, ClaimAnswered(Target.NEXT_STEP))
>>> command, [type(e).__name__ for e in events]
(EndTurn(reason='final'), ['TurnEnded'])

The rulings it implements, each with a test in ``tests/test_loop.py`` (and, for every driver,
in ``tests/test_rulings.py``): every driver asks this table at each boundary and decides none of
it itself. The runner and the framework adapters' bridge feed it every happening; aimu, whose
framework says neither what the model did nor which boundary it reached, asks it which claims
such a boundary makes and whether what they took is worth a round
(:func:`~nous_inbox.commands.round_claims`, :func:`~nous_inbox.commands.worth_a_round`).

1. **Claim points.** A turn opens -> ``Claim(next_turn)``; every step boundary -> ``Claim(next_step)``
   right before the model request, so a message sent during a tool call lands after that tool's
   result. Later steps claim only ``next_step``. Each boundary's claim is one entry of the table
   :data:`~nous_inbox.commands.CLAIMS`.
2. **The would-be final answer** (content, no tool calls) is a boundary too, but it asks for a
   ``wake_only`` claim: the driver claims ``next_step`` only if an entry there asked for a wake (a
   steer) and is worth a round (``Inbox.claim(..., wake_only=True)`` decides, in the core), and
   then the run is extended by one step. Results that are the answer (``ToolsFinished(final=True)``,
   a framework's output tool) make the same boundary. A pending *injection* alone does not extend
   the run: Nous defines inject as "have this to hand if you make another request", so it stays
   queued for the next request someone else causes. aimu's "any pending message extends the run"
   is thereby kept for messages that ask to be answered, and a steer that lands after this check is
   the owner's to answer with a new turn when the run ends.
3. **A degenerate reply** (no tool calls, blank content) is followed by a request the run makes
   anyway, so it claims ``next_step`` plainly: anything delivered (steer *or* injection) replaces the
   continuation nudge; with nothing delivered the loop adds its own nudge, a user message whose
   ``metadata["provenance"]`` is ``"continuation"`` (event ``Nudged``). Delivered messages stay
   plain user messages. A framework that answers the reply itself (``Retried``: its own retry
   prompt) has made the nudge: a delivery joins it.
4. **Blank content is never worth a round** (whitespace, or only invisible characters:
   ``Message.blank``, decided when the message is built). Blank messages are still claimed (so nothing
   is left behind and replay agrees with the log: a claim *is* the transcript entry, so they do
   enter the transcript and ride along with the next request the run makes anyway), but they never
   extend a run, replace a nudge or reset the budget. A blank model reply counts as degenerate.
5. **The step budget** (``max_steps`` requests) counts from the last delivery: a non-blank message
   claimed at a step boundary refills it, at most ``max_steps`` times per turn; past that cap one
   ``Warned`` event says so and messages are still delivered without refilling. When the budget is
   spent, a waking message may still refill it (a ``wake_only`` claim); otherwise the turn ends
   with reason ``"budget"``. Once the refills are used up a spent budget ends the turn without
   claiming, so a steer still queued is answered by a new turn (the owner's wake check) rather
   than left unanswered in this one's transcript. Under a framework that bounds its own requests
   (``new_state(added_only=True)``: the pydantic-ai adapter) the budget counts only the requests
   the inbox added (a run extended past its would-be end, ruling 2, or after a blank reply,
   ruling 3): the framework's limit bounds the rest, and the budget never cuts off a run the
   framework would finish, so it never stops one between a tool's result and the request that
   shows it.
8. **A structured (single-shot) run** makes one model request and ends: no claims, no tools.
9. **Cancelling** ends the turn with reason ``"cancelled"``; no claim is asked for after it, and
   tool calls left unanswered get a "cancelled" tool message so the transcript stays well-formed.
   A driver that cut a tool off in flight says so (``Cancelled(results=[interrupted_result(...)])``):
   the tool started, so "cancelled before it ran" would be untrue.

Design notes. ``advance`` returns exactly one command: the loop is always waiting for one thing.
Every transition is one row of a table, ``_TRANSITIONS``, from (phase, happening type) to the
handler that takes it (at the end of this module, the h11 way); ``accepts(phase)`` reads it. What
the loop tells its driver (the commands, and the claims table) is :mod:`nous_inbox.commands`;
what the driver tells it (the happenings) is :mod:`nous_inbox.happenings`. A happening that does
not fit the current phase raises ``UnexpectedHappeningError`` (a ``ValueError``) naming both: a
driver bug must not be smoothed over. The state keeps the transcript as a ``pvector``, so each
step appends in O(1) and a ``CallModel`` hands the model the same vector without copying.

One verb, four names: ``Claim`` asks, ``ClaimAnswered`` answers, ``events.QueueClaimed`` is
recorded, ``inbox.Claimed`` is the view of the messages taken. ``ClaimAnswered`` reads like the
other answers (``CallModel`` -> ``ModelAnswered``, ``RunTools`` -> ``ToolsFinished``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, NamedTuple

import msgspec
from pyrsistent import PVector, pvector

from nous_inbox.commands import (
    CLAIMS,
    CallModel,
    Claim,
    Command,
    EndTurn,
    RunTools,
    ToolSpec,
    worth_a_round,
)
from nous_inbox.errors import UnexpectedHappeningError
from nous_inbox.events import (
    Event,
    ModelReplied,
    ModelRequested,
    Nudged,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnEndReason,
    TurnStarted,
    Warned,
)
from nous_inbox.happenings import (
    Cancelled,
    ClaimAnswered,
    Failed,
    Happening,
    ModelAnswered,
    Retried,
    ToolsFinished,
    TurnOpened,
    cancelled_result,
)
from nous_inbox.message import Message, ToolCall

__all__ = ["CONTINUATION", "Advance", "LoopState", "Phase", "accepts", "advance", "new_state"]

CONTINUATION: Final = Message.user(
    "Continue with the task, or give your final answer if you are done.",
    metadata={"provenance": "continuation"},
)
"""The loop's own nudge after a degenerate reply; its provenance tag marks it as the loop's words."""


class Phase(enum.StrEnum):
    """What the loop is waiting for."""

    NEW = "new"  # nothing yet: waiting for TurnOpened
    CLAIM_TURN = "claim_turn"  # the next_turn claim as the turn opens
    CLAIM_STEP = "claim_step"  # the next_step claim before a request the run makes anyway
    CLAIM_NUDGE = "claim_nudge"  # the same after a degenerate reply: a delivery replaces the nudge
    CLAIM_FINAL = "claim_final"  # the wake-only claim at a would-be final answer
    CLAIM_BUDGET = "claim_budget"  # the wake-only claim when the budget is spent
    MODEL = "model"  # the model's reply
    TOOLS = "tools"  # the tool results
    ENDED = "ended"  # nothing: the turn is over


class LoopState(msgspec.Struct, frozen=True):
    """Where one turn stands. Build it with :func:`new_state`; only :func:`advance` moves it.

    ``step`` counts the model requests made this turn; ``steps_left`` is what remains of the
    budget; ``resets`` is how many times a delivery refilled it; ``calls`` are the tool calls
    awaiting results; ``added_only``: the budget counts only the requests the inbox added.
    """

    max_steps: int = 10
    structured: bool = False
    tools: tuple[ToolSpec, ...] = ()
    added_only: bool = False
    phase: Phase = Phase.NEW
    turn: int = 0
    step: int = 0
    transcript: PVector[Message] = pvector()
    steps_left: int = 0
    resets: int = 0
    warned: bool = False
    calls: tuple[ToolCall, ...] = ()


class Advance(NamedTuple):
    """What ``advance`` returns: the new state, the one command to perform, the events to record."""

    state: LoopState
    command: Command
    events: tuple[Event, ...]


def new_state(
    max_steps: int = 10, *, structured: bool = False, tools: Sequence[ToolSpec] = (),
    added_only: bool = False,
) -> LoopState:
    """A loop waiting for its turn to open.

    ``max_steps`` bounds the model requests since the last delivered message (at least 1);
    ``structured`` makes a single-shot run; ``tools`` are what each ``CallModel`` offers.
    ``added_only`` is for a driver whose framework bounds its own requests (pydantic-ai's
    ``request_limit``): the budget then counts only the requests the inbox added, a run
    extended past its would-be final answer or after a blank reply, never the ones the run
    makes anyway, so it never ends a run the framework would have finished.

    >>> new_state(0)
    Traceback (most recent call last):
    ...
    ValueError: max_steps must be an int >= 1, got 0
    """
    if type(max_steps) is not int or max_steps < 1:
        raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
    if type(structured) is not bool:
        raise TypeError(f"structured must be a bool, got {type(structured).__name__}")
    if type(added_only) is not bool:
        raise TypeError(f"added_only must be a bool, got {type(added_only).__name__}")
    specs = tuple(tools)
    for i, spec in enumerate(specs):
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"tools[{i}] must be a ToolSpec, got {type(spec).__name__}")
    return LoopState(max_steps, structured, specs, added_only)


_replace = msgspec.structs.replace
_Moved = tuple[LoopState, Command, tuple[Event, ...]]  # a handler's Advance, made by advance
_as_advance: Final = tuple.__new__


def advance(state: LoopState, happening: Happening) -> Advance:
    """Move the loop on by one happening: the new state, the next command and the events.

    Pure: the same state and happening always give the same result, and ``state`` is unchanged.
    Which happening each phase takes is the table ``_TRANSITIONS`` below, read with
    :func:`accepts`; a happening that does not fit is an ``UnexpectedHappeningError`` (a
    ``ValueError``) naming both.

    >>> advance(new_state(), ModelAnswered(Message.assistant("hi")))
    Traceback (most recent call last):
    ...
    nous_inbox.errors.UnexpectedHappeningError: loop in phase 'new' cannot take ModelAnswered (it takes TurnOpened)
    """
    handler = _TRANSITIONS.get((state.phase, type(happening)))
    if handler is None:
        raise _refused(state.phase, happening)
    return _as_advance(Advance, handler(state, happening))  # the tuple, typed: no Python call


def accepts(phase: Phase) -> tuple[type[Happening], ...]:
    """The happening types a loop in ``phase`` takes, in the order the table lists them.

    >>> [kind.__name__ for kind in accepts(Phase.MODEL)]
    ['ModelAnswered', 'Cancelled', 'Failed']
    >>> accepts(Phase.ENDED)
    ()
    """
    return _ACCEPTS[Phase(phase)]


def _refused(phase: Phase, happening: object) -> UnexpectedHappeningError:
    kind = type(happening)
    if kind in (Cancelled, Failed) and phase in (Phase.NEW, Phase.ENDED):
        why = "no turn is open to end"
    elif phase is Phase.ENDED:
        why = "the turn is over: a new one needs a new state"
    else:
        why = "it takes " + " or ".join(k.__name__ for k in _ACCEPTS[phase])
    return UnexpectedHappeningError(
        f"loop in phase {phase.value!r} cannot take {kind.__name__} ({why})",
        phase=phase.value, happening=happening,
    )


_CLAIMS_AT: Final[Mapping[Phase, Claim]] = MappingProxyType({
    Phase.CLAIM_TURN: CLAIMS["turn_opening"],
    Phase.CLAIM_STEP: CLAIMS["step"],
    Phase.CLAIM_NUDGE: CLAIMS["step"],  # a request the run makes anyway, after a blank reply
    Phase.CLAIM_FINAL: CLAIMS["stop"],  # a would-be final answer
    Phase.CLAIM_BUDGET: CLAIMS["stop"],  # a spent budget
})
"""The claim each claim phase asks for: the boundary it is, read from :data:`CLAIMS`."""
_CLAIM_STEP: Final = CLAIMS["step"]
_CLAIM_WAKE: Final = CLAIMS["stop"]


def _open(state: LoopState, opened: TurnOpened) -> _Moved:
    """NEW + TurnOpened: start the turn's bookkeeping and claim ``next_turn`` (ruling 1)."""
    if type(opened.turn) is not int or opened.turn < 1:
        raise ValueError(f"TurnOpened.turn must be an int >= 1, got {opened.turn!r}")
    transcript = opened.transcript  # a session's pvector is shared, not copied:
    transcript = transcript if isinstance(transcript, PVector) else pvector(transcript)
    state = _replace(
        state, turn=opened.turn, step=0, transcript=transcript,
        steps_left=state.max_steps, resets=0, warned=False, calls=(),
    )
    started = TurnStarted(turn=opened.turn, reason=opened.reason)
    if state.structured:
        return _start_step(state, [started], added=False)
    return (_replace(state, phase=Phase.CLAIM_TURN), _CLAIMS_AT[Phase.CLAIM_TURN],
                   (started,))


def _claim_answered(state: LoopState, answer: ClaimAnswered) -> _Moved:
    """Any claim phase + ClaimAnswered: the claimed messages join the transcript; what comes next
    depends on which boundary claimed (rulings 1 to 5)."""
    phase = state.phase
    asked = _CLAIMS_AT[phase].target
    if answer.target != asked:
        raise UnexpectedHappeningError(
            f"loop in phase {phase.value!r} asked to claim {asked.value}, "
            f"got ClaimAnswered({answer.target!s})",
            phase=phase.value, happening=answer,
        )
    events: list[Event] = []
    worth = False  # most boundaries claim nothing: no copy, no question asked of no messages
    if answer.messages:
        messages = tuple(answer.messages)
        state = _replace(state, transcript=state.transcript.extend(messages))
        worth = worth_a_round(messages)
        if worth:
            state = _delivered(state, events)
    if phase is Phase.CLAIM_TURN:
        return (_replace(state, phase=Phase.CLAIM_STEP), _CLAIM_STEP, ())
    if phase is Phase.CLAIM_STEP:
        return _start_step(state, events, added=False)
    if phase is Phase.CLAIM_NUDGE:
        if not worth:
            nudge = CONTINUATION
            state = _replace(state, transcript=state.transcript.append(nudge))
            events.append(Nudged(turn=state.turn, step=state.step, message=nudge))
        return _start_step(state, events, added=True)
    # CLAIM_FINAL / CLAIM_BUDGET: only a delivery that refilled (or had) budget goes on.
    if worth and state.steps_left > 0:
        return _start_step(state, events, added=True)
    return _end(state, "final" if phase is Phase.CLAIM_FINAL else "budget", events)


def _delivered(state: LoopState, events: list[Event]) -> LoopState:
    """A message worth a round was claimed: refill the budget, within the cap (ruling 5)."""
    if state.steps_left >= state.max_steps:
        return state
    if state.resets < state.max_steps:
        return _replace(state, steps_left=state.max_steps, resets=state.resets + 1)
    if not state.warned:
        events.append(_cap_warning(state))
        return _replace(state, warned=True)
    return state


def _cap_warning(state: LoopState) -> Warned:
    return Warned(
        text=f"the inbox has extended this run's step budget {state.max_steps} times; refusing "
        "further extensions (messages are still delivered). A message source that hands back "
        "already-delivered messages does this."
    )


def _start_step(state: LoopState, events: list[Event], *, added: bool) -> _Moved:
    """Start a request: one the run makes anyway, or one the inbox or the loop ``added`` (a run
    extended past its would-be end, or a nudge); what the budget counts (ruling 5)."""
    step = state.step + 1
    spent = 1 if added or not state.added_only else 0
    state = _replace(state, phase=Phase.MODEL, step=step, steps_left=state.steps_left - spent)
    events.append(StepStarted(turn=state.turn, step=step))
    events.append(ModelRequested(turn=state.turn, step=step, count=len(state.transcript)))
    tools = () if state.structured else state.tools
    return (state, CallModel(state.transcript, tools), tuple(events))


def _answered(state: LoopState, answered: ModelAnswered) -> _Moved:
    """MODEL + ModelAnswered: tool calls to run, a would-be final answer, or a degenerate reply."""
    message = answered.message
    if not isinstance(message, Message) or message.role != "assistant":
        raise ValueError(f"ModelAnswered needs an assistant Message, got {message!r}")
    turn, step = state.turn, state.step
    transcript = state.transcript.append(message)
    events: list[Event] = [ModelReplied(turn=turn, step=step, message=message)]
    calls = message.tool_calls
    if calls and not state.structured:
        for call in calls:
            events.append(ToolCalled(turn=turn, step=step, call=call))
        return (_replace(state, phase=Phase.TOOLS, transcript=transcript, calls=calls),
                       RunTools(calls), tuple(events))
    state = _replace(state, transcript=transcript)
    events.append(StepEnded(turn=turn, step=step))
    if state.structured:
        return _end(state, "final", events)
    if not message.blank:
        return _boundary(state, Phase.CLAIM_FINAL, events)
    return _boundary(state, Phase.CLAIM_NUDGE, events)


def _tools_finished(state: LoopState, finished: ToolsFinished) -> _Moved:
    """TOOLS + ToolsFinished: the results join the transcript, then the next step's claim."""
    results = finished.results
    calls = state.calls
    if len(results) != len(calls):
        raise ValueError(
            f"ToolsFinished has {len(results)} result(s) for {len(calls)} tool call(s)"
        )
    turn, step = state.turn, state.step
    events: list[Event] = []
    for i, result in enumerate(results):
        call = calls[i]
        if not isinstance(result, Message) or result.role != "tool" or result.tool_call_id != call.id:
            raise ValueError(
                f"ToolsFinished.results[{i}] must be a tool Message answering call {call.id!r}, "
                f"got {result!r}"
            )
        events.append(ToolReturned(turn=turn, step=step, message=result))
    events.append(StepEnded(turn=turn, step=step))
    state = _replace(state, transcript=state.transcript.extend(results), calls=())
    return _boundary(state, Phase.CLAIM_FINAL if finished.final else Phase.CLAIM_STEP, events)


def _retried(state: LoopState, retried: Retried) -> _Moved:
    """A claim phase after a step + Retried: the framework's nudge joins the transcript, and
    the request it makes claims plainly (ruling 3), the framework's own (ruling 5)."""
    message = retried.message
    if not isinstance(message, Message) or message.role != "user":
        raise ValueError(f"Retried needs a user Message, got {message!r}")
    state = _replace(state, transcript=state.transcript.append(message))
    events: list[Event] = [Nudged(turn=state.turn, step=state.step, message=message)]
    return _boundary(state, Phase.CLAIM_STEP, events)


def _boundary(state: LoopState, then: Phase, events: list[Event]) -> _Moved:
    """A step ended: claim for the next request, or check whether the run must go on."""
    if then is Phase.CLAIM_FINAL:
        if state.steps_left > 0 or state.resets < state.max_steps:
            return (_replace(state, phase=Phase.CLAIM_FINAL), _CLAIM_WAKE, tuple(events))
        return _end(state, "final", events)
    if state.steps_left > 0 or (state.added_only and then is Phase.CLAIM_STEP):
        return (_replace(state, phase=then), _CLAIM_STEP, tuple(events))
    if state.resets < state.max_steps:
        return (_replace(state, phase=Phase.CLAIM_BUDGET), _CLAIM_WAKE, tuple(events))
    if not state.warned:
        events.append(_cap_warning(state))
        state = _replace(state, warned=True)
    return _end(state, "budget", events)


def _end(
    state: LoopState, reason: TurnEndReason, events: list[Event], error: str | None = None
) -> _Moved:
    events.append(TurnEnded(turn=state.turn, steps=state.step, reason=reason, error=error))
    return (_replace(state, phase=Phase.ENDED), EndTurn(reason), tuple(events))


def _cancelled(state: LoopState, cancelled: Cancelled) -> _Moved:
    """Any open phase + Cancelled: end the turn, claiming nothing more (ruling 9)."""
    return _close(state, "cancelled", None, cancelled.results)


def _failed(state: LoopState, failed: Failed) -> _Moved:
    """Any open phase + Failed: end the turn with reason ``"error"``."""
    return _close(state, "error", failed.error)


def _close(state: LoopState, reason: TurnEndReason, error: str | None,
           answered: Sequence[Message] = ()) -> _Moved:
    """End the turn from any open phase, answering tool calls left pending: with the driver's
    ``answered`` results where it has them, else as cancelled."""
    left = list(answered)  # matched to the calls in order: a model may repeat an id
    results = []
    for call in state.calls:
        match = next((m for m in left if isinstance(m, Message) and m.role == "tool"
                      and m.tool_call_id == call.id), None)
        results.append(cancelled_result(call) if match is None else left.pop(left.index(match)))
    if left:
        raise ValueError(f"Cancelled.results must be tool Messages answering calls the loop is "
                         f"running ({[c.id for c in state.calls]}), also got "
                         f"{[getattr(m, 'tool_call_id', type(m).__name__) for m in left]}")
    events: list[Event] = []
    if state.phase is Phase.TOOLS:
        events.extend(ToolReturned(turn=state.turn, step=state.step, message=m) for m in results)
        state = _replace(state, transcript=state.transcript.extend(results), calls=())
    if state.phase is Phase.MODEL or state.phase is Phase.TOOLS:
        events.append(StepEnded(turn=state.turn, step=state.step))
    return _end(state, reason, events, error)


# -- the table: every transition the loop makes -------------------------------------------------

_Handler = Callable[[LoopState, Any], _Moved]
_CLAIM_PHASES: Final = tuple(_CLAIMS_AT)
_OPEN_PHASES: Final = (*_CLAIM_PHASES, Phase.MODEL, Phase.TOOLS)

_TRANSITIONS: Final[Mapping[tuple[Phase, type], _Handler]] = MappingProxyType({
    (Phase.NEW, TurnOpened): _open,
    **{(phase, ClaimAnswered): _claim_answered for phase in _CLAIM_PHASES},
    (Phase.MODEL, ModelAnswered): _answered,
    (Phase.TOOLS, ToolsFinished): _tools_finished,
    **{(phase, Retried): _retried for phase in _CLAIM_PHASES if phase is not Phase.CLAIM_TURN},
    **{(phase, Cancelled): _cancelled for phase in _OPEN_PHASES},
    **{(phase, Failed): _failed for phase in _OPEN_PHASES},
})
"""(phase, happening type) -> the handler that takes it. A pair not listed is refused."""

_ACCEPTS: Final[Mapping[Phase, tuple[type[Any], ...]]] = MappingProxyType({
    phase: tuple(kind for (at, kind) in _TRANSITIONS if at is phase) for phase in Phase
})

