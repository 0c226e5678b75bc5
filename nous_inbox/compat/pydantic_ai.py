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

Where the inbox joins a run (the rulings of ``DESIGN.md``, through pydantic-ai's own hooks):

- A turn opens: ``next_turn`` is claimed (followups, prompts), then ``next_step`` as the first
  step boundary; together they are the run's opening request (pydantic-ai needs a request to
  start from), after the earlier transcript as ``message_history``.
- Every later step boundary, in ``before_model_request``: ``next_step`` is claimed and the claimed
  messages join that very request as user parts (through ``RunContext.enqueue``), after the tool
  results it carries, so a steer sent during a tool call lands after that tool's result.
- A would-be final answer, in ``after_node_run`` when the result is ``End``: a pending *waking*
  message (a steer, not whitespace) is claimed and extends the run by one request (ruling 2);
  an injection alone does not, it waits for the next request something else causes.
- Cancelling ends the run at its next node boundary, recorded as ``"cancelled"`` (ruling 9): the
  results of tools that ran before it are recorded, and calls it left unrun are answered as
  cancelled, as the built-in runner does, so no call is left for pydantic-ai to answer unlogged.

What is recorded: ``TurnStarted``; the claims (``QueueClaimed``: the claim *is* the transcript
entry, ruling 6); per request ``StepStarted``, ``ModelRequested``, ``ModelReplied`` (the response as
an assistant ``Message``) and a ``ToolCalled`` per tool call, all before the tools run; each tool
result or retry prompt the model is then shown as ``ToolReturned`` (a retry prompt not tied to a
tool, as ``Nudged``), an output tool's return included; ``StepEnded`` and ``TurnEnded``. A call an
older log left open is answered as pydantic-ai answers it to the model ("interrupted") when the
next turn opens, so the replayed transcript is the one the model saw. Design choice: tool results are recorded
from the request that carries them, in pydantic-ai's own rendering, rather than from the tool's
raw return value, because the promise is the transcript *the model saw*. Not recorded: the
agent's instructions and system prompts (configuration, not conversation), and content a host
adds through pydantic-ai's own ``enqueue`` (send it through the inbox to have it kept).

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
import logging
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

try:
    from pydantic_ai import Agent
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import (
        INTERRUPTED_TOOL_RETURN_CONTENT,
        ModelMessage,
        ModelRequest,
        ModelRequestPart,
        ModelResponse,
        RetryPromptPart,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_graph import End
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "nous_inbox.compat.pydantic_ai needs pydantic-ai: pip install 'nous-inbox[pydantic-ai]'"
    ) from exc

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
)
from nous_inbox.inbox import Target
from nous_inbox.journal import claim_event
from nous_inbox.loop import cancelled_result, open_calls
from nous_inbox.message import Message, ToolCall
from nous_inbox.port import JournalPort, SessionPort, check_port
from nous_inbox.session import Session

__all__ = ["AgentRunner", "from_model_response", "to_model_messages"]

logger: Final = logging.getLogger("nous_inbox.compat.pydantic_ai")

_T = TypeVar("_T")
_DONE: Final = object()
#: The recorded events that add a message to the transcript a request shows.
_JOINS_TRANSCRIPT: Final = frozenset({ModelReplied, ToolReturned, Nudged})
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


def _shown_part(part: ModelRequestPart, turn: int, step: int) -> Event | None:
    """The event recording a part pydantic-ai put in a request itself (a tool result, a retry)."""
    if isinstance(part, ToolReturnPart):
        message = Message.tool(part.model_response_str(), part.tool_call_id, name=part.tool_name)
        return ToolReturned(turn=turn, step=step, message=message)
    if isinstance(part, RetryPromptPart):
        text = part.model_response()
        if part.tool_name is not None:
            message = Message.tool(text, part.tool_call_id, name=part.tool_name,
                                   metadata={"error": "retry"})
            return ToolReturned(turn=turn, step=step, message=message)
        return Nudged(turn=turn, step=step, message=Message.user(text))
    return None


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


def _interrupted(call: ToolCall) -> Message:
    """The answer to a call an earlier turn left open, as pydantic-ai words it to the model."""
    return Message.tool(INTERRUPTED_TOOL_RETURN_CONTENT, call.id, name=call.name,
                        metadata={"error": "interrupted"})


@dataclass(frozen=True)
class _Answer:
    """A boundary part: answer every call the transcript leaves open
    (:func:`~nous_inbox.loop.open_calls`; pydantic-ai would answer them itself, unrecorded)
    with ``make(call)``, recorded at ``step``."""

    make: Callable[[ToolCall], Message]
    step: int


