"""Runner: one turn body, written once, pumped by a short sync and a short asyncio driver.

A model is any callable, sync or async, ``model(transcript, tools) -> Message`` returning an
assistant message with content and/or tool calls. Tools are plain callables, sync or async (see
:mod:`nous_inbox.runner.tools`). The runner reads and writes the session through a :class:`SessionPort`:
an owner implements it over a durable store; :class:`LocalSession` is the in-memory one.

>>> from nous_inbox.message import Message, ToolCall, enc_hook
>>> def model(transcript, tools):
...     if transcript[-1].role == "tool":
...         return Message.assistant("2 + 3 = " + transcript[-1].content)
...     return Message.assistant(tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 3})])
>>> def add(a: int, b: int) -> int:
...     "Add two numbers."
...     return a + b
>>> local = LocalSession()
>>> _ = local.followup("what is 2 + 3?")
>>> for event in Runner(model, [add]).run_turn(local):
...     print(event.seq, type(event).__name__)
2 TurnStarted
3 QueueClaimed
4 StepStarted
5 ModelRequested
6 ModelReplied
7 ToolCalled
8 ToolReturned
9 StepEnded
10 StepStarted
11 ModelRequested
12 ModelReplied
13 StepEnded
14 TurnEnded
>>> local.session.transcript[-1].content
'2 + 3 = 5'

How a run reads the inbox: the turn's first claim takes ``next_turn`` (followups), and every step
boundary claims ``next_step`` (steers and injections) right before the model request. The rules
(a steer at the would-be final answer extends the run, the budget, nudges, whitespace) are the
loop's (``nous_inbox.loop``) and the inbox's (``Inbox.claim(..., wake_only=True)``): the runner
decides none of them and never inspects the session beyond reading it as a turn opens.

The port (``nous_inbox.runner.port``): ``session``, the folded session, read as a turn opens (turn
number, transcript); ``claim(target, wake_only=...)``, which drains a queue and records the
claim atomically, returning ``(messages, QueueClaimed | None)``; and ``record(event)``. Every
event is recorded before the runner acts on it, and the runner yields exactly the events it
recorded or claimed, in order; messages others send meanwhile are in the log but not the stream.

Failures. A port the runner cannot call is refused with ``TypeError`` when ``run_turn`` is
called, before anything is recorded. A claim that raises or answers in the wrong shape is logged,
recorded as ``Warned``, and the run goes on without the inbox for the rest of the turn (ruling 7:
the port's :class:`~nous_inbox.runner.port.ClaimGuard`, which the adapters claim through too).
A tool that raises, a call to a tool nobody has, arguments that do not fit the tool's annotations,
and a result the log cannot hold (text with a lone surrogate, as ``os.listdir`` returns for a
name that is not UTF-8; a record above the size limit of the store the port records into, its
``max_record_size``) each become an error tool message the model sees, and the run goes on.
A model that raises (or returns something that is not an assistant ``Message`` or ``str``)
ends the turn with reason ``"error"``, recorded, and the exception is re-raised to the consumer.
Closing the stream early (or cancelling the task running ``arun_turn``) ends the turn as
``"cancelled"``, recorded. A cancel records each tool as what it did: a result it returned is
kept, a tool cut off in flight is answered "interrupted" (it started; what it did is unknown),
and one that never started "cancelled", so the model, a replay and a page all read the same.

Sync and async. ``run_turn`` is a generator for sync models and tools (it refuses async ones).
``arun_turn`` is an async generator that awaits async models and tools and, by default, runs sync
ones in a worker thread (``asyncio.to_thread``) so a slow model or tool never blocks the event loop
that steers arrive on; ``Runner(..., offload=False)`` calls them inline (cheaper for trivial
functions). Tool calls run one after another, in the order the model gave them, in both drivers.
The port is called directly from the driving thread or event loop: its methods must be quick.
A port whose calls may block (an ``AsyncOwner``'s over a durable store) says so with a
``call_io`` member, ``call_io(fn, *args) -> Future``: ``arun_turn`` then runs each stretch of the
turn body between two model or tool calls (where the port is called) through it, off the loop.
``call_io`` need not keep order (a plain thread pool will do): a turn cancelled while a stretch
runs waits for that stretch before it closes the body and records the end, and then raises
``CancelledError``.

Design note. As httpx writes an auth flow once, as a generator the client pumps, the turn is one
generator (``Runner._turn``) that does everything that is not a call of the user's code: it
advances the loop, claims and records through the port, and decides what a failure, a cancel or
a bad result means. It yields two kinds of request: a list of events (recorded already: stream
them) and a ``_Call`` (call the model or a tool and send back what it returned, or throw in
what it raised). ``run_turn`` and ``arun_turn`` are the two pumps, a dozen lines each: they
differ only in how a call is made (inline, or awaited against the cancel event) and in how
events are handed on. Closing the body (the pump's ``finally``) is the one place an abandoned
turn is recorded as cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import types
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, Final, NamedTuple, Protocol

import attrs
from msgspec.structs import replace

from nous_inbox.codec import MAX_RECORD_SIZE, MAX_STREAM_NAME, Record, encode_record
from nous_inbox.commands import CallModel, Claim, EndTurn, ToolSpec
from nous_inbox.events import Event, ToolReturned, TurnEnded, Warned
from nous_inbox.happenings import (
    Cancelled,
    ClaimAnswered,
    Failed,
    Happening,
    ModelAnswered,
    ToolsFinished,
    TurnOpened,
    cancelled_result,
    interrupted_result,
)
from nous_inbox.loop import Advance, LoopState, Phase, advance, new_state
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner.port import ClaimGuard, LocalSession, SessionPort, check_port, describe_error
from nous_inbox.runner.tools import Tool, tool
from nous_inbox.session import Session

# The port's names are re-exported: a runner and its port are used together; so are its tools.
__all__ = ["LocalSession", "Model", "Runner", "SessionPort", "Tool", "check_port", "tool"]

logger: Final = logging.getLogger("nous_inbox.runner")

Model = Callable[[Sequence[Message], Sequence[ToolSpec]], "Message | str | Awaitable[Message | str]"]
"""A model: ``model(transcript, tools)`` returns (or, async, resolves to) an assistant Message."""


class _Flag(Protocol):
    """A cancel event: ``threading.Event`` for ``run_turn``, ``asyncio.Event`` for ``arun_turn``."""

    def is_set(self) -> bool: ...


# -- what the turn body asks its pump to do -------------------------------------------------------


class _Call(NamedTuple):
    """Call ``fn(*args, **kwargs)`` (async when ``is_async``); ``what`` names it in errors."""

    fn: Callable[..., Any]
    is_async: bool
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    what: str


_Request = list[Event] | _Call
"""A list: events already recorded, to stream in order. A ``_Call``: send back its result."""


class _Abandoned:
    """What an asyncio pump sends back for a call the cancel event won the race against."""


_NOT_STARTED: Final = _Abandoned()
"""The cancel came before the call: it never started."""
_CUT_OFF: Final = _Abandoned()
"""The cancel came while the call ran: abandoned in flight (a sync one's thread runs on), its
outcome unknown."""


# -- the runner -----------------------------------------------------------------------------------


def _callable_model(model: Model) -> Model:
    if not callable(model):
        raise TypeError(f"model must be callable, got {type(model).__name__}")
    return model


def _by_name(tools: Iterable[Tool | Callable[..., Any]]) -> Mapping[str, Tool]:
    by_name: dict[str, Tool] = {}
    for item in tools:
        wrapped = item if isinstance(item, Tool) else Tool(item)
        if wrapped.name in by_name:
            raise ValueError(f"two tools are named {wrapped.name!r}; tool names must be unique")
        by_name[wrapped.name] = wrapped
    return types.MappingProxyType(by_name)


def _start(self: Runner) -> LoopState:
    return new_state(
        self.max_steps, structured=self.structured, tools=[t.spec for t in self.tools.values()]
    )


@attrs.frozen(eq=False)
class Runner:
    """Runs turns: a model, its tools, and the loop's rules, over any :class:`SessionPort`.

    ``tools`` are :class:`Tool` s or plain callables (wrapped), uniquely named; ``max_steps``
    bounds the model requests since the last delivered message (ruling 5); ``structured=True``
    makes each turn a single model request that claims nothing (ruling 8); ``offload`` (async
    driver only) runs sync models and tools in a worker thread.

    >>> Runner(lambda transcript, tools: "hi", [print], max_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: max_steps must be an int >= 1, got 0
    """

    model: Model = attrs.field(converter=_callable_model, repr=False)
    tools: Mapping[str, Tool] = attrs.field(default=(), converter=_by_name)
    max_steps: int = attrs.field(default=10, kw_only=True)
    structured: bool = attrs.field(default=False, kw_only=True)
    offload: bool = attrs.field(default=True, kw_only=True, converter=bool)
    _start: LoopState = attrs.field(
        init=False, repr=False, default=attrs.Factory(_start, takes_self=True)
    )
    _model_is_async: bool = attrs.field(
        init=False, repr=False,
        default=attrs.Factory(lambda self: inspect.iscoroutinefunction(self.model) or (
            inspect.iscoroutinefunction(getattr(self.model, "__call__", None))  # noqa: B004
        ), takes_self=True),
    )

    def run_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """Run one turn on ``port``, yielding each event as it is recorded.

        Refuses (``TypeError``, nothing recorded) a port it cannot call and async models or tools
        (use :meth:`arun_turn`). ``cancel``, when set, ends the turn at the next point the runner
        checks it: before each claim, model request and tool, and when the model returns.
        """
        limit = self._check(port, reason)
        if self._model_is_async or any(t.is_async for t in self.tools.values()):
            found = "the model" if self._model_is_async else "a tool"
            raise TypeError(f"{found} is async: drive this runner with arun_turn")
        return _pump(self._turn(port, reason, cancel, limit))

    def arun_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: asyncio.Event | None = None
    ) -> AsyncIterator[Event]:
        """Run one turn on ``port`` under asyncio, yielding each event as it is recorded.

        Same turn, same events as :meth:`run_turn`. Async models and tools are awaited; sync ones
        run in a worker thread unless the runner was built with ``offload=False``. Setting
        ``cancel`` abandons a model request or tool in flight (its reply is discarded; a tool cut
        off is answered as interrupted) and ends the turn as ``"cancelled"``; so does cancelling
        the task that iterates. A sync call's thread cannot be stopped: it runs on, unheard.
        """
        limit = self._check(port, reason)
        return _apump(self._turn(port, reason, cancel, limit), cancel, self.offload,
                      getattr(port, "call_io", None))

    def _check(self, port: object, reason: str) -> int:
        """Refuse what the turn could not use; the record limit a tool's result is held to."""
        check_port(port)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        # The limit of the store the port records into (a store may be opened with its own).
        # A port that does not say, or says None (a host's log with no limit of its own), is
        # held to the codec's default: the largest record every reader of the log takes.
        limit = getattr(port, "max_record_size", None)
        if limit is None:
            limit = MAX_RECORD_SIZE
        if type(limit) is not int or limit < 1:
            raise TypeError(
                f"{type(port).__name__}.max_record_size must be an int >= 1 (the largest record "
                f"the port can store, in bytes), got {limit!r}"
            )
        return limit

    # -- the turn, once ---------------------------------------------------------------------------

    def _turn(
        self, port: SessionPort, reason: str, cancel: _Flag | None, limit: int
    ) -> Generator[_Request, Any, None]:
        """The whole turn, as requests to a pump (see the module's design note)."""
        session = port.session
        if not isinstance(session, Session):
            raise TypeError(
                f"{type(port).__name__}.session is a {type(session).__name__}, not a Session"
            )
        adv = advance(self._start, TurnOpened(session.turn + 1, reason, session.transcript))
        claims = ClaimGuard(port)
        error: Exception | None = None
        usage: dict[str, int | float] = {}  # what the model's replies reported, summed
        answered: list[Message] = []  # the running step's tool answers, and the tool in flight
        running: ToolCall | None = None
        try:
            while True:
                # Record all of a step's events before streaming any, so a consumer that stops
                # reading never leaves half of them unrecorded.
                if adv.events:
                    yield _record_all(port, _with_usage(adv.events, usage) if usage else adv.events)
                command = adv.command
                kind = type(command)
                happening: Happening
                if kind is EndTurn:
                    break
                if cancel is not None and cancel.is_set():
                    happening = Cancelled()
                elif kind is Claim:
                    asked: Claim = command  # type: ignore[assignment]
                    messages, shown = claims.claim(asked.target, wake_only=asked.wake_only)
                    happening = ClaimAnswered(asked.target, messages)
                    if shown:
                        yield shown
                elif kind is CallModel:
                    ask: CallModel = command  # type: ignore[assignment]
                    try:
                        value = yield _Call(self.model, self._model_is_async,
                                            (ask.transcript, ask.tools), {}, "the model")
                        reply = None if type(value) is _Abandoned else _as_reply(value)
                    except Exception as exc:
                        # A model that fails after the turn was cancelled is part of the cancel.
                        if cancel is not None and cancel.is_set():
                            happening = Cancelled()
                        else:
                            error, happening = exc, Failed(describe_error(exc))
                    else:
                        if reply is None or (cancel is not None and cancel.is_set()):
                            happening = Cancelled()
                        else:
                            happening = ModelAnswered(reply)
                            _add_usage(usage, reply)
                else:
                    answered = []
                    for running in command.calls:  # type: ignore[union-attr]
                        answered.append((yield from self._tool(running, cancel, limit)))
                    running = None
                    happening = ToolsFinished(answered)
                    answered = []
                adv = advance(adv.state, happening)
        except GeneratorExit:  # the consumer stopped reading, or the task was cancelled
            if running is not None:  # closed in its call: the tool started, and was cut off
                answered.append(interrupted_result(running, "the turn was cancelled"))
            _end_abandoned(port, adv, answered)
            raise
        if error is not None:
            raise error

    def _tool(
        self, call: ToolCall, cancel: _Flag | None, limit: int
    ) -> Generator[_Request, Any, Message]:
        """One tool call, answered by a tool message whatever happens."""
        if cancel is not None and cancel.is_set():
            return cancelled_result(call)
        found = self.tools.get(call.name)
        if found is None:
            have = ", ".join(sorted(self.tools)) or "none"
            return _fitting_error(
                call, "unknown_tool", f"unknown tool {call.name!r} (this run's tools: {have})",
                limit,
            )
        try:
            arguments = found.arguments(call.arguments)
        except TypeError as exc:  # the model's mistake, not the tool's: it never ran
            logger.warning("tool %r: arguments refused, the tool did not run (%s)", call.name, exc)
            return _fitting_error(call, "arguments_refused",
                                  f"arguments refused, the tool did not run: {exc}", limit)
        try:
            value = yield _Call(found.fn, found.is_async, (), arguments, f"tool {call.name!r}")
        except Exception as exc:
            logger.warning("tool %r raised; the model gets an error result", call.name,
                           exc_info=True)
            return _fitting_error(call, type(exc).__name__, describe_error(exc), limit)
        if value is _NOT_STARTED:
            return cancelled_result(call)
        if value is _CUT_OFF:
            return interrupted_result(call, "the turn was cancelled")
        return tool_message(call, value, limit)


# -- the two pumps --------------------------------------------------------------------------------


def _pump(turn: Generator[_Request, Any, None]) -> Iterator[Event]:
    """The sync driver: calls inline, events handed on as they come."""
    try:
        request = next(turn)
        while True:
            if type(request) is list:
                yield from request
                request = next(turn)
                continue
            call: _Call = request  # type: ignore[assignment]
            try:
                value = call.fn(*call.args, **call.kwargs)
                _not_awaitable(value, call.what)
            except Exception as exc:
                request = turn.throw(exc)
            else:
                request = turn.send(value)
    except StopIteration:
        return
    finally:
        turn.close()  # abandoned mid-turn: the body records the turn as cancelled


async def _apump(
    turn: Generator[_Request, Any, None], cancel: asyncio.Event | None, offload: bool,
    io: Callable[..., Awaitable[Any]] | None = None,
) -> AsyncIterator[Event]:
    """The asyncio driver: calls awaited (sync ones in a thread when ``offload``), each raced
    against ``cancel``. With ``io`` (the port's ``call_io``), each stretch of the body between
    two calls, which is where the port is called, runs through it: off the event loop."""
    in_flight: asyncio.Future[Any] | None = None

    async def resume(advance_body: Callable[[Any], _Request], value: Any) -> Any:
        nonlocal in_flight
        if io is None:
            return _stepped(advance_body, value)
        # Shielded: a cancel of this task must not cancel the future that tracks the stretch,
        # which would report it done while it still runs on ``io``'s thread.
        in_flight = asyncio.ensure_future(io(_stepped, advance_body, value))
        return await asyncio.shield(in_flight)

    try:
        request = await resume(turn.send, None)
        while request is not _FINISHED:
            if type(request) is list:
                for event in request:
                    yield event
                request = await resume(turn.send, None)
                continue
            call: _Call = request
            try:
                value = await _unless_cancelled(_acall(call, offload), cancel)
            except Exception as exc:
                request = await resume(turn.throw, exc)
            else:
                request = await resume(turn.send, value)
    finally:
        # Abandoned mid-turn (aclose, task cancelled): the body records the turn as cancelled.
        # A stretch still running elsewhere finishes first (a running generator cannot close);
        # ``call_io`` promises no order, so the close waits for it. A cancel during either wait
        # is remembered, not raised, so a second cancel cannot skip recording the end (which
        # would leave it to the generator's collection, store I/O on the event loop).
        cancelled = False
        if in_flight is not None and not in_flight.done():
            cancelled = await _finish_shielded(in_flight)
            if not in_flight.cancelled() and in_flight.exception() is not None:
                # Nobody awaits it any more; the turn is being abandoned anyway.
                logger.warning("a stretch of an abandoned turn failed", exc_info=in_flight.exception())
        if io is None:
            turn.close()
        else:
            closing = asyncio.ensure_future(io(turn.close))
            cancelled = await _finish_shielded(closing) or cancelled
            closing.result()
        if cancelled:
            raise asyncio.CancelledError


async def _finish_shielded(work: asyncio.Future[Any]) -> bool:
    """Wait for ``work`` to finish even if this task is cancelled meanwhile: cleanup that must
    not be cut short (the turn's end is recorded in it). Whether a cancel came meanwhile, for
    the caller to raise once all of its cleanup is done; ``work``'s outcome is the caller's to
    read."""
    cancelled = False
    while not work.done():
        try:
            await asyncio.wait((work,))
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


_FINISHED: Final = object()
"""What a stretch of the body answers when the turn is over."""


def _stepped(advance_body: Callable[[Any], _Request], value: Any) -> object:
    try:
        return advance_body(value)
    except StopIteration:  # never raised into a future: asyncio refuses StopIteration there
        return _FINISHED


async def _acall(call: _Call, offload: bool) -> Any:
    if call.is_async or not offload:
        value = call.fn(*call.args, **call.kwargs)
    else:
        value = await asyncio.to_thread(call.fn, *call.args, **call.kwargs)
    if inspect.isawaitable(value):
        value = await value
    return value


async def _unless_cancelled(work: Awaitable[Any], cancel: asyncio.Event | None) -> Any:
    """Await ``work`` unless ``cancel`` is set first: its result (work that finished first
    keeps it), ``_NOT_STARTED`` when the cancel came before it, or ``_CUT_OFF`` when it came
    while ``work`` ran (cancelled, not awaited: a sync call's thread cannot be stopped)."""
    if cancel is None:
        return await work
    if cancel.is_set():
        if inspect.iscoroutine(work):
            work.close()
        return _NOT_STARTED
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            # A cancel only asks: the task is done when it next runs, so it is read here by
            # whether it had finished, never by its result (which is not set yet).
            task.cancel()
            task.add_done_callback(_forget)
    if task.done() and not task.cancelled():
        return task.result()
    return _CUT_OFF


def _forget(task: asyncio.Future[Any]) -> None:
    """Read the outcome of a call abandoned in flight, which nobody awaits, so asyncio does not
    report it as never retrieved."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("a call abandoned by a cancel raised", exc_info=task.exception())


# -- small rules the body applies -----------------------------------------------------------------


def _record_all(port: SessionPort, events: Sequence[Event]) -> list[Event]:
    recorded = [port.record(event) for event in events]
    for event in events:
        if type(event) is Warned:  # the loop's budget warning: a log line as well as an event
            logger.warning(event.text)
    return recorded


def _add_usage(usage: dict[str, int | float], reply: Message) -> None:
    """Add what a reply reports in ``metadata["usage"]`` (counts by name: tokens, requests)
    to the turn's ``usage``; its end records the sum. Anything else there is not a count."""
    reported = reply.metadata.get("usage")
    if isinstance(reported, Mapping):
        for name, value in reported.items():
            if type(value) in (int, float):
                usage[name] = usage.get(name, 0) + value


def _with_usage(events: Sequence[Event], usage: dict[str, int | float]) -> list[Event]:
    return [replace(e, usage=dict(usage)) if type(e) is TurnEnded else e for e in events]


def _end_abandoned(port: SessionPort, adv: Advance, answered: Sequence[Message]) -> None:
    """The consumer stopped reading mid-turn: record the turn as cancelled, so the log does not
    show it running forever, with the ``answered`` tool results of the step it stopped in.
    Nothing is yielded (a closing generator may not yield)."""
    if type(adv.command) is EndTurn or adv.state.phase is Phase.ENDED:
        return
    for event in advance(adv.state, Cancelled(answered)).events:
        port.record(event)


def _as_reply(value: object) -> Message:
    if isinstance(value, str):
        return Message.assistant(value)
    if not isinstance(value, Message):
        raise TypeError(
            f"the model returned {type(value).__name__}, expected an assistant Message (or a str)"
        )
    if value.role != "assistant":
        raise TypeError(f"the model returned a {value.role!r} message, expected an assistant one")
    return value


def _not_awaitable(value: object, what: str) -> None:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError(f"{what} returned an awaitable; drive async callables with arun_turn")


def _error_result(call: ToolCall, kind: str, text: str) -> Message:
    return Message.tool(f"error: {text}", call.id, name=call.name, metadata={"error": kind})


def _fitting_error(call: ToolCall, kind: str, text: str, limit: int) -> Message:
    """:func:`_error_result`, its text cut short when the record would be above ``limit`` (the
    store's record limit): a tool that raised with a long message, under a store with a small
    limit, must still answer its call rather than end the turn with a store error."""
    # As in tool_message: a character takes at most 6 bytes in a record.
    fixed = (len(call.id) + len(call.name) + len(kind)) * 6 + _ENVELOPE + _FIXED
    if len(text) * 6 + fixed <= limit or _record_size(
            _error_result(call, kind, text)) + _ENVELOPE <= limit:
        return _error_result(call, kind, text)
    room = max(0, (limit - fixed) // 6 - len(_CUT))
    logger.warning("tool %r: its error text is cut to fit a record", call.name)
    return _error_result(call, kind, text[:room] + _CUT)


_CUT: Final = "... (cut to fit the log's record limit)"

_ENVELOPE: Final = 4 * MAX_STREAM_NAME + 256
"""Bytes a ToolReturned record may take beyond what :func:`_record_size` measures: the stream's
name (at most ``MAX_STREAM_NAME`` characters, 4 bytes each at most), the seq, time, turn, step
and batch position at their longest, and MessagePack's longer string headers. A bound, not a
guess: a result under it is one every store of this package takes (a host's own store
with another envelope says so by a smaller ``max_record_size``)."""

_FIXED: Final = 512
"""Bytes a ToolReturned record of empty text, id and name takes at most, envelope aside (131):
with :data:`_ENVELOPE`, what lets a short result through without encoding it twice."""


def _record_size(message: Message) -> int:
    """The size of ``message``'s ToolReturned record as the ``file:`` store writes it (JSON, the
    larger encoding), with an empty stream name and its numbers at zero: :data:`_ENVELOPE`
    covers those."""
    event = ToolReturned(turn=0, step=0, message=message)
    return len(encode_record(Record(stream="", event=event)))


def tool_message(call: ToolCall, value: object, limit: int) -> Message:
    """A tool's return value as its tool message, or an error message when the log cannot hold
    it: text with a lone surrogate, or a record above ``limit``, the size limit of the
    store the port records into. The transcript stays well-formed either way: every call gets
    its answer (unless the call's own id and name are beyond the limit: then no answer fits).

    The runner answers each call through it; a loop of one's own can too, to record what the
    runner would::

        >>> tool_message(ToolCall("c1", "dump"), "x" * 9000, 8192).metadata["error"]
        'result_too_large'
    """
    try:
        if isinstance(value, str):
            text = value
        elif isinstance(value, (dict, list, tuple)):
            text = json.dumps(value, ensure_ascii=False, default=str)
        else:
            text = str(value)
        message = Message.tool(text, call.id, name=call.name)
    except (TypeError, ValueError, RecursionError) as exc:
        logger.warning("tool %r returned a result the log cannot hold", call.name)
        return _error_result(call, "unstorable_result", f"the result cannot be stored: {exc}")
    # A character takes at most 6 bytes in a record (JSON-escaped), so only long text, a long
    # call id or tool name (the model's), can be near the limit: the rest are not encoded twice.
    if (len(text) + len(call.id) + len(call.name)) * 6 + _ENVELOPE + _FIXED > limit:
        try:
            size = _record_size(message) + _ENVELOPE
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            logger.warning("tool %r returned a result the log cannot hold", call.name)
            return _error_result(call, "unstorable_result",
                                 f"the result cannot be stored: {exc}")
        if size > limit:
            logger.warning("tool %r returned %d bytes, above the record limit", call.name, size)
            return _error_result(
                call, "result_too_large",
                f"the result is at most {size} bytes as a log record, above the limit of "
                f"{limit} bytes; return less (a summary, a page, a path)",
            )
    return message
