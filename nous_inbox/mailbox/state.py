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
few list appends. For the same reason a message is not an object of its own but a *position* in
three lists (its event, its id, an ``int`` of flags: a small one, which Python does not allocate;
its send order is its position plus ``cut``, see ``MailboxState._order``), so a send
allocates nothing the cyclic garbage collector tracks (the events are ``gc=False``) and inserts
into no dict: with thousands of queued messages, tracked objects made every collection
walk them all, and two dict inserts per send cost more than the rest of it. Ids are indexed
lazily, the first time one is looked up (a withdraw, a read, a notice, a resend of a given id);
a receive finds its messages at the head of the queue without the index. :class:`Mail` is a view
built on demand.

What the state keeps is bounded by what is kept, not by what was ever sent. A message let go
(received, withdrawn, dropped, released) leaves only its id and outcome behind, for a resend of
its id and ``status``; those are remembered while fewer than ``remember`` more messages were sent
after it was let go (at least; a little longer, until the next compaction), and then forgotten,
so a resend of its id is a new message. A message kept a long time (an idle recipient, a question
nobody answers) is still remembered that long after it is let go: the let-go stamps it with the
number of messages sent so far. Every so often a send compacts the three lists
(:meth:`MailboxState.compact`): it keeps the messages still kept, the last ``remember`` entries
and an eighth more (``late``), and those let go within the last ``remember`` sends; renumbers
them, and renumbers what names them (the recipients' queues and wake lists, the answers, the
index). A message let go within ``late`` sends of its own send is in those last entries for as
long as it is remembered; one let go later has its position appended to ``gone`` (in let-go
order, so by stamp), where compaction finds it. So the common case (mail received soon after it
came) costs the hot path only a comparison per receive. Compaction runs once the lists are twice
as long as what the last one kept (and at least ``_COMPACT_MIN`` longer), and costs
O(remember + kept messages + ``gone``), so its cost is spread over at least as many sends (a few
percent of a send and receive in the benchmark). Where it runs depends only on the events folded, so a replayed state
is compacted exactly like the live one; ``remember`` and ``retain`` are therefore part of the
fold: every process sharing a stream must use the same values, or they disagree on whether a
resend is a duplicate and on what retention let go.

