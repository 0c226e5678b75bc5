"""Snapshots: a session's value saved at a seq, so opening a long session replays only its tail.

A snapshot is derived data, never the truth: the log is. It is a cache of ``replay(events[:seq])``
kept beside the log, and opening a session with one is ``replay(events after seq, start=the
snapshot's value)``, which equals the full replay because replay is a fold. So a snapshot can
only make an open faster; whenever it cannot be trusted it is ignored (a warning on the
``nous_inbox.store.snapshot`` logger) and the session is replayed from its first event, as if there
were none. Nothing acknowledged ever depends on a snapshot.

>>> from nous_inbox.events import MessageSent
>>> from nous_inbox.message import Message
>>> from nous_inbox.store import open_store
>>> store = open_store("memory:")
>>> _ = store.append("s", [MessageSent(target="next_turn", wakeup=False,
...                                    message=Message.user(str(i))) for i in range(5)])
>>> save_snapshot(store, "s", replay(store.read("s")))
True
>>> _ = store.append("s", [MessageSent(target="next_turn", wakeup=False, message=Message.user("5"))])
>>> opened = load_session(store, "s")
>>> opened.replayed, opened.snapshot, opened.session == replay(store.read("s"))
(1, 5, True)

What a snapshot holds: a head (:class:`SnapshotFile`: a format name and version,
``nous-inbox-snapshot`` and :data:`SNAPSHOT_VERSION`, the stream, the seq it was taken at, the
*tip*, a digest of the content of the log's last events up to that seq (:data:`TIP_EVENTS` of
them, each whole: type, time and every field), and a CRC-32 of the body), then the body: the
:class:`~nous_inbox.session.Session` (inbox, transcript, turn, step, running) as MessagePack.
A store keeps one per stream (see "which snapshot a store keeps" below)
(``save_snapshot``/``load_snapshot`` on :class:`~nous_inbox.store.base.StoreBase`: a table row in
SQLite and PostgreSQL, a dict entry in ``memory:``, a private side file for ``file:``); a host's
own store without those methods simply has no snapshots.

When a snapshot is ignored. It does not decode, names another format or a version this library
does not read (older or newer), names another stream, fails its checksum, claims a seq beyond the
stream's version, its tip does not match the events the log holds up to that seq (a log deleted
and started again under the same name, a snapshot copied from elsewhere), or the events after it
do not fold onto it. Each is one warning and a full replay; none fails the open.

What "equal to the full replay" rests on. The tip binds a snapshot to its log by content, not
by time: a host's clock may repeat (``Journal(clock=...)``: a fixed or coarse clock in tests,
simulations and replays), so two logs' events at a seq can share their type and time, but
rarely their whole content over the last :data:`TIP_EVENTS` events. Two logs that agree there
and differ only before could still share a snapshot; the tip is a cache key, not a proof, and a
proof would cost the read the snapshot exists to avoid. And the open reads the log only from
the snapshot's seq on, so damage in the log before it (a record that would make the full replay
raise) goes unnoticed while the snapshot is good: the open equals the full replay whenever the
log reads.

Who saves, and when. A :class:`~nous_inbox.store.journal.Journal` (so an owner) saves one after
``snapshot_every`` events folded since the last one (:data:`SNAPSHOT_EVERY`, 10 000 by default;
0 turns saving off), or a tenth of the session (:data:`SNAPSHOT_SHARE`) when that is more, and
right after an open that had to replay that many. A save encodes the whole value (about 1.3 s
with the SQLite write at a million events on this machine), so the interval grows with the
session and the saving cost per event stays flat; an open then replays at most a tenth of the
session. Saving is skipped on a read-only store; a failed save is a warning, never a failed send.
``nous-inbox snapshot --store URL SESSION`` saves one on demand.

The save runs inside the send (the journal's commit) that reaches the save point, under the
owner's lock: that one send per interval pays for it (``bench/snapshot_bench.py`` times it).
It is not handed to a background thread, though the value is immutable: encoding holds the
interpreter lock throughout (msgspec does not release it, so a thread encoding would stall
the sending thread for most of the save), and the write holds the store's lock, which the
next append needs, so the same sends would wait, only later and less predictably.

Which snapshot a store keeps. One per stream, replaced by each save unless the one kept is
newer and of this same log (its tip checks out against the log): one beyond the stream's
version, or of another log, can never be used and is always replaced, so it never blocks the
log's own saves. ``save_snapshot`` answers ``False`` when it wrote nothing.

Design notes. The body's checksum catches a flipped bit that would still decode; the tip catches a
snapshot that decodes perfectly but belongs to another log (version 1 compared the tip's type
and time only, which a repeating clock fooled; its snapshots are ignored, and replaced by the
next save). Both are cheap next to decoding the
transcript. The format version is checked before the body is decoded, so a newer library's
snapshot is never half-read; the version is bumped whenever the body's layout or a session's
meaning changes (a field added to ``Message`` with a default needs no bump: it decodes). The seq
is kept by the store beside the bytes too, so the tip is read from the log (a few events) before
anything is decoded.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, Protocol, runtime_checkable

import attrs
import msgspec
from pyrsistent import pvector

from nous_inbox.errors import ReplayError
from nous_inbox.events import Event
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message, enc_hook
from nous_inbox.session import Session, replay

__all__ = [
    "SNAPSHOT_EVERY",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_SHARE",
    "SNAPSHOT_VERSION",
    "TIP_EVENTS",
    "Opened",
    "SnapshotError",
    "SnapshotFile",
    "SnapshotStore",
    "check_snapshot",
    "check_snapshot_every",
    "decode_snapshot",
    "encode_snapshot",
    "load_session",
    "save_snapshot",
    "split_snapshot",
    "tip_after",
]

logger: Final = logging.getLogger("nous_inbox.store.snapshot")

SNAPSHOT_FORMAT: Final = "nous-inbox-snapshot"
#: The snapshot format this library writes and reads; any other is ignored (and replayed past).
#: 3: each queued entry keeps the seq of its send (what a withdraw names it by).
SNAPSHOT_VERSION: Final = 3
#: How many of the log's last events up to a snapshot's seq its tip digests (all, when fewer).
TIP_EVENTS: Final = 16
#: Save a snapshot after this many events folded since the last one (0: never save).
SNAPSHOT_EVERY: Final = 10_000
#: ... or after the last snapshot's seq divided by this, when that is more: saving costs what the
#: session holds, so the interval grows with it and the cost per event stays flat.
SNAPSHOT_SHARE: Final = 10


def check_snapshot_every(value: object, who: str) -> int:
    """``value`` if it is a valid ``snapshot_every`` (an int >= 0), else a ``ValueError`` naming
    ``who``'s option: the one check for the journal and both owners.

    >>> check_snapshot_every(-1, "Owner")
    Traceback (most recent call last):
    ...
    ValueError: Owner: snapshot_every must be an int >= 0 (0: never), got -1
    """
    if type(value) is not int or value < 0:
        raise ValueError(f"{who}: snapshot_every must be an int >= 0 (0: never), got {value!r}")
    return value


@runtime_checkable
class SnapshotStore(Protocol):
    """The optional part of a store that keeps snapshots (every ``nous_inbox.store`` store).

    A host's own store without these methods still works everywhere: it just has no snapshots.
    """

    def save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        """Keep ``data`` as ``stream``'s snapshot at ``seq``; ``False`` when not kept."""

    def load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """The snapshot kept for ``stream`` as ``(seq, data)``, or ``None``."""


