"""The PostgreSQL store's tables: made and versioned on open, in the URL's ``schema``.

::

    nous_inbox_meta      (key, value)                       format and schema versions
    nous_inbox_streams   (stream PK, version, holder, pid, host, epoch, expires, moved;
                          index on moved, the transaction that last moved the stream)
    nous_inbox_events    (stream, seq, body, batch; PK (stream, seq); index on batch)
    nous_inbox_snapshots (stream PK, seq, body)              the newest snapshot of each stream

All are made on first open. What a later version added beside the first layout (the snapshots
table, the index that finds an append by its identity, the streams' ``moved`` column and its
index) is added on the next writable open of an older store; the layout version is unchanged,
so older versions still open it. A role without CREATE on the schema (or not owning the
tables) cannot add them, and is told so in the log: without the snapshots table it keeps no
snapshots; without the index, finding an append by its identity reads the stream; without
``moved``, every look for the streams that moved lists them all.

>>> tables = Tables("agents", "postgresql:///db")
>>> tables.events
'"agents".nous_inbox_events'
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Final

import psycopg

from nous_inbox.codec import FORMAT_NAME
from nous_inbox.errors import DecodeError, StoreError
from nous_inbox.events import SCHEMA_VERSION
from nous_inbox.store.postgres.url import first_line

__all__ = ["TABLES_VERSION", "Tables"]

logger: Final = logging.getLogger("nous_inbox.store.postgres")

#: The layout of our tables; bumped (with a migration) when it changes.
TABLES_VERSION: Final = 1
#: The tables without which a schema is not a store (the later additions may be missing).
_REQUIRED: Final = frozenset({"nous_inbox_meta", "nous_inbox_streams", "nous_inbox_events"})
_SNAPSHOTS: Final = "nous_inbox_snapshots"
_BATCH_INDEX: Final = "nous_inbox_events_batch"
_MOVED_INDEX: Final = "nous_inbox_streams_moved"
_INDEXES: Final = frozenset({_BATCH_INDEX, _MOVED_INDEX})


class Tables:
    """The qualified names of one schema's tables, and the work of making and checking them."""

    def __init__(self, schema: str, url: str) -> None:
        self.schema = schema
        self.url = url
        q = f'"{schema}".'
        self.meta = q + "nous_inbox_meta"
        self.streams = q + "nous_inbox_streams"
        self.events = q + "nous_inbox_events"
        self.snapshots = q + _SNAPSHOTS
        #: Whether the streams table has its ``moved`` column and index (a store made before
        #: them, opened by a role that cannot add them, has not).
        self.moves = False

    def setup(self, db: psycopg.Connection[Any], read_only: bool) -> None:
        """Check the schema holds a store of ours, making (writable) what is missing."""
        try:
            found = self._check(db)
            if read_only:
                if not found:
                    raise StoreError(f"{self.url}: no store in schema {self.schema!r} (opened "
                                     f"read-only, so nothing was created)")
                self.moves = _MOVED_INDEX in found
                return
            self.moves = _MOVED_INDEX in found
            if _SNAPSHOTS in found and found >= _INDEXES:
                return
            with db.transaction():
                # Two hosts opening a new database at once: one creates, the other waits.
                db.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema),))
                found = self._check(db)
                if not found:
                    self._create(db)
                    self.moves = True
                    return
                if _SNAPSHOTS not in found:
                    self._add(db, f"CREATE TABLE IF NOT EXISTS {self.snapshots} ({_SNAPSHOT_COLUMNS})",
                              "the snapshots table", "no snapshots are kept")
                if _BATCH_INDEX not in found:
                    self._add(db, self._batch_index(), "the index of append identities",
                              "finding an append by its identity reads the stream")
                self.moves = _MOVED_INDEX in found or self._add(
                    db, f"ALTER TABLE {self.streams} ADD COLUMN IF NOT EXISTS {_MOVED_COLUMN}; "
                        f"{self._moved_index()}",
                    "the streams' moved column", "every look for the streams that moved lists "
                    "them all")
        except psycopg.Error as exc:
            raise StoreError(f"{self.url} is not a usable PostgreSQL store: "
                             f"{first_line(exc)}") from exc

    def _check(self, db: psycopg.Connection[Any]) -> frozenset[str]:
        """Our tables and index that are there (checking they are ours); empty if none is."""
        rows = db.execute(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'i') "
            "AND relname LIKE 'nous\\_inbox\\_%%'", (self.schema,),
        ).fetchall()
        found = frozenset(name for (name,) in rows)
        if not found:
            return found
        if not found >= _REQUIRED:
            tables = sorted(found - _INDEXES - {n for n in found if n.endswith("_pkey")})
            raise StoreError(f"{self.url} is not a usable PostgreSQL store: schema "
                             f"{self.schema!r} has only {', '.join(tables)}")
        meta = dict(db.execute(f"SELECT key, value FROM {self.meta}").fetchall())
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
        return found

    def _add(self, db: psycopg.Connection[Any], ddl: str, what: str, without: str) -> bool:
        """Add what a later version made beside the first layout (inside the opening
        transaction, under its lock); without the privilege to, the store opens all the same.
        Whether it was added."""
        try:
            with db.transaction():  # a savepoint: a refusal leaves the opening transaction usable
                db.execute(ddl)
            return True
        except psycopg.errors.InsufficientPrivilege as exc:
            logger.warning("%s: cannot add %s (%s); %s until a role with CREATE on schema %r "
                           "opens the store", self.url, what, first_line(exc), without,
                           self.schema)
            return False

    def _moved_index(self) -> str:
        return f"CREATE INDEX IF NOT EXISTS {_MOVED_INDEX} ON {self.streams} (moved)"

    def _batch_index(self) -> str:
        return f"CREATE INDEX IF NOT EXISTS {_BATCH_INDEX} ON {self.events} (batch)"

    def _create(self, db: psycopg.Connection[Any]) -> None:
        db.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        db.execute(f"CREATE TABLE {self.meta} (key text PRIMARY KEY, value text NOT NULL)")
        db.execute(
            f"CREATE TABLE {self.streams} ("
            ' stream text COLLATE "C" PRIMARY KEY, version bigint NOT NULL DEFAULT 0,'
            " holder text, pid integer, host text, epoch bigint NOT NULL DEFAULT 0,"
            f" expires timestamptz, {_MOVED_COLUMN})"
        )
        db.execute(self._moved_index())
        db.execute(
            f"CREATE TABLE {self.events} ("
            ' stream text COLLATE "C" NOT NULL, seq bigint NOT NULL, body bytea NOT NULL,'
            " batch uuid, PRIMARY KEY (stream, seq))"
        )
        db.execute(self._batch_index())
        db.execute(f"CREATE TABLE {self.snapshots} ({_SNAPSHOT_COLUMNS})")
        with db.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {self.meta} (key, value) VALUES (%s, %s)",
                [("format", FORMAT_NAME), ("version", str(SCHEMA_VERSION)),
                 ("tables", str(TABLES_VERSION))],
            )


#: The transaction that last moved the stream (an append, a delete; 0: none since the column
#: came): a look for what moved reads the rows of transactions it may not have seen yet.
_MOVED_COLUMN: Final = "moved xid8 NOT NULL DEFAULT '0'"
_SNAPSHOT_COLUMNS: Final = ('stream text COLLATE "C" PRIMARY KEY, seq bigint NOT NULL, '
                            "body bytea NOT NULL")


def _lock_key(schema: str) -> int:
    return int.from_bytes(hashlib.sha256(f"nous-inbox:{schema}".encode()).digest()[:8], "big",
                          signed=True)
