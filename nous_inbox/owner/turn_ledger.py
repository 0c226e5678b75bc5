"""The turn ledger: what a prompt or followup got for an answer, read from the log.

A prompt (or followup) waits in ``next_turn`` and is claimed when a turn opens; that turn is the
one it *starts or joins* (several sends queued together join one turn), and its outcome is the
send's result: the last model reply, the typed output where the runner records one, the usage
the model reported, the turn's first and last seq and why it ended. Everything here is read
from the events, so a new owner answers for a send an old one took (the log is the truth).

:class:`TurnLedger` is that reading, done once for every owner: a fold over the events that
keeps, per turn, which sends it claimed and how it ended. Sends to ``next_turn`` are claimed
oldest first, so a turn's claim is one range of them: the ledger keeps the newest seq each
turn claimed and finds a send's turn by bisection (a withdrawn send, kept apart, has none).

>>> from nous_inbox.events import MessageSent, ModelReplied, QueueClaimed, TurnEnded, TurnStarted
>>> from nous_inbox.message import Message
>>> log = [
...     MessageSent(seq=1, target="next_turn", wakeup=True, message=Message.user("hi")),
...     TurnStarted(seq=2, turn=1, reason="prompt"),
...     QueueClaimed(seq=3, target="next_turn", count=1),
...     ModelReplied(seq=4, turn=1, step=1, message=Message.assistant("hello")),
...     TurnEnded(seq=5, turn=1, steps=1, reason="final"),
... ]
>>> ledger = TurnLedger()
>>> ledger.fold(log)
True
>>> result = ledger.result_of(1)
>>> result.turn, result.text, result.output, (result.first_seq, result.last_seq), result.reason
(1, 'hello', 'hello', (2, 5), 'final')

A turn that failed or was cancelled raises from :func:`settled` (and so from every handle), as
:class:`TurnFailed` or :class:`TurnCancelled`, each carrying the :class:`TurnResult`.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from nous_inbox.events import (
    Event,
    MessageSent,
    MessageWithdrawn,
    ModelReplied,
    QueueClaimed,
    TurnEnded,
    TurnEndReason,
    TurnStarted,
)
from nous_inbox.frozen import thaw_json
from nous_inbox.message import Message
from nous_inbox.session import Session
from nous_inbox.verbs import Target

__all__ = ["OutputLoader", "TurnCancelled", "TurnError", "TurnFailed", "TurnLedger", "TurnResult",
           "settled"]

_TURN: Final = Target.NEXT_TURN


@attrs.frozen
class TurnResult:
    """How one turn ended: the answer a prompt or followup got.

    ``message`` is the turn's last model reply (``None`` if it made none); ``output`` the typed
    output the runner recorded (a pydantic-ai ``output_type``, rebuilt by the runner), else that
    reply's text; ``usage`` what the model reported over the turn (``None`` when it reported
    nothing); ``first_seq`` and ``last_seq`` the turn's opening and closing events; ``reason``
    ``"final"``, ``"budget"``, ``"cancelled"`` or ``"error"`` (with ``error``, the recorded one).
    """

    turn: int
    reason: TurnEndReason
    message: Message | None
    output: Any
    usage: Mapping[str, int | float] | None
    first_seq: int
    last_seq: int
    error: str | None = None

    @property
    def text(self) -> str:
        """The last reply's text (``""`` when the turn made no reply)."""
        return "" if self.message is None else self.message.content


