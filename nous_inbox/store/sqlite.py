"""SqliteStore (``sqlite:PATH``): the embedded default, many sessions in one file, many processes.

Standard library ``sqlite3`` in WAL mode: readers never block the writer, and writers in several
processes take turns (each waits up to ``busy_timeout`` seconds for another's transaction).
An event is one row, ``events(stream, seq, body)``, its body the event as MessagePack; a ``meta``
table records the format and schema version.

>>> import tempfile, os
>>> from nous_inbox.events import Warned
>>> path = os.path.join(tempfile.mkdtemp(), "inbox.sqlite")
>>> with SqliteStore(path) as store:
...     _ = store.append("s1", [Warned(text="a")], expected_version=0)
...     store.append("s1", [Warned(text="b")], expected_version=0)
Traceback (most recent call last):
...
nous_inbox.errors.ConcurrencyError: stream 's1': expected version 0 but it is at 1 (another writer appended first); nothing was written
>>> with SqliteStore(path) as store:
...     [(e.seq, e.text) for e in store.read("s1")]
[(1, 'a')]

An append is one ``BEGIN IMMEDIATE`` transaction: it reads the stream's version, checks the
expected one and inserts, so the check and the write cannot be split by another writer; the
primary key ``(stream, seq)`` guards the same thing a second time. ``synchronous=FULL``: an
append that returned survives a crash of the process and of the machine.

Design notes. One connection per store, shared by its threads behind a lock (the owner appends
from worker threads); ``read`` fetches a page of rows at a time, so no lock or cursor stays open
while the caller iterates. ``version`` is one index seek (``max(seq)``), and ``streams`` skips
from one stream name to the next through the same index rather than scanning every event. The
database and its ``-wal``/``-shm`` files are created mode 0600.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Final

import msgspec

from nous_inbox.codec import FORMAT_NAME, MAX_RECORD_SIZE
from nous_inbox.errors import ConcurrencyError, DecodeError, RecordTooLargeError
from nous_inbox.events import SCHEMA_VERSION, Event
from nous_inbox.message import enc_hook
from nous_inbox.store.base import (
    StoreLockedError,
    check_expected_version,
    check_stream,
    conflict,
    number_events,
)

__all__ = ["SqliteStore"]

_PAGE: Final = 512
_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS events ("
    " stream TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,"
    " PRIMARY KEY (stream, seq)) WITHOUT ROWID",
)
_STREAMS: Final = (
    "WITH RECURSIVE names(name) AS ("
    " SELECT min(stream) FROM events"
    " UNION ALL"
    " SELECT (SELECT min(stream) FROM events WHERE stream > names.name) FROM names"
    " WHERE names.name IS NOT NULL)"
    " SELECT name FROM names WHERE name IS NOT NULL"
)

_encoder: Final = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_decoder: Final = msgspec.msgpack.Decoder(Event)


class SqliteStore:
    """A :class:`~nous_inbox.store.base.Store` in one SQLite file (created mode 0600)."""

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 10.0,
        max_record_size: int = MAX_RECORD_SIZE,
    ) -> None:
        self.path = os.fspath(path)
        self.url = f"sqlite:{self.path}"
        self._timeout = busy_timeout
        self._max = max_record_size
        self._lock = threading.RLock()
        _create_private(self.path)
        self._db: sqlite3.Connection | None = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False,
        )
        try:
            self._setup(self._db)
        except BaseException:
            self._db.close()
            raise

    def _setup(self, db: sqlite3.Connection) -> None:
        db.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        try:
            mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise DecodeError(f"{self.url}: not a SQLite database ({exc})") from None
        if mode != "wal":
            raise DecodeError(f"{self.url}: cannot use WAL mode (got {mode!r})")
        db.execute("PRAGMA synchronous = FULL")
        with self._transaction(db):
            for statement in _SCHEMA:
                db.execute(statement)
            rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
            if not rows:
                db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("format", FORMAT_NAME), ("version", str(SCHEMA_VERSION))],
                )
                rows = {"format": FORMAT_NAME, "version": str(SCHEMA_VERSION)}
        self._check_meta(rows)

    def _check_meta(self, rows: dict[str, Any]) -> None:
        if rows.get("format") != FORMAT_NAME:
            raise DecodeError(
                f"{self.url}: not a nous-inbox store (meta format {rows.get('format')!r})"
            )
        try:
            version = int(rows.get("version", ""))
        except ValueError:
            raise DecodeError(
                f"{self.url}: invalid schema version {rows.get('version')!r}"
            ) from None
        if version > SCHEMA_VERSION:
            raise DecodeError(
                f"{self.url}: written with schema version {version}, newer than this nous-inbox "
                f"reads ({SCHEMA_VERSION}); upgrade nous-inbox to read it"
            )

    # -- the protocol ----------------------------------------------------------------------------

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
    ) -> list[Event]:
        """Append in one transaction; see :class:`~nous_inbox.store.base.Store`."""
        check_stream(stream)
        check_expected_version(expected_version)
        if not events:
            number_events(stream, events, 0)  # still refuse a non-sequence
            return []
        with self._lock:
            db = self._connection()
            try:
                with self._transaction(db):
                    version = self._version(db, stream)
                    if expected_version is not None and expected_version != version:
                        raise conflict(stream, expected_version, version)
                    stored = number_events(stream, events, version)
                    rows = [(stream, event.seq, self._encode(stream, event)) for event in stored]
                    db.executemany(
                        "INSERT INTO events (stream, seq, body) VALUES (?, ?, ?)", rows
                    )
            except sqlite3.IntegrityError:
                # Another writer took these sequence numbers first.
                actual = self._version(db, stream)
                raise ConcurrencyError(
                    f"stream {stream!r}: another writer appended concurrently (now at version "
                    f"{actual}); nothing was written"
                ) from None
            return stored

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        """The events of ``stream`` after seq ``after``, in order, a page at a time."""
        check_stream(stream)
        self._connection()  # fail now, not at the first next(), if closed
        return self._read(stream, max(after, 0))

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        decode = _decoder.decode
        while True:
            with self._lock:
                rows = self._connection().execute(
                    "SELECT seq, body FROM events WHERE stream = ? AND seq > ? "
                    "ORDER BY seq LIMIT ?", (stream, after, _PAGE),
                ).fetchall()
            for seq, body in rows:
                where = f"{self.url} stream {stream!r} seq {seq}"
                if len(body) > self._max:
                    raise RecordTooLargeError(
                        f"{where}: record of {len(body)} bytes is above the limit of "
                        f"{self._max} bytes"
                    )
                try:
                    event: Event = decode(body)
                except (msgspec.DecodeError, RecursionError) as exc:
                    raise DecodeError(f"{where}: {exc}") from None
                if event.seq != seq:
                    raise DecodeError(f"{where}: the stored event says seq {event.seq}")
                yield event
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def version(self, stream: str) -> int:
        """The last seq of ``stream`` (0 if none): one index seek."""
        check_stream(stream)
        with self._lock:
            return self._version(self._connection(), stream)

    def streams(self) -> list[str]:
        """Sorted names of the streams that have events."""
        with self._lock:
            return [name for (name,) in self._connection().execute(_STREAMS)]

    def close(self) -> None:
        """Close the connection; later calls raise ``ValueError``."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    # -- internals -------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise ValueError(f"{self.url} store is closed")
        return self._db

    @staticmethod
    def _version(db: sqlite3.Connection, stream: str) -> int:
        row = db.execute("SELECT max(seq) FROM events WHERE stream = ?", (stream,)).fetchone()
        return int(row[0] or 0)

    def _encode(self, stream: str, event: Event) -> bytes:
        body = _encoder.encode(event)
        if len(body) > self._max:
            raise RecordTooLargeError(
                f"{self.url}: an event of stream {stream!r} encodes to {len(body)} bytes, "
                f"above the limit of {self._max} bytes; nothing was written"
            )
        return body

    def _transaction(self, db: sqlite3.Connection) -> _Transaction:
        return _Transaction(db, self.url, self._timeout)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error; a lock timeout made clear."""

    def __init__(self, db: sqlite3.Connection, url: str, timeout: float) -> None:
        self._db, self._url, self._timeout = db, url, timeout

    def __enter__(self) -> None:
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreLockedError(
                    f"{self._url}: another writer held the database for more than "
                    f"{self._timeout:g}s; nothing was written"
                ) from None
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if kind is None:
            try:
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        elif self._db.in_transaction:
            self._db.execute("ROLLBACK")


def _create_private(path: str) -> None:
    # Create the database file ourselves, mode 0600, rather than let SQLite create it with the
    # umask's mode. SQLite gives the -wal and -shm files the database file's permissions (it
    # fchmods them to match), so no process-wide umask change is needed.
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
