"""pydantic-ai adapter: a real pydantic-ai ``Agent`` whose runs read a durable inbox.

The idea: pydantic-ai already knows where a run's step boundaries are (its capability hooks); this
module puts the inbox behind them and records everything in the session's store, so a message
sent from another process (``nous-inbox steer --store URL S "text"``) reaches a running agent at
its next model request, survives a crash, and a replay of the log gives back the transcript the
model was shown. :class:`AgentRunner` is a turn runner for an :class:`~nous_inbox.owner.Owner`
or :class:`~nous_inbox.async_owner.AsyncOwner`; each turn is one pydantic-ai run.

>>> import asyncio
>>> from pydantic_ai import Agent
>>> from pydantic_ai.messages import ModelResponse, TextPart
>>> from pydantic_ai.models.function import FunctionModel
>>> from nous_inbox.port import LocalSession
>>> def reply(messages, info):
...     return ModelResponse(parts=[TextPart(f"heard {len(messages)} message(s)")])
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> async def turn():
...     return [type(e).__name__ async for e in AgentRunner(Agent(FunctionModel(reply))).arun_turn(local)]
>>> asyncio.run(turn())  # doctest: +NORMALIZE_WHITESPACE
['TurnStarted', 'QueueClaimed', 'StepStarted', 'ModelRequested', 'ModelReplied', 'StepEnded',
 'TurnEnded']
>>> [m.content for m in local.session.transcript]
['hello', 'heard 1 message(s)']

Where the inbox joins a run. The loop (:mod:`nous_inbox.loop`) decides every boundary, as it
does for the built-in runner; the hooks tell it what pydantic-ai did and carry out what it says:

- A turn opens: the loop claims ``next_turn`` (followups, prompts), then ``next_step`` (ruling 1);
  the run starts from the loop's first request, the earlier transcript as ``message_history``.
- Every later step boundary, in ``before_model_request``: the tool results pydantic-ai shows are
  the loop's ``ToolsFinished``, its own retry prompt a ``Retried``; what the loop then claims
  joins that very request (through ``RunContext.enqueue``), after the tool results, so a steer
  sent during a tool call lands after that tool's result. When the loop ends the turn there
  instead (a spent budget, ruling 5: ``max_steps``, as for the runner), the run stops before
  the request.
- The run would end (``after_node_run`` with ``End``: a text answer, or an output tool's return,
  ``ToolsFinished(final=True)``): the loop's wake-only claim extends the run by one request for a
  pending steer (ruling 2), not for an injection alone; after a blank reply its plain claim
  delivers a pending message, else its nudge (rulings 3 and 4).
- Cancelling ends the run at its next node boundary, recorded as ``"cancelled"`` (ruling 9): the
  results of tools that ran before it are recorded, and calls it left unrun are answered as
  cancelled, as the built-in runner does, so no call is left for pydantic-ai to answer unlogged.

Where pydantic-ai decides first: it answers an empty reply itself, with a retry prompt counted
against its output retries, so a pending message joins that prompt rather than replacing it
(ruling 3), and a run of empty replies ends as an error at its retry limit, before the step
budget would.

What is recorded: ``TurnStarted``; the claims (``QueueClaimed``: the claim *is* the transcript
entry, ruling 6); per request ``StepStarted``, ``ModelRequested``, ``ModelReplied`` (the response as
an assistant ``Message``) and a ``ToolCalled`` per tool call, all before the tools run; each tool
result or retry prompt the model is then shown as ``ToolReturned`` (pydantic-ai's own retry
prompt, as ``Nudged``), an output tool's return included; ``StepEnded`` and ``TurnEnded``, which
carries the run's usage and its output as JSON (unless the output is the final reply's text), so
a prompt's result (:mod:`nous_inbox.turn_result`) gives ``output`` typed again
(:meth:`AgentRunner.load_output`), live or after a restart. A call an
older log left open is answered as pydantic-ai answers it to the model ("interrupted") when the
next turn opens, so the replayed transcript is the one the model saw. Design choice: tool results are recorded
from the request that carries them, in pydantic-ai's own rendering, rather than from the tool's
raw return value, because the promise is the transcript *the model saw*. Not recorded: the
agent's instructions and system prompts (configuration, not conversation: they reach the model
at every turn, the system prompts at the start of the history, as a bare run shows them), and
content a host adds through pydantic-ai's own ``enqueue`` (send it through the inbox to have it
kept).

Store I/O never runs on the event loop. Each hook makes all its port calls in one trip, and
records what it records in one append (:meth:`JournalPort.commit
<nous_inbox.port.JournalPort.commit>`): a model request costs two transactions, the boundary
before it (what the request shows, the step, the claim) and the reply after it. The trip goes
where the port says (an ``AsyncOwner``'s port: its store worker, or inline when its store does
not block), else to a thread (``asyncio.to_thread``), or inline with ``offload=False`` (an
in-memory port, where a thread hop costs more than the call).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar, Union

import msgspec

try:
    from pydantic import TypeAdapter
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import (
        INTERRUPTED_TOOL_RETURN_CONTENT,
        ModelMessage,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        RetryFeedbackPart,
        RetryPromptPart,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_core import to_jsonable_python
    from pydantic_graph import End
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "nous_inbox.compat.pydantic_ai needs pydantic-ai: pip install 'nous-inbox[pydantic-ai]'"
    ) from exc

from nous_inbox.events import Event, Nudged, ToolReturned, TurnEnded, Warned
from nous_inbox.journal import claim_event
from nous_inbox.loop import (
    Advance,
    CallModel,
    Cancelled,
    Claim,
    ClaimAnswered,
    EndTurn,
    Failed,
    Happening,
    LoopState,
    ModelAnswered,
    Phase,
    Retried,
    ToolsFinished,
    TurnOpened,
    advance,
    cancelled_result,
    new_state,
    open_calls,
)
from nous_inbox.message import Message, ToolCall, freeze_json
from nous_inbox.port import ClaimGuard, JournalPort, SessionPort, check_port, describe_error
from nous_inbox.session import Session

__all__ = ["AgentRunner", "from_model_response", "to_model_messages"]

logger: Final = logging.getLogger("nous_inbox.compat.pydantic_ai")

_T = TypeVar("_T")
_DONE: Final = object()
_NO_CALL_IO: Final = object()


# -- one transcript, two spellings ------------------------------------------------------------------


def to_model_messages(transcript: Iterable[Message]) -> list[ModelMessage]:
    """Our transcript as pydantic-ai's message history: what a new run continues from.

    Consecutive user, system and tool entries make one ``ModelRequest`` (as pydantic-ai builds
    them: tool results, then what joined them); an assistant entry is one ``ModelResponse``.

    >>> from nous_inbox.message import ToolCall
    >>> history = to_model_messages([
    ...     Message.user("list files"),
    ...     Message.assistant(tool_calls=[ToolCall("c1", "ls", {})]),
    ...     Message.tool("a.txt", "c1", name="ls"),
    ...     Message.user("only text files"),
    ... ])
    >>> [(type(m).__name__, [p.part_kind for p in m.parts]) for m in history]
    [('ModelRequest', ['user-prompt']), ('ModelResponse', ['tool-call']), ('ModelRequest', ['tool-return', 'user-prompt'])]
    """
    history: list[ModelMessage] = []
    parts: list[ModelRequestPart] = []
    for message in transcript:
        if message.role == "assistant":
            if parts:
                history.append(ModelRequest(parts=parts))
                parts = []
            history.append(_as_response(message))
        else:
            parts.append(_as_request_part(message))
    if parts:
        history.append(ModelRequest(parts=parts))
    return history


def _as_request_part(message: Message) -> ModelRequestPart:
    if message.role == "system":
        return SystemPromptPart(content=message.content)
    if message.role == "tool":
        return ToolReturnPart(
            tool_name=message.name or "", content=message.content,
            tool_call_id=message.tool_call_id or "",
        )
    return UserPromptPart(content=message.content)


def _as_response(message: Message) -> ModelResponse:
    parts: list[Any] = [TextPart(content=message.content)] if message.content else []
    parts.extend(
        ToolCallPart(tool_name=call.name, args=dict(call.arguments), tool_call_id=call.id)
        for call in message.tool_calls
    )
    return ModelResponse(parts=parts)


def from_model_response(response: ModelResponse) -> Message:
    """A pydantic-ai response as the assistant ``Message`` the transcript keeps.

    Text parts are joined; each tool call keeps its id, name and arguments. Other parts (thinking,
    files, native tool calls) are not part of what a later request shows the model as text.

    >>> from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    >>> from_model_response(ModelResponse(parts=[TextPart("looking"), ToolCallPart("ls", {"d": "."}, "c1")]))
    Message(role='assistant', content='looking', tool_calls=(ToolCall(id='c1', name='ls', arguments={'d': '.'}),))
    """
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    calls = [
        ToolCall(p.tool_call_id, p.tool_name, p.args_as_dict())
        for p in response.parts
        if isinstance(p, ToolCallPart)
    ]
    return Message.assistant(text, calls)


def _parts(messages: Sequence[Message]) -> list[ModelRequestPart]:
    return [_as_request_part(m) for m in messages]


def _trailing_parts(messages: Sequence[ModelMessage]) -> list[ModelRequestPart]:
    """The parts of the requests after the last response: what the next request shows anew
    (pydantic-ai may keep them as several requests: an output tool's return, then what joined)."""
    parts: list[ModelRequestPart] = []
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            break
        parts[:0] = message.parts
    return parts


def _left_over(run: Any) -> list[ModelRequestPart]:
    """What a run that stopped holds but no request showed yet: the results of tools that ran
    (the next request, built and never made, when a cancel ended it at that node) and an
    output tool's return (the run ended on it)."""
    if run is None:
        return []
    messages = run.all_messages()
    parts = _trailing_parts(messages)
    try:
        upcoming = run.next_node
    except Exception:  # a failed run re-raises its failure here: it has no next request
        upcoming = None
    request = getattr(upcoming, "request", None)
    if isinstance(request, ModelRequest) and not any(m is request for m in messages):
        parts.extend(request.parts)
    return parts


class _TurnOver(Exception):
    """Raised from a hook when the loop ends the turn where pydantic-ai would make a request
    (a spent budget, ruling 5): the run stops there, the request unmade."""


_CLAIMS: Final = object()
"""A boundary part: make the claims the loop asks for now, until it asks for something else."""

_Part = Event | Happening | object
"""What a boundary records, in order: an event as given, a happening the loop advances by (its
events recorded), or ``_CLAIMS``."""


def _walk(adv: Advance, parts: Sequence[_Part], claim: Callable[[Claim], Sequence[Message]],
          emit: Callable[[Any], None]) -> tuple[Advance, list[Message]]:
    """Advance the loop through ``parts``, emitting every event in order, and at ``_CLAIMS``
    making each claim the loop asks for with ``claim``. What is claimed and how, and whether the
    run goes on, is the loop's table; this only carries it out. Returns where the loop stands
    and what the next request must carry that pydantic-ai does not put there itself (the
    claimed messages and the loop's own nudge), in order."""
    deliver: list[Message] = []
    for part in parts:
        if isinstance(part, _HAPPENINGS):
            if adv.state.phase is not Phase.ENDED:
                adv = advance(adv.state, part)
                for event in adv.events:
                    emit(event)
            continue
        if part is not _CLAIMS:
            emit(part)
            continue
        while isinstance(adv.command, Claim):
            command = adv.command
            messages = claim(command)
            deliver.extend(messages)
            adv = advance(adv.state, ClaimAnswered(command.target, messages))
            for event in adv.events:
                emit(event)
                if type(event) is Nudged:  # the loop's own nudge: pydantic-ai has not shown it
                    deliver.append(event.message)
    return adv, deliver


_HAPPENINGS: Final = (TurnOpened, ModelAnswered, ToolsFinished, Retried, Cancelled, Failed)


# -- the hooks ------------------------------------------------------------------------------------


@dataclass
class _InboxHooks(AbstractCapability[Any]):
    """One turn's bridge between a pydantic-ai run and a session port.

    Built per turn by :class:`AgentRunner`. It keeps the loop's state (``nous_inbox.loop``) and
    tells it what happened at each of pydantic-ai's boundaries; the loop says what to claim,
    whether the run goes on, and what to record. The port's methods do store I/O, so each hook
    makes all its port calls in one trip through ``call``.
    """

    port: SessionPort
    call: Callable[[Callable[[], Any]], Any]
    start: LoopState
    adv: Advance = field(init=False)
    #: How a port that is not a journal is claimed from: guarded (ruling 7).
    claims: ClaimGuard = field(init=False)
    opening: bool = True
    recorded: list[Event] = field(default_factory=list)
    #: The run's usage (pydantic-ai's, updated in place) and its output once it has one: what
    #: the turn's end records.
    usage: Any = None
    output: Any = None
    #: The request parts recorded already (or the transcript's own), by identity; kept alive so
    #: an id is never reused while it is here.
    seen: dict[int, object] = field(default_factory=dict)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built in code, never from a spec

    def _write(self, *parts: _Part) -> list[Message]:
        """Record a boundary (see :func:`_walk`): one atomic append when the port can
        (:meth:`JournalPort.commit <nous_inbox.port.JournalPort.commit>`, worked out again from
        the new session if another writer appended first), one port call each otherwise. Returns
        what the next request must carry."""
        before = len(self.recorded)
        if isinstance(self.port, JournalPort):
            if getattr(self.port, "heard", False) and any(p is _CLAIMS for p in parts):
                self._reaching(parts)
            def boundary(session: Session) -> tuple[list[Event], tuple[Advance, list[Message]]]:
                events: list[Event] = []
                inbox = session.inbox

                def claim(command: Claim) -> Sequence[Message]:
                    nonlocal inbox
                    messages, event, inbox = claim_event(
                        inbox, command.target, wake_only=command.wake_only)
                    if event is not None:
                        events.append(event)
                    return messages

                return events, _walk(self.adv, parts, claim,
                                     lambda event: events.append(self._finished(event)))

            stored, walked = self.port.commit(boundary)
            self.recorded.extend(stored)
        else:
            def claim(command: Claim) -> Sequence[Message]:
                messages, events = self.claims.claim(command.target, wake_only=command.wake_only)
                self.recorded.extend(events)
                return messages

            walked = _walk(self.adv, parts, claim,
                           lambda event: self.recorded.append(self.port.record(self._finished(event))))
        self.adv, deliver = walked
        for event in self.recorded[before:]:
            if isinstance(event, Warned) and event is not self.claims.warning:
                logger.warning(event.text)  # the loop's budget warning: a log line too
        return deliver

    def _finished(self, event: Any) -> Any:
        """A turn's end with what the run reported: its output (as JSON; only when it is more
        than the final reply's text) and its usage (the counts the model reported)."""
        if type(event) is not TurnEnded:
            return event
        usage = _usage_counts(self.usage)
        output = self.output
        reply = self.adv.state.transcript[-1] if self.adv.state.transcript else None
        if isinstance(output, str) and reply is not None and reply.content == output:
            output = None  # the final reply says it already
        if output is None and usage is None:
            return event
        if output is not None:
            output = freeze_json(to_jsonable_python(output), "the run's output")
        return msgspec.structs.replace(event, output=output, usage=usage)

    def _reaching(self, parts: Sequence[_Part]) -> None:
        """Tell the owner's boundary subscribers of each claim this boundary will make, before
        the one commit that makes them (a send of theirs must not land inside that commit):
        the claims are the loop's, worked out on a dry walk that claims nothing."""
        reaching = self.port.reaching  # type: ignore[attr-defined]
        claims: list[Claim] = []

        def claim(command: Claim) -> Sequence[Message]:
            claims.append(command)
            return ()

        _walk(self.adv, parts, claim, lambda event: None)
        for command in claims:
            reaching(command.target, self.adv.state.turn, wake_only=command.wake_only)

    def _deliver(self, ctx: Any, messages: Sequence[Message]) -> None:
        if messages:
            parts = _parts(messages)
            for part in parts:
                self.seen[id(part)] = part  # recorded by its claim (or as the loop's nudge)
            ctx.enqueue(*parts)

    def open(self, reason: str) -> list[ModelMessage]:
        """The turn's opening, before the run: ``TurnStarted``, the answers to calls an earlier
        turn left open (pydantic-ai would answer them itself, unrecorded), then the loop's
        claims. Returns the history the run starts from: what the loop's first request shows."""
        self.claims = ClaimGuard(self.port)
        session = self.port.session
        answers = [  # as pydantic-ai words the answer to a call left open
            Message.tool(INTERRUPTED_TOOL_RETURN_CONTENT, call.id, name=call.name,
                         metadata={"error": "interrupted"})
            for call in open_calls(session.transcript)]
        turn = session.turn + 1
        opened = advance(self.start, TurnOpened(turn, reason, [*session.transcript, *answers]))
        self.adv = opened._replace(events=())
        self._write(*opened.events, *(ToolReturned(turn=turn, step=0, message=m) for m in answers),
                    _CLAIMS)
        command = self.adv.command
        history = to_model_messages(command.transcript) if type(command) is CallModel else []
        for message in history:
            for part in message.parts:
                self.seen[id(part)] = part  # the transcript's own: recorded already
        return history

    def _happenings(self, shown: Sequence[ModelRequestPart], final: bool = False) -> list[_Part]:
        """What a request (or a run's end) shows that pydantic-ai put there itself and is not
        recorded yet, as the loop's happenings: the results of the calls the loop waits for (a
        retry prompt answering a call is its result), then pydantic-ai's own retry prompts."""
        by_id: dict[str, Message] = {}
        retries: list[_Part] = []
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
        if self.adv.state.phase is not Phase.TOOLS:
            return retries
        calls = self.adv.state.calls
        results = [by_id.get(call.id) or cancelled_result(call) for call in calls]
        return [ToolsFinished(results, final=final), *retries]

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        """A step boundary: the results pydantic-ai shows, then the loop's claim into this very
        request, after them (or the end of the turn, when the loop says so)."""
        self.usage = ctx.usage
        if self.opening:
            self.opening = False  # the opening claimed already
            return request_context
        parts = self._happenings(_trailing_parts(request_context.messages))
        deliver = await self.call(lambda: self._write(*parts, _CLAIMS))
        if type(self.adv.command) is EndTurn:
            raise _TurnOver
        self._deliver(ctx, deliver)
        return request_context

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: Any) -> Any:
        """The reply, and every tool call it asks for, recorded before any tool runs."""
        message = from_model_response(response)
        await self.call(lambda: self._write(ModelAnswered(message)))
        return response

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        """The run would end: the loop's claim decides whether it goes on, by a waking message
        (ruling 2) or after a blank reply, which a pending message or the loop's nudge follows
        (rulings 3 and 4)."""
        if isinstance(result, End):
            self.usage, self.output = ctx.usage, getattr(result.data, "output", None)
            parts = self._happenings(_trailing_parts(ctx.messages), final=True)
            deliver = await self.call(lambda: self._write(*parts, _CLAIMS))
            self._deliver(ctx, deliver)  # pydantic-ai redirects End into one more request
        return result

    def close(self, ending: Cancelled | Failed, left_over: Sequence[ModelRequestPart] = ()) -> None:
        """End the turn, unless the loop ended it. What the run holds but never showed is
        recorded first (results of tools that ran before a cancel), every call still open is
        answered as cancelled (ruling 9, as the built-in runner does), and nothing is claimed."""
        if self.adv.state.phase is Phase.ENDED:
            return
        self._write(*self._happenings(left_over), ending)

    def end_opening(self, failure: BaseException | None) -> None:
        """End a turn whose opening was cut short (by ``failure``, or a cancel when ``None``),
        if it got as far as recording the turn's start: a turn the log shows open would keep
        the session running. The opening records that start first (or, in one append, with
        all the rest), so anything recorded means the turn started."""
        if self.recorded:
            self.close(Cancelled() if failure is None else Failed(describe_error(failure)))

    def take(self) -> list[Event]:
        taken, self.recorded = self.recorded, []
        return taken