_WAKE: Final = object()
"""A boundary part: claim ``next_step`` only if a waking message worth a round is queued."""


# -- the hooks ------------------------------------------------------------------------------------


@dataclass
class _InboxHooks(AbstractCapability[Any]):
    """One turn's bridge between a pydantic-ai run and a session port.

    Built per turn by :class:`AgentRunner` (it holds the turn's counters). The port's methods do
    store I/O, so each hook makes all its port calls in one trip through ``call``.
    """

    port: SessionPort
    call: Callable[[Callable[[], Any]], Any]
    turn: int = 0
    step: int = 0
    opening: bool = True
    recorded: list[Event] = field(default_factory=list)
    #: The request parts recorded already (or the transcript's own), by identity; kept alive so
    #: an id is never reused while it is here.
    seen: dict[int, object] = field(default_factory=dict)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # built in code, never from a spec

    def _write(self, *parts: Event | Target | _Answer | object | None) -> list[Message]:
        """Record a boundary: each event as given, each ``Target`` a claim of that queue,
        ``_WAKE`` a wake-only claim of ``next_step``, an ``_Answer`` an answer to each call left
        open, and ``None`` the ``ModelRequested`` of the request being made (what it shows is
        counted then). One atomic append when the port can (:meth:`JournalPort.commit
        <nous_inbox.port.JournalPort.commit>`), one port call each otherwise. Returns the claimed
        messages, in order."""
        if isinstance(self.port, JournalPort):
            stored, claimed = self.port.commit(lambda session: self._boundary(session, parts))
            self.recorded.extend(stored)
            return claimed
        claimed = []
        for part in parts:
            if isinstance(part, Target) or part is _WAKE:
                target = Target.NEXT_STEP if part is _WAKE else part
                messages, event = self.port.claim(target, wake_only=part is _WAKE)  # type: ignore[arg-type]
                if event is not None:
                    self.recorded.append(event)
                    claimed.extend(messages)
            elif isinstance(part, _Answer):
                for call in open_calls(self.port.session.transcript):
                    answer = ToolReturned(turn=self.turn, step=part.step, message=part.make(call))
                    self.recorded.append(self.port.record(answer))
            else:
                if part is None:
                    count = len(self.port.session.transcript)
                    part = ModelRequested(turn=self.turn, step=self.step, count=count)
                self.recorded.append(self.port.record(part))  # type: ignore[arg-type]
        return claimed

    def _boundary(
        self, session: Session, parts: Sequence[Event | Target | _Answer | object | None]
    ) -> tuple[list[Event], list[Message]]:
        """The events of one boundary, computed from ``session`` (again, if another writer
        appended first): the claims are the core's (:func:`~nous_inbox.journal.claim_event`)."""
        events: list[Event] = []
        claimed: list[Message] = []
        inbox, shown = session.inbox, len(session.transcript)
        for part in parts:
            if isinstance(part, Target) or part is _WAKE:
                messages, event, inbox = claim_event(
                    inbox, Target.NEXT_STEP if part is _WAKE else part,  # type: ignore[arg-type]
                    wake_only=part is _WAKE)
                if event is not None:
                    events.append(event)
                    claimed.extend(messages)
                    shown += len(messages)
            elif isinstance(part, _Answer):
                answered = [e.message.tool_call_id or "" for e in events
                            if type(e) is ToolReturned]
                for call in open_calls(session.transcript, answered):
                    events.append(ToolReturned(turn=self.turn, step=part.step,
                                               message=part.make(call)))
                    shown += 1
            elif part is None:
                events.append(ModelRequested(turn=self.turn, step=self.step, count=shown))
            else:
                events.append(part)  # type: ignore[arg-type]
                shown += type(part) in _JOINS_TRANSCRIPT
        return events, claimed

    def _fresh(self, parts: Iterable[ModelRequestPart]) -> list[Event]:
        """The events recording the parts of ``parts`` pydantic-ai added (tool results, retry
        prompts) that are not recorded yet; claimed messages are recorded by their claim."""
        events: list[Event] = []
        for part in parts:
            if id(part) in self.seen:
                continue
            event = _shown_part(part, self.turn, self.step)
            if event is not None:
                self.seen[id(part)] = part
                events.append(event)
        return events

    # The turn's opening, before the run: TurnStarted, the answers to calls an earlier turn left
    # open (pydantic-ai would answer them itself, unrecorded), next_turn, step 1, next_step.
    def open(self, reason: str) -> list[ModelMessage]:
        self.turn = self.port.session.turn + 1
        self.step = 1
        self._write(TurnStarted(turn=self.turn, reason=reason), _Answer(_interrupted, 0),
                    Target.NEXT_TURN, StepStarted(turn=self.turn, step=1), Target.NEXT_STEP)
        history = to_model_messages(self.port.session.transcript)
        for message in history:
            for part in message.parts:
                self.seen[id(part)] = part  # the transcript's own: recorded already
        return history

    def _next_step(self, shown: Sequence[ModelRequestPart]) -> Sequence[Message]:
        parts: list[Event | Target | None] = list(self._fresh(shown))
        parts.append(StepEnded(turn=self.turn, step=self.step))
        self.step += 1
        parts += [StepStarted(turn=self.turn, step=self.step), Target.NEXT_STEP, None]
        return self._write(*parts)

    async def before_model_request(self, ctx: Any, request_context: Any) -> Any:
        """Step boundary: record what the request shows, claim ``next_step`` into it."""
        if self.opening:
            self.opening = False
            await self.call(lambda: self._write(None))
            return request_context
        shown = _trailing_parts(request_context.messages)
        claimed = await self.call(lambda: self._next_step(shown))
        if claimed:
            ctx.enqueue(*_parts(claimed))
        return request_context

    def _replied(self, message: Message) -> None:
        self._write(ModelReplied(turn=self.turn, step=self.step, message=message),
                    *(ToolCalled(turn=self.turn, step=self.step, call=call)
                      for call in message.tool_calls))

    async def after_model_request(self, ctx: Any, *, request_context: Any, response: Any) -> Any:
        """The reply, and every tool call it asks for, recorded before any tool runs."""
        message = from_model_response(response)
        await self.call(lambda: self._replied(message))
        return response

    def _claim_if_waking(self, shown: Sequence[ModelRequestPart]) -> Sequence[Message]:
        # What the answer's request holds (an output tool's return) first, then the claim: the
        # order the model sees them in if the run goes on. The claim is the core's rule.
        return self._write(*self._fresh(shown), _WAKE)

    async def after_node_run(self, ctx: Any, *, node: Any, result: Any) -> Any:
        """A would-be final answer: a pending steer extends the run by one request (ruling 2)."""
        if isinstance(result, End):
            shown = _trailing_parts(ctx.messages)
            claimed = await self.call(lambda: self._claim_if_waking(shown))
            if claimed:
                ctx.enqueue(*_parts(claimed))  # pydantic-ai redirects End into one more request
        return result

    def close(
        self, reason: TurnEndReason, error: str | None = None,
        left_over: Sequence[ModelRequestPart] = (),
    ) -> None:
        """End the turn. What the run holds but never showed is recorded first (results of tools
        that ran before a cancel, an output tool's return), then every call still open is
        answered as cancelled (ruling 9, as the built-in runner does), so the transcript the
        next run continues from is the one the log holds, with no call pydantic-ai would answer
        on its own."""
        ended = TurnEnded(turn=self.turn, steps=self.step, reason=reason, error=error)
        parts: list[Event | _Answer] = [*self._fresh(left_over), _Answer(
            lambda call: cancelled_result(call), self.step)]
        if self.step:
            parts.append(StepEnded(turn=self.turn, step=self.step))
        self._write(*parts, ended)

    def take(self) -> list[Event]:
        taken, self.recorded = self.recorded, []
        return taken


