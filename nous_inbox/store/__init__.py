"""Stores: where event logs live. ``open_store(url)`` picks one by its URL.

=====================  ===========================================================================
URL                    store
=====================  ===========================================================================
``memory:``            :class:`MemoryStore`: a dict in this process, for tests and experiments
``file:PATH``          :class:`FileStore`: one JSON Lines file, every session's events, fsynced
``sqlite:PATH``        :class:`SqliteStore`: the embedded default, safe with many processes
``postgresql://...``   ``PostgresStore`` (:mod:`nous_inbox.store.postgres`, needs the ``postgres``
                       extra): one database shared by many machines, leases that expire
``PATH``               a bare path (no scheme) is a SQLite file
=====================  ===========================================================================

>>> with open_store("memory:") as store:
...     store.version("nobody")
0
>>> open_store("redis://localhost")
Traceback (most recent call last):
...
ValueError: unknown store scheme 'redis' in 'redis://localhost' (use memory:, file:PATH, sqlite:PATH, postgresql://... or a path)

``open_store(url, read_only=True)`` opens a store only to look: it must already exist (else
:class:`~nous_inbox.errors.StoreError` saying there is no store there), nothing is created or
repaired, and ``append``/``own`` raise ``ValueError``. ``memory:`` read-only is an empty store.

>>> open_store("sqlite:/nonexistent/inbox.sqlite", read_only=True)
Traceback (most recent call last):
...
nous_inbox.errors.StoreError: sqlite:/nonexistent/inbox.sqlite: no store at /nonexistent/inbox.sqlite (opened read-only, so nothing was created)

Each store hands out owner leases, :class:`OwnerLease`, one per stream: see
:mod:`nous_inbox.store.lease`.

With no URL given, tools use :func:`default_store_url`: ``$NOUS_INBOX_STORE`` if set, else
``sqlite:$XDG_STATE_HOME/nous-inbox/inbox.sqlite`` (``~/.local/state`` when unset).
"""

from __future__ import annotations

import os
import re
from typing import Final

from nous_inbox.store.base import (
    MAX_STREAM_NAME,
    STORE_ENV,
    Moved,
    Store,
    StoreLockedError,
    append_once,
    check_stream,
    default_store_path,
    default_store_url,
)
from nous_inbox.store.file import FileStore
from nous_inbox.store.lease import OwnerLease
from nous_inbox.store.memory import MemoryStore
from nous_inbox.store.sqlite import SqliteStore

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "LOCK_TIMEOUT_ENV",
    "MAX_STREAM_NAME",
    "STORE_ENV",
    "FileStore",
    "MemoryStore",
    "Moved",
    "OwnerLease",
    "SqliteStore",
    "Store",
    "StoreLockedError",
    "append_once",
    "check_stream",
    "default_store_path",
    "default_store_url",
    "open_store",
]

LOCK_TIMEOUT_ENV: Final = "NOUS_INBOX_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT: Final = 10.0

# A scheme is two or more letters before a colon, so a path like "C:/x" stays a path.
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")


def open_store(
    url: str, *, read_only: bool = False, lock_timeout: float | None = None,
) -> Store:
    """Open the store ``url`` names: ``memory:``, ``file:PATH``, ``sqlite:PATH``, a bare path, or
    ``postgresql://...`` (``postgres://`` too).

    ``PATH`` may start with ``~``. An unknown scheme or a missing path is a ``ValueError``
    naming it; a path that cannot be opened as a store is a
    :class:`~nous_inbox.errors.StoreError`. ``read_only=True`` opens an existing store just to
    read it (see above).

    ``lock_timeout`` is how long, in seconds, an append to a ``file:`` or ``sqlite:`` store waits
    for another process's append before it gives up with
    :class:`~nous_inbox.store.base.StoreLockedError`; ``None`` takes ``$NOUS_INBOX_LOCK_TIMEOUT``,
    else 10. The wait blocks the calling thread (an asyncio loop's too: call ``append`` through
    ``asyncio.to_thread`` there, as the owner's worker thread does for its sends).

    >>> open_store("memory:", lock_timeout=-1)
    Traceback (most recent call last):
    ...
    ValueError: lock_timeout must be a number of seconds >= 0, got -1
    """
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a str, got {type(url).__name__}")
    timeout = _lock_timeout(lock_timeout)
    match = _SCHEME.match(url)
    if match is None:
        if not url:
            raise ValueError("store URL is empty")
        return SqliteStore(os.path.expanduser(url), read_only=read_only, busy_timeout=timeout)
    scheme = match.group(1).lower()
    rest = url[match.end():]
    if scheme == "memory":
        if rest:
            raise ValueError(f"memory: takes no path, got {url!r}")
        return MemoryStore(read_only=read_only)
    if scheme in ("postgresql", "postgres"):
        # Imported here: psycopg is an optional extra, and nothing else needs it.
        try:
            from nous_inbox.store.postgres import PostgresStore
        except ImportError as exc:
            raise ValueError(
                f"{url.split('@')[-1]!r} needs psycopg: pip install 'nous-inbox[postgres]' ({exc})"
            ) from None
        return PostgresStore(url, read_only=read_only)
    if scheme in ("file", "sqlite"):
        if not rest:
            raise ValueError(f"store URL {url!r} needs a path after {scheme}:")
        path = os.path.expanduser(rest)
        if scheme == "file":
            return FileStore(path, read_only=read_only, lock_timeout=timeout)
        return SqliteStore(path, read_only=read_only, busy_timeout=timeout)
    raise ValueError(
        f"unknown store scheme {match.group(1)!r} in {url!r} "
        f"(use memory:, file:PATH, sqlite:PATH, postgresql://... or a path)"
    )


def _lock_timeout(value: float | None) -> float:
    source = "lock_timeout"
    if value is None:
        text = os.environ.get(LOCK_TIMEOUT_ENV, "")
        if not text:
            return DEFAULT_LOCK_TIMEOUT
        source = f"${LOCK_TIMEOUT_ENV}"
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{source} must be a number of seconds >= 0, got {text!r}") from None
    if type(value) not in (int, float) or not 0 <= value < float("inf"):
        raise ValueError(f"{source} must be a number of seconds >= 0, got {value!r}")
    return float(value)
