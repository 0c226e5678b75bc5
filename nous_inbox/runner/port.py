"""The session port: what a runner needs from a session, and ``LocalSession``, the in-memory one.

A run reads and writes its session through three members. ``session`` is the folded
:class:`~nous_inbox.session.Session`, which the runner reads once, as a turn opens, for the turn
number and the transcript; it decides nothing else from it. ``claim(target, *, wake_only=False)``
drains one queue *and records the claim* in one atomic step (the claim is the transcript entry,
ruling 6) and returns ``(messages, event)``: the messages in send order and the ``QueueClaimed``
it recorded, or ``((), None)`` when nothing was claimed (an empty claim records nothing). With
``wake_only`` it claims only when a waking message worth a model round is queued: the question a
run asks where it would otherwise stop (ruling 2), answered by the pure core
(:meth:`Inbox.claim <nous_inbox.inbox.Inbox.claim>`). ``record(events)`` durably appends events
in one atomic append (a step's events are recorded together: never half of them) and returns
them as recorded, ``seq`` and ``at`` set. A port may also say, as
``max_record_size``, the largest record it can store (a :class:`JournalPort` gives its store's);
a runner holds a tool's result to it, and a port that says nothing to the codec's default.

There is one implementation: :class:`JournalPort`, a :class:`~nous_inbox.store.journal.Journal` (one
stream of a store) seen from a runner. The owner runs its turns through one; :class:`LocalSession`
is one over an in-memory list, with the send verbs added, for tests, examples and single-process
hosts (unlike a store, it does not prove each event reads back from a wire format). Every claim,
the adapters' included, builds its event with :meth:`Session.claim
<nous_inbox.session.Session.claim>` (the journal's, directly; a holder claiming several queues
in one append, through :func:`~nous_inbox.store.journal.claim_event`).

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
found and the fix, rather than failing mid-run or, worse, silently never delivering. A port that
passes it and then misbehaves mid-run (its claim raises, or answers in a shape no claim has) is
met by :class:`~nous_inbox.runner.guard.ClaimGuard`, which every driver claims through: logged, recorded as ``Warned``,
and the run goes on without it (ruling 7).
"""

from __future__ import annotations

import abc
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, Protocol, TypeVar, runtime_checkable

from nous_inbox.commands import Claim
from nous_inbox.errors import ConcurrencyError
from nous_inbox.events import EVENT_TYPES, Event, MessageSent, QueueClaimed
from nous_inbox.loop import Advance
from nous_inbox.message import Message
from nous_inbox.runner.walk import Ended, claims_ahead, finish, walk_claims
from nous_inbox.session import Session, replay
from nous_inbox.store.journal import Change, Journal, sent_event
from nous_inbox.verbs import FOLLOWUP, INJECT, STEER, Target

__all__ = ["JournalPort", "LocalSession", "SendPresets", "SessionPort", "check_port"]

logger: Final = logging.getLogger("nous_inbox.runner.port")

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

    def record(self, events: Sequence[Event]) -> Sequence[Event]:
        """Durably append ``events``, in order, in one atomic append; return them as recorded
        (``seq`` and ``at`` set)."""

    # Optional, so not a member here (an ``isinstance`` check would then refuse the ports that
    # leave it out): ``max_record_size``, an int, the largest record ``record`` can store, in
    # bytes. A runner turns a tool result above it into an error result the model sees; a port
    # without it, or with None (no limit of its own), is held to the codec's default
    # (``nous_inbox.codec.MAX_RECORD_SIZE``).


