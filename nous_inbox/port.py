"""The session port: what a runner needs from a session, and ``LocalSession``, the in-memory one.

A run reads and writes its session through three members. ``session`` is the folded
:class:`~nous_inbox.session.Session`, which the runner reads once, as a turn opens, for the turn
number and the transcript; it decides nothing else from it. ``claim(target, *, wake_only=False)``
drains one queue *and records the claim* in one atomic step (the claim is the transcript entry,
ruling 6) and returns ``(messages, event)``: the messages in send order and the ``QueueClaimed``
it recorded, or ``((), None)`` when nothing was claimed (an empty claim records nothing). With
``wake_only`` it claims only when a waking message worth a model round is queued: the question a
run asks where it would otherwise stop (ruling 2), answered by the pure core
(:meth:`Inbox.claim <nous_inbox.inbox.Inbox.claim>`). ``record(event)`` durably appends one event
and returns it as recorded, ``seq`` and ``at`` set. A port may also say, as
``max_record_size``, the largest record it can store (a :class:`JournalPort` gives its store's);
a runner holds a tool's result to it, and a port that says nothing to the codec's default.

There is one implementation: :class:`JournalPort`, a :class:`~nous_inbox.journal.Journal` (one
stream of a store) seen from a runner. The owner runs its turns through one; :class:`LocalSession`
is one over an in-memory list, with the send verbs added, for tests, examples and single-process
hosts (unlike a store, it does not prove each event reads back from a wire format). Every claim,
the adapters' included, builds its event with :meth:`Session.claim
<nous_inbox.session.Session.claim>` (the journal's, directly; a holder claiming several queues
in one append, through :func:`~nous_inbox.journal.claim_event`).

>>> local = LocalSession()
>>> local.inject("recall: the deploy is frozen").seq, local.steer("stop and summarize").seq
(1, 2)
>>> messages, event = local.claim("next_step")
>>> [m.content for m in messages], (event.count, event.seq)
(['recall: the deploy is frozen', 'stop and summarize'], (2, 3))
>>> local.claim("next_step")
((), None)
>>> replay(local.events) == local.session
True

:func:`check_port` is the rehearsal the runner makes before a turn starts (ruling 7): a port it
could not call the way it calls one is refused with a ``TypeError`` naming the class, what was
found and the fix, rather than failing mid-run or, worse, silently never delivering.
"""

from __future__ import annotations

import abc
import copy
import inspect
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, Protocol, TypeVar, runtime_checkable

from nous_inbox.errors import ConcurrencyError, LeaseLostError
from nous_inbox.events import EVENT_TYPES, Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Target, as_message, as_target, as_wakeup
from nous_inbox.journal import Change, Journal
from nous_inbox.message import Message
from nous_inbox.session import Session, replay

__all__ = [
    "JournalPort", "LocalSession", "SendPresets", "SessionPort", "check_port", "commit_batch",
    "sent_event",
]

_EVENT_TYPES: Final = frozenset(EVENT_TYPES)

T = TypeVar("T")


@runtime_checkable
class SessionPort(Protocol):
    """What the runner needs from a session: its state, an atomic claim, and a durable record."""

    @property
    def session(self) -> Session:
        """The session folded so far (turn number, transcript, inbox)."""

    def claim(
        self, target: Target, *, wake_only: bool = False
    ) -> tuple[Sequence[Message], QueueClaimed | None]:
        """Drain ``target`` and record the claim atomically; ``((), None)`` if nothing was
        claimed. ``wake_only``: claim only if a waking message worth a round is queued."""

    def record(self, event: Event) -> Event:
        """Durably append ``event``; return it as recorded (``seq`` and ``at`` set)."""

    # Optional, so not a member here (an ``isinstance`` check would then refuse the ports that
    # leave it out): ``max_record_size``, an int, the largest record ``record`` can store, in
    # bytes. A runner turns a tool result above it into an error result the model sees; a port
    # without it, or with None (no limit of its own), is held to the codec's default
    # (``nous_inbox.codec.MAX_RECORD_SIZE``).


