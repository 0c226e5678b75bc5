"""The mailbox's state: what its stream of events folds into, one event at a time.

Every fact of the mailbox is an event (``nous_inbox.events``: ``MailSent``, ``MailDropped``,
``MailReceived``, ``MailNoticed``, ``MailRead``, ``MailAnswered``, ``MailWithdrawn``), and this
fold is the only place they change anything. A live mailbox folds each event it appends; a
restarted one folds the stored stream from the start and holds an equal state: the same queues,
threads, unread and noticed marks, counts and outcomes.

>>> from nous_inbox.events import MailSent, MailRead
>>> state = MailboxState()
>>> state.apply(MailSent(id="m1", sender="lead", recipient="dev", body="ship it", seq=1))
>>> state.apply(MailSent(id="m2", sender="qa", recipient="dev", body="fyi: green",
...                      kind="fyi", seq=2))
>>> state.pending("dev"), [t.key for t in state.threads("dev")]
(2, ['qa', 'lead'])
>>> state.apply(MailRead(recipient="dev", ids=("m1",), seq=3))
>>> state.pending("dev"), state.mail("m1").state
(1, 'read')

Design notes. The fold is mutable and kept under its mailbox's lock: a send is the hot path (the
benchmark races PraisonAI's deque), and a persistent value per send would cost several times a
few dict and list updates. For the same reason a message is not an object of its own: it is its
``MailSent`` event (kept by id) and an ``int`` of flags (its send order above the flag bits), so
a send allocates nothing the cyclic garbage collector tracks (the events are ``gc=False``). With
thousands of queued messages, each tracked object would make every collection walk them all;
measured, that alone cost more than the rest of a send. :class:`Mail` is a view built on demand.

Each recipient's :class:`Box` holds its messages in send order (``queue``, a list read from a
head index, so taking from the front is O(1)); a message taken out of the middle (read,
withdrawn) only changes its flags and is skipped when the head reaches it; the list is compacted
when more than half of it is gone. So every event costs O(messages it names), never O(queue
length), O(recipients) or O(threads). Threads are grouped from the kept messages when asked for
(a listing or a read), and a notice groups only the new ones. Retention (``retain`` messages kept
per recipient) lets go only of messages that are read and answered, in the order they became so;
a message let go leaves its outcome behind (its flags), so a resend of its id gets the same answer
after a restart. Equality compares :meth:`MailboxState.snapshot`, a plain structure of everything
observable.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Final, Literal

from nous_inbox.events import (
    MailAnswered,
    MailDropped,
    MailNoticed,
    MailRead,
    MailReceived,
    MailSent,
    MailWithdrawn,
)
from nous_inbox.message import thaw_json

__all__ = ["KINDS", "RETAIN", "Box", "Mail", "MailboxState", "Outcome", "Thread", "wakes"]

KINDS: Final = frozenset({"action", "blocker", "report", "fyi", "reply"})
"""The classes of a message; they decide whether it may wake an idle recipient (see ``wakes``)."""

RETAIN: Final = 500
"""Messages kept per recipient by default before settled ones (read and answered) are let go."""

Outcome = Literal["received", "withdrawn", "dropped", "released"]
"""What became of a message the mailbox no longer keeps."""

QUEUED: Final = 1  # not yet taken by receive or read, nor withdrawn
FRESH: Final = 2  # no notice carried it yet, and it was not read or taken
NOTICED: Final = 4
READ: Final = 8
RETRACTED: Final = 16
WAKES: Final = 32  # it may wake its idle recipient
RECEIVED: Final = 64  # the flags of a message no longer kept are only what became of it:
WITHDRAWN: Final = 128
DROPPED: Final = 256
RELEASED: Final = 512
ORDER: Final = 1024  # flags // ORDER is the message's place among every message sent
_OUTCOMES: Final[dict[int, Outcome]] = {
    RECEIVED: "received", WITHDRAWN: "withdrawn", DROPPED: "dropped", RELEASED: "released",
}
_OUTCOME_FLAGS: Final = {name: flag for flag, name in _OUTCOMES.items()}
_NEW: Final = QUEUED | FRESH
_COMPACT: Final = 1024  # a queue is compacted once it is this long and more than half gone


class Mail:
    """A view of one kept message: its event, flags and the reply that answered it, if any."""

    __slots__ = ("answered_by", "event", "flags")

    def __init__(self, event: MailSent, flags: int, answered_by: str | None) -> None:
        self.event = event
        self.flags = flags
        self.answered_by = answered_by

    @property
    def id(self) -> str:
        """The message's id."""
        return self.event.id

    @property
    def order(self) -> int:
        """Its place among every message sent (1, 2, ...; the seq is 0 without a store)."""
        return self.flags // ORDER

    @property
    def thread(self) -> str:
        """Its thread: the one its sender named, else the sender."""
        return self.event.thread or self.event.sender

    @property
    def state(self) -> str:
        """The furthest it got: retracted, answered, read, noticed or queued."""
        flags = self.flags
        if flags & RETRACTED:
            return "retracted"
        if self.answered_by is not None:
            return "answered"
        if flags & READ:
            return "read"
        return "noticed" if flags & NOTICED else "queued"


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
        return sum(1 for m in self.mails if not m.flags & READ)

    @property
    def new(self) -> int:
        """How many of its messages no notice carried yet."""
        return sum(1 for m in self.mails if m.flags & FRESH)

    @property
    def newest(self) -> Mail:
        """Its newest message."""
        return self.mails[-1]


