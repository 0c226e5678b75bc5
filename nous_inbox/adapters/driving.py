"""How every framework adapter drives a turn: where its port calls run, how a threaded owner
drives an asyncio run, and which messages a framework's run cannot take.

These are the same rules for every framework, so they live once, here, and each adapter's
runner reads them: a rule in three copies drifts.

>>> from nous_inbox.message import Message
>>> check_deliverable("AgentRunner", "a demo run", Message.user("hi"))
>>> check_deliverable("AgentRunner", "a demo run", Message.assistant("hi"))
Traceback (most recent call last):
...
ValueError: AgentRunner cannot deliver a 'assistant' message to a demo run (it takes the model's words only from the model); send it as a 'user' or 'system' message
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Final, TypeVar

from nous_inbox.events import Event
from nous_inbox.message import Message
from nous_inbox.runner.port import SessionPort

__all__ = ["UNDELIVERABLE", "Caller", "caller", "check_deliverable", "drive_in_thread", "open_turn"]

logger: Final = logging.getLogger("nous_inbox.adapters")

_T = TypeVar("_T")
_DONE: Final = object()
_NO_CALL_IO: Final = object()

Caller = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs a port call where it belongs and awaits it."""

UNDELIVERABLE: Final = {
    "tool": "it takes a tool result only as the answer to a call of its own run",
    "assistant": "it takes the model's words only from the model",
}
"""The roles a framework's run cannot take from the inbox, and why: a framework takes a user
or system message as sent, but a tool result or the model's words only from its own run."""


async def _inline(fn: Callable[[], _T]) -> _T:
    return fn()


def caller(port: SessionPort, offload: bool) -> Caller:
    """Where a turn's port calls run: the port's own ``call_io`` when it has one (an
    ``AsyncOwner``'s store worker, in order with the owner's other store calls; ``None``: its
    store does not block, so inline), else a thread when ``offload``, else inline.

    >>> from nous_inbox.runner.port import LocalSession
    >>> asyncio.run(caller(LocalSession(), offload=False)(lambda: 42))
    42
    """
    call_io: Any = getattr(port, "call_io", _NO_CALL_IO)
    if call_io is _NO_CALL_IO:
        return asyncio.to_thread if offload else _inline
    return _inline if call_io is None else call_io


async def open_turn(call: Caller, opening: Callable[[], _T],
                    end_opening: Callable[[BaseException | None], None]) -> _T:
    """A framework turn's opening (``opening``, run by ``call`` where the port's calls run),
    seen through: a caller cancelled meanwhile leaves it to finish, then the turn it opened is
    ended (``end_opening(failure)``, ``None`` for a cancel); an opening that fails ends the turn
    as that error, recorded, and raises it (the caller then yields what was recorded)."""
    started = asyncio.ensure_future(call(opening))
    try:
        opened: _T = await asyncio.shield(started)
        return opened
    except asyncio.CancelledError:
        while not started.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((started,))
        failure = None if started.cancelled() else started.exception()
        try:
            await asyncio.shield(call(lambda: end_opening(failure)))
        except BaseException:
            logger.exception("could not record the end of a cancelled turn")
        raise
    except Exception as exc:
        await call(functools.partial(end_opening, exc))
        raise


def check_deliverable(runner: str, run: str, message: Message) -> None:
    """Refuse a message ``runner`` cannot deliver to ``run`` as it is: a ``ValueError`` naming
    the role and why (see :data:`UNDELIVERABLE`). A host or an owner asks this before it
    sends, so the log never holds a message the model would not see as sent."""
    why = UNDELIVERABLE.get(message.role)
    if why is not None:
        raise ValueError(f"{runner} cannot deliver a {message.role!r} message to {run} ({why}); "
                         f"send it as a 'user' or 'system' message")


def drive_in_thread(arun: Callable[[threading.Event], AsyncIterator[Event]],
                    name: str) -> Iterator[Event]:
    """A turn for a thread (the threaded ``Owner``'s worker): ``arun(stop)`` runs whole on an
    event loop in a thread of its own (a framework's run must live in one task) and each event
    is handed over as it is recorded, in order. A consumer that stops reading sets ``stop`` and
    cancels the run at once, not at its next boundary, which a long model call would put off;
    the turn still records its end. A failure of a turn read to its end is re-raised.

    >>> async def two(stop):
    ...     yield "a"
    ...     yield "b"
    >>> list(drive_in_thread(two, "demo"))
    ['a', 'b']
    """
    handed: queue.SimpleQueue[object] = queue.SimpleQueue()
    failure: list[BaseException] = []
    stop = threading.Event()  # set when the consumer stops reading
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []

    async def pump() -> None:
        task = asyncio.current_task()
        assert task is not None
        running.append((asyncio.get_running_loop(), task))
        async for event in arun(stop):
            handed.put(event)

    def drive() -> None:
        try:
            asyncio.run(pump())
        except BaseException as exc:
            failure.append(exc)
        finally:
            handed.put(_DONE)

    thread = threading.Thread(target=drive, name=name, daemon=True)
    thread.start()
    finished = False
    try:
        while (item := handed.get()) is not _DONE:
            yield item  # type: ignore[misc]
        finished = True
    finally:
        if not finished:
            stop.set()
            for loop, task in running:
                with contextlib.suppress(RuntimeError):  # its loop is already gone
                    loop.call_soon_threadsafe(task.cancel)
        thread.join()
    if failure and finished:
        raise failure[0]
