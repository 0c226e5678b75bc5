"""An inbox for aimu agents: a host steers a run that is already in progress.

aimu's ``Agent`` asks its ``inbox`` for a reader once per run, as the run starts, and calls that
reader's drain at every round boundary: whatever the drain returns becomes that round's user
message, on a model request the run was making anyway. ``AimuInbox`` is such an inbox, built on
the library's pure two-queue ``Inbox`` value, with the host-side verbs of the rest of the library:

>>> box = AimuInbox()
>>> drain = box.reader("researcher")        # what an aimu run does as it starts
>>> box.steer("check the staging log instead", agent="researcher")
>>> box.inject("fyi: the deploy is frozen")  # no agent: whichever run asks first takes it
>>> drain()                                  # what the run does at its next round boundary
['check the staging log instead', 'fyi: the deploy is frozen']
>>> drain()                                  # a drain hands out only what the run has not had
[]
>>> box.followup("then write it up", agent="researcher")
>>> drain()                                  # a followup waits for the agent's next run
[]
>>> box.reader("researcher")()
['then write it up']

Wiring it into aimu (the adapter never imports aimu; it satisfies aimu's ``Inbox`` protocol by
shape)::

    mailbox = AimuInbox()
    agent = Agent(client, name="researcher", tools=[...], inbox=mailbox)
    threading.Thread(target=agent.run, args=("summarize the logs",)).start()
    mailbox.steer("check the staging log instead", agent="researcher")

Routing. Each address holds one ``Inbox`` value: one per agent name, and one shared (``agent=None``).
A run opened as ``reader("a")`` drains the queues addressed to ``"a"`` and the shared ones, never
another agent's; a shared message goes to the first run whose drain asks for it. Name your agents
if you route: aimu generates an unguessable name for an agent built without ``name=``.

Order. ``steer`` and ``inject`` queue on ``next_step``, ``followup`` on ``next_turn``. A drain
returns the turn messages first (the first drain of a run only), then the step messages; within
each, the agent's own and the shared queue are merged in send order. Each queued message carries
its send position as ``metadata[ORDER_KEY]`` (``"nous_inbox.order"``; the name's home is
:mod:`nous_inbox.adapters.aimu_routing`), which is what that merge sorts by, and
all it is used for: which followups a run is owed is decided from the queues themselves.

Design notes. What a drain claims, and whether what it takes is worth a round, is the loop's
(:func:`~nous_inbox.commands.round_claims`, :func:`~nous_inbox.commands.worth_a_round`): a drain
is a round boundary that aimu does not name, so its first claims what a turn's opening does
(``next_turn``, then ``next_step``) and each later one what a step boundary does. The routing
decisions (addresses, the send clock, which followups a run is owed) live beside it, in
:mod:`nous_inbox.adapters.aimu_routing`; this adapter is aimu's face over them and over a journal
per address.

* A run is owed the followups queued when it opened its reader: ``reader()`` first reads what
  other writers appended to the store, then notes, per address, which ``next_turn`` entries are
  there. A followup sent from another process before the run began is therefore the run's, and
  one sent after it began (from any process, however far behind its clock or counter) is not.
* Those followups are claimed by the run's *first drain*, not by ``reader()``: a run that fails
  before its first round boundary (a model error on the first request) then takes no followup
  with it. When nothing joined ``next_turn`` in between, the drain claims the queue as it is;
  when followups did arrive in between, it claims only the oldest entries, the ones owed
  (``QueueClaimed.rest`` records how many stay), and the late ones wait, untouched, for the
  next run. Each message enters the transcript exactly once.
* Send positions are a hybrid clock: each is later than every position this process has made or
  read from the store, and otherwise the wall-clock time in nanoseconds. Two processes' messages
  thus merge in the order they were sent (to the precision of the machines' clocks), and a
  restarted or fresh process never sorts its new messages before older ones.
* Every change takes one lock around the value swap (hosts steer from other threads while the
  run drains on its own). A drain never waits for a message: it returns ``[]`` when nothing is
  queued.
* With a ``store``, each address is the stream ``aimu:<agent>`` (``aimu:*`` for the shared one).
  Every send appends a ``MessageSent`` and every non-empty claim a ``QueueClaimed`` *before* the
  value changes, with the stream's expected version, and a new ``AimuInbox`` replays the streams,
  so nothing queued is lost by a restart. Every read of the queues reads what other writers
  appended first: ``reader()`` and each drain (so a message appended by another process reaches
  the run at its next boundary), and ``pending``, ``wants_wake`` and ``inbox`` (so a host
  deciding whether a run is owed sees the other processes' messages and claims too). A change
  that lost a race with another writer catches up and is worked out again on the new value.
* aimu does not say at which boundary it drains, so the loop's claims there are plain, never the
  wake-only claim of a would-be final answer (ruling 2): an ``inject`` pending at what would be
  the final answer extends the run like a ``steer``; the wake flag matters to a host deciding
  whether to start a run (``wants_wake``). A blank message (whitespace, or invisible characters
  only) is never handed to aimu on its own, where it would make a round (ruling 4): it stays
  queued until a drain has something worth a round to deliver with it. And aimu drains first *after*
  the run's first reply, so a followup reaches the next run at its first round boundary, not in
  its first request.
* A message that lands after a run's last drain (or in a run that ends on its round budget,
  where aimu does not drain) stays queued, never dropped: a host asks ``wants_wake(agent)`` when
  a run ends to learn that another run is owed.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Final, Protocol, TypeVar

import attrs

from nous_inbox.adapters import aimu_routing as routing
from nous_inbox.adapters.aimu_routing import (
    SendClock,
    addresses,
    check_agent,
    claim_for_run,
    order_of,
)
from nous_inbox.commands import OPENING, round_claims, worth_a_round
from nous_inbox.events import Event, MessageSent
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message
from nous_inbox.queued import Entry
from nous_inbox.session import Session
from nous_inbox.store.journal import Journal, Log, sent_event
from nous_inbox.verbs import FOLLOWUP, INJECT, STEER, Target, Verb

__all__ = ["STREAM_PREFIX", "AimuInbox", "EventStore", "stream_name"]

logger = logging.getLogger(__name__)

STREAM_PREFIX: Final = "aimu:"
"""Streams an ``AimuInbox`` owns in its store start with this; others are left alone."""

_EMPTY: Final = Inbox()
_TURN: Final = Target.NEXT_TURN
_STEP: Final = Target.NEXT_STEP
_CLAIM_ORDER: Final = tuple(dict.fromkeys(claim.target for claim in OPENING))
"""The order a drain hands out what its claims took: a turn's opening order (followups first)."""
_T = TypeVar("_T")


