"""The Store protocol: where a session's event log lives, and the rules every store keeps.

A store holds named streams (one per session). Each stream is an append-only run of events
numbered 1, 2, 3, ... by the store itself, so two writers can never both think they wrote seq 7.
An append is all or nothing, and may say which version it expects the stream to be at
(optimistic concurrency): if another writer got there first, the append raises
:class:`~nous_inbox.errors.ConcurrencyError` and writes nothing.

>>> from nous_inbox.store import open_store
>>> from nous_inbox.events import Warned
>>> with open_store("memory:") as store:
...     stored = store.append("s1", [Warned(text="a"), Warned(text="b")], expected_version=0)
...     [e.seq for e in stored], store.version("s1"), store.streams()
([1, 2], 2, ['s1'])

One process runs a session (its owner); ``own(stream)`` takes the stream's
:class:`~nous_inbox.store.lease.OwnerLease`, so a second owner, in this process or another, is
refused with :class:`~nous_inbox.errors.StreamOwnedError` instead of running the session twice.
Appending needs no lease: anyone may send a message to a session someone else owns.

``version`` is meant to be polled: it is how an owner in one process notices what another process
appended, so every store answers it cheaply (a dict lookup, a ``stat``, an index seek).

Stream names are non-empty strings of at most 256 characters without control characters;
anything else is a ``ValueError`` naming it.
"""

from __future__ import annotations

import abc
import io
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Protocol, Self, runtime_checkable

import msgspec

from nous_inbox.errors import ConcurrencyError
from nous_inbox.events import EVENT_TYPES, Event
from nous_inbox.store.lease import Leases, OwnerLease

__all__ = [
    "StoreBase",
    "MAX_STREAM_NAME",
    "STORE_ENV",
    "Store",
    "StoreLockedError",
    "check_expected_version",
    "check_stream",
    "conflict",
    "default_store_path",
    "default_store_url",
    "number_events",
    "read_only_error",
]

MAX_STREAM_NAME: Final = 256
STORE_ENV: Final = "NOUS_INBOX_STORE"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class StoreLockedError(ConcurrencyError):
    """Another writer held the store for longer than the lock timeout; nothing was written."""


@runtime_checkable
class Store(Protocol):
    """What the owner and the CLI need from a place that keeps event logs."""

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
    ) -> list[Event]:
        """Append ``events`` to ``stream`` atomically and return them as stored.

        The store numbers them ``version + 1, version + 2, ...`` (any ``seq`` the caller set is
        ignored) and stamps ``at`` with the current time where the caller left ``0.0``. If
        ``expected_version`` is given and is not the stream's version, raise
        ``ConcurrencyError`` and write nothing. An empty list is a no-op returning ``[]``.
        """

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        """The events of ``stream`` with ``seq > after``, in order (none for an unknown stream)."""

    def version(self, stream: str) -> int:
        """The last ``seq`` of ``stream`` (0 if it has none); cheap enough to poll."""

    def streams(self) -> list[str]:
        """The names of the streams that have events, sorted."""

    def own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s owner lease, or raise ``StreamOwnedError`` if another owner holds it.

        The lease holds across store instances, threads and processes until it is released, its
        store is closed, or its process dies (even by SIGKILL). A store opened read-only refuses
        with ``ValueError``.
        """

    def close(self) -> None:
        """Release files, locks, leases and connections; the store is unusable afterwards."""

    def __enter__(self) -> Store: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store on leaving a ``with`` block."""


def check_stream(stream: object) -> str:
    """Return ``stream`` if it is a valid stream name, else raise ``ValueError`` naming it.

    >>> check_stream("session-1")
    'session-1'
    >>> check_stream("a\\nb")
    Traceback (most recent call last):
    ...
    ValueError: stream name 'a\\nb' contains a control character at index 1
    """
    if not isinstance(stream, str):
        raise ValueError(f"stream name must be a str, got {type(stream).__name__}: {stream!r}")
    if not stream:
        raise ValueError("stream name must not be empty")
    if len(stream) > MAX_STREAM_NAME:
        raise ValueError(
            f"stream name {stream[:40]!r}... is {len(stream)} characters long "
            f"(at most {MAX_STREAM_NAME})"
        )
    bad = _CONTROL.search(stream)
    if bad is not None:
        raise ValueError(
            f"stream name {stream!r} contains a control character at index {bad.start()}"
        )
    return stream


