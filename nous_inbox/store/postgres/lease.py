"""Leases in PostgreSQL rows, renewed by a background thread that also listens for wake-ups.

A process dying frees nothing in a server, so ``own(stream)`` takes a *lease* in the stream's
row: a holder token, the holder's pid and host, and an expiry on the database's clock (``lease``
seconds ahead). Taking it bumps the row's ``epoch``, the fencing token every append of the owner
carries: an owner whose lease expired and was taken over writes nothing, however late its
append arrives (``LeaseLostError``). One :class:`Background` thread per store, on a connection
of its own, renews every lease held every third of the lease, LISTENs for the store's channel,
and calls the subscribers: on a notification for their stream, after a reconnect (a notification
sent while nobody listened is lost), and every ``poll`` seconds as a backstop.

Renewals never wait for the store's main connection or its lock, so a call stalled there (a row
lock, a reconnect) costs no lease. Taking a lease waits at most ``lease/4`` for the stream row's
lock, and a renewal as long: a row locked longer is a writer stuck or gone, and ``own`` refuses
the stream as owned rather than wait; that renewal is made at the next round.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import psycopg

from nous_inbox.store.base import check_stream
from nous_inbox.store.lease import OwnerLease, owned_error
from nous_inbox.store.postgres._connection import Connecting
from nous_inbox.store.postgres.schema import Tables
from nous_inbox.store.postgres.url import first_line

__all__ = ["Background", "Leasing", "PostgresLease"]

logger: Final = logging.getLogger("nous_inbox.store.postgres")


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


def _take_row(store: Leasing, db: psycopg.Connection[Any], stream: str,
             token: str) -> tuple[int, int | None]:
    """Take ``stream``'s row for ``token``: ``(epoch, None)``, or ``(0, holder's pid)`` when
    another holds it (the pid ``None`` when a writer has the row locked)."""
    streams = store.tables.streams
    try:
        with db.transaction():
            # A row lock held longer than this is a writer stuck or cut off mid-append: the
            # stream is in use, so it is refused as owned rather than waited for.
            db.execute(f"SET LOCAL lock_timeout = {store._lock_wait_ms}")
            db.execute(f"INSERT INTO {streams} (stream) VALUES (%s) ON CONFLICT DO NOTHING",
                       (stream,))
            row = db.execute(
                f"UPDATE {streams} SET holder = %s, pid = %s, host = %s, epoch = epoch + 1, "
                f"expires = clock_timestamp() + make_interval(secs => %s) "
                f"WHERE stream = %s AND (holder IS NULL OR expires < clock_timestamp()) "
                f"RETURNING epoch", (token, os.getpid(), store._host, store.lease, stream),
            ).fetchone()
            if row is not None:
                return int(row[0]), None
            other = db.execute(f"SELECT pid FROM {streams} WHERE stream = %s",
                               (stream,)).fetchone()
            return 0, (None if other is None else other[0])
    except psycopg.errors.LockNotAvailable:
        return 0, None


def _held_epoch(store: Leasing, db: psycopg.Connection[Any], stream: str,
               token: str) -> tuple[int, int | None] | None:
    """``(epoch, None)`` when ``token`` holds ``stream`` (a take whose answer was lost), else None."""
    row = db.execute(f"SELECT epoch FROM {store.tables.streams} WHERE stream = %s "
                     f"AND holder = %s", (stream, token)).fetchone()
    return None if row is None else (int(row[0]), None)


#: What a notification's payload starts with when a lease was given back (a stream name holds
#: no control character, so it cannot be mistaken for an append's).
RELEASED: Final = "\x07"


def _release_row(store: Leasing, db: psycopg.Connection[Any], stream: str,
                token: str) -> None:
    """Clear ``stream``'s lease if ``token`` still holds it, and say so on the store's channel,
    so a host waiting to take the stream takes it at once rather than at lease expiry."""
    db.execute(f"WITH freed AS (UPDATE {store.tables.streams} SET holder = NULL, pid = NULL, "
               f"host = NULL, expires = NULL WHERE stream = %s AND holder = %s RETURNING stream) "
               f"SELECT pg_notify(%s, %s || stream) FROM freed",
               (stream, token, store.channel, RELEASED))


class Leasing(Connecting):
    """The store's leases and subscriptions: what :class:`~nous_inbox.store.postgres.PostgresStore`
    does beside its log (a mixin of it; the names below are the store's)."""

    poll: float
    channel: str
    tables: Tables
    _host: str
    _state: threading.Lock
    _held: dict[str, PostgresLease]
    _subscribers: dict[str, list[Callable[[], None]]]
    _released: list[Callable[[str], None]]
    _background: Background | None
    _check_open: Callable[[], None]  # the store's: raise if it was closed

    def _own(self, stream: str) -> PostgresLease:
        """The template's hook: take the lease row."""
        with self._state:
            if stream in self._held:
                raise owned_error(stream, self.url, os.getpid())
        token = uuid.uuid4().hex
        epoch, pid = self._retrying(
            f"owning stream {stream!r}", lambda db: _take_row(self, db, stream, token),
            lambda db: _held_epoch(self, db, stream, token))
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

    def _holds(self, stream: str) -> bool:
        """The template's hook: whether this store holds ``stream``'s lease row."""
        with self._state:
            return stream in self._held

    def _release(self, stream: str, token: str) -> None:
        """Give the lease row back: one try; if the server cannot be reached the lease expires."""
        with self._state:
            held = self._held.get(stream)
            if held is not None and held.token == token:
                del self._held[stream]
        with self._lock:
            try:
                # Closing: its connection while it is still open, else (a lease taken as the
                # store closed) a connection of its own.
                db = self._connection() if not self._closed else self._db
                if db is not None and not db.closed:
                    _release_row(self, db, stream, token)
                else:
                    with self.connect() as own:
                        _release_row(self, own, stream, token)
            except (psycopg.Error, ValueError) as exc:
                logger.warning("%s: could not release the lease of %r (it will expire): %s",
                               self.url, stream, first_line(exc))

    def subscribe_released(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(stream)`` when any store on this database gives ``stream``'s lease
        back (an owner closed, a host drained): a hint, from the background thread, that the
        stream can be taken now; returns the unsubscribe function. Keep it quick."""
        with self._state:
            self._check_open()
            self._released.append(callback)
            self._start_background()

        def unsubscribe() -> None:
            with self._state, contextlib.suppress(ValueError):
                self._released.remove(callback)

        return unsubscribe

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
            # A send made before this subscription notified nobody: check now, not at the next
            # poll. (Not yet listening: the background thread nudges everyone once it is.)
            callback()

        def unsubscribe() -> None:
            with self._state:
                callbacks = self._subscribers.get(stream, [])
                with contextlib.suppress(ValueError):
                    callbacks.remove(callback)
                if not callbacks:
                    self._subscribers.pop(stream, None)

        return unsubscribe

    @property
    def listening(self) -> bool:
        """Whether the store's background connection is up: renewing the leases the store
        holds and listening for its subscribers' streams (behind a transaction pooler:
        connected, its subscribers polled). ``False`` until a lease or a subscription starts
        it, while it reconnects, and once the store is closed: what a health check reads, and
        how to know a subscription is live before relying on its wake-ups::

            unsubscribe = store.subscribe("s", woken.set)
            healthy = store.listening  # False: no lease is renewed, no notification heard
        """
        with self._state:
            return self._background is not None and self._background.ready

    def _start_background(self) -> None:
        if self._background is None:
            self._background = Background(self)

    def _release_all(self) -> None:
        """The template's hook, first in ``close`` (without the lock): mark the store closed,
        release every lease (one try each), then stop the background thread and wait for it,
        so it renews and nudges nothing after ``close`` returned."""
        with self._state:
            if self._closed:
                return
            self._closed = True  # nothing new is owned or subscribed from here on
            held = list(self._held.values())
            self._subscribers.clear()
            self._released.clear()
        for lease in held:
            lease.release()
        with self._state:
            background, self._background = self._background, None
        if background is not None:
            background.stop()

    def _nudge(self, stream: str | None) -> None:
        """Call the subscribers of ``stream`` (of every stream for ``None``); a released lease's
        notification, those of :meth:`subscribe_released`."""
        if stream is not None and stream.startswith(RELEASED):
            with self._state:
                released = list(self._released)
            for hear in released:
                try:
                    hear(stream[1:])
                except Exception:
                    logger.exception("%s: a subscriber of released leases failed", self.url)
            return
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


class Background:
    """One thread and connection per store: renews leases, LISTENs, nudges subscribers."""

    def __init__(self, store: Leasing) -> None:
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
                self._renew(db)
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
                        self._renew(db)
                        renewed = now
                    if now - polled >= store.poll:
                        store._nudge(None)
                        polled = now
            except psycopg.Error as exc:
                logger.info("%s: background connection failed (%s); reconnecting", store.url,
                            first_line(exc))
                self._stop.wait(0.1)
            except Exception:
                logger.exception("%s: background thread failed; restarting it", store.url)
                self._stop.wait(0.5)
            finally:
                self.ready = False
                if db is not None:
                    with contextlib.suppress(Exception):
                        db.close()

    def _renew(self, db: psycopg.Connection[Any]) -> None:
        """Renew every lease held, each waiting at most L/4 (``lock_timeout``) for a row a stuck
        writer holds: that lease is renewed at the next round, the others are not held up.
        Behind a transaction pooler the bound is set per renewal (``SET LOCAL`` in a
        transaction of its own), as a session setting would stay on the pooled connection."""
        store = self._store
        with store._state:
            held = list(store._held.values())
        pooled = store.pooler == "transaction"
        renew = (f"UPDATE {store.tables.streams} SET expires = clock_timestamp() + "
                 f"make_interval(secs => %s) WHERE stream = %s AND holder = %s "
                 f"AND epoch = %s RETURNING 1")
        for lease in held:
            if lease.lost or lease.released:
                continue
            values = (store.lease, lease.stream, lease.token, lease.epoch)
            try:
                if pooled:
                    with db.transaction():
                        db.execute(f"SET LOCAL lock_timeout = {store._lock_wait_ms}")
                        row = db.execute(renew, values).fetchone()
                else:
                    row = db.execute(renew, values).fetchone()
            except psycopg.errors.LockNotAvailable:
                logger.info("%s: the row of stream %r is locked by a stuck writer; its lease is "
                            "renewed at the next round", store.url, lease.stream)
                continue
            if row is None and not lease.released:
                lease.lost = True
                logger.warning("%s: the lease of stream %r (epoch %d) was taken over",
                               store.url, lease.stream, lease.epoch)


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
