"""The live readers of an asyncio owner's events: each reads the stored events after its
position, then every event as it is recorded, once and in log order, until the owner ends.

A reader listens before it reads the store, so an event recorded meanwhile is in one or both and
the repeat is dropped by ``seq``; a reader that falls behind has its events queued for it, in
order. An :class:`~nous_inbox.owner.async_owner.AsyncOwner` hands each folded batch to
:meth:`EventReaders.tell` on its loop (its store worker relays them there in log order,
:mod:`nous_inbox.owner.store_worker`), and ends every reader with :meth:`EventReaders.end` as it
closes or loses its lease: a host streaming a session (the web face) so resumes by ``seq``.

>>> import asyncio
>>> from nous_inbox.events import Warned
>>> stored = [Warned(text="stored", seq=1)]
>>> async def read(after):
...     return [event for event in stored if event.seq > after]
>>> async def main():
...     readers = EventReaders()
...     reader = readers.read(0, read, lambda: None)
...     first = await anext(reader)  # the stored event; the reader listens from before its read
...     readers.tell([Warned(text="stored", seq=1), Warned(text="live", seq=2)])
...     readers.end()
...     return [first.text] + [event.text async for event in reader]
>>> asyncio.run(main())
['stored', 'live']
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence

from nous_inbox.events import Event

__all__ = ["EventReaders"]


class EventReaders:
    """The live readers of one owner's events (see the module notes). Every call is made on the
    owner's loop."""

    __slots__ = ("_queues",)

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Event | None]] = set()  # one per reader; None: it ends

    def __bool__(self) -> bool:
        """Whether anyone reads."""
        return bool(self._queues)

    def tell(self, events: Sequence[Event]) -> None:
        """Queue ``events`` for every reader, in order."""
        for reader in tuple(self._queues) if self._queues else ():
            for event in events:
                reader.put_nowait(event)

    def end(self) -> None:
        """The owner is over: every reader ends once it has read what was queued for it."""
        for reader in self._queues:
            reader.put_nowait(None)

    async def read(self, after: int, stored: Callable[[int], Awaitable[list[Event]]],
                   check: Callable[[], object]) -> AsyncGenerator[Event, None]:
        """Every event with ``seq > after``: ``stored(after)``, then each one told, until
        :meth:`end`. ``check()`` raises, as the reading starts, if the owner cannot be read;
        closing the iterator stops listening."""
        if type(after) is not int:
            raise TypeError(f"events: after must be an int seq, got {type(after).__name__}")
        check()
        live: asyncio.Queue[Event | None] = asyncio.Queue()
        self._queues.add(live)
        last = after
        try:
            for event in await stored(after):
                last = event.seq
                yield event
            while (event := await live.get()) is not None:  # type: ignore[assignment]
                if event.seq > last + 1:  # never expected: fill the gap from the log itself
                    for missed in await stored(last):
                        if missed.seq < event.seq:
                            last = missed.seq
                            yield missed
                if event.seq > last:  # (else read from the store already)
                    last = event.seq
                    yield event
        finally:
            self._queues.discard(live)