# -- the runner -----------------------------------------------------------------------------------


class _Flag(Protocol):
    """A cancel flag: an ``asyncio.Event``, a ``threading.Event``, or :class:`_Either`."""

    def is_set(self) -> bool:
        """Whether the turn should end at its next node."""


class _Either:
    """A cancel flag that is set when the host's is, or when :meth:`set` was called."""

    __slots__ = ("_host", "_mine")

    def __init__(self, host: threading.Event | None) -> None:
        self._host = host
        self._mine = threading.Event()

    def set(self) -> None:
        self._mine.set()

    def is_set(self) -> bool:
        return self._mine.is_set() or (self._host is not None and self._host.is_set())


async def _offloaded(fn: Callable[[], _T]) -> _T:
    return await asyncio.to_thread(fn)


def _caller(port: SessionPort, offload: bool) -> Callable[[Callable[[], Any]], Any]:
    """How this turn calls ``port``: through the port's own ``call_io`` when it has one (an
    ``AsyncOwner``'s: its store worker, in order with the owner's other store calls; ``None``
    when its store does not block: inline), else in a thread when ``offload``, else inline."""
    found: Any = getattr(port, "call_io", _NO_CALL_IO)
    if found is _NO_CALL_IO:
        return _offloaded if offload else _inline
    if found is None:
        return _inline
    call_io: Callable[..., Awaitable[Any]] = found

    async def through(fn: Callable[[], _T]) -> _T:
        result: _T = await call_io(fn)
        return result

    return through


