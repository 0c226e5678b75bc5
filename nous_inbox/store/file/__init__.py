"""FileStore (``file:PATH``): every session's events in one JSON Lines file you can ``tail -f``.

The file is a header line, then one :class:`~nous_inbox.codec.Record` a line: the stream name and
the event. An append of several events is one ``write()`` of several lines, then ``fsync``, so an
acknowledged append is on disk.

>>> import tempfile, os
>>> from nous_inbox.events import Warned
>>> path = os.path.join(tempfile.mkdtemp(), "inbox.jsonl")
>>> with FileStore(path) as store:
...     _ = store.append("s1", [Warned(text="a", at=1.0), Warned(text="b", at=1.0)])
>>> print(open(path).read(), end="")
{"format":"nous-inbox","version":5}
{"stream":"s1","event":{"type":"warned","text":"a","seq":1,"at":1.0},"more":1}
{"stream":"s1","event":{"type":"warned","text":"b","seq":2,"at":1.0}}
>>> with FileStore(path, read_only=True) as store:
...     [e.text for e in store.read("s1")]
['a', 'b']

Writers. Each append takes an exclusive ``flock`` on the file, catches up with what others wrote,
checks the expected version, writes, syncs and lets go. So writers in several processes take
turns (a CLI can steer a session whose owner has the file open), and one that cannot get the
lock within ``lock_timeout`` seconds (10 by default; ``open_store(url, lock_timeout=...)``)
gets a :class:`~nous_inbox.store.base.StoreLockedError`. The wait blocks the calling thread,
an asyncio loop's included: an owner's sends run on its worker thread, but a direct
``store.append`` from a coroutine should go through ``asyncio.to_thread``. A write that fails
(a full disk, a quota) is a :class:`~nous_inbox.errors.StoreError` naming the store and the
stream, and leaves the file as it was.
Readers never lock. ``read_only=True`` opens without write access at all: the file must exist
(else :class:`~nous_inbox.errors.StoreError`), nothing is created, locked or cut off (a torn tail
is left where it is and simply not read), and ``append``/``own`` raise ``ValueError``.

Owners. ``own(stream)`` locks ``PATH.owners/<hash>.lock`` (see :mod:`nous_inbox.store.lease`),
next to the log's real path, so every store on this log, in any process, sees the lease.
Snapshots (:mod:`nous_inbox.store.snapshot`) live beside it in ``PATH.snapshots/<hash>.snapshot``,
private files replaced atomically (see :mod:`nous_inbox.store._snapshots`).

Its parts: :mod:`~nous_inbox.store.file.log` (the file: header, records, torn tails, crash
safety), :mod:`~nous_inbox.store.file.index` (what is read of each stream, and how) and
:mod:`~nous_inbox.store.file.store` (the store).

Deleting a stream (``store.delete``, ``nous-inbox rm``) writes a copy of the file without the
stream's records beside it (mode 0600, a new name, never through a link), syncs it and renames
it over the log, so a crash leaves the old file or the new one, never half of one. A store
that has the old file open notices its name is gone and opens the new one.
"""

from nous_inbox.store.file.store import FileStore

__all__ = ["FileStore"]
