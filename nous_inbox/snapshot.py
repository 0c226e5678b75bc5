"""Snapshots: a session's value saved at a seq, so opening a long session replays only its tail.

A snapshot is derived data, never the truth: the log is. It is a cache of ``replay(events[:seq])``
kept beside the log, and opening a session with one is ``replay(events after seq, start=the
snapshot's value)``, which equals the full replay because replay is a fold. So a snapshot can
only make an open faster; whenever it cannot be trusted it is ignored (a warning on the
``nous_inbox.snapshot`` logger) and the session is replayed from its first event, as if there
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
*tip*, that is the type and time of the event at that seq, and a CRC-32 of the body), then the
body: the :class:`~nous_inbox.session.Session` (inbox, transcript, turn, step, running) as
MessagePack. A store keeps the newest one per stream
(``save_snapshot``/``load_snapshot`` on :class:`~nous_inbox.store.base.StoreBase`: a table row in
SQLite and PostgreSQL, a dict entry in ``memory:``, a private side file for ``file:``); a host's
own store without those methods simply has no snapshots.

When a snapshot is ignored. It does not decode, names another format or a version this library
does not read (older or newer), names another stream, fails its checksum, claims a seq beyond the
stream's version, its tip does not match the event the log holds at that seq (a log deleted
and started again under the same name, a snapshot copied from elsewhere), or the events after it
do not fold onto it. Each is one warning and a full replay; none fails the open.

Who saves, and when. A :class:`~nous_inbox.journal.Journal` (so an owner) saves one after
``snapshot_every`` events folded since the last one (:data:`SNAPSHOT_EVERY`, 10 000 by default;
0 turns saving off), or a tenth of the session (:data:`SNAPSHOT_SHARE`) when that is more, and
right after an open that had to replay that many. A save encodes the whole value (about 1.3 s
with the SQLite write at a million events on this machine), so the interval grows with the
session and the saving cost per event stays flat; an open then replays at most a tenth of the
session. Saving is skipped on a read-only store; a failed save is a warning, never a failed send.
``nous-inbox snapshot --store URL SESSION`` saves one on demand.

Design notes. The body's checksum catches a flipped bit that would still decode; the tip catches a
snapshot that decodes perfectly but belongs to another log. Both are cheap next to decoding the
transcript. The format version is checked before the body is decoded, so a newer library's
snapshot is never half-read; the version is bumped whenever the body's layout or a session's
meaning changes (a field added to ``Message`` with a default needs no bump: it decodes). The seq
is kept by the store beside the bytes too, so the tip is read from the log (one event) before
anything is decoded.
"""

from __future__ import annotations

import logging
import struct
import zlib
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
    "Opened",
    "SnapshotError",
    "SnapshotFile",
    "SnapshotStore",
    "decode_snapshot",
    "encode_snapshot",
    "load_session",
    "save_snapshot",
    "split_snapshot",
]

logger: Final = logging.getLogger("nous_inbox.snapshot")

SNAPSHOT_FORMAT: Final = "nous-inbox-snapshot"
#: The snapshot format this library writes and reads; any other is ignored (and replayed past).
SNAPSHOT_VERSION: Final = 1
#: Save a snapshot after this many events folded since the last one (0: never save).
SNAPSHOT_EVERY: Final = 10_000
#: ... or after the last snapshot's seq divided by this, when that is more: saving costs what the
#: session holds, so the interval grows with it and the cost per event stays flat.
SNAPSHOT_SHARE: Final = 10


@runtime_checkable
class SnapshotStore(Protocol):
    """The optional part of a store that keeps snapshots (every ``nous_inbox.store`` store).

    A host's own store without these methods still works everywhere: it just has no snapshots.
    """

    def save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        """Keep ``data`` as ``stream``'s snapshot at ``seq``; ``False`` when not kept."""

    def load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        """The newest snapshot kept for ``stream`` as ``(seq, data)``, or ``None``."""


class SnapshotFile(msgspec.Struct, frozen=True, kw_only=True):
    """The head of a stored snapshot: what it is, where it belongs, and its body's checksum.

    A snapshot's bytes are the head's length (4 bytes, big-endian), the head (MessagePack), then
    the body (MessagePack), so the body is checked and decoded in place, never copied.
    """

    format: str
    version: int
    stream: str = ""
    seq: int = 0
    tip_type: str = ""
    tip_at: float = 0.0
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