class EventStore(Log, Protocol):
    """What ``AimuInbox`` needs of a store: a journal's log (append with an expected version,
    read back, a cheap version number) and the list of its streams.

    The stores of ``nous_inbox.store`` fit it; so does any object with these four methods.
    """

    def streams(self) -> Iterable[str]:
        """The names of the streams holding events: a new ``AimuInbox`` replays those it owns."""


def stream_name(agent: str | None) -> str:
    """The store stream holding the messages addressed to ``agent`` (``None``: the shared ones).

    >>> stream_name("researcher"), stream_name(None)
    ('aimu:researcher', 'aimu:*')
    """
    return routing.stream_name(STREAM_PREFIX, agent)


def _check_text(text: object, where: str) -> Message:
    if isinstance(text, str):
        return Message.user(text)
    if isinstance(text, Message):
        if text.role != "user":
            # aimu delivers every inbox message as a user turn; another role would be mislabelled.
            raise ValueError(
                f"{where}: aimu delivers inbox messages as user messages, got a {text.role!r} message"
            )
        return text
    raise TypeError(f"{where}: text must be a str or a user Message, got {type(text).__name__}")


@attrs.frozen(repr=False, eq=False)
class _RunDrain:
    """One run's drain: it owes the run, per address, the followups queued when the run opened,
    until a drain has claimed that address's share."""

    _inbox: AimuInbox
    _agent: str | None
    _owed_turn: dict[str | None, Sequence[Entry]]

    def __call__(self) -> list[str]:
        return self._inbox._drain(self._agent, self._owed_turn)

    def __repr__(self) -> str:
        return f"<AimuInbox drain for agent {self._agent!r}>"