def check_expected_version(expected_version: object) -> None:
    """Refuse an ``expected_version`` that is neither ``None`` nor a non-negative ``int``."""
    if expected_version is None:
        return
    if type(expected_version) is not int or expected_version < 0:
        raise ValueError(
            f"expected_version must be None or an int >= 0, got {expected_version!r}"
        )


def conflict(stream: str, expected: int, actual: int) -> ConcurrencyError:
    """The error for an append whose expected version is stale."""
    return ConcurrencyError(
        f"stream {stream!r}: expected version {expected} but it is at {actual} "
        f"(another writer appended first); nothing was written"
    )


def read_only_error(url: str) -> io.UnsupportedOperation:
    """The error for an ``append`` or ``own`` on a store opened read-only (a ``ValueError``)."""
    return io.UnsupportedOperation(f"{url} was opened read-only")


def number_events(
    stream: str, events: Sequence[Event], version: int, now: float | None = None,
) -> list[Event]:
    """The events as the store will keep them: ``seq`` from ``version + 1``, ``at`` filled in.

    Refuses anything that is not an event of the vocabulary, naming its index, so a bad batch
    is rejected before a byte is written.

    >>> from nous_inbox.events import Warned
    >>> [(e.seq, e.at) for e in number_events("s", [Warned(text="x", seq=9)], 4, now=1.5)]
    [(5, 1.5)]
    """
    if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
        raise TypeError(
            f"append to {stream!r}: events must be a sequence of events, "
            f"got {type(events).__name__}"
        )
    stamp = time.time() if now is None else now
    replace = msgspec.structs.replace
    numbered: list[Event] = []
    for i, event in enumerate(events):
        if type(event) not in EVENT_TYPES:
            raise TypeError(
                f"append to {stream!r}: events[{i}] is a {type(event).__name__}, not an event"
            )
        at = event.at if event.at else stamp
        numbered.append(replace(event, seq=version + 1 + i, at=at))
    return numbered


def default_store_path() -> Path:
    """Where the default SQLite store lives: ``$XDG_STATE_HOME/nous-inbox/inbox.sqlite``.

    ``XDG_STATE_HOME`` defaults to ``~/.local/state`` (a relative value is ignored, as the XDG
    specification asks). Does not create anything.
    """
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "nous-inbox" / "inbox.sqlite"


def default_store_url() -> str:
    """The store to use when none is named: ``$NOUS_INBOX_STORE`` if set, else a private SQLite file.

    The SQLite file is :func:`default_store_path`; its directory is created (mode 0700) so the
    store can be opened straight away.
    """
    url = os.environ.get(STORE_ENV, "")
    if url:
        return url
    path = default_store_path()
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)  # mkdir's mode is filtered by the umask
    return f"sqlite:{path}"


class StoreBase(abc.ABC):
    """What the three stores share: owner leases, the read-only refusal, and ``with`` blocks.

    A store sets ``url``, ``read_only``, ``_lock`` and ``_leases``, and says how it checks that
    it is still open (``_check_open``) and how it closes.
    """

    url: str
    read_only: bool
    _lock: threading.Lock | threading.RLock
    _leases: Leases

    @abc.abstractmethod
    def _check_open(self) -> None:
        """Raise ``ValueError`` if the store was closed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the store holds; later calls raise ``ValueError``."""

    def own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s owner lease; see :class:`Store`."""
        check_stream(stream)
        with self._lock:
            self._check_writable()
        return self._leases.own(stream)

    def _check_writable(self) -> None:
        """Raise unless the store is open and was not opened read-only (call with the lock)."""
        self._check_open()
        if self.read_only:
            raise read_only_error(self.url)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