_PORT_FIX: Final = (
    "A session port needs `session` (a property holding the folded Session), "
    "`claim(self, target, *, wake_only=False)` and `record(self, events)`; see "
    "nous_inbox.runner.port.SessionPort."
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
    ...     def record(self, events):
    ...         return events
    >>> check_port(Drain())
    Traceback (most recent call last):
    ...
    TypeError: Drain.claim() cannot be called the way the runner calls it: claim(target, wake_only=True), with the queue to claim as one positional argument and wake_only as a keyword. Widen the signature in the class body: `def claim(self, target, *, wake_only=False)`.
    """
    kind = type(port)
    members = (getattr(kind, "session", None), getattr(kind, "claim", None),
               getattr(kind, "record", None))
    own = getattr(port, "__dict__", None)
    # The rehearsal reads signatures, which costs a turn's worth of steps: its verdict is kept
    # per class, while the class holds the same members and the port does not shadow them.
    plain = not own or own.keys().isdisjoint(_MEMBERS)
    if plain and _PASSED.get(kind) == members:
        return
    _rehearse(port)
    if plain:
        _PASSED[kind] = members


_MEMBERS: Final = frozenset({"session", "claim", "record"})
_PASSED: Final[weakref.WeakKeyDictionary[type, tuple[object, ...]]] = weakref.WeakKeyDictionary()
"""The port classes that passed :func:`check_port`, with the members they passed with."""


def _rehearse(port: object) -> None:
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
            call, what, fix = "record(events)", "the events to record as one positional argument", (
                "def record(self, events)")
            kwargs = {}
        try:
            signature.bind(Target.NEXT_STEP, **kwargs)
        except TypeError:
            raise TypeError(
                f"{cls}.{name}{signature} cannot be called the way the runner calls it: "
                f"{call}, with {what}. Widen the signature in the class body: `{fix}`."
            ) from None


class SendPresets(abc.ABC):
    """``steer``, ``inject`` and ``followup`` over a class's own ``send``, each as the verb table
    (:mod:`nous_inbox.verbs`) says it."""

    @abc.abstractmethod
    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` (the primitive); returns the recorded ``MessageSent``."""

    def steer(self, message: Message | str) -> MessageSent:
        """The ``steer`` verb: next step, wakes, "read this before your next model request"."""
        return self.send(message, STEER.target, STEER.wakeup)

    def inject(self, message: Message | str) -> MessageSent:
        """The ``inject`` verb: next step, no wake, "have this to hand if you make another request"."""
        return self.send(message, INJECT.target, INJECT.wakeup)

    def followup(self, message: Message | str) -> MessageSent:
        """The ``followup`` verb: next turn, wakes, "answer this after you finish"."""
        return self.send(message, FOLLOWUP.target, FOLLOWUP.wakeup)


class JournalPort:
    """The session port over a :class:`~nous_inbox.store.journal.Journal`: the one port there is.

    ``session`` reads what other writers appended first (a steer from another process is part of
    the turn the runner opens); ``claim`` is the journal's one claim path; ``record`` and
    ``append`` append one event with the journal's expected version. ``lock`` serializes every
    use with its holder's other uses of the journal (an owner passes its own; a journal is not
    locked by itself). An owner's sends from many threads share transactions through its group
    commit (:mod:`nous_inbox.owner.group_commit`), not here.

    >>> from nous_inbox.store import open_store
    >>> port = JournalPort(Journal(open_store("memory:"), "s"))
    >>> port.claim("next_step")
    ((), None)
    >>> port.append(sent_event("go", "next_step", True)).seq
    1
    """

    __slots__ = ("_journal", "_lock")

    def __init__(self, journal: Journal, lock: threading.RLock | None = None) -> None:
        self._journal = journal
        self._lock = threading.RLock() if lock is None else lock

    @property
    def journal(self) -> Journal:
        """The journal this port reads and writes."""
        return self._journal

    @property
    def max_record_size(self) -> int | None:
        """The largest record the journal's store takes, in bytes, or ``None`` when it names no
        limit (the optional port member a runner checks a tool's result against; see
        :class:`SessionPort`, and :attr:`Journal.max_record_size
        <nous_inbox.store.journal.Journal.max_record_size>`)."""
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
        claimed. See :meth:`Journal.claim <nous_inbox.store.journal.Journal.claim>`."""
        with self._lock:
            self.reaching(target, self._journal.session.turn, wake_only=wake_only)
            messages, event = self._journal.claim(target, wake_only=wake_only,
                                                  limit=self.claim_limit(target))
            return (tuple(messages), event) if event is not None else ((), None)

    def record(self, events: Sequence[Event]) -> list[Event]:
        """Append ``events`` in one atomic append, numbered and timed; returns them as recorded.

        An event that does not fold (a claim count the inbox cannot meet) raises ``ReplayError``
        and nothing changes.
        """
        if type(events) is not list and type(events) is not tuple:
            _check_sequence(events)
        for event in events:
            if type(event) not in _EVENT_TYPES:
                _check_event(event)
        with self._lock:
            return self._journal.append(events)

    def append(self, event: Event) -> Event:
        """:meth:`record` of one event: the event as recorded.

        >>> LocalSession().append(sent_event("go", "next_step", True)).seq
        1
        """
        (stored,) = self.record((event,))
        return stored

    def boundary(self, adv: Advance, ended: Ended | None = None) -> tuple[list[Event], Advance]:
        """A run's boundary in one atomic append, the one port call a runner makes at each:
        ``adv``'s events, then each claim the loop asks for and the events it answers with
        (:func:`~nous_inbox.runner.walk.walk_claims`), until it asks for a model request, tools
        or the turn's end. Returns the events as recorded and where the loop stands. Each claim
        is told to the boundary subscribers first and held to :meth:`claim_limit`, as
        :meth:`claim` is; ``ended`` completes the turn's end, if the walk reaches it.

        >>> from nous_inbox.happenings import TurnOpened
        >>> from nous_inbox.loop import advance, new_state
        >>> port = LocalSession()
        >>> _ = port.followup("hi")
        >>> stored, adv = port.boundary(advance(new_state(), TurnOpened(1)))
        >>> [e.seq for e in stored], type(adv.command).__name__
        ([2, 3, 4, 5], 'CallModel')
        """
        with self._lock:
            if type(adv.command) is not Claim:
                return self._journal.append(finish(adv.events, adv.state, ended)), adv
            if self.heard:
                for asked in claims_ahead(adv):
                    self.reaching(asked.target, adv.state.turn, wake_only=asked.wake_only)
            limit = self.claim_limit
            return self._journal.commit(lambda session: walk_claims(adv, session, limit, ended))

    def claim_limit(self, target: Target | str) -> int | None:
        """How many of ``target``'s oldest messages a claim made now may take: all (``None``)
        here; an owner's port says otherwise for a prompt sent with run options."""
        return None

    @property
    def heard(self) -> bool:
        """Whether anyone listens to the boundaries (an owner's subscribers; none here)."""
        return False

    def reaching(self, target: Target | str, turn: int, *, wake_only: bool = False) -> None:
        """The run of ``turn`` is about to claim ``target``: nobody to tell here (an owner's
        port tells its boundary subscribers)."""

    def commit(self, change: Change[T]) -> tuple[list[Event], T]:
        """Append the events ``change`` computes from the session (other writers' events read
        first), in one atomic append; see :meth:`Journal.commit
        <nous_inbox.store.journal.Journal.commit>`. For a runner that records several events at one
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


def _check_sequence(events: object) -> None:
    if isinstance(events, EVENT_TYPES):
        raise TypeError(f"record takes a sequence of events, got one {type(events).__name__}: "
                        "pass [event]")
    if isinstance(events, (str, bytes)) or not isinstance(events, Sequence):
        raise TypeError(f"record takes a sequence of events, got {type(events).__name__}")


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
    """A LocalSession's log: a list in memory, the smallest :class:`~nous_inbox.store.journal.Log`.

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
