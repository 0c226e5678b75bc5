"""Runner: drive the loop with a model and tools, sync or asyncio, streaming events as they happen.

A model is any callable, sync or async, ``model(transcript, tools) -> Message`` returning an
assistant message with content and/or tool calls. Tools are plain callables, sync or async; their
name is their ``__name__`` (or wrap them in :class:`Tool` / :func:`tool` to say otherwise). The
runner reads and writes the session through a :class:`SessionPort`: an owner implements it over a
durable store; :class:`LocalSession` is the in-memory one.

>>> from nous_inbox.message import Message, ToolCall
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
loop's: see ``nous_inbox.loop``.

The port (``nous_inbox.port``): ``session``, the folded session; ``claim(target)``, which drains a
queue and records the claim atomically, returning ``(messages, QueueClaimed | None)``; and
``record(event)``. Every event is recorded before the runner acts on it, and the runner yields
exactly the events it recorded or claimed, in order; messages others send meanwhile are in the
log but not in the stream.

Failures. A port the runner cannot call (a missing member, a ``claim`` that will not take one
positional target) is refused with ``TypeError`` when ``run_turn`` is called, before anything is
recorded. A claim that raises or answers in the wrong shape is logged, recorded as ``Warned``, and
the run goes on without the inbox for the rest of the turn (ruling 7). A tool that raises, or a
call to a tool nobody has, becomes an error tool message and the run goes on. A model that raises
(or returns something that is not an assistant ``Message`` or ``str``) ends the turn with reason
``"error"``, recorded, and the exception is re-raised to the consumer. Closing the stream early
(or cancelling the task running ``arun_turn``) ends the turn as ``"cancelled"``, recorded.

Sync and async. ``run_turn`` is a generator for sync models and tools (it refuses async ones).
``arun_turn`` is an async generator that awaits async models and tools and, by default, runs sync
ones in a worker thread (``asyncio.to_thread``) so a slow model or tool never blocks the event loop
that steers arrive on; ``Runner(..., offload=False)`` calls them inline (cheaper for trivial
functions). Tool calls run one after another, in the order the model gave them, in both drivers.
The port is called directly from the driving thread or event loop: its methods must be quick.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import typing
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from typing import Any, Final

from nous_inbox.events import Event, QueueClaimed, Warned
from nous_inbox.inbox import Target
from nous_inbox.loop import (
    Advance,
    CallModel,
    Cancelled,
    Claim,
    Drained,
    EndTurn,
    Failed,
    Happening,
    ModelAnswered,
    Phase,
    ToolsFinished,
    ToolSpec,
    TurnOpened,
    advance,
    cancelled_result,
    new_state,
)
from nous_inbox.message import Message, ToolCall, thaw_json
from nous_inbox.port import LocalSession, SessionPort, check_port
from nous_inbox.session import Session

# The port's names are re-exported: a runner and its port are used together.
__all__ = ["LocalSession", "Model", "Runner", "SessionPort", "Tool", "check_port", "tool"]

logger: Final = logging.getLogger("nous_inbox.runner")

Model = Callable[[Sequence[Message], Sequence[ToolSpec]], "Message | str | Awaitable[Message | str]"]
"""A model: ``model(transcript, tools)`` returns (or, async, resolves to) an assistant Message."""


def _step_wants_wake(session: Session) -> bool:
    # Whether an entry on next_step asked for a wake, in O(1) through the public API: draining
    # next_turn leaves exactly the next_step wake count behind.
    return session.inbox.claim(Target.NEXT_TURN)[1].wants_wake()


class _Source:
    """The port's claim side, guarded (ruling 7): a claim that raises or answers in the wrong
    shape is logged, reported as a ``Warned`` event, and not asked again for the rest of the run."""

    __slots__ = ("failed", "port")

    def __init__(self, port: SessionPort) -> None:
        self.port = port
        self.failed = False

    def claim(self, command: Claim) -> tuple[Sequence[Message], QueueClaimed | None, Warned | None]:
        if self.failed:
            return (), None, None
        target = command.target
        cls = type(self.port).__name__
        try:
            if command.wake_only:
                session = self.port.session
                if not isinstance(session, Session):
                    return self._fail(
                        f"{cls}.session is a {type(session).__name__}, not a Session"
                    )
                if not _step_wants_wake(session):
                    return (), None, None
            result = self.port.claim(target)
        except Exception as exc:
            logger.warning("message source %s failed", cls, exc_info=True)
            return self._fail(f"{cls}.claim({target}) raised {type(exc).__name__}: {exc}")
        problem = _claim_shape_problem(result, target)
        if problem:
            return self._fail(f"{cls}.claim({target}) {problem}")
        messages, event = result
        return messages, event, None

    def take(self, command: Claim) -> tuple[list[Event], Drained]:
        """Claim for a driver: the events to stream (a recorded warning, the port's claim) and
        what the loop is told. One place for both drivers, so they cannot drift apart."""
        messages, claimed, warned = self.claim(command)
        shown = [self.port.record(warned)] if warned is not None else []
        if claimed is not None:
            shown.append(claimed)
        return shown, Drained(command.target, messages)

    def _fail(self, problem: str) -> tuple[Sequence[Message], None, Warned]:
        self.failed = True
        text = f"message source failed: {problem}; the run goes on without it for this turn"
        logger.warning(text)
        return (), None, Warned(text=text)


def _claim_shape_problem(result: object, target: Target) -> str | None:
    expected = "expected (messages, QueueClaimed | None)"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        if isinstance(result, str):
            return f"returned the str {result[:40]!r}, {expected} (a str is not iterated)"
        return f"returned {type(result).__name__}, {expected}"
    messages, event = result
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        return f"returned messages of type {type(messages).__name__}, {expected}"
    for i, message in enumerate(messages):
        if not isinstance(message, Message):
            return f"returned messages[{i}] of type {type(message).__name__}, not a Message"
    if event is None:
        if messages:
            return f"returned {len(messages)} message(s) but no QueueClaimed: the claim was not recorded"
        return None
    if not isinstance(event, QueueClaimed) or event.target != target or event.count != len(messages):
        return f"returned {event!r} for {len(messages)} message(s) claimed from {target}"
    return None


# -- tools ----------------------------------------------------------------------------------------

_JSON_TYPES: Final[dict[Any, str]] = {
    str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
    tuple: "array", dict: "object",
}


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )


def _parameters(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    """A JSON schema of ``fn``'s keyword arguments, from its signature and annotations."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {"type": "object"}
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations only cost the schema its types
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.kind is param.VAR_POSITIONAL or param.kind is param.VAR_KEYWORD:
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(
                f"{where}: parameter {param.name!r} is positional-only, but tools are called "
                "with keyword arguments"
            )
        hint = hints.get(param.name)
        kind = _JSON_TYPES.get(typing.get_origin(hint) or hint)
        properties[param.name] = {"type": kind} if kind else {}
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required}


