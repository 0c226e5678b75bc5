"""The mailbox's state: what its stream of events folds into, one event at a time.

Every fact of the mailbox is an event (``nous_inbox.events``: ``MailSent``, ``MailDropped``,
``MailReceived``, ``MailNoticed``, ``MailRead``, ``MailAnswered``, ``MailWithdrawn``, and
``MailAgent`` for a declared parent or a first turn), and this fold is the only place they change
anything. A live mailbox folds each event it appends; a
restarted one folds the stored stream from the start and holds an equal state: the same queues,
threads, unread and noticed marks, counts and outcomes. What an event means (who may wake whom,
what settles a message) is asked of :mod:`nous_inbox.mailbox.rules`.

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

The records (a kept message, a recipient's share, a thread, what a message let go leaves) are
:mod:`nous_inbox.mailbox.records`. Messages and outcomes are found by id in dicts built when an
id is first looked up, so a send and a receive (which takes from the front) touch no dict. Every
event costs O(messages it names), never O(queue length), O(recipients) or O(threads); threads
are grouped when asked for.

What the state keeps is bounded by what is kept, not by what was ever sent. Retention
(``retain`` messages per recipient) lets go only of settled messages, in the order they became
so. A message let go (received, withdrawn, dropped, released) leaves only its id, outcome and
two parties behind (in a :class:`~nous_inbox.mailbox.records.Gone`, one for all that one event let
go), for a resend of its id,
``status`` and its parties' look-ups, until ``remember`` more messages were sent; then it is
forgotten, and a resend of its id is a new message. ``remember`` and ``retain`` are therefore
part of the fold: every process sharing a stream must use the same values. Equality compares
:meth:`MailboxState.snapshot`, a plain structure of everything observable.

The fold is mutable, kept under its mailbox's lock: a send is the hot path, and a persistent
value per send would cost several times a few appends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, islice
from operator import attrgetter
from typing import Any, Final

from nous_inbox.events import (
    MailAgent,
    MailAnswered,
    MailDropped,
    MailNoticed,
    MailRead,
    MailReceived,
    MailSent,
    MailWithdrawn,
)
from nous_inbox.frozen import thaw_json
from nous_inbox.mailbox import rules
from nous_inbox.mailbox.records import AgentMail, Gone, Mail, Outcome, Thread
from nous_inbox.mailbox.rules import GIVES_WORK, REMEMBER, RETAIN, wakes

__all__ = ["MailboxState"]

_TIDY: Final = 64
"""Slack for work done in batches: a recipient's queues are rebuilt without the messages that
left them once they hold this many more than four times what is still queued, and outcomes are
forgotten once this many more sends are due, so each is paid for by many events."""


_NOBODY: Final = AgentMail()
_consume: Final[Callable[[Iterable[Any]], None]] = deque(maxlen=0).extend
"""Runs an iterator to its end, keeping nothing (a C loop)."""

# Read by C callables, so a batch is checked or tidied without a Python frame per message.
_ID: Final = attrgetter("event.id")
_EVENT: Final = attrgetter("event")
_SENDER: Final = attrgetter("event.sender")
_ANSWER: Final = attrgetter("answered_by")
_QUEUED: Final = attrgetter("queued")
_FRESH: Final = attrgetter("fresh")
_KEPT: Final = attrgetter("kept")


class MailboxState:
    """Everything the mailbox's events say, folded; ``retain`` bounds each recipient's kept mail,
    ``remember`` how many sends the outcome of a message let go is remembered for."""

    def __init__(self, retain: int = RETAIN, remember: int = REMEMBER) -> None:
        self.retain = retain
        self.remember = remember
        self.version = 0  # the last event's seq when events carry one, else how many were folded
        self.sends = 0  # messages ever sent: the last one's order
        self.boxes: dict[str, AgentMail] = {}
        self._kept_count = 0  # messages kept
        # By id, indexed when first looked up (a send and a receive need no index):
        self._mails: dict[str, Mail] = {}  # kept messages
        self._gone: dict[str, tuple[Gone, int]] = {}  # outcomes of messages let go, still
        # remembered: the record and the message's place in it
        self._unindexed: list[Mail] = []  # sent since the last look-up (some let go since)
        self._forget: deque[Gone] = deque()  # outcomes in the order they were let go...
        self._gone_unindexed = 0  # ...the last this many of them not indexed yet
        self._forget_due = remember + _TIDY  # the sends at which some may be forgotten

    # -- reading ------------------------------------------------------------------------------

    def box(self, agent: str) -> AgentMail:
        """``agent``'s share (an empty one, not to be changed, if it has none yet)."""
        return self.boxes.get(agent, _NOBODY)

    def mail(self, id: str) -> Mail | None:
        """The kept message ``id``, or None."""
        return self._index().get(id)

    def is_kept(self, id: str) -> bool:
        """Whether the mailbox still keeps message ``id``."""
        return id in self._index()

    def outcome(self, id: str) -> tuple[Outcome, str | None] | None:
        """What became of ``id`` if the mailbox no longer keeps it (and the reply that answered
        it, if one did); None for a kept message or an id never sent (or forgotten)."""
        if id in self._index():
            return None
        found = self._gone.get(id)
        if found is None:
            return None
        gone, i = found
        return gone.outcome, gone.answered_by(i)

    def _index(self) -> dict[str, Mail]:
        """The kept messages by id, brought up to date (and the outcomes by id with them)."""
        if self._unindexed:
            mails = self._mails
            for mail in self._unindexed:
                if mail.kept:
                    mails[mail.event.id] = mail
                    mail.indexed = True
            self._unindexed.clear()
        if self._gone_unindexed:
            gone = self._gone
            for batch in islice(reversed(self._forget), self._gone_unindexed):
                for i, id in enumerate(batch.ids):
                    gone[id] = batch, i
            self._gone_unindexed = 0
        return self._mails

    def parties(self, id: str) -> tuple[str, str] | None:
        """The sender and recipient of ``id``, kept or let go (None: never sent, or forgotten):
        the agents it is theirs to see."""
        mail = self._index().get(id)
        if mail is not None:
            return mail.event.sender, mail.event.recipient
        found = self._gone.get(id)
        return None if found is None else found[0].parties(found[1])

    def pending(self, agent: str) -> int:
        """How many messages wait for ``agent`` (neither received nor read nor withdrawn)."""
        return self.box(agent).queued

    def oldest_queued(self, agent: str, limit: int) -> list[MailSent]:
        """The ``limit`` oldest queued messages for ``agent``."""
        box = self.boxes.get(agent)
        if box is None or not box.queued or limit <= 0:
            return []
        queue = box.queue
        box.first_queued()
        if len(queue) == box.queued:  # no message left from the middle: the first are taken
            return list(map(_EVENT, islice(queue, limit)))
        found: list[MailSent] = []
        for mail in queue:
            if mail.queued:
                found.append(mail.event)
                if len(found) == limit:
                    break
        return found

    def fresh(self, agent: str) -> Iterator[Mail]:
        """The messages ``agent`` has not heard of yet (no notice carried them), oldest first."""
        box = self.boxes.get(agent)
        if box is None or box.first_fresh() is None:
            return iter(())
        return (mail for mail in list(box.fresh) if mail.fresh)

    def oldest_fresh(self, agent: str, waking: bool = False) -> Mail | None:
        """The oldest fresh message of ``agent`` (only those that may wake it, if ``waking``)."""
        box = self.boxes.get(agent)
        if box is None:
            return None
        return box.first_fresh(waking)

    def kept(self, agent: str) -> list[Mail]:
        """The messages ``agent`` still has, in send order."""
        box = self.boxes.get(agent)
        if box is None:
            return []
        queued = [mail for mail in box.queue if mail.queued]
        return sorted([*box.held.values(), *queued], key=lambda mail: mail.order)

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

    # -- folding ------------------------------------------------------------------------------

    def apply(self, event: Any) -> None:
        """Fold one mailbox event in (events of other kinds are passed by)."""
        if type(event) is not MailSent:
            self._changed(event)
            self.version = event.seq or self.version + 1
            box = self.boxes.get(event.agent if type(event) is MailAgent else event.recipient)
            if box is not None and len(box.queue) + len(box.fresh) > 4 * box.queued + _TIDY:
                self._tidy(box)  # messages left the queues: drop them once they are many
            if len(self._unindexed) > 2 * self._kept_count + _TIDY:
                self._unindexed = list(compress(self._unindexed, map(_KEPT, self._unindexed)))
            return
        # A message is sent: it is queued and new, and may wake its recipient by its class.
        self.version = event.seq or self.version + 1
        sends = self.sends = self.sends + 1
        recipient = event.recipient
        box = self.boxes.get(recipient)
        if box is None:
            box = self.boxes[recipient] = AgentMail()
        waking = box.wakes_from.get((event.kind, event.sender))
        if waking is None:
            waking = self._first_from(box, event.kind, event.sender, recipient)
        mail = Mail(event, sends, waking)
        self._kept_count += 1
        self._unindexed.append(mail)
        box.queue.append(mail)
        box.fresh.append(mail)
        if waking:
            box.waking.append(mail)
        box.queued += 1
        if box.settled and box.kept > self.retain:
            self._trim(box)
        if sends >= self._forget_due:
            self._forget_old()

    def _first_from(self, box: AgentMail, cls: str, sender: str, recipient: str) -> bool:
        """Whether a message of class ``cls`` from ``sender`` may wake ``box``'s agent, asked
        of the rule once while what it depends on stays the same; and, for work given, the
        giver's note of it (so a hit in ``box.wakes_from`` means it was noted already)."""
        waking = box.wakes_from[cls, sender] = wakes(cls, sender, box.parent, box.started,
                                                     box.gave_work)
        if cls in GIVES_WORK and sender != box.parent:  # (the parent was told when declared)
            self._box(sender).give_work(recipient)
        return waking

    def _changed(self, event: Any) -> None:
        """Fold in an event that changes messages already sent (any but ``MailSent``)."""
        kind = type(event)
        if kind is MailReceived:
            box = self._box(event.recipient)
            box.started = True
            queue, ids = box.queue, event.ids
            box.first_queued()
            taken = list(islice(queue, len(ids))) if len(queue) == box.queued else []
            if tuple(map(_ID, taken)) == ids:  # the oldest queued, as a receive takes them
                # Off the queue's front at once, by C calls alone (no Python frame per message):
                # popleft as many times as were taken.
                _consume(islice(iter(queue.popleft, None), len(taken)))
                self._let_go(taken, "received", box, ids)
            else:
                self._let_go(self._kept(ids), "received", box)
        elif kind is MailNoticed:
            self._box(event.recipient).started = True
            for mail in self._kept(event.ids):
                mail.fresh = False
                if not mail.retracted:
                    mail.noticed = True
        elif kind is MailRead:
            box = self._box(event.recipient)
            box.started = True
            for mail in self._kept(event.ids):
                if not mail.read:
                    self._hold(box, mail)
                    mail.read = True
                    self._settle_if_due(box, mail)
        elif kind is MailAnswered:
            box = self._box(event.recipient)
            for mail in self._kept(event.ids):
                if mail.answered_by is None:
                    mail.answered_by = event.by
                    self._settle_if_due(box, mail)
        elif kind is MailWithdrawn:
            for mail in self._kept((event.id,)):
                if event.retracted:
                    box = self._box(event.recipient)
                    if mail.read:  # read already: the retraction is news, unread and new
                        mail.read = mail.settled = False
                        mail.fresh = True
                        box.fresh = deque(m for m in box.fresh if m is not mail)  # (rare)
                        box.fresh.append(mail)
                    else:
                        self._hold(box, mail)
                    mail.retracted = True
                    self._settle_if_due(box, mail)
                else:
                    self._let_go((mail,), "withdrawn", self._box(event.recipient))
        elif kind is MailDropped:
            for mail in self._kept((event.id,)):
                self._let_go((mail,), "dropped", self._box(event.recipient))
            self._box(event.recipient).dropped += 1
        elif kind is MailAgent:
            box = self._box(event.agent)
            if event.parent is not None:
                box.parent = event.parent
                self._box(event.parent).give_work(event.agent)
            box.started = box.started or event.worked

    def _forget_old(self) -> None:
        """Forget the outcomes of messages let go ``remember`` sends ago or more."""
        forget, gone, until = self._forget, self._gone, self.sends - self.remember
        while forget and forget[0].sends <= until:
            old = forget.popleft()
            if len(forget) < self._gone_unindexed:
                self._gone_unindexed = len(forget)  # it was not indexed
            else:
                for id in old.ids:
                    found = gone.get(id)
                    if found is not None and found[0] is old:
                        del gone[id]
        # Next time in a batch: an outcome is remembered up to _TIDY sends longer.
        self._forget_due = (forget[0].sends if forget else self.sends) + self.remember + _TIDY

    def _kept(self, ids: Iterable[str]) -> list[Mail]:
        """The kept messages among ``ids``."""
        mails = self._index()
        return [mail for id in ids if (mail := mails.get(id)) is not None]

    def _box(self, agent: str) -> AgentMail:
        box = self.boxes.get(agent)
        if box is None:
            box = self.boxes[agent] = AgentMail()
        return box

    def _hold(self, box: AgentMail, mail: Mail) -> None:
        """``mail`` is kept but no longer queued, nor new."""
        if mail.queued:
            mail.queued = False
            box.queued -= 1
            box.held[mail.id] = mail
        mail.fresh = False

    def _settle_if_due(self, box: AgentMail, mail: Mail) -> None:
        if mail.settled:
            return
        if rules.settled(mail.event.kind, read=mail.read, retracted=mail.retracted,
                   answered=mail.answered_by is not None):
            mail.settled = True
            box.settled.append(mail)
            self._trim(box)

    def _trim(self, box: AgentMail) -> None:
        settled_mail = box.settled
        while box.kept > self.retain and settled_mail:
            mail = settled_mail.popleft()
            if mail.kept and mail.settled:
                self._let_go((mail,), "released", box)

    def _let_go(self, mails: Sequence[Mail], outcome: Outcome, box: AgentMail,
                ids: tuple[str, ...] | None = None) -> None:
        """Stop keeping ``mails`` (of ``box``, with ``ids`` when the caller has them): only their
        outcome stays, in one record, for ``remember`` sends."""
        index, queued = self._mails, 0
        for mail in mails:
            if mail.queued:
                mail.queued = mail.fresh = mail.kept = False
                queued += 1
            else:
                del box.held[mail.event.id]
                mail.kept = False
            if mail.indexed:
                del index[mail.event.id]
        if mails:
            self._forget.append(Gone(
                tuple(map(_ID, mails)) if ids is None else ids, tuple(map(_SENDER, mails)),
                outcome, mails[0].event.recipient, self.sends,
                tuple(map(_ANSWER, mails)) if any(map(_ANSWER, mails)) else None))
            self._gone_unindexed += 1
            self._kept_count -= len(mails)
        box.queued -= queued
        if not box.queued:  # nothing queued: only a retraction of a read message may be new
            self._tidy(box)

    def _tidy(self, box: AgentMail) -> None:
        box.queue = deque(compress(box.queue, map(_QUEUED, box.queue))) if box.queued else deque()
        box.fresh = deque(compress(box.fresh, map(_FRESH, box.fresh)))
        box.waking = deque(compress(box.waking, map(_FRESH, box.waking)))

    # -- equality -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything observable, as plain values: two states are equal when these are."""
        boxes = {}
        for agent, box in sorted(self.boxes.items()):
            boxes[agent] = {
                "queue": [e.id for e in self.oldest_queued(agent, box.queued)],
                "fresh": [m.id for m in self.fresh(agent)],
                "waking": [m.id for m in list(box.waking) if m.fresh],
                "threads": [(t.key, [m.id for m in t.mails], t.senders, t.unread, t.new)
                            for t in self.threads(agent)],
                "settled": [m.id for m in box.settled if m.kept and m.settled],
                "counts": (box.queued, box.kept, box.dropped),
                "family": (box.parent, box.started, sorted(box.gave_work)),
            }
        kept = self._index()
        mails: dict[str, Any] = {id: (g.outcome, g.answered_by(i))
                                 for id, (g, i) in self._gone.items() if id not in kept}
        for id, mail in kept.items():
            event = mail.event
            mails[id] = (event.sender, event.recipient, thaw_json(event.body), event.kind,
                         event.thread, event.correlation_id, event.reply_to, event.at,
                         mail.order, mail.wakes, mail.state, mail.fresh, mail.queued,
                         mail.answered_by)
        return {"version": self.version, "sends": self.sends, "mails": mails, "boxes": boxes}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MailboxState):
            return NotImplemented
        return self.snapshot() == other.snapshot()

    __hash__ = None  # type: ignore[assignment]  # mutable