# -- the runner -----------------------------------------------------------------------------------


class _Flag(Protocol):
    """A cancel flag: an ``asyncio.Event`` or a ``threading.Event``."""

    def is_set(self) -> bool:
        """Whether the turn should end at its next node."""


def _usage_counts(usage: Any) -> dict[str, int | float] | None:
    """A pydantic-ai usage as the counts a turn's end records: its non-zero numbers (tokens,
    requests, tool calls, cost) and details; ``None`` when the model reported nothing."""
    if usage is None:
        return None
    counts: dict[str, int | float] = {}
    for name, value in [*vars(usage).items(), *getattr(usage, "details", {}).items()]:
        if type(value) in (int, float) and value and math.isfinite(value):
            counts.setdefault(name, value)
    return counts or None


async def _offloaded(fn: Callable[[], _T]) -> _T:
    return await asyncio.to_thread(fn)


def _caller(port: SessionPort, offload: bool) -> Callable[[Callable[[], Any]], Any]:
    """How this turn calls ``port``: through the port's own ``call_io`` when it has one (an
    ``AsyncOwner``'s: its store worker, in order with the owner's other store calls; ``None``
    when its store does not block: inline), else in a thread when ``offload``, else inline."""
    call_io: Any = getattr(port, "call_io", _NO_CALL_IO)
    if call_io is _NO_CALL_IO:
        return _offloaded if offload else _inline
    return _inline if call_io is None else call_io