_encoder: Final = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_head: Final = msgspec.msgpack.Decoder(_Head)
_file: Final = msgspec.msgpack.Decoder(SnapshotFile)
_body: Final = msgspec.msgpack.Decoder(_Body)
_LENGTH: Final = struct.Struct(">I")


class SnapshotError(ValueError):
    """Why a snapshot was ignored (only ever logged: an open never fails because of one)."""


def _tip_type(event: Event) -> str:
    return type(event).__name__


def encode_snapshot(stream: str, session: Session, tip: Event) -> bytes:
    """``session`` as a snapshot of ``stream`` at ``session.version``; ``tip`` is the event there.

    >>> from nous_inbox.events import Warned
    >>> data = encode_snapshot("s", Session(version=1), Warned(seq=1, text="x", at=2.0))
    >>> decode_snapshot(data, "s", Warned(seq=1, text="x", at=2.0)) == Session(version=1)
    True
    """
    if tip.seq != session.version or session.version < 1:
        raise ValueError(
            f"snapshot of {stream!r}: the tip event has seq {tip.seq}, the session is at "
            f"version {session.version} (they must be equal and >= 1)"
        )
    body = _encoder.encode(_Body(
        session.inbox.to_msgpack(), session.transcript,  # type: ignore[arg-type]
        session.turn, session.step, session.running,
    ))
    head = _encoder.encode(SnapshotFile(
        format=SNAPSHOT_FORMAT, version=SNAPSHOT_VERSION, stream=stream, seq=session.version,
        tip_type=_tip_type(tip), tip_at=float(tip.at), crc=zlib.crc32(body),
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


def decode_snapshot(data: bytes, stream: str, tip: Event | None) -> Session:
    """The session a snapshot holds, after checking it belongs to ``stream`` and its log.

    ``tip`` is the event the log holds at the snapshot's seq (``None`` if it has none). Anything
    that does not fit is a :class:`SnapshotError` saying what.
    """
    snap, raw = split_snapshot(data)
    if snap.stream != stream:
        raise SnapshotError(f"it belongs to stream {snap.stream!r}")
    if tip is None or tip.seq != snap.seq:
        raise SnapshotError(f"it claims seq {snap.seq}, beyond the stream's log")
    if (_tip_type(tip), float(tip.at)) != (snap.tip_type, snap.tip_at):
        raise SnapshotError(
            f"it was taken of another log (its event {snap.seq} was a {snap.tip_type} at "
            f"{snap.tip_at!r}; the log's is a {_tip_type(tip)} at {tip.at!r})"
        )
    if zlib.crc32(raw) != snap.crc:
        raise SnapshotError("its body fails its checksum (damaged)")
    try:
        body = _body.decode(raw)
        inbox = Inbox.from_msgpack(body.inbox)
    except (msgspec.DecodeError, RecursionError, TypeError, ValueError) as exc:
        raise SnapshotError(f"its body does not decode ({exc})") from None
    if type(body.turn) is not int or type(body.step) is not int or body.turn < 0 or body.step < 0:
        raise SnapshotError(f"its turn/step ({body.turn}, {body.step}) are not counts")
    return Session(inbox, pvector(body.transcript), snap.seq, body.turn, body.step, body.running)


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
        events = iter(store.read(stream, seq - 1))
        tip = next(events, None)
        try:
            start = decode_snapshot(data, stream, tip)
            del found, data  # the encoded bytes are not kept while the tail replays
        except SnapshotError as exc:
            logger.warning("stream %r: snapshot at seq %d ignored, replaying from the start: %s",
                           stream, seq, exc)
        else:
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
    session = replay(store.read(stream), stream=stream)
    return Opened(session, 0, session.version)


def save_snapshot(store: Any, stream: str, session: Session) -> bool:
    """Save ``session`` as ``stream``'s snapshot in ``store``; whether it was kept.

    Not kept (``False``): a store without snapshots, a read-only one, an empty session. The
    event at ``session.version`` is read back from the store to record the snapshot's tip, so a
    session that is not ``store``'s (ahead of its log) is a ``ValueError``.
    """
    if session.version < 1 or not callable(getattr(store, "save_snapshot", None)):
        return False
    if getattr(store, "read_only", False):
        return False
    tip = next(iter(store.read(stream, session.version - 1)), None)
    if tip is None or tip.seq != session.version:
        raise ValueError(
            f"snapshot of {stream!r}: the session is at version {session.version}, beyond the "
            f"stream's log"
        )
    kept: bool = store.save_snapshot(stream, session.version, encode_snapshot(stream, session, tip))
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

