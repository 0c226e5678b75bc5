"""MemoryStore (``memory:``): event streams in a dict, for tests and experiments.

Nothing survives the process; everything else behaves as the durable stores do (numbering,
expected versions, all-or-nothing appends), so code tested against it runs unchanged on them.

>>> from nous_inbox.events import Warned
>>> store = MemoryStore()
>>> store.append("s", [Warned(text="hi")])[0].seq
1
>>> [e.text for e in store.read("s")]
['hi']

Every event is proved to read back before it is kept, as the durable stores prove theirs, so an
event this store accepts is one they accept too.

Design note: the one-event send or claim. A durable store must encode an event anyway, to write
it; this one keeps the event itself, so encoding is only ever a proof. For the two events every
message makes (its send and its claim), when they hold only plain values, the proof is already
made without encoding: the store judges each field's exact type and range
(:func:`~nous_inbox.store.base._reads_back`, the same judgement the durable stores use to skip
their decode), and the size limit holds exactly because such an event's MessagePack size is
bounded by its text's length plus a fixed overhead (computed below from the largest such event):
an event under the limit by that bound is under it by its real size, and one that is not goes
the general way and is encoded and measured. So a plain send or claim is appended with one check
of its fields and one lock, and anything else (a batch, another event, non-ASCII text, metadata)
takes :class:`~nous_inbox.store.base.StoreBase`'s path, proved by encoding.

Only ``MemoryStore`` itself takes that path; every subclass takes the general one, for every
append and ``version``. The path rests on assumptions no list of overridden hooks can hold for
good: the records are MessagePack (the bound is a MessagePack size; a subclass may set
``_format``, and JSON Lines writes a control character as six bytes), the lock is all the
exclusion needed (a subclass may turn ``_lock_excludes`` off so that its ``_appending`` runs),
and no hook has work to do (a ``_write`` that mirrors). A rule on the class alone cannot drift
as hooks are added. It is per class, so an instance-level patch of a hook or of ``_format``
(``store._write = ...``) is not seen: a plain send or claim skips it; patch a subclass instead.

Thread-safe: one lock guards the streams; ``read`` iterates over a snapshot taken under it.
Owner leases are a set in the store: no other store can see its streams, so none can own them.
``MemoryStore(read_only=True)`` is an empty store that refuses appends and leases, for code that
takes a read-only store.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Final, get_args

import msgspec

from nous_inbox.codec import MSGPACK
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Target
from nous_inbox.message import Message, Role
from nous_inbox.store.base import (
    _GOOD_STREAMS,
    _INT64_MAX,
    StoreBase,
    _conflict,
    _read_only_error,
    _reads_back,
    check_stream,
)
from nous_inbox.store.lease import Leases

__all__ = ["MemoryStore"]


_replace: Final = msgspec.structs.replace
_time: Final = time.time

#: The most a plain send (one :func:`_reads_back` proves) encodes to beyond its text: the largest
#: role, the largest seq and a time, a one-character text, plus the four bytes a string header
#: grows by at most (a fixstr's one byte to a str32's five).
_SENT_MOST: Final = max(
    len(MSGPACK.encode(MessageSent(target=target, wakeup=False, message=Message(role, "x"),
                                   seq=_INT64_MAX, at=-1e300))) - 1 + 4
    for role in get_args(Role) for target in Target
)
#: ... and the most a plain claim encodes to: every number at its largest.
_CLAIMED_MOST: Final = max(
    len(MSGPACK.encode(QueueClaimed(target=target, count=_INT64_MAX, rest=_INT64_MAX,
                                    seq=_INT64_MAX, at=-1e300)))
    for target in Target
)


class MemoryStore(StoreBase):
    """A :class:`~nous_inbox.store.base.Store` that keeps its streams in memory."""

    url = "memory:"
    blocking = False  # a call is a few microseconds under a lock: an event loop may make it
    _lock_excludes = True  # one lock guards the streams; a write is one list.extend

    #: Whether appends of a proven send or claim and ``version`` skip the hooks (see ``append``):
    #: only in ``MemoryStore`` itself, never in a subclass (see the module's design note).
    _direct: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._direct = False

    def __init__(self, *, read_only: bool = False) -> None:
        self.read_only = read_only
        self._streams: dict[str, list[Event]] = {}
        self._snapshots: dict[str, tuple[int, bytes]] = {}  # stream -> its newest snapshot
        self._lock = threading.Lock()
        self._leases = Leases(self.url, None)
        self._closed = False

    def __repr__(self) -> str:
        return "MemoryStore(read_only=True)" if self.read_only else "MemoryStore()"

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
        *, identity: str | uuid.UUID | None = None,
    ) -> list[Event]:
        """Append atomically, after proving every event reads back; see
        :class:`~nous_inbox.store.base.Store`. A lone plain send or claim is proved by its
        fields and size bound (see the module's design note); anything else by encoding."""
        if (
            self._direct and identity is None and (type(events) is list or type(events) is tuple) and len(events) == 1
            and type(stream) is str and stream in _GOOD_STREAMS
            and (expected_version is None
                 or (type(expected_version) is int and expected_version >= 0))
        ):
            event: Any = events[0]
            kind = type(event)
            if (kind is MessageSent or kind is QueueClaimed) and _reads_back(event) and (
                _CLAIMED_MOST if kind is QueueClaimed else _SENT_MOST + len(event.message.content)
            ) <= self.max_record_size:
                with self._lock:
                    if self._closed:
                        self._check_open()  # raises
                    if self.read_only:
                        raise _read_only_error(self.url)
                    log = self._streams.get(stream)
                    version = len(log) if log is not None else 0
                    if expected_version is not None and expected_version != version:
                        raise _conflict(stream, expected_version, version)
                    if event.seq != version + 1 or not event.at:
                        # Numbered and timed as _numbered would: still plain values, so the
                        # proof above holds for the copy.
                        event = _replace(event, seq=version + 1, at=event.at or _time())
                    if log is None:
                        self._streams[stream] = [event]
                    else:
                        log.append(event)
                return [event]
        return super().append(stream, events, expected_version, identity=identity)

    def version(self, stream: str) -> int:
        """The last seq of ``stream`` (0 if none); see :class:`~nous_inbox.store.base.Store`.

        Read without the lock: it is one dict lookup and one ``len``, each atomic, and a writer
        replaces nothing it reads (an append extends the stream's list; a close swaps in a new
        dict). A journal asks it before every read of what others wrote (an empty claim, a
        watcher's poll), so it costs what the lookup costs.
        """
        if not self._direct:
            return super().version(stream)
        if type(stream) is not str or stream not in _GOOD_STREAMS:  # (check_stream's cache)
            check_stream(stream)
        if self._closed:
            self._check_open()  # raises
        log = self._streams.get(stream)
        return len(log) if log is not None else 0

    # -- the hooks (called with the lock held) ---------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("memory: store is closed")

    def _appending(self, stream: str) -> contextlib.AbstractContextManager[int]:
        return contextlib.nullcontext(self._version(stream))

    def _write(self, stream: str, events: list[Event], records: list[bytes], *,
               batch: object | None = None) -> None:
        self._streams.setdefault(stream, []).extend(events)

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        return iter(self._streams.get(stream, [])[after:])

    def _version(self, stream: str) -> int:
        return len(self._streams.get(stream, ()))

    def _stream_names(self) -> list[str]:
        return sorted(self._streams)

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        self._snapshots[stream] = (seq, data)
        return True

    def _load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        return self._snapshots.get(stream)

    def _close(self) -> None:
        self._closed = True
        self._streams = {}
        self._snapshots = {}
