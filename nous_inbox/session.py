"""Session: the state a stream of events folds into, and ``replay``, the fold.

A live owner and a reader of its log hold the same thing: the inbox value, the transcript and the
run bookkeeping, all derived from the events alone. ``replay(events)`` folds a stream from the
start; ``session.apply(event)`` folds one more. There is no second format: whatever the owner had
in memory, replaying its log gives back an equal ``Session``.

>>> from nous_inbox.events import MessageSent, QueueClaimed
>>> from nous_inbox.inbox import Target
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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec
from pyrsistent import PVector, pvector

from nous_inbox.errors import ReplayError
from nous_inbox.events import (
    Event,
    MessageSent,
    ModelReplied,
    Nudged,
    QueueClaimed,
    StepStarted,
    ToolReturned,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message

__all__ = ["Session", "replay"]

_NO_MESSAGES: Final[PVector[Any]] = pvector()


class Session(msgspec.Struct, frozen=True):
    """One session's state: inbox value, transcript, and where its runs stand.

    ``version`` is the ``seq`` of the last event folded in (0 for a new session). ``turn`` and
    ``step`` number the latest turn and its latest step; ``running`` is whether that turn is
    still open (a log cut off mid-turn by a crash replays as running).
    """

    inbox: Inbox = Inbox()
    transcript: PVector[Any] = _NO_MESSAGES
    version: int = 0
    turn: int = 0
    step: int = 0
    running: bool = False

    def apply(self, event: Event, stream: str = "") -> Session:
        """Fold one event in and return the new session; ``ReplayError`` if it does not fit.

        ``stream`` only names the stream in error messages.
        """
        seq = event.seq
        if seq != self.version + 1:
            where = f"stream {stream!r} " if stream else ""
            raise ReplayError(
                f"{where}seq {seq}: expected seq {self.version + 1} after {self.version} "
                f"(events must be numbered 1, 2, 3, ... with no gap)"
            )
        kind = type(event)
        if kind is MessageSent:
            sent: MessageSent = event  # type: ignore[assignment]
            return Session(
                self.inbox.send(sent.message, sent.target, sent.wakeup),
                self.transcript, seq, self.turn, self.step, self.running,
            )
        if kind is QueueClaimed:
            claim: QueueClaimed = event  # type: ignore[assignment]
            claimed, inbox = self.inbox.claim(claim.target)
            if len(claimed) != claim.count:
                where = f"stream {stream!r} " if stream else ""
                raise ReplayError(
                    f"{where}seq {seq}: claim of {claim.target.value} records {claim.count} "
                    f"message(s) but {len(claimed)} were queued"
                )
            transcript = self.transcript.extend(claimed) if claimed else self.transcript
            return Session(inbox, transcript, seq, self.turn, self.step, self.running)
        if kind is ModelReplied or kind is ToolReturned or kind is Nudged:
            message: Message = event.message  # type: ignore[union-attr]
            return Session(
                self.inbox, self.transcript.append(message), seq, self.turn, self.step,
                self.running,
            )
        if kind is StepStarted:
            return Session(
                self.inbox, self.transcript, seq, self.turn, event.step,  # type: ignore[union-attr]
                self.running,
            )
        if kind is TurnStarted:
            return Session(self.inbox, self.transcript, seq, event.turn, 0, True)  # type: ignore[union-attr]
        if kind is TurnEnded:
            return Session(self.inbox, self.transcript, seq, self.turn, self.step, False)
        return Session(self.inbox, self.transcript, seq, self.turn, self.step, self.running)

    @property
    def messages(self) -> list[Message]:
        """The transcript as a plain list."""
        return list(self.transcript)


def replay(events: Iterable[Event], start: Session | None = None, stream: str = "") -> Session:
    """Fold ``events`` into a session, from ``start`` (an empty session by default).

    The result equals what a live owner held after the same events. ``stream`` only names the
    stream in error messages.

    >>> from nous_inbox.events import Warned
    >>> replay([Warned(seq=2, text="late")])
    Traceback (most recent call last):
    ...
    nous_inbox.errors.ReplayError: seq 2: expected seq 1 after 0 (events must be numbered 1, 2, 3, ... with no gap)
    """
    session = Session() if start is None else start
    for event in events:
        session = session.apply(event, stream)
    return session
