"""PostgresStore (``postgresql://...``): sessions shared by many machines, one owner each.

When agent hosts run on several machines, a steer arrives at whichever web server took the
request, and any host may die mid-run, the log must live in a server they all reach. This store
keeps it in PostgreSQL through psycopg 3 (``pip install nous-inbox[postgres]``); nothing else in
the library imports psycopg. Its parts: :mod:`~nous_inbox.store.postgres.url` (which URLs it
takes), :mod:`~nous_inbox.store.postgres.schema` (its tables),
:mod:`~nous_inbox.store.postgres._connection` (connecting, and retrying a lost call),
:mod:`~nous_inbox.store.postgres.lease` (leases and wake-ups) and
:mod:`~nous_inbox.store.postgres.store` (the store and its appends).

An append is one transaction: it moves the stream's row from the expected version to the new
one (no match means :class:`~nous_inbox.errors.ConcurrencyError` and nothing written), inserts
the events (MessagePack bodies, as in the SQLite store) and notifies, all committed at once. The
row lock serialises writers of one stream; writers of different streams never wait for each
other. Every append this store makes to a stream it owns is fenced by its lease's epoch: an
owner whose lease expired and was taken over is refused with
:class:`~nous_inbox.errors.LeaseLostError` and writes nothing. A delete is one transaction fenced
the same way: the stream's events and snapshot go, its row stays at version 0 with its lease.

Unlike the local stores, where a lease dies with its process at once, a crashed or paused
host's sessions are taken over once its lease has expired, ``lease`` seconds after its last
renewal. Nothing the store does may outlast a lease it holds (``lease`` = L):

- renewals run every L/3 on a connection of their own and never wait for the main one;
- the server ends a transaction of ours left idle after ``max(1, L/2)`` s, and every append
  is shaped so that a host paused in the middle of one is such a transaction; TCP keepalives on
  both ends notice a dead peer within about L + 3 s;
- taking a lease waits at most L/4 for the stream row's lock, then refuses it as owned;
- ``reconnect`` (4/5 of L by default, at most 10 s) bounds the retries of a call whose
  connection was lost.

Lost answers. Every append has an identity, the caller's (``append(..., identity=...)``) or a
random one, stored with its events. When the connection is lost or the backend ends during an
append, the store reconnects and looks for that identity before it answers: found, the append
was committed and its events are returned; not found, it is made again. Only when it cannot
look within ``reconnect`` does it raise :class:`~nous_inbox.errors.OutcomeUnknownError`, whose
``identity`` a retry passes back so the append is written once whichever way it went.

Connection poolers. Behind a pooler in transaction mode (PgBouncer, say), pass
``pooler=transaction``: no prepared statements, no session settings (set the pooler's or the
role's own idle timeout), and, as such a pooler cannot hold a LISTEN, wake-ups from the polling
backstop alone. Leases are rows, not advisory locks, so they survive a pooler handing out other
connections. In session mode nothing needs saying. A transaction pooler not declared is refused
at open (``StoreError`` saying to add ``pooler=transaction``): behind any pooler the store checks,
as it opens, that a LISTEN on one of its connections hears a NOTIFY from another.

Connections. One for the store's calls, shared by its threads behind a lock, plus one for the
background thread once it owns or is subscribed to a stream. No pool: writes to one stream
serialise on its row anyway, and the owner's group commit already joins concurrent sends.
``store.backend_pid`` is the main connection's server process (find it in ``pg_stat_activity``);
``store.listening`` says whether the background connection is up, renewing and listening.

URL query parameters read by this store (libpq never sees them): ``schema`` (``public`` by
default), ``lease`` (seconds, 5), ``poll`` (seconds, 2), ``pooler`` (``transaction`` or
``session``), ``reconnect`` (seconds; 0 for no retry). Everything else is libpq's, as libpq
reads it, ``connect_timeout`` included (5 s when neither the URL nor ``PGCONNECT_TIMEOUT`` says).
"""

from nous_inbox.store.postgres.lease import PostgresLease
from nous_inbox.store.postgres.store import PostgresStore

__all__ = ["PostgresLease", "PostgresStore"]
