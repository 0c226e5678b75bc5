"""StoreBase: the :class:`~nous_inbox.store.base.protocol.Store` protocol written once, over hooks.

A store implements a few hooks (``_appending``, ``_write``, ``_read``, ``_version``,
``_stream_names``, ``_check_open``, ``_close``; optionally its snapshots and ``_delete``);
everything a caller can get wrong is checked here once, so every store refuses it alike.

>>> from nous_inbox.store import MemoryStore
>>> isinstance(MemoryStore(), StoreBase)
True
"""

from __future__ import annotations

import abc
import contextlib
import io
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, Final, Self

from nous_inbox.codec import DECODE_ERRORS, JSON_LINES, MAX_RECORD_SIZE, MSGPACK, LogFormat
from nous_inbox.errors import DecodeError, RecordTooLargeError, StoreError
from nous_inbox.events import Event
from nous_inbox.store.base.proof import batch_digest, first_unencodable, reads_back, refused
from nous_inbox.store.base.protocol import (
    Moved,
    append_identity,
    check_expected_version,
    check_stream,
    checked_events,
    number_events,
    read_only_error,
    version_conflict,
)
from nous_inbox.store.lease import Leases, OwnerLease
from nous_inbox.store.snapshot import SnapshotError, check_snapshot, split_snapshot, tip_after

__all__ = ["StoreBase"]

_READ_BACK: Final = "it would not read back"
_EVENT_DECODE: Final = {fmt: fmt.decoder(Event).decode for fmt in (MSGPACK, JSON_LINES)}
#: How many identities of appends made with one a local store remembers (see ``append``).
_BATCHES_KEPT: Final = 4096


