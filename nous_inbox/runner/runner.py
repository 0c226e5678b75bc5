"""Runner: one turn body, written once, pumped by a sync and an asyncio driver.

A model is any callable, sync or async, ``model(transcript, tools) -> Message`` returning an
assistant message with content and/or tool calls. Tools are plain callables, sync or async (see
:mod:`nous_inbox.runner.tools`). The runner reads and writes the session through a :class:`SessionPort`:
an owner implements it over a durable store; :class:`LocalSession` is the in-memory one.

>>> from nous_inbox.message import Message, ToolCall
>>> from nous_inbox.runner import LocalSession
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
claim atomically, returning ``(messages, QueueClaimed | None)``; and ``record(events)``, one
atomic append of the events the loop gave at one boundary. Every event is recorded before the
runner acts on it, and the runner yields exactly the events it recorded or claimed, in order;
messages others send meanwhile are in the log but not the stream.

Failures. A port the runner cannot call is refused with ``TypeError`` when ``run_turn`` is
called, before anything is recorded. A claim that raises or answers in the wrong shape is logged,
recorded as ``Warned``, and the run goes on without the inbox for the rest of the turn (ruling 7:
the port's :class:`~nous_inbox.runner.guard.ClaimGuard`, which the adapters claim through too).
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
them) and a call (stream the events it carries, then call the model or a tool and send back what
it returned, or throw in what it raised). ``run_turn`` and ``arun_turn`` hand the body to the two
pumps of :mod:`nous_inbox.runner._pump`: the sync one, about twenty lines, makes each call inline;
the asyncio one makes the same requests the same way and adds what asyncio needs: each call raced
against the cancel event, sync callables in a worker thread, the body's stretches through the
port's ``call_io``, and a close that a second cancel cannot cut short. Closing the body (either
pump's ``finally``) is the one place an abandoned turn is recorded as cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
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
from typing import Any, Final, Protocol

import attrs
from msgspec.structs import replace

from nous_inbox.codec import MAX_RECORD_SIZE
from nous_inbox.commands import CallModel, Claim, EndTurn, ToolSpec
from nous_inbox.events import Event, TurnEnded, Warned
from nous_inbox.happenings import (
    Cancelled,
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
from nous_inbox.runner._pump import CUT_OFF, NOT_STARTED, Abandoned, Request, apump, pump
from nous_inbox.runner.guard import Boundary, ClaimGuard, describe_error, guarded_boundary
from nous_inbox.runner.port import JournalPort, SessionPort, check_port
from nous_inbox.runner.results import fitting_error, tool_message
from nous_inbox.runner.tools import Tool
from nous_inbox.runner.tracing import TurnTrace, turn_trace
from nous_inbox.session import Session

__all__ = ["Model", "Runner"]

logger: Final = logging.getLogger("nous_inbox.runner")

Model = Callable[[Sequence[Message], Sequence[ToolSpec]], "Message | str | Awaitable[Message | str]"]
"""A model: ``model(transcript, tools)`` returns (or, async, resolves to) an assistant Message."""


class _Flag(Protocol):
    """A cancel event: ``threading.Event`` for ``run_turn``, ``asyncio.Event`` for ``arun_turn``."""

    def is_set(self) -> bool: ...


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
        trace = turn_trace(port)
        return pump(self._turn(port, reason, cancel, limit, trace), trace)

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
        trace = turn_trace(port)
        return apump(self._turn(port, reason, cancel, limit, trace), cancel, self.offload,
                     getattr(port, "call_io", None), trace)

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
        self, port: SessionPort, reason: str, cancel: _Flag | None, limit: int,
        trace: TurnTrace | None = None,
    ) -> Generator[Request, Any, None]:
        """The whole turn, as requests to a pump (see the module's design note)."""
        session = port.session
        if not isinstance(session, Session):
            raise TypeError(
                f"{type(port).__name__}.session is a {type(session).__name__}, not a Session"
            )
        adv = advance(self._start, TurnOpened(session.turn + 1, reason, session.transcript))
        boundary, guard = _boundary_of(port)
        error: Exception | None = None
        usage: dict[str, int | float] = {}  # what the model's replies reported, summed

        def with_usage(ended: TurnEnded, state: LoopState) -> TurnEnded:
            return replace(ended, usage=dict(usage)) if usage else ended

        answered: list[Message] = []  # the running step's tool answers, and the tool in flight
        running: ToolCall | None = None
        shown: list[Event] = []  # recorded, not streamed yet: they go with the next request
        try:
            while True:
                if cancel is not None and type(adv.command) is Claim and cancel.is_set():
                    # Cancelled before the claim: the turn ends, in the boundary's one append.
                    ending = advance(adv.state, Cancelled())
                    adv = ending._replace(events=(*adv.events, *ending.events))
                # A boundary is recorded whole, in one append (its events, each claim the loop
                # asks for, the events after), before any of it is streamed, so a consumer that
                # stops reading never leaves half of it unrecorded.
                known = len(adv.state.transcript) if trace is not None else 0
                recorded, adv = boundary(adv, with_usage)
                if trace is not None and len(adv.state.transcript) > known:
                    trace.claimed(adv.state.transcript[known:])  # what the boundary's claims took
                if Warned in map(type, recorded):
                    _log_warnings(recorded, guard)
                shown += recorded
                command = adv.command
                kind = type(command)
                happening: Happening
                if kind is EndTurn:
                    break
                if cancel is not None and cancel.is_set():
                    happening = Cancelled()
                elif kind is CallModel:
                    ask: CallModel = command  # type: ignore[assignment]
                    request, shown = (shown, self.model, self._model_is_async,
                                      (ask.transcript, ask.tools), _NO_KWARGS, None), []
                    try:
                        value = yield request
                        reply = None if type(value) is Abandoned else _as_reply(value)
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
                            if reply.metadata:
                                _add_usage(usage, reply)
                else:
                    answered = []
                    for running in command.calls:  # type: ignore[union-attr]
                        message, shown = yield from self._tool(running, cancel, limit, shown)
                        answered.append(message)
                    running = None
                    happening = ToolsFinished(answered)
                    answered = []
                adv = advance(adv.state, happening)
            if shown:
                yield shown
        except GeneratorExit:  # the consumer stopped reading, or the task was cancelled
            if running is not None:  # closed in its call: the tool started, and was cut off
                answered.append(interrupted_result(running, "the turn was cancelled"))
            _end_abandoned(boundary, adv, answered)
            raise
        if error is not None:
            raise error

    def _tool(
        self, call: ToolCall, cancel: _Flag | None, limit: int, shown: list[Event]
    ) -> Generator[Request, Any, tuple[Message, list[Event]]]:
        """One tool call, answered by a tool message whatever happens; the events of ``shown``
        go with the call if it is made, and are handed back otherwise."""
        if cancel is not None and cancel.is_set():
            return cancelled_result(call), shown
        found = self.tools.get(call.name)
        if found is None:
            have = ", ".join(sorted(self.tools)) or "none"
            return fitting_error(
                call, "unknown_tool", f"unknown tool {call.name!r} (this run's tools: {have})",
                limit,
            ), shown
        try:
            arguments = found.arguments(call.arguments)
        except TypeError as exc:  # the model's mistake, not the tool's: it never ran
            logger.warning("tool %r: arguments refused, the tool did not run (%s)", call.name, exc)
            return fitting_error(call, "arguments_refused",
                                 f"arguments refused, the tool did not run: {exc}", limit), shown
        try:
            value = yield (shown, found.fn, found.is_async, (), arguments, call)
        except Exception as exc:
            logger.warning("tool %r raised; the model gets an error result", call.name,
                           exc_info=True)
            return fitting_error(call, type(exc).__name__, describe_error(exc), limit), []
        if value is NOT_STARTED:
            return cancelled_result(call), []
        if value is CUT_OFF:
            return interrupted_result(call, "the turn was cancelled"), []
        return tool_message(call, value, limit), []


_NO_KWARGS: Final[Mapping[str, Any]] = types.MappingProxyType({})


# -- small rules the body applies -----------------------------------------------------------------


def _boundary_of(port: SessionPort) -> tuple[Boundary, ClaimGuard | None]:
    """How the turn records a boundary on ``port``: a journal's port in one append; a host's
    own port, or a journal's whose claim or record a host rewrote (a source of its own),
    through its claim and record, the claims guarded (ruling 7)."""
    kind = type(port)
    if (isinstance(port, JournalPort) and kind.claim is JournalPort.claim
            and kind.record is JournalPort.record):
        return port.boundary, None
    guard = ClaimGuard(port)
    return guarded_boundary(port, guard), guard


def _log_warnings(recorded: Sequence[Event], guard: ClaimGuard | None) -> None:
    """The loop's budget warning is a log line as well as an event (a failed source's warning
    was logged as it failed)."""
    for event in recorded:
        if type(event) is Warned and (guard is None or event is not guard.warning):
            logger.warning(event.text)


def _add_usage(usage: dict[str, int | float], reply: Message) -> None:
    """Add what a reply reports in ``metadata["usage"]`` (counts by name: tokens, requests)
    to the turn's ``usage``; its end records the sum. Anything else there is not a count."""
    reported = reply.metadata.get("usage")
    if isinstance(reported, Mapping):
        for name, value in reported.items():
            if type(value) in (int, float):
                usage[name] = usage.get(name, 0) + value


def _end_abandoned(boundary: Boundary, adv: Advance, answered: Sequence[Message]) -> None:
    """The consumer stopped reading mid-turn: record the turn as cancelled, so the log does not
    show it running forever, with the ``answered`` tool results of the step it stopped in.
    Nothing is yielded (a closing generator may not yield)."""
    if type(adv.command) is EndTurn or adv.state.phase is Phase.ENDED:
        return
    boundary(advance(adv.state, Cancelled(answered)), None)


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