class SnapshotFile(msgspec.Struct, frozen=True, kw_only=True):
    """The head of a stored snapshot: what it is, where it belongs, and its body's checksum.

    A snapshot's bytes are the head's length (4 bytes, big-endian), the head (MessagePack), then
    the body (MessagePack), so the body is checked and decoded in place, never copied.
    """

    format: str
    version: int
    stream: str = ""
    seq: int = 0
    tip: bytes = b""
    crc: int = 0


class _Head(msgspec.Struct, frozen=True):
    """The envelope's first two fields, decoded alone so a newer format is never half-read."""

    format: str
    version: int


class _Body(msgspec.Struct, frozen=True, array_like=True):
    inbox: bytes
    transcript: list[Message]
    turn: int
    step: int
    running: bool
    cancelling: bool = False  # later than the rest: an older snapshot decodes without it


_encoder: Final = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_head: Final = msgspec.msgpack.Decoder(_Head)
_file: Final = msgspec.msgpack.Decoder(SnapshotFile)
_body: Final = msgspec.msgpack.Decoder(_Body)
_LENGTH: Final = struct.Struct(">I")


class SnapshotError(ValueError):
    """Why a snapshot was ignored (only ever logged: an open never fails because of one)."""


def _tip_first(seq: int) -> int:
    """The seq of the first event a snapshot at ``seq`` digests."""
    return max(1, seq - TIP_EVENTS + 1)


def tip_after(seq: int) -> int:
    """Where to read a log (``store.read(stream, tip_after(seq))``) for the events a snapshot
    at ``seq`` digests as its tip: they are the first ones read, up to ``seq``.

    >>> tip_after(100), tip_after(3)
    (84, 0)
    """
    return _tip_first(seq) - 1


def _digest(events: Iterable[Event]) -> bytes:
    # An event's MessagePack is a function of its value (fields in declaration order, maps in
    # the order the store gives them back), so equal events digest alike at save and at load.
    digest = hashlib.blake2b(digest_size=16)
    for event in events:
        encoded = _encoder.encode(event)
        digest.update(_LENGTH.pack(len(encoded)))
        digest.update(encoded)
    return digest.digest()


