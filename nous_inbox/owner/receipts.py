"""Where a session's sends went, as an owner, the command line and the web face ask it; and a
withdraw from any process.

Every answer is a :class:`~nous_inbox.receipts.Receipt` from :mod:`nous_inbox.receipts` (the one
home of "where did send N go"). An owner keeps a :class:`SendReceipts` beside its session: it
answers a queued send from the session value, a send it saw settle while someone waited for it
from what it folded, and any other from the log. A writer that does not hold the session (the
``nous-inbox withdraw`` command, a web host for a session held elsewhere) withdraws with
:func:`request_withdraw` and asks with :func:`receipt_in`.

A withdraw is the mailbox's model: a message still queued is taken back (a ``MessageWithdrawn``
is recorded, so replay agrees); one already claimed answers where it went (which turn, which
step), and one withdrawn already says so; nothing fails silently.

>>> from nous_inbox.store import open_store
>>> from nous_inbox.store.journal import send_to
>>> store = open_store("memory:")
>>> sent = send_to(store, "s", "scratch that", "next_step", True)
>>> print(receipt_in(store, "s", sent.seq))
the message sent at seq 1 is still queued on next_step
>>> print(request_withdraw(store, "s", sent.seq))
the message sent at seq 1 was withdrawn (event #2)
>>> print(request_withdraw(store, "s", sent.seq))          # a second time: where it went
the message sent at seq 1 was withdrawn (event #2)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from nous_inbox.events import Event, MessageWithdrawn
from nous_inbox.receipts import Deliveries, Receipt, receipt
from nous_inbox.session import Session
from nous_inbox.store import Store
from nous_inbox.store.base import check_stream
from nous_inbox.store.journal import Journal

__all__ = ["SendReceipts", "receipt_in", "request_withdraw", "withdrawing"]

_WITHDRAWN: Final = "withdrawn"


def withdrawing(sent: int) -> Callable[[Session], tuple[Sequence[Event], MessageWithdrawn | None]]:
    """The change (for :meth:`Journal.commit <nous_inbox.store.journal.Journal.commit>`) that
    withdraws the message the send at ``sent`` queued, if it is still queued
    (:meth:`Session.withdraw <nous_inbox.session.Session.withdraw>` decides): every withdraw,
    an owner's or another process's, commits this."""

    def change(session: Session) -> tuple[Sequence[Event], MessageWithdrawn | None]:
        event = session.withdraw(sent)
        return ((event,) if event is not None else ()), event

    return change


def _taken_back(event: MessageWithdrawn) -> Receipt:
    return Receipt(sent=event.sent, target=event.target, state=_WITHDRAWN, by=event.seq)


def request_withdraw(store: Store, stream: str, sent: int) -> Receipt:
    """Withdraw the message the send at seq ``sent`` queued on ``stream``, wherever its owner
    runs: record a ``MessageWithdrawn`` its owner folds in, or, when the message is no longer
    queued, answer where it went. ``LookupError`` / ``ValueError`` when ``sent`` is no send of
    the stream (see :func:`~nous_inbox.receipts.receipt`)."""
    check_stream(stream)
    journal = Journal(store, stream, transcript=False, snapshot_every=0)
    _, event = journal.commit(withdrawing(sent))
    if event is not None:
        return _taken_back(event)
    return receipt(store.read(stream), sent)


def receipt_in(store: Store, stream: str, sent: int) -> Receipt:
    """Where the send at seq ``sent`` of ``stream`` went, read from the store's log."""
    check_stream(stream)
    return receipt(store.read(stream), sent)


class SendReceipts:
    """What an owner answers about where its sends went (``read(after)``: the stored events with
    ``seq > after``, for a send that settled before anyone asked).

    :meth:`fold` sees every batch the owner folds (under its lock) and keeps the receipts of
    the sends someone :meth:`watch` es, so a waiter is answered without reading the log; the
    rest is not kept, so a long session costs it no more than its queues. An owner asks
    :meth:`now` under its lock and :meth:`logged` after releasing it, so reading a long log
    never holds up its sends and its run.
    """

    __slots__ = ("_deliveries", "_guard", "_read", "_settled", "_watchers")

    def __init__(self, read: Callable[[int], Iterable[Event]]) -> None:
        self._read = read
        self._deliveries = Deliveries()
        self._watchers: dict[int, int] = {}  # seq -> how many wait for it
        self._settled: dict[int, Receipt] = {}  # of the watched sends that settled
        self._guard = threading.Lock()  # watch and fold may run on different threads

    def start(self, session: Session) -> None:
        """The owner opened on ``session``: follow what is folded from now on."""
        self._deliveries = Deliveries(session)

    def fold(self, events: Sequence[Event]) -> bool:
        """Fold ``events`` in; whether a watched send settled among them."""
        heard = False
        for settled in self._deliveries.fold(events):
            with self._guard:
                if settled.sent in self._watchers:
                    self._settled[settled.sent] = settled
                    heard = True
        return heard

    def watch(self, sent: int) -> None:
        """Someone waits for the send at ``sent``: keep its receipt when it settles."""
        with self._guard:
            self._watchers[sent] = self._watchers.get(sent, 0) + 1

    def unwatch(self, sent: int) -> None:
        """One wait for the send at ``sent`` is over."""
        with self._guard:
            left = self._watchers.pop(sent, 1) - 1
            if left:
                self._watchers[sent] = left
            else:
                self._settled.pop(sent, None)

    def now(self, session: Session, sent: int) -> Receipt | None:
        """The receipt of the send at ``sent`` without reading the log: queued in ``session``
        (the owner's, as it stands), or settled while watched; ``None``: ask :meth:`logged`.
        ``LookupError`` for a seq beyond the session."""
        where = session.inbox.holds(sent)  # (checks sent: an int >= 1)
        if where is not None:
            return Receipt(sent=sent, target=where, state="queued")
        if sent > session.version:
            raise LookupError(f"no event at seq {sent} (the session is at seq {session.version})")
        return self._settled.get(sent)

    def logged(self, sent: int) -> Receipt:
        """The receipt of the send at ``sent``, read from the whole log (I/O)."""
        return receipt(self._read(0), sent)

    def withdraw(self, journal: Journal, sent: int) -> Receipt | None:
        """Withdraw through the owner's ``journal`` (under its lock; store I/O): the message
        taken back, or where it went as :meth:`now` says (``None``: ask :meth:`logged`, once
        the lock is released, since it reads the whole log)."""
        _, event = journal.commit(withdrawing(sent))
        return _taken_back(event) if event is not None else self.now(journal.session, sent)
