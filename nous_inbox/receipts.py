"""Receipts: where a send went, read from the log. The one home of "where did send N go".

A send is acknowledged with the seq its ``MessageSent`` was stored at. From then on the message
is queued until a claim takes it into a run (ruling 1) or a withdraw takes it back: a
:class:`Receipt` says which, and for a claimed message which turn and step it joined. Every
front asks here: the owners' waits, ``nous-inbox steer --wait`` and ``withdraw``, the web face's
send endpoint and its page.

>>> from nous_inbox.events import MessageSent, QueueClaimed, StepEnded, StepStarted, TurnStarted
>>> from nous_inbox.message import Message
>>> log = [
...     TurnStarted(seq=1, turn=1), StepStarted(seq=2, turn=1, step=1),
...     MessageSent(seq=3, target="next_step", wakeup=True, message=Message.user("go")),
...     StepEnded(seq=4, turn=1, step=1), QueueClaimed(seq=5, target="next_step", count=1),
... ]
>>> receipt(log[:3], 3)
Receipt(sent=3, target=<Target.NEXT_STEP: 'next_step'>, state='queued')
>>> print(receipt(log, 3))
the message sent at seq 3 was claimed by turn 1 for step 2 (event #5)

A claim is recorded right before the model request it feeds, so a message claimed after step
``n`` of a turn (or at its opening, ``n`` = 0) is read by step ``n + 1``: that is the step a
receipt names. A claim outside any turn (a host taking a queue by hand) names turn 0.

Design notes. :class:`Deliveries` is the fold: it keeps the seqs still queued on each queue
(started from a session, whose inbox knows them) and where the open turn stands, and folding an
event answers the receipts that event settled. An owner keeps one beside its session and wakes
whoever waits for those sends; :func:`receipt` folds a whole log for a reader that holds no
session. Nothing settled is kept, so a long session costs it no more than its queues.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any, Final, Literal

import msgspec

from nous_inbox.events import (
    Event,
    MessageSent,
    MessageWithdrawn,
    QueueClaimed,
    StepStarted,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.inbox import as_target
from nous_inbox.session import Session
from nous_inbox.verbs import Target

__all__ = ["Deliveries", "Receipt", "ReceiptState", "receipt"]

ReceiptState = Literal["queued", "claimed", "withdrawn"]
"""Where a send's message is: still ``queued``, ``claimed`` into a run, or ``withdrawn``."""

_TURN: Final = Target.NEXT_TURN
_STEP: Final = Target.NEXT_STEP


class Receipt(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True,
              repr_omit_defaults=True):
    """Where the message the send at seq ``sent`` queued on ``target`` went.

    ``state`` is ``"queued"``, ``"claimed"`` or ``"withdrawn"``; for a claimed message ``turn``
    and ``step`` are the turn and step whose model request carried it (turn 0: claimed outside
    any turn); ``by`` is the seq of the ``QueueClaimed`` or ``MessageWithdrawn`` that settled
    it (0 while it is queued).

    >>> Receipt(sent=4, target=Target.NEXT_TURN, state="withdrawn", by=6).settled
    True
    """

    sent: int
    target: Target
    state: ReceiptState
    turn: int = 0
    step: int = 0
    by: int = 0

    @property
    def settled(self) -> bool:
        """Whether the message left its queue (claimed or withdrawn): a settled receipt never
        changes again."""
        return self.state != "queued"

    def __str__(self) -> str:
        said = f"the message sent at seq {self.sent}"
        if self.state == "queued":
            return f"{said} is still queued on {self.target.value}"
        if self.state == "withdrawn":
            return f"{said} was withdrawn (event #{self.by})"
        if not self.turn:
            return f"{said} was claimed outside any turn (event #{self.by})"
        return f"{said} was claimed by turn {self.turn} for step {self.step} (event #{self.by})"

    def to_dict(self) -> dict[str, Any]:
        """The receipt as a JSON-able dict (what the web face answers).

        >>> Receipt(sent=2, target=Target.NEXT_STEP, state="claimed", turn=1, step=1, by=3).to_dict()
        {'sent': 2, 'target': 'next_step', 'state': 'claimed', 'turn': 1, 'step': 1, 'by': 3}
        """
        return {"sent": self.sent, "target": self.target.value, "state": self.state,
                "turn": self.turn, "step": self.step, "by": self.by}


