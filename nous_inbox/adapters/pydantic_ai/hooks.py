"""The run hooks: where a pydantic-ai run meets the inbox, at the run's own node boundaries.

pydantic-ai already knows where a run's step boundaries are (its capability hooks), so one
capability, built per turn by :class:`~nous_inbox.adapters.pydantic_ai.runner.AgentRunner`, tells
the loop what pydantic-ai did at each of them and carries out what the loop says: the adapter
asks the loop's table and decides nothing of its own.

Where the inbox joins a run. The loop (:mod:`nous_inbox.loop`) decides every boundary, as it
does for the built-in runner; the hooks tell it what pydantic-ai did and carry out what it says:

- A turn opens: the loop claims ``next_turn`` (followups, prompts), then ``next_step`` (ruling 1);
  the run starts from the loop's first request, the earlier transcript as ``message_history``.
- Every later step boundary, in ``before_model_request``: the tool results pydantic-ai shows are
  the loop's ``ToolsFinished``, its own retry prompt a ``Retried``; what the loop then claims
  joins that very request (through ``RunContext.enqueue``), after the tool results, so a steer
  sent during a tool call lands after that tool's result. These requests are the agent's own:
  pydantic-ai's limits bound them (``usage_limits``), not the step budget.
- The run would end (``after_node_run`` with ``End``: a text answer, or an output tool's return,
  ``ToolsFinished(final=True)``): the loop's wake-only claim extends the run by one request for a
  pending steer (ruling 2), not for an injection alone; after a blank reply its plain claim
  delivers a pending message, else its nudge (rulings 3 and 4). These added requests are what
  the step budget counts (ruling 5: ``max_steps``, ``new_state(added_only=True)``): when it is
  spent the run ends with its answer, never between a tool's result and the request that
  shows it.
- Cancelling ends the run at its next node boundary, recorded as ``"cancelled"`` (ruling 9): the
  results of tools that ran before it are recorded, and calls it left unrun are answered as
  cancelled, as the built-in runner does, so no call is left for pydantic-ai to answer unlogged.
  A run stopped inside a tool (its task cancelled: an owner closing, a server stopping) answers
  that call as interrupted: the tool started, and what it did is unknown.

Where pydantic-ai decides first: it answers an empty reply itself, with a retry prompt counted
against its output retries, so a pending message joins that prompt rather than replacing it
(ruling 3), and a run of empty replies ends as an error at its retry limit (the retries are
its own requests, which the step budget does not count).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pydantic_ai import ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    INTERRUPTED_TOOL_RETURN_CONTENT,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    RetryFeedbackPart,
    RetryPromptPart,
    ToolReturnPart,
)
from pydantic_core import to_jsonable_python
from pydantic_graph import End

from nous_inbox.adapters.bridge import CLAIMS, Part, TurnBridge, numeric_counts, stop_cause
from nous_inbox.adapters.pydantic_ai.streaming import streamed
from nous_inbox.adapters.pydantic_ai.transcript import (
    as_request_part,
    from_model_response,
    to_model_messages,
    trailing_parts,
)
from nous_inbox.commands import EndTurn
from nous_inbox.events import Event
from nous_inbox.happenings import Cancelled, Failed, ModelAnswered, Retried
from nous_inbox.loop import LoopState, Phase
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner.deltas import deltas_of
from nous_inbox.runner.port import SessionPort
from nous_inbox.runner.tracing import TurnTrace

__all__ = ["InboxHooks", "TurnOver"]

logger: Final = logging.getLogger("nous_inbox.adapters.pydantic_ai")


class TurnOver(Exception):
    """Raised from a hook when the loop ends the turn where pydantic-ai would make a request:
    the run stops there, the request unmade. (The adapter's budget never does: it counts only
    the requests the inbox adds, at a would-be end.)"""


def _left_open(call: ToolCall) -> Message:
    """The answer to a call an earlier turn left open, as pydantic-ai words it (it would answer
    the call itself, unrecorded)."""
    return Message.tool(INTERRUPTED_TOOL_RETURN_CONTENT, call.id, name=call.name,
                        metadata={"error": "interrupted"})


# -- the hooks ------------------------------------------------------------------------------------


@dataclass
class InboxHooks(AbstractCapability[Any]):
    """One turn's bridge between a pydantic-ai run and a session port.

    Built per turn by :class:`~nous_inbox.adapters.pydantic_ai.runner.AgentRunner`. It tells
    the shared :class:`~nous_inbox.adapters.bridge.TurnBridge` (``bridge``: the loop's state and
    how a boundary is recorded) what happened at each of pydantic-ai's boundaries, in its terms;
    the loop says what to claim, whether the run goes on, and what to record. The port's methods
    do store I/O, so each hook makes all its port calls in one trip through ``call``.
    """

    port: SessionPort
    call: Callable[[Callable[[], Any]], Any]
    start: LoopState
    bridge: TurnBridge = field(init=False)
    opening: bool = True
    #: The run's usage (pydantic-ai's, updated in place): what the turn's end records.
    usage: Any = None
    #: The request parts recorded already (or the transcript's own), by identity; kept alive so
    #: an id is never reused while it is here.
    seen: dict[int, object] = field(default_factory=dict)
    #: The ids of the calls whose tools started: one the run stops in is interrupted, not unrun.
    started: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.bridge = TurnBridge(self.port, self.start, left_open=_left_open,
                                 counts=lambda: _usage_counts(self.usage),
                                 jsonable=to_jsonable_python, log=logger)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built in code, never from a spec

    def get_wrapper_model(self, model: Any) -> Any:
        """While someone reads the session's text deltas, the model is asked to stream, and
        each piece of its reply is said to them (:mod:`~nous_inbox.adapters.pydantic_ai.streaming`)."""
        return streamed(model, deltas_of(self.port))

    def _deliver(self, ctx: Any, messages: Sequence[Message]) -> None:
        if messages:
            parts = [as_request_part(m) for m in messages]
            for part in parts:
                self.seen[id(part)] = part  # recorded by its claim (or as the loop's nudge)
            ctx.enqueue(*parts)

    def open(self, reason: str) -> list[ModelMessage]:
        """The turn's opening, before the run: ``TurnStarted``, the answers to calls an earlier
        turn left open (pydantic-ai would answer them itself, unrecorded), then the loop's
        claims. Returns the history the run starts from: what the loop's first request shows."""
        history = to_model_messages(self.bridge.open(reason))
        for message in history:
            for part in message.parts:
                self.seen[id(part)] = part  # the transcript's own: recorded already
        return history

    def _happenings(self, shown: Sequence[ModelRequestPart], final: bool = False,
                    stopped: str = "") -> list[Part]:
        """What a request (or a run's end) shows that pydantic-ai put there itself and is not
        recorded yet, as the loop's happenings: the results of the calls the loop waits for (a
        retry prompt answering a call is its result), then pydantic-ai's own retry prompts. A
        run that ``stopped`` (saying why) answers a call whose tool started as interrupted."""
        by_id: dict[str, Message] = {}
        retries: list[Part] = []
        for part in shown:
            if id(part) in self.seen:
                continue
            self.seen[id(part)] = part
            if isinstance(part, ToolReturnPart):
                by_id[part.tool_call_id] = Message.tool(
                    part.model_response_str(), part.tool_call_id, name=part.tool_name)
            elif isinstance(part, RetryPromptPart) and part.tool_name is not None:
                by_id[part.tool_call_id] = Message.tool(
                    part.model_response(), part.tool_call_id, name=part.tool_name,
                    metadata={"error": "retry"})
            elif isinstance(part, (RetryFeedbackPart, RetryPromptPart)):  # its own nudge
                retries.append(Retried(Message.user(part.model_response())))
        finished = self.bridge.finished(by_id, final=final, stopped=stopped, started=self.started)
        return retries if finished is None else [finished, *retries]

    async def before_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any) -> Any:
        """A tool starts: if the run stops before it answers, it was interrupted."""
        self.started.add(call.tool_call_id)
        return args

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        """A step boundary: the results pydantic-ai shows, then the loop's claim into this very
        request, after them (or the end of the turn, when the loop says so)."""
        self.usage = ctx.usage
        if self.opening:
            self.opening = False  # the opening claimed already
            return request_context
        parts = self._happenings(trailing_parts(request_context.messages))
        deliver = await self.call(lambda: self.bridge.write(*parts, CLAIMS))
        if type(self.bridge.adv.command) is EndTurn:
            raise TurnOver
        self._deliver(ctx, deliver)
        return request_context

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: Any) -> Any:
        """The reply, and every tool call it asks for, recorded before any tool runs."""
        message = from_model_response(response)
        await self.call(lambda: self.bridge.write(ModelAnswered(message)))
        return response

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        """The run would end: the loop's claim decides whether it goes on, by a waking message
        (ruling 2) or after a blank reply, which a pending message or the loop's nudge follows
        (rulings 3 and 4)."""
        if isinstance(result, End):
            self.usage, self.bridge.output = ctx.usage, getattr(result.data, "output", None)
            parts = self._happenings(trailing_parts(ctx.messages), final=True)
            deliver = await self.call(lambda: self.bridge.write(*parts, CLAIMS))
            self._deliver(ctx, deliver)  # pydantic-ai redirects End into one more request
        return result

    def close(self, ending: Cancelled | Failed, left_over: Sequence[ModelRequestPart] = ()) -> None:
        """End the turn, unless the loop ended it. What the run holds but never showed is
        recorded first (results of tools that ran before a cancel), every call still open is
        answered as interrupted if its tool started, else as cancelled (ruling 9, as the
        built-in runner does), and nothing is claimed."""
        if self.bridge.phase() is not Phase.ENDED:
            self.bridge.close(ending, *self._happenings(left_over, stopped=stop_cause(ending)))

    async def end(self, run: Any, ending: Cancelled | Failed) -> None:
        """End the turn as :meth:`close` does, once ``run`` (the run, or ``None`` before it
        started) stopped: what it holds but never showed, and its usage, are read here, on the
        event loop that drives it, before the call that records them."""
        self.usage = _run_usage(run, self.usage)
        left = _left_over(run)
        await self.call(lambda: self.close(ending, left))

    def end_opening(self, failure: BaseException | None) -> None:
        """End a turn whose opening was cut short (by ``failure``, or a cancel when ``None``),
        if it got as far as recording the turn's start: a turn the log shows open would keep
        the session running. The opening records that start first (or, in one append, with
        all the rest), so anything recorded means the turn started."""
        self.bridge.end_opening(failure)

    def take(self) -> list[Event]:
        """The events recorded since the last take, in order."""
        return self.bridge.take()


