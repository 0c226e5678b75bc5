"""Turn results: what a prompt or followup got for an answer, read from the log.

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

:class:`TurnAnswers` is what an owner answers from that ledger and the log behind it, written
once for both owners as :data:`Steps`: the threaded owner runs them with :func:`pump`, the
asyncio one with :func:`apump`; each pump brings only its way of reading the log and of waiting.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

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
from nous_inbox.owner.receipts import SendReceipts
from nous_inbox.owner.sends import Refused
from nous_inbox.receipts import Receipt
from nous_inbox.session import Session
from nous_inbox.verbs import Target

__all__ = [
    "AsyncTurnHandle", "Steps", "TurnAnswers", "TurnCancelled", "TurnEnds",
    "TurnError", "TurnFailed", "TurnHandle", "TurnLedger", "TurnResult", "apump", "pump",
    "settled",
]

_TURN: Final = Target.NEXT_TURN
_T = TypeVar("_T")


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
    nous_inbox.owner.turn_result.TurnCancelled: turn 3 was cancelled (seq 10 to 12)
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


# -- the answers, as steps for either pump ------------------------------------------------------

Steps = Generator[Callable[[], Any] | None, Any, _T]
"""An answer as the steps a pump takes (one body, two pumps, as the runner's turn): each step is
a log read, a callable the pump calls where its store calls run and whose result it sends back,
or ``None``: wait until a turn ends or the owner closes, then go on. It returns the answer."""


def _at_once(read: Callable[[], Any]) -> Any:
    return read()


def pump(steps: Steps[_T], wait: Callable[[], object] = lambda: None,
         call: Callable[[Callable[[], Any]], Any] = _at_once) -> _T:
    """Run ``steps`` on this thread: each read with ``call(read)`` (at once, by default), each
    wait with ``wait()`` (the threaded owner's pump; its ``wait`` raises ``TimeoutError`` once
    the caller's time is up, and its ``call`` reads with its lock released).

    >>> def steps():
    ...     read = yield (lambda: 41)
    ...     return read + 1
    >>> pump(steps())
    42
    """
    answer: Any = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]  # (the generator's return value)
        answer = wait() if step is None else call(step)


async def apump(steps: Steps[_T], call: Callable[[Callable[[], Any]], Awaitable[Any]],
                wait: Callable[[], Awaitable[object]]) -> _T:
    """Run ``steps`` on the event loop: each read through ``call`` (where store calls run), each
    wait with ``await wait()`` (the asyncio owner's pump)."""
    answer: Any = None
    while True:
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]  # (the generator's return value)
        answer = await (wait() if step is None else call(step))


class TurnEnds:
    """What an asyncio owner's handles wait on between two looks at its ledger (``apump``'s
    ``wait``), on its loop: :meth:`wait` returns at the next :meth:`ended`."""

    __slots__ = ("_over",)

    def __init__(self) -> None:
        self._over = asyncio.Event()

    def wait(self) -> Coroutine[Any, Any, bool]:
        """Wait for the next :meth:`ended`."""
        return self._over.wait()

    def ended(self) -> None:
        """A turn ended, or the owner did: every wait returns, to look again."""
        self._over.set()
        self._over = asyncio.Event()


class TurnAnswers:
    """What an owner answers about its session's turns, whichever pump waits: from the ledger of
    the turns it folded, else from the log behind it (``read(after)``: the stored events with
    ``seq > after``; a turn an earlier owner ran). ``load_output`` is the runner's; ``receipts``
    says where each send went (:class:`~nous_inbox.owner.receipts.SendReceipts`).

    >>> log = [MessageSent(seq=1, target="next_turn", wakeup=True, message=Message.user("hi")),
    ...        TurnStarted(seq=2, turn=1), QueueClaimed(seq=3, target="next_turn", count=1),
    ...        TurnEnded(seq=4, turn=1, steps=0, reason="final")]
    >>> answers = TurnAnswers("demo", lambda after: log[after:])
    >>> pump(answers.of_turn(1)).last_seq, pump(answers.sent(1)).seq   # read from the log
    (4, 1)
    """

    __slots__ = ("_load_output", "_read", "_stream", "ended", "ledger", "receipts")

    def __init__(self, stream: str, read: Callable[[int], Iterable[Event]],
                 load_output: OutputLoader | None = None) -> None:
        self._stream, self._read, self._load_output = stream, read, load_output
        self.ledger = TurnLedger()  # which turn took each prompt, and how each turn ended
        self.ended = 0  # answers the ledger saw come (a turn ended, a prompt withdrawn): a
        # waiter looks again when it moves
        self.receipts = SendReceipts(read)

    def start(self, session: Session) -> None:
        """The owner opened on ``session``: its ledger answers for what is folded from now on."""
        self.ledger = TurnLedger(session)
        self.receipts.start(session)

    def fold(self, events: Sequence[Event]) -> bool:
        """Fold ``events`` in; whether a turn ended, a queued prompt or followup was withdrawn,
        or a send someone waits for settled."""
        settled, ended = self.receipts.fold(events), self.ledger.fold(events)
        self.ended += ended
        return ended or settled

    def of_turn(self, turn: int) -> Steps[TurnResult]:
        """How ``turn`` ended (settled); ``LookupError`` for a turn that has not ended."""
        result = self.ledger.result(turn, self._load_output)
        if result is None:
            result = yield functools.partial(self._logged, None, turn)
        if result is None:
            raise LookupError(f"turn {turn} of session {self._stream!r} has not ended")
        return settled(result)

    def sent(self, seq: int) -> Steps[MessageSent]:
        """The ``next_turn`` send stored at ``seq``, or the error saying why no turn answers it."""
        events = yield functools.partial(self._read, seq - 1)
        for event in events:
            if event.seq == seq:
                if type(event) is MessageSent and event.target == _TURN:
                    return event
                raise ValueError(f"session {self._stream!r}: seq {seq} is a "
                                 f"{type(event).__name__}, not a send to next_turn (a prompt "
                                 f"or followup), so no turn answers it")
        raise ValueError(f"session {self._stream!r} has no event at seq {seq}")

    def of_send(self, seq: int, unanswered: Callable[[int], object]) -> Steps[TurnResult]:
        """The settled result of the turn of the send at ``seq``, once it ended. Between two
        looks it waits for a turn to end or a prompt to be withdrawn; ``unanswered(seq)``
        raises when none will answer it.
        A send this owner folded is in its ledger; an older one is looked for in the log."""
        looked = -1
        while True:
            if looked != self.ended:  # look again only once an answer came
                looked = self.ended
                result = (self.ledger.result_of(seq, self._load_output) if self.ledger.knows(seq)
                          else (yield functools.partial(self._logged, seq, None)))
                if result is not None:
                    return settled(result)
            unanswered(seq)
            yield None

    def _logged(self, seq: int | None, turn: int | None) -> TurnResult | None:
        """The result of the send at ``seq`` (or of ``turn``), read from the whole log (I/O)."""
        ledger = TurnLedger.from_log(self._read(0))
        return (ledger.result_of(seq, self._load_output) if seq is not None
                else ledger.result(turn or 0, self._load_output))


# -- the handles --------------------------------------------------------------------------------


def _unfollowed(*_: object) -> Any:
    raise RuntimeError("this handle has no owner to follow its send")


class TurnHandle:
    """The turn a threaded :class:`~nous_inbox.owner.Owner`'s prompt or followup starts or
    joins. ``sent`` is the stored send (``seq`` its seq); :meth:`result` waits for the turn.

    ``wait(seq, timeout)`` and ``follow(seq, timeout)`` are the owner's.
    """

    __slots__ = ("_follow", "_wait", "sent")

    def __init__(self, sent: MessageSent, wait: Callable[[int, float | None], TurnResult],
                 follow: Callable[[int, float | None], Receipt] | None = None) -> None:
        self.sent = sent
        self._wait = wait
        self._follow = follow

    def delivered(self, timeout: float | None = None) -> Receipt:
        """Wait until a turn claims the message (or it is withdrawn) and say where it went
        (:meth:`Owner.delivered <nous_inbox.owner.Owner.delivered>`)."""
        return _unfollowed() if self._follow is None else self._follow(self.sent.seq, timeout)

    @property
    def seq(self) -> int:
        """The seq of the stored send."""
        return self.sent.seq

    def result(self, timeout: float | None = None) -> TurnResult:
        """Wait for the turn to end and return how it did; ``TimeoutError`` after ``timeout``
        seconds; :class:`TurnFailed` or :class:`TurnCancelled` for a turn without an answer."""
        return self._wait(self.sent.seq, timeout)

    def done(self) -> bool:
        """Whether the turn has ended (so :meth:`result` returns or raises at once)."""
        try:
            self._wait(self.sent.seq, 0)
        except TimeoutError:
            return False
        except Exception:
            return True
        return True

    def __repr__(self) -> str:
        return f"TurnHandle(seq={self.sent.seq})"


class AsyncTurnHandle:
    """The turn an :class:`~nous_inbox.owner.async_owner.AsyncOwner`'s prompt or followup starts or
    joins: ``await handle`` is its :class:`TurnResult`. ``await handle.stored()`` is the stored
    send alone (then ``sent`` and ``seq`` read it). Cancelling an await before the send is
    stored takes the send back, if no commit took it yet. A send refused when it was made (bad
    input, a closed owner) raises its error from either await."""

    __slots__ = ("_follow", "_stored", "_wait")

    def __init__(self, stored: MessageSent | asyncio.Future[MessageSent] | Refused[MessageSent],
                 wait: Callable[[int, float | None], Awaitable[TurnResult]],
                 follow: Callable[[int, float | None], Awaitable[Receipt]] | None = None) -> None:
        self._stored = stored
        self._wait = wait
        self._follow = follow

    async def delivered(self, timeout: float | None = None) -> Receipt:
        """Once the send is stored, where its message went (:meth:`AsyncOwner.delivered
        <nous_inbox.owner.async_owner.AsyncOwner.delivered>`)."""
        sent = await self.stored()
        return await (self._follow or _unfollowed)(sent.seq, timeout)

    async def stored(self) -> MessageSent:
        """The send as stored, once it is."""
        stored = self._stored
        return stored if isinstance(stored, MessageSent) else await stored

    @property
    def sent(self) -> MessageSent:
        """The stored send; ``RuntimeError`` before it is (``await handle.stored()`` first)."""
        stored = self._stored
        if isinstance(stored, MessageSent):
            return stored
        if isinstance(stored, Refused):
            raise RuntimeError("the send was refused: await handle.stored() for its error")
        if not stored.done() or stored.cancelled() or stored.exception() is not None:
            raise RuntimeError("the send is not stored: await handle.stored() first")
        return stored.result()

    @property
    def seq(self) -> int:
        """The seq of the stored send (see :attr:`sent`)."""
        return self.sent.seq

    async def result(self, timeout: float | None = None) -> TurnResult:
        """The turn's result (waiting at most ``timeout`` seconds for it, then
        ``TimeoutError``); :class:`TurnFailed` or :class:`TurnCancelled` without an answer."""
        sent = await self.stored()
        return await self._wait(sent.seq, timeout)

    def __await__(self) -> Generator[Any, None, TurnResult]:
        return self.result().__await__()

    def __repr__(self) -> str:
        try:
            return f"AsyncTurnHandle(seq={self.seq})"
        except RuntimeError:
            return "AsyncTurnHandle(not stored)"

