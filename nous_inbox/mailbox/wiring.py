"""Wiring agents to their owners: what the mailbox needs from the owner of an agent's session,
its note of each one, and the notices it delivers through them.

The mailbox delivers notices through the owner's own verbs: a ``steer`` for a running turn, a
``followup`` to join a waiting prompt's turn or to wake an idle agent. It reads the ``session``
(is a run going? is a prompt waiting?) and ``listen``s for claims, since a notice counts as heard
only once a run claimed it. :class:`nous_inbox.owner.Owner` is such a recipient; so is anything
with these members.

:class:`Notices` is the mailbox's side of it (``attach``, ``tick``), kept here so the delivery
rules of :mod:`nous_inbox.mailbox.post` and the timing of notices each fit in one module. Locks:
the owner calls the mailbox back (a claim) while holding its own lock, so the mailbox never calls
the owner while holding the mailbox's; it decides under its lock and delivers after.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol, TypeVar, runtime_checkable

from nous_inbox.events import Event, MailNoticed, QueueClaimed
from nous_inbox.inbox import Target
from nous_inbox.mailbox.notice import NOTICE, compose, plan
from nous_inbox.mailbox.state import FRESH, MailboxState
from nous_inbox.message import Message
from nous_inbox.session import Session

__all__ = ["Desk", "Notices", "Recipient"]

logger: Final = logging.getLogger("nous_inbox.mailbox")
_TURN: Final = Target.NEXT_TURN
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

    def steer(self, message: Message) -> Any:
        """Queue ``message`` for the next step, waking."""

    def followup(self, message: Message) -> Any:
        """Queue ``message`` for the next turn, waking."""

    def listen(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback`` with every event the session records from now on."""


class Desk:
    """One attached agent: its owner and the notice in flight (id and the ids it carries)."""

    __slots__ = ("agent", "in_flight", "owner")

    def __init__(self, agent: str, owner: Recipient) -> None:
        self.agent = agent
        self.owner = owner
        self.in_flight: tuple[str, tuple[str, ...]] | None = None


class Notices:
    """The notice half of :class:`~nous_inbox.mailbox.post.Mailbox`: agents attached to their
    owners, and the notices delivered to them when due (see :mod:`nous_inbox.mailbox.notice`)."""

    _lock: threading.RLock
    _due: threading.Condition
    _closed: threading.Event
    _ticker: threading.Thread | None
    _state: MailboxState
    _desks: dict[str, Desk]
    _plain: bool
    _clock: Callable[[], float]
    _prefix: str
    _counter: itertools.count[int]
    _debounce: float
    _max_wait: float

    def _catch_up(self) -> bool:
        raise NotImplementedError  # the mailbox's

    def _commit(
        self, change: Callable[[MailboxState], tuple[Sequence[Event], _T]]
    ) -> tuple[Sequence[Event], _T]:
        raise NotImplementedError  # the mailbox's

    def attach(self, agent: str, owner: Recipient) -> None:
        """Deliver ``agent``'s mail to the session ``owner`` runs, as notices (see
        :mod:`nous_inbox.mailbox.notice`). A notice counts as heard only once a run claimed it.

        Reconciles with the session first: a notice the session already claimed marks its
        messages noticed; one still queued there is the notice in flight.
        """
        if type(agent) is not str or not agent:
            raise TypeError(f"attach: agent must be a non-empty str, got {agent!r}")
        desk = Desk(agent, owner)
        with self._lock:
            if agent in self._desks:
                raise ValueError(f"attach: agent {agent!r} is already attached")
            self._desks[agent] = desk
            self._plain = False  # a send to it may be due a notice
            heard: list[str] = []
            for message in owner.session.transcript:
                if message.metadata.get("provenance") == NOTICE:
                    heard.extend(message.metadata.get("ids", ()))
            state = self._state
            fresh = tuple(i for i in heard if (m := state.mail(i)) is not None and m.flags & FRESH)
            if fresh:
                self._commit(lambda state: ([MailNoticed(recipient=agent, notice="(replayed)",
                                                         ids=fresh, at=self._clock())], None))
            for target in Target:
                for message, _ in owner.session.inbox.entries(target):
                    if message.metadata.get("provenance") == NOTICE:
                        desk.in_flight = (message.metadata["notice"],
                                          tuple(message.metadata.get("ids", ())))
        owner.listen(lambda event: self._on_session_event(desk, event))
        self.tick()

    def tick(self, agents: Iterable[str] | None = None) -> float | None:
        """Deliver every notice that is due now (to ``agents``, default every attached one);
        return when the next one falls due (or None).

        A send to an attached agent ticks it at once (so a running agent hears at its next
        step); what waits on the clock (the debounce, the bounded wait) needs a later tick: call
        this, or let ``autotick=True`` do it.
        """
        now = self._clock()
        deliveries = []
        due: float | None = None
        with self._lock:
            self._catch_up()
            desks = self._desks.values() if agents is None else [
                self._desks[a] for a in agents if a in self._desks]
            for desk in desks:
                agent = desk.agent
                if desk.in_flight is not None:
                    continue
                session = desk.owner.session
                how, when = plan(self._state, agent, now,
                                 running=desk.owner.running or session.running,
                                 prompt_waiting=session.inbox.count(_TURN) > 0,
                                 debounce=self._debounce, max_wait=self._max_wait)
                if how is None:
                    if when is not None:
                        due = when if due is None else min(due, when)
                    continue
                notice_id = f"notice-{self._prefix}{next(self._counter)}"
                message, ids = compose(self._state, agent, notice_id)
                desk.in_flight = (notice_id, ids)
                deliveries.append((desk, how, message))
        if due is not None and self._ticker is not None:
            with self._lock:
                self._due.notify_all()  # the timer thread may need to wake sooner
        for desk, how, message in deliveries:
            try:
                if how == "steer":
                    desk.owner.steer(message)
                else:
                    desk.owner.followup(message)
            except Exception:
                logger.exception("delivering a notice to %r failed; it will be tried again",
                                 desk.agent)
                with self._lock:
                    desk.in_flight = None
        return due

    def _on_session_event(self, desk: Desk, event: Event) -> None:
        # Runs inside the owner's lock: take only the mailbox's (never the other way round).
        if type(event) is not QueueClaimed or desk.in_flight is None:
            return
        notice_id, ids = desk.in_flight
        transcript = desk.owner.session.transcript
        claimed = transcript[len(transcript) - event.count:]
        if not any(m.metadata.get("notice") == notice_id for m in claimed):
            return
        with self._lock:
            desk.in_flight = None
            live = tuple(i for i in ids if self._state.is_kept(i))
            if live:
                self._commit(lambda state: ([MailNoticed(recipient=desk.agent, notice=notice_id,
                                                         ids=live, at=self._clock())], None))
            self._due.notify_all()

    def _tick_forever(self) -> None:
        while not self._closed.is_set():
            try:
                due = self.tick()
            except Exception:
                logger.exception("the mailbox's notice timer failed; retrying")
                due = None
            with self._lock:
                timeout = 1.0 if due is None else max(0.0, due - self._clock())
                self._due.wait(min(timeout, 1.0))

