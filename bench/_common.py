"""What several benchmarks share: sender threads let go at once, and SQLite's raw limit.

Senders wait at a barrier and are timed from its release, so thread start-up is not measured and
every sender competes from its first send.

The raw limit is what a durable send on ``sqlite:`` cannot beat: one thread inserting rows by hand
with the store's pragmas (WAL, ``synchronous = FULL``) on the same disk. The owner and mailbox
benchmarks set their group commits against it, measured the same way.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["RAW_BODY", "RAW_ROWS", "all_at_once", "postgres_url", "raw_db", "raw_limit",
           "raw_transaction"]


def all_at_once(senders: Sequence[Callable[[], object]]) -> float:
    """Run each of ``senders`` on a thread of its own, all let go at once; the seconds from
    their start to the last one's end."""
    started = threading.Barrier(len(senders) + 1)

    def run(send: Callable[[], object]) -> None:
        started.wait()
        send()

    threads = [threading.Thread(target=run, args=(send,)) for send in senders]
    for thread in threads:
        thread.start()
    started.wait()
    begin = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - begin


#: The rows per transaction of the raw limit: what 8 senders would share at best.
RAW_ROWS = 8


#: An event-sized row body for the raw transactions: what a send's record weighs.
RAW_BODY = (b'{"type":"message_sent","seq":1,"at":1700000000.0,"target":"next_step",'
             b'"wakeup":false,"message":{"role":"user","content":"s0m0"}}')


def raw_db(path: Path) -> sqlite3.Connection:
    """A SQLite file with the store's pragmas and an events table, written by hand. Any thread
    may use the connection (``check_same_thread=False``): under a group commit, whichever sender
    leads a batch commits it, one at a time."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute("CREATE TABLE events (stream TEXT NOT NULL, seq INTEGER NOT NULL, "
               "body BLOB NOT NULL, PRIMARY KEY (stream, seq))")
    return db


def raw_transaction(db: sqlite3.Connection, first: int, rows: int,
                    body: bytes = RAW_BODY) -> None:
    """Insert ``rows`` rows of ``body`` from seq ``first`` in one transaction."""
    db.execute("BEGIN IMMEDIATE")
    db.executemany("INSERT INTO events (stream, seq, body) VALUES (?, ?, ?)",
                   [("bench", seq, body) for seq in range(first, first + rows)])
    db.execute("COMMIT")


def raw_limit(path: Path, total: int, rows: int = RAW_ROWS, body: bytes = RAW_BODY) -> float:
    """Rows per second one thread inserts into SQLite, ``rows`` per transaction, with the
    store's pragmas and a row of ``body`` (by default event-sized): the limit a durable send
    cannot beat."""
    db = raw_db(path)
    try:
        begin = time.perf_counter()
        for first in range(0, total, rows):
            raw_transaction(db, first, min(rows, total - first), body)
        return total / (time.perf_counter() - begin)
    finally:
        db.close()


@contextlib.contextmanager
def postgres_url() -> Iterator[str | None]:
    """A store URL on a schema of its own in the tests' private PostgreSQL (started for the run,
    or the server ``NOUS_INBOX_TEST_POSTGRES`` names), dropped afterwards; ``None``, said on
    stderr, when no server can be had."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.postgres_server import Unavailable, server

    try:
        with server() as running:
            url, schema = running.fresh_url()
            try:
                yield url
            finally:
                running.drop(schema)
    except Unavailable as exc:
        print(f"(no PostgreSQL server: {exc})", file=sys.stderr)
        yield None