@dataclass
class StepSpans(AbstractCapability[Any]):
    """The turn's step span current around each node pydantic-ai runs, so its own spans (its
    instrumentation's model request and tool spans) nest under the step they belong to. Added
    to a run only when the turn is traced (:mod:`nous_inbox.runner.tracing`).

    pydantic-ai opens its request span before the boundary that starts our step is recorded
    (inside the request), so a model request node opens the next step's span first."""

    trace: TurnTrace

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built in code, never from a spec

    async def wrap_node_run(self, ctx: Any, *, node: Any, handler: Any) -> Any:
        if isinstance(node, ModelRequestNode):
            self.trace.begin_request()
        with self.trace.current():
            return await handler(node)


def _usage_counts(usage: Any) -> dict[str, int | float] | None:
    """A pydantic-ai usage as the counts a turn's end records: its non-zero numbers (tokens,
    requests, tool calls, cost) and details; ``None`` when the model reported nothing."""
    return None if usage is None else numeric_counts(vars(usage), getattr(usage, "details", {}))


def _left_over(run: Any) -> list[ModelRequestPart]:
    """What a run that stopped holds but no request showed yet: the results of tools that ran
    (the next request, built and never made, when a cancel ended it at that node) and an
    output tool's return (the run ended on it)."""
    if run is None:
        return []
    messages = run.all_messages()
    parts = trailing_parts(messages)
    try:
        upcoming = run.next_node
    except Exception:  # a failed run re-raises its failure here: it has no next request
        upcoming = None
    request = getattr(upcoming, "request", None)
    if isinstance(request, ModelRequest) and not any(m is request for m in messages):
        parts.extend(request.parts)
    return parts


def _run_usage(run: Any, usage: Any) -> Any:
    try:
        found = usage if run is None else run.usage
        # A method in older pydantic-ai; the property's value is callable too, deprecated.
        return found if hasattr(found, "input_tokens") else found()
    except Exception:  # a run that failed before it had a state
        return usage