class StoreBase(abc.ABC):
    """The store template: the :class:`~nous_inbox.store.base.Store` protocol written once, over a few hooks.

    ``append`` checks the stream name, the expected version's type and every event, refuses a
    read-only store, then, inside ``_appending`` (which excludes other writers and gives the
    stream's version), compares the expected version, numbers the events, encodes them
    (``_encode``), refuses a record above ``max_record_size``, proves each record decodes back
    to an equal event (``_decode``), and hands the batch to ``_write``. ``read``, ``version``
    and ``streams`` check their arguments and that the store is open, then call ``_read``,
    ``_version`` and ``_stream_names``; ``close`` releases the leases (``_release_all``), then
    calls ``_close``.

    A store sets ``url``, ``read_only``, ``_lock`` (held around every hook call) and
    ``_leases``; it may set ``_format`` (the codec it writes with, MessagePack by default) and
    ``max_record_size``.
    """

    url: str
    read_only: bool
    max_record_size: int = MAX_RECORD_SIZE
    #: Whether a call may wait on a disk, a lock or a network (an asyncio host then makes it
    #: from a worker thread, never on its event loop). Only ``memory:`` says no.
    blocking: bool = True
    _format: LogFormat = MSGPACK
    #: Whether ``_lock`` alone keeps every other writer out and ``_write`` either keeps the
    #: whole batch or raises having kept nothing (``memory:``): the append then asks ``_version``
    #: for the version instead of entering ``_appending``, a context with nothing to do there.
    _lock_excludes: bool = False
    _lock: threading.Lock | threading.RLock
    _leases: Leases
    _append_observers: tuple[Callable[[str, int, float], object], ...] = ()

    #: Whether the records are the bare events in ``_format`` (the store overrides neither
    #: ``_encode`` nor ``_decode``): set for each subclass as it is defined. Then an event whose
    #: fields prove it reads back (``reads_back``) is not decoded again before it is written.
    _bare_records: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._bare_records = (
            cls._encode is StoreBase._encode and cls._decode is StoreBase._decode
        )

    # -- hooks -----------------------------------------------------------------------------------

    @abc.abstractmethod
    def _check_open(self) -> None:
        """Raise ``ValueError`` if the store was closed."""

    @abc.abstractmethod
    def _appending(self, stream: str) -> contextlib.AbstractContextManager[int]:
        """Exclude other writers of ``stream`` and give its version; keep what was written
        inside on a clean exit, nothing on an error (a transaction, a file lock, ...)."""

    @abc.abstractmethod
    def _write(self, stream: str, events: list[Event], records: list[bytes], *,
               batch: object | None = None) -> None:
        """Keep ``events`` (numbered, stamped) whose encodings ``_encode`` gave as ``records``;
        ``batch`` is the append's identity when ``_append_retrying`` gave one (a store that
        retries an append keeps it, to recognise a lost attempt that committed), else ``None``."""

    @abc.abstractmethod
    def _read(self, stream: str, after: int) -> Iterator[Event]:
        """The events of ``stream`` after seq ``after`` (``after`` >= 0)."""

    @abc.abstractmethod
    def _version(self, stream: str) -> int:
        """The last seq of ``stream``, 0 if none."""

    @abc.abstractmethod
    def _stream_names(self) -> list[str]:
        """The names of the streams that have events, sorted."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release what the store holds (with the lock, on every ``close``: the second and later
        calls must do nothing)."""

    def _moved(self, since: object) -> Moved:
        """The streams that moved since the cursor ``since`` (see :meth:`moved`): by default
        always a full answer, correct but costing every stream; each store here overrides it."""
        return Moved(self._stream_names(), None, True)

    def _own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s lease (the name and the store checked): by default from ``_leases``."""
        return self._leases.own(stream)

    def _holds(self, stream: str) -> bool:
        """Whether this store holds ``stream``'s lease: by default asked of ``_leases``."""
        return self._leases.holds(stream)

    def _delete(self, stream: str) -> None:
        """Remove ``stream``'s events and snapshot in one step (with the lock, the store
        writable, the stream's lease held by this store); nothing for an unknown stream. A store
        that cannot refuses with ``io.UnsupportedOperation`` (a ``ValueError``), the default."""
        raise io.UnsupportedOperation(f"{self.url} cannot delete a stream")

    def _release_all(self) -> None:
        """Give up every lease still held, first thing in ``close`` (called without the lock,
        since a lease's release may need it): by default ``_leases.close()``."""
        self._leases.close()

    def _append_retrying(
        self, stream: str, events: Sequence[Event], expected_version: int | None,
        identity: uuid.UUID | None,
    ) -> list[Event]:
        """Make the checked, non-empty append: by default once, with the caller's identity.

        A store that retries an append after a lost connection overrides this and gives each
        append an identity (``batch``), which ``_append_once`` hands to ``_write``.
        """
        return self._append_once(stream, events, expected_version, identity, identity is not None)

    def _find_batch(self, stream: str, identity: uuid.UUID) -> list[Event] | None:
        """The events of the append made to ``stream`` with ``identity``, or ``None``: by
        default from the identities this store remembers (with the lock, the stream held).
        The events must still be the ones written then: another store may have deleted the
        stream since, and another writer filled the same seqs."""
        span = self.__dict__.get("_batches", {}).get((stream, identity))
        if span is None:
            return None
        first, count, digest = span
        found = list(itertools.islice(self._read(stream, first - 1), count))
        if len(found) != count or found[0].seq != first:
            return None
        return found if batch_digest(self._encode(stream, found)) == digest else None

    def _remember_batch(self, stream: str, identity: uuid.UUID, stored: list[Event],
                        records: list[bytes]) -> None:
        """Note the append just written with ``identity`` (its events and their ``records``);
        by default in this store's memory, the oldest forgotten past ``_BATCHES_KEPT``."""
        kept: dict[tuple[str, uuid.UUID], tuple[int, int, bytes]] = self.__dict__.setdefault(
            "_batches", {})
        if len(kept) >= _BATCHES_KEPT:
            del kept[next(iter(kept))]
        kept[(stream, identity)] = (stored[0].seq, len(stored), batch_digest(records))

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        """Keep ``data`` as ``stream``'s snapshot at ``seq`` in place of whatever is kept;
        whether it was kept. Optional: by default a store keeps no snapshots (see
        :mod:`nous_inbox.store.snapshot`). Called with the lock, never on a read-only store, with
        ``1 <= seq <=`` the stream's version, only when :meth:`save_snapshot` decided that
        ``data`` replaces the one kept: the hook writes, it does not judge."""
        return False

    def _load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """The snapshot kept for ``stream`` as ``(seq, data)``, or ``None``. Optional."""
        return None

    def _snapshot_seq(self, stream: str) -> int | None:
        """The seq of the snapshot kept for ``stream`` (``None``: none, or none readable), called
        with the lock before every save. By default from :meth:`_load_snapshot`; a store that
        can tell without reading the whole snapshot overrides it."""
        found = self._load_snapshot(stream)
        return None if found is None else found[0]

    def _keeps_newer_snapshot(self, stream: str, seq: int, version: int) -> bool:
        # The one replacement rule, for every store: the snapshot kept is replaced unless it is
        # newer than ``seq`` AND still of this log. One beyond the stream's version, or taken of
        # another log (deleted and begun again under the same name), can never be used, and
        # keeping it would block every save until the log grew past it. Equal seqs: the last
        # writer wins (both are valid caches).
        try:
            kept = self._snapshot_seq(stream)
        except StoreError:
            return False  # one that cannot be read (planted, damaged) is replaced
        if kept is None or kept <= seq or kept > version:
            return False
        try:
            found = self._load_snapshot(stream)  # rare: only a saver behind the kept snapshot
        except StoreError:
            return False
        if found is None or found[0] != kept:
            return False
        try:
            head, _ = split_snapshot(found[1])
            tip = list(itertools.islice(self._read(stream, tip_after(kept)), kept - tip_after(kept)))
            check_snapshot(head, stream, tip)
        except SnapshotError:
            return False
        return True

    def _encode(self, stream: str, events: list[Event]) -> list[bytes]:
        """Each event as the store keeps it: by default its bare encoding in ``_format``."""
        encode = self._format.encode
        if len(events) == 1:  # most appends: one send, one claim, one record
            return [encode(events[0])]
        return [encode(event) for event in events]

    def _decode(self, stream: str, record: bytes) -> Event:
        """Read back one record ``_encode`` made (the proof before a write)."""
        fmt = self._format
        decode = _EVENT_DECODE.get(fmt)
        try:
            event: Event = (
                decode(record) if decode is not None else fmt.decoder(Event).decode(record)
            )
        except DECODE_ERRORS:  # the slow way again, for an error that says where
            event = self._format.decode(record, Event, _READ_BACK, self.max_record_size)
        return event

    # -- the protocol ----------------------------------------------------------------------------

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
        *, identity: str | uuid.UUID | None = None,
    ) -> list[Event]:
        """Append atomically, after proving every event reads back; see :class:`~nous_inbox.store.base.Store`."""
        check_stream(stream)
        if expected_version is not None and (
            type(expected_version) is not int or expected_version < 0
        ):
            check_expected_version(expected_version)
        key = None if identity is None else append_identity(identity)
        batch = checked_events(stream, events)
        if not batch:
            with self._lock:
                self._check_writable()
            return []
        start = time.perf_counter()
        stored = self._append_retrying(stream, batch, expected_version, key)
        for observe in self._append_observers:
            try:  # stored: what an observer raises must not read as a failed append
                observe(stream, len(stored), time.perf_counter() - start)
            except Exception:
                logging.getLogger("nous_inbox.store").exception("%s: an append observer failed", self.url)
        return stored

    def observe_appends(self, callback: Callable[[str, int, float], object]) -> Callable[[], None]:
        """Call ``callback(stream, events, seconds)`` after each append this store makes (the
        time a caller waits: checks, proof, write); returns the call that stops it. Metrics use
        it (:class:`nous_inbox.observe.Metrics`); it runs on the appending thread, so keep it quick."""
        with self._lock:
            self._append_observers += (callback,)

        def stop() -> None:
            with self._lock:
                self._append_observers = tuple(o for o in self._append_observers if o is not callback)

        return stop

    def _append_once(
        self, stream: str, events: Sequence[Event], expected_version: int | None,
        batch: Any, known: bool = False,
    ) -> list[Event]:
        """One attempt at a checked append, under the lock; ``batch`` (when not ``None``, the
        append's identity) is passed on to ``_write`` as its keyword ``batch``, and looked for
        first when ``known`` (the caller named it)."""
        with self._lock:
            self._check_open()
            if self.read_only:
                raise read_only_error(self.url)
            if self._lock_excludes:
                return self._append_at(stream, events, expected_version, batch,
                                       self._version(stream), known)
            with self._appending(stream) as version:
                return self._append_at(stream, events, expected_version, batch, version, known)

    def _append_at(
        self, stream: str, events: Sequence[Event], expected_version: int | None,
        batch: Any, version: int, known: bool = False,
    ) -> list[Event]:
        """The checked append, the stream held at ``version``: an append already made with
        its identity is answered as it was; else compare, number, prove, write."""
        if known:
            found = self._find_batch(stream, batch)
            if found is not None:
                return found
        if expected_version is not None and expected_version != version:
            raise version_conflict(stream, expected_version, version)
        stored = number_events(events, version, None)
        records = self._prove(stream, stored)
        if batch is None:  # (a store written before ``batch`` may not take it)
            self._write(stream, stored, records)
        else:
            self._write(stream, stored, records, batch=batch)
            if known:
                self._remember_batch(stream, batch, stored, records)
        return stored

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        """The events of ``stream`` after seq ``after``, in order; see :class:`~nous_inbox.store.base.Store`."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            return self._read(stream, max(after, 0))

    def version(self, stream: str) -> int:
        """The last seq of ``stream`` (0 if none); see :class:`~nous_inbox.store.base.Store`."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            return self._version(stream)

    def streams(self) -> list[str]:
        """Sorted names of the streams that have events."""
        with self._lock:
            self._check_open()
            return self._stream_names()

    def moved(self, since: object = None) -> Moved:
        """The streams that moved since the look that gave ``since``; see :class:`~nous_inbox.store.base.Store`."""
        with self._lock:
            self._check_open()
            return self._moved(since)

    def save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        """Keep ``data`` (an encoded :mod:`~nous_inbox.store.snapshot`) as ``stream``'s snapshot at
        ``seq``; whether it was written.

        It replaces the snapshot kept unless that one is newer and still of this log; one
        beyond the stream's version or of another log (a log deleted and begun again) is always
        replaced. A snapshot is a cache beside the log, never part of it: a read-only store, one
        that keeps none, or one that keeps a newer snapshot of this log answers ``False`` and
        nothing is written. ``seq`` must be between 1 and the stream's version (``ValueError``
        otherwise).
        """
        check_stream(stream)
        if type(seq) is not int or seq < 1:
            raise ValueError(f"snapshot of {stream!r}: seq must be an int >= 1, got {seq!r}")
        if not isinstance(data, bytes):
            raise TypeError(f"snapshot of {stream!r}: data must be bytes, got {type(data).__name__}")
        with self._lock:
            self._check_open()
            if self.read_only:
                return False
            version = self._version(stream)
            if seq > version:
                raise ValueError(
                    f"snapshot of {stream!r}: seq {seq} is beyond the stream's version {version}"
                )
            if self._keeps_newer_snapshot(stream, seq, version):
                return False
            return self._save_snapshot(stream, seq, data)

    def load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """The snapshot kept for ``stream`` as ``(seq, data)``, or ``None`` (undecoded:
        :func:`nous_inbox.store.snapshot.load_session` checks it before trusting it)."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            return self._load_snapshot(stream)

    def delete(self, stream: str) -> None:
        """Remove ``stream``'s events and snapshot atomically, under its lease; see :class:`~nous_inbox.store.base.Store`."""
        check_stream(stream)
        with self._lock:
            self._check_writable()
        lease = None if self._holds(stream) else self._own(stream)
        try:
            with self._lock:
                self._check_writable()
                self._delete(stream)
                batches = self.__dict__.get("_batches", {})
                for key in [key for key in batches if key[0] == stream]:
                    del batches[key]  # their seqs will be numbered again
        finally:
            if lease is not None:
                lease.release()

    def own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s owner lease; see :class:`~nous_inbox.store.base.Store`."""
        check_stream(stream)
        with self._lock:
            self._check_writable()
        return self._own(stream)

    def close(self) -> None:
        """Release leases, then files, locks and connections; later calls raise ``ValueError``."""
        try:
            self._release_all()
        finally:
            with self._lock:
                self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the shared work -------------------------------------------------------------------------

    def _check_writable(self) -> None:
        """Raise unless the store is open and was not opened read-only (call with the lock)."""
        self._check_open()
        if self.read_only:
            raise read_only_error(self.url)

    def _prove(self, stream: str, events: list[Event]) -> list[bytes]:
        """Encode ``events``; refuse (naming the index) one too large or not read back equal."""
        try:
            if self._bare_records and len(events) == 1:  # _encode's own work, one call less
                records = [self._format.encode(events[0])]
            else:
                records = self._encode(stream, events)
            if self._format is not MSGPACK:
                # What one store accepts every store accepts, so a log can move between them:
                # MessagePack carries 64-bit integers only, where JSON would take any.
                for event in events:
                    MSGPACK.encode(event)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:  # incl. Unicode...
            index = first_unencodable(events)
            raise refused(stream, index, events[index], exc) from None
        limit = self.max_record_size
        decode = self._decode
        bare = self._bare_records
        for i, event in enumerate(events):
            record = records[i]
            if len(record) > limit:
                raise RecordTooLargeError(
                    f"{self.url}: an event of stream {stream!r} (events[{i}], "
                    f"{type(event).__name__}) encodes to {len(record)} bytes, above the limit of "
                    f"{limit} bytes; nothing was written"
                )
            if bare and reads_back(event):
                continue
            try:
                back = decode(stream, record)
            except (DecodeError, TypeError, ValueError, RecursionError) as exc:
                raise refused(stream, i, event, exc) from None
            if back != event:
                raise ValueError(
                    f"append to {stream!r}: events[{i}] ({type(event).__name__}) would not read "
                    f"back equal (stored as {back!r}); nothing was written"
                )
        return records
