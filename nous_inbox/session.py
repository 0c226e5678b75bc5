"""Session: the state a stream of events folds into, and ``replay``, the fold.

A live owner and a reader of its log hold the same thing: the inbox value, the transcript and the
run bookkeeping, all derived from the events alone. ``replay(events)`` folds a stream from the
start; ``session.apply(event)`` folds one more. There is no second format: whatever the owner had
in memory, replaying its log gives back an equal ``Session``.

>>> from nous_inbox.events import MessageSent, QueueClaimed
>>> from nous_inbox.verbs import Target
>>> from nous_inbox.message import Message
>>> events = [
...     MessageSent(seq=1, target=Target.NEXT_STEP, wakeup=False, message=Message.user("fyi")),
...     MessageSent(seq=2, target=Target.NEXT_STEP, wakeup=True, message=Message.user("go")),
...     QueueClaimed(seq=3, target=Target.NEXT_STEP, count=2),
... ]
>>> session = replay(events)
>>> [m.content for m in session.transcript], session.inbox.has_pending(), session.version
(['fyi', 'go'], False, 3)

Replay checks itself: sequence numbers must run 1, 2, 3, ... with no gap, and a claim must take
exactly the number of messages the log says it took. Either mismatch is a ``ReplayError`` naming
the position, since a log that disagrees with itself must not be silently "repaired".

Design notes. ``Session.apply`` is a table from event type to a small fold function (``_APPLY``),
so which event changes what is read in one place. ``replay`` is the same fold written as one loop
over plain lists, for speed; ``tests/test_session.py`` holds the two to each other. A session,
like an inbox, is built with ``gc=False``: it holds only values that cannot point back at it, so
the cyclic collector need not track one per applied event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec
from pyrsistent import PVector, pvector

from nous_inbox._collector import collector_paused
from nous_inbox.errors import ReplayError
from nous_inbox.events import (
    CancelRequested,
    Event,
    MessageSent,
    MessageWithdrawn,
    ModelReplied,
    ModelRequested,
    Nudged,
    QueueClaimed,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.inbox import Inbox, as_target
from nous_inbox.message import Message
from nous_inbox.queued import Claimed
from nous_inbox.verbs import Target

__all__ = ["Session", "replay"]

_NO_MESSAGES: Final[PVector[Any]] = pvector()
_INERT: Final = frozenset({ModelRequested, ToolCalled, StepEnded, Warned})
"""Events that change nothing but the version: what a run asked and what it warned about."""
_STEP: Final = Target.NEXT_STEP
_TURN: Final = Target.NEXT_TURN


class Session(msgspec.Struct, frozen=True, gc=False):
    """One session's state: inbox value, transcript, and where its runs stand.

    ``version`` is the ``seq`` of the last event folded in (0 for a new session). ``turn`` and
    ``step`` number the latest turn and its latest step; ``running`` is whether that turn is
    still open (a log cut off mid-turn by a crash replays as running); ``cancelling`` is whether
    someone asked that open turn to end (a ``CancelRequested`` for it; see :meth:`cancel`).
    """

    inbox: Inbox = Inbox()
    transcript: PVector[Any] = _NO_MESSAGES
    version: int = 0
    turn: int = 0
    step: int = 0
    running: bool = False
    cancelling: bool = False

    def apply(self, event: Event, stream: str = "") -> Session:
        """Fold one event in and return the new session; ``ReplayError`` if it does not fit.

        ``stream`` only names the stream in error messages. Which event changes what is the
        table ``_APPLY`` below (event type -> fold); an event that changes nothing but the
        version (a model request, a warning, ...) is listed there too.

        >>> from nous_inbox.events import MessageSent
        >>> Session().apply(MessageSent(seq=1, target="next_step", wakeup=True,
        ...                             message=Message.user("go"))).inbox.wants_wake()
        True
        """
        seq = event.seq
        if seq != self.version + 1:
            raise _gap(stream, seq, self.version)
        return _APPLY.get(type(event), _count_only)(self, event, seq, stream)

    def apply_all(self, events: Iterable[Event], stream: str = "") -> Session:
        """Fold ``events`` in, in order: equal to applying each in turn, errors included.

        The fold of a batch, such as the events a journal appends at one boundary: an event
        that changes nothing but the version (a model request, a tool call, a step's end) moves
        a counter rather than building a session, so a batch builds one session per event that
        changes something, and at most one more for the version.

        >>> from nous_inbox.events import ModelRequested, StepEnded
        >>> Session().apply_all([ModelRequested(seq=1, turn=1, step=1, count=0),
        ...                      StepEnded(seq=2, turn=1, step=1)]).version
        2
        """
        # What a run's records change (the transcript, the step) is kept in locals, and a
        # session is built for the table's other folds only: one fold, written in two places,
        # which tests/test_session.py holds to ``apply``.
        session = self
        version = self.version
        transcript = self.transcript
        step = self.step
        for event in events:
            seq = event.seq
            if seq != version + 1:
                raise _gap(stream, seq, version)
            version = seq
            kind = type(event)
            if kind in _INERT:
                continue
            if kind is ModelReplied or kind is ToolReturned or kind is Nudged:
                transcript = transcript.append(event.message)  # type: ignore[union-attr]
            elif kind is StepStarted:
                step = event.step  # type: ignore[union-attr]
            else:
                fold = _FOLDS.get(kind)
                if fold is not None:
                    session = fold(Session(session.inbox, transcript, seq - 1, session.turn, step,
                                           session.running, session.cancelling),
                                   event, seq, stream)
                    transcript, step = session.transcript, session.step
        return Session(session.inbox, transcript, version, session.turn, step, session.running,
                       session.cancelling)

    def claim(
        self, target: Target | str, *, at: float = 0.0, wake_only: bool = False,
        limit: int | None = None,
    ) -> tuple[Claimed, QueueClaimed | None, Session]:
        """A claim made on this session, in one step: the messages taken, the ``QueueClaimed``
        recording it (numbered next, timed ``at``; ``None`` when nothing was taken) and the
        session it folds into, which equals ``self.apply(event)``.

        What is taken is :meth:`Inbox.claim <nous_inbox.inbox.Inbox.claim>`'s decision
        (``wake_only``, ``limit``). Every claimer that records its claim (the journal,
        :func:`~nous_inbox.store.journal.claim_event`) builds its event here, so the event always
        says what the core decided.

        >>> from nous_inbox.inbox import Inbox
        >>> session = Session(inbox=Inbox().inject("fyi"))
        >>> taken, event, after = session.claim("next_step", at=1.0)
        >>> [m.content for m in taken], event.count, event.seq, after == session.apply(event)
        (['fyi'], 1, 1, True)
        """
        where = as_target(target)
        claimed, inbox = self.inbox.claim(where, limit, wake_only=wake_only)
        count = len(claimed)
        if not count:
            return claimed, None, self
        seq = self.version + 1
        rest = inbox.count(where) if limit is not None else 0
        event = QueueClaimed(target=where, count=count, rest=rest, seq=seq, at=at)
        return claimed, event, _took(self, claimed, inbox, seq)

    def withdraw(self, sent: int, *, at: float = 0.0) -> MessageWithdrawn | None:
        """The event that takes back the message the send at seq ``sent`` queued (numbered
        next, timed ``at``), or ``None`` when that message is not queued: it was claimed or
        withdrawn already, or ``sent`` is no send of this session. The one place that decides
        whether a withdraw is recorded; where a message that is gone went is
        :func:`nous_inbox.receipts.receipt`'s answer, read from the log.

        >>> session = replay([MessageSent(seq=1, target="next_step", wakeup=True,
        ...                               message=Message.user("go"))])
        >>> event = session.withdraw(1)
        >>> event.sent, event.target, session.apply(event).inbox.has_pending()
        (1, <Target.NEXT_STEP: 'next_step'>, False)
        >>> print(session.apply(event).withdraw(1))        # gone already: nothing to record
        None
        """
        where = self.inbox.holds(sent)
        if where is None:
            return None
        return MessageWithdrawn(sent=sent, target=where, seq=self.version + 1, at=at)

    def cancel(self, *, at: float = 0.0) -> CancelRequested | None:
        """The request that cancels the open turn (numbered next, timed ``at``), or ``None``:
        no turn is open, or its cancel was asked already. The one place that decides whether a
        cancel is recorded, so one never outlives its turn and a second adds nothing.

        >>> from nous_inbox.events import TurnStarted
        >>> running = Session().apply(TurnStarted(seq=1, turn=1))
        >>> request = running.cancel()
        >>> request.turn, running.apply(request).cancelling, running.apply(request).cancel()
        (1, True, None)
        >>> print(Session().cancel())            # nothing runs: nothing to record
        None
        """
        if not self.running or self.cancelling:
            return None
        return CancelRequested(turn=self.turn, seq=self.version + 1, at=at)


# -- the fold of one event, by type: Session.apply's table -------------------------------------


def _sent(session: Session, sent: MessageSent, seq: int, stream: str) -> Session:
    return Session(
        session.inbox.send(sent.message, sent.target, sent.wakeup, seq),
        session.transcript, seq, session.turn, session.step, session.running, session.cancelling,
    )


def _withdrawn(session: Session, taken: MessageWithdrawn, seq: int, stream: str) -> Session:
    where, inbox = session.inbox.withdraw(taken.sent)
    if where is None or where != taken.target:
        raise _not_queued(stream, seq, taken)
    return Session(inbox, session.transcript, seq, session.turn, session.step, session.running,
                   session.cancelling)


def _claimed(session: Session, claim: QueueClaimed, seq: int, stream: str) -> Session:
    where = as_target(claim.target)
    queued = session.inbox.count(where)
    if queued != claim.count + claim.rest:
        raise _miscount(stream, seq, where, claim, queued)
    claimed, inbox = session.inbox.claim(where, claim.count if claim.rest else None)
    if not claimed:  # a recorded claim that took nothing: only the version moves
        return Session(inbox, session.transcript, seq, session.turn, session.step,
                       session.running, session.cancelling)
    return _took(session, claimed, inbox, seq)


def _took(session: Session, claimed: Claimed, inbox: Inbox, seq: int) -> Session:
    # A claim's fold once a claim took something: the one copy for ``apply`` and
    # ``Session.claim``.
    return Session(inbox, session.transcript.extend(claimed), seq, session.turn, session.step,
                   session.running, session.cancelling)


def _joined(
    session: Session, event: ModelReplied | ToolReturned | Nudged, seq: int, stream: str
) -> Session:
    return Session(
        session.inbox, session.transcript.append(event.message), seq, session.turn,
        session.step, session.running, session.cancelling,
    )


def _step_started(session: Session, started: StepStarted, seq: int, stream: str) -> Session:
    return Session(session.inbox, session.transcript, seq, session.turn, started.step,
                   session.running, session.cancelling)


def _turn_started(session: Session, started: TurnStarted, seq: int, stream: str) -> Session:
    return Session(session.inbox, session.transcript, seq, started.turn, 0, True)


def _turn_ended(session: Session, _: TurnEnded, seq: int, stream: str) -> Session:
    return Session(session.inbox, session.transcript, seq, session.turn, session.step, False)


def _cancel_requested(session: Session, asked: CancelRequested, seq: int, stream: str) -> Session:
    # A request for a turn that is not the open one (never recorded so) changes nothing else.
    cancelling = session.cancelling or (session.running and asked.turn == session.turn)
    return Session(session.inbox, session.transcript, seq, session.turn, session.step,
                   session.running, cancelling)


def _count_only(session: Session, _: Event, seq: int, stream: str) -> Session:
    return Session(session.inbox, session.transcript, seq, session.turn, session.step,
                   session.running, session.cancelling)


_Fold = Callable[[Session, Any, int, str], Session]
_APPLY: Final[Mapping[type, _Fold]] = MappingProxyType({
    MessageSent: _sent,
    MessageWithdrawn: _withdrawn,
    QueueClaimed: _claimed,
    ModelReplied: _joined,
    ToolReturned: _joined,
    Nudged: _joined,
    StepStarted: _step_started,
    TurnStarted: _turn_started,
    TurnEnded: _turn_ended,
    CancelRequested: _cancel_requested,
    ModelRequested: _count_only,
    ToolCalled: _count_only,
    StepEnded: _count_only,
    Warned: _count_only,
})
"""Event type -> how it folds into a session. A type not listed (the mailbox's events, kept in a
stream of their own) changes only the version, like the inert ones listed last."""
_FOLDS: Final[Mapping[type, _Fold]] = MappingProxyType({
    kind: fold for kind, fold in _APPLY.items() if fold is not _count_only
})
"""The folds that change more than the version: what :meth:`Session.apply_all` calls."""


def replay(events: Iterable[Event], start: Session | None = None, stream: str = "") -> Session:
    """Fold ``events`` into a session, from ``start`` (an empty session by default).

    The result equals what a live owner held after the same events, that is, what
    ``session.apply`` gives one event at a time, errors included. ``stream`` only names the
    stream in error messages.

    >>> from nous_inbox.events import Warned
    >>> replay([Warned(seq=2, text="late")])
    Traceback (most recent call last):
    ...
    nous_inbox.errors.ReplayError: seq 2: expected seq 1 after 0 (events must be numbered 1, 2, 3, ... with no gap)

    Design note: replaying a long log is the hot path of every restart, so this is one loop over
    plain lists rather than one new ``Session`` per event. Messages sent and not yet claimed
    wait in a list per queue; a claim moves them (after any the start inbox held) to the
    transcript list; the persistent vectors are built once, at the end. The checks and their
    messages are those of ``apply``. The cyclic garbage collector is paused while the loop
    runs: what a replay builds is acyclic, and with the collector on, each of its full passes
    walks every message already replayed, so a replay's time per event would grow with the log.
    Reference counting still frees everything as usual; the caller's collector state is
    restored on the way out, an exception included (``nous_inbox._collector.collector_paused``).
    """
    with collector_paused():
        return _replay(events, start, stream)


def _replay(events: Iterable[Event], start: Session | None, stream: str) -> Session:
    session = Session() if start is None else start
    inbox = session.inbox
    version, turn, step, running = session.version, session.turn, session.step, session.running
    cancelling = session.cancelling
    # Messages sent during this replay and not yet claimed, with their wake flags, per queue;
    # the start inbox's own entries (older) are claimed from it first.
    step_messages: list[Any] = []
    step_wakes: list[bool] = []
    step_seqs: list[int] = []
    turn_messages: list[Any] = []
    turn_wakes: list[bool] = []
    turn_seqs: list[int] = []
    older = {_STEP: inbox.count(_STEP), _TURN: inbox.count(_TURN)}
    added: list[Any] = []
    join = added.append
    # The loop dispatches on the exact type, which mypy cannot follow through ``kind``: each
    # branch reads only the fields of the type it matched, so the event is typed Any here.
    # The branches run in the order events are common in a runner's log: the inert ones (a
    # model request, a tool call, a step's end: a third of it), what joins the transcript,
    # step starts, then sends (most of a bare inbox's log) and claims.
    event: Any
    for event in events:
        version += 1
        if event.seq != version:
            raise _gap(stream, event.seq, version - 1)
        kind = type(event)
        if kind in _INERT:
            continue
        if kind is ModelReplied or kind is ToolReturned:
            join(event.message)
        elif kind is StepStarted:
            step = event.step
        elif kind is MessageSent:
            message = event.message
            target = event.target
            wakeup = event.wakeup
            if type(message) is not Message or (wakeup is not True and wakeup is not False):
                message, target, wakeup = _checked_send(message, target, wakeup)
            if target is _STEP:
                step_messages.append(message)
                step_wakes.append(wakeup)
                step_seqs.append(version)
            elif target is _TURN:
                turn_messages.append(message)
                turn_wakes.append(wakeup)
                turn_seqs.append(version)
            else:
                message, target, wakeup = _checked_send(message, target, wakeup)
                messages, wakes, seqs = ((step_messages, step_wakes, step_seqs) if target is _STEP
                                         else (turn_messages, turn_wakes, turn_seqs))
                messages.append(message)
                wakes.append(wakeup)
                seqs.append(version)
        elif kind is QueueClaimed:
            target = event.target
            if target is not _STEP and target is not _TURN:
                target = as_target(target)
            messages, wakes, seqs = ((step_messages, step_wakes, step_seqs) if target is _STEP
                                     else (turn_messages, turn_wakes, turn_seqs))
            count = event.count
            if not count and not event.rest and not messages and not older[target]:
                continue  # the commonest claim: nothing queued, nothing taken
            queued = len(messages) + older[target]
            if queued != count + event.rest:
                raise _miscount(stream, version, target, event, queued)
            if older[target]:  # the start inbox's entries are the oldest: claimed first
                from_start = min(count, older[target])
                claimed, inbox = inbox.claim(target, from_start)
                added.extend(claimed)
                older[target] -= from_start
                count -= from_start
            if count == len(messages):
                added.extend(messages)
                messages.clear()
                wakes.clear()
                seqs.clear()
            elif count:
                added.extend(messages[:count])
                del messages[:count]
                del wakes[:count]
                del seqs[:count]
        elif kind is MessageWithdrawn:
            target = as_target(event.target)
            messages, wakes, seqs = ((step_messages, step_wakes, step_seqs) if target is _STEP
                                     else (turn_messages, turn_wakes, turn_seqs))
            if event.sent in seqs:
                at = seqs.index(event.sent)
                del messages[at], wakes[at], seqs[at]
            else:  # sent before this replay began, or not queued at all (refused there)
                where, inbox = inbox.withdraw(event.sent)
                if where is not target:
                    raise _not_queued(stream, version, event)
                older[target] -= 1
        elif kind is TurnStarted:
            turn, step, running, cancelling = event.turn, 0, True, False
        elif kind is TurnEnded:
            running = cancelling = False
        elif kind is Nudged:
            join(event.message)
        elif kind is CancelRequested:
            cancelling = cancelling or (running and event.turn == turn)
    for message, wakeup, sent in zip(turn_messages, turn_wakes, turn_seqs, strict=True):
        inbox = inbox.send(message, _TURN, wakeup, sent)
    for message, wakeup, sent in zip(step_messages, step_wakes, step_seqs, strict=True):
        inbox = inbox.send(message, _STEP, wakeup, sent)
    transcript = session.transcript.extend(added) if added else session.transcript
    return Session(inbox, transcript, version, turn, step, running, cancelling)


def _gap(stream: str, seq: int, version: int) -> ReplayError:
    where = f"stream {stream!r} " if stream else ""
    return ReplayError(
        f"{where}seq {seq}: expected seq {version + 1} after {version} "
        f"(events must be numbered 1, 2, 3, ... with no gap)"
    )


def _miscount(
    stream: str, seq: int, target: Target, claim: QueueClaimed, queued: int
) -> ReplayError:
    where = f"stream {stream!r} " if stream else ""
    left = f" and leaves {claim.rest}" if claim.rest else ""
    return ReplayError(
        f"{where}seq {seq}: claim of {target.value} records {claim.count} "
        f"message(s){left} but {queued} were queued"
    )


def _not_queued(stream: str, seq: int, taken: MessageWithdrawn) -> ReplayError:
    where = f"stream {stream!r} " if stream else ""
    return ReplayError(
        f"{where}seq {seq}: withdraw of the message sent at seq {taken.sent} from "
        f"{as_target(taken.target).value}, but no such message is queued there"
    )


def _checked_send(message: Any, target: object, wakeup: Any) -> tuple[Message, Target, bool]:
    # An event built by hand (not decoded) may hold a str message or target: normalize it
    # exactly as Inbox.send would, raising its errors.
    where = as_target(target)
    entry = Inbox().send(message, where, wakeup).entries(where)[0]
    return entry[0], where, entry[1]
