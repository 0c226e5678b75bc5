"""Group commit: sends that arrive while a transaction commits share the next one.

A durable store pays most of a send in its commit (a disk flush, a round trip), and that cost
barely grows with the rows in it. So an owner does not commit each send on its own: a send that
arrives while a commit is under way queues, and the next commit takes everything queued in one
atomic append. Every sender still returns only once the transaction holding its send committed,
so acknowledged means durable, and each sender's sends keep their order.

The rules live here once, with no threads and no event loop: :class:`GroupCommit` says who
commits next and what goes in a batch, how long a new leader waits for company, and who gets
which result; :func:`settle` says how a batch ends. Two pumps drive it: :func:`commit_in_threads`
(the threaded owner: the sender that finds no commit under way leads, the others wait on a lock
each) and the asyncio owner's store worker (one job per batch).

>>> from nous_inbox.events import Warned
>>> batcher = GroupCommit()
>>> first, second = Ticket(Warned(text="a")), Ticket(Warned(text="b"))
>>> batcher.queue(first), batcher.queue(second)     # the first leads; the second waits
(True, False)
>>> batch = batcher.take()
>>> outcomes = settle(lambda events: [e for e in events], [t.event for t in batch])
>>> batcher.finish(batch, outcomes, seconds=0.001) is None   # nothing queued meanwhile: idle
True
>>> second.result().text
'b'
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final, Generic, TypeVar

import attrs

from nous_inbox.errors import LeaseLostError, OutcomeUnknownError
from nous_inbox.events import Event

__all__ = [
    "GATHER_MAX_SECONDS", "GATHER_SECONDS", "GroupCommit", "GroupCommitState", "Outcome", "Ticket",
    "commit_in_threads", "copy_for_sender", "interrupted", "refused_unwritten", "settle",
]

W = TypeVar("W")

Outcome = tuple[Event, None] | tuple[None, BaseException]
"""How one send of a batch ended: stored (the event as stored), or the error its sender hears."""

#: How long a new leader may wait, at least, for the senders of the last round to queue again
#: (when a commit takes longer, half of its smoothed time) ...
GATHER_SECONDS: Final = 0.0005
#: ... and at most, whatever a commit takes.
GATHER_MAX_SECONDS: Final = 0.005

#: The refusals that prove a commit wrote nothing: raised before any I/O (bad input, a record too
#: large, an event that does not fold). Only these are worth trying again one event at a time.
_REFUSED: Final = (TypeError, ValueError)


class Ticket(Generic[W]):
    """One send waiting for a group commit: its ``event``, the ``waiter`` its pump wakes it with
    (a lock, a future), and how it ended (:meth:`result`)."""

    __slots__ = ("done", "error", "event", "stored", "waiter")

    def __init__(self, event: Event, waiter: W = None) -> None:  # type: ignore[assignment]
        self.event = event
        self.waiter = waiter
        self.done = False
        self.stored: Event | None = None
        self.error: BaseException | None = None

    def result(self) -> Event:
        """The event as stored, or raise the error this sender is to hear (its own copy)."""
        if self.error is not None:
            raise copy_for_sender(self.error)
        if self.stored is None:
            raise RuntimeError("this send has not been committed yet")
        return self.stored


@attrs.frozen
class GroupCommitState:
    """A group commit at one moment, as a host watches it: ``queued``, the sends waiting for a
    transaction to take them (a send backlog); ``committing``, whether a leader is gathering or
    committing (a send made now waits for it); ``senders``, how many senders the next leader
    waits for (those of the last round: one, and a lone sender never waits for company).
    An owner's :attr:`~nous_inbox.owner.Owner.group_commit` gives it.

    >>> GroupCommit().state()
    GroupCommitState(queued=0, committing=False, senders=1)
    """

    queued: int
    committing: bool
    senders: int


class GroupCommit(Generic[W]):
    """The queue of a group commit and its decisions; not locked (its pump holds a lock).

    * :meth:`queue` a ticket: ``True`` when no commit is under way, so the caller leads the next;
    * :meth:`gather` (the leader): how long to wait for company first. The senders of the last
      round (its batch, and those who queued while it committed) are likely back at once with
      their next sends; waiting for them, at most half a commit's smoothed time, makes one
      transaction of what would be two. A lone sender never waits, and the last sender it
      waits for takes the lead over (:meth:`queue`);
    * :meth:`take` everything queued as the batch; :meth:`finish` it with its outcomes, which
      names the ticket to lead the next batch (the first queued meanwhile), or ``None``: idle;
    * :meth:`withdraw` a ticket its sender gave up on, if no batch took it yet.
    """

    __slots__ = ("_commit_seconds", "_committing", "_gathering", "_leader", "_pending", "_senders")

    def __init__(self) -> None:
        self._pending: list[Ticket[W]] = []
        self._committing = False  # a leader is gathering or committing
        self._leader: Ticket[W] | None = None  # the ticket to lead, until it takes its batch
        self._gathering = False  # ... waiting for the senders of the last round
        self._senders = 1  # how many sent in the last round: whom the next leader waits for
        self._commit_seconds = 0.0  # a commit's time, smoothed: what bounds that wait

    @property
    def queued(self) -> int:
        """How many sends wait for a batch to take them."""
        return len(self._pending)

    @property
    def committing(self) -> bool:
        """Whether a leader is gathering or committing: a send queued now waits for it."""
        return self._committing

    @property
    def senders(self) -> int:
        """How many senders the next leader waits for (those of the last round)."""
        return self._senders

    def state(self) -> GroupCommitState:
        """What :attr:`queued`, :attr:`committing` and :attr:`senders` say now, as one value
        (read it under the lock its pump holds, so the three agree)."""
        return GroupCommitState(len(self._pending), self._committing, self._senders)

    def queue(self, ticket: Ticket[W]) -> bool:
        """Queue ``ticket``; whether its sender is to lead the next commit: none is under way,
        or the leader is gathering and this is the last sender it waits for (it takes the lead
        over rather than wake the leader, one thread wake-up less between two transactions;
        the old leader, its send in the batch, waits as a sender)."""
        self._pending.append(ticket)
        if not self._committing:
            self._committing, self._leader = True, ticket
            return True
        if self._gathering and len(self._pending) >= self._senders:
            self._gathering, self._leader = False, ticket
            return True
        return False

    def leads(self, ticket: Ticket[W]) -> bool:
        """Whether ``ticket``'s sender is (still) to lead: a gathering leader asks when its wait
        ends, as the last sender may have taken the lead over."""
        return self._leader is ticket

    def gather(self) -> float:
        """For the leader, before it takes: the seconds to wait for company (0: take now)."""
        if len(self._pending) >= self._senders:
            return 0.0
        self._gathering = True
        return min(max(GATHER_SECONDS, self._commit_seconds / 2), GATHER_MAX_SECONDS)

    def take(self) -> list[Ticket[W]]:
        """Everything queued, as the batch the leader commits now."""
        batch, self._pending, self._leader = self._pending, [], None
        self._gathering = False
        return batch

    def finish(
        self, batch: Sequence[Ticket[W]], outcomes: Sequence[Outcome], seconds: float
    ) -> Ticket[W] | None:
        """``batch`` ended with ``outcomes`` (one per ticket, in order) after ``seconds``: settle
        each ticket, and name the ticket to lead next (``None``: nothing queued, idle)."""
        for ticket, (stored, error) in zip(batch, outcomes, strict=True):
            ticket.stored, ticket.error, ticket.done = stored, error, True
        self._commit_seconds += (seconds - self._commit_seconds) / 4
        self._senders = max(len(batch) + len(self._pending), 1)
        return self._hand_over()

    def withdraw(self, ticket: Ticket[W]) -> tuple[bool, Ticket[W] | None]:
        """``ticket``'s sender gave up: whether it was taken back (no batch had it), and the
        ticket to wake as the next leader when the one that left was to lead."""
        taken_back = ticket in self._pending
        if taken_back:
            self._pending.remove(ticket)
        if self._leader is not ticket:
            return taken_back, None
        return taken_back, self._hand_over()

    def _hand_over(self) -> Ticket[W] | None:
        self._gathering = False
        if self._pending:
            self._leader = self._pending[0]
            return self._leader
        self._committing, self._leader = False, None
        return None


def settle(commit: Callable[[Sequence[Event]], Sequence[Event]],
           events: Sequence[Event]) -> list[Outcome]:
    """Commit ``events`` (a batch) with ``commit`` and say how each ended: the one settle rule.

    A batch refused before anything was written (``TypeError`` or ``ValueError``: an event too
    large, one that does not fold) is tried again one event at a time, so one bad send fails
    only its own sender; a lone refused event is not tried again. Any other failure (a
    ``StoreError`` whose transaction may have committed) goes to every sender unchanged, and
    nothing is appended twice. ``commit`` must raise those two only when it wrote nothing.

    >>> def commit(events):
    ...     if any(e == "bad" for e in events):
    ...         raise ValueError("refused")
    ...     return list(events)
    >>> [(stored, type(error).__name__) for stored, error in settle(commit, ["a", "bad"])]
    [('a', 'NoneType'), (None, 'ValueError')]
    """
    try:
        stored = commit(events)
    except Exception as exc:
        if len(events) == 1 or not isinstance(exc, _REFUSED):
            return [(None, exc) for _ in events]
        outcomes: list[Outcome] = []
        for event in events:
            try:
                (one,) = commit([event])
            except Exception as single:
                outcomes.append((None, single))
            else:
                outcomes.append((one, None))
        return outcomes
    return [(event, None) for event in stored]


def interrupted(error: BaseException, count: int) -> list[Outcome]:
    """How a batch of ``count`` sends ends when ``error`` (an interrupt, not a store's failure)
    stopped its commit: each sender hears that its send may or may not be stored
    (``OutcomeUnknownError``, caused by ``error``); the interrupt stays the leading thread's.

    >>> [type(error).__name__ for _, error in interrupted(KeyboardInterrupt(), 2)]
    ['OutcomeUnknownError', 'OutcomeUnknownError']
    """
    unknown = OutcomeUnknownError("the commit of this send's batch was interrupted: "
                                  "it may or may not be stored")
    unknown.__cause__ = error
    return [(None, unknown)] * count


def refused_unwritten(error: BaseException) -> bool:
    """Whether a failed send's ``error`` proves nothing was stored: a refusal raised before any
    I/O (``TypeError``, ``ValueError``) or an append fenced off (``LeaseLostError``). Any other
    failure may have stored it (a commit whose answer was lost, a cancel after it was taken up).

    >>> refused_unwritten(ValueError("too large")), refused_unwritten(OSError("lost the answer"))
    (True, False)
    """
    return isinstance(error, (*_REFUSED, LeaseLostError))


def copy_for_sender(error: BaseException) -> BaseException:
    """A copy of a failed batch's ``error`` for one of its senders, caused by it: one instance
    raised in every sender would gather every sender's frames in its one traceback. An error
    that cannot be copied (its class needs arguments it does not keep) is raised as is."""
    try:
        mine = copy.copy(error)
    except Exception:
        return error
    if type(mine) is not type(error) or mine is error or str(mine) != str(error):
        return error
    mine.__cause__ = error
    mine.__traceback__ = None
    return mine


def commit_in_threads(
    batcher: GroupCommit[threading.Lock], queue_lock: threading.Lock, event: Event,
    commit: Callable[[Sequence[Event]], Sequence[Event]],
) -> Event:
    """The threaded pump: send ``event`` through ``batcher`` (guarded by ``queue_lock``, which
    is never held across I/O) and return it as stored, once its transaction committed.

    The sender that finds no commit under way leads: it gathers, takes the batch, commits it with
    ``commit``, wakes the next leader and then the batch's other senders. The others wait on a
    lock of their own, so a wake-up reaches exactly the thread concerned. A sender interrupted
    while it waits takes its send back if no batch took it yet (else it is committed, or may
    be), and passes on the lead if it held it.
    """
    ticket: Ticket[threading.Lock] = Ticket(event, threading.Lock())
    ticket.waiter.acquire()
    try:
        with queue_lock:
            leading = batcher.queue(ticket)
        while not ticket.done:
            if leading:
                leading = _lead(batcher, queue_lock, ticket, commit)
            else:
                ticket.waiter.acquire()
                leading = not ticket.done  # woken to lead, not as a sender whose send is done
    except BaseException:
        if not ticket.done:
            with queue_lock:
                _, leader = batcher.withdraw(ticket)
            if leader is not None:
                _release(leader)
        raise
    return ticket.result()


def _lead(batcher: GroupCommit[threading.Lock], queue_lock: threading.Lock,
          ticket: Ticket[threading.Lock], commit: Callable[[Sequence[Event]], Sequence[Event]],
          ) -> bool:
    """Lead one batch; ``False`` when the last sender took the lead over while this one
    gathered (it then waits as a sender of that batch)."""
    with queue_lock:
        wait = batcher.gather()
    if wait:
        ticket.waiter.acquire(timeout=wait)  # the deadline, unless a hand-over woke it
    with queue_lock:
        if not batcher.leads(ticket):
            return False
        batch = batcher.take()
    begin = time.monotonic()
    outcomes: list[Outcome] = []
    try:
        outcomes = settle(commit, [t.event for t in batch])
    except BaseException as exc:  # an interrupt in the leader: no sender waits forever
        outcomes = interrupted(exc, len(batch))
        raise
    finally:
        with queue_lock:
            leader = batcher.finish(batch, outcomes, time.monotonic() - begin)
        if leader is not None:
            _release(leader)  # the next commit first: every sender queued meanwhile waits for it
        for other in batch:
            if other is not ticket:
                _release(other)
    return True


def _release(ticket: Ticket[threading.Lock]) -> None:
    # A leader that stopped gathering at its deadline may be released once more by a late
    # sender; a lock released twice would raise, and a wake-up too many is harmless.
    if ticket.waiter.locked():
        with contextlib.suppress(RuntimeError):  # released between the look and the release
            ticket.waiter.release()