async def _inline(fn: Callable[[], _T]) -> _T:
    return fn()


def _options(port: SessionPort) -> dict[str, Any]:
    """The run options the prompts this turn claimed came with (an owner's port keeps them)."""
    return dict(getattr(port, "turn_options", None) or {})


def _run_usage(run: Any, usage: Any) -> Any:
    try:
        found = usage if run is None else run.usage
        # A method in older pydantic-ai; the property's value is callable too, deprecated.
        return found if hasattr(found, "input_tokens") else found()
    except Exception:  # a run that failed before it had a state
        return usage


_NO_ADAPTER: Final = object()


def _adapter(output_type: Any) -> TypeAdapter[Any] | None:
    """The pydantic adapter that rebuilds a recorded output of ``output_type``: the type itself,
    the types a marker (``ToolOutput``, ``NativeOutput``, ...) wraps, a list of types as their
    union; ``None`` for text and what is not a type (an output function)."""
    if isinstance(output_type, (list, tuple)):
        types = [t for item in output_type for t in _wrapped(item)]
    else:
        types = _wrapped(output_type)
    types = [t for t in types if t is not str]
    if not types or any(callable(t) and not isinstance(t, type) and not hasattr(t, "__origin__")
                        for t in types):
        return None
    try:
        return TypeAdapter(types[0] if len(types) == 1 else Union[tuple(types)])  # type: ignore[arg-type]  # noqa: UP007
    except Exception:
        return None