def _tip(events: Event | Sequence[Event], seq: int) -> bytes | None:
    """The digest of the log's events up to ``seq`` as a tip, or ``None`` when ``events`` are
    not exactly the ones it covers (:func:`_tip_first` to ``seq``, in order)."""
    window = [events] if isinstance(events, Event) else list(events)
    if [event.seq for event in window] != list(range(_tip_first(seq), seq + 1)):
        return None
    return _digest(window)


def encode_snapshot(stream: str, session: Session, tip: Event | Sequence[Event]) -> bytes:
    """``session`` as a snapshot of ``stream`` at ``session.version``; ``tip`` is the log's last
    events up to there, the ones numbered from ``version - TIP_EVENTS + 1`` (or 1) to
    ``version`` (one event, for a session at version 1).

    >>> from nous_inbox.events import Warned
    >>> data = encode_snapshot("s", Session(version=1), Warned(seq=1, text="x", at=2.0))
    >>> decode_snapshot(data, "s", Warned(seq=1, text="x", at=2.0)) == Session(version=1)
    True
    >>> decode_snapshot(data, "s", Warned(seq=1, text="y", at=2.0))
    Traceback (most recent call last):
    ...
    nous_inbox.store.snapshot.SnapshotError: it was taken of another log (its events up to seq 1 are not the log's)
    """
    digest = _tip(tip, session.version) if session.version >= 1 else None
    if digest is None:
        seqs = [tip.seq] if isinstance(tip, Event) else [event.seq for event in tip]
        raise ValueError(
            f"snapshot of {stream!r}: the tip events have seqs {seqs}, the session is at "
            f"version {session.version}: they must run from {_tip_first(session.version)} to "
            f"the version, which must be >= 1"
        )
    body = _encoder.encode(_Body(
        session.inbox.to_msgpack(), session.transcript,  # type: ignore[arg-type]
        session.turn, session.step, session.running, session.cancelling,
    ))
    head = _encoder.encode(SnapshotFile(
        format=SNAPSHOT_FORMAT, version=SNAPSHOT_VERSION, stream=stream, seq=session.version,
        tip=digest, crc=zlib.crc32(body),
    ))
    return b"".join([_LENGTH.pack(len(head)), head, body])


def split_snapshot(data: bytes) -> tuple[SnapshotFile, memoryview]:
    """A snapshot's head, decoded and checked to be a format this library reads, and its body
    (undecoded, a view into ``data``); :class:`SnapshotError` otherwise."""
    view = memoryview(data)
    if len(view) < _LENGTH.size:
        raise SnapshotError("it does not decode (cut short)")
    (length,) = _LENGTH.unpack_from(view)
    end = _LENGTH.size + length
    if end > len(view):
        raise SnapshotError("it does not decode (cut short)")
    try:
        head = _head.decode(view[_LENGTH.size:end])
    except (msgspec.DecodeError, RecursionError) as exc:
        raise SnapshotError(f"it does not decode ({exc})") from None
    if head.format != SNAPSHOT_FORMAT:
        raise SnapshotError(f"it is not a snapshot (format {head.format!r})")
    if head.version != SNAPSHOT_VERSION:
        age = "newer" if head.version > SNAPSHOT_VERSION else "older"
        raise SnapshotError(
            f"it is snapshot format version {head.version}, {age} than the {SNAPSHOT_VERSION} "
            f"this library reads"
        )
    try:
        snap = _file.decode(view[_LENGTH.size:end])
    except (msgspec.DecodeError, RecursionError) as exc:
        raise SnapshotError(f"it does not decode ({exc})") from None
    return snap, view[end:]


def check_snapshot(snap: SnapshotFile, stream: str, tip: Event | Sequence[Event] | None) -> None:
    """Refuse (:class:`SnapshotError`) a snapshot head that is not of ``stream``'s log.

    ``tip`` is what the log holds up to the snapshot's seq: its events from
    ``seq - TIP_EVENTS + 1`` (or 1) on, as :func:`encode_snapshot` takes them, fewer when the
    log is shorter (``None`` or empty: it has none there).
    """
    if snap.stream != stream:
        raise SnapshotError(f"it belongs to stream {snap.stream!r}")
    window = [] if tip is None else [tip] if isinstance(tip, Event) else list(tip)
    if not window or window[-1].seq != snap.seq:
        raise SnapshotError(f"it claims seq {snap.seq}, beyond the stream's log")
    if _tip(window, snap.seq) != snap.tip:
        raise SnapshotError(
            f"it was taken of another log (its events up to seq {snap.seq} are not the log's)"
        )