_PORT_FIX: Final = (
    "A session port needs `session` (a property holding the folded Session), "
    "`claim(self, target, *, wake_only=False)` and `record(self, event)`; see "
    "nous_inbox.port.SessionPort."
)


def check_port(port: object) -> None:
    """Refuse, with a ``TypeError`` naming the class, what was found and the fix, a port the
    runner could not call the way it calls one (ruling 7: refused before the run starts).

    A signature that cannot be read (a C function behind ``functools.partial``) is let through,
    since an unreadable signature is no evidence of a wrong one.

    >>> class Drain:
    ...     session = Session()
    ...     def claim(self):
    ...         return (), None
    ...     def record(self, event):
    ...         return event
    >>> check_port(Drain())
    Traceback (most recent call last):
    ...
    TypeError: Drain.claim() cannot be called the way the runner calls it: claim(target, wake_only=True), with the queue to claim as one positional argument and wake_only as a keyword. Widen the signature in the class body: `def claim(self, target, *, wake_only=False)`.
    """
    cls = type(port).__name__
    for name in ("session", "claim", "record"):
        try:
            found = inspect.getattr_static(port, name)
        except AttributeError:
            raise TypeError(f"{cls} has no {name!r}, so it cannot be a session port. {_PORT_FIX}") from None
        if name == "session":
            if inspect.isfunction(found) or isinstance(found, (classmethod, staticmethod)):
                raise TypeError(
                    f"{cls}.session is a method, but the runner reads it as a value: make it a "
                    f"property (`@property def session(self) -> Session`). {_PORT_FIX}"
                )
            continue
        member = getattr(port, name)
        if not callable(member):
            raise TypeError(f"{cls}.{name} is a {type(member).__name__}, not callable. {_PORT_FIX}")
        try:
            signature = inspect.signature(member)
        except (TypeError, ValueError):
            continue
        if name == "claim":
            call, what, fix = (
                "claim(target, wake_only=True)",
                "the queue to claim as one positional argument and wake_only as a keyword",
                "def claim(self, target, *, wake_only=False)",
            )
            kwargs = {"wake_only": True}
        else:
            call, what, fix = "record(event)", "the event to record as one positional argument", (
                "def record(self, event)")
            kwargs = {}
        try:
            signature.bind(Target.NEXT_STEP, **kwargs)
        except TypeError:
            raise TypeError(
                f"{cls}.{name}{signature} cannot be called the way the runner calls it: "
                f"{call}, with {what}. Widen the signature in the class body: `{fix}`."
            ) from None


def one_senders(error: BaseException) -> BaseException:
    """A copy of a failed batch's ``error`` for one of its senders, caused by it: one instance
    raised to every sender would gather each sender's frames in its one traceback, and notes a
    handler adds in one would show in the others'. Both owners' group commits give each sender
    its error through here. An error that cannot be copied (its class needs arguments it does
    not keep) is raised as is."""
    try:
        mine = copy.copy(error)
    except Exception:
        return error
    if type(mine) is not type(error) or mine is error or str(mine) != str(error):
        return error
    mine.__cause__ = error
    mine.__traceback__ = None
    return mine


