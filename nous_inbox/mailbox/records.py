"""The mailbox's records: what its fold keeps for each message, thread and recipient.

Each kept message is a :class:`Mail` (its event and how far it got). Each recipient has an
:class:`AgentMail`: its queued messages in send order, the new ones (no notice carried them) and
those that may wake it, each a queue read from the front, where a message that left it (taken,
read, withdrawn) is dropped when it gets there; and the messages it keeps but no longer has
queued (read, retracted). Messages let go leave only a :class:`Gone` behind (their ids, outcome and
parties), one for all that one event let go. A :class:`Thread` is grouped from a recipient's kept
messages when asked for. The fold that keeps them is
:class:`~nous_inbox.mailbox.state.MailboxState`.

The records hold no reference back to anything, so they are not tracked by the cyclic collector
(``gc=False``): thousands of queued messages never make a collection walk them.

>>> from nous_inbox.events import MailSent
>>> box = AgentMail()
>>> box.queue.append(Mail(MailSent(id="m1", sender="lead", recipient="dev", body="hi"), 1))
>>> box.first_queued().thread, box.first_fresh()
('lead', None)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set as AbstractSet
from typing import Literal

import msgspec

from nous_inbox.events import MailSent

__all__ = ["AgentMail", "Gone", "Mail", "Outcome", "Thread"]

Outcome = Literal["received", "withdrawn", "dropped", "released"]
"""What became of a message the mailbox no longer keeps."""


class Mail(msgspec.Struct, gc=False):
    """One message the mailbox keeps: its event, its send ``order`` (1, 2, ... over the stream's
    life, where an id, once forgotten, may come again) and how far it got."""

    event: MailSent
    order: int
    wakes: bool = False  # it may wake its idle recipient
    queued: bool = True  # not taken by receive nor read nor withdrawn
    fresh: bool = True  # no notice carried it, and it was not read nor taken
    noticed: bool = False
    read: bool = False
    retracted: bool = False
    answered_by: str | None = None
    settled: bool = False  # it owes nothing more: retention may let it go
    kept: bool = True  # not let go yet
    indexed: bool = False  # in the state's index by id

    @property
    def id(self) -> str:
        """The message's id."""
        return self.event.id

    @property
    def thread(self) -> str:
        """Its thread: the one its sender named, else the sender."""
        return self.event.thread or self.event.sender

    @property
    def state(self) -> str:
        """The furthest it got: retracted, answered, read, noticed or queued."""
        if self.retracted:
            return "retracted"
        if self.answered_by is not None:
            return "answered"
        if self.read:
            return "read"
        return "noticed" if self.noticed else "queued"


class Gone(msgspec.Struct, frozen=True, gc=False):
    """What the messages one event let go of left behind, one record for them all (a receive
    lets go of a batch): their ``ids`` and each one's ``sender``, the ``outcome`` and
    ``recipient`` they share, how many messages had been sent when they were let go (they are
    forgotten ``remember`` sends later), and the reply that answered each (``answers``, None
    when none was): the outcome, told only to each message's sender and recipient.

    >>> gone = Gone(("m1", "m2"), ("lead", "qa"), "received", "dev", 2)
    >>> gone.parties(1), gone.answered_by(1)
    (('qa', 'dev'), None)
    """

    ids: tuple[str, ...]
    senders: tuple[str, ...]
    outcome: Outcome
    recipient: str
    sends: int
    answers: tuple[str | None, ...] | None = None

    def parties(self, i: int) -> tuple[str, str]:
        """The sender and recipient of its ``i``-th message."""
        return self.senders[i], self.recipient

    def answered_by(self, i: int) -> str | None:
        """The reply that answered its ``i``-th message, if one did."""
        return None if self.answers is None else self.answers[i]


class Thread:
    """One thread of a recipient's messages, grouped on demand: kept messages in send order."""

    __slots__ = ("key", "mails")

    def __init__(self, key: str, mails: list[Mail]) -> None:
        self.key = key
        self.mails = mails

    @property
    def senders(self) -> tuple[str, ...]:
        """Who wrote in it, first writer first."""
        return tuple(dict.fromkeys(m.event.sender for m in self.mails))

    @property
    def unread(self) -> int:
        """How many of its messages are not read yet."""
        return sum(1 for m in self.mails if not m.read)

    @property
    def new(self) -> int:
        """How many of its messages no notice carried yet."""
        return sum(1 for m in self.mails if m.fresh)

    @property
    def newest(self) -> Mail:
        """Its newest message."""
        return self.mails[-1]


class AgentMail:
    """One recipient's share of the mailbox, and who it works with."""

    __slots__ = ("_gave_work", "_parent", "_started", "dropped", "fresh", "held", "queue",
                 "queued", "settled", "wakes_from", "waking")

    def __init__(self) -> None:
        self.queue: deque[Mail] = deque()  # queued messages in send order (and some that left)
        self.fresh: deque[Mail] = deque()  # new ones, oldest first (and some no longer new)
        self.waking: deque[Mail] = deque()  # new ones that may wake it (and some no longer)
        self.queued = 0  # how many of ``queue`` are still queued
        self.held: dict[str, Mail] = {}  # kept but no longer queued (read, retracted)
        self.settled: deque[Mail] = deque()  # settled ones, in the order they became so
        self.dropped = 0
        self._parent: str | None = None
        self._started = False
        self._gave_work: set[str] = set()
        # What ``rules.wakes`` said of a message of each (class, sender) for it, while what
        # that depends on (its parent, whether it started, whom it gave work) stays the same:
        # a send asks a dict, not the rule (found by the fold, cleared when those change).
        self.wakes_from: dict[tuple[str, str], bool] = {}

    @property
    def parent(self) -> str | None:
        """The agent declared to have started it."""
        return self._parent

    @parent.setter
    def parent(self, parent: str | None) -> None:
        if parent != self._parent:
            self._parent = parent
            self.wakes_from.clear()

    @property
    def started(self) -> bool:
        """Whether it has had a turn or taken any message yet."""
        return self._started

    @started.setter
    def started(self, started: bool) -> None:
        if started != self._started:
            self._started = started
            self.wakes_from.clear()

    @property
    def gave_work(self) -> AbstractSet[str]:
        """The agents it gave work to (grown by :meth:`give_work` only)."""
        return self._gave_work

    def give_work(self, agent: str) -> None:
        """It gave ``agent`` work: a result or report from ``agent`` may wake it now."""
        if agent not in self._gave_work:
            self._gave_work.add(agent)
            self.wakes_from.clear()

    @property
    def kept(self) -> int:
        """How many of its messages are kept: queued ones and held ones."""
        return self.queued + len(self.held)

    def first_queued(self) -> Mail | None:
        """The first of its queue still queued, dropping those before it that left."""
        queue = self.queue
        while queue and not queue[0].queued:
            queue.popleft()
        return queue[0] if queue else None

    def first_fresh(self, waking: bool = False) -> Mail | None:
        """The first of its new messages still new (of those that may wake it, if ``waking``),
        dropping those before it that are not."""
        waiting = self.waking if waking else self.fresh
        while waiting and not waiting[0].fresh:
            waiting.popleft()
        return waiting[0] if waiting else None