def decode_snapshot(data: bytes, stream: str, tip: Event | Sequence[Event] | None) -> Session:
    """The session a snapshot holds, after checking it belongs to ``stream`` and its log.

    ``tip`` is what the log holds up to the snapshot's seq (see :func:`check_snapshot`).
    Anything that does not fit is a :class:`SnapshotError` saying what.
    """
    snap, raw = split_snapshot(data)
    check_snapshot(snap, stream, tip)
    if zlib.crc32(raw) != snap.crc:
        raise SnapshotError("its body fails its checksum (damaged)")
    try:
        body = _body.decode(raw)
        inbox = Inbox.from_msgpack(body.inbox)
    except (msgspec.DecodeError, RecursionError, TypeError, ValueError) as exc:
        raise SnapshotError(f"its body does not decode ({exc})") from None
    if type(body.turn) is not int or type(body.step) is not int or body.turn < 0 or body.step < 0:
        raise SnapshotError(f"its turn/step ({body.turn}, {body.step}) are not counts")
    return Session(inbox, pvector(body.transcript), snap.seq, body.turn, body.step, body.running,
                   body.cancelling)


@attrs.frozen
class Opened:
    """What :func:`load_session` found: the session, the snapshot seq it started from (0 for
    none) and how many events it replayed on top."""

    session: Session
    snapshot: int
    replayed: int


def load_session(store: Any, stream: str) -> Opened:
    """``stream``'s session from ``store``: from its newest usable snapshot, else from the start.

    Equal to ``replay(store.read(stream))`` whatever the snapshot holds (checked in
    ``tests/test_snapshot.py``); a snapshot that cannot be trusted is ignored with a warning.
    A store without ``load_snapshot`` is replayed from the start.
    """
    found = _load(store, stream)
    if found is not None:
        seq, data = found
        events = iter(store.read(stream, tip_after(seq)))
        window = _take(events, seq)
        try:
            start = decode_snapshot(data, stream, window)
        except SnapshotError as exc:
            logger.warning("stream %r: snapshot at seq %d ignored, replaying from the start: %s",
                           stream, seq, exc)
        else:
            del found, data, window  # the encoded bytes are not kept while the tail replays
            try:
                session = replay(events, start=start, stream=stream)
            except ReplayError as exc:
                # The snapshot disagrees with the log after it: the log wins.
                logger.warning("stream %r: snapshot at seq %d ignored, replaying from the "
                               "start: the events after it do not fold onto it (%s)",
                               stream, seq, exc)
            else:
                # replay checked the seqs run on from the snapshot's: the count is the difference
                return Opened(session, seq, session.version - seq)
        # Nothing of the discarded snapshot stays alive through the full replay: the fallback is
        # already the slow case, and would otherwise hold two sessions at its peak.
        found = data = window = start = events = None  # type: ignore[assignment]
    session = replay(store.read(stream), stream=stream)
    return Opened(session, 0, session.version)


def _take(events: Iterator[Event], seq: int) -> list[Event]:
    """The events from ``events`` up to ``seq`` (the tip's window); the rest stay in ``events``."""
    window: list[Event] = []
    for event in events:
        window.append(event)
        if event.seq >= seq:
            break
    return window


def save_snapshot(store: Any, stream: str, session: Session) -> bool:
    """Save ``session`` as ``stream``'s snapshot in ``store``; whether it was kept.

    Not kept (``False``): a store without snapshots, a read-only one, an empty session, or a
    store that keeps a newer snapshot of this log. The last events up to ``session.version``
    are read back from the store to record the snapshot's tip, so a session that is not
    ``store``'s (ahead of its log) is a ``ValueError``.
    """
    if session.version < 1 or not callable(getattr(store, "save_snapshot", None)):
        return False
    if getattr(store, "read_only", False):
        return False
    window = _take(iter(store.read(stream, tip_after(session.version))), session.version)
    if not window or window[-1].seq != session.version:
        raise ValueError(
            f"snapshot of {stream!r}: the session is at version {session.version}, beyond the "
            f"stream's log"
        )
    kept: bool = store.save_snapshot(stream, session.version,
                                     encode_snapshot(stream, session, window))
    return kept


def _load(store: Any, stream: str) -> tuple[int, bytes] | None:
    load = getattr(store, "load_snapshot", None)
    if not callable(load):
        return None
    try:
        found = load(stream)
    except Exception as exc:  # a snapshot is a cache: a store that cannot give one has none
        logger.warning("stream %r: no snapshot loaded, replaying from the start: %s", stream, exc)
        return None
    if found is None:
        return None
    seq, data = found
    if type(seq) is not int or seq < 1 or not isinstance(data, bytes):
        logger.warning("stream %r: the store's snapshot record is malformed; replaying from the "
                       "start", stream)
        return None
    return seq, data