def sent_event(message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
    """Check a send's three parts and build its ``MessageSent`` (``seq`` is left for the log).

    Whoever records sends calls this first, so bad input raises before anything is written.

    >>> sent_event("go", "next_step", True).message.content
    'go'
    >>> sent_event("go", "next_step", "yes")
    Traceback (most recent call last):
    ...
    TypeError: wakeup must be a bool, got str
    """
    message = as_message(message)  # the parts in Inbox.send's order, so the same error wins
    return MessageSent(target=as_target(target), wakeup=as_wakeup(wakeup), message=message)


class SendPresets(abc.ABC):
    """``steer``, ``inject`` and ``followup`` defined once, over a class's own ``send``."""

    @abc.abstractmethod
    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` (the primitive); returns the recorded ``MessageSent``."""

    def steer(self, message: Message | str) -> MessageSent:
        """Next step, wakes: "read this before your next model request"."""
        return self.send(message, Target.NEXT_STEP, True)

    def inject(self, message: Message | str) -> MessageSent:
        """Next step, no wake: "have this to hand if you make another request"."""
        return self.send(message, Target.NEXT_STEP, False)

    def followup(self, message: Message | str) -> MessageSent:
        """Next turn, wakes: "answer this after you finish what you are doing"."""
        return self.send(message, Target.NEXT_TURN, True)


class _Pending:
    """One event waiting for a group commit, and how it ended: stored, or the error to raise."""

    __slots__ = ("batch", "done", "error", "event", "gone", "handed", "next", "stored", "wake")

    def __init__(self, event: Event) -> None:
        self.event = event
        self.done = False
        self.stored: Event | None = None
        self.error: BaseException | None = None
        # Released once: when the event is done (and its turn to wake came), or when its sender
        # is to lead. One lock per sender wakes exactly the thread concerned, with no convoy on
        # a shared condition.
        self.wake = threading.Lock()
        self.wake.acquire()
        # The wake-up chain of a committed batch (see JournalPort._lead), under the queue lock:
        # whom this sender wakes once woken, whether its turn came, and whether it left.
        self.next: _Pending | None = None
        self.handed = False
        self.gone = False
        # The batch this sender took to lead, until its commit is under way: an interrupt in
        # between gives it back (JournalPort._leave) rather than strand its senders.
        self.batch: list[_Pending] | None = None


class JournalPort:
    """The session port over a :class:`~nous_inbox.journal.Journal`: the one port there is.

    ``session`` reads what other writers appended first (a steer from another process is part of
    the turn the runner opens); ``claim`` is the journal's one claim path; ``record`` appends one
    event with the journal's expected version. ``lock`` serializes every use with its holder's
    other uses of the journal (an owner passes its own; a journal is not locked by itself).

    ``append`` is the hosts' write (every send goes through it): a **group commit**. A sender
    queues its event; if no transaction is under way it becomes the leader, else it waits (on a
    lock of its own, so a wake-up reaches exactly the thread concerned). The leader first
    *gathers*: the senders of the last round (those its batch released, and those who queued
    while it committed) are likely back at once with their next sends, so it waits for them, at
    most half a commit's smoothed time (between ``GATHER_SECONDS`` and ``GATHER_MAX_SECONDS``);
    a lone sender never waits, and the last sender it waits for takes the batch and leads it
    itself, without waking the leader (which waits, on its own lock, as one of that batch's
    senders). Then the leader appends everything queued in one atomic append, one transaction
    of the store, marks each event stored (or failed), hands the leadership to the first sender
    who queued meanwhile (a leader commits one batch, the one holding its own event, so no
    sender commits for the others indefinitely) and wakes its batch's senders, as a chain: it
    wakes the first, and each, once woken, wakes the next. Waking a thread is most of what a
    send costs beyond its share of the commit (a system call, and a sleeping processor to
    start), and the woken threads take the interpreter lock one at a time anyway: woken in a
    chain, each one's wake-up overlaps the previous one's work instead of queueing behind the
    leader's. No call returns before the transaction holding its event committed, so
    acknowledged still means durable, and each sender's events keep their order (a sender waits
    for one before it sends the next). A batch the store refuses before writing anything (a
    ``TypeError`` or ``ValueError``: an event too large, one that does not fold; the journal's
    version unmoved) is tried again one event at a time, so one bad event fails only its own sender; any other failure (a
    ``StoreError``, say, whose transaction may have committed) is raised to every sender of the
    batch, and nothing is appended twice. A send made by a thread that already holds ``lock``
    (a listener called while a batch commits) is committed directly rather than queued behind
    itself.

    >>> from nous_inbox.store import open_store
    >>> port = JournalPort(Journal(open_store("memory:"), "s"))
    >>> port.claim("next_step")
    ((), None)
    >>> port.append(sent_event("go", "next_step", True)).seq
    1
    """

    __slots__ = (
        "_commit_seconds",
        "_committing",
        "_deadline",
        "_gatherer",
        "_journal",
        "_leader",
        "_lock",
        "_pending",
        "_queue_lock",
        "_senders",
    )

    def __init__(self, journal: Journal, lock: threading.RLock | None = None) -> None:
        self._journal = journal
        self._lock = threading.RLock() if lock is None else lock
        # The queue of sends waiting for a group commit; its lock is never held across I/O.
        # Every waiting sender, the gathering leader too, waits on its own ``_Pending.wake``.
        self._queue_lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._committing = False  # a leader is gathering or appending a batch
        self._leader: _Pending | None = None  # ... the sender leading, until its commit starts
        self._gatherer: _Pending | None = None  # the leader still waiting for senders to queue
        self._deadline = 0.0  # ... until then at most
        self._senders = 1  # how many sent in the last round: whom the next leader waits for
        self._commit_seconds = 0.0  # a commit's time, smoothed: what bounds that wait

    @property
    def journal(self) -> Journal:
        """The journal this port reads and writes."""
        return self._journal

    @property
    def max_record_size(self) -> int | None:
        """The largest record the journal's store takes, in bytes, or ``None`` when it names no
        limit (the optional port member a runner checks a tool's result against; see
        :class:`SessionPort`, and :attr:`Journal.max_record_size
        <nous_inbox.journal.Journal.max_record_size>`)."""
        return self._journal.max_record_size

    @property
    def session(self) -> Session:
        """The session with what other writers appended folded in."""
        with self._lock:
            self._journal.catch_up()
            return self._journal.session

    def claim(
        self, target: Target | str, *, wake_only: bool = False
    ) -> tuple[Sequence[Message], QueueClaimed | None]:
        """Drain ``target`` and record the claim, atomically; ``((), None)`` if nothing was
        claimed. See :meth:`Journal.claim <nous_inbox.journal.Journal.claim>`."""
        with self._lock:
            messages, event = self._journal.claim(target, wake_only=wake_only)
            return (tuple(messages), event) if event is not None else ((), None)

    def record(self, event: Event) -> Event:
        """Append ``event``, numbered and timed; returns it as recorded.

        An event that does not fold (a claim count the inbox cannot meet) raises ``ReplayError``
        and nothing changes.
        """
        _check_event(event)
        with self._lock:
            (stored,), _ = self._journal.commit(_just(event))
            return stored

    def commit(self, change: Change[T]) -> tuple[list[Event], T]:
        """Append the events ``change`` computes from the session (other writers' events read
        first), in one atomic append; see :meth:`Journal.commit
        <nous_inbox.journal.Journal.commit>`. For a runner that records several events at one
        boundary (a claim among them) as one transaction rather than one each.

        >>> from nous_inbox.events import Warned
        >>> port = LocalSession()
        >>> stored, _ = port.commit(lambda session: ([Warned(text="a"), Warned(text="b")], None))
        >>> [e.seq for e in stored]
        [1, 2]
        """
        with self._lock:
            self._journal.catch_up()
            return self._journal.commit(change)

    def append(self, event: Event) -> Event:
        """Append ``event`` in a group commit with whatever other threads are appending; return
        it as stored, once the transaction holding it has committed (see the class notes)."""
        _check_event(event)
        if self._holds_lock():
            # A send from inside a commit (a listener called as the leader's batch folds in),
            # or from a thread holding the lock a leader waits for: queueing would wait for
            # this very thread, forever. It commits directly, under the lock it already holds.
            with self._lock:
                (stored,), _ = self._journal.commit(_just(event))
            return stored
        mine = _Pending(event)
        try:
            with self._queue_lock:
                self._pending.append(mine)
                batch: list[_Pending] | None = None
                if not self._committing:
                    self._committing, self._leader = True, mine
                    batch = self._gather(mine)
                elif self._gatherer is not None and len(self._pending) >= self._senders:
                    # The last sender the gathering leader waits for: lead the batch at once
                    # rather than wake the leader to (one thread wake-up less between two
                    # transactions). The leader, its send in this batch, is woken with the
                    # batch's other senders.
                    self._gatherer, self._leader = None, mine
                    batch = self._take(mine)
            if batch is None:
                batch = self._wait(mine)
            if batch is not None:
                self._lead(batch, mine)
        except BaseException:  # interrupted: unsent, unless a leader already took it
            self._leave(mine)
            raise
        if mine.error is not None:
            raise one_senders(mine.error)
        assert mine.stored is not None
        return mine.stored

    def _gather(self, mine: _Pending) -> list[_Pending] | None:
        """As the new leader (with the queue lock): the batch to commit now, or ``None`` while
        it waits, briefly, for the senders of the last round to queue their next sends.

        ``_senders`` is how many sent in the last round (the last batch, and those queued while
        it committed); each is likely back at once with its next send, so waiting for them,
        at most a fraction of a commit's time, makes one transaction of what would be two
        (PostgreSQL's ``commit_delay``, but waiting only for senders known to be active). A
        lone sender never waits: it is all the senders there are. The last of them takes the
        batch and leads it (``_gatherer`` cleared); else the leader takes it at the deadline.
        """
        if len(self._pending) >= self._senders:
            return self._take(mine)
        self._gatherer = mine
        self._deadline = time.monotonic() + min(max(GATHER_SECONDS, self._commit_seconds / 2),
                                                GATHER_MAX_SECONDS)
        return None

    def _wait(self, mine: _Pending) -> list[_Pending] | None:
        """Wait until ``mine`` is committed (``None``), or until this sender is to lead: then
        the batch to lead (``mine`` in it)."""
        while True:
            if self._gatherer is mine:  # (only the thread of ``mine`` sets it to ``mine``)
                woken = mine.wake.acquire(timeout=max(self._deadline - time.monotonic(), 0))
            else:
                woken = mine.wake.acquire()
            if woken and mine.done:
                self._wake_next(mine)
                return None
            with self._queue_lock:
                if woken:  # handed the leadership
                    batch = self._gather(mine)
                    if batch is not None:
                        return batch
                elif self._gatherer is mine:  # gathered until the deadline: lead what came
                    self._gatherer = None
                    return self._take(mine)
                # (else the last sender took the batch, ``mine`` in it: wait to be woken)

    def _take(self, mine: _Pending) -> list[_Pending]:
        """(With the queue lock.) Take everything queued as the batch ``mine``'s sender leads."""
        batch, self._pending = self._pending, []
        mine.batch = batch
        return batch

    def _leave(self, mine: _Pending) -> None:
        """``mine``'s sender was interrupted (before its batch's commit started, or while it
        waited for it): take its send back if no leader took it yet (else it is committed, or
        failed, unacknowledged), and pass on whatever it held. A batch it took to lead goes back
        to the head of the queue, without its own send; the leadership it held (gathering, or
        handed to it, or taken with a batch) goes to the first sender queued, so no sender is
        left waiting for a leader that is gone."""
        with self._queue_lock:
            mine.gone = True
            if mine in self._pending:
                self._pending.remove(mine)
            batch, mine.batch = mine.batch, None
            if batch is not None:
                self._pending[:0] = [pending for pending in batch if pending is not mine]
            if self._leader is mine:
                self._gatherer = None
                self._hand_over()
            woken = self._next_to_wake(mine) if mine.handed else None
        if woken is not None:
            woken.wake.release()

    def _holds_lock(self) -> bool:
        """Whether this thread holds the port's lock (a leader committing does, for the whole
        of its commit; so does an owner's worker inside ``record``)."""
        is_owned = getattr(self._lock, "_is_owned", None)
        return bool(is_owned()) if is_owned is not None else False

    def _lead(self, batch: list[_Pending], mine: _Pending) -> None:
        """As the leader: commit ``batch`` in one transaction, then hand over and wake its senders.

        The next leader (the first sender who queued meanwhile) is woken first: the next commit
        is what every sender queued meanwhile waits for. Then the first of the batch's other
        senders, who wakes the next, and so on (see the class notes); a sender that left
        (interrupted) is skipped, since the chain would end at it.
        """
        begin = time.monotonic()
        try:
            # From here on, the finally below answers for every sender of the batch.
            mine.batch, self._leader = None, None
            with self._lock:
                self._commit_batch(batch)
        finally:
            took = time.monotonic() - begin
            with self._queue_lock:
                # A smoothed commit time bounds the next gather; the senders of this round
                # are those just committed and those who queued meanwhile.
                self._commit_seconds += (took - self._commit_seconds) / 4
                self._senders = len(batch) + len(self._pending)
                self._hand_over()
                followers = [pending for pending in batch if pending is not mine]
                for pending, after in itertools.pairwise(followers):
                    pending.next = after
                first = _first_present(followers[0]) if followers else None
                if first is not None:
                    first.handed = True
            if first is not None:  # (each is done: stored, or failed)
                first.wake.release()

    def _wake_next(self, mine: _Pending) -> None:
        """``mine``'s sender was woken, its event done: wake the next sender of its batch."""
        with self._queue_lock:
            woken = self._next_to_wake(mine)
        if woken is not None:
            woken.wake.release()

    def _next_to_wake(self, mine: _Pending) -> _Pending | None:
        """(With the queue lock.) The next sender of ``mine``'s batch still waiting, marked as
        handed its turn; a sender that left (interrupted) is skipped, as its wake would wake no
        one and end the chain."""
        woken = _first_present(mine.next)
        if woken is not None:
            woken.handed = True
        return woken

    def _hand_over(self) -> None:
        """Stop leading (with the queue lock): wake the first sender queued meanwhile to lead
        the next batch, or, with none queued, let the next sender to come lead."""
        if self._pending:
            self._leader = first = self._pending[0]
            first.wake.release()
        else:
            self._committing, self._leader = False, None

    def _commit_batch(self, batch: list[_Pending]) -> None:
        """Commit ``batch`` in one append (called with the lock); mark each done either way."""
        try:
            outcomes = commit_batch(self._journal, [pending.event for pending in batch])
            for pending, (stored, error) in zip(batch, outcomes, strict=True):
                pending.stored, pending.error = stored, error
        except BaseException as exc:  # an interrupt in the leader: no follower waits forever
            for pending in batch:
                if pending.stored is None and pending.error is None:
                    pending.error = exc
            raise
        finally:
            for pending in batch:
                pending.done = True


def commit_batch(
    journal: Journal, events: Sequence[Event]
) -> list[tuple[Event, None] | tuple[None, Exception]]:
    """Commit ``events`` (a group commit's batch) in one append, and say how each ended: stored,
    or the error its sender is to hear. Call it holding the journal's lock. Every group commit
    (:meth:`JournalPort.append`'s, an ``AsyncOwner`` worker's) settles its batch here, by one
    rule: a batch the store refused before writing anything (``TypeError``, ``ValueError``, the
    journal's :attr:`~nous_inbox.journal.Journal.writes` unmoved) is tried again one event at a
    time, so one bad event fails only its own sender; a refused single event is not tried
    again; any other failure (whose transaction may have committed, as when PostgreSQL loses the
    answer to its COMMIT, or raised once the batch was stored, as the journal's ``on_events``
    may) goes to every sender, unchanged, and nothing is appended twice.

    >>> from nous_inbox.store import open_store
    >>> journal = Journal(open_store("memory:"), "s")
    >>> [(e.seq, error) for e, error in commit_batch(journal, [sent_event("a", "next_step", True)])]
    [(1, None)]
    """
    before = journal.writes
    try:
        stored, _ = journal.commit(lambda session: (events, None))
    except Exception as exc:
        # A ValueError after the append (from ``on_events``) comes with the batch written:
        # appending it again one by one would store every event twice. Not the version: a
        # retry's catch-up moves that for another writer's events, with nothing of ours written.
        refused = isinstance(exc, _REFUSED_UNWRITTEN) and journal.writes == before
        if len(events) == 1 or not refused:
            return [(None, exc) for _ in events]
        outcomes: list[tuple[Event, None] | tuple[None, Exception]] = []
        for event in events:
            try:
                (one,), _ = journal.commit(_just(event))
            except Exception as single:
                outcomes.append((None, single))
            else:
                outcomes.append((one, None))
        return outcomes
    return [(event, None) for event in stored]


#: The refusals that prove a batch wrote nothing, raised before any I/O (a ``TypeError``, a
#: ``ValueError`` such as ``ReplayError`` or ``RecordTooLargeError``): only these are worth
#: trying again one event at a time.
_REFUSED_UNWRITTEN: Final = (TypeError, ValueError)

def refused_unwritten(error: BaseException) -> bool:
    """Whether a failed send's ``error`` shows that nothing was stored: a refusal raised before
    any I/O (``TypeError``, ``ValueError``: bad input, a record too large) or an append fenced
    off (``LeaseLostError``). Any other failure may have stored it: a ``StoreError`` whose
    commit may have landed, a cancel after the send was taken up.

    >>> refused_unwritten(ValueError("too large")), refused_unwritten(OSError("lost the answer"))
    (True, False)
    """
    return isinstance(error, (*_REFUSED_UNWRITTEN, LeaseLostError))


#: How long a leader may wait, at least, for the senders of the last round to queue again
#: (when a commit takes longer, half of its smoothed time).
GATHER_SECONDS: Final = 0.0005
#: ... and at most, whatever a commit takes.
GATHER_MAX_SECONDS: Final = 0.005


def _first_present(pending: _Pending | None) -> _Pending | None:
    while pending is not None and pending.gone:
        pending = pending.next
    return pending


def _just(event: Event) -> Callable[[Session], tuple[list[Event], None]]:
    return lambda session: ([event], None)


def _check_event(event: object) -> None:
    if type(event) not in _EVENT_TYPES and not isinstance(event, EVENT_TYPES):
        raise TypeError(f"record needs an event, got {type(event).__name__}")


class LocalSession(JournalPort, SendPresets):
    """An in-memory, thread-safe session: a :class:`JournalPort` over a ``memory:`` store, with
    the send verbs.

    Sends (``steer``, ``inject``, ``followup``, ``send``) and the runner's claims and records all
    append to one log under one lock, and fold into ``session`` as they do; so
    ``replay(local.events) == local.session`` at every moment. Give it earlier ``events`` to
    resume; ``clock`` times the events it records.

    >>> local = LocalSession()
    >>> _ = local.followup("later")
    >>> LocalSession(local.events).session == local.session
    True
    """

    def __init__(
        self, events: Iterable[Event] = (), *, clock: Callable[[], float] = time.time
    ) -> None:
        self._log = _EventList(events)
        super().__init__(Journal(self._log, _STREAM, clock=clock))

    @property
    def events(self) -> tuple[Event, ...]:
        """Every event recorded, in order (a snapshot)."""
        with self._lock:
            return tuple(self._log.events)

    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` (the primitive); returns the recorded ``MessageSent``."""
        stored = self.append(sent_event(message, target, wakeup))
        return stored  # type: ignore[return-value]

    def __repr__(self) -> str:
        s = self._journal.session
        return f"LocalSession(events={s.version}, turn={s.turn}, inbox={s.inbox!r})"


_STREAM: Final = "local"


class _EventList:
    """A LocalSession's log: a list in memory, the smallest :class:`~nous_inbox.journal.Log`.

    Not a ``memory:`` store on purpose: the journal numbers, times and folds every event before
    it arrives here (an event replay would refuse is never kept), and a store's proof that each
    event reads back from its wire format would cost a local session four times its append for
    a log that is never written anywhere.
    """

    __slots__ = ("events",)

    def __init__(self, events: Iterable[Event]) -> None:
        self.events = list(events)
        replay(self.events)  # refuse a log that does not fold before keeping any of it

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None
    ) -> Sequence[Event]:
        if expected_version is not None and expected_version != len(self.events):
            raise ConcurrencyError(  # one journal, one lock: a second writer is a bug
                f"stream {stream!r} is at version {len(self.events)}, not {expected_version}"
            )
        self.events.extend(events)
        return events

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        return iter(self.events[max(after, 0):])

    def version(self, stream: str) -> int:
        return len(self.events)
