"""The SQLite store's writes at the level of its connection: a write transaction whose lock
timeout says so, the database file made private, and inserts of many rows in one statement.

>>> insert_statement(2)
'INSERT INTO events (stream, seq, body) VALUES (?, ?, ?), (?, ?, ?)'
"""

from __future__ import annotations

import functools
import os
import sqlite3
from types import TracebackType
from typing import Final

from nous_inbox.store.base import StoreLockedError

__all__ = ["ROWS", "Transaction", "create_private", "insert_statement"]

#: The most rows one INSERT carries (3 variables each).
ROWS: Final = 64


@functools.cache
def insert_statement(rows: int) -> str:
    """The INSERT of ``rows`` events in one statement."""
    return "INSERT INTO events (stream, seq, body) VALUES " + ", ".join(["(?, ?, ?)"] * rows)


class Transaction:
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


def create_private(path: str) -> None:
    """Create the database file at ``path``, mode 0600, unless it exists."""
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