class Box:
    """One recipient's share of the mailbox."""

    __slots__ = ("dropped", "fresh_head", "gave_work", "head", "kept", "parent", "queue",
                 "queued", "settled", "started", "waking")

    def __init__(self) -> None:
        self.queue: list[MailSent] = []  # its messages in send order; those gone are skipped
        self.head = 0  # queue[head] is the oldest message that may still be queued
        self.fresh_head = 0  # and queue[fresh_head] the oldest that may still be fresh
        self.queued = 0
        self.kept = 0  # how many of ``queue`` are not gone
        self.waking: deque[MailSent] = deque()  # those that may wake it (lazily cleaned)
        self.settled: deque[str] = deque()  # ids read and answered, in the order they became so
        self.dropped = 0
        self.parent: str | None = None  # who gave it its first work
        self.started = False  # whether it has taken any message yet
        self.gave_work: set[str] = set()  # the agents it gave work to


def wakes(box: Box, kind: str, sender: str) -> bool:
    """Whether a message of class ``kind`` from ``sender`` may wake ``box``'s idle agent.

    A blocker always may; a report only of work the recipient gave ``sender``; an action when it
    is the recipient's first work or comes from its parent (who gave it that first work). An FYI
    or a reply never wakes anyone (acpmux: other agents' messages are not turns).

    >>> box = Box()
    >>> wakes(box, "fyi", "lead"), wakes(box, "action", "lead"), wakes(box, "report", "lead")
    (False, True, False)
    """
    if kind == "action":
        return sender == box.parent or (box.parent is None and not box.started)
    if kind == "blocker":
        return True
    if kind == "report":
        return sender in box.gave_work
    return False


_EMPTY_BOX: Final = Box()


