"""PostgresStore (``postgresql://...``): sessions shared by many machines, one owner each.

When agent hosts run on several machines, a steer arrives at whichever web server took the
request, and any host may die mid-run, the log must live in a server they all reach. This store
keeps it in PostgreSQL through psycopg 3 (``pip install nous-inbox[postgres]``); nothing else in
the library imports psycopg.

Schema (created and versioned on open, in the URL's ``schema``, ``public`` by default)::

    nous_inbox_meta    (key, value)                       format and schema versions
    nous_inbox_streams (stream PK, version, holder, pid, host, epoch, expires)
    nous_inbox_events  (stream, seq, body, batch; PK (stream, seq))
    nous_inbox_snapshots (stream PK, seq, body)           the newest snapshot of each stream

All four are made on first open. A store made by a version that created the snapshots table
with its first snapshot gets it on its next writable open (the table is the same, so the layout
version is unchanged and those versions still open the store); a role without CREATE on the
schema cannot add it, and is told so in the log.

An append is one transaction: it moves the stream's row from the expected version to the new
one (``UPDATE ... WHERE version = expected``; no row updated means
:class:`~nous_inbox.errors.ConcurrencyError` and nothing written), inserts the events (bodies
are MessagePack, as in the SQLite store) and sends a notification, all committed at once. The
row lock on the stream row serialises writers of one stream; writers of different streams never
wait for each other.

Ownership across machines. A process dying does not free anything in a server, so ``own(stream)``
takes a *lease* in the stream's row: a holder token, the holder's pid and host, and an expiry on
the database's clock (``lease`` seconds ahead, 5 by default). A background thread renews it every
third of that while held; ``release`` and ``close`` clear it. Taking a lease bumps the stream's
``epoch``, a fencing token: every append this store makes to a stream it owns says "only if my
token and epoch still hold the lease", so an owner whose lease expired and was taken over (it was
paused, partitioned, or its renewals failed) is refused with
:class:`~nous_inbox.errors.LeaseLostError` and writes nothing, however late its append arrives.
That error is final: catching up and retrying cannot fix it, so it is deliberately not a
``ConcurrencyError``.

How this differs from the local stores: there, a lease dies with its process at once (the kernel
drops the lock). Here a crashed host's sessions are taken over only when its lease has expired,
``lease`` seconds after its last renewal. A shorter lease means a faster takeover and more renewal
traffic; an owner that cannot reach the server for longer than its lease loses its sessions.

Timing rules (``lease`` = L seconds). Nothing the store waits for may outlast a lease it holds:

- Renewals run every L/3 on the background connection and never wait for the main connection
  or its lock: a call stalled there (a row lock, a reconnect) costs no other lease.
- A transaction of ours left idle (a host cut off between an append's two round trips) is ended
  by the server after ``max(1, L/2)`` s (``idle_in_transaction_session_timeout``), and TCP
  keepalives on both ends notice a dead peer within about L + 3 s, so a stream row stays locked
  by a vanished host for seconds, not the two hours of the defaults.
- Taking a lease waits at most L/4 for the stream row's lock, and a renewal as long (that lease
  is renewed at the next round); a row locked longer is a writer stuck or gone, and ``own``
  refuses the stream as owned (``StreamOwnedError``) rather than wait.
- ``reconnect`` defaults to 4/5 of L (at most 10 s): a call that cannot get its connection back
  stops retrying then, rather than retrying into a takeover. It is checked between attempts, so
  an attempt under way (bounded by ``connect_timeout``, 5 s by default, whole seconds for libpq)
  may end later, and other calls of the store wait behind it; the pauses between attempts are
  made without the connection's lock. Leases do not depend on this: renewals use their own
  connection. The recovery of an append whose connection dropped waits for the stream row no
  longer than what is left of ``reconnect``, then raises ``StoreError`` saying the outcome is
  not known.
- Behind a transaction pooler the session settings above are not made (they would stay on the
  pooled server connection, for other clients): set the pooler's or the role's own. The waits
  for a row lock (taking, renewing, recovering) are bounded there all the same, per transaction
  (``SET LOCAL``).

Wake-ups. Each append notifies the channel of its schema with the stream's name. The background
thread LISTENs (first, on every (re)connect, then nudges every subscriber, since a notification
sent while nobody listened is lost) and calls :meth:`PostgresStore.subscribe` callbacks: on a
notification for their stream, after a reconnect, and every ``poll`` seconds as a backstop. The
callback is a hint: the subscriber reads the version to see what changed.

Lost acknowledgements. Each append carries a random batch id stored with its events. When the
connection drops during an append, the store reconnects (for up to ``reconnect`` seconds) and
looks for that id: found, the append had committed and its events are returned as stored; not
found, it is made again. So a retry after a commit whose answer was lost neither loses nor
doubles the events. Reads and version checks retry the same way. (The store implements only the
template's hooks: ``_append_retrying`` makes that batch id and the retries, ``_write`` stores it;
``_own`` and ``_release_all`` take and give back the lease rows.)

Connection poolers. Behind a pooler in transaction mode (PgBouncer, say), pass
``pooler=transaction``: no prepared statements are used (``prepare_threshold=None``), and, since
such a pooler cannot hold a LISTEN, wake-ups come from the polling backstop alone. Behind a
pooler in session mode, ``pooler=session`` (or nothing) is right: such a pooler gives each client
connection one server connection for as long as it lasts, so prepared statements and LISTEN
work as they do directly. Leases are rows, not advisory locks, so they survive the pooler
handing out other connections.

Connections. A store uses one connection for its calls, shared by its threads behind a lock (as
the SQLite store shares its one), plus one for the background thread once it owns or is
subscribed to a stream. No pool: writes to one stream serialise on its row anyway, and the
owner's group commit already joins concurrent sends into one transaction, so more connections
would only mean more server processes. An append is pipelined: two round trips (the row lock, then the writes with the
COMMIT), whatever the number of events.

URL query parameters read by this store (removed before the URL reaches libpq): ``schema``,
``lease`` (seconds), ``poll`` (seconds), ``pooler`` (``transaction`` or ``session``),
``reconnect`` (seconds an operation keeps trying to get a lost connection back, 4/5 of the
lease and at most 10 by default; 0 for no retry). Everything else is libpq's,
``connect_timeout`` included (5 s when not given).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import select
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import psycopg

from nous_inbox.codec import FORMAT_NAME, MAX_RECORD_SIZE, MSGPACK
from nous_inbox.errors import DecodeError, LeaseLostError, StoreError
from nous_inbox.events import SCHEMA_VERSION, Event
from nous_inbox.store.base import StoreBase, check_max_record_size, check_stream
from nous_inbox.store.lease import OwnerLease, owned_error

__all__ = ["PostgresLease", "PostgresStore"]

logger: Final = logging.getLogger("nous_inbox.store.postgres")

#: The layout of our tables; bumped (with a migration) when it changes.
TABLES_VERSION: Final = 1
DEFAULT_LEASE: Final = 5.0
DEFAULT_POLL: Final = 2.0
#: The longest default ``reconnect``; by default it is also shorter than the lease (see
#: :func:`_default_reconnect`).
DEFAULT_RECONNECT: Final = 10.0
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
_PAGE: Final = 512
_OURS: Final = ("schema", "lease", "poll", "pooler", "reconnect")
#: The tables without which a schema is not a store (the snapshots table may be missing: see
#: the module docstring).
_TABLES: Final = frozenset({"nous_inbox_meta", "nous_inbox_streams", "nous_inbox_events"})
_SNAPSHOTS: Final = "nous_inbox_snapshots"
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class PostgresLease(OwnerLease):
    """An :class:`~nous_inbox.store.lease.OwnerLease` held in a PostgreSQL row, with its epoch.

    ``epoch`` is the fencing token this lease carries in every append; ``lost`` says whether a
    renewal found it taken over (appends then raise ``LeaseLostError`` without asking).
    """

    __slots__ = ("epoch", "lost", "token")

    def __init__(self, stream: str, release: Callable[[], None], token: str, epoch: int) -> None:
        super().__init__(stream, release)
        self.token = token
        self.epoch = epoch
        self.lost = False


def _split_url(url: str) -> tuple[str, dict[str, str], str]:
    """``(conninfo for libpq, our parameters, the URL to show with any password hidden)``."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OURS}
    theirs = [(k, v) for k, v in query if k not in _OURS]
    conninfo = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(theirs)))
    shown = parts
    if parts.password:
        shown = shown._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1))
    if any(k in _SECRETS for k, _ in query):  # a password given as a query parameter
        hidden = [(k, "***" if k in _SECRETS else v) for k, v in query]
        shown = shown._replace(query=urllib.parse.urlencode(hidden, safe="*"))
    return conninfo, ours, (url if shown is parts else urllib.parse.urlunsplit(shown))