Each recipient's :class:`Box` holds its messages' positions in send order (``queue``, read from a
head index, so taking from the front is O(1)); a message taken out of the middle (read,
withdrawn) only changes its flags and is skipped when the head reaches it; the list is compacted
when more than half of it is gone. So every event costs O(messages it names), never O(queue
length), O(recipients) or O(threads). Threads are grouped from the kept messages when asked for
(a listing or a read), and a notice groups only the new ones. Retention (``retain`` messages kept
per recipient) lets go only of settled messages, in the order they became so: read and answered;
read, for a class that asks no answer (an FYI, a report, a reply); or retracted (its sender took
it back, so it owes nothing), once read: a retraction is only told in the thread, and an
agent that heard of the message (a notice carried it) learns it no longer holds only by reading
it, so an unread retracted message is kept like any other unread one. A message let go leaves its
id and outcome behind (see above).
Equality compares :meth:`MailboxState.snapshot`, a plain structure of everything observable.
"""

from __future__ import annotations

import sys
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator
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

__all__ = ["KINDS", "NO_ANSWER", "REMEMBER", "RETAIN", "Box", "Mail", "MailboxState", "Outcome",
           "Thread", "wakes"]

KINDS: Final = frozenset({"action", "blocker", "report", "fyi", "reply"})
"""The classes of a message; they decide whether it may wake an idle recipient (see ``wakes``)."""

RETAIN: Final = 500
"""Messages kept per recipient by default before settled ones (read and answered) are let go."""

REMEMBER: Final = 10_000
"""Messages sent after one was let go during which its outcome is still remembered, by default
(however long it was kept before): a resend of its id within them answers what became of it and
carries nothing."""

NO_ANSWER: Final = frozenset({"fyi", "report", "reply"})
"""The classes that ask for no answer: reading such a message settles it."""

Outcome = Literal["received", "withdrawn", "dropped", "released"]
"""What became of a message the mailbox no longer keeps."""

QUEUED: Final = 1  # not yet taken by receive or read, nor withdrawn
FRESH: Final = 2  # no notice carried it yet, and it was not read or taken
NOTICED: Final = 4
READ: Final = 8
RETRACTED: Final = 16
WAKES: Final = 32  # it may wake its idle recipient
RECEIVED: Final = 64  # the flags of a message no longer kept are what became of it (and when):
WITHDRAWN: Final = 128
DROPPED: Final = 256
RELEASED: Final = 512
ORDER: Final = 1024  # a gone message's flags: its outcome plus ORDER times the number of
# messages sent when it was let go (a kept one's are below ORDER: see MailboxState._order)
_OUTCOME: Final = ORDER - 1
_OUTCOMES: Final[dict[int, Outcome]] = {
    RECEIVED: "received", WITHDRAWN: "withdrawn", DROPPED: "dropped", RELEASED: "released",
}
_NEW: Final = QUEUED | FRESH
_NEW_WAKING: Final = QUEUED | FRESH | WAKES
_COMPACT: Final = 1024  # a queue is compacted once it is this long and more than half gone
_UNBOUNDED: Final = sys.maxsize  # a fold without a bound (replay: the events already obey it)
_COMPACT_MIN: Final = 4096  # the lists are compacted once they grew at least this much since
# the last compaction (and doubled): whether the new entries are dead does not matter, the cost
# is spread over the sends that grew them either way


class Mail:
    """A view of one kept message: its event, flags and the reply that answered it, if any."""

    __slots__ = ("answered_by", "event", "flags", "order")

    def __init__(self, event: MailSent, flags: int, answered_by: str | None, order: int) -> None:
        self.event = event
        self.flags = flags
        self.answered_by = answered_by
        self.order = order  # its place among every message sent (1, 2, ...; not the seq)

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
    """One recipient's share of the mailbox (messages named by their position in the log)."""

    __slots__ = ("dropped", "fresh_head", "gave_work", "head", "held", "parent", "queue",
                 "queued", "settled", "started", "waking")

    def __init__(self) -> None:
        self.queue: list[int] = []  # its messages in send order; those gone are skipped
        self.head = 0  # queue[head] is the oldest message that may still be queued
        self.fresh_head = 0  # and queue[fresh_head] the oldest that may still be fresh
        self.queued = 0
        self.held = 0  # how many of ``queue`` are kept but no longer queued (read, retracted)
        self.waking: deque[int] = deque()  # those that may wake it (lazily cleaned,
        # and emptied once nothing is queued: a fresh message is a queued one)
        self.settled: deque[int] = deque()  # read and answered, in the order they became so
        self.dropped = 0
        self.parent: str | None = None  # who gave it its first work
        self.started = False  # whether it has taken any message yet
        self.gave_work: set[str] = set()  # the agents it gave work to

    @property
    def kept(self) -> int:
        """How many of its messages are kept (not gone): queued ones and held ones. Two counts,
        not this one, so a send and a receive each change only ``queued``."""
        return self.queued + self.held


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
    """Everything the mailbox's events say, folded; ``retain`` bounds each recipient's kept mail,
    ``remember`` how long the outcome of a message let go is remembered (see the module notes).

    Every message the state still knows of has a position (0, 1, 2, ... in send order):
    ``log[p]`` is its event while it is kept (None once gone), ``ids[p]`` its id and ``marks[p]``
    its flags (or, once gone, what became of it and when). ``gone`` lists, in let-go order, the
    positions let go more than ``late`` sends after their own send (since the last compaction,
    and those it still remembers). A compaction
    renumbers them; ``cut`` counts the entries it dropped, so ``len(log) + cut`` messages were
    ever sent. Positions are found from ids by an index built lazily: a mailbox used only to send
    and receive never needs it.
    """

    def __init__(self, retain: int = RETAIN, remember: int = REMEMBER) -> None:
        self.retain = retain
        self.remember = remember
        # ``version`` is this plus the sends folded (len(log) + cut, which compaction keeps):
        # the other events folded, or, once events carry a store's seq, what makes the last
        # one's seq. So a send without a store changes no count of its own.
        self._base = 0
        self.log: list[MailSent | None] = []
        self.ids: list[str] = []
        self.marks: list[int] = []
        self.answers: dict[int, str] = {}  # position -> the reply that answered it
        self.gone: list[int] = []  # positions let go late, in let-go order (so by their stamp)
        self.late = remember // 8  # let go within this many sends of its send: not in ``gone``
        self.boxes: dict[str, Box] = {}
        self.cut = 0  # entries compaction dropped (forgotten messages)
        self._orders: dict[int, int] = {}  # position -> send order, where not p + 1 + cut
        self._compact_at = _COMPACT_MIN  # the length of the lists at which a send compacts
        self._index: dict[str, int] = {}
        self._indexed = 0

    # -- reading ------------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The stream's version this state has folded: the last event's ``seq`` when events
        carry one (a store's), else how many events were folded."""
        return self._base + len(self.log) + self.cut

    def position(self, id: str) -> int | None:
        """The position of the message ``id`` (kept or gone), or None if it was never sent."""
        found = self._index.get(id)
        if found is None and self._indexed < len(self.ids):
            ids, start = self.ids, self._indexed
            self._index.update(zip(ids[start:], range(start, len(ids)), strict=True))
            self._indexed = len(ids)
            found = self._index.get(id)
        return found

    def is_kept(self, id: str) -> bool:
        """Whether the mailbox still keeps message ``id``."""
        p = self.position(id)
        return p is not None and self.log[p] is not None

    def box(self, agent: str) -> Box:
        """``agent``'s box (an empty one, not to be changed, if it has none yet)."""
        return self.boxes.get(agent, _EMPTY_BOX)

    def mail(self, id: str) -> Mail | None:
        """A view of the kept message ``id``, or None."""
        p = self.position(id)
        return None if p is None else self._view(p)

    def _view(self, p: int) -> Mail | None:
        event = self.log[p]
        if event is None:
            return None
        return Mail(event, self.marks[p], self.answers.get(p), self._order(p))

    def _order(self, p: int) -> int:
        """The send order of the kept message at position ``p`` (its place among every message
        sent): ``p + 1 + cut``, unless compaction moved it to the front of the lists.

        Not kept in its flags: a kept message's flags are below 256, so Python's cached small
        ints serve them and a send allocates no int for them."""
        order = self._orders.get(p)
        return p + 1 + self.cut if order is None else order

    def outcome(self, id: str) -> tuple[Outcome, str | None] | None:
        """What became of ``id`` if the mailbox no longer keeps it (and the reply that answered
        it, if one did); None for a kept message or an id never sent."""
        p = self.position(id)
        if p is None or self.log[p] is not None:
            return None
        return _OUTCOMES[self.marks[p] & _OUTCOME], self.answers.get(p)

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
        queue, marks, log = box.queue, self.marks, self.log
        found: list[MailSent] = []
        end = len(queue)
        while i < end and len(found) < limit:
            p = queue[i]
            if marks[p] & QUEUED:
                found.append(log[p])  # type: ignore[arg-type]  # queued means kept
            i += 1
        return found

    def fresh(self, agent: str) -> Iterator[Mail]:
        """The messages ``agent`` has not heard of yet (no notice carried them), oldest first."""
        box = self.boxes.get(agent)
        if box is None:
            return iter(())
        queue, marks = box.queue, self.marks
        start = self._fresh_head(box)
        return (self._view(p) for p in queue[start:] if marks[p] & FRESH)  # type: ignore[misc]

    def oldest_fresh(self, agent: str, waking: bool = False) -> Mail | None:
        """The oldest fresh message of ``agent`` (only those that may wake it, if ``waking``)."""
        box = self.boxes.get(agent)
        if box is None:
            return None
        if waking:
            waiting, marks = box.waking, self.marks
            while waiting and not marks[waiting[0]] & FRESH:
                waiting.popleft()
            return self._view(waiting[0]) if waiting else None
        i = self._fresh_head(box)
        return self._view(box.queue[i]) if i < len(box.queue) else None

    def kept(self, agent: str) -> list[Mail]:
        """The messages ``agent`` still has, in send order."""
        box = self.boxes.get(agent)
        if box is None:
            return []
        views = (self._view(p) for p in box.queue)
        return [view for view in views if view is not None]

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
        queue, marks = box.queue, self.marks
        i, end = box.head, len(queue)
        while i < end and not marks[queue[i]] & QUEUED:
            i += 1
        box.head = i
        if end > _COMPACT and end > 2 * (box.queued + box.held):
            self._compact(box)
        return box.head

    def _compact(self, box: Box) -> None:
        # Cut out the messages gone: mostly a consumed head, and holes retention let go of.
        queue, log, head = box.queue, self.log, box.head
        if not box.held and box.queued == len(queue) - head:
            # The common case: every kept message is queued, so none is before the head, and
            # every one from the head on is: the queue is its tail, one slice, no look at each.
            box.queue = queue[head:]
            box.head = box.fresh_head = 0
            return
        before = [p for p in queue[:head] if log[p] is not None]
        box.queue = before + [p for p in queue[head:] if log[p] is not None]
        box.head, box.fresh_head = len(before), 0

    def _fresh_head(self, box: Box) -> int:
        queue, marks = box.queue, self.marks
        i, end = max(box.fresh_head, box.head), len(queue)
        while i < end and not marks[queue[i]] & FRESH:
            i += 1
        box.fresh_head = i
        return i

    # -- folding ------------------------------------------------------------------------------

    def take(self, agent: str, limit: int) -> list[MailSent]:
        """Take the ``limit`` oldest queued messages of ``agent``: what folding the
        ``MailReceived`` naming them does, in one pass (a mailbox without a store records
        nothing, so it need not build the event)."""
        box = self.boxes.get(agent)
        if box is None or not box.queued or limit <= 0:
            return []
        i = self._head(box)
        queue, marks, log = box.queue, self.marks, self.log
        chunk = queue[i:i + limit]
        now = len(log) + self.cut
        received = RECEIVED + now * ORDER  # what became of them, and when
        # Let go late, if the oldest was (a queue is in send order): compaction must find them.
        late = now - self._order(chunk[0]) >= self.late  # queued: chunk is not empty
        if box.queued == len(queue) - i:
            # The common case: every message from the head on is queued (every queued one is
            # there), so the chunk has no hole (a read, a withdraw) and needs no look at flags.
            taken: list[MailSent] = [log[p] for p in chunk]  # type: ignore[misc]
            for p in chunk:
                marks[p] = received
                log[p] = None
            if late:
                self.gone += chunk
            i += len(chunk)
        else:
            taken = []
            gone = self.gone
            end = len(queue)
            while i < end and len(taken) < limit:
                p = queue[i]
                if marks[p] & QUEUED:
                    taken.append(log[p])  # type: ignore[arg-type]  # queued means kept
                    marks[p] = received
                    log[p] = None
                    if late:
                        gone.append(p)
                i += 1
        box.head = i  # nothing before it is queued now: the next take need not walk past them
        box.started = True
        box.queued -= len(taken)
        if not box.queued:
            box.waking.clear()  # a fresh message is a queued one: none of them is fresh now
        self._base += 1  # the MailReceived a store would have recorded
        return taken

    def sent(self, event: MailSent, bound: int = _UNBOUNDED) -> bool:
        """Fold one ``MailSent`` in: what :meth:`apply` does with it, called directly by a send.

        With ``bound``, only if fewer than that many messages are queued for its recipient;
        otherwise fold nothing and answer False (the send's overflow policy decides). The send
        checks its bound here, under the same look-up of the recipient as the fold."""
        recipient = event.recipient
        box = self.boxes.get(recipient)
        if box is None:
            box = self.boxes[recipient] = Box()
        elif box.queued >= bound:
            return False
        # Compaction runs at the same folded event live and in replay: only once the send is
        # sure to be folded (a send at the bound folds a drop first, then comes back here).
        log = self.log
        p = len(log)
        if p >= self._compact_at:
            self.compact()
            log = self.log
            p = len(log)
        sender = event.sender
        if sender == box.parent and event.kind == "action":
            # The commonest send: more work from the agent that gave this one its first work.
            # It wakes, and the sender is already among those that gave work (set with parent).
            log.append(event)
            self.ids.append(event.id)
            self.marks.append(_NEW_WAKING)
            box.queue.append(p)
            box.queued += 1
            box.waking.append(p)
            if box.settled and box.queued + box.held > self.retain:
                self._trim(box)
            if event.seq:
                self._base = event.seq - p - 1 - self.cut
            return True
        cls = event.kind
        flags = _NEW
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
        log.append(event)
        self.ids.append(event.id)
        self.marks.append(flags)
        box.queue.append(p)
        box.queued += 1
        if flags & WAKES:
            box.waking.append(p)
        if box.settled and box.queued + box.held > self.retain:
            self._trim(box)
        if event.seq:
            self._base = event.seq - p - 1 - self.cut
        return True

    def apply(self, event: Any) -> None:
        """Fold one mailbox event in (events of other kinds are passed by)."""
        kind = type(event)
        if kind is MailSent:
            self.sent(event)
            return
        if kind is MailReceived:
            box = self._box(event.recipient)
            box.started = True
            self._received(box, event.ids)
        elif kind is MailNoticed:
            self._box(event.recipient).started = True
            marks = self.marks
            for p in self._kept(event.ids):
                if not marks[p] & RETRACTED:
                    marks[p] = (marks[p] | NOTICED) & ~FRESH
        elif kind is MailRead:
            box = self._box(event.recipient)
            box.started = True
            marks = self.marks
            for p in self._kept(event.ids):
                if not marks[p] & READ:
                    settled = self._settled(p)
                    if marks[p] & QUEUED:
                        box.queued -= 1
                        box.held += 1
                    marks[p] = (marks[p] | READ) & ~_NEW
                    if not settled and self._settled(p):
                        self._settle(box, p)
        elif kind is MailAnswered:
            box = self._box(event.recipient)
            for p in self._kept(event.ids):
                if p not in self.answers:
                    settled = self._settled(p)
                    self.answers[p] = event.by
                    if not settled and self._settled(p):
                        self._settle(box, p)
        elif kind is MailWithdrawn:
            for p in self._kept((event.id,)):
                if event.retracted:
                    box = self._box(event.recipient)
                    settled = self._settled(p)
                    if self.marks[p] & QUEUED:
                        box.queued -= 1
                        box.held += 1
                    self.marks[p] = (self.marks[p] | RETRACTED) & ~_NEW
                    if not settled and self._settled(p):
                        self._settle(box, p)
                else:
                    self._remove(p, WITHDRAWN)
        elif kind is MailDropped:
            for p in self._kept((event.id,)):
                self._remove(p, DROPPED)
            self._box(event.recipient).dropped += 1
        if event.seq:
            self._base = event.seq - len(self.log) - self.cut
        else:
            self._base += 1

    def _kept(self, ids: Iterable[str]) -> list[int]:
        """The positions of the kept messages among ``ids``."""
        found = []
        log = self.log
        for id in ids:
            p = self.position(id)
            if p is not None and log[p] is not None:
                found.append(p)
        return found

    def _received(self, box: Box, taken: tuple[str, ...]) -> None:
        # A receive takes the oldest queued: walk the queue from its head, matching ids, so the
        # common case needs no index; an id out of step falls back to it.
        i = self._head(box)  # first: it may compact the queue
        queue, marks, log, ids = box.queue, self.marks, self.log, self.ids
        now = len(log) + self.cut
        received = RECEIVED + now * ORDER
        end = len(queue)
        count = queued = 0
        for id in taken:
            while i < end and not marks[queue[i]] & QUEUED:
                i += 1
            if i < end and ids[queue[i]] == id:
                p = queue[i]
                i += 1
            else:
                found = self._kept((id,))
                if not found:
                    continue
                p = found[0]
            queued += marks[p] & QUEUED
            if now - self._order(p) >= self.late:
                self.gone.append(p)
            marks[p] = received
            log[p] = None
            count += 1
        box.queued -= queued
        box.held -= count - queued
        if not box.queued:
            box.waking.clear()  # a fresh message is a queued one: none of them is fresh now

    def _box(self, agent: str) -> Box:
        box = self.boxes.get(agent)
        if box is None:
            box = self.boxes[agent] = Box()
        return box

    def _remove(self, p: int, outcome: int) -> None:
        event = self.log[p]
        assert event is not None
        box = self._box(event.recipient)
        if self.marks[p] & QUEUED:
            box.queued -= 1
        else:
            box.held -= 1
        now = len(self.log) + self.cut
        if now - self._order(p) >= self.late:
            self.gone.append(p)
        self.marks[p] = outcome + now * ORDER
        self.log[p] = None
        if len(box.queue) > _COMPACT and len(box.queue) > 2 * (box.queued + box.held):
            self._head(box)  # which compacts

    def _settled(self, p: int) -> bool:
        """Whether the kept message at ``p`` owes nothing more, so retention may let it go:
        read and answered; read, if its class asks no answer; or read and retracted.

        A retraction alone does not settle a message: it is only retracted because a notice
        carried it (or one on its way does), so its recipient was told of it, and the thread,
        where it shows as retracted, is the only place it learns that it no longer holds.
        """
        flags = self.marks[p]
        if not flags & READ:
            return False
        if flags & RETRACTED:
            return True
        event = self.log[p]
        return p in self.answers or (event is not None and event.kind in NO_ANSWER)

    def _settle(self, box: Box, p: int) -> None:
        box.settled.append(p)
        self._trim(box)

    def _trim(self, box: Box) -> None:
        settled = box.settled
        while box.queued + box.held > self.retain and settled:
            p = settled.popleft()
            if self.log[p] is not None:
                self._remove(p, RELEASED)

    # -- compaction ---------------------------------------------------------------------------

    def compact(self) -> None:
        """Drop what the state no longer needs: messages let go before the last ``remember``
        sends; renumber the rest, and everything that names them.

        A send calls it once the lists are at least twice as long as what they still needed
        after the last compaction (and ``_COMPACT_MIN`` longer), so it costs O(1) per send,
        amortized. The last ``remember + late`` entries stay whole (copied as slices): among
        them every message let go within ``late`` sends of its send that is still remembered.
        Of the older ones, only kept messages stay, found in their recipients' queues (every
        kept message is in its queue), and those let go late within the last ``remember``
        sends, found at the end of ``gone`` (in let-go order, so a bisection finds where they
        start). So the cost is O(remember + kept + ``gone``), not O(entries dropped). Queues and
        wake lists lose the messages gone; the index is rebuilt lazily.
        """
        log, ids, marks = self.log, self.ids, self.marks
        # Positions from here on all stay: a message let go at most ``late`` sends after its
        # send, while still remembered, was sent within the last remember + late.
        recent = max(0, len(log) - self.remember - self.late)
        # Remembered: let go when at least len(log) + cut - remember + 1 messages had been sent.
        since = (len(log) + self.cut - self.remember + 1) * ORDER
        remembered = self.gone[bisect_left(self.gone, since, key=marks.__getitem__):]
        old = [p for p in remembered if p < recent]
        for box in self.boxes.values():
            # A queue is in send order, so its positions before ``recent`` are a prefix; and
            # before its head only held messages are kept: with none, that part needs no look.
            queue = box.queue
            start = 0 if box.held else box.head
            old += [p for p in queue[start:bisect_left(queue, recent, start)]
                    if log[p] is not None]
        old.sort()
        shift = recent - len(old)  # a position p >= recent becomes p - shift
        moved = {p: i for i, p in enumerate(old)}

        def kept(positions: Iterable[int]) -> list[int]:
            # The new positions of the kept messages among ``positions``, in their order.
            return [p - shift if p >= recent else moved[p]
                    for p in positions if log[p] is not None]

        self.answers = {p - shift if p >= recent else moved[p]: by
                        for p, by in self.answers.items() if p >= recent or p in moved}
        # The kept messages moved to the front keep their send order aside (the rest shift with
        # ``cut``, so theirs is still p + 1 + cut).
        orders = {moved[p]: self._order(p) for p in old if log[p] is not None}
        orders.update((p - shift, order) for p, order in self._orders.items()
                      if p >= recent and log[p] is not None)
        self._orders = orders
        for box in self.boxes.values():  # while the old lists are in place (_fresh_head)
            if box.waking:
                # Only those still fresh may matter, and fresh ones are queued: none is older
                # than the oldest fresh message, so the older part goes without a look.
                i = self._fresh_head(box)
                if i < len(box.queue):
                    waking = list(box.waking)
                    box.waking = deque(kept(waking[bisect_left(waking, box.queue[i]):]))
                else:
                    box.waking = deque()
            if box.queue:
                before = kept(box.queue[:box.head]) if box.held else []
                box.queue = before + kept(box.queue[box.head:])
                box.head = box.fresh_head = len(before)
            if box.settled:
                box.settled = deque(kept(box.settled))
        self.gone = [p - shift if p >= recent else moved[p] for p in remembered]
        self.log, self.ids, self.marks = log[recent:], ids[recent:], marks[recent:]
        # The older survivors go in front of the slices (one move), not the slices after a
        # list of them: that copies the slice again, and costs several times as much.
        self.log[:0] = [log[p] for p in old]
        self.ids[:0] = [ids[p] for p in old]
        self.marks[:0] = [marks[p] for p in old]
        self.cut += shift
        self._index = {}
        self._indexed = 0
        size = len(self.log)
        self._compact_at = max(2 * size, size + _COMPACT_MIN)

    # -- equality -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything observable, as plain values: two states are equal when these are."""
        boxes = {}
        log, ids = self.log, self.ids
        for agent, box in sorted(self.boxes.items()):
            boxes[agent] = {
                "queue": [e.id for e in self.oldest_queued(agent, box.queued)],
                "fresh": [m.id for m in self.fresh(agent)],
                "threads": [(t.key, [m.id for m in t.mails], t.senders, t.unread, t.new)
                            for t in self.threads(agent)],
                "settled": [ids[p] for p in box.settled if log[p] is not None],
                "counts": (box.queued, box.queued + box.held, box.dropped),
                "family": (box.parent, box.started, sorted(box.gave_work)),
            }
        mails: dict[str, Any] = {}
        for p, event in enumerate(log):
            if event is None:
                mails[ids[p]] = (_OUTCOMES[self.marks[p] & _OUTCOME], self.answers.get(p))
            else:
                mails[ids[p]] = (event.sender, event.recipient, thaw_json(event.body),
                                 event.kind, event.thread, event.correlation_id, event.reply_to,
                                 event.at, self.marks[p], self._order(p), self.answers.get(p))
        return {"version": self.version, "mails": mails, "boxes": boxes}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MailboxState):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]  # mutable