class MailboxState:
    """Everything the mailbox's events say, folded; ``retain`` bounds each recipient's kept mail."""

    def __init__(self, retain: int = RETAIN) -> None:
        self.retain = retain
        self.version = 0
        self.sent = 0
        self.events: dict[str, MailSent] = {}  # the kept messages by id
        self.flags: dict[str, int] = {}  # every id ever sent: its flags, or its outcome if gone
        self.answers: dict[str, str] = {}  # id -> the reply that answered it
        self.boxes: dict[str, Box] = {}

    # -- reading ------------------------------------------------------------------------------

    def box(self, agent: str) -> Box:
        """``agent``'s box (an empty one, not to be changed, if it has none yet)."""
        return self.boxes.get(agent, _EMPTY_BOX)

    def mail(self, id: str) -> Mail | None:
        """A view of the kept message ``id``, or None."""
        event = self.events.get(id)
        if event is None:
            return None
        return Mail(event, self.flags[id], self.answers.get(id))

    def outcome(self, id: str) -> tuple[Outcome, str | None] | None:
        """What became of ``id`` if the mailbox no longer keeps it (and the reply that answered
        it, if one did); None for a kept message or an id never sent."""
        if id in self.events:
            return None
        flags = self.flags.get(id)
        return None if flags is None else (_OUTCOMES[flags], self.answers.get(id))

    def pending(self, agent: str) -> int:
        """How many messages wait for ``agent`` (neither received nor read nor withdrawn)."""
        box = self.boxes.get(agent)
        return 0 if box is None else box.queued

    def oldest_queued(self, agent: str, limit: int) -> list[MailSent]:
        """The ``limit`` oldest queued messages for ``agent``."""
        box = self.boxes.get(agent)
        if box is None or not box.queued:
            return []
        i = self._head(box)  # first: it may compact the queue
        queue, flags = box.queue, self.flags
        end = min(len(queue), i + limit)
        found = queue[i:end]
        if all(flags[e.id] & QUEUED for e in found):
            return found  # the common case: no holes
        found = []
        i, end = box.head, len(queue)
        while i < end and len(found) < limit:
            event = queue[i]
            if flags[event.id] & QUEUED:
                found.append(event)
            i += 1
        return found

    def fresh(self, agent: str) -> Iterator[Mail]:
        """The messages ``agent`` has not heard of yet (no notice carried them), oldest first."""
        box = self.boxes.get(agent)
        if box is None:
            return iter(())
        queue, flags, answers = box.queue, self.flags, self.answers
        start = self._fresh_head(box)
        return (Mail(e, flags[e.id], answers.get(e.id)) for e in queue[start:]
                if flags[e.id] & FRESH)

    def oldest_fresh(self, agent: str, waking: bool = False) -> Mail | None:
        """The oldest fresh message of ``agent`` (only those that may wake it, if ``waking``)."""
        box = self.boxes.get(agent)
        if box is None:
            return None
        if waking:
            waiting = box.waking
            while waiting and not self.flags[waiting[0].id] & FRESH:
                waiting.popleft()
            return self.mail(waiting[0].id) if waiting else None
        i = self._fresh_head(box)
        return self.mail(box.queue[i].id) if i < len(box.queue) else None

    def kept(self, agent: str) -> list[Mail]:
        """The messages ``agent`` still has, in send order."""
        box = self.boxes.get(agent)
        if box is None:
            return []
        flags, answers, events = self.flags, self.answers, self.events
        return [Mail(e, flags[e.id], answers.get(e.id)) for e in box.queue if e.id in events]

    def threads(self, agent: str) -> list[Thread]:
        """``agent``'s threads, grouped from its kept messages, newest message first."""
        groups: dict[str, list[Mail]] = {}
        for mail in self.kept(agent):
            groups.setdefault(mail.thread, []).append(mail)
        threads = [Thread(key, mails) for key, mails in groups.items()]
        return sorted(threads, key=lambda t: t.mails[-1].order, reverse=True)

    def thread(self, agent: str, key: str) -> Thread | None:
        """``agent``'s thread ``key``, or None if it has no message there."""
        mails = [m for m in self.kept(agent) if m.thread == key]
        return Thread(key, mails) if mails else None

    def _head(self, box: Box) -> int:
        queue, flags = box.queue, self.flags
        i, end = box.head, len(queue)
        while i < end and not flags[queue[i].id] & QUEUED:
            i += 1
        box.head = i
        if end > _COMPACT and end > 2 * box.kept:
            self._compact(box)
        return box.head

    def _compact(self, box: Box) -> None:
        # Cut out the messages gone: mostly a consumed head, and holes retention let go of.
        queue, kept, head = box.queue, self.events, box.head
        before = sum(1 for e in queue[:head] if e.id in kept)
        box.queue = [e for e in queue if e.id in kept]
        box.head, box.fresh_head = before, 0

    def _fresh_head(self, box: Box) -> int:
        queue, flags = box.queue, self.flags
        i, end = max(box.fresh_head, box.head), len(queue)
        while i < end and not flags[queue[i].id] & FRESH:
            i += 1
        box.fresh_head = i
        return i

    # -- folding ------------------------------------------------------------------------------

    def apply(self, event: Any) -> None:
        """Fold one mailbox event in (events of other kinds are passed by)."""
        kind = type(event)
        if kind is MailSent:
            recipient = event.recipient
            box = self.boxes.get(recipient)
            if box is None:
                box = self.boxes[recipient] = Box()
            sender = event.sender
            cls = event.kind
            self.sent += 1
            flags = _NEW + self.sent * ORDER
            if cls == "action":
                if box.parent is None:
                    if not box.started:
                        flags |= WAKES
                    box.parent = sender
                elif sender == box.parent:
                    flags |= WAKES
                giver = self.boxes.get(sender)
                if giver is None:
                    giver = self.boxes[sender] = Box()
                giver.gave_work.add(recipient)
            elif wakes(box, cls, sender):
                flags |= WAKES
            id = event.id
            self.events[id] = event
            self.flags[id] = flags
            box.queue.append(event)
            box.queued += 1
            box.kept += 1
            if flags & WAKES:
                box.waking.append(event)
            if box.settled and box.kept > self.retain:
                self._trim(box)
        elif kind is MailReceived:
            box = self._box(event.recipient)
            box.started = True
            events, marks = self.events, self.flags
            taken = queued = 0
            for id in event.ids:
                if events.pop(id, None) is not None:
                    queued += marks[id] & QUEUED
                    marks[id] = RECEIVED
                    taken += 1
            box.queued -= queued
            box.kept -= taken
        elif kind is MailNoticed:
            self._box(event.recipient).started = True
            marks = self.flags
            for id in event.ids:
                if id in self.events and not marks[id] & RETRACTED:
                    marks[id] = (marks[id] | NOTICED) & ~FRESH
        elif kind is MailRead:
            box = self._box(event.recipient)
            box.started = True
            marks = self.flags
            for id in event.ids:
                if id in self.events and not marks[id] & READ:
                    if marks[id] & QUEUED:
                        box.queued -= 1
                    marks[id] = (marks[id] | READ) & ~_NEW
                    if id in self.answers:
                        self._settle(box, id)
        elif kind is MailAnswered:
            box = self._box(event.recipient)
            for id in event.ids:
                if id in self.events and id not in self.answers:
                    self.answers[id] = event.by
                    if self.flags[id] & READ:
                        self._settle(box, id)
        elif kind is MailWithdrawn:
            id = event.id
            if id in self.events:
                if event.retracted:
                    box = self._box(event.recipient)
                    if self.flags[id] & QUEUED:
                        box.queued -= 1
                    self.flags[id] = (self.flags[id] | RETRACTED) & ~_NEW
                else:
                    self._remove(id, "withdrawn")
        elif kind is MailDropped:
            if event.id in self.events:
                self._remove(event.id, "dropped")
            self._box(event.recipient).dropped += 1
        self.version = event.seq or self.version + 1

    def _box(self, agent: str) -> Box:
        box = self.boxes.get(agent)
        if box is None:
            box = self.boxes[agent] = Box()
        return box

    def _remove(self, id: str, outcome: Outcome) -> None:
        event = self.events.pop(id)
        box = self._box(event.recipient)
        if self.flags[id] & QUEUED:
            box.queued -= 1
        box.kept -= 1
        self.flags[id] = _OUTCOME_FLAGS[outcome]
        if len(box.queue) > _COMPACT and len(box.queue) > 2 * box.kept:
            self._head(box)  # which compacts

    def _settle(self, box: Box, id: str) -> None:
        box.settled.append(id)
        if box.kept > self.retain:
            self._trim(box)

    def _trim(self, box: Box) -> None:
        settled = box.settled
        while box.kept > self.retain and settled:
            id = settled.popleft()
            if id in self.events:
                self._remove(id, "released")

    # -- equality -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything observable, as plain values: two states are equal when these are."""
        boxes = {}
        for agent, box in sorted(self.boxes.items()):
            boxes[agent] = {
                "queue": [e.id for e in self.oldest_queued(agent, box.queued)],
                "fresh": [m.id for m in self.fresh(agent)],
                "threads": [(t.key, [m.id for m in t.mails], t.senders, t.unread, t.new)
                            for t in self.threads(agent)],
                "settled": [id for id in box.settled if id in self.events],
                "counts": (box.queued, box.kept, box.dropped),
                "family": (box.parent, box.started, sorted(box.gave_work)),
            }
        mails = {}
        for id, event in self.events.items():
            mails[id] = (event.sender, event.recipient, thaw_json(event.body), event.kind,
                         event.thread, event.correlation_id, event.reply_to, event.at,
                         self.flags[id], self.answers.get(id))
        return {"version": self.version, "sent": self.sent, "mails": mails,
                "gone": {id: self.outcome(id) for id in self.flags if id not in self.events},
                "boxes": boxes}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MailboxState):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]  # mutable
