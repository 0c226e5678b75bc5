"""Turn results as an owner answers them: steps for either pump, and the handles a send returns.

What each turn answered is the ledger's (:mod:`nous_inbox.owner.turn_ledger`: a fold of the log).
:class:`TurnAnswers` is what an owner answers from that ledger and the log behind it, written
once for both owners as :data:`Steps`: the threaded owner runs them with :func:`pump`, the
asyncio one with :func:`apump`; each pump brings only its way of reading the log and of waiting.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from typing import Any, Final, TypeVar

from nous_inbox.events import (
    Event,
    MessageSent,
)
from nous_inbox.owner.receipts import SendReceipts
from nous_inbox.owner.sends import Refused
from nous_inbox.owner.turn_ledger import (
    OutputLoader,
    TurnLedger,
    TurnResult,
    settled,
)
from nous_inbox.receipts import Receipt
from nous_inbox.session import Session
from nous_inbox.verbs import Target

__all__ = ["AsyncTurnHandle", "Steps", "TurnAnswers", "TurnEnds", "TurnHandle", "apump", "pump"]

_TURN: Final = Target.NEXT_TURN
_T = TypeVar("_T")


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

    >>> from nous_inbox.events import MessageSent, QueueClaimed, TurnEnded, TurnStarted
    >>> from nous_inbox.message import Message
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

