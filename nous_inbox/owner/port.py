"""What crosses between an owner and the rest: the port its runs use, the runner it drives, and
a cancel any process may record.

An owner (:mod:`nous_inbox.owner.body`) keeps its session behind its lock; nothing outside
touches the journal directly. A run reaches it through :class:`OwnerPort`, the journal's port
under that lock, which tells the boundary subscribers (:mod:`nous_inbox.boundary`) before each
claim so what they send joins it. A runner is anything with ``run_turn`` (:class:`TurnRunner`,
for a threaded :class:`~nous_inbox.owner.Owner`) or ``arun_turn`` (:class:`AsyncTurnRunner`,
for an :class:`~nous_inbox.owner.async_owner.AsyncOwner`). And any process may ask the open turn to
end (:func:`request_cancel`): the request is an event in the log, which the owner folds in as it
folds another writer's steer (ruling 9).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any, Final, Protocol, TypeVar

from nous_inbox.boundary import Boundaries
from nous_inbox.commands import Claim
from nous_inbox.events import CancelRequested, Event, MessageWithdrawn
from nous_inbox.inbox import as_target
from nous_inbox.loop import Advance
from nous_inbox.owner.handover import Handover
from nous_inbox.runner.deltas import Deltas
from nous_inbox.runner.port import JournalPort
from nous_inbox.runner.walk import Ended, finish
from nous_inbox.session import Session
from nous_inbox.store import Store
from nous_inbox.store.base import check_stream
from nous_inbox.store.journal import Change, Journal
from nous_inbox.verbs import Target

__all__ = [
    "AsyncTurnRunner", "OwnerPort", "RunOptions", "TurnRunner", "cancel_open_turn",
    "request_cancel",
]

_T = TypeVar("_T")

_TURN: Final = Target.NEXT_TURN


def request_cancel(store: Store, stream: str) -> CancelRequested | None:
    """Ask ``stream``'s open turn to end as ``"cancelled"`` at its next boundary, wherever its
    owner runs (this process or another): record a ``CancelRequested`` its owner folds in.

    Returns the request as stored, or ``None`` when nothing was recorded: no turn is open (an
    idle session, one between two turns, or one with no events), or its cancel was asked
    already. A request never waits for a later turn, and wakes nothing (ruling 9).

    >>> from nous_inbox.events import TurnStarted
    >>> from nous_inbox.store import open_store
    >>> store = open_store("memory:")
    >>> print(request_cancel(store, "s"))             # nothing runs: nothing recorded
    None
    >>> _ = store.append("s", [TurnStarted(turn=1)])
    >>> request_cancel(store, "s").turn, request_cancel(store, "s")   # a second adds nothing
    (1, None)
    """
    check_stream(stream)
    journal = Journal(store, stream, transcript=False, snapshot_every=0)
    stored, _ = journal.commit(cancel_open_turn)
    return stored[0] if stored else None  # type: ignore[return-value]  # (only ever one)


def cancel_open_turn(session: Session) -> tuple[Sequence[Event], None]:
    """The change (for :meth:`Journal.commit <nous_inbox.store.journal.Journal.commit>`) that
    records a cancel of ``session``'s open turn, if it takes one (:meth:`Session.cancel
    <nous_inbox.session.Session.cancel>` decides): :func:`request_cancel` and an owner's own
    ``cancel()`` record it alike.

    >>> from nous_inbox.events import TurnStarted
    >>> from nous_inbox.session import replay
    >>> events, _ = cancel_open_turn(replay([TurnStarted(turn=1, seq=1)]))
    >>> [type(event).__name__ for event in events]
    ['CancelRequested']
    """
    request = session.cancel()
    return ((request,) if request is not None else ()), None


class TurnRunner(Protocol):
    """What an owner needs from a runner: run one turn on a port, yielding its events."""

    def run_turn(
        self, port: Any, *, reason: str = ..., cancel: threading.Event | None = ...
    ) -> Iterator[Event]:
        """Run one turn; see ``nous_inbox.runner.Runner.run_turn``."""


class AsyncTurnRunner(Protocol):
    """What an ``AsyncOwner`` needs from a runner: one turn on a port, as an async stream."""

    def arun_turn(
        self, port: Any, *, reason: str = ..., cancel: asyncio.Event | None = ...
    ) -> AsyncIterator[Event]:
        """Run one turn; see ``nous_inbox.runner.Runner.arun_turn``."""


def _no_limit(target: Target | str) -> int | None:
    return None


class RunOptions:
    """The run options an owner keeps for the prompts and followups sent with some (``deps``,
    ``model_settings``, ...: never logged), by the seq of their send, until the turn that claims
    one reads them, or the send is withdrawn (:meth:`fold`). Options are never merged: a send
    with options gets a turn of its own, so a turn's claim of ``next_turn`` stops short of it,
    or takes it alone (:meth:`limit`).

    >>> options = RunOptions()
    >>> options.keep(2, {"deps": "ada"})
    >>> options.limit("next_turn", [1, 2, 3]), options.limit("next_turn", [2, 3])
    (1, 1)
    >>> options.of_turn([2]), options.of_turn([2]), len(options)     # handed over once
    ({'deps': 'ada'}, {}, 0)
    """

    __slots__ = ("_by_seq",)

    def __init__(self) -> None:
        self._by_seq: dict[int, dict[str, Any]] = {}

    @staticmethod
    def checked(runner: object, options: dict[str, Any]) -> dict[str, Any] | None:
        """``options`` as ``runner`` takes them (``None`` for none): its ``check_run_options``
        refuses what it sets itself; a runner without one takes none (``TypeError``)."""
        if not options:
            return None
        check = getattr(runner, "check_run_options", None)
        if not callable(check):
            raise TypeError(f"{type(runner).__name__} takes no run options per prompt, "
                            f"got {', '.join(sorted(options))}")
        check(options)
        return options

    def keep(self, seq: int, options: dict[str, Any]) -> None:
        """Keep the ``options`` the send stored at ``seq`` came with."""
        self._by_seq[seq] = options

    def __len__(self) -> int:
        """How many sends' options are kept (each until its turn reads them, or it is withdrawn)."""
        return len(self._by_seq)

    def fold(self, events: Iterable[Event]) -> None:
        """Forget the options of each send withdrawn among ``events`` (every batch the owner
        folds in, its own withdraws and another process's alike): no turn will claim it.

        >>> from nous_inbox.events import MessageWithdrawn
        >>> options = RunOptions()
        >>> options.keep(2, {"deps": "ada"})
        >>> options.fold([MessageWithdrawn(seq=3, sent=2, target="next_turn")])
        >>> len(options), options.limit("next_turn", [4])
        (0, None)
        """
        if self._by_seq:
            for event in events:
                if type(event) is MessageWithdrawn:
                    self._by_seq.pop(event.sent, None)

    def of_turn(self, claimed: Iterable[int]) -> dict[str, Any]:
        """The options of the one send (if any) among the ``claimed`` seqs a turn took, handed
        over once."""
        options: dict[str, Any] = {}
        for seq in claimed:
            options.update(self._by_seq.pop(seq, ()))
        return options

    def limit(self, target: Target | str, queued: Iterable[int]) -> int | None:
        """How many of ``target``'s oldest messages a claim may take, given the seqs of the
        ``next_turn`` sends ``queued`` (oldest first): all (``None``), but short of a send with
        options, or that send alone when it is the oldest."""
        if not self._by_seq or target != _TURN:
            return None
        for ahead, seq in enumerate(queued):
            if seq in self._by_seq:
                return ahead or 1
        return None


class OwnerPort(JournalPort):
    """The port an owner's runs use: the journal under the owner's lock; before each claim it
    tells the boundary subscribers, under that lock, so what they send joins the claim.
    ``call_io``: how a runner reaches an ``AsyncOwner``'s store worker (``None``: call inline).
    ``options`` and ``limit`` are the owner's: the open turn's run options, and how much of a
    queue a claim may take now (see :attr:`turn_options`, :meth:`claim_limit`). ``deltas``: the
    session's outlet for the model's text as it streams (:mod:`nous_inbox.runner.deltas`), which
    the owner's live readers subscribe to. ``handover``: the gate each boundary asks while the
    owner hands its session over (:mod:`nous_inbox.owner.handover`)."""

    __slots__ = ("_boundaries", "_limit", "_options", "call_io", "deltas", "handover")

    def __init__(self, journal: Journal, lock: threading.RLock, boundaries: Boundaries,
                 call_io: Callable[..., Any] | None = None, *,
                 options: Callable[[], dict[str, Any]] = dict,
                 limit: Callable[[Target | str], int | None] = _no_limit) -> None:
        super().__init__(journal, lock)
        self._boundaries = boundaries
        self.call_io = call_io
        self.deltas = Deltas(lambda: (journal.session.turn, journal.session.step))
        self._options = options
        self._limit = limit
        self.handover = Handover()

    @property
    def turn_options(self) -> dict[str, Any]:
        """The run options (``deps``, ``model_settings``, ...) given with the prompt or followup
        the open turn claimed (one at most: see :meth:`claim_limit`); read once, as the turn
        opens."""
        with self._lock:
            return self._options()

    def claim_limit(self, target: Target | str) -> int | None:
        """How many of ``target``'s oldest messages a claim made now may take (``None``: all).
        A prompt or followup sent with run options gets a turn of its own, so a turn's claim
        of ``next_turn`` stops short of it, or takes it alone when it is the oldest: options
        are never merged. A runner that claims inside a commit of its own (the pydantic-ai
        adapter) asks this inside that commit; :meth:`claim` asks it itself."""
        with self._lock:
            return self._limit(target)

    def boundary(self, adv: Advance, ended: Ended | None = None) -> tuple[list[Event], Advance]:
        """As :meth:`JournalPort.boundary`, through the handover's gate: a run cut off records
        nothing more; while the owner hands over, what came before the boundary is recorded
        first, then its claim is where the run stops (:mod:`nous_inbox.owner.handover`)."""
        gate = self.handover
        gate.at_record()
        if not gate.asked or type(adv.command) is not Claim:
            return super().boundary(adv, ended)
        with self._lock:
            before = self._journal.append(finish(adv.events, adv.state, ended)) if adv.events else []
            stored, adv = super().boundary(adv._replace(events=()), ended)
            return [*before, *stored], adv

    def commit(self, change: Change[_T]) -> tuple[list[Event], _T]:
        self.handover.at_record()  # a run cut off in a handover records nothing more
        return super().commit(change)

    @property
    def heard(self) -> bool:
        """Whether anyone listens to the boundaries, or the owner is handing over (a runner
        that claims inside a commit of its own asks, and calls :meth:`reaching` before that
        commit only then)."""
        return bool(self._boundaries) or self.handover.asked

    def reaching(self, target: Target | str, turn: int, *, wake_only: bool = False) -> None:
        """The run of ``turn`` is about to claim ``target`` (``wake_only``: where it would stop):
        tell the boundary subscribers which boundary that claim is (the loop's table names it),
        under the owner's lock, so what they send commits at once and joins that claim."""
        if self.handover.asked:
            with self._lock:
                self.handover.at_claim(self._journal, wake_only)
        if self._boundaries:
            with self._lock:
                self._boundaries.tell(Claim(as_target(target), wake_only).boundary, turn)
