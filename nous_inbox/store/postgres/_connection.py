"""How the PostgreSQL store connects, and retries a call whose connection was lost.

Every connection bounds its waits (the server ends a transaction of ours left idle, TCP
keepalives on both ends notice a dead peer), and :meth:`Connecting._retrying` makes a call again
on a new connection until ``reconnect`` runs out, telling a lost session (try again) from the
server's definite refusal of a statement (nothing was done).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Final

import psycopg

from nous_inbox.errors import StoreError
from nous_inbox.store.postgres.url import first_line

__all__ = ["Connecting"]

#: Server errors that mean the session is gone (class 08: connection exceptions; the backend
#: terminated, the server shutting down or crashed, our idle transaction ended by its timer).
_GONE: Final = frozenset({"57P01", "57P02", "57P03", "25P03"})
#: How long a NOTIFY may take to reach a listener through a session pooler before the probe of
#: :meth:`Connecting._open` takes it as never coming (it comes in milliseconds).
_PROBE_WAIT: Final = 5.0
#: The server process each connection of ours was answered by when it was made (the same for its
#: life, unless a transaction pooler, where none is kept): libpq's own is a pooler's key.
_SERVER_PIDS: Final[weakref.WeakKeyDictionary[psycopg.Connection[Any], int]] = (
    weakref.WeakKeyDictionary())


class Connecting:
    """The store's connections: what :class:`~nous_inbox.store.postgres.PostgresStore` does to
    reach its server (a mixin of it; the names below are the store's)."""

    url: str
    lease: float
    pooler: str | None
    _conninfo: str
    _libpq_keys: frozenset[str]
    _connect_timeout: float | None
    reconnect: float
    _closed: bool
    _db: psycopg.Connection[Any] | None
    _lock: threading.Lock | threading.RLock
    _pause: threading.Condition
    _local: threading.local

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection to the store's database, with its waits bounded.

        A host cut off mid-transaction leaves its server process holding the stream row's lock
        until the server notices, hours with the defaults. So the connection ends a transaction
        left idle for ``max(1, lease/2)`` s (``idle_in_transaction_session_timeout``), and TCP
        keepalives on both ends (libpq's ``keepalives*``, unless the URL sets them, and the
        server's ``tcp_keepalives_*``) notice a dead peer within about ``lease`` + 3 s. Behind a
        transaction pooler no session setting is made (it would stay on the pooled server
        connection, for other clients) and no statement is prepared: set the pooler's or the
        role's own (``ALTER ROLE ... SET idle_in_transaction_session_timeout``).
        """
        return self._connect()[0]

    def _connect(self) -> tuple[psycopg.Connection[Any], bool]:
        """:meth:`connect`, and whether the connection may pass through a pooler: the server
        process answering is not the one libpq was told of at login (a pooler gives its clients
        keys of its own), or, behind a declared transaction pooler, not asked."""
        prepare = None if self.pooler == "transaction" else 5
        extra: dict[str, Any] = {}
        if self._connect_timeout is not None:  # else the user's own applies
            extra["connect_timeout"] = max(1, round(self._connect_timeout))
        if not any(key.startswith("keepalives") for key in self._libpq_keys):
            extra.update(keepalives=1, keepalives_idle=self._keepalive_idle,
                         keepalives_interval=1, keepalives_count=3)
        for attempt in (1, 2):
            db = psycopg.connect(self._conninfo, autocommit=True, prepare_threshold=prepare,
                                 **extra)
            if self.pooler == "transaction":
                return db, True
            try:
                row = db.execute(
                    "SELECT pg_backend_pid(), "
                    "set_config('idle_in_transaction_session_timeout', %s, false), "
                    "set_config('tcp_keepalives_idle', %s, false), "
                    "set_config('tcp_keepalives_interval', '1', false), "
                    "set_config('tcp_keepalives_count', '3', false)",
                    (str(self._idle_limit_ms), str(self._keepalive_idle)),
                ).fetchone()
                if row is None:
                    raise psycopg.ProgrammingError("the answer had no row")
            except psycopg.ProgrammingError as exc:
                # Answered with no rows: an answer to someone else's statement (a session
                # pooler that handed over a server connection whose last client was killed
                # mid-query, with its reset's answer still to come). Ours would then answer our
                # next statement: the connection is out of step, so it goes.
                db.close()
                if attempt == 2:
                    raise psycopg.OperationalError(
                        f"the server answered the connection's first statement with another's "
                        f"answer ({first_line(exc)}), twice") from exc
                continue
            except BaseException:
                db.close()
                raise
            _SERVER_PIDS[db] = row[0]
            return db, row[0] != db.info.backend_pid
        raise AssertionError("unreachable")

    def _open(self) -> psycopg.Connection[Any]:
        """The store's first connection, refused behind a transaction pooler not declared.

        Such a pooler hands each transaction of a client whichever server connection is free:
        the session settings of :meth:`connect` would land on other clients' connections,
        prepared statements would be missing, and a LISTEN would hear nothing, so wake-ups would
        wait for the poll. A connection straight to the server costs nothing more to tell (its
        server process is the one it logged in to). Behind a pooler, the store listens on this
        connection and notifies from a second one: a session keeps its LISTEN and hears it; in
        transaction pooling an idle client has no server connection to hear it on, whichever
        server connections the pooler picks. Errors as ``psycopg.Error``; the refusal as
        ``StoreError`` naming what to set.
        """
        db, pooled = self._connect()
        if not pooled or self.pooler == "transaction":
            return db
        try:
            if not _keeps_its_session(db, self.connect):
                given = f"pooler={self.pooler}" if self.pooler else "no pooler="
                raise StoreError(
                    f"{self.url}: the server is reached through a pooler in transaction mode "
                    f"(a LISTEN made on one of the store's connections did not hear a NOTIFY: "
                    f"its session does not stay with it), and the URL says {given}: add "
                    f"pooler=transaction to the URL (no session settings, no prepared "
                    f"statements, wake-ups by polling every poll= seconds), or connect directly "
                    f"or through session pooling")
        except BaseException:
            db.close()
            raise
        return db

    @property
    def backend_pid(self) -> int | None:
        """The server process of the store's main connection (``pg_stat_activity.pid``), or
        ``None`` while it has none (closed, or lost and not made again yet; behind a transaction
        pooler, always: each transaction may run on another). Behind a session pooler it is the
        server's process, not the pooler's key libpq was given. An operator finds the store's
        session by it: what it waits on, or ``pg_terminate_backend`` to cut it. It waits for
        nothing, not even a call stalled on the connection. With a connection of your own,
        ``admin``::

            admin.execute("SELECT wait_event_type, query FROM pg_stat_activity WHERE pid = %s",
                          (store.backend_pid,))
        """
        db = self._db  # (one read: a call may replace it meanwhile)
        if db is None or db.closed or db.broken:
            return None
        return _SERVER_PIDS.get(db)

    @property
    def _idle_limit_ms(self) -> int:
        """How long the server lets one of our transactions sit idle (see :meth:`connect`)."""
        return round(max(1.0, self.lease / 2) * 1000)

    @property
    def _keepalive_idle(self) -> int:
        return max(1, round(self.lease))

    @property
    def _lock_wait_ms(self) -> int:
        """How long taking or renewing a lease waits for the stream row's lock: normally an
        append in flight (milliseconds); longer means a writer that is stuck or gone."""
        return max(10, round(self.lease / 4 * 1000))

    def _connection(self) -> psycopg.Connection[Any]:
        """The live connection, made again if the last one broke (call with the lock)."""
        if self._closed:
            raise ValueError(f"{self.url} store is closed")
        db = self._db
        if db is None or db.closed or db.broken:
            self._drop(db)
            db = self._db = self.connect()
        return db

    def _drop(self, db: psycopg.Connection[Any] | None) -> None:
        """Let go of a connection whose session is gone or in an unknown state."""
        if db is self._db:
            self._db = None
        if db is not None:
            with contextlib.suppress(Exception):
                db.close()

    def _retrying(self, what: str, work: Callable[[psycopg.Connection[Any]], Any],
                  recover: Callable[[psycopg.Connection[Any]], Any] | None = None,
                  unknown: Callable[[str], Exception | None] | None = None) -> Any:
        """Run ``work(connection)`` under the lock, reconnecting after a lost connection.

        After a loss, ``recover(connection)`` (when given) runs first on the new connection; a
        result other than ``None`` is returned instead of running ``work`` again. The attempts
        stop ``reconnect`` seconds after the first loss (``_local.deadline``; a host paused in
        the call has lost nothing of its budget), the pauses between them made without the
        lock. Giving up, the error is ``unknown(reason)`` when that is not ``None`` (the last
        attempt may have written), else ``StoreError`` saying nothing was done.
        """
        pause = 0.02
        lost = False
        deadline = 0.0
        with self._lock:
            while True:
                db: psycopg.Connection[Any] | None = None
                recovering = False
                try:
                    db = self._connection()
                    if lost and recover is not None:
                        recovering = True
                        found = recover(db)
                        if found is not None:
                            return found
                        recovering = False
                    return work(db)
                except psycopg.Error as exc:
                    if not _session_lost(exc, db):  # refused by the server: nothing was done
                        error = unknown(first_line(exc)) if recovering and unknown else None
                        if error is not None:  # ... by this attempt; the lost one may have
                            raise error from exc
                        done = "; nothing was written" if unknown is not None else ""
                        raise StoreError(f"{self.url}: {what} failed: {first_line(exc)}{done}"
                                         ) from exc
                    self._drop(db)
                    if not lost:
                        deadline = self._local.deadline = time.monotonic() + self.reconnect
                    if time.monotonic() + pause > deadline:
                        reason = (f"lost the connection and could not get it back within "
                                  f"{self.reconnect:g}s: {first_line(exc)}")
                        error = unknown(reason) if unknown is not None else None
                        if error is not None:
                            raise error from exc
                        raise StoreError(f"{self.url}: {what} failed: {reason}; nothing was "
                                         f"done") from exc
                    lost = True
                    self._pause.wait(pause)  # the lock is free meanwhile
                    pause = min(pause * 2, 0.5)

def _keeps_its_session(db: psycopg.Connection[Any],
                       connect: Callable[[], psycopg.Connection[Any]]) -> bool:
    """Whether ``db``'s session stays with it between transactions: a LISTEN made on it hears
    a NOTIFY from another connection (``connect()``) while it waits outside any transaction."""
    channel = f"nous_inbox_probe_{uuid.uuid4().hex}"
    db.execute(f"LISTEN {channel}")
    try:
        heard_by_sender: list[psycopg.Notify] = []
        with connect() as sender:
            # (A handler, as a notification read during the NOTIFY itself is handed to those.)
            sender.add_notify_handler(heard_by_sender.append)
            sender.execute(f"NOTIFY {channel}")
        if heard_by_sender:  # the pooler gave the sender the listening server connection
            return False
        return any(True for _ in db.notifies(timeout=_PROBE_WAIT, stop_after=1))
    finally:
        with contextlib.suppress(psycopg.Error):
            db.execute(f"UNLISTEN {channel}")


def _session_lost(exc: psycopg.Error, db: psycopg.Connection[Any] | None) -> bool:
    """Whether ``exc`` left the session gone or in an unknown state (try again on a new one),
    rather than being the server's definite refusal of a statement (nothing was done)."""
    if db is None or db.closed or db.broken:
        return True
    state = exc.sqlstate
    if state is None:  # raised by the client: a broken protocol state, a lost socket
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return state.startswith("08") or state in _GONE