async def _inline(fn: Callable[[], _T]) -> _T:
    return fn()


class AgentRunner:
    """Runs turns of a pydantic-ai ``agent`` over a session port: one pydantic-ai run per turn.

    Give it to an owner (``AsyncOwner(store, stream, AgentRunner(agent))``, or the threaded
    ``Owner``); ``run_kwargs`` pass through to ``agent.iter`` (``deps``, ``usage_limits``,
    ``model_settings``, ...). A port that says where its calls belong (``call_io``, as an
    ``AsyncOwner``'s does) is called there; any other is called in a thread (``asyncio.to_thread``),
    or inline with ``offload=False`` (an in-memory port, where the hop costs more than the call).
    """

    def __init__(self, agent: Agent[Any, Any], *, offload: bool = True, **run_kwargs: Any) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"AgentRunner needs a pydantic_ai.Agent, got {type(agent).__name__}")
        for name in ("user_prompt", "message_history", "capabilities"):
            if name in run_kwargs:
                raise TypeError(
                    f"AgentRunner sets {name} itself (from the inbox and the transcript); "
                    f"do not pass it"
                )
        self.agent = agent
        self.offload = bool(offload)
        self.run_kwargs = run_kwargs

    def arun_turn(
        self,
        port: SessionPort,
        *,
        reason: str = "wake",
        cancel: asyncio.Event | threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """Run one turn on ``port`` under asyncio, yielding each event as it is recorded.

        Setting ``cancel`` ends the run at its next node boundary as ``"cancelled"``; so does
        closing the iterator early or cancelling its task. A failing model ends the turn as
        ``"error"``, recorded, and the exception is re-raised.
        """
        check_port(port)
        return self._arun(port, reason, cancel)

    async def _arun(self, port: SessionPort, reason: str, cancel: _Flag | None) -> AsyncIterator[Event]:
        hooks = _InboxHooks(port, _caller(port, self.offload))
        opening = asyncio.ensure_future(hooks.call(lambda: hooks.open(reason)))
        try:
            history = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The opening goes on where the port's calls run; a turn it opens is ended here.
            while not opening.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait((opening,))
            if not opening.cancelled() and opening.exception() is None:
                try:
                    await asyncio.shield(hooks.call(lambda: hooks.close("cancelled")))
                except BaseException:
                    logger.exception("could not record the end of a cancelled turn")
            raise
        ending: TurnEndReason = "cancelled"  # unless the run says otherwise below
        error: str | None = None
        run: Any = None
        try:
            # Inside the try: a consumer that stops reading at the opening's events (aclose,
            # break) still has the turn ended.
            for event in hooks.take():
                yield event
            if history and isinstance(history[-1], ModelRequest):
                async with self.agent.iter(
                    None, message_history=history, capabilities=[hooks], **self.run_kwargs
                ) as run:
                    async for _node in run:
                        for event in hooks.take():
                            yield event
                        if cancel is not None and cancel.is_set():
                            break
                    else:
                        ending = "final"
            else:
                ending = "final"  # nothing to answer: the turn claimed nothing new
        except UsageLimitExceeded as exc:
            ending, error = "budget", str(exc)
        except Exception as exc:
            ending, error = "error", f"{type(exc).__name__}: {exc}"
            left = _left_over(run)
            await hooks.call(lambda: hooks.close("error", error, left))
            for event in hooks.take():
                yield event
            raise
        finally:
            if ending == "cancelled":
                # Cancelled, or the consumer stopped reading (aclose, its task cancelled): the
                # end is still recorded where the port's calls belong.
                try:
                    left = _left_over(run)
                    await hooks.call(lambda: hooks.close("cancelled", left_over=left))
                except BaseException:
                    logger.exception("could not record the end of a cancelled turn")
        if ending != "cancelled":
            left = _left_over(run)
            await hooks.call(lambda: hooks.close(ending, error, left))
        for event in hooks.take():
            yield event

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
        stop = _Either(cancel)  # set too when the consumer stops reading
        running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []

        async def pump() -> None:
            task = asyncio.current_task()
            assert task is not None
            running.append((asyncio.get_running_loop(), task))
            async for event in self._arun(port, reason, stop):
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
