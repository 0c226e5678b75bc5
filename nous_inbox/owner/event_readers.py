"""The live readers of an owner's events: each reads the stored events after its position, then
every event as it is recorded, once and in log order, until the owner ends; a reader that asks
for them also gets the model's text as it streams (:class:`~nous_inbox.runner.deltas.TextDelta`),
in order with the events.

A reader listens before it reads the store, so an event recorded meanwhile is in one or both and
the repeat is dropped by ``seq``; a reader that falls behind has its events queued for it, in
order. An owner hands each folded batch to :meth:`EventReaders.tell` on the thread that folded
it, under its journal's lock (so in log order, and before any delta said after that batch), and
ends every reader with
:meth:`EventReaders.end` as it closes or loses its lease: a host streaming a session (the web
face) so resumes by ``seq``.

Text deltas are not events: they have no ``seq``, are never stored, and a reader resuming from a
``seq`` reads only events. A delta is handed to each reader's buffer on the thread that says it
and never waits for the reader: the deltas a reader has not read yet are joined into one
(:meth:`Feed.delta`), so a slow or stuck reader never slows the run, loses no text of a reply,
and holds at most one unread delta per run of text between two events.

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
import contextlib
import threading
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence

from nous_inbox.events import Event
from nous_inbox.runner.deltas import Deltas, TextDelta

__all__ = ["EventReaders", "Feed"]

Item = Event | TextDelta | None  # None: the owner is over, the reader ends
DeltasOf = Callable[[], Deltas | None]  # the owner's outlet as the reading starts (None: none)


class Feed:
    """One live reader's buffer: every event told, in order, and the text deltas said between
    them. Put from any thread, read on one: an asyncio reader (``loop`` given) awaits
    :meth:`aget`, a thread blocks in :meth:`get`.

    A delta never waits and is never dropped: said while the delta before it is still unread
    (and nothing came after that one), it is joined to it.

    >>> feed = Feed()
    >>> feed.delta(TextDelta(text="Hel", turn=1, step=1))
    >>> feed.delta(TextDelta(text="lo", turn=1, step=1))   # the reader has not read "Hel" yet
    >>> feed.get(timeout=0).text
    'Hello'
    """

    __slots__ = ("_items", "_loop", "_ready", "_thread", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._items: deque[Item] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._loop = loop
        self._thread = threading.get_ident()  # an asyncio reader's: its loop's thread
        self._waiter: asyncio.Future[None] | None = None

    def put(self, items: Sequence[Item]) -> None:
        """Queue ``items`` (events, or the end), in order."""
        with self._ready:
            self._items.extend(items)
            self._wake()

    def delta(self, delta: TextDelta) -> None:
        """Queue ``delta``, joined to the unread delta before it of the same step if that one
        is the last thing queued."""
        with self._ready:
            items = self._items
            last = items[-1] if items else None
            if (type(last) is TextDelta and last.turn == delta.turn
                    and last.step == delta.step):
                items[-1] = TextDelta(text=last.text + delta.text, turn=last.turn, step=last.step)
                return  # (the reader was woken for it already)
            items.append(delta)
            self._wake()

    def _wake(self) -> None:
        """Wake the reader (called with the lock held)."""
        if self._loop is None:
            self._ready.notify()
            return
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        if threading.get_ident() == self._thread:
            if not waiter.done():
                waiter.set_result(None)
            return
        with contextlib.suppress(RuntimeError):  # its loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(_settle, waiter)

    async def aget(self) -> Item:
        """The next item, waiting for it on the loop."""
        assert self._loop is not None
        while True:
            with self._ready:
                if self._items:
                    return self._items.popleft()
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def get(self, timeout: float | None = None) -> Item:
        """The next item, waiting for it at most ``timeout`` seconds (``TimeoutError``)."""
        with self._ready:
            if not self._ready.wait_for(lambda: self._items, timeout):
                raise TimeoutError(f"no event or delta within {timeout} s")
            return self._items.popleft()


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Order:
    """Where a reader is in the log: it yields each event once, in ``seq`` order."""

    __slots__ = ("last",)

    def __init__(self, after: int) -> None:
        self.last = after

    def missed(self, event: Event) -> bool:
        """Whether events before ``event`` were never told (never expected: the reader then
        fills the gap from the log itself)."""
        return event.seq > self.last + 1

    def fresh(self, event: Event) -> bool:
        """Whether ``event`` is new to this reader (else it was read from the store already)."""
        if event.seq > self.last:
            self.last = event.seq
            return True
        return False


class EventReaders:
    """The live readers of one owner's events (see the module notes). ``tell`` and ``end`` are
    called in log order, from any thread (each feed wakes its reader where it waits); readers
    come and go from any thread."""

    __slots__ = ("_feeds", "_lock")

    def __init__(self) -> None:
        self._feeds: tuple[Feed, ...] = ()  # one per reader; replaced whole
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        """Whether anyone reads."""
        return bool(self._feeds)

    def tell(self, events: Sequence[Event]) -> None:
        """Queue ``events`` for every reader, in order."""
        for feed in self._feeds:
            feed.put(events)

    def end(self) -> None:
        """The owner is over: every reader ends once it has read what was queued for it."""
        for feed in self._feeds:
            feed.put((None,))

    def _join(self, feed: Feed, deltas: DeltasOf | None) -> Callable[[], None]:
        """Add ``feed`` (with the deltas said from now on, if asked for); returns its removal."""
        with self._lock:
            self._feeds = (*self._feeds, feed)
        outlet = None if deltas is None else deltas()
        unsubscribe = None if outlet is None else outlet.subscribe(feed.delta)

        def leave() -> None:
            if unsubscribe is not None:
                unsubscribe()
            with self._lock:
                self._feeds = tuple(f for f in self._feeds if f is not feed)

        return leave

    async def read(self, after: int, stored: Callable[[int], Awaitable[list[Event]]],
                   check: Callable[[], object],
                   deltas: DeltasOf | None = None) -> AsyncGenerator[Event | TextDelta, None]:
        """Every event with ``seq > after``: ``stored(after)``, then each one told, until
        :meth:`end`; with ``deltas``, each text delta said from now on too, in order with them.
        ``check()`` raises, as the reading starts, if the owner cannot be read; ``deltas()``
        is the outlet, looked up after it (a reader made before its owner opened hears the
        text all the same); closing the iterator stops listening."""
        _check_after(after)
        check()
        feed = Feed(asyncio.get_running_loop())
        leave = self._join(feed, deltas)
        order = _Order(after)
        try:
            for event in await stored(after):
                order.last = event.seq
                yield event
            while (item := await feed.aget()) is not None:
                if type(item) is TextDelta:
                    yield item
                    continue
                assert isinstance(item, Event)
                if order.missed(item):
                    for missed in await stored(order.last):
                        if missed.seq < item.seq and order.fresh(missed):
                            yield missed
                if order.fresh(item):
                    yield item
        finally:
            leave()

    def follow(self, after: int, stored: Callable[[int], list[Event]],
               check: Callable[[], object], deltas: DeltasOf | None = None,
               timeout: float | None = None) -> Iterator[Event | TextDelta]:
        """:meth:`read` for a thread: each item as it comes, blocking for it; a wait for the
        next one longer than ``timeout`` seconds raises ``TimeoutError``."""
        _check_after(after)
        check()
        return self._follow(after, stored, check, deltas, timeout)

    def _follow(self, after: int, stored: Callable[[int], list[Event]],
                check: Callable[[], object], deltas: DeltasOf | None,
                timeout: float | None) -> Iterator[Event | TextDelta]:
        feed = Feed()
        leave = self._join(feed, deltas)
        order = _Order(after)
        try:
            check()  # again, listening now: an owner that ended in between ends this reader
            for event in stored(after):
                order.last = event.seq
                yield event
            while (item := feed.get(timeout)) is not None:
                if type(item) is TextDelta:
                    yield item
                    continue
                assert isinstance(item, Event)
                if order.missed(item):
                    for missed in stored(order.last):
                        if missed.seq < item.seq and order.fresh(missed):
                            yield missed
                if order.fresh(item):
                    yield item
        finally:
            leave()


def _check_after(after: object) -> None:
    if type(after) is not int:
        raise TypeError(f"events: after must be an int seq, got {type(after).__name__}")