def _wrapped(spec: Any) -> list[Any]:
    if isinstance(spec, type) or hasattr(spec, "__origin__"):
        return [spec]
    inner = getattr(spec, "outputs", None) or getattr(spec, "output", None)
    if inner is None:
        return [spec]
    return list(inner) if isinstance(inner, (list, tuple)) else [inner]


_UNDELIVERABLE: Final = {
    "tool": "it takes a tool result only as the answer to a call of its own run",
    "assistant": "it takes the model's words only from the model",
}


class AgentRunner:
    """Runs turns of a pydantic-ai ``agent`` over a session port: one pydantic-ai run per turn.

    Give it to an owner (``AsyncOwner(store, stream, AgentRunner(agent))``, or the threaded
    ``Owner``); ``max_steps`` bounds the model requests since the last delivered message, as
    :class:`~nous_inbox.runner.Runner`'s does (ruling 5); ``run_kwargs`` pass through to ``agent.iter`` (``deps``, ``usage_limits``,
    ``model_settings``, ...), and so do the options given with a prompt, for its turn
    (``owner.prompt(text, deps=..., model_settings=...)``, read from the owner's port as
    ``turn_options``: they win over these). A port that says where its calls belong (``call_io``, as an
    ``AsyncOwner``'s does) is called there; any other is called in a thread (``asyncio.to_thread``),
    or inline with ``offload=False`` (an in-memory port, where the hop costs more than the call).
    """

    def __init__(
        self, agent: Agent[Any, Any], *, max_steps: int = 10, offload: bool = True,
        **run_kwargs: Any,
    ) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"AgentRunner needs a pydantic_ai.Agent, got {type(agent).__name__}")
        self.check_run_options(run_kwargs)
        self._start = new_state(max_steps)
        self.agent = agent
        self.offload = bool(offload)
        self.run_kwargs = run_kwargs
        self._output_adapter: Any = _NO_ADAPTER

    @staticmethod
    def check_run_options(options: dict[str, Any]) -> None:
        """Refuse run options this runner sets itself: a ``TypeError`` naming the option. An
        owner asks this of the options given with a prompt (``owner.prompt(text, deps=...)``),
        before anything is written; the rest pass through to ``agent.iter`` for that turn."""
        for name in ("user_prompt", "message_history", "capabilities"):
            if name in options:
                raise TypeError(
                    f"AgentRunner sets {name} itself (from the inbox and the transcript); "
                    f"do not pass it"
                )

    def load_output(self, data: Any) -> Any:
        """A turn's output, recorded as JSON, rebuilt as the agent's ``output_type`` (with
        pydantic): what a turn's result gives, live or read back from the log after a restart.
        An output type pydantic cannot rebuild from JSON alone (an output function) gives the
        JSON as recorded.

        >>> from pydantic import BaseModel
        >>> from pydantic_ai.models.test import TestModel
        >>> class Answer(BaseModel):
        ...     value: int
        >>> AgentRunner(Agent(TestModel(), output_type=Answer)).load_output({"value": 4})
        Answer(value=4)
        """
        if self._output_adapter is _NO_ADAPTER:
            self._output_adapter = _adapter(self.agent.output_type)
        if self._output_adapter is None:
            return data
        try:
            return self._output_adapter.validate_python(data)
        except Exception:
            logger.warning("the recorded output does not fit the agent's output type; "
                           "giving it as recorded", exc_info=True)
            return data

    def arun_turn(
        self,
        port: SessionPort,
        *,
        reason: str = "wake",
        cancel: asyncio.Event | threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """Run one turn on ``port`` under asyncio, yielding each event as it is recorded.

        Setting ``cancel`` ends the run at its next node boundary as ``"cancelled"``; so does
        closing the iterator early or cancelling its task. A failing model, or a port that fails
        once the turn has started, ends the turn as ``"error"``, recorded, and the exception is
        re-raised.
        """
        check_port(port)
        return self._arun(port, reason, cancel)

    async def _arun(self, port: SessionPort, reason: str, *cancels: _Flag | None) -> AsyncIterator[Event]:
        hooks = _InboxHooks(port, _caller(port, self.offload), self._start)
        opening = asyncio.ensure_future(hooks.call(lambda: (hooks.open(reason), _options(port))))
        try:
            history, options = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The opening goes on where the port's calls run; a turn it opens is ended here.
            while not opening.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait((opening,))
            failure = None if opening.cancelled() else opening.exception()
            try:
                await asyncio.shield(hooks.call(lambda: hooks.end_opening(failure)))
            except BaseException:
                logger.exception("could not record the end of a cancelled turn")
            raise
        except Exception as exc:  # as a failing run: the turn ends as an error, recorded
            await hooks.call(functools.partial(hooks.end_opening, exc))
            for event in hooks.take():
                yield event
            raise
        ending: Cancelled | Failed | None = Cancelled()  # unless the run says otherwise below
        run: Any = None
        try:
            # Inside the try: a consumer that stops reading at the opening's events (aclose,
            # break) still has the turn ended.
            for event in hooks.take():
                yield event
            if history and isinstance(history[-1], ModelRequest):
                run_kwargs = {**self.run_kwargs, **options}  # this turn's prompts' options win
                await self._with_system_prompts(history, run_kwargs)
                async with self.agent.iter(
                    None, message_history=history, capabilities=[hooks], **run_kwargs
                ) as run:
                    async for _node in run:
                        for event in hooks.take():
                            yield event
                        if any(flag is not None and flag.is_set() for flag in cancels):
                            break
                    else:
                        ending = None  # the loop ended the turn at the run's end
            else:
                ending = Failed("nothing to answer: the turn claimed nothing and the transcript "
                                "ends with the model's reply")
        except _TurnOver:
            ending = None  # the loop ended the turn (a spent budget) before a request
        except Exception as exc:
            failed = Failed(describe_error(exc))
            hooks.usage = _run_usage(run, hooks.usage)
            left = _left_over(run)
            await hooks.call(lambda: hooks.close(failed, left))
            for event in hooks.take():
                yield event
            raise
        finally:
            if type(ending) is Cancelled:
                # Cancelled, or the consumer stopped reading (aclose, its task cancelled): the
                # end is still recorded where the port's calls belong.
                try:
                    hooks.usage = _run_usage(run, hooks.usage)
                    left = _left_over(run)
                    await hooks.call(lambda: hooks.close(Cancelled(), left))
                except BaseException:
                    logger.exception("could not record the end of a cancelled turn")
        if type(ending) is not Cancelled:
            left = _left_over(run)
            await hooks.call(lambda: hooks.close(ending or Cancelled(), left))
        for event in hooks.take():
            yield event

    def check_message(self, message: Message) -> None:
        """Refuse a message this runner cannot deliver to the model as it is: a ``ValueError``
        naming the role. pydantic-ai takes a user or system message in a request; a tool result
        only as the answer to a call of its own run, and an assistant message only from the
        model. A host (or an owner) asks this before it sends, so the log never holds a message
        the model would not see as sent.

        >>> from pydantic_ai.models.test import TestModel
        >>> AgentRunner(Agent(TestModel())).check_message(Message.tool("42", "c1"))
        Traceback (most recent call last):
        ...
        ValueError: AgentRunner cannot deliver a 'tool' message to a pydantic-ai run (it takes a tool result only as the answer to a call of its own run); send it as a 'user' or 'system' message
        """
        why = _UNDELIVERABLE.get(message.role)
        if why is not None:
            raise ValueError(
                f"AgentRunner cannot deliver a {message.role!r} message to a pydantic-ai run "
                f"({why}); send it as a 'user' or 'system' message"
            )

    async def _with_system_prompts(self, history: list[ModelMessage],
                                   run_kwargs: dict[str, Any]) -> None:
        """Put the agent's system prompts at the start of ``history``, as a bare run of the agent
        shows them: pydantic-ai adds them only to a run with no history, and every turn here
        continues one. They are the agent's configuration, not the conversation: not recorded."""
        prompts = await self.agent.system_prompt_parts(
            message_history=history, deps=run_kwargs.get("deps"), model=run_kwargs.get("model"))
        if prompts:
            first = history[0]
            parts = first.parts if isinstance(first, ModelRequest) else []
            history[: 1 if parts else 0] = [ModelRequest(parts=[*prompts, *parts])]

    def run_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """The same turn for a thread (the threaded ``Owner``'s worker): an event loop of its own.

        Events are yielded as the turn records them, in order.
        """
        check_port(port)
        return self._run(port, reason, cancel)

    def _run(
        self, port: SessionPort, reason: str, cancel: threading.Event | None
    ) -> Iterator[Event]:
        # pydantic-ai's run must live in one task, so the turn runs whole on a loop in a thread
        # of its own and hands each event over as it is recorded.
        handed: queue.SimpleQueue[object] = queue.SimpleQueue()
        failure: list[BaseException] = []
        stop = threading.Event()  # set when the consumer stops reading
        running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []

        async def pump() -> None:
            task = asyncio.current_task()
            assert task is not None
            running.append((asyncio.get_running_loop(), task))
            async for event in self._arun(port, reason, cancel, stop):
                handed.put(event)

        def drive() -> None:
            try:
                asyncio.run(pump())
            except BaseException as exc:
                failure.append(exc)
            finally:
                handed.put(_DONE)

        thread = threading.Thread(target=drive, name="nous-inbox pydantic-ai turn", daemon=True)
        thread.start()
        finished = False
        try:
            while (item := handed.get()) is not _DONE:
                yield item  # type: ignore[misc]
            finished = True
        finally:
            if not finished:
                # The consumer stopped reading (an owner closing): end the turn now, not at the
                # next node, which a long model request would put off (the turn still records
                # its end as cancelled, then the thread ends).
                stop.set()
                for loop, task in running:
                    with contextlib.suppress(RuntimeError):  # its loop is already gone
                        loop.call_soon_threadsafe(task.cancel)
            thread.join()
        if failure and finished:
            raise failure[0]

    def __repr__(self) -> str:
        return f"AgentRunner({self.agent!r})"