class TurnError(Exception):
    """A turn ended without an answer; ``result`` says how (its seqs, its recorded error)."""

    def __init__(self, message: str, result: TurnResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class TurnFailed(TurnError):
    """The turn ended as ``"error"``: the model or the store failed (``result.error`` says)."""


class TurnCancelled(TurnError):
    """The turn was cancelled (``cancel()``, or its owner closing) before it answered."""


def settled(result: TurnResult) -> TurnResult:
    """``result``, or the error a failed or cancelled turn raises on its handle.

    >>> settled(TurnResult(3, "cancelled", None, None, None, 10, 12))
    Traceback (most recent call last):
    ...
    nous_inbox.owner.turn_ledger.TurnCancelled: turn 3 was cancelled (seq 10 to 12)
    """
    where = f"turn {result.turn}"
    seqs = f"(seq {result.first_seq} to {result.last_seq})"
    if result.reason == "error":
        raise TurnFailed(f"{where} failed {seqs}: {result.error}", result)
    if result.reason == "cancelled":
        raise TurnCancelled(f"{where} was cancelled {seqs}", result)
    return result


OutputLoader = Callable[[Any], Any]
"""A runner's ``load_output(data)``: the typed output rebuilt from its JSON in the log."""


class TurnLedger:
    """Which turn claimed each ``next_turn`` send, and how each turn ended: a fold of the log.

    Started on ``session`` (an owner's, as it opens), it answers for the sends folded after it;
    a send at or before ``session.version`` is for :meth:`from_log`. Per turn it keeps a few
    numbers and the last reply (a reference into the transcript), so it stays small.
    """

    __slots__ = ("_claimed_now", "_claims", "_ended", "_first", "_queued", "_reply", "_since",
                 "_turn", "_withdrawn")

    def __init__(self, session: Session | None = None) -> None:
        start = Session() if session is None else session
        self._since = start.version
        self._queued: collections.deque[int] = collections.deque(start.inbox.seqs(_TURN))
        self._withdrawn: dict[int, int] = {}  # a withdrawn next_turn send's seq -> its withdraw's
        self._claims: list[tuple[int, int]] = []  # (the newest seq a claim took, its turn)
        self._ended: dict[int, tuple[TurnEnded, int, Message | None]] = {}
        self._turn, self._first = start.turn, 0
        self._reply: Message | None = None
        self._claimed_now: list[int] = []

    @classmethod
    def from_log(cls, events: Iterable[Event]) -> TurnLedger:
        """The ledger of a whole log, read from its first event (a restart's answer)."""
        ledger = cls()
        ledger.fold(events)
        return ledger

    def knows(self, seq: int) -> bool:
        """Whether a send at ``seq`` was folded here (else read the log: :meth:`from_log`)."""
        return seq > self._since

    @property
    def queued(self) -> Iterable[int]:
        """The seqs of the ``next_turn`` sends still queued, oldest first (before the next fold)."""
        return self._queued

    @property
    def claimed_now(self) -> tuple[int, ...]:
        """The seqs of the ``next_turn`` sends the open turn claimed, in send order."""
        return tuple(self._claimed_now)

    def fold(self, events: Iterable[Event]) -> bool:
        """Fold ``events`` in (in log order); whether a send's answer came among them: a turn
        ended, or a queued ``next_turn`` send was withdrawn (its waiters hear no turn will
        answer it, so they must look again as they do when a turn ends)."""
        ended = False
        event: Any
        for event in events:  # typed Any: each branch reads only the fields of the type it matched
            kind = type(event)
            if kind is MessageSent:
                if event.target == _TURN:
                    self._queued.append(event.seq)
            elif kind is ModelReplied:
                self._reply = event.message
            elif kind is QueueClaimed:
                if event.target == _TURN:
                    self._claimed(event.count)
            elif kind is MessageWithdrawn:
                if event.target == _TURN and event.sent in self._queued:
                    self._queued.remove(event.sent)
                    self._withdrawn[event.sent] = event.seq
                    ended = True
            elif kind is TurnStarted:
                self._turn, self._first, self._reply = event.turn, event.seq, None
                self._claimed_now = []
            elif kind is TurnEnded and self._first:
                self._ended[event.turn] = (event, self._first, self._reply)
                self._first, ended = 0, True
        return ended

    def _claimed(self, count: int) -> None:
        newest = 0
        for _ in range(min(count, len(self._queued))):
            newest = self._queued.popleft()
            if newest and self._first:
                self._claimed_now.append(newest)
        if newest:  # a claim outside any turn answers for no turn (0)
            self._claims.append((newest, self._turn if self._first else 0))

    def turn_of(self, seq: int) -> int | None:
        """The turn that claimed the ``next_turn`` send at ``seq``; ``None`` while it is queued
        (0 if it was claimed outside any turn)."""
        at = bisect.bisect_left(self._claims, (seq, -1))
        return self._claims[at][1] if at < len(self._claims) else None

    def result(self, turn: int, load_output: OutputLoader | None = None) -> TurnResult | None:
        """How ``turn`` ended, or ``None`` while it is open (or was never seen here).
        ``load_output`` rebuilds a recorded output (the runner's)."""
        found = self._ended.get(turn)
        if found is None:
            return None
        ended, first, reply = found
        output = ended.output
        if output is None:
            output = None if reply is None else reply.content
        elif load_output is not None:
            output = load_output(thaw_json(output))
        usage = None if ended.usage is None else dict(ended.usage)
        return TurnResult(ended.turn, ended.reason, reply, output, usage, first, ended.seq,
                          ended.error)

    def result_of(self, seq: int, load_output: OutputLoader | None = None) -> TurnResult | None:
        """The result of the send at ``seq``: its turn's, once that ended, else ``None``.
        ``TurnError`` when its message was claimed outside any turn, or withdrawn."""
        if seq in self._withdrawn:
            raise TurnError(f"the message sent at seq {seq} was withdrawn (event "
                            f"#{self._withdrawn[seq]}), so no turn answers it")
        turn = self.turn_of(seq)
        if turn is None:
            return None
        if turn == 0:
            raise TurnError(f"the message sent at seq {seq} was claimed outside any turn")
        return self.result(turn, load_output)
