"""The two pumps a turn body runs under, and the requests the body makes of them.

The turn body (``Runner._turn``) is a generator that never calls the user's code itself. It
yields a request, and a pump carries it out:

* a ``list`` of events the body recorded already: the pump streams them to the consumer, then
  resumes the body;
* a :data:`Call`: the pump streams the events it carries (recorded already), then calls the model
  or a tool, and sends back what it returned or throws in what it raised.

A call carries the events recorded just before it, so a step's boundary and the call that follows
it take one trip through the body, not two. The events are streamed before the call is made, so
a consumer that stops reading at one of them stops the turn before the call, as it would have
with the events asked for on their own.

:func:`pump` is the sync driver, and :func:`apump` the asyncio one, which adds what asyncio needs:
each call raced against the cancel event (:func:`unless_cancelled`), sync callables in a worker
thread, and the stretches of the body run through the port's ``call_io`` (off the event loop)
when it has one. Closing the body, in either pump's ``finally``, is the one place an abandoned
turn is recorded as cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Any, Final

from nous_inbox.events import Event
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner.tracing import TurnTrace

__all__ = ["CUT_OFF", "NOT_STARTED", "Abandoned", "Call", "Request", "apump", "pump",
           "unless_cancelled"]

logger: Final = logging.getLogger("nous_inbox.runner")

Call = tuple[Sequence[Event], Callable[..., Any], bool, tuple[Any, ...], Mapping[str, Any],
             "ToolCall | None"]
"""``(events, fn, is_async, args, kwargs, tool_call)``: stream ``events`` (recorded already),
then call ``fn(*args, **kwargs)`` (a coroutine function when ``is_async``): the model when
``tool_call`` is None, else the tool answering it. A plain tuple: the body makes two a step."""

Request = list[Event] | Call
"""What the body yields: events to stream, or a call to make (see the module docstring)."""


class Abandoned:
    """What an asyncio pump sends back for a call the cancel event won the race against."""


NOT_STARTED: Final = Abandoned()
"""The cancel came before the call: it never started."""
CUT_OFF: Final = Abandoned()
"""The cancel came while the call ran: abandoned in flight (a sync one's thread runs on), its
outcome unknown."""


_PLAIN: Final = frozenset({Message, str, int, float, bool, type(None), dict, list, tuple})
"""What a model or a tool commonly returns and is never awaitable: not asked whether it is."""


def _what(tool_call: ToolCall | None) -> str:
    return "the model" if tool_call is None else f"tool {tool_call.name!r}"


def pump(turn: Generator[Request, Any, None], trace: TurnTrace | None = None) -> Iterator[Event]:
    """The sync driver: events handed on as they come, calls made inline (each in its span when
    the turn is ``trace`` d)."""
    try:
        request = next(turn)
        while True:
            if type(request) is list:
                if trace is not None:
                    trace.saw_all(request)
                yield from request
                request = next(turn)
                continue
            call: Call = request  # type: ignore[assignment]  # not a list: a call
            events, fn, _, args, kwargs, tool_call = call
            if trace is not None:
                trace.saw_all(events)
            yield from events
            try:
                if trace is None:
                    value = fn(*args, **kwargs)
                else:
                    with trace.calling(tool_call):
                        value = fn(*args, **kwargs)
                if type(value) not in _PLAIN and inspect.isawaitable(value):
                    raise _awaitable(value, tool_call)
            except Exception as exc:
                request = turn.throw(exc)
            else:
                request = turn.send(value)
    except StopIteration:
        return
    finally:
        turn.close()  # abandoned mid-turn: the body records the turn as cancelled
        if trace is not None:
            trace.close()


def _awaitable(value: Any, tool_call: ToolCall | None) -> TypeError:
    if inspect.iscoroutine(value):
        value.close()
    return TypeError(f"{_what(tool_call)} returned an awaitable; drive async callables with "
                     "arun_turn")


async def apump(
    turn: Generator[Request, Any, None], cancel: asyncio.Event | None, offload: bool,
    io: Callable[..., Awaitable[Any]] | None = None, trace: TurnTrace | None = None,
) -> AsyncIterator[Event]:
    """The asyncio driver: calls awaited (sync ones in a thread when ``offload``), each raced
    against ``cancel`` (and in its span when the turn is ``trace`` d). With ``io`` (the port's
    ``call_io``), each stretch of the body between two calls, which is where the port is
    called, runs through it: off the event loop."""
    in_flight: asyncio.Future[Any] | None = None

    async def through_io(advance_body: Callable[[Any], Request], value: Any) -> Any:
        nonlocal in_flight
        # Shielded: a cancel of this task must not cancel the future that tracks the stretch,
        # which would report it done while it still runs on ``io``'s thread.
        in_flight = asyncio.ensure_future(io(_stepped, advance_body, value))  # type: ignore[misc]
        return await asyncio.shield(in_flight)

    try:
        request = _stepped(turn.send, None) if io is None else await through_io(turn.send, None)
        while request is not _FINISHED:
            if type(request) is list:
                if trace is not None:
                    trace.saw_all(request)
                for event in request:
                    yield event
                request = (_stepped(turn.send, None) if io is None
                           else await through_io(turn.send, None))
                continue
            call: Call = request
            events, fn, is_async, args, kwargs, tool_call = call
            if trace is not None:
                trace.saw_all(events)
            for event in events:
                yield event
            step: Callable[[Any], Request]
            try:
                # An async callable's coroutine is the work; a sync one is called in _acall.
                work = fn(*args, **kwargs) if is_async else _acall(fn, args, kwargs, offload)
                if trace is None:
                    value = await (work if cancel is None else unless_cancelled(work, cancel))
                else:
                    # The work starts inside the span: it runs, and a task or thread it makes
                    # copies the context, only once awaited.
                    with trace.calling(tool_call):
                        value = await (work if cancel is None else unless_cancelled(work, cancel))
            except Exception as exc:
                step, value = turn.throw, exc
            else:
                step = turn.send
            request = _stepped(step, value) if io is None else await through_io(step, value)
    finally:
        await _close(turn, in_flight, io)
        if trace is not None:
            trace.close()



async def _close(turn: Generator[Request, Any, None], in_flight: asyncio.Future[Any] | None,
                 io: Callable[..., Awaitable[Any]] | None) -> None:
    """Close the body of a turn that ended or was abandoned (aclose, the task cancelled): the
    body then records the turn as cancelled. A stretch still running elsewhere finishes first
    (a running generator cannot close); ``call_io`` promises no order, so the close waits for
    it. A cancel during either wait is remembered, not raised, so a second cancel cannot skip
    recording the end (which would leave it to the generator's collection, store I/O on the
    event loop)."""
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


def _stepped(advance_body: Callable[[Any], Request], value: Any) -> Any:
    try:
        return advance_body(value)
    except StopIteration:  # never raised into a future: asyncio refuses StopIteration there
        return _FINISHED


async def _acall(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 offload: bool) -> Any:
    """A sync callable's call: in a worker thread when ``offload``; what it returns awaited if
    it is awaitable."""
    if offload:
        value = await asyncio.to_thread(fn, *args, **kwargs)
    else:
        value = fn(*args, **kwargs)
    if type(value) not in _PLAIN and inspect.isawaitable(value):
        value = await value
    return value


async def unless_cancelled(work: Awaitable[Any], cancel: asyncio.Event) -> Any:
    """Await ``work`` unless ``cancel`` is set first: its result (work that finished first
    keeps it), :data:`NOT_STARTED` when the cancel came before it, or :data:`CUT_OFF` when it
    came while ``work`` ran (cancelled, not awaited: a sync call's thread cannot be stopped)."""
    if cancel.is_set():
        if inspect.iscoroutine(work):
            work.close()
        return NOT_STARTED
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
    return CUT_OFF


def _forget(task: asyncio.Future[Any]) -> None:
    """Read the outcome of a call abandoned in flight, which nobody awaits, so asyncio does not
    report it as never retrieved."""
    if not task.cancelled() and task.exception() is not None:
        logger.debug("a call abandoned by a cancel raised", exc_info=task.exception())