class Tool:
    """A callable the model may ask for, with the name and description the model is shown.

    ``Tool(fn)`` takes the name from ``fn.__name__``, the description from its docstring's first
    paragraph and the parameter schema from its signature; each may be given instead.

    >>> def grep(pattern: str, path: str = ".") -> str:
    ...     '''Search files for a pattern.'''
    ...     return ""
    >>> Tool(grep).spec.to_dict()
    {'name': 'grep', 'description': 'Search files for a pattern.', 'parameters': {'type': 'object', 'properties': {'pattern': {'type': 'string'}, 'path': {'type': 'string'}}, 'required': ['pattern']}}
    """

    __slots__ = ("fn", "is_async", "spec")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"a tool must be callable, got {type(fn).__name__}")
        if name is None:
            name = getattr(fn, "__name__", None)
            if not isinstance(name, str) or name == "<lambda>":
                raise TypeError(f"cannot name the tool {fn!r}: pass Tool(fn, name=...)")
        if description is None:
            description = (inspect.getdoc(fn) or "").split("\n\n", 1)[0].strip()
        if parameters is None:
            parameters = _parameters(fn, f"tool {name!r}")
        self.fn = fn
        self.is_async = _is_async(fn)
        self.spec = ToolSpec(name, description, parameters)

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        return self.spec.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


