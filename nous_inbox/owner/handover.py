"""Handing a session over: an owner that lets its session go on purpose, at a boundary of its run.

A host draining for a rolling restart must not make each session wait out its lease, nor cut
its turns off mid-step. So an owner handing over (``AsyncOwner.aclose(hand_over=True)``) starts
nothing more, lets its run reach its next boundary (a turn opening or a step boundary, before
the claim there: nothing is in flight), records a :class:`~nous_inbox.events.SessionReleased`
naming the open turn, and stops the run there, recording nothing more; then it gives the lease
back. The next holder (:meth:`OwnerCore.resume <nous_inbox.owner.core.OwnerCore.resume>`)
ends that turn as ``"released"`` and carries the work on at once in a ``"resumed"`` turn, from
the transcript as it stood at the boundary. A run that reaches no boundary in time is cut off:
nothing more of it is recorded, the release names no turn, and the next holder closes the turn
as it closes a dead holder's.

>>> from nous_inbox.events import SessionReleased, StepStarted, TurnStarted
>>> from nous_inbox.session import replay
>>> from nous_inbox.store import open_store
>>> store = open_store("memory:")
>>> _ = store.append("s", [TurnStarted(turn=1), StepStarted(turn=1, step=1)])
>>> carried_on(store, "s", replay(store.read("s")))
False
>>> _ = store.append("s", [SessionReleased(turn=1)])
>>> carried_on(store, "s", replay(store.read("s")))
True
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from nous_inbox.errors import HandedOverError
from nous_inbox.events import (
    Event,
    ModelReplied,
    ModelRequested,
    Nudged,
    QueueClaimed,
    SessionReleased,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.session import Session
from nous_inbox.store import Store
from nous_inbox.store.journal import Journal

__all__ = ["Handover", "last_run_event", "carried_on", "hand_over_run", "hand_over_thread"]

logger: Final = logging.getLogger("nous_inbox.owner")


class Handover:
    """The gate an owner's port asks before each claim and record: open until the owner hands
    its session over (:attr:`asked`); then the next claim that is a boundary records the
    release and stops the run, and once the run is stopped or cut off (:attr:`cut`) nothing
    more of it is recorded."""

    __slots__ = ("asked", "cut", "released")

    def __init__(self) -> None:
        self.asked = False
        self.cut = False
        self.released = False  # the release is recorded

    def at_claim(self, journal: Journal, wake_only: bool) -> None:
        """Before a claim, under the owner's lock. A claim where the run would stop
        (``wake_only``) is let through: the turn ends right after it, and the owner hands
        over once it has."""
        if self.cut:
            raise HandedOverError("the session was handed over; its run records nothing more")
        if self.asked and not wake_only:
            session = journal.session
            journal.append([SessionReleased(turn=session.turn if session.running else 0)])
            self.released = self.cut = True
            raise HandedOverError(f"turn {session.turn} was handed over at a boundary")

    def at_record(self) -> None:
        """Before a record, under the owner's lock: refused once the run was cut off."""
        if self.cut:
            raise HandedOverError("the session was handed over; its run records nothing more")


#: The events that say where a run stands; anything else (a send, a withdraw, a cancel request, a
#: warning, mail) may be appended by anyone after a release, and does not undo it.
_RUN_EVENTS: Final = (TurnStarted, StepStarted, ModelRequested, ModelReplied, ToolCalled,
                      ToolReturned, StepEnded, TurnEnded, QueueClaimed, Nudged, SessionReleased)


def last_run_event(store: Store, stream: str, version: int) -> Event | None:
    """The last event up to ``version`` that says where ``stream``'s run stands (store I/O: the
    log's tail, read further back only while it holds nothing of the run)."""
    back = 16
    while version:
        after = max(0, version - back)
        for event in reversed(list(store.read(stream, after))):
            if event.seq <= version and type(event) in _RUN_EVENTS:
                return event
        if after == 0:
            return None
        back *= 4
    return None


def carried_on(store: Store, stream: str, session: Session) -> bool:
    """Whether ``session``'s open turn was let go at a boundary for the next holder to carry
    on: the run's last word in the log is a :class:`~nous_inbox.events.SessionReleased` naming
    it, whatever was sent after it (store I/O, and only for a session with an open turn)."""
    if not session.running or not session.version:
        return False
    last = last_run_event(store, stream, session.version)
    return type(last) is SessionReleased and last.turn == session.turn


def hand_over_thread(run: threading.Thread | None, gate: Handover, timeout: float | None,
                     cut: Callable[[], None], commit: Callable[[Sequence[Event]], object]) -> None:
    """The threaded ``Owner``'s handover, the same rule as :func:`hand_over_run`: let ``run``
    reach its next boundary; one still going after ``timeout`` is cut off (``cut`` cancels its
    turn; nothing more of it is recorded). Then the release, unless the run recorded it."""
    gate.asked = True
    if run is not None and run is not threading.current_thread():
        run.join(timeout)
        if run.is_alive():
            gate.cut = True
            cut()
            run.join(timeout)
    _release(gate, commit)


def _release(gate: Handover, commit: Callable[[Sequence[Event]], object]) -> None:
    if not gate.released:
        try:
            commit([SessionReleased()])
        except Exception:
            logger.exception("could not record that the session was released")
        gate.released = gate.cut = True


async def hand_over_run(run: asyncio.Task[Any] | None, caller: asyncio.Task[Any] | None,
                        gate: Handover, timeout: float | None,
                        commit: Callable[[Sequence[Event]], Awaitable[object]]) -> None:
    """An ``AsyncOwner``'s handover, once its core starts nothing more: let ``run`` reach its
    next boundary, where ``gate`` stops it; one still going after ``timeout`` seconds is cut
    off (its task cancelled, nothing more of it recorded). Then the release is recorded by
    ``commit`` (store I/O), unless the run recorded it at its boundary; a store that fails is
    logged, and the lease goes back all the same (the next holder resumes the log)."""
    gate.asked = True
    if run is not None and run is not caller and not run.done():
        await asyncio.wait((run,), timeout=timeout)
        if not run.done():
            gate.cut = True
            run.cancel()
            await asyncio.wait((run,), timeout=timeout)
    if not gate.released:
        try:
            await commit([SessionReleased()])
        except Exception:
            logger.exception("could not record that the session was released")
        gate.released = gate.cut = True
