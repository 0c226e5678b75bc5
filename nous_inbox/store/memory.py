"""MemoryStore (``memory:``): event streams in a dict, for tests and experiments.

Nothing survives the process; everything else behaves as the durable stores do (numbering,
expected versions, all-or-nothing appends), so code tested against it runs unchanged on them.

>>> from nous_inbox.events import Warned
>>> store = MemoryStore()
>>> store.append("s", [Warned(text="hi")])[0].seq
1
>>> [e.text for e in store.read("s")]
['hi']

Thread-safe: one lock guards the streams; ``read`` iterates over a snapshot taken under it.
Owner leases are a set in the store: no other store can see its streams, so none can own them.
``MemoryStore(read_only=True)`` is an empty store that refuses appends and leases, for code that
takes a read-only store.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from nous_inbox.events import Event
from nous_inbox.store.base import (
    StoreBase,
    check_expected_version,
    check_stream,
    conflict,
    number_events,
)
from nous_inbox.store.lease import Leases

__all__ = ["MemoryStore"]


class MemoryStore(StoreBase):
    """A :class:`~nous_inbox.store.base.Store` that keeps its streams in memory."""

    url = "memory:"

    def __init__(self, *, read_only: bool = False) -> None:
        self.read_only = read_only
        self._streams: dict[str, list[Event]] = {}
        self._lock = threading.Lock()
        self._leases = Leases(self.url, None)
        self._closed = False

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
    ) -> list[Event]:
        """Append atomically; see :class:`~nous_inbox.store.base.Store`."""
        check_stream(stream)
        check_expected_version(expected_version)
        with self._lock:
            self._check_writable()
            log = self._streams.get(stream)
            version = len(log) if log else 0
            if expected_version is not None and expected_version != version:
                raise conflict(stream, expected_version, version)
            stored = number_events(stream, events, version)
            if stored:
                self._streams.setdefault(stream, []).extend(stored)
            return stored

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        """The events of ``stream`` after seq ``after``, in order."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            snapshot = self._streams.get(stream, [])[max(after, 0):]
        return iter(snapshot)

    def version(self, stream: str) -> int:
        """The last seq of ``stream`` (0 if none)."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            return len(self._streams.get(stream, ()))

    def streams(self) -> list[str]:
        """Sorted names of the streams that have events."""
        with self._lock:
            self._check_open()
            return sorted(self._streams)


    def close(self) -> None:
        """Forget everything and release the leases; later calls raise ``ValueError``."""
        with self._lock:
            self._closed = True
            self._streams = {}
        self._leases.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("memory: store is closed")


    def __repr__(self) -> str:
        return "MemoryStore(read_only=True)" if self.read_only else "MemoryStore()"