@typing.overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@typing.overload
def tool(
    *, name: str | None = None, description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator making a :class:`Tool`: bare (``@tool``) or with overrides (``@tool(name=...)``).

    >>> @tool(name="now")
    ... def current_time() -> str:
    ...     return "12:00"
    >>> current_time.name, current_time()
    ('now', '12:00')
    """
    if fn is not None:
        return Tool(fn, name=name, description=description, parameters=parameters)
    return lambda f: Tool(f, name=name, description=description, parameters=parameters)


def _content(value: object) -> str:
    """A tool's return value as tool-message text: str as is, containers as JSON, else str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _error_result(call: ToolCall, kind: str, text: str) -> Message:
    return Message.tool(f"error: {text}", call.id, name=call.name, metadata={"error": kind})


def _not_awaitable(value: object, what: str) -> None:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError(f"{what} returned an awaitable; drive async callables with arun_turn")


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


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- the runner -----------------------------------------------------------------------------------


class Runner:
    """Runs turns: a model, its tools, and the loop's rules, over any :class:`SessionPort`.

    ``max_steps`` bounds the model requests since the last delivered message (ruling 5);
    ``structured=True`` makes each turn a single model request that claims nothing (ruling 8);
    ``offload`` (async driver only) runs sync models and tools in a worker thread.
    """

    def __init__(
        self,
        model: Model,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        max_steps: int = 10,
        structured: bool = False,
        offload: bool = True,
    ) -> None:
        if not callable(model):
            raise TypeError(f"model must be callable, got {type(model).__name__}")
        by_name: dict[str, Tool] = {}
        for item in tools:
            wrapped = item if isinstance(item, Tool) else Tool(item)
            if wrapped.name in by_name:
                raise ValueError(f"two tools are named {wrapped.name!r}; tool names must be unique")
            by_name[wrapped.name] = wrapped
        self.model = model
        self.tools: dict[str, Tool] = by_name
        self.offload = bool(offload)
        self._start = new_state(
            max_steps, structured=structured, tools=[t.spec for t in by_name.values()]
        )
        self._model_is_async = _is_async(model)

    @property
    def max_steps(self) -> int:
        """The step budget: model requests allowed since the last delivered message."""
        return self._start.max_steps

    @property
    def structured(self) -> bool:
        """Whether each turn is a single model request that claims nothing."""
        return self._start.structured

    # -- sync driver ------------------------------------------------------------------------------

    def run_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """Run one turn on ``port``, yielding each event as it is recorded.

        Refuses (``TypeError``, nothing recorded) a port it cannot call and async models or tools
        (use :meth:`arun_turn`). ``cancel``, when set, ends the turn at the next point the runner
        checks it: before each claim, model request and tool, and when the model returns.
        """
        self._check(port, reason)
        if self._model_is_async or any(t.is_async for t in self.tools.values()):
            found = "the model" if self._model_is_async else "a tool"
            raise TypeError(f"{found} is async: drive this runner with arun_turn")
        return self._run(port, reason, cancel)

    def _check(self, port: object, reason: str) -> None:
        check_port(port)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")

    def _open(self, port: SessionPort, reason: str) -> Advance:
        session = port.session
        if not isinstance(session, Session):
            raise TypeError(
                f"{type(port).__name__}.session is a {type(session).__name__}, not a Session"
            )
        opened = TurnOpened(session.turn + 1, reason, session.transcript)
        return advance(self._start, opened)

    def _run(
        self, port: SessionPort, reason: str, cancel: threading.Event | None
    ) -> Iterator[Event]:
        source = _Source(port)
        adv = self._open(port, reason)
        error: Exception | None = None
        try:
            while True:
                # Record all of a step's events before yielding any, so a consumer that stops
                # reading never leaves half of them unrecorded.
                recorded = _record_all(port, adv.events)
                yield from recorded
                command = adv.command
                happening: Happening
                if type(command) is EndTurn:
                    break
                if cancel is not None and cancel.is_set():
                    happening = Cancelled()
                elif type(command) is Claim:
                    shown, happening = source.take(command)
                    yield from shown
                elif type(command) is CallModel:
                    try:
                        value = self.model(command.transcript, command.tools)
                        _not_awaitable(value, "the model")
                        reply = _as_reply(value)
                    except Exception as exc:
                        error, happening = _failed_unless_cancelled(exc, cancel)
                    else:
                        cancelled = cancel is not None and cancel.is_set()
                        happening = Cancelled() if cancelled else ModelAnswered(reply)
                else:
                    calls: tuple[ToolCall, ...] = command.calls  # type: ignore[union-attr]
                    happening = ToolsFinished([self._call_tool(call, cancel) for call in calls])
                adv = advance(adv.state, happening)
        except GeneratorExit:
            _end_abandoned(port, adv)
            raise
        if error is not None:
            raise error

    def _call_tool(self, call: ToolCall, cancel: threading.Event | None) -> Message:
        if cancel is not None and cancel.is_set():
            return cancelled_result(call)
        found = self._find(call)
        if isinstance(found, Message):
            return found
        try:
            value = found.fn(**thaw_json(call.arguments))
            _not_awaitable(value, f"tool {call.name!r}")
        except Exception as exc:
            return _tool_failed(call, exc)
        return Message.tool(_content(value), call.id, name=call.name)

    def _find(self, call: ToolCall) -> Tool | Message:
        found = self.tools.get(call.name)
        if found is not None:
            return found
        have = ", ".join(sorted(self.tools)) or "none"
        return _error_result(
            call, "unknown_tool", f"unknown tool {call.name!r} (this run's tools: {have})"
        )

    # -- async driver -----------------------------------------------------------------------------

    def arun_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: asyncio.Event | None = None
    ) -> AsyncIterator[Event]:
        """Run one turn on ``port`` under asyncio, yielding each event as it is recorded.

        Same loop, same events as :meth:`run_turn`. Async models and tools are awaited; sync ones
        run in a worker thread unless the runner was built with ``offload=False``. Setting
        ``cancel`` abandons a model request or tool in flight (its reply is discarded) and ends
        the turn as ``"cancelled"``; so does cancelling the task that iterates.
        """
        self._check(port, reason)
        return self._arun(port, reason, cancel)

    async def _arun(
        self, port: SessionPort, reason: str, cancel: asyncio.Event | None
    ) -> AsyncIterator[Event]:
        source = _Source(port)
        adv = self._open(port, reason)
        error: Exception | None = None
        try:
            while True:
                recorded = _record_all(port, adv.events)
                for event in recorded:
                    yield event
                command = adv.command
                happening: Happening
                if type(command) is EndTurn:
                    break
                if cancel is not None and cancel.is_set():
                    happening = Cancelled()
                elif type(command) is Claim:
                    shown, happening = source.take(command)
                    for event in shown:
                        yield event
                elif type(command) is CallModel:
                    transcript, specs = command.transcript, command.tools
                    try:
                        done, value = await _unless_cancelled(
                            self._acall(self.model, self._model_is_async, transcript, specs),
                            cancel,
                        )
                        reply = _as_reply(value) if done else None
                    except Exception as exc:
                        error, happening = _failed_unless_cancelled(exc, cancel)
                    else:
                        cancelled = reply is None or (cancel is not None and cancel.is_set())
                        happening = Cancelled() if cancelled else ModelAnswered(reply)  # type: ignore[arg-type]
                else:
                    calls: tuple[ToolCall, ...] = command.calls  # type: ignore[union-attr]
                    happening = ToolsFinished([await self._acall_tool(c, cancel) for c in calls])
                adv = advance(adv.state, happening)
        except (GeneratorExit, asyncio.CancelledError):
            _end_abandoned(port, adv)
            raise
        if error is not None:
            raise error

    async def _acall(
        self, fn: Callable[..., Any], is_async: bool, /, *args: Any, **kwargs: Any
    ) -> Any:
        if is_async or not self.offload:
            value = fn(*args, **kwargs)
        else:
            value = await asyncio.to_thread(fn, *args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value

    async def _acall_tool(self, call: ToolCall, cancel: asyncio.Event | None) -> Message:
        if cancel is not None and cancel.is_set():
            return cancelled_result(call)
        found = self._find(call)
        if isinstance(found, Message):
            return found
        try:
            done, value = await _unless_cancelled(
                self._acall(found.fn, found.is_async, **thaw_json(call.arguments)), cancel
            )
        except Exception as exc:
            return _tool_failed(call, exc)
        if not done:
            return cancelled_result(call)
        return Message.tool(_content(value), call.id, name=call.name)


def _failed_unless_cancelled(
    exc: Exception, cancel: threading.Event | asyncio.Event | None
) -> tuple[Exception | None, Happening]:
    # A model that fails after the turn was cancelled is part of the cancel, not an error.
    if cancel is not None and cancel.is_set():
        return None, Cancelled()
    return exc, Failed(_describe(exc))


def _record_all(port: SessionPort, events: Sequence[Event]) -> list[Event]:
    recorded = [port.record(event) for event in events]
    for event in events:
        if type(event) is Warned:  # the loop's budget warning: a log line as well as an event
            logger.warning(event.text)
    return recorded


def _tool_failed(call: ToolCall, exc: Exception) -> Message:
    logger.warning("tool %r raised; the model gets an error result", call.name, exc_info=True)
    return _error_result(call, type(exc).__name__, _describe(exc))


async def _unless_cancelled(
    work: Awaitable[Any], cancel: asyncio.Event | None
) -> tuple[bool, Any]:
    """Await ``work`` unless ``cancel`` is set first: ``(True, result)``, or ``(False, None)``
    when the cancel won and ``work`` was abandoned (work that finished first keeps its result)."""
    if cancel is None:
        return True, await work
    if cancel.is_set():
        if inspect.iscoroutine(work):
            work.close()
        return False, None
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled():
        return False, None
    return True, task.result()


def _end_abandoned(port: SessionPort, adv: Advance) -> None:
    """The consumer stopped reading mid-turn: record the turn as cancelled, so the log does not
    show it running forever. Nothing is yielded (a closing generator may not yield)."""
    if type(adv.command) is EndTurn or adv.state.phase is Phase.ENDED:
        return
    for event in advance(adv.state, Cancelled()).events:
        port.record(event)
