"""The mailbox's link to the owners of its agents' sessions: what it needs of an owner, its note
of each attached agent, and the notices it delivers through them.

The mailbox hears of a running agent's boundaries through the owner's ``on_boundary`` hook, on the
run's own thread, before the claim there: everything that came since the last boundary goes in
right then as ONE notice (``send`` on the queue the claim takes), so a burst during a tool call
is one notice at the next step, and a turn that opens (a person's prompt, a followup) takes
whatever waits along. An idle agent gets a notice as a followup (a turn of its own) when the
rules say it is due. The mailbox reads the ``session`` (is a run going? is a prompt waiting? has
it had a turn?) and ``listen``s for claims, since a notice counts as heard only once a run
claimed it. :class:`nous_inbox.owner.Owner` is such a recipient; so is anything with these
members.

:class:`NoticeDelivery` is the mailbox's side of it (``attach``, ``detach``, ``tick``); what a
notice says and when it is due are :mod:`nous_inbox.mailbox.rules`'.

Locks. The owner tells its boundaries and reports a claim while holding its own lock, so the
order is always the owner's lock, then the mailbox's: the mailbox never waits for an owner's lock
while it holds its own. For an :class:`~nous_inbox.owner.Owner`, whether a notice is due and its
sending are one step: the mailbox takes the owner's lock (under which the owner records every
event and starts and ends its runs), looks and sends, before it lets go; the owner commits a send
from the thread holding its lock at once. So no run starts or ends, and no prompt arrives,
between the look and the send. A thread that already holds another attached owner's lock (a
listener that sends mail) only tries the lock, so two owners' threads never wait for each other;
if it is busy, the agent is handed to the delivery thread (started when first needed; with
``autotick``, the notice timer). Any other recipient is looked at twice, once to decide and once
right before the send (it has no lock to offer), and the gap between that look and the send
remains.

Two limits remain, known. The look reads the owner's folded session, which another process's
appends reach only once the owner folds them: a prompt appended from another terminal and not
folded yet is not seen. And the guard above knows only the owners attached to this mailbox: a
thread holding the lock of an owner that is not (a coordinator's listener relaying mail, an
owner attached to a second mailbox) blocks on the target's lock, and if the target's thread, in
a listener, sends to that first owner, the two wait for each other. Knowing it would take a
process-wide record of which thread holds which owner's lock: keep such relays one way.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

from nous_inbox.boundary import Boundary, BoundaryKind
from nous_inbox.events import Event, MailNoticed, QueueClaimed
from nous_inbox.mailbox.names import text
from nous_inbox.mailbox.records import Mail
from nous_inbox.mailbox.rules import DEBOUNCE, MAX_WAIT, NOTICE, compose, plan
from nous_inbox.mailbox.state import MailboxState
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.owner.sends import Refused
from nous_inbox.session import Session
from nous_inbox.verbs import FOLLOWUP, INJECT, STEER, Target

__all__ = ["AttachedAgent", "InFlight", "NoticeDelivery", "Recipient", "held"]

logger: Final = logging.getLogger("nous_inbox.mailbox")
_TURN: Final = Target.NEXT_TURN
_HOW: Final[dict[str, tuple[Target, bool]]] = {
    **{verb.name: (verb.target, verb.wakeup) for verb in (STEER, INJECT, FOLLOWUP)},
    "join": (_TURN, False),
}
"""Each way a notice goes, as the queue it joins and whether it wakes: the send verbs' (a notice
is never a person's prompt), and ``"join"``, the send no verb names (next turn, no wake), for a
notice that joins the turn opening now and so needs no wake of its own."""
_T = TypeVar("_T")


@runtime_checkable
class Recipient(Protocol):
    """The owner of an attached agent's session, as the mailbox uses it."""

    @property
    def session(self) -> Session:
        """The session as folded so far."""

    @property
    def running(self) -> bool:
        """Whether a run is going."""

    def send(self, message: Message, target: Target, wakeup: bool) -> Any:
        """Queue ``message`` on ``target``, waking if ``wakeup``."""

    def listen(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback`` with every event the session records from now on."""

    def on_boundary(self, callback: Callable[[Boundary], object]) -> Callable[[], None]:
        """Call ``callback`` at each boundary of a run, before its claim; returns the undo."""


def held(lock: threading.RLock) -> bool:
    """Whether this thread holds ``lock`` (an ``RLock`` knows; so does ``JournalPort``)."""
    return bool(lock._is_owned())  # type: ignore[attr-defined]


def _closed(owner: object) -> bool:
    """Whether ``owner`` says it is closed (an :class:`~nous_inbox.owner.Owner` does, through
    ``closed``; a recipient without it is taken as open)."""
    closed = getattr(owner, "closed", False)
    return closed is True


def _lock_of(owner: object) -> threading.RLock | None:
    """The lock ``owner`` records its events, starts and ends its runs and calls its listeners
    under, if it is an :class:`~nous_inbox.owner.Owner` (None for any other recipient)."""
    return owner._lock if isinstance(owner, Owner) else None


class AttachedAgent:
    """One attached agent: its owner, the owner's lock if it has one we know, and the notice in
    flight (its id, the ids it carries and their messages' orders, or None for a notice an older
    version sent, which named no orders), with how much of the transcript is known not to hold
    it (``seen``: a run claims it into the transcript after that)."""

    __slots__ = ("agent", "in_flight", "lock", "owner", "seen", "unsubscribe")

    def __init__(self, agent: str, owner: Recipient) -> None:
        self.agent = agent
        self.owner = owner
        self.lock = _lock_of(owner)
        self.in_flight: InFlight | None = None
        self.seen = 0
        self.unsubscribe: Callable[[], None] | None = None  # from the owner's boundaries

    def carries(self, mail: Mail) -> bool:
        """Whether the notice in flight carries ``mail`` (that very message, not an earlier one
        with the same id, forgotten since)."""
        if self.in_flight is None:
            return False
        _, ids, orders = self.in_flight
        if orders is None:
            return mail.id in ids
        return any(i == mail.id and o == mail.order for i, o in zip(ids, orders, strict=True))


InFlight = tuple[str, tuple[str, ...], tuple[int, ...] | None]
"""A notice in flight: its id, the ids it carries and their orders (None: it named none)."""


def _carried(metadata: Any) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """The ids a notice's metadata names, and their orders: None if it names no orders (a notice
    an older version sent) or they do not pair up with the ids."""
    ids = tuple(metadata.get("ids", ()))
    orders = metadata.get("orders")
    if orders is None or len(orders) != len(ids):
        return ids, None
    return ids, tuple(orders)


def _heard(state: MailboxState, ids: Sequence[str], orders: Sequence[int] | None,
           ) -> tuple[str, ...]:
    """Those of ``ids`` the state keeps as the very messages a notice carried: the same order,
    when the notice names orders (an id may be sent again once forgotten: that is another
    message), else just the id (a notice an older version sent)."""
    if orders is None:
        return tuple(i for i in ids if state.is_kept(i))
    return tuple(i for i, o in zip(ids, orders, strict=True)
                 if (m := state.mail(i)) is not None and m.order == o)


class NoticeDelivery(abc.ABC):
    """The notice half of :class:`~nous_inbox.mailbox.mailbox.Mailbox`: agents attached to
    their owners, and the notices delivered to them when due."""

    _lock: threading.RLock
    _state: MailboxState
    _clock: Callable[[], float]
    _new_id: Callable[[], str]

    def __init__(self, *, debounce: float = DEBOUNCE, max_wait: float = MAX_WAIT,
                 autotick: bool = False) -> None:
        self._debounce = debounce
        self._max_wait = max_wait
        self._attached: dict[str, AttachedAgent] = {}
        self._closed = threading.Event()
        self._due = threading.Condition(self._lock)
        self._recheck: set[str] = set()
        self._deliverer: threading.Thread | None = None
        self._ticker: threading.Thread | None = None
        if autotick:
            self._ticker = threading.Thread(target=self._tick_forever, daemon=True,
                                            name="nous-inbox mailbox notices")
            self._ticker.start()

    @abc.abstractmethod
    def _catch_up(self) -> bool:
        """Fold in what other writers appended to the mailbox's stream (the mailbox's)."""

    @abc.abstractmethod
    def _commit(
        self, change: Callable[..., tuple[Sequence[Event], _T]], *args: Any
    ) -> tuple[Sequence[Event], _T]:
        """Append what ``change(*args, state)`` computes, and fold it in (the mailbox's)."""

    def attach(self, agent: str, owner: Recipient) -> None:
        """Deliver ``agent``'s mail to the session ``owner`` runs, as notices; a notice counts
        as heard only once a run claimed it.

        Reconciles with the session first: a notice the session already claimed marks its
        messages noticed (the very messages it carried: matched by id and order, since an id
        forgotten may be sent again as a new message; a notice written before notices named
        orders is matched by id alone); one still queued there is the notice in flight. The
        owner's listener is registered before the session is read, so a claim made meanwhile is
        seen either in what was read or by the listener (which waits for the mailbox's lock).
        """
        agent = text(agent, "agent", "attach")
        link = AttachedAgent(agent, owner)
        with self._lock:
            if agent in self._attached:
                raise ValueError(f"attach: agent {agent!r} is already attached")
        owner.listen(lambda event: self._on_session_event(link, event))
        link.unsubscribe = owner.on_boundary(lambda boundary: self._at_boundary(link, boundary))
        with self._lock:
            if agent in self._attached:
                raise ValueError(f"attach: agent {agent!r} is already attached")
            self._attached[agent] = link
            session = owner.session  # one value: its transcript and inbox agree
            # id -> the orders notices carried it under (None: a notice that named no orders)
            heard: dict[str, set[int] | None] = {}
            for message in session.transcript:
                if message.metadata.get("provenance") == NOTICE:
                    ids, orders = _carried(message.metadata)
                    for n, i in enumerate(ids):
                        known = heard.setdefault(i, set())
                        if orders is None or known is None:
                            heard[i] = None
                        else:
                            known.add(orders[n])

            def replayed(state: MailboxState) -> tuple[list[Event], None]:
                fresh = tuple(i for i, orders in heard.items()
                              if (m := state.mail(i)) is not None and m.fresh
                              and (orders is None or m.order in orders))
                return ([MailNoticed(recipient=agent, notice="(replayed)", ids=fresh,
                                     at=self._clock())] if fresh else []), None

            if heard:
                self._commit(replayed)
            link.seen = len(session.transcript)  # a notice in flight is claimed after these
            for target in Target:
                for message, _ in session.inbox.entries(target):
                    if message.metadata.get("provenance") == NOTICE:
                        link.in_flight = (message.metadata["notice"],
                                          *_carried(message.metadata))
        self.tick((agent,))

    def detach(self, agent: str) -> bool:
        """Stop delivering ``agent``'s mail to its owner; returns whether it was attached.

        Its messages stay in the mailbox (``receive``, ``read_thread``), and a later
        ``attach`` reconciles with the session again. The mailbox also lets go of an agent on
        its own once its owner refuses a notice because it is closed.
        """
        agent = text(agent, "agent", "detach")
        with self._lock:
            link = self._attached.pop(agent, None)
        if link is not None and link.unsubscribe is not None:
            link.unsubscribe()
        return link is not None

    def _carried(self, mail: Mail) -> bool:
        """Whether the notice on its way to ``mail``'s recipient carries it (with the lock)."""
        link = self._attached.get(mail.event.recipient)
        return link is not None and link.carries(mail)

    def _stop_delivery(self) -> None:
        """Stop the notice timer and the delivery thread."""
        self._closed.set()
        with self._lock:
            self._due.notify_all()
        for thread in (self._ticker, self._deliverer):
            if thread is not None and thread is not threading.current_thread():
                thread.join(5)

    def tick(self, agents: Iterable[str] | None = None) -> float | None:
        """Deliver every notice that is due now (to ``agents``, default every attached one);
        return when the next one falls due (or None).

        A send to an attached agent ticks it at once (so a running agent hears at its next
        step); what waits on the clock (the debounce, the bounded wait) needs a later tick: call
        this, or let ``autotick=True`` do it.
        """
        now = self._clock()
        with self._lock:
            self._catch_up()
            state = self._state
            links = [link for link in (self._attached.values() if agents is None else
                                       [self._attached[a] for a in agents if a in self._attached])
                     if link.in_flight is None and state.oldest_fresh(link.agent) is not None]
        due: float | None = None
        for link in links:
            when = self._deliver(link, now)
            if when is not None:
                due = when if due is None else min(due, when)
        if due is not None and self._ticker is not None:
            with self._lock:
                self._due.notify_all()  # the timer thread may need to wake sooner
        return due

    def _at_boundary(self, link: AttachedAgent, boundary: Boundary) -> None:
        """The owner's run reached ``boundary`` (on its thread, holding its lock): what came since
        the last one goes in now, as one notice; after a turn, an idle agent's rules apply."""
        if self._attached.get(link.agent) is link:
            self._deliver(link, self._clock(), boundary.kind)

    def _deliver(self, link: AttachedAgent, now: float, boundary: BoundaryKind | None = None,
                 ) -> float | None:
        """Send ``link``'s notice if one is due; else return when to look again (or None).

        Never called with the mailbox's lock held (the owner's comes first, see the module).
        """
        lock = link.lock
        if lock is None:
            return self._deliver_unlocked(link, now, boundary)
        # Free, or ours already (a claim's listener: only counted again): no need to look at
        # the other owners, so a send costs the same however many agents are attached.
        if not lock.acquire(False):
            # Busy: wait for it, unless this thread holds another attached owner's lock (a
            # listener of that owner sending mail): two such threads could each wait for the
            # other's.
            with self._lock:
                others = [d.lock for d in self._attached.values() if d is not link and d.lock]
            if any(held(other) for other in others):
                self._defer(link.agent)
                return None
            lock.acquire()
        try:
            how, when, message = self._decide(link, now, boundary)
            if how is None or message is None:
                return when
            # Still under the owner's lock: the owner commits it at once, and nothing it does
            # (a run ending, a prompt) comes between the look above and this send.
            self._hand_over(link, how, message)
            return None
        finally:
            lock.release()

    def _decide(self, link: AttachedAgent, now: float, boundary: BoundaryKind | None,
                ) -> tuple[str | None, float | None, Message | None]:
        """Under the mailbox's lock: how to send ``link``'s notice and the notice, now in flight;
        or no way, with when to look again (None: not at all, one is in flight or the agent left)."""
        with self._lock:
            if link.in_flight is not None or self._attached.get(link.agent) is not link:
                return None, None, None
            how, when = self._plan(link, now, boundary)
            if how is None:
                return None, when, None
            return how, when, self._compose(link)

    def _deliver_unlocked(self, link: AttachedAgent, now: float,
                          boundary: BoundaryKind | None,
                          ) -> float | None:
        """:meth:`_deliver` for a recipient with no lock to offer: decide, then look again
        right before sending, so an FYI's steer never starts a turn and no notice goes ahead of
        a prompt that came meanwhile (a gap between that look and the send remains)."""
        how, when, message = self._decide(link, now, boundary)
        if how is None or message is None:
            return when
        with self._lock:
            again, when = self._plan(link, now, boundary)
            if again is None:
                link.in_flight = None
                self._due.notify_all()
                return when
        self._hand_over(link, again, message)
        return None

    def _compose(self, link: AttachedAgent) -> Message:
        """The notice of what ``link``'s agent has not heard of, now in flight (with the lock)."""
        notice_id = f"notice-{self._new_id()}"
        message, ids = compose(self._state, link.agent, notice_id)
        # Claimed, it joins the transcript after what is there now.
        link.seen = len(link.owner.session.transcript)
        link.in_flight = (notice_id, ids, tuple(message.metadata["orders"]))
        return message

    def _hand_over(self, link: AttachedAgent, how: str, message: Message) -> None:
        """Hand the notice to the owner; one it refuses is not in flight any more."""
        try:
            sent = link.owner.send(message, *_HOW[how])
            if isinstance(sent, Refused):  # an AsyncOwner's refusal, raised where it is awaited
                sent.close()
                raise sent.error
        except Exception:
            with self._lock:
                link.in_flight = None
                closed = _closed(link.owner)
                if closed and self._attached.get(link.agent) is link:
                    del self._attached[link.agent]
            if closed:
                logger.warning("the owner of %r is closed: detached it (its mail stays)",
                               link.agent)
            else:
                logger.exception("delivering a notice to %r failed; it will be tried again",
                                 link.agent)

    def _defer(self, agent: str) -> None:
        """Have the delivery thread (or the timer) look at ``agent`` again, holding no lock."""
        with self._lock:
            self._recheck.add(agent)
            if self._ticker is None and self._deliverer is None and not self._closed.is_set():
                self._deliverer = threading.Thread(target=self._deliver_forever, daemon=True,
                                                   name="nous-inbox mailbox delivery")
                self._deliverer.start()
            self._due.notify_all()

    def _plan(self, link: AttachedAgent, now: float, boundary: BoundaryKind | None,
              ) -> tuple[str | None, float | None]:
        owner = link.owner
        session = owner.session
        return plan(self._state, link.agent, now, boundary=boundary,
                    running=owner.running or session.running,
                    # A turn will open for what waits only if the core finds it worth a round.
                    prompt_waiting=session.inbox.worth_waking(_TURN),
                    debounce=self._debounce, max_wait=self._max_wait)

    def _on_session_event(self, link: AttachedAgent, event: Event) -> None:
        # Runs inside the owner's lock: take only the mailbox's (never the other way round).
        if (type(event) is not QueueClaimed or link.in_flight is None
                or self._attached.get(link.agent) is not link):
            return
        with self._lock:
            if link.in_flight is None or self._attached.get(link.agent) is not link:
                return
            notice_id, ids, orders = link.in_flight
            # Look for the notice in all the transcript gained since it was sent, not in this
            # claim's share of it: a runner may claim several queues in one append (a framework
            # adapter opens a turn with next_turn and next_step at once), and the listener sees
            # each claim only once the whole append is folded, so the newest entries may be
            # another claim's. The transcript only grows: what was looked at stays looked at.
            transcript = link.owner.session.transcript
            seen, link.seen = link.seen, len(transcript)
            if not any(transcript[n].metadata.get("notice") == notice_id
                       for n in range(seen, len(transcript))):
                return
            link.in_flight = None

            def noticed(state: MailboxState) -> tuple[list[Event], None]:
                live = _heard(state, ids, orders)
                return ([MailNoticed(recipient=link.agent, notice=notice_id, ids=live,
                                     at=self._clock())] if live else []), None

            self._commit(noticed)
        # What came while it was on its way waits for the run's next boundary; an idle agent's
        # for its debounce or the bounded wait (the turn that claimed it ends at a boundary).

    def _deliver_forever(self) -> None:
        # Without autotick: check again each agent whose owner's lock was busy, once it is free.
        while not self._closed.is_set():
            with self._lock:
                self._due.wait_for(lambda: self._recheck or self._closed.is_set())
                agents, self._recheck = self._recheck, set()
            if agents and not self._closed.is_set():
                try:
                    self.tick(agents)
                except Exception:
                    logger.exception("the mailbox's notice delivery failed; retrying")

    def _tick_forever(self) -> None:
        while not self._closed.is_set():
            try:
                with self._lock:
                    self._recheck.clear()  # this tick checks every agent
                due = self.tick()
            except Exception:
                logger.exception("the mailbox's notice timer failed; retrying")
                due = None
            with self._lock:
                timeout = 1.0 if due is None else max(0.0, due - self._clock())
                self._due.wait_for(lambda: self._recheck or self._closed.is_set(),
                                   min(timeout, 1.0))