#: Query parameters libpq reads as secrets: never shown in ``url``, errors or ``repr``.
_SECRETS: Final = frozenset({"password", "sslpassword"})


def _libpq_timeout(conninfo: str) -> str | None:
    """The ``connect_timeout`` the URL gives libpq, if any."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(conninfo).query)
    values = query.get("connect_timeout")
    return values[-1] if values else None


def _default_reconnect(lease: float) -> float:
    """``reconnect`` when none is given: shorter than the lease (4/5 of it, at most 10 s), so an
    operation that cannot get its connection back stops retrying rather than retrying into a
    takeover. A bound on the retries, checked between attempts, not on the call: an attempt
    under way runs to its ``connect_timeout`` (see the module docstring)."""
    return min(DEFAULT_RECONNECT, 0.8 * lease)


def _reconnect_seconds(value: str | float | None, default: float, url: str) -> float:
    """``reconnect`` from the keyword or the URL: seconds, or zero (any spelling) for one try."""
    try:
        if value is not None and type(value) is not bool and float(value) == 0:
            return 0.0
    except ValueError:
        pass  # _seconds names it
    return _seconds("reconnect", value, default, url)


def _seconds(name: str, value: str | float | None, default: float, url: str) -> float:
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{url}: {name} must be a positive number of seconds, got {value!r}")
    return seconds


class PostgresStore(StoreBase):
    """A :class:`~nous_inbox.store.base.Store` in a PostgreSQL database, shared by many hosts.

    ``url`` is a libpq URL (``postgresql://user@host/db``), optionally with the parameters the
    module docstring lists; the keyword arguments, when given, win over them. ``read_only=True``
    opens an existing store without writing to it. ``reconnect`` bounds how long an operation
    keeps retrying a lost connection before it raises ``StoreError`` (by default 4/5 of
    ``lease``, at most 10 s, so shorter than the lease; 0 means one try, no retry).
    ``connect_timeout`` bounds each connection attempt (libpq's own URL parameter of that name
    is respected; 5 s when neither says).

    Timing: a stalled call never delays the lease renewals (they need only a small lock never
    held across I/O, and their own connection); the server ends a transaction of ours left idle
    after ``max(1, lease/2)`` s; ``own`` waits at most ``lease/4`` for a locked stream row, then
    refuses it as owned. The module docstring has the full rules.
    """

    def __init__(
        self, url: str, *, read_only: bool = False, schema: str | None = None,
        lease: float | None = None, poll: float | None = None, pooler: str | None = None,
        reconnect: float | None = None, connect_timeout: float | None = None,
        max_record_size: int = MAX_RECORD_SIZE,
    ) -> None:
        self._conninfo, ours, self.url = _split_url(url)
        self.read_only = read_only
        self.schema = schema if schema is not None else ours.get("schema", "public")
        if not _IDENTIFIER.fullmatch(self.schema):
            raise ValueError(f"{self.url}: schema must be a plain SQL name "
                             f"(letters, digits, _), got {self.schema!r}")
        self.lease = _seconds("lease", lease if lease is not None else ours.get("lease"),
                              DEFAULT_LEASE, self.url)
        self.poll = _seconds("poll", poll if poll is not None else ours.get("poll"),
                             DEFAULT_POLL, self.url)
        self.pooler = pooler if pooler is not None else ours.get("pooler")
        if self.pooler not in (None, "", "transaction", "session"):
            raise ValueError(f"{self.url}: pooler must be 'transaction' or 'session', "
                             f"got {self.pooler!r}")
        given = reconnect if reconnect is not None else ours.get("reconnect")
        self._reconnect = _reconnect_seconds(given, _default_reconnect(self.lease), self.url)
        # libpq's connect_timeout in the URL is the user's (libpq reads it): only the keyword
        # overrides it, and only when neither says is ours given.
        self._connect_timeout: float | None = None
        if connect_timeout is not None or _libpq_timeout(self._conninfo) is None:
            self._connect_timeout = _seconds("connect_timeout", connect_timeout,
                                             DEFAULT_CONNECT_TIMEOUT, self.url)
        try:
            self._libpq_keys = frozenset(psycopg.conninfo.conninfo_to_dict(self._conninfo))
        except psycopg.Error:  # connecting says what is wrong with it
            self._libpq_keys = frozenset()
        self._format = MSGPACK
        self.max_record_size = check_max_record_size(self.url, max_record_size)
        # Per thread: a seq below every seq the thread's append in progress can have (what
        # ``_appending`` read), so its recovery looks only at the stream's newest rows.
        self._local = threading.local()
        self.channel = "nous_inbox_" + hashlib.sha256(self.schema.encode()).hexdigest()[:16]
        q = f'"{self.schema}".'
        self._t_meta, self._t_streams, self._t_events, self._t_snapshots = (
            q + "nous_inbox_meta", q + "nous_inbox_streams", q + "nous_inbox_events",
            q + _SNAPSHOTS)
        # Two locks. ``_lock`` is the main connection's: held around every use of it, so it may
        # be held for as long as the server or the network takes. ``_state`` guards the leases
        # held, the subscribers, ``_closed`` and ``_background``, and is never held across I/O:
        # the background thread needs only ``_state``, so a call stalled on the main connection
        # (a row lock, a reconnect) never delays a renewal, and every other lease of this store
        # survives it.
        self._lock = threading.RLock()
        self._state = threading.Lock()
        # Waiting on this releases ``_lock`` (every level of it) for the pause between
        # reconnect attempts, so other threads are not kept waiting behind a sleep.
        self._pause = threading.Condition(self._lock)
        self._held: dict[str, PostgresLease] = {}
        self._subscribers: dict[str, list[Callable[[], None]]] = {}
        self._closed = False
        self._db: psycopg.Connection[Any] | None = None
        self._background: _Background | None = None
        self._host = socket.gethostname()
        with self._lock:
            self._db = self._connect_first()
            try:
                self._setup(self._db)
            except BaseException:
                self._db.close()
                raise

    # -- connecting ------------------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection to the store's database (no prepared statements behind a
        transaction pooler), with its waits bounded.

        A host cut off mid-transaction leaves its server process holding the stream row's lock
        until the server notices, about two hours with the defaults. So the connection ends
        a transaction left idle for ``max(1, lease/2)`` seconds
        (``idle_in_transaction_session_timeout``; our transactions never idle longer than a
        proof of the records between two round trips), and TCP keepalives on both ends (libpq's
        ``keepalives*``, unless the URL sets them, and the server's ``tcp_keepalives_*``) notice
        a dead peer within about ``lease`` + 3 seconds. Behind a transaction pooler, session
        settings would leak to other clients of the pooled server connection, so none are made:
        set the pooler's or the role's own (PgBouncer's ``idle_transaction_timeout``, ``ALTER
        ROLE ... SET idle_in_transaction_session_timeout``).
        """
        prepare = None if self.pooler == "transaction" else 5
        extra: dict[str, Any] = {}
        if self._connect_timeout is not None:  # else the URL's own connect_timeout applies
            extra["connect_timeout"] = max(1, round(self._connect_timeout))
        if not any(key.startswith("keepalives") for key in self._libpq_keys):
            extra.update(keepalives=1, keepalives_idle=self._keepalive_idle,
                         keepalives_interval=1, keepalives_count=3)
        db = psycopg.connect(self._conninfo, autocommit=True, prepare_threshold=prepare, **extra)
        if self.pooler != "transaction":
            try:
                db.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, false), "
                    "set_config('tcp_keepalives_idle', %s, false), "
                    "set_config('tcp_keepalives_interval', '1', false), "
                    "set_config('tcp_keepalives_count', '3', false)",
                    (str(self._idle_limit_ms), str(self._keepalive_idle)),
                )
            except BaseException:
                db.close()
                raise
        return db

    @property
    def _idle_limit_ms(self) -> int:
        """How long the server lets one of our transactions sit idle (see :meth:`connect`)."""
        return round(max(1.0, self.lease / 2) * 1000)

    @property
    def _keepalive_idle(self) -> int:
        return max(1, round(self.lease))

    @property
    def _lock_wait_ms(self) -> int:
        """How long taking a lease, or renewing one, waits for the stream row's lock: normally
        an append in flight (milliseconds); longer means a writer that is stuck or gone."""
        return max(10, round(self.lease / 4 * 1000))

    def _connect_first(self) -> psycopg.Connection[Any]:
        try:
            return self.connect()
        except psycopg.Error as exc:
            raise StoreError(f"{self.url}: cannot connect: {_first_line(exc)}") from exc

    def _setup(self, db: psycopg.Connection[Any]) -> None:
        try:
            found = self._check_schema(db)
            if self.read_only:
                if not found:
                    raise StoreError(
                        f"{self.url}: no store in schema {self.schema!r} (opened read-only, so "
                        f"nothing was created)"
                    )
                return
            if _SNAPSHOTS in found:
                return
            with db.transaction():
                # Two hosts opening a new database at once: one creates, the other waits.
                db.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema),))
                found = self._check_schema(db)
                if not found:
                    self._create_schema(db)
                elif _SNAPSHOTS not in found:
                    self._add_snapshots(db)
        except psycopg.Error as exc:
            raise StoreError(f"{self.url} is not a usable PostgreSQL store: "
                             f"{_first_line(exc)}") from exc

    def _check_schema(self, db: psycopg.Connection[Any]) -> frozenset[str]:
        """Our tables that are there (checking they are ours); empty if none is."""
        rows = db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "AND table_name LIKE 'nous\\_inbox\\_%%'", (self.schema,),
        ).fetchall()
        tables = frozenset(name for (name,) in rows)
        if not tables:
            return tables
        if not tables >= _TABLES:
            raise StoreError(f"{self.url} is not a usable PostgreSQL store: schema "
                             f"{self.schema!r} has only {', '.join(sorted(tables))}")
        meta = dict(db.execute(f"SELECT key, value FROM {self._t_meta}").fetchall())
        if meta.get("format") != FORMAT_NAME:
            raise StoreError(f"{self.url} is not a usable PostgreSQL store: not a nous-inbox "
                             f"store (meta format {meta.get('format')!r})")
        for key, ours in (("version", SCHEMA_VERSION), ("tables", TABLES_VERSION)):
            try:
                theirs = int(meta.get(key, ""))
            except (TypeError, ValueError):
                raise DecodeError(f"{self.url}: invalid {key} {meta.get(key)!r} in meta") from None
            if theirs > ours:
                raise DecodeError(
                    f"{self.url}: written with {key} {theirs}, newer than this nous-inbox "
                    f"reads ({ours}); upgrade nous-inbox to read it"
                )
        return tables

    def _add_snapshots(self, db: psycopg.Connection[Any]) -> None:
        """Add the snapshots table to a store made before it came with the others (inside the
        opening transaction, under its lock). Without the privilege to, the store opens all the
        same: it keeps no snapshots, and says so."""
        try:
            with db.transaction():  # a savepoint: a refusal leaves the opening transaction usable
                self._create_snapshots(db)
        except psycopg.errors.InsufficientPrivilege as exc:
            logger.warning("%s: cannot add the snapshots table (%s); no snapshots are kept until "
                           "a role with CREATE on schema %r opens the store", self.url,
                           _first_line(exc), self.schema)

    def _create_snapshots(self, db: psycopg.Connection[Any]) -> None:
        db.execute(f"CREATE TABLE IF NOT EXISTS {self._t_snapshots} ("
                   ' stream text COLLATE "C" PRIMARY KEY, seq bigint NOT NULL,'
                   " body bytea NOT NULL)")

    def _create_schema(self, db: psycopg.Connection[Any]) -> None:
        db.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        db.execute(f"CREATE TABLE {self._t_meta} (key text PRIMARY KEY, value text NOT NULL)")
        db.execute(
            f"CREATE TABLE {self._t_streams} ("
            ' stream text COLLATE "C" PRIMARY KEY, version bigint NOT NULL DEFAULT 0,'
            " holder text, pid integer, host text, epoch bigint NOT NULL DEFAULT 0,"
            " expires timestamptz)"
        )
        db.execute(
            f"CREATE TABLE {self._t_events} ("
            ' stream text COLLATE "C" NOT NULL, seq bigint NOT NULL, body bytea NOT NULL,'
            " batch uuid, PRIMARY KEY (stream, seq))"
        )
        self._create_snapshots(db)
        with db.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {self._t_meta} (key, value) VALUES (%s, %s)",
                [("format", FORMAT_NAME), ("version", str(SCHEMA_VERSION)),
                 ("tables", str(TABLES_VERSION))],
            )

    def _connection(self) -> psycopg.Connection[Any]:
        """The live connection, made again if the last one broke (call with the lock)."""
        if self._closed:
            raise ValueError(f"{self.url} store is closed")
        db = self._db
        if db is None or db.closed or db.broken:
            self._db = None
            if db is not None:
                with contextlib.suppress(Exception):
                    db.close()
            db = self._db = self.connect()
        return db

    def _retrying(self, what: str, work: Callable[[psycopg.Connection[Any]], Any],
                  recover: Callable[[psycopg.Connection[Any]], Any] | None = None) -> Any:
        """Run ``work(connection)`` under the lock, reconnecting after a lost connection.

        The pauses between attempts are made without the lock (the only wait the store makes
        on its own), and the attempts stop ``reconnect`` seconds after the first.

        After a loss, ``recover(connection)`` (when given) runs first on the new connection; a
        result other than ``None`` is returned instead of running ``work`` again.
        """
        deadline = time.monotonic() + self._reconnect
        pause = 0.02
        lost = False
        with self._lock:
            while True:
                db: psycopg.Connection[Any] | None = None
                try:
                    db = self._connection()
                    if lost and recover is not None:
                        found = recover(db)
                        if found is not None:
                            return found
                    return work(db)
                except psycopg.Error as exc:
                    gone = db is None or db.closed or db.broken
                    if not gone or not isinstance(exc, psycopg.OperationalError
                                                  | psycopg.InterfaceError):
                        raise StoreError(f"{self.url}: {what} failed: {_first_line(exc)}") from exc
                    if time.monotonic() + pause > deadline:
                        raise StoreError(
                            f"{self.url}: {what} failed: lost the connection and could not get "
                            f"it back within {self._reconnect:g}s: {_first_line(exc)}"
                        ) from exc
                    lost = True
                    logger.info("%s: lost the connection during %s; reconnecting", self.url, what)
                    self._pause.wait(pause)  # the lock is free meanwhile (see __init__)
                    pause = min(pause * 2, 0.5)

    # -- the protocol ----------------------------------------------------------------------------

    def _append_retrying(
        self, stream: str, events: Sequence[Event], expected_version: int | None,
    ) -> list[Event]:
        """Append in one transaction, fenced when this store owns the stream; see the module.

        A connection lost on the way is made again, and the batch looked for before the append
        is tried again, so it is written once whether or not the lost attempt committed.
        """
        batch = uuid.uuid4()
        deadline = time.monotonic() + self._reconnect

        def attempt(db: psycopg.Connection[Any]) -> list[Event]:
            self._local.floor = expected_version or 0
            return self._append_once(stream, events, expected_version, batch)

        def recover(db: psycopg.Connection[Any]) -> list[Event] | None:
            # The lost attempt may still be committing: taking the stream row's lock waits for
            # its transaction to end either way (the INSERT waits for one that was creating the
            # row), so the look that follows sees its outcome. That wait is bounded by what is
            # left of ``reconnect``: a lost attempt whose server process lives on, idle in its
            # transaction, ends within ``max(1, lease/2)`` seconds (see ``connect``).
            left = max(50, round((deadline - time.monotonic()) * 1000))
            try:
                with db.transaction():
                    db.execute(f"SET LOCAL lock_timeout = {left}")
                    db.execute(f"INSERT INTO {self._t_streams} (stream) VALUES (%s) "
                               f"ON CONFLICT DO NOTHING", (stream,))
                    db.execute(f"SELECT 1 FROM {self._t_streams} WHERE stream = %s FOR UPDATE",
                               (stream,))
                    rows = db.execute(
                        f"SELECT seq, body FROM {self._t_events} WHERE stream = %s AND seq > %s "
                        f"AND batch = %s ORDER BY seq",
                        (stream, getattr(self._local, "floor", 0), batch),
                    ).fetchall()
            except psycopg.errors.LockNotAvailable as exc:
                raise StoreError(
                    f"{self.url}: append to stream {stream!r}: lost the connection, and the lost "
                    f"attempt still held the stream {self._reconnect:g}s later, so whether it "
                    f"was written is not known; read the stream to see"
                ) from exc
            return [self._row(stream, seq, body) for seq, body in rows] if rows else None

        stored: list[Event] = self._retrying(f"append to stream {stream!r}", attempt, recover)
        return stored

    @contextlib.contextmanager
    def _appending(self, stream: str) -> Iterator[int]:
        """One transaction holding the stream row's lock, fenced by the lease this store holds."""
        db = self._connection()
        with self._state:
            held = self._held.get(stream)
        if held is not None and held.lost:
            raise self._lost(stream, held)
        # Pipelined: BEGIN and the row lock go out together, and the writes and the COMMIT
        # together, so an append costs two round trips to the server, not six.
        with db.pipeline(), db.transaction():
            for _ in range(2):
                row = db.execute(
                    f"SELECT version, holder, epoch FROM {self._t_streams} WHERE stream = %s "
                    f"FOR UPDATE", (stream,),
                ).fetchone()
                if row is not None:
                    break
                db.execute(f"INSERT INTO {self._t_streams} (stream) VALUES (%s) "
                           f"ON CONFLICT DO NOTHING", (stream,))
            if row is None:
                raise StoreError(f"{self.url}: the row of stream {stream!r} vanished")
            if held is not None and (row[1], row[2]) != (held.token, held.epoch):
                held.lost = True
                raise self._lost(stream, held)
            self._local.floor = version = int(row[0])
            yield version

    def _write(self, stream: str, events: list[Event], records: list[bytes], *,
               batch: object | None = None) -> None:
        """Move the stream row on, insert the events with the batch id, and notify."""
        db = self._connection()
        db.execute(f"UPDATE {self._t_streams} SET version = %s WHERE stream = %s",
                   (events[-1].seq, stream))
        # One statement for the whole batch, however many events: the rows travel as two arrays.
        db.execute(
            f"INSERT INTO {self._t_events} (stream, seq, body, batch) "
            f"SELECT %s, u.seq, u.body, %s FROM unnest(%s::bigint[], %s::bytea[]) AS u(seq, body)",
            (stream, batch, [event.seq for event in events], records),
        )
        db.execute("SELECT pg_notify(%s, %s)", (self.channel, stream))

    def _lost(self, stream: str, held: PostgresLease) -> LeaseLostError:
        return LeaseLostError(
            f"stream {stream!r} of {self.url}: this owner's lease (epoch {held.epoch}) expired "
            f"and was taken over; nothing was written", stream=stream, epoch=held.epoch,
        )

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        return self._pages(stream, after)

    def _pages(self, stream: str, after: int) -> Iterator[Event]:
        # A page of rows at a time, the lock taken per page: nothing stays locked or open while
        # the caller iterates.
        query = (f"SELECT seq, body FROM {self._t_events} WHERE stream = %s AND seq > %s "
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
            lambda db: db.execute(f"SELECT version FROM {self._t_streams} WHERE stream = %s",
                                  (stream,)).fetchone(),
        )
        return 0 if row is None else int(row[0])

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        # The stream's snapshot, one row, replaced (save_snapshot decided it should be). No DDL
        # here: the table is made on open, so a role that may only write the tables saves too.
        table = self._t_snapshots

        def save(db: psycopg.Connection[Any]) -> bool:
            try:
                db.execute(f"INSERT INTO {table} (stream, seq, body) VALUES (%s, %s, %s) "
                           "ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq, "
                           "body = excluded.body", (stream, seq, data))
            except psycopg.errors.UndefinedTable:
                return False  # a store without the table keeps none (see _add_snapshots)
            return True

        kept: bool = self._retrying(f"snapshot of stream {stream!r}", save)
        return kept

    def _snapshot_seq(self, stream: str) -> int | None:
        table = self._t_snapshots

        def seq(db: psycopg.Connection[Any]) -> Any:  # the seq alone, not the body
            try:
                return db.execute(f"SELECT seq FROM {table} WHERE stream = %s",
                                  (stream,)).fetchone()
            except psycopg.errors.UndefinedTable:  # a store made before the table
                return None

        row = self._retrying(f"snapshot of stream {stream!r}", seq)
        return None if row is None else int(row[0])

    def _load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        table = self._t_snapshots

        def load(db: psycopg.Connection[Any]) -> Any:
            try:
                return db.execute(f"SELECT seq, body FROM {table} WHERE stream = %s",
                                  (stream,)).fetchone()
            except psycopg.errors.UndefinedTable:  # a store made before the table
                return None

        row = self._retrying(f"snapshot of stream {stream!r}", load)
        return None if row is None else (int(row[0]), bytes(row[1]))

    def _stream_names(self) -> list[str]:
        rows = self._retrying(
            "listing the streams",
            lambda db: db.execute(f"SELECT stream FROM {self._t_streams} WHERE version > 0 "
                                  f"ORDER BY stream").fetchall(),
        )
        return [name for (name,) in rows]

    def own(self, stream: str) -> PostgresLease:
        """Take ``stream``'s lease row, or raise ``StreamOwnedError``; see the module docstring."""
        lease = super().own(stream)
        assert isinstance(lease, PostgresLease)
        return lease

    def _own(self, stream: str) -> PostgresLease:
        """The template's hook: take the lease row (see the module docstring)."""
        with self._state:
            if stream in self._held:
                raise owned_error(stream, self.url, os.getpid())
        token = uuid.uuid4().hex

        def take(db: psycopg.Connection[Any]) -> tuple[int, int | None]:
            try:
                with db.transaction():
                    # A row lock held longer than this is a writer stuck or cut off mid-append:
                    # the stream is in use, so it is refused as owned rather than waited for.
                    db.execute(f"SET LOCAL lock_timeout = {self._lock_wait_ms}")
                    db.execute(f"INSERT INTO {self._t_streams} (stream) VALUES (%s) "
                               f"ON CONFLICT DO NOTHING", (stream,))
                    row = db.execute(
                        f"UPDATE {self._t_streams} SET holder = %s, pid = %s, host = %s, "
                        f"epoch = epoch + 1, "
                        f"expires = clock_timestamp() + make_interval(secs => %s) "
                        f"WHERE stream = %s AND (holder IS NULL OR expires < clock_timestamp()) "
                        f"RETURNING epoch", (token, os.getpid(), self._host, self.lease, stream),
                    ).fetchone()
                    if row is not None:
                        return int(row[0]), None
                    other = db.execute(f"SELECT pid FROM {self._t_streams} WHERE stream = %s",
                                       (stream,)).fetchone()
                    return 0, (None if other is None else other[0])
            except psycopg.errors.LockNotAvailable:
                return 0, None

        def recover(db: psycopg.Connection[Any]) -> tuple[int, int | None] | None:
            row = db.execute(f"SELECT epoch FROM {self._t_streams} WHERE stream = %s "
                             f"AND holder = %s", (stream, token)).fetchone()
            return None if row is None else (int(row[0]), None)

        epoch, pid = self._retrying(f"owning stream {stream!r}", take, recover)
        if not epoch:
            raise owned_error(stream, self.url, pid)
        lease = PostgresLease(stream, lambda: self._release(stream, token), token, epoch)
        with self._state:
            closed = self._closed
            if not closed:
                self._held[stream] = lease
                self._start_background()
        if closed:  # closed while we took it: give it straight back
            self._release(stream, token)
            raise ValueError(f"{self.url} store is closed")
        return lease

    def _release(self, stream: str, token: str) -> None:
        with self._state:
            held = self._held.get(stream)
            if held is not None and held.token == token:
                del self._held[stream]
        with self._lock:
            self._release_row(stream, token)

    def _release_row(self, stream: str, token: str) -> None:
        # One try: if the server cannot be reached the lease simply expires. Once the store is
        # closing, its connection is used while it is still open, else (a lease taken as the
        # store closed) a connection of its own.
        query = (f"UPDATE {self._t_streams} SET holder = NULL, pid = NULL, host = NULL, "
                 f"expires = NULL WHERE stream = %s AND holder = %s")
        try:
            db = self._connection() if not self._closed else self._db
            if db is not None and not db.closed:
                db.execute(query, (stream, token))
            else:
                with self.connect() as own:
                    own.execute(query, (stream, token))
        except (psycopg.Error, ValueError) as exc:
            logger.warning("%s: could not release the lease of %r (it will expire): %s",
                           self.url, stream, _first_line(exc))

    def subscribe(self, stream: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when ``stream`` may have changed; returns the unsubscribe function.

        A hint, never a report: it comes once as soon as the store listens for the stream (on
        this thread, if it already does), then on a notification for the stream, after every
        reconnect of the listening connection, and every ``poll`` seconds as a backstop, from a
        background thread. Keep it quick (set an event); read the version to see what changed.
        """
        check_stream(stream)
        with self._state:
            self._check_open()
            self._subscribers.setdefault(stream, []).append(callback)
            self._start_background()
            assert self._background is not None
            listening = self._background.ready
        if listening:
            # Already listening: a send made before this subscription sent its notification
            # to nobody, so check now rather than at the next poll. (Not yet listening: the
            # background thread nudges every subscriber once it is.)
            callback()

        def unsubscribe() -> None:
            with self._state:
                callbacks = self._subscribers.get(stream, [])
                with contextlib.suppress(ValueError):
                    callbacks.remove(callback)
                if not callbacks:
                    self._subscribers.pop(stream, None)

        return unsubscribe


    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"PostgresStore({self.url!r}{mode})"

    # -- internals -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.url} store is closed")

    def _start_background(self) -> None:
        if self._background is None:
            self._background = _Background(self)

    def _row(self, stream: str, seq: int, body: Any) -> Event:
        where = f"{self.url} stream {stream!r} seq {seq}"
        if type(body) is not bytes:
            raise DecodeError(f"{where}: the stored body is {type(body).__name__}, not bytes")
        event: Event = self._format.decode(body, Event, where, self.max_record_size)
        if event.seq != seq:
            raise DecodeError(f"{where}: the stored event says seq {event.seq}")
        return event

    def _release_all(self) -> None:
        """The template's hook, first thing in ``close`` (without the lock): mark the store
        closed, release every lease (one try each: one that cannot be released expires), then
        stop the background thread and wait for it, so it renews and nudges nothing after
        ``close`` returned."""
        with self._state:
            if self._closed:
                return
            self._closed = True  # nothing new is owned or subscribed from here on
            held = list(self._held.values())
            self._subscribers.clear()
        for lease in held:
            lease.release()
        with self._state:
            background, self._background = self._background, None
        if background is not None:
            background.stop()

    def _close(self) -> None:
        """The template's hook, after ``_release_all``: close the connection."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(psycopg.Error):
                db.close()

    # -- for the background thread ---------------------------------------------------------------

    def _nudge(self, stream: str | None) -> None:
        """Call the subscribers of ``stream`` (of every stream for ``None``)."""
        with self._state:
            if stream is None:
                callbacks = [c for cs in self._subscribers.values() for c in cs]
            else:
                callbacks = list(self._subscribers.get(stream, ()))
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("%s: a subscriber of %r failed", self.url, stream)

    def _renew(self, db: psycopg.Connection[Any]) -> None:
        """Renew every lease held, on the background connection, each waiting at most L/4
        (``lock_timeout``) for a row a stuck writer holds: that lease is renewed at the next
        round, and the others are not held up by it. Behind a transaction pooler the bound is
        set per renewal (``SET LOCAL`` in a transaction of its own), as a session setting would
        stay on the pooled server connection; otherwise the background connection has it."""
        with self._state:
            held = list(self._held.values())
        pooled = self.pooler == "transaction"
        renew = (f"UPDATE {self._t_streams} SET expires = clock_timestamp() + "
                 f"make_interval(secs => %s) WHERE stream = %s AND holder = %s "
                 f"AND epoch = %s RETURNING 1")
        for lease in held:
            if lease.lost or lease.released:
                continue
            values = (self.lease, lease.stream, lease.token, lease.epoch)
            try:
                if pooled:
                    with db.transaction():
                        db.execute(f"SET LOCAL lock_timeout = {self._lock_wait_ms}")
                        row = db.execute(renew, values).fetchone()
                else:
                    row = db.execute(renew, values).fetchone()
            except psycopg.errors.LockNotAvailable:
                logger.info("%s: the row of stream %r is locked by a stuck writer; its lease is "
                            "renewed at the next round", self.url, lease.stream)
                continue
            if row is None and not lease.released:
                lease.lost = True
                logger.warning("%s: the lease of stream %r (epoch %d) was taken over",
                               self.url, lease.stream, lease.epoch)


class _Background:
    """One thread and connection per store: renews leases, LISTENs, nudges subscribers."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self.ready = False  # listening (or, behind a transaction pooler, connected)
        self._stop = threading.Event()
        # A pipe stop() writes to, so a thread waiting for notifications wakes at once.
        self._wake_read, self._wake_write = os.pipe()
        self._pipe_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"nous-inbox {store.url}",
                                        daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Stop the thread; with ``wait``, return once it renews and nudges no more, or after
        10 s at most: it wakes at once, unless a connection attempt (``connect_timeout``) or a
        renewal (bounded by ``lock_timeout`` and the TCP keepalives) is under way, and such a
        call may outlive the wait; it renews nothing after it (the store is closed)."""
        self._stop.set()
        with self._pipe_lock:
            if self._wake_write >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._wake_write, b"x")
        if wait and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            with self._pipe_lock:
                os.close(self._wake_read)
                os.close(self._wake_write)
                self._wake_read = self._wake_write = -1

    def _serve(self) -> None:
        store = self._store
        renew_every = store.lease / 3
        tick = min(renew_every, store.poll, 0.2)
        listening = store.pooler != "transaction"
        while not self._stop.is_set():
            db: psycopg.Connection[Any] | None = None
            # The streams notified, however their notifications were read: by the handler,
            # which psycopg calls for those that arrive during any statement (a renewal's, say:
            # read off the socket then, they would not make it readable again), and below.
            arrived: list[str] = []
            try:
                db = store.connect()
                if listening:
                    db.add_notify_handler(functools.partial(_collect, arrived))
                    db.execute(f"LISTEN {store.channel}")
                    # (behind a transaction pooler, a session setting would outlive us there)
                    db.execute(f"SET lock_timeout = {store._lock_wait_ms}")
                with store._state:
                    self.ready = True  # a subscriber from now on is nudged as it subscribes
                store._nudge(None)  # anything sent while nobody listened
                renewed = polled = time.monotonic()
                store._renew(db)
                while not self._stop.is_set():
                    if listening:
                        readable, _, _ = select.select([db.fileno(), self._wake_read], [], [],
                                                       tick)
                        if self._stop.is_set():
                            return
                        if db.fileno() in readable:
                            _read_notifications(db, arrived)
                        if arrived:  # on every pass, whoever read them
                            streams = list(dict.fromkeys(arrived))
                            arrived.clear()
                            for stream in streams:
                                store._nudge(stream)
                    else:
                        self._stop.wait(tick)
                    now = time.monotonic()
                    if now - renewed >= renew_every:
                        store._renew(db)
                        renewed = now
                    if now - polled >= store.poll:
                        store._nudge(None)
                        polled = now
            except psycopg.Error as exc:
                logger.info("%s: background connection failed (%s); reconnecting", store.url,
                            _first_line(exc))
                self._stop.wait(0.1)
            except Exception:
                logger.exception("%s: background thread failed; restarting it", store.url)
                self._stop.wait(0.5)
            finally:
                self.ready = False
                if db is not None:
                    with contextlib.suppress(Exception):
                        db.close()


def _collect(into: list[str], note: psycopg.Notify) -> None:
    into.append(note.payload)


def _read_notifications(db: psycopg.Connection[Any], into: list[str]) -> None:
    """Read the notifications waiting on ``db``'s socket into ``into``, without a round trip.

    (``Connection.notifies`` would do it, but psycopg 3.3 warns when it is used beside a notify
    handler, and psycopg 3.2 hands a notification read during a statement to the handlers
    alone: the handler is what sees them all.)
    """
    pgconn = db.pgconn
    pgconn.consume_input()
    encoding = db.info.encoding
    while (note := pgconn.notifies()) is not None:
        into.append(note.extra.decode(encoding))


def _lock_key(schema: str) -> int:
    return int.from_bytes(hashlib.sha256(f"nous-inbox:{schema}".encode()).digest()[:8], "big",
                          signed=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