def _check_store(box: object, attribute: object, store: EventStore | None) -> None:
    if store is None:
        return
    missing = [name for name in ("append", "read", "version", "streams")
               if not callable(getattr(store, name, None))]
    if missing:
        raise TypeError(
            f"AimuInbox: store must be a nous_inbox store (or have append, read, version and "
            f"streams); {type(store).__name__} has no {', '.join(missing)}"
        )


@attrs.define(repr=False, eq=False)
class AimuInbox:
    """A host-side mailbox satisfying aimu's ``Inbox`` protocol, routed by agent name.

    ``steer``, ``inject`` and ``followup`` may be called from any thread; ``reader`` is aimu's.
    ``store`` (optional) makes every queued message durable; see the module notes. Something
    that is not a store is refused at once:

    >>> AimuInbox("sqlite:inbox.db")
    Traceback (most recent call last):
    ...
    TypeError: AimuInbox: store must be a nous_inbox store (or have append, read, version and streams); str has no append, read, version, streams
    """

    _store: EventStore | None = attrs.field(default=None, validator=_check_store)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _journals: dict[str | None, Journal] = attrs.field(init=False, factory=dict)
    _clock: SendClock = attrs.field(init=False, factory=SendClock)

    def __attrs_post_init__(self) -> None:
        store = self._store
        if store is not None:
            for stream in store.streams():
                if not stream.startswith(STREAM_PREFIX):
                    continue
                rest = stream[len(STREAM_PREFIX):]
                if rest == "":
                    logger.warning("store stream %r names no agent; AimuInbox ignores it", stream)
                    continue
                self._journal(None if rest == "*" else rest)

    # -- the host's side ---------------------------------------------------------------------

    def steer(self, text: str | Message, agent: str | None = None) -> None:
        """Queue ``text`` for ``agent``'s next round boundary (any run's, when ``agent`` is None).

        The way to redirect a run in progress; it also tells a host that an idle agent is owed a
        run (``wants_wake``).
        """
        self._send(text, agent, STEER)

    def inject(self, text: str | Message, agent: str | None = None) -> None:
        """Queue ``text`` for the next round boundary without asking for a run of its own.

        Context for a run that is going anyway: ``wants_wake`` stays False for it.
        """
        self._send(text, agent, INJECT)

    def followup(self, text: str | Message, agent: str | None = None) -> None:
        """Queue ``text`` for ``agent``'s *next* run: no run already in progress receives it.

        "Answer this after you finish": the next run's first drain delivers it, before any step
        message.
        """
        self._send(text, agent, FOLLOWUP)

    def _send(self, text: object, agent: object, verb: Verb) -> None:
        where = f"AimuInbox.{verb.name}"
        name = check_agent(agent, where)
        message = _check_text(text, where)

        def change(box: Inbox) -> tuple[Inbox, list[Event], None]:
            # Stamped here, not once up front: a retry after a lost race has just read the other
            # writer's messages, and this one must sort after them.
            stamped = routing.stamped(message, self._clock.next())
            sent = sent_event(stamped, verb.target, verb.wakeup, at=time.time())
            return box.send(stamped, verb.target, verb.wakeup), [sent], None

        with self._lock:
            self._commit(name, change)

    # -- aimu's side -------------------------------------------------------------------------

    def reader(self, agent: str | None = None) -> Callable[[], list[str]]:
        """Open one run's drain; aimu calls this once per run, as it starts, with the run's name.

        The drain returns the text of every message the run has not yet had, oldest first (``[]``
        when there is none) and never waits. Messages it returns are claimed: no other run gets
        them. The run is owed the followups queued, in this process or any other writing to the
        store, at the moment ``reader`` is called.
        """
        name = check_agent(agent, "AimuInbox.reader")
        names = addresses(name)
        with self._lock:
            if self._store is not None:
                try:
                    self._catch_up_all(names)
                except Exception:
                    # aimu would run without a reader at all; with this process's view the run
                    # still gets every message, only a followup that another process sent just
                    # now may wait for the next run.
                    logger.warning(
                        "AimuInbox: could not read the store as a run opened; going by what "
                        "this process has seen",
                        exc_info=True,
                    )
            owed = {n: self._box(n).entries(_TURN) for n in names}
        return _RunDrain(self, name, owed)

    def _drain(self, agent: str | None, owed_turn: dict[str | None, Sequence[Entry]]) -> list[str]:
        """A round boundary of the run: make the claims the loop names for it on each address
        (the first drain of an address makes the turn's opening claims), when what they take is
        worth a round; the messages in claim order, each claim's merged in send order."""
        by_target: dict[Target, list[list[Message]]] = {}
        failure: Exception | None = None
        names = addresses(agent)
        with self._lock:
            if not self._worth_a_round(names, owed_turn):
                return []
            for name in names:
                try:
                    if self._store is not None:
                        self._journal(name).catch_up()
                    claims = round_claims(first=name in owed_turn)
                    claim = partial(claim_for_run, claims=claims, owed_turn=owed_turn.get(name))
                    taken = self._commit(name, claim)
                except Exception as exc:
                    # The other address may still deliver; what it claims must not be dropped.
                    failure = failure or exc
                    continue
                owed_turn.pop(name, None)
                for made, messages in zip(claims, taken, strict=True):
                    by_target.setdefault(made.target, []).append(messages)
        if failure is not None:
            if not any(m for lists in by_target.values() for m in lists):
                raise failure
            logger.warning("AimuInbox: part of a drain failed; delivering the rest", exc_info=failure)
        merged = [message for target in _CLAIM_ORDER
                  for message in heapq.merge(*by_target.get(target, ()), key=order_of)]
        return [message.content for message in merged]

    def _worth_a_round(
        self, names: Iterable[str | None], owed_turn: dict[str | None, Sequence[Entry]]
    ) -> bool:
        """Whether a drain now would hand the run a message worth a model round, as the loop
        rules it (:func:`~nous_inbox.commands.worth_a_round`, ruling 4).

        aimu makes a round of any text a drain returns (one more request at what would be its
        final answer, or in place of its nudge, with its budget refilled), and strips only
        whitespace itself. So a drain whose claims would take only blank messages (whitespace,
        or invisible characters only) claims nothing: they stay queued, owe no run
        (:meth:`wants_wake`), and ride along with the next drain that delivers something.
        Called with the lock held.
        """
        for name in names:
            if self._store is not None:
                try:
                    self._journal(name).catch_up()
                except Exception:
                    return True  # the drain reads again and says what failed
            claims = round_claims(first=name in owed_turn)
            _, _, taken = claim_for_run(self._box(name), claims, owed_turn.get(name))
            if worth_a_round(message for messages in taken for message in messages):
                return True
        return False

    # -- asking --------------------------------------------------------------------------------

    def pending(self, agent: str | None = None, target: Target | str | None = None) -> int:
        """How many queued messages a run opened as ``reader(agent)`` could receive.

        That is the messages addressed to ``agent`` plus the shared ones (only the shared ones
        for ``agent=None``), on ``target`` or on both queues, after reading what other writers
        appended to the store.

        >>> box = AimuInbox()
        >>> box.steer("a", agent="x"); box.inject("b"); box.followup("c", agent="y")
        >>> box.pending("x"), box.pending("y"), box.pending(), box.pending("x", "next_turn")
        (2, 2, 1, 0)
        """
        name = check_agent(agent, "AimuInbox.pending")
        with self._lock:
            self._catch_up_all(addresses(name))
            own = self._box(name).count(target)
            return own if name is None else own + self._box(None).count(target)

    def wants_wake(self, agent: str | None = None) -> bool:
        """Whether ``agent`` is owed a run: a message it could receive asked for one (a steer or
        a followup) and is worth a model round (:meth:`Inbox.worth_waking
        <nous_inbox.inbox.Inbox.worth_waking>`).

        The question a host asks when a run ends: a steer that landed after the run's last
        drain, or any followup, is owed a new run. An inject alone is not, nor a blank message
        (ruling 4). It counts what other processes sent and claimed through the store too.

        >>> box = AimuInbox()
        >>> box.steer("  \\u200b", agent="a"); box.wants_wake("a")
        False
        >>> box.steer("check the tests", agent="a"); box.wants_wake("a")
        True
        """
        name = check_agent(agent, "AimuInbox.wants_wake")
        with self._lock:
            self._catch_up_all(addresses(name))
            if self._box(name).worth_waking():
                return True
            return name is not None and self._box(None).worth_waking()

    def inbox(self, agent: str | None = None) -> Inbox:
        """The ``Inbox`` value queued for exactly this address (``None``: the shared one).

        With a store, it is the value the address's stream replays to, other writers included.
        """
        name = check_agent(agent, "AimuInbox.inbox")
        with self._lock:
            self._catch_up_all((name,))
            return self._box(name)

    def __repr__(self) -> str:
        # This process's view only: a repr must not do I/O (or fail because a store does).
        with self._lock:
            counts = {
                name: journal.session.inbox.count()
                for name, journal in self._journals.items()
                if journal.session.inbox.count()
            }
        return f"AimuInbox(pending={counts!r})"

    # -- the value swap and the log ------------------------------------------------------------

    def _journal(self, name: str | None) -> Journal:
        """``name``'s journal, replayed from the store the first time it is asked for.

        Called with the lock held.
        """
        journal = self._journals.get(name)
        if journal is None:
            journal = Journal(self._store, stream_name(name), on_events=self._saw,
                              transcript=False)  # aimu keeps the transcript; we keep the queues
            self._journals[name] = journal
            for target in (_TURN, _STEP):
                self._clock.saw(m for m, _ in journal.session.inbox.entries(target))
        return journal

    def _box(self, name: str | None) -> Inbox:
        journal = self._journals.get(name)
        return _EMPTY if journal is None else journal.session.inbox

    def _commit(
        self, name: str | None, change: Callable[[Inbox], tuple[Inbox, list[Event], _T]]
    ) -> _T:
        """Log the events ``change`` computes from ``name``'s value; the journal folds them in.

        Called with the lock held. A lost race with another writer of the stream is answered by
        reading what it wrote and computing the change again; on any other failure nothing
        changed. (``change`` also returns the value it expects; the fold of its events is the
        value kept, and the two are the same by construction: replay equals live.)
        """

        def events_of(session: Session) -> tuple[list[Event], _T]:
            _, events, result = change(session.inbox)
            return events, result

        _, result = self._journal(name).commit(events_of)
        return result

    def _saw(self, events: Sequence[Event]) -> None:
        # Every send position read here moves this process's clock past it.
        self._clock.saw(e.message for e in events if isinstance(e, MessageSent))

    def _catch_up_all(self, names: Iterable[str | None]) -> None:
        """Fold in what was appended to the streams of ``names`` since this process last saw
        them, when there is a store; called with the lock."""
        if self._store is not None:
            for name in names:
                self._journal(name).catch_up()
