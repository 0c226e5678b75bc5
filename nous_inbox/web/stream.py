"""A session's events as Server-Sent Events: the log from a position, then live, until the host
stops or the client leaves.

Each event is ``id: seq`` and ``data:`` the event as ``nous-inbox log --json`` prints it; with
deltas, each piece of the model's text as it streams is ``event: delta`` with no ``id`` (so a
reconnect's ``Last-Event-ID`` stays the last event's seq); an idle stream sends a comment now and
then, so proxies keep it open.

>>> from nous_inbox.runner.deltas import TextDelta
>>> delta_json(TextDelta(text="Hel\\u202elo", turn=1, step=2))
'{"type":"text_delta","text":"Hel\\\\u202elo","turn":1,"step":2}'
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Final

import msgspec
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from nous_inbox.events import Event
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.safe_json import event_json, json_safe
from nous_inbox.web.host import SessionHost

__all__ = ["EventStream", "delta_json", "sse"]

logger: Final = logging.getLogger("nous_inbox.web")


class EventStream(StreamingResponse):
    """An event stream closed however its response ends: Starlette leaves an iterator it stopped
    reading (a client gone mid-send) to the garbage collector, and with it the tasks feeding it."""

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()


async def sse(host: SessionHost, name: str, after: int, keepalive: float, *,
              deltas: bool = False) -> AsyncGenerator[bytes, None]:
    """The event stream: each event as ``id: seq`` and ``data: json``; with ``deltas``, each
    piece of the model's text as it streams as ``event: delta`` and ``data: json``, with no
    ``id`` (so ``Last-Event-ID`` stays the last event's seq); a comment after each
    ``keepalive`` idle seconds; ends when the host stops or the client leaves."""
    queue: asyncio.Queue[Event | TextDelta | None] = asyncio.Queue(maxsize=256)

    async def pump() -> None:
        try:
            async for event in host.events(name, after, deltas=deltas):
                await queue.put(event)
        except Exception:
            logger.warning("the event stream of session %r failed", name, exc_info=True)
        await queue.put(None)  # the end; not reached once cancelled, when nobody would read it

    loop = asyncio.get_running_loop()
    feeding = loop.create_task(pump())
    stopping = loop.create_task(host.stopping.wait())
    getting: asyncio.Task[Event | TextDelta | None] | None = None
    host.metrics.reader_opened()
    try:
        yield b": events of this session follow\n\n"
        while not host.stopping.is_set():  # checked after each event too: a backlog waits
            getting = getting or loop.create_task(queue.get())
            done, _ = await asyncio.wait((getting, stopping), timeout=keepalive,
                                        return_when=asyncio.FIRST_COMPLETED)
            if getting in done:
                event, getting = getting.result(), None
                if event is None:  # the host stopped, or reading the session failed
                    return
                if isinstance(event, TextDelta):
                    yield f"event: delta\ndata: {delta_json(event)}\n\n".encode()
                else:
                    yield f"id: {event.seq}\ndata: {event_json(event)}\n\n".encode()
            elif stopping not in done:
                yield b": keep-alive\n\n"
    finally:
        host.metrics.reader_closed()
        waiting = [task for task in (getting, stopping, feeding) if task is not None]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


def delta_json(delta: TextDelta) -> str:
    """A text delta as one JSON line, escaped as an event's line is (:func:`event_json`)."""
    return json_safe(msgspec.json.encode(delta).decode())
