"""PostgresStore: the store of :mod:`nous_inbox.store.postgres`, its connections and its appends.

An append is one transaction in two round trips, each one message to the server: first ``BEGIN``
and the stream row's lock (``SELECT ... FOR UPDATE``), then the writes with the ``COMMIT``. The
shape is what bounds a paused holder: between the two, the server is idle in our transaction,
so its ``idle_in_transaction_session_timeout`` runs, and a host paused there (SIGSTOP, a frozen
VM, a partition) loses its connection and the row lock after ``max(1, lease/2)`` s. The second
message is read whole before any of it runs, so a host paused while sending it is cut off the
same way. (A pipeline would not do: its statements between two Syncs leave the server waiting
for input with no timer armed.)

A lost append is looked up by its identity under the stream row's lock, which waits for the lost
attempt's transaction to end; only whether it was made is asked there, and its rows are read once
the row is let go (see the package's "Lost answers").
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import psycopg
from psycopg import ClientCursor
from psycopg.pq import TransactionStatus

from nous_inbox.codec import MAX_RECORD_SIZE, MSGPACK
from nous_inbox.errors import DecodeError, LeaseLostError, OutcomeUnknownError, StoreError
from nous_inbox.events import Event
from nous_inbox.store.base import Moved, StoreBase, check_max_record_size
from nous_inbox.store.postgres.lease import Background, Leasing, PostgresLease
from nous_inbox.store.postgres.schema import Tables
from nous_inbox.store.postgres.url import (
    default_reconnect,
    first_line,
    gives_connect_timeout,
    reconnect_seconds,
    seconds,
    split_url,
)

__all__ = ["PostgresStore"]

logger: Final = logging.getLogger("nous_inbox.store.postgres")

DEFAULT_LEASE: Final = 5.0
DEFAULT_POLL: Final = 2.0
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_PAGE: Final = 512
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class PostgresStore(Leasing, StoreBase):
    """A :class:`~nous_inbox.store.base.Store` in a PostgreSQL database, shared by many hosts.

    ``url`` is any URL libpq takes (``postgresql://user@host/db``,
    ``postgresql:///db?host=/run/postgresql``, ``postgresql://?service=agents``), optionally with
    the parameters :mod:`nous_inbox.store.postgres` lists; the keyword arguments win over them.
    ``read_only=True`` opens an existing store without writing to it. ``reconnect`` bounds how
    long a call keeps retrying a lost connection (4/5 of ``lease``, at most 10 s, by default;
    0: one try); ``lease``, ``poll`` and ``reconnect`` read back as the store uses them. ``connect_timeout`` bounds each connection attempt (libpq's own URL parameter
    or ``PGCONNECT_TIMEOUT`` is respected; 5 s when none says).
    """

    def __init__(
        self, url: str, *, read_only: bool = False, schema: str | None = None,
        lease: float | None = None, poll: float | None = None, pooler: str | None = None,
        reconnect: float | None = None, connect_timeout: float | None = None,
        max_record_size: int = MAX_RECORD_SIZE,
    ) -> None:
        target = split_url(url)
        ours, self.url = target.ours, target.shown
        self.read_only = read_only
        self.schema = schema if schema is not None else ours.get("schema", "public")
        if not _IDENTIFIER.fullmatch(self.schema):
            raise ValueError(f"{self.url}: schema must be a plain SQL name "
                             f"(letters, digits, _), got {self.schema!r}")
        self.lease = seconds("lease", lease if lease is not None else ours.get("lease"),
                             DEFAULT_LEASE, self.url)
        self.poll = seconds("poll", poll if poll is not None else ours.get("poll"),
                            DEFAULT_POLL, self.url)
        self.pooler = pooler if pooler is not None else ours.get("pooler")
        if self.pooler not in (None, "", "transaction", "session"):
            raise ValueError(f"{self.url}: pooler must be 'transaction' or 'session', "
                             f"got {self.pooler!r}")
        given = reconnect if reconnect is not None else ours.get("reconnect")
        self.reconnect = reconnect_seconds(given, default_reconnect(self.lease), self.url)
        # The user's connect_timeout (URL or environment) is libpq's to read: only the keyword
        # overrides it, and only when none says is ours given.
        self._connect_timeout: float | None = None
        if connect_timeout is not None or not gives_connect_timeout(target.params):
            self._connect_timeout = seconds("connect_timeout", connect_timeout,
                                            DEFAULT_CONNECT_TIMEOUT, self.url)
        self._conninfo = psycopg.conninfo.make_conninfo("", **target.params)
        self._libpq_keys = frozenset(target.params)
        self._format = MSGPACK
        self.max_record_size = check_max_record_size(self.url, max_record_size)
        # Per thread: what the append in progress needs between the hooks (the seq below which
        # its recovery need not look; the identity to look for, and what was found).
        self._local = threading.local()
        self.channel = "nous_inbox_" + hashlib.sha256(self.schema.encode()).hexdigest()[:16]
        self.tables = Tables(self.schema, self.url)
        # Two locks. ``_lock`` is the main connection's, held around every use of it, so for as
        # long as the server or the network takes. ``_state`` guards the leases held, the
        # subscribers, ``_closed`` and ``_background``, and is never held across I/O: the
        # background thread needs only ``_state``, so a call stalled on the main connection
        # never delays a renewal.
        self._lock = threading.RLock()
        self._state = threading.Lock()
        # Waiting on this releases ``_lock`` for the pause between reconnect attempts.
        self._pause = threading.Condition(self._lock)
        self._held: dict[str, PostgresLease] = {}
        self._subscribers: dict[str, list[Callable[[], None]]] = {}
        self._released: list[Callable[[str], None]] = []
        self._closed = False
        self._db: psycopg.Connection[Any] | None = None
        self._background: Background | None = None
        self._host = socket.gethostname()
        with self._lock:
            try:
                self._db = self._open()
            except psycopg.Error as exc:
                raise StoreError(f"{self.url}: cannot connect: {first_line(exc)}") from exc
            try:
                self.tables.setup(self._db, read_only)
            except BaseException:
                self._db.close()
                raise

    # -- the append ------------------------------------------------------------------------------

    def _append_retrying(
        self, stream: str, events: Sequence[Event], expected_version: int | None,
        identity: uuid.UUID | None,
    ) -> list[Event]:
        """Append in one transaction, fenced when this store owns the stream; a lost
        connection is made again and the append looked for before it is tried again."""
        batch = identity if identity is not None else uuid.uuid4()

        def attempt(db: psycopg.Connection[Any]) -> list[Event]:
            # Every earlier attempt is known to have written nothing (none was made, or a
            # recovery looked), and this one cannot until it sends its COMMIT (``_write``).
            self._local.committing = False
            self._local.floor = expected_version or 0
            self._local.look = identity
            return self._append_once(stream, events, expected_version, batch, identity is not None)

        def recover(db: psycopg.Connection[Any]) -> list[Event] | None:
            # Taking the stream row's lock waits for the lost attempt's transaction to end
            # either way, so the look that follows sees its outcome. The wait is bounded by what
            # is left of ``reconnect``: a lost attempt whose server process lives on, idle in
            # its transaction, ends within ``max(1, lease/2)`` s (see ``connect``).
            left = max(50, round((self._local.deadline - time.monotonic()) * 1000))
            try:
                with db.transaction():
                    db.execute(f"SET LOCAL lock_timeout = {left}")
                    db.execute(f"INSERT INTO {self.tables.streams} (stream) VALUES (%s) "
                               f"ON CONFLICT DO NOTHING", (stream,))
                    db.execute(f"SELECT 1 FROM {self.tables.streams} WHERE stream = %s "
                               f"FOR UPDATE", (stream,))
            except psycopg.errors.LockNotAvailable as exc:
                reason = f"the lost attempt still held the stream {self.reconnect:g}s later"
                raise unknown(reason) or StoreError(
                    f"{self.url}: append to stream {stream!r} failed: {reason}; nothing was "
                    f"written") from exc
            # The lost attempt is over, written or not: its rows are read with the row let go,
            # so a host paused while it receives them holds no lock (the server would be busy
            # sending, where no idle timer runs).
            return self._batch_rows(db, stream, batch, getattr(self._local, "floor", 0)) or None

        def unknown(reason: str) -> OutcomeUnknownError | None:
            if not getattr(self._local, "committing", False):
                return None  # the COMMIT was never sent: nothing was written
            return OutcomeUnknownError(
                f"{self.url}: append to stream {stream!r}: {reason}, so whether it was written "
                f"is not known; append it again with identity={batch} to write it once",
                stream=stream, identity=batch,
            )

        stored: list[Event] = self._retrying(f"append to stream {stream!r}", attempt, recover,
                                             unknown)
        return stored

    @contextlib.contextmanager
    def _appending(self, stream: str) -> Iterator[int]:
        """The first round trip: the transaction begun and the stream row locked, fenced by the
        lease this store holds (and, for an append with an identity, that append looked up)."""
        db = self._connection()
        with self._state:
            held = self._held.get(stream)
        if held is not None and held.lost:
            raise self._lost(stream, held)
        look, self._local.look, self._local.found = getattr(self._local, "look", None), None, None
        streams = self.tables.streams
        query = (f"BEGIN; INSERT INTO {streams} (stream) VALUES (%s) ON CONFLICT DO NOTHING; "
                 f"SELECT version, holder, epoch FROM {streams} WHERE stream = %s FOR UPDATE")
        params: list[Any] = [stream, stream]
        if look is not None:  # under the lock only whether it was made; its rows after
            query += (f"; SELECT min(seq), count(*) FROM {self.tables.events} WHERE batch = %s "
                      f"AND stream = %s")
            params += [look, stream]
        self._local.db = db  # the second round trip's, whatever happens to ``_db`` meanwhile
        try:
            cur = ClientCursor(db)
            cur.execute(query, params)
            for _ in range(2):  # past BEGIN and INSERT
                cur.nextset()
            row = cur.fetchone()
            if row is None:
                raise StoreError(f"{self.url}: the row of stream {stream!r} vanished")
            if look is not None:
                cur.nextset()
                span = cur.fetchone()
                self._local.found = (int(span[0]), int(span[1])) if span and span[1] else None
            if held is not None and (row[1], row[2]) != (held.token, held.epoch):
                held.lost = True
                raise self._lost(stream, held)
            self._local.floor = version = int(row[0])
            yield version
        finally:
            self._end_transaction(db)

    def _end_transaction(self, db: psycopg.Connection[Any]) -> None:
        """Roll back a transaction the append left open (it wrote nothing: a conflict, an
        append found already made, an error); a connection that cannot is let go."""
        if db.closed or db.broken or db.info.transaction_status == TransactionStatus.IDLE:
            return
        try:
            db.execute("ROLLBACK")
        except psycopg.Error:
            self._drop(db)

    def _find_batch(self, stream: str, identity: uuid.UUID) -> list[Event] | None:
        """The append made with ``identity``, which ``_appending`` found in the stream: read
        once the transaction let the row go (it writes nothing now), so a host paused while it
        receives a large batch holds no lock."""
        span = getattr(self._local, "found", None)
        if span is None:
            return None
        db = self._local.db
        self._end_transaction(db)
        found = self._batch_rows(db, stream, identity, span[0] - 1)
        if len(found) != span[1] or found[0].seq != span[0]:
            raise StoreError(
                f"{self.url}: the append to stream {stream!r} with identity={identity} was "
                f"written, then the stream was deleted before it could be read back")
        return found

    def _batch_rows(self, db: psycopg.Connection[Any], stream: str, batch: uuid.UUID,
                    after: int) -> list[Event]:
        """The events ``stream`` holds after seq ``after`` from the append ``batch``, in order."""
        rows = db.execute(f"SELECT seq, body FROM {self.tables.events} WHERE stream = %s "
                          f"AND seq > %s AND batch = %s ORDER BY seq",
                          (stream, after, batch)).fetchall()
        return [self._row(stream, seq, body) for seq, body in rows]

    def _remember_batch(self, stream: str, identity: uuid.UUID, stored: list[Event],
                        records: list[bytes]) -> None:
        """Nothing to do: the identity is stored with the events (``_write``)."""

    def _write(self, stream: str, events: list[Event], records: list[bytes], *,
               batch: object | None = None) -> None:
        """The second round trip: move the stream row on, insert the events with the batch's
        identity (one statement however many), notify, and commit."""
        self._local.committing = True
        moved = ", moved = pg_current_xact_id()" if self.tables.moves else ""
        ClientCursor(self._local.db).execute(
            f"UPDATE {self.tables.streams} SET version = %s{moved} WHERE stream = %s; "
            f"INSERT INTO {self.tables.events} (stream, seq, body, batch) "
            f"SELECT %s, u.seq, u.body, %s FROM unnest(%s::bigint[], %s::bytea[]) AS u(seq, body); "
            f"SELECT pg_notify(%s, %s); COMMIT",
            (events[-1].seq, stream, stream, batch, [event.seq for event in events], records,
             self.channel, stream),
        )

    def _delete(self, stream: str) -> None:
        """One transaction, fenced by the lease this store holds: the events and the snapshot
        go, the stream row stays at version 0 (it holds the lease)."""
        with self._state:
            held = self._held.get(stream)
        tables = self.tables
        committed: list[bool] = []  # a COMMIT sent, by any attempt: then it may have been done

        def work(db: psycopg.Connection[Any]) -> None:
            with db.transaction():
                row = db.execute(f"SELECT holder, epoch FROM {tables.streams} WHERE stream = %s "
                                 f"FOR UPDATE", (stream,)).fetchone()
                if row is None:
                    return
                if held is not None and (row[0], row[1]) != (held.token, held.epoch):
                    held.lost = True
                    raise self._lost(stream, held)
                db.execute(f"DELETE FROM {tables.events} WHERE stream = %s", (stream,))
                with contextlib.suppress(psycopg.errors.UndefinedTable), db.transaction():
                    db.execute(f"DELETE FROM {tables.snapshots} WHERE stream = %s", (stream,))
                moved = ", moved = pg_current_xact_id()" if tables.moves else ""
                db.execute(f"UPDATE {tables.streams} SET version = 0{moved} WHERE stream = %s",
                           (stream,))
                db.execute("SELECT pg_notify(%s, %s)", (self.channel, stream))
                committed.append(True)  # leaving the block sends the COMMIT

        def unknown(reason: str) -> StoreError | None:
            if not committed:
                return None
            return StoreError(f"{self.url}: delete of stream {stream!r}: {reason}, so whether "
                              f"it was done is not known; delete it again to be sure")

        self._retrying(f"delete of stream {stream!r}", work, unknown=unknown)

    def _lost(self, stream: str, held: PostgresLease) -> LeaseLostError:
        return LeaseLostError(
            f"stream {stream!r} of {self.url}: this owner's lease (epoch {held.epoch}) expired "
            f"and was taken over; nothing was written", stream=stream, epoch=held.epoch,
        )

    # -- reads -----------------------------------------------------------------------------------

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        return self._pages(stream, after)

    def _pages(self, stream: str, after: int) -> Iterator[Event]:
        # A page of rows at a time, the lock taken per page: nothing stays locked or open while
        # the caller iterates.
        query = (f"SELECT seq, body FROM {self.tables.events} WHERE stream = %s AND seq > %s "
                 f"ORDER BY seq LIMIT {_PAGE}")
        while True:
            page = (stream, after)
            rows: list[tuple[int, Any]] = self._retrying(
                f"read of stream {stream!r}",
                lambda db, page=page: db.execute(query, page).fetchall(),  # type: ignore[misc]
            )
            for seq, body in rows:
                yield self._row(stream, seq, body)
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def _version(self, stream: str) -> int:
        """The last seq of ``stream`` (0 if none): one primary-key lookup."""
        row = self._retrying(
            f"version of stream {stream!r}",
            lambda db: db.execute(f"SELECT version FROM {self.tables.streams} WHERE stream = %s",
                                  (stream,)).fetchone(),
        )
        return 0 if row is None else int(row[0])

    def _stream_names(self) -> list[str]:
        rows = self._retrying(
            "listing the streams",
            lambda db: db.execute(f"SELECT stream FROM {self.tables.streams} WHERE version > 0 "
                                  f"ORDER BY stream").fetchall(),
        )
        return [name for (name,) in rows]

    def _moved(self, since: object) -> Moved:
        """The rows moved by a transaction this look may not have seen: the cursor is the
        oldest transaction still running when the last look began (every older one had ended,
        so its rows were read then), so a transaction that commits late is never missed, and
        one running long only names its streams again until it ends."""
        if since is not None and (type(since) is not int or since < 0):
            raise ValueError(f"moved: {since!r} is not a cursor this store gave")
        if not self.tables.moves:
            return Moved(self._stream_names(), None, True)
        streams = self.tables.streams

        def look(db: psycopg.Connection[Any]) -> Moved:
            row: Any = db.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
            cursor = int(row[0])
            if since is None or since > cursor:  # (a cursor of another database)
                names = db.execute(f"SELECT stream FROM {streams} WHERE version > 0 "
                                   f"ORDER BY stream").fetchall()
                return Moved([name for (name,) in names], cursor, True)
            rows = db.execute(f"SELECT stream FROM {streams} WHERE moved >= %s::text::xid8 "
                              f"ORDER BY stream", (str(since),)).fetchall()
            return Moved([name for (name,) in rows], cursor, False)

        moved: Moved = self._retrying("listing the streams that moved", look)
        return moved

    def _row(self, stream: str, seq: int, body: Any) -> Event:
        where = f"{self.url} stream {stream!r} seq {seq}"
        if type(body) is not bytes:
            raise DecodeError(f"{where}: the stored body is {type(body).__name__}, not bytes")
        event: Event = self._format.decode(body, Event, where, self.max_record_size)
        if event.seq != seq:
            raise DecodeError(f"{where}: the stored event says seq {event.seq}")
        return event

    # -- snapshots -------------------------------------------------------------------------------

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        # One row, replaced (save_snapshot decided it should be). No DDL here: the table is
        # made on open, so a role that may only write the tables saves too.
        query = (f"INSERT INTO {self.tables.snapshots} (stream, seq, body) VALUES (%s, %s, %s) "
                 "ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq, body = excluded.body")
        kept = self._snapshot_query(query, (stream, seq, data), write=True)
        return kept is not None

    def _snapshot_seq(self, stream: str) -> int | None:
        row = self._snapshot_query(f"SELECT seq FROM {self.tables.snapshots} WHERE stream = %s",
                                   (stream,))
        return None if row is None else int(row[0])

    def _load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        row = self._snapshot_query(
            f"SELECT seq, body FROM {self.tables.snapshots} WHERE stream = %s", (stream,))
        return None if row is None else (int(row[0]), bytes(row[1]))

    def _snapshot_query(self, query: str, params: tuple[Any, ...], write: bool = False) -> Any:
        """Run a snapshot query: its row (``()`` for a write), or ``None`` in a store made
        before the snapshots table, which keeps none."""
        stream = params[0]

        def run(db: psycopg.Connection[Any]) -> Any:
            try:
                cursor = db.execute(query, params)
            except psycopg.errors.UndefinedTable:
                return None
            return () if write else cursor.fetchone()

        return self._retrying(f"snapshot of stream {stream!r}", run)

    def own(self, stream: str) -> PostgresLease:
        """Take ``stream``'s lease row, or raise ``StreamOwnedError`` (see its module)."""
        lease = super().own(stream)
        assert isinstance(lease, PostgresLease)
        return lease

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"PostgresStore({self.url!r}{mode})"

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.url} store is closed")

    def _close(self) -> None:
        """The template's hook, after ``_release_all``: close the connection."""
        self._drop(self._db)
