"""The Store protocol: where a session's event log lives, and the rules every store keeps.

A store holds named streams (one per session). Each stream is an append-only run of events
numbered 1, 2, 3, ... by the store itself, so two writers can never both think they wrote seq 7.
An append is all or nothing, and may say which version it expects the stream to be at
(optimistic concurrency): if another writer got there first, the append raises
:class:`~nous_inbox.errors.ConcurrencyError` and writes nothing.

>>> from nous_inbox.store import open_store
>>> from nous_inbox.events import Warned
>>> with open_store("memory:") as store:
...     stored = store.append("s1", [Warned(text="a"), Warned(text="b")], expected_version=0)
...     [e.seq for e in stored], store.version("s1"), store.streams()
([1, 2], 2, ['s1'])

One process runs a session (its owner); ``own(stream)`` takes the stream's
:class:`~nous_inbox.store.lease.OwnerLease`, so a second owner, in this process or another, is
refused with :class:`~nous_inbox.errors.StreamOwnedError` instead of running the session twice.
Appending needs no lease: anyone may send a message to a session someone else owns. Deleting
does: ``delete(stream)`` removes a stream's events and snapshot at once, made by the owner
through its own store or under a lease taken for it, and refused while another owner holds one.

``version`` is meant to be polled: it is how an owner in one process notices what another process
appended, so every store answers it cheaply (a dict lookup, a ``stat``, an index seek).

A store acknowledges only what it has proved it can read back: every event of an append is
proved to read back before anything is written, either encoded in the store's own format and
decoded again or, for a plain send or claim, judged by its fields
(:func:`~nous_inbox.store.base.proof.reads_back`, the exact type and range of each, held to the
decoders by a property test). One that would not come
back equal (a bare ``str`` where a message belongs, an unknown target, a ``wakeup`` that is not
a bool, a time that is not a finite number) is refused with a ``TypeError`` or ``ValueError``
naming its index and the field, and nothing is written. So a hand-built event can never poison
a log for its other readers.

Writing a store. :class:`StoreBase` does the shared work once: it checks names, expected
versions and events, refuses writes to a read-only store, numbers and time-stamps events,
encodes them in the store's :class:`~nous_inbox.codec.LogFormat`, enforces the size limit and
proves each record decodes. A store implements only a few hooks: ``_appending`` (exclude other
writers and say the stream's version), ``_write`` (keep the encoded batch), ``_read``,
``_version``, ``_stream_names``, ``_check_open`` and ``_close``; see their docstrings. Two more
are optional, ``_save_snapshot`` and ``_load_snapshot``: where a store keeps its snapshots
(:mod:`nous_inbox.store.snapshot`); without them it keeps none, and every session replays in full.
``_delete`` removes a stream; without it ``delete`` is refused. A store whose leases or appends are not the local kind overrides ``_own`` and ``_release_all``
(leases held elsewhere) or ``_append_retrying`` (an append retried after a lost connection, its
batch identified so a retry never writes it twice).

Its parts: :mod:`~nous_inbox.store.base.protocol` (the protocol and the helpers every store
shares), :mod:`~nous_inbox.store.base.template` (:class:`StoreBase`) and
:mod:`~nous_inbox.store.base.proof` (the read-back proof).

Stream names are non-empty strings of at most 256 characters without control characters;
anything else is a ``ValueError`` naming it.
"""

from nous_inbox.codec import MAX_STREAM_NAME
from nous_inbox.store.base.protocol import (
    STORE_ENV,
    Moved,
    Store,
    StoreLockedError,
    append_identity,
    append_once,
    check_max_record_size,
    check_stream,
    default_store_path,
    default_store_url,
)
from nous_inbox.store.base.template import StoreBase

__all__ = [
    "MAX_STREAM_NAME",
    "STORE_ENV",
    "Moved",
    "Store",
    "StoreBase",
    "StoreLockedError",
    "append_identity",
    "append_once",
    "check_max_record_size",
    "check_stream",
    "default_store_path",
    "default_store_url",
]
