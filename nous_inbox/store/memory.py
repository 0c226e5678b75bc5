"""MemoryStore (``memory:``): event streams in a dict, for tests and experiments.

Nothing survives the process; everything else behaves as the durable stores do (numbering,
expected versions, all-or-nothing appends), so code tested against it runs unchanged on them.

>>> from nous_inbox.events import Warned
>>> store = MemoryStore()
>>> store.append("s", [Warned(text="hi")])[0].seq
1
>>> [e.text for e in store.read("s")]
['hi']

Every event is proved to read back before it is kept, by the same path the durable stores take
(:class:`~nous_inbox.store.base.StoreBase`'s append), so an event this store accepts is one
they accept too.

Thread-safe: one lock guards the streams; ``read`` iterates over a snapshot taken under it.
Owner leases are a set in the store: no other store can see its streams, so none can own them.
``MemoryStore(read_only=True)`` is an empty store that refuses appends and leases, for code that
takes a read-only store.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from nous_inbox.events import Event
from nous_inbox.store.base import Moved, StoreBase
from nous_inbox.store.base.moves import MoveLog
from nous_inbox.store.lease import Leases

__all__ = ["MemoryStore"]


class MemoryStore(StoreBase):
    """A :class:`~nous_inbox.store.base.Store` that keeps its streams in memory."""

    url = "memory:"
    blocking = False  # no disk, no network, a lock around a list: an event loop may call it
    _lock_excludes = True  # one lock guards the streams; a write is one list.extend

    def __init__(self, *, read_only: bool = False) -> None:
        self.read_only = read_only
        self._streams: dict[str, list[Event]] = {}
        self._snapshots: dict[str, tuple[int, bytes]] = {}  # stream -> its newest snapshot
        self._lock = threading.Lock()
        self._leases = Leases(self.url, None)
        self._closed = False
        self._moves = MoveLog()

    def __repr__(self) -> str:
        return "MemoryStore(read_only=True)" if self.read_only else "MemoryStore()"

    # -- the hooks (called with the lock held) ---------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("memory: store is closed")

    def _appending(self, stream: str) -> contextlib.AbstractContextManager[int]:
        return contextlib.nullcontext(self._version(stream))

    def _write(self, stream: str, events: list[Event], records: list[bytes], *,
               batch: object | None = None) -> None:
        self._streams.setdefault(stream, []).extend(events)
        self._moves.note(stream)

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        return iter(self._streams.get(stream, [])[after:])

    def _version(self, stream: str) -> int:
        return len(self._streams.get(stream, ()))

    def _stream_names(self) -> list[str]:
        return sorted(self._streams)

    def _moved(self, since: object) -> Moved:
        moved = self._moves.since(since)
        if moved is None:
            return Moved(sorted(self._streams), self._moves.cursor(), True)
        return Moved(moved, self._moves.cursor(), False)

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        self._snapshots[stream] = (seq, data)
        return True

    def _load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        return self._snapshots.get(stream)

    def _delete(self, stream: str) -> None:
        self._streams.pop(stream, None)
        self._snapshots.pop(stream, None)
        self._moves.note(stream)

    def _close(self) -> None:
        self._closed = True
        self._streams = {}
        self._snapshots = {}
