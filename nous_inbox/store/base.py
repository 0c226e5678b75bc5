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

A store acknowledges only what it has proved it can read back: every event of an append is
proved to read back before anything is written, either encoded in the store's own format and
decoded again or, for a plain send or claim, judged by its fields (:func:`_reads_back`, the
exact type and range of each, held to the decoders by a property test). One that would not come
back equal (a bare ``str`` where a message belongs, an unknown target, a ``wakeup`` that is not
a bool, a time that is not a finite number) is refused with a ``TypeError`` or ``ValueError``
naming its index and the field, and nothing is written. So a hand-built event can never poison
a log for its other readers.

Writing a store. :class:`StoreBase` does the shared work once: it checks names, expected
versions and events, refuses writes to a read-only store, numbers and time-stamps events,
encodes them in the store's :class:`~nous_inbox.codec.LogFormat`, enforces the size limit and
proves each record decodes. A store implements only a few hooks: ``_appending`` (exclude other
writers and say the stream's version), ``_write`` (keep the encoded batch), ``_read``,
``_version``, ``_stream_names``, ``_check_open`` and ``_close``; see their docstrings. Two more
are optional, ``_save_snapshot`` and ``_load_snapshot``: where a store keeps its snapshots
(:mod:`nous_inbox.snapshot`); without them it keeps none, and every session replays in full. A
store whose leases or appends are not the local kind overrides ``_own`` and ``_release_all``
(leases held elsewhere) or ``_append_retrying`` (an append retried after a lost connection, its
batch identified so a retry never writes it twice).

Stream names are non-empty strings of at most 256 characters without control characters;
anything else is a ``ValueError`` naming it.
"""

from __future__ import annotations

import abc
import contextlib
import io
import itertools
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Protocol, Self, cast, runtime_checkable

import msgspec

from nous_inbox.codec import _BAD, JSON_LINES, MAX_RECORD_SIZE, MAX_STREAM_NAME, MSGPACK, LogFormat
from nous_inbox.errors import (
    ConcurrencyError,
    DecodeError,
    OutcomeUnknownError,
    RecordTooLargeError,
    StoreError,
)
from nous_inbox.events import EVENT_TYPES, Event, MailSent, MessageSent, QueueClaimed
from nous_inbox.inbox import Target
from nous_inbox.message import ROLES, Message, freeze_json
from nous_inbox.snapshot import SnapshotError, check_snapshot, split_snapshot, tip_after
from nous_inbox.store.lease import Leases, OwnerLease

__all__ = [
    "MAX_STREAM_NAME",
    "STORE_ENV",
    "Store",
    "StoreBase",
    "StoreLockedError",
    "append_identity",
    "append_once",
    "check_max_record_size",
    "check_stream",
    "default_store_path",
    "default_store_url",
]

STORE_ENV: Final = "NOUS_INBOX_STORE"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_READ_BACK: Final = "it would not read back"
_INF: Final = math.inf
_EVENT_TYPES: Final = frozenset(EVENT_TYPES)
_NO_METADATA: Final = next(f.default for f in msgspec.structs.fields(Message)
                           if f.name == "metadata")
_INT64_MAX: Final = 2**63 - 1
_EVENT_DECODE: Final = {fmt: fmt.decoder(Event).decode for fmt in (MSGPACK, JSON_LINES)}
_replace: Final = msgspec.structs.replace
_GOOD_STREAMS: Final[dict[str, None]] = {}  # names check_stream has passed, as a set
_GOOD_STREAMS_KEPT: Final = 4096
#: How many identities of appends made with one a local store remembers (see ``append``).
_BATCHES_KEPT: Final = 4096
#: The namespace of the identities made from a caller's own key (see :func:`append_identity`).
_IDENTITIES: Final = uuid.UUID("5a0a5b9e-6f1e-4c56-9d1e-6e6f75732d69")


class StoreLockedError(ConcurrencyError):
    """Another writer held the store for longer than the lock timeout; nothing was written."""


@runtime_checkable
class Store(Protocol):
    """What the owner and the CLI need from a place that keeps event logs."""

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
        *, identity: str | uuid.UUID | None = None,
    ) -> list[Event]:
        """Append ``events`` to ``stream`` atomically and return them as stored.

        The store numbers them ``version + 1, version + 2, ...`` (any ``seq`` the caller set is
        ignored) and stamps ``at`` with the current time where the caller left ``0.0``. If
        ``expected_version`` is given and is not the stream's version, raise
        ``ConcurrencyError`` and write nothing. An event the store could not read back equal
        is refused (``TypeError`` or ``ValueError``) and nothing is written. An empty list is a
        no-op returning ``[]``.

        ``identity`` (see :func:`append_identity`) names the append: an append with an identity
        already written to ``stream`` writes nothing and returns the events stored then, before
        any version check. So an append whose outcome is unknown
        (:class:`~nous_inbox.errors.OutcomeUnknownError`, a call cancelled in its thread) is
        retried with the same identity and written once. A server store keeps identities with
        the events; a local one remembers those of its last 4096 appends made with one, for as
        long as it is open (a local append's outcome is known to the process that made it).
        """

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        """The events of ``stream`` with ``seq > after``, in order (none for an unknown stream)."""

    def version(self, stream: str) -> int:
        """The last ``seq`` of ``stream`` (0 if it has none); cheap enough to poll."""

    def streams(self) -> list[str]:
        """The names of the streams that have events, sorted."""

    def own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s owner lease, or raise ``StreamOwnedError`` if another owner holds it.

        The lease holds across store instances, threads and processes until it is released or
        its store is closed. When its process dies (even by SIGKILL), a local store's lease
        (``file:``, ``sqlite:``) dies with it at once; a server's (``postgresql:``) expires a
        lease time after its last renewal, and an owner whose expired lease was taken over is
        refused with ``LeaseLostError``. A store opened read-only refuses with ``ValueError``.
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
    if type(stream) is str and stream in _GOOD_STREAMS:
        return stream
    if not isinstance(stream, str):
        raise ValueError(f"stream name must be a str, got {type(stream).__name__}: {stream!r}")
    if not stream:
        raise ValueError("stream name must not be empty")
    if len(stream) > MAX_STREAM_NAME:
        raise ValueError(
            f"stream name {stream[:40]!r}... is {len(stream)} characters long "
            f"(at most {MAX_STREAM_NAME})"
        )
    if not stream.isascii():
        try:
            stream.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"stream name {stream!r} has no UTF-8 form (a lone surrogate at index "
                f"{exc.start}), so no store can write it"
            ) from None
    bad = _CONTROL.search(stream)
    if bad is not None:
        raise ValueError(
            f"stream name {stream!r} contains a control character at index {bad.start()}"
        )
    if type(stream) is str:
        # Every append, read and poll names its stream: one already found good is looked up
        # rather than checked again. Bounded, so a host naming endless streams keeps no more.
        if len(_GOOD_STREAMS) >= _GOOD_STREAMS_KEPT:
            _GOOD_STREAMS.clear()
        _GOOD_STREAMS[stream] = None
    return stream


def append_identity(identity: object) -> uuid.UUID:
    """The identity of an append as the stores keep it: a ``uuid.UUID`` as it is; a ``str``
    that spells a UUID, that UUID; any other non-empty ``str`` (a key of the caller's own), a
    UUID made from it. Anything else is a ``TypeError``.

    >>> append_identity("send-42") == append_identity("send-42") != append_identity("send-43")
    True
    """
    if type(identity) is uuid.UUID:
        return identity
    if type(identity) is str and identity:
        try:
            return uuid.UUID(identity)
        except ValueError:
            return uuid.uuid5(_IDENTITIES, identity)
    raise TypeError(f"an append's identity must be a uuid.UUID or a non-empty str, "
                    f"got {identity!r}")


def append_once(
    store: Store, stream: str, events: Sequence[Event], expected_version: int | None = None,
    *, tries: int = 3,
) -> list[Event]:
    """``store.append``, written once whatever its outcome: an append whose outcome the store
    could not learn (:class:`~nous_inbox.errors.OutcomeUnknownError`) is made again with the
    identity the error gives, up to ``tries`` attempts in all, then that error is raised. Every
    other error means nothing was written, and is raised at once. (The first attempt names no
    identity, so it costs what any append costs.)

    >>> from nous_inbox.store import open_store
    >>> from nous_inbox.events import Warned
    >>> [e.seq for e in append_once(open_store("memory:"), "s", [Warned(text="a")])]
    [1]
    """
    try:
        return store.append(stream, events, expected_version)
    except OutcomeUnknownError as unknown:
        for left in range(tries - 1, 0, -1):
            try:
                return store.append(stream, events, expected_version, identity=unknown.identity)
            except OutcomeUnknownError as again:
                if left == 1:
                    raise again from unknown
        raise


def check_max_record_size(url: str, value: object) -> int:
    """``value`` if it is a store's ``max_record_size`` (an int >= 1, in bytes), else raise,
    naming it: checked when a store opens, because the runner holds tool results to the limit
    the store says, and a limit the store enforces differently would end a turn instead.

    >>> check_max_record_size("memory:", 4096)
    4096
    >>> check_max_record_size("memory:", 65536.0)
    Traceback (most recent call last):
    ...
    TypeError: memory:: max_record_size must be an int >= 1 (bytes), got 65536.0
    """
    if type(value) is not int:  # a bool, a float: refused, not rounded
        raise TypeError(f"{url}: max_record_size must be an int >= 1 (bytes), got {value!r}")
    if value < 1:
        raise ValueError(f"{url}: max_record_size must be an int >= 1 (bytes), got {value!r}")
    return value


def _check_expected_version(expected_version: object) -> None:
    """Refuse an ``expected_version`` that is neither ``None`` nor a non-negative ``int``."""
    if expected_version is None:
        return
    if type(expected_version) is not int or expected_version < 0:
        raise ValueError(
            f"expected_version must be None or an int >= 0, got {expected_version!r}"
        )


def _conflict(stream: str, expected: int, actual: int) -> ConcurrencyError:
    """The error for an append whose expected version is stale."""
    return ConcurrencyError(
        f"stream {stream!r}: expected version {expected} but it is at {actual} "
        f"(another writer appended first); nothing was written"
    )


def _read_only_error(url: str) -> io.UnsupportedOperation:
    """The error for an ``append`` or ``own`` on a store opened read-only (a ``ValueError``)."""
    return io.UnsupportedOperation(f"{url} was opened read-only")


def _checked_events(stream: str, events: object) -> Sequence[Event]:
    """Refuse anything but a sequence of events with finite times, naming the index."""
    shape = type(events)
    if shape is not list and shape is not tuple and (  # (the ABC check costs as much as the rest)
        isinstance(events, (str, bytes)) or not isinstance(events, Sequence)
    ):
        raise TypeError(
            f"append to {stream!r}: events must be a sequence of events, "
            f"got {type(events).__name__}"
        )
    checked = cast(Sequence[Event], events)
    kinds = _EVENT_TYPES
    for i, event in enumerate(checked):
        kind = type(event)
        if kind not in kinds:
            raise TypeError(
                f"append to {stream!r}: events[{i}] is a {type(event).__name__}, not an event"
            )
        at = event.at
        if type(at) is float and -_INF < at < _INF and kind is not MailSent:
            continue  # the common case, every check below passed
        if type(event) is MailSent and event.body is not None:
            # The check the mailbox's send makes (JSON-able, str keys, at most MAX_DEPTH deep):
            # a body built by hand is refused here by every store alike. Here, not when the
            # event is built, so replay does not walk every body again as it decodes.
            freeze_json(event.body, f"append to {stream!r}: events[{i}] (MailSent) body")
        if not (type(at) is float and -_INF < at < _INF) and (  # NaN fails both comparisons
            type(at) is bool or not isinstance(at, (int, float)) or not _finite(at)
        ):
            raise ValueError(
                f"append to {stream!r}: events[{i}].at must be a finite number of seconds, "
                f"got {at!r}; nothing was written"
            )
    return checked


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int beyond any float (10**400)
        return False


def _numbered(events: Sequence[Event], version: int, now: float | None = None) -> list[Event]:
    """Checked events as the store keeps them: ``seq`` from ``version + 1``, ``at`` filled in."""
    numbered = []
    for event in events:
        version += 1
        at = event.at
        # An event numbered and timed already (a journal does so before it folds) is kept as
        # it is: the copy would be equal.
        if type(event.seq) is not int or event.seq != version or type(at) is not float or not at:
            if not at:
                if now is None:
                    now = time.time()  # once an append, and only when some event needs it
                at = now
            event = _replace(event, seq=version, at=float(at))
        numbered.append(event)
    return numbered


def number_events(
    stream: str, events: Sequence[Event], version: int, now: float | None = None,
) -> list[Event]:
    """The events as the store will keep them: ``seq`` from ``version + 1``, ``at`` filled in.

    Deprecated as public API (a store built on :class:`StoreBase` never calls it); kept so old
    imports work. Refuses anything that is not an event of the vocabulary, naming its index.

    >>> from nous_inbox.events import Warned
    >>> [(e.seq, e.at) for e in number_events("s", [Warned(text="x", seq=9)], 4, now=1.5)]
    [(5, 1.5)]
    """
    return _numbered(_checked_events(stream, events), version, now)


# Deprecated aliases of helpers that became private (a store implements hooks instead).
check_expected_version = _check_expected_version
conflict = _conflict
read_only_error = _read_only_error


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
    """The store template: the :class:`Store` protocol written once, over a few hooks.

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

    #: Whether the records are the bare events in ``_format`` (the store overrides neither
    #: ``_encode`` nor ``_decode``): set for each subclass as it is defined. Then an event whose
    #: fields prove it reads back (``_reads_back``) is not decoded again before it is written.
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

    def _own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s lease (the name and the store checked): by default from ``_leases``."""
        return self._leases.own(stream)

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
        default from the identities this store remembers (with the lock, the stream held)."""
        span = self.__dict__.get("_batches", {}).get((stream, identity))
        if span is None:
            return None
        first, count = span
        found = list(itertools.islice(self._read(stream, first - 1), count))
        return found if len(found) == count and found[0].seq == first else None

    def _remember_batch(self, stream: str, identity: uuid.UUID, stored: list[Event]) -> None:
        """Note the append just written with ``identity``; by default in this store's memory,
        the oldest forgotten past ``_BATCHES_KEPT``."""
        kept: dict[tuple[str, uuid.UUID], tuple[int, int]] = self.__dict__.setdefault(
            "_batches", {})
        if len(kept) >= _BATCHES_KEPT:
            del kept[next(iter(kept))]
        kept[(stream, identity)] = (stored[0].seq, len(stored))

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        """Keep ``data`` as ``stream``'s snapshot at ``seq`` in place of whatever is kept;
        whether it was kept. Optional: by default a store keeps no snapshots (see
        :mod:`nous_inbox.snapshot`). Called with the lock, never on a read-only store, with
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
        except _BAD:  # the slow way again, for an error that says where
            event = self._format.decode(record, Event, _READ_BACK, self.max_record_size)
        return event

    # -- the protocol ----------------------------------------------------------------------------

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
        *, identity: str | uuid.UUID | None = None,
    ) -> list[Event]:
        """Append atomically, after proving every event reads back; see :class:`Store`."""
        if type(stream) is not str or stream not in _GOOD_STREAMS:  # (check_stream's own cache)
            check_stream(stream)
        if expected_version is not None and (
            type(expected_version) is not int or expected_version < 0
        ):
            _check_expected_version(expected_version)
        key = None if identity is None else append_identity(identity)
        batch = _checked_events(stream, events)
        if not batch:
            with self._lock:
                self._check_writable()
            return []
        return self._append_retrying(stream, batch, expected_version, key)

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
                raise _read_only_error(self.url)
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
            raise _conflict(stream, expected_version, version)
        stored = _numbered(events, version, None)
        records = self._prove(stream, stored)
        if batch is None:  # (a store written before ``batch`` may not take it)
            self._write(stream, stored, records)
        else:
            self._write(stream, stored, records, batch=batch)
            if known:
                self._remember_batch(stream, batch, stored)
        return stored

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        """The events of ``stream`` after seq ``after``, in order; see :class:`Store`."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            return self._read(stream, max(after, 0))

    def version(self, stream: str) -> int:
        """The last seq of ``stream`` (0 if none); see :class:`Store`."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            return self._version(stream)

    def streams(self) -> list[str]:
        """Sorted names of the streams that have events."""
        with self._lock:
            self._check_open()
            return self._stream_names()

    def save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        """Keep ``data`` (an encoded :mod:`~nous_inbox.snapshot`) as ``stream``'s snapshot at
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
        :func:`nous_inbox.snapshot.load_session` checks it before trusting it)."""
        check_stream(stream)
        with self._lock:
            self._check_open()
            return self._load_snapshot(stream)

    def own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s owner lease; see :class:`Store`."""
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
            raise _read_only_error(self.url)

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
            index = _first_unencodable(events)
            raise _refused(stream, index, events[index], exc) from None
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
            if bare and _reads_back(event):
                continue
            try:
                back = decode(stream, record)
            except (DecodeError, TypeError, ValueError, RecursionError) as exc:
                raise _refused(stream, i, event, exc) from None
            if back != event:
                raise ValueError(
                    f"append to {stream!r}: events[{i}] ({type(event).__name__}) would not read "
                    f"back equal (stored as {back!r}); nothing was written"
                )
        return records


def _reads_back(event: Event) -> bool:
    """Whether ``event`` decodes back equal from its bare encoding, judged by the exact type
    and range of every field: ``False`` means "decode it and see".

    The proof an append needs, made without decoding, for the two events every message makes
    (its send and its claim) when they hold only what a decoder gives back as it was given: a
    ``Target`` member, a ``bool``, an ``int`` count in range, an ``int`` seq, a finite ``float``
    time, and a message whose role is one of the four, whose content is ASCII text, whose
    blankness is what that text makes it, and which has no other field. These are the checks
    msgspec's decoder would make, made on the value; anything else (non-ASCII text, metadata, a
    value of a wrong type however it got there, a message altered past its own checks) is
    decoded and compared as before.
    """
    # (Read through ``Any``, not ``cast``: this runs for every send and claim, and a ``cast``
    # is a function call.)
    judged: Any = event
    kind = type(judged)
    seq = judged.seq
    at = judged.at
    if type(seq) is not int or type(at) is not float or not (
        0 <= seq <= _INT64_MAX and -_INF < at < _INF
    ):
        return False
    if kind is MessageSent:
        message = judged.message
        if type(message) is not Message or type(judged.target) is not Target or (
            type(judged.wakeup) is not bool
        ):
            return False
        role = message.role
        content = message.content
        calls = message.tool_calls
        return (
            type(role) is str and role in ROLES and type(content) is str and content.isascii()
            and message.name is None and message.tool_call_id is None and message.id is None
            and message.metadata is _NO_METADATA and type(calls) is tuple and not calls
            and message.blank is (not content or content.isspace())  # as decoding decides it
        )
    if kind is QueueClaimed:
        count = judged.count
        rest = judged.rest
        return (
            type(judged.target) is Target and type(count) is int and type(rest) is int
            and 0 <= count <= _INT64_MAX and 0 <= rest <= _INT64_MAX
        )
    return False


#: The fields :func:`_reads_back` judges, type by type. It proves only what it names: a field
#: added to one of these types later would pass unjudged, and an event holding a value that
#: does not read back would be acknowledged. So the module refuses to import until the proof is
#: revisited (a raise, not an ``assert``, which ``python -O`` would drop).
_PROVEN_FIELDS: Final[dict[type[msgspec.Struct], frozenset[str]]] = {
    MessageSent: frozenset({"seq", "at", "target", "wakeup", "message"}),
    QueueClaimed: frozenset({"seq", "at", "target", "count", "rest"}),
    Message: frozenset({"role", "content", "name", "tool_call_id", "id", "metadata",
                        "tool_calls", "blank"}),
}


def _check_proof(proven_fields: Mapping[type[msgspec.Struct], frozenset[str]]) -> None:
    """Raise ``ImportError`` if a judged type has a field the proof does not name (or names one
    it lacks). Called once below, at import; a test calls it with a proof that falls short."""
    for kind, proven in proven_fields.items():
        if frozenset(kind.__struct_fields__) != proven:
            raise ImportError(
                f"_reads_back judges {sorted(proven)} of {kind.__name__}, which has "
                f"{sorted(kind.__struct_fields__)}: extend the proof to every field"
            )


_check_proof(_PROVEN_FIELDS)


def _first_unencodable(events: list[Event]) -> int:
    for i, event in enumerate(events):
        try:
            JSON_LINES.encode(event)
            MSGPACK.encode(event)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return i
    return 0


def _refused(stream: str, index: int, event: Event, exc: BaseException) -> Exception:
    reason = "nested too deeply to encode or decode" if isinstance(exc, RecursionError) else str(exc)
    cls = TypeError if isinstance(exc, TypeError) else ValueError
    return cls(
        f"append to {stream!r}: events[{index}] ({type(event).__name__}) cannot be stored: "
        f"{reason}; nothing was written"
    )

