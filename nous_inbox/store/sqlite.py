"""SqliteStore (``sqlite:PATH``): the embedded default, many sessions in one file, many processes.

Standard library ``sqlite3`` in WAL mode: readers never block the writer, and writers in several
processes take turns (each waits up to ``busy_timeout`` seconds for another's transaction).
An event is one row, ``events(stream, seq, body)``, its body the event as MessagePack; a ``meta``
table records the format and schema version. A ``snapshots`` table (made with the first one)
keeps each stream's newest snapshot (:mod:`nous_inbox.store.snapshot`), a cache beside the log.

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
append that returned survives a crash of the process and of the machine. A delete is one such
transaction too: the stream's rows and its snapshot go together.

Design notes. One connection per store, shared by its threads behind a lock (the owner appends
from worker threads); ``read`` fetches a page of rows at a time, so no lock or cursor stays open
while the caller iterates. ``version`` is one index seek (``max(seq)``), and ``streams`` skips
from one stream name to the next through the same index rather than scanning every event. The
database and its ``-wal``/``-shm`` files are created mode 0600.

Errors. No ``sqlite3`` exception escapes: a path that is a directory or not a database, a database
holding someone else's tables, a failure while reading or writing, each is a
:class:`~nous_inbox.errors.StoreError` (an ``OSError``) naming the database and what failed. On
open, the ``meta`` table must say this is a nous-inbox store and the ``events`` table must have
its columns; a database with other tables and no ``meta`` is refused, never written to.

Read-only. ``SqliteStore(path, read_only=True)`` opens with ``mode=ro``: the file must exist (else
``StoreError``), no schema is created, and ``append``/``own`` raise ``ValueError``. SQLite may
still create its ``-wal``/``-shm`` companions (mode 0600) to read a WAL database no writer has
open: a reader needs them. Where it cannot (read-only media) and no writer is at work, the file
is opened ``immutable=1`` instead. An empty database file reads as an empty store. Files another
user made or may write to are refused; see :mod:`nous_inbox.store._safety`.

Owners. ``own(stream)`` locks ``PATH.owners/<hash>.lock`` next to the database's real path; see
:mod:`nous_inbox.store.lease`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any, Final

from nous_inbox.codec import DECODE_ERRORS, FORMAT_NAME, MAX_RECORD_SIZE, MSGPACK, Header
from nous_inbox.errors import ConcurrencyError, DecodeError, StoreError
from nous_inbox.events import SCHEMA_VERSION, Event
from nous_inbox.store._safety import check_store_file, read_only_sqlite_uri
from nous_inbox.store.base import (
    Moved,
    StoreBase,
    check_max_record_size,
    check_stream,
)
from nous_inbox.store.lease import Leases
from nous_inbox.store.sqlite_transaction import ROWS, Transaction, create_private, insert_statement

__all__ = ["SqliteStore"]

_PAGE: Final = 512
_BYTES: Final = frozenset({bytes})
_COMPANIONS: Final = ("-wal", "-shm")
_SCHEMA: Final = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE events ("
    " stream TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,"
    " PRIMARY KEY (stream, seq)) WITHOUT ROWID",
)
_SNAPSHOTS: Final = (
    "CREATE TABLE IF NOT EXISTS snapshots ("
    " stream TEXT PRIMARY KEY, seq INTEGER NOT NULL, body BLOB NOT NULL)"
)
# The moves: a row per event appended (by a trigger, so it costs no statement of ours and any
# writer keeps it) and one per delete, numbered in commit order (a write holds the lock from its
# BEGIN): what Store.moved reads, a range of row ids, not every stream. A row goes at the end of
# its table's tree, so an append writes one page more; past _MOVES_KEPT the oldest are let go
# (a cursor older than what is kept gets a full look). A store made before it gains them on its
# next writable open; until then every look is a full one.
_MOVES_KEPT: Final = 65536
_MOVES: Final = (
    "CREATE TABLE IF NOT EXISTS moves (pos INTEGER PRIMARY KEY, stream TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS moves_append AFTER INSERT ON events"
    " BEGIN INSERT INTO moves (stream) VALUES (NEW.stream); END",
    f"CREATE TRIGGER IF NOT EXISTS moves_kept AFTER INSERT ON moves"
    f" WHEN NEW.pos % {_MOVES_KEPT // 16} = 0"
    f" BEGIN DELETE FROM moves WHERE pos <= NEW.pos - {_MOVES_KEPT}; END",
)
_COLUMNS: Final = {"meta": ("key", "value"), "events": ("stream", "seq", "body")}
_TABLES: Final = (
    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
)
_STREAMS: Final = (
    "WITH RECURSIVE names(name) AS ("
    " SELECT min(stream) FROM events"
    " UNION ALL"
    " SELECT (SELECT min(stream) FROM events WHERE stream > names.name) FROM names"
    " WHERE names.name IS NOT NULL)"
    " SELECT name FROM names WHERE name IS NOT NULL"
)



#: The size (bytes) the -wal file is cut back to after a checkpoint that emptied it.
_WAL_LIMIT: Final = 4 * 1024 * 1024


class SqliteStore(StoreBase):
    """A :class:`~nous_inbox.store.base.Store` in one SQLite file (created mode 0600).

    ``read_only=True`` opens an existing database without writing to it. ``busy_timeout``
    bounds the wait for another writer's transaction; ``max_record_size`` bounds one event.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, read_only: bool = False,
        busy_timeout: float = 10.0, max_record_size: int = MAX_RECORD_SIZE,
    ) -> None:
        self.path = os.fspath(path)
        self.url = f"sqlite:{self.path}"
        self.read_only = read_only
        self._timeout = busy_timeout
        self.max_record_size = check_max_record_size(self.url, max_record_size)
        self._format = MSGPACK
        self._lock = threading.RLock()
        self._ready = False  # the schema is there (a read-only store may find an empty file)
        self._moves = False  # the moves table is there (a read-only store of an old file: not)
        self._db: sqlite3.Connection | None = self._connect()
        try:
            with self._unusable():
                self._setup(self._db)
        except BaseException:
            self._db.close()
            raise
        self._leases = Leases(self.url, os.path.realpath(self.path) + ".owners")

    def _connect(self) -> sqlite3.Connection:
        if os.path.isdir(self.path):
            raise StoreError(f"{self.url} is not a usable SQLite store: it is a directory")
        try:
            check_store_file(self.url, self.path, read_only=self.read_only, companions=_COMPANIONS)
            if self.read_only:
                if not os.path.exists(self.path):
                    raise StoreError(
                        f"{self.url}: no store at {self.path} (opened read-only, so nothing was "
                        f"created)"
                    )
                return sqlite3.connect(
                    read_only_sqlite_uri(self.path), uri=True, timeout=self._timeout,
                    isolation_level=None, check_same_thread=False,
                )
            create_private(self.path)
            return sqlite3.connect(
                self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False,
            )
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            raise self._unusable_error(exc) from exc

    def _unusable_error(self, exc: BaseException) -> StoreError:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return StoreError(f"{self.url} is not a usable SQLite store: {detail}")

    @contextlib.contextmanager
    def _unusable(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise self._unusable_error(exc) from exc
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{self.url}: a name in the database is not UTF-8: {exc}") from exc

    def _setup(self, db: sqlite3.Connection) -> None:
        db.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        # Look before writing anything, even the journal mode, so someone else's database is
        # refused untouched.
        self._ready = self._check_schema(db)
        if self.read_only:
            return
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(f"{self.url} is not a usable SQLite store: cannot use WAL mode "
                             f"(got {mode!r})")
        db.execute("PRAGMA synchronous = FULL")
        # A snapshot save writes its whole blob through the WAL; without a limit the -wal file
        # stays that large (a second copy of the largest snapshot) for as long as it is open.
        # With one, SQLite truncates it back when a checkpoint lets it start over.
        db.execute(f"PRAGMA journal_size_limit = {_WAL_LIMIT}")
        with self._transaction(db):
            if not self._check_schema(db):
                for statement in _SCHEMA:
                    db.execute(statement)
                db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("format", FORMAT_NAME), ("version", str(SCHEMA_VERSION))],
                )
            for statement in _MOVES:
                db.execute(statement)
        self._ready = self._moves = True

    def _check_schema(self, db: sqlite3.Connection) -> bool:
        """Check the tables are ours; ``False`` for a database with no tables at all."""
        tables = {name for (name,) in db.execute(_TABLES)}
        if "meta" not in tables:
            if tables:
                raise StoreError(
                    f"{self.url} is not a usable SQLite store: it holds other tables "
                    f"({', '.join(sorted(tables))}) and no nous-inbox meta table"
                )
            return False
        self._check_columns(db, "meta")
        self._check_meta(dict(db.execute("SELECT key, value FROM meta").fetchall()))
        if "events" not in tables:
            raise StoreError(
                f"{self.url} is not a usable SQLite store: it has a nous-inbox meta table "
                f"but no events table"
            )
        self._check_columns(db, "events")
        return True

    def _check_columns(self, db: sqlite3.Connection, table: str) -> None:
        have = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        missing = [name for name in _COLUMNS[table] if name not in have]
        if missing:
            raise StoreError(
                f"{self.url} is not a usable SQLite store: its {table} table has columns "
                f"({', '.join(have)}), not ({', '.join(_COLUMNS[table])})"
            )

    def _check_meta(self, rows: dict[Any, Any]) -> None:
        if rows.get("format") != FORMAT_NAME:
            raise StoreError(
                f"{self.url} is not a usable SQLite store: not a nous-inbox store "
                f"(meta format {rows.get('format')!r})"
            )
        try:
            version = int(rows.get("version", ""))
        except (TypeError, ValueError):
            raise DecodeError(
                f"{self.url}: invalid schema version {rows.get('version')!r}"
            ) from None
        Header(format=FORMAT_NAME, version=version).check(self.url)

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"SqliteStore({self.path!r}{mode})"

    # -- the hooks (called with the lock held) ---------------------------------------------------

    def _check_open(self) -> None:
        self._connection()

    @contextlib.contextmanager
    def _appending(self, stream: str) -> Iterator[int]:
        with self._failing(f"append to stream {stream!r}"):
            db = self._connection()
            try:
                with self._transaction(db):
                    yield self._last_seq(db, stream)
            except sqlite3.IntegrityError:
                # Another writer took these sequence numbers first.
                actual = self._last_seq(db, stream)
                raise ConcurrencyError(
                    f"stream {stream!r}: another writer appended concurrently (now at version "
                    f"{actual}); nothing was written"
                ) from None

    def _write(self, stream: str, events: list[Event], records: list[bytes], *,
               batch: object | None = None) -> None:
        # One statement per chunk of rows, not one step per row: a group commit's batch is
        # inserted in one go. Chunks stay far below SQLite's oldest limit on variables (999),
        # and their few shapes stay in the connection's statement cache.
        db = self._connection()
        for start in range(0, len(events), ROWS):
            chunk = events[start:start + ROWS]
            params: list[object] = []
            for event, body in zip(chunk, records[start:start + ROWS], strict=True):
                params += (stream, event.seq, body)
            db.execute(insert_statement(len(chunk)), params)

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        return self._pages(stream, after)

    def _pages(self, stream: str, after: int) -> Iterator[Event]:
        # A page of rows at a time, the lock taken per page: nothing stays locked or open while
        # the caller iterates. A page's bodies are decoded in one batch (msgspec's own loop);
        # a row is named, and walked to, only when something is wrong with one.
        decoder = self._format.decoder(Event)
        limit = self.max_record_size
        while True:
            with self._lock, self._failing(f"read of stream {stream!r}"):
                db = self._connection()
                if not self._has_events(db):
                    return
                rows = db.execute(
                    "SELECT seq, body FROM events WHERE stream = ? AND seq > ? "
                    "ORDER BY seq LIMIT ?", (stream, after, _PAGE),
                ).fetchall()
            seqs = [seq for seq, _ in rows]
            bodies = [body for _, body in rows]
            try:
                if not _BYTES.issuperset(map(type, bodies)) or (
                    bodies and max(map(len, bodies)) > limit
                ):
                    raise _Slow
                events: list[Event] = list(map(decoder.decode, bodies))
            except (_Slow, *DECODE_ERRORS):
                events = self._walk(stream, rows)
            if [event.seq for event in events] != seqs:
                self._walk(stream, rows)  # names the row
            yield from events
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def _walk(self, stream: str, rows: list[tuple[Any, Any]]) -> list[Event]:
        """Decode and check ``rows`` one by one, to name the first that is not the stored event
        its seq says (the label of a row is built here, only once something is wrong)."""
        decode = self._format.decode
        events: list[Event] = []
        for seq, body in rows:
            where = f"{self.url} stream {stream!r} seq {seq}"
            if type(body) is not bytes:
                raise DecodeError(f"{where}: the stored body is {type(body).__name__}, not bytes")
            event: Event = decode(body, Event, where, self.max_record_size)
            if event.seq != seq:
                raise DecodeError(f"{where}: the stored event says seq {event.seq}")
            events.append(event)
        return events

    def _version(self, stream: str) -> int:
        with self._failing(f"version of stream {stream!r}"):
            db = self._connection()
            return self._last_seq(db, stream) if self._has_events(db) else 0

    def _stream_names(self) -> list[str]:
        with self._failing("listing the streams"):
            db = self._connection()
            names = [name for (name,) in db.execute(_STREAMS)] if self._has_events(db) else []
        for name in names:  # the file store checks names as it reads them; so does this one
            try:
                check_stream(name)
            except ValueError as exc:
                raise DecodeError(f"{self.url}: a stored stream has an invalid name: {exc}") from None
        return names

    def _moved(self, since: object) -> Moved:
        if since is not None and (type(since) is not int or since < 0):
            raise ValueError(f"moved: {since!r} is not a cursor this store gave")
        with self._failing("listing the streams that moved"):
            db = self._connection()
            if not self._has_events(db) or not self._has_moves(db):
                return Moved(self._stream_names(), None, True)
            rows = [] if since is None else db.execute(
                "SELECT stream, max(pos) FROM moves WHERE pos > ? GROUP BY stream", (since,),
            ).fetchall()
            first, last = db.execute("SELECT min(pos), coalesce(max(pos), 0) FROM moves").fetchone()
            # None, a cursor of a database since replaced, or one older than the moves kept (let
            # go since, maybe before the rows were read): a full look, its cursor read first, so
            # a move between the two reads is named again next time.
            if since is None or since > last or (first is not None and since < first - 1):
                return Moved(self._stream_names(), last, True)
        cursor = max([pos for _, pos in rows], default=since)
        return Moved(sorted(name for name, _ in rows), cursor, False)

    def _has_moves(self, db: sqlite3.Connection) -> bool:
        if not self._moves:
            self._moves = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'moves'"
            ).fetchone() is not None
        return self._moves

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        # One row per stream, replaced (save_snapshot decided it should be): a snapshot is a
        # cache, so its table is made when the first one is saved (a store an older version
        # made gains it then).
        with self._failing(f"snapshot of stream {stream!r}"):
            db = self._connection()
            with self._transaction(db):
                db.execute(_SNAPSHOTS)
                db.execute(
                    "INSERT INTO snapshots (stream, seq, body) VALUES (?, ?, ?) "
                    "ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq, body = excluded.body",
                    (stream, seq, data),
                )
        return True

    def _snapshot_seq(self, stream: str) -> int | None:
        with self._failing(f"snapshot of stream {stream!r}"):  # the seq alone, not the blob
            db = self._connection()
            if db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'"
            ).fetchone() is None:
                return None
            row = db.execute("SELECT seq FROM snapshots WHERE stream = ?", (stream,)).fetchone()
        return None if row is None else int(row[0])

    def _load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        with self._failing(f"snapshot of stream {stream!r}"):
            db = self._connection()
            if not self._has_events(db) or db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'"
            ).fetchone() is None:
                return None
            row = db.execute(
                "SELECT seq, body FROM snapshots WHERE stream = ?", (stream,)
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def _delete(self, stream: str) -> None:
        with self._failing(f"delete of stream {stream!r}"):
            db = self._connection()
            with self._transaction(db):
                db.execute("DELETE FROM events WHERE stream = ?", (stream,))
                if self._has_moves(db):
                    db.execute("INSERT INTO moves (stream) VALUES (?)", (stream,))
                if db.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'snapshots'"
                ).fetchone() is not None:
                    db.execute("DELETE FROM snapshots WHERE stream = ?", (stream,))

    def _close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            with self._failing("closing"):
                db.close()

    # -- internals -------------------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise ValueError(f"{self.url} store is closed")
        return self._db

    @contextlib.contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        # After the store opened: a failure underneath, named with the operation it broke.
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"{self.url}: {what} failed: {exc}") from exc
        except UnicodeDecodeError as exc:  # sqlite3 decodes TEXT strictly; damage can break it
            raise DecodeError(f"{self.url}: {what}: stored text is not UTF-8: {exc}") from exc

    def _has_events(self, db: sqlite3.Connection) -> bool:
        # Only a read-only store can lack the schema: it opened an empty database, to which a
        # writer may since have given one.
        if not self._ready:
            with self._unusable():
                self._ready = self._check_schema(db)
        return self._ready

    def _last_seq(self, db: sqlite3.Connection, stream: str) -> int:
        last = db.execute("SELECT max(seq) FROM events WHERE stream = ?", (stream,)).fetchone()[0]
        if last is None:
            return 0
        if type(last) is not int:
            raise DecodeError(
                f"{self.url} stream {stream!r}: the last seq is {last!r}, not an integer"
            )
        return last

    def _transaction(self, db: sqlite3.Connection) -> Transaction:
        return Transaction(db, self.url, self._timeout)


class _Slow(Exception):
    """A page holds a body that is not bytes or is too large: it is walked row by row."""