class Deliveries:
    """Follows each send to where it went: a fold of a session's log, from ``session`` (an
    empty one by default) on.

    :meth:`fold` takes events in log order and answers the receipts they settled;
    :meth:`queued` answers a send still waiting. It keeps only the seqs still queued and where
    the open turn stands, so it stays as small as the session's queues.

    >>> from nous_inbox.message import Message
    >>> deliveries = Deliveries()
    >>> deliveries.fold([MessageSent(seq=1, target="next_turn", wakeup=True,
    ...                              message=Message.user("hi"))])
    []
    >>> deliveries.queued(1).state
    'queued'
    >>> [r.state for r in deliveries.fold([MessageWithdrawn(seq=2, sent=1, target="next_turn")])]
    ['withdrawn']
    """

    __slots__ = ("_queues", "_running", "_since", "_step", "_turn")

    def __init__(self, session: Session | None = None) -> None:
        start = Session() if session is None else session
        self._since = start.version
        self._queues = {where: collections.deque(start.inbox.seqs(where)) for where in (_TURN, _STEP)}
        self._turn, self._step, self._running = start.turn, start.step, start.running

    def knows(self, sent: int) -> bool:
        """Whether the send at ``sent`` was folded here or waits in the session it started from
        (else its receipt is :func:`receipt`'s, read from the whole log)."""
        return sent > self._since or self.queued(sent) is not None

    def queued(self, sent: int) -> Receipt | None:
        """The receipt of the send at ``sent`` if its message is still queued, else ``None``."""
        for where, seqs in self._queues.items():
            if sent in seqs:
                return Receipt(sent=sent, target=where, state="queued")
        return None

    def fold(self, events: Iterable[Event]) -> list[Receipt]:
        """Fold ``events`` in (in log order); the receipts they settled, in order."""
        settled: list[Receipt] = []
        event: Any
        for event in events:  # typed Any: each branch reads only the fields of the type it matched
            kind = type(event)
            if kind is MessageSent:
                self._queues[as_target(event.target)].append(event.seq)
            elif kind is QueueClaimed and event.count:
                where = as_target(event.target)
                queue = self._queues[where]
                turn, step = (self._turn, self._step + 1) if self._running else (0, 0)
                for _ in range(min(event.count, len(queue))):
                    settled.append(Receipt(sent=queue.popleft(), target=where, state="claimed",
                                           turn=turn, step=step, by=event.seq))
            elif kind is MessageWithdrawn:
                where = as_target(event.target)
                queue = self._queues[where]
                if event.sent in queue:
                    queue.remove(event.sent)
                    settled.append(Receipt(sent=event.sent, target=where, state="withdrawn",
                                           by=event.seq))
            elif kind is StepStarted:
                self._step = event.step
            elif kind is TurnStarted:
                self._turn, self._step, self._running = event.turn, 0, True
            elif kind is TurnEnded:
                self._running = False
        return settled


def receipt(events: Iterable[Event], sent: int) -> Receipt:
    """Where the send at seq ``sent`` went, read from ``events``: a session's log from its
    first event. ``LookupError`` if the log holds no event at ``sent``; ``ValueError`` if the
    event there is not a send.

    >>> receipt([], 1)
    Traceback (most recent call last):
    ...
    LookupError: no event at seq 1 (the log ends at seq 0)
    """
    if type(sent) is not int or sent < 1:
        raise ValueError(f"a send's seq must be an int >= 1, got {sent!r}")
    deliveries = Deliveries()
    last = 0
    event: Event
    for event in events:
        last = event.seq
        if last == sent and type(event) is not MessageSent:
            raise ValueError(f"seq {sent} is a {type(event).__name__}, not a send")
        for settled in deliveries.fold((event,)):
            if settled.sent == sent:
                return settled
    found = deliveries.queued(sent)
    if found is None:
        raise LookupError(f"no event at seq {sent} (the log ends at seq {last})")
    return found
