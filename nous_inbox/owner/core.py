"""The owner's rules with no threads, no event loop and no I/O: one copy for every owner.

An owner holds one session and decides when to run. Those decisions are few and they are the
same whether the owner runs its turns on a worker thread (:class:`~nous_inbox.owner.Owner`) or as
an asyncio task (``AsyncOwner``), so they live here once, as a small state machine the owner
*pumps*: it tells the core what happened (a batch of events was folded in, a turn ended, a run
failed, the host cancelled or closed) and the core answers what to do (start a run, open the next
turn and with which reason, or stop and record these events). The driver does the I/O the answer
asks for, under its own lock (or on its own event loop), and nothing else decides.

The rules:

* **append before acting**: the core only ever reads the session *after* the driver folded the
  stored events in, and the events it asks for (closing an open turn, a warning) are handed back
  for the driver to append before it goes on;
* **one run at a time**: :meth:`OwnerCore.wake` says "start" at most once until the run stops;
* **wake on a waking send, and again at run end**: :meth:`OwnerCore.arrived` wakes for a batch
  holding a send that asked to wake (another process's too); :meth:`OwnerCore.next_turn` opens
  another turn while a waking message worth a model round is queued. A blank one is not
  (ruling 4), nor is an injection alone, even after a cancel left a waking entry behind (ruling 9);
* **cancel wakes nothing**: after :meth:`OwnerCore.cancel` the run stops at its turn's end; so
  it does after a batch that asked its open turn to end (:meth:`OwnerCore.cancel_asked`: a
  ``CancelRequested`` from any thread or process, folded into ``Session.cancelling``), and after
  a run that failed (:meth:`OwnerCore.failed`). What was queued before the cancel (or before the
  failed turn ended) waits for a new waking send;
* **a run that is stopping still hears a send**: a waking send that arrives after the cancel, or
  after the run's last turn ended, while the run has not stopped yet, is that new send: the
  run's ``Stop`` says ``again`` and the driver starts the next run at once. The window between
  a turn's recorded end and the run's last decision is as wide as the runner makes it (a
  pydantic-ai turn hands its events over from a thread of its own), so the rule cannot rest on
  it being short;
* **a prompt's turn is the one that takes it**: a turn opens as ``"prompt"`` while a prompt the
  owner stored (:meth:`OwnerCore.prompted`, by its seq) is still queued, read from the session
  each time, so one withdrawn by anyone (a ``MessageWithdrawn`` folded in) leaves nothing behind;
  and while a prompt's send has not settled yet, as the run it wakes may open its turn first;
* **resume from the log**: :meth:`OwnerCore.resume` closes a turn the log shows as open (the
  process died mid-run) as ``"error"``, answering its open tool calls as interrupted; one its
  holder let go at a boundary (a handover, :mod:`nous_inbox.owner.handover`) ends as
  ``"released"`` and the owner carries it on at once in a ``"resumed"`` turn;
* **a handover starts nothing more**: after :meth:`OwnerCore.hand_over` the run goes on to its
  next boundary, where it stops recording nothing (:meth:`OwnerCore.let_go`);
* **a lost lease ends the owner**: after :meth:`OwnerCore.lease_lost` (the store said another
  owner took the stream over, ``LeaseLostError``) nothing starts again and a run stops at its
  next decision, recording nothing (the store would refuse it): the new owner resumes the log.

>>> from nous_inbox.inbox import Inbox
>>> from nous_inbox.session import Session
>>> core = OwnerCore()
>>> idle = Session()
>>> waiting = Session(inbox=Inbox().steer("summarize"))
>>> core.wake(idle), core.wake(waiting), core.wake(waiting)   # nothing to do; start; already running
(False, True, False)
>>> core.next_turn(waiting, None)              # the worker asks before its first turn
Turn(reason='wake')
>>> core.cancel()
True
>>> core.next_turn(waiting, True)              # cancelled: stop, even with a steer still queued
Stop(record=(), again=False)
>>> core.running
False
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import Event, MessageSent, ToolReturned, TurnEnded, Warned
from nous_inbox.happenings import interrupted_result, open_calls
from nous_inbox.session import Session
from nous_inbox.verbs import Target

__all__ = ["INTERRUPTED", "OwnerCore", "Stop", "Turn"]

#: The error of a turn an owner closes on opening, as its holder stopped mid-turn (a takeover).
INTERRUPTED: Final = "interrupted: the owner stopped mid-turn"

_TURN = Target.NEXT_TURN
_NO_PROGRESS = ("a turn claimed none of the messages that woke it; "
                "not waking again until a new send")


@attrs.frozen
class Turn:
    """The answer "open another turn", recorded with ``reason`` (``"prompt"`` or ``"wake"``)."""

    reason: str


@attrs.frozen
class Stop:
    """The answer "the run is over": append ``record`` (possibly nothing), then go idle; with
    ``again``, ask :meth:`OwnerCore.wake` at once and start the next run if it says so (a
    waking send arrived while this run was stopping: it must not wait for a later one)."""

    record: tuple[Event, ...] = ()
    again: bool = False


@attrs.define
class OwnerCore:
    """The state of one owner's decisions: whether a run is going, cancelled, prompted, closed.

    Not locked: its driver calls it under the lock (or on the event loop) that also guards the
    session it passes in, so the decision and the state it was made on cannot drift apart.
    """

    _running: bool = False
    _cancelled: bool = False
    _sending: int = 0  # prompts whose send has not settled (stored, refused or unknown) yet
    _unseen: int = 0  # of those, the ones no turn has opened for since they were sent
    _prompts: set[int] = attrs.Factory(set)  # the seqs of stored prompts, while still queued
    _closed: bool = False
    _lost: LeaseLostError | None = None
    _again: bool = False  # a waking send arrived while the run was stopping (see ``arrived``)
    _carry_on: bool = False  # a turn let go at a boundary by the last holder: resume it

    @property
    def running(self) -> bool:
        """Whether a run is going (from the ``wake`` that started it until its ``Stop``)."""
        return self._running

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: nothing starts any more."""
        return self._closed

    @property
    def lost(self) -> LeaseLostError | None:
        """The ``LeaseLostError`` that ended this owner (see :meth:`lease_lost`), or ``None``."""
        return self._lost

    def resume(self, session: Session, carried_on: bool = False) -> list[Event]:
        """The events to append before anything else when an owner opens on ``session``: a turn
        the log shows as open (its owner died mid-run) is ended as ``"error"``, after its tool
        calls left unanswered are answered as interrupted (as a turn's end answers them, ruling
        9), so the next run continues from a well-formed transcript that is the one logged.
        ``carried_on``: its last holder let that turn go at a boundary
        (:func:`~nous_inbox.owner.handover.carried_on`): it ends as ``"released"`` and the
        owner's first run opens a ``"resumed"`` turn at once, queued waking message or not.

        >>> from nous_inbox.events import TurnStarted
        >>> core, open_turn = OwnerCore(), Session().apply(TurnStarted(seq=1, turn=1))
        >>> [event.reason for event in core.resume(open_turn, carried_on=True)]
        ['released']
        >>> core.wake(Session()), core.next_turn(Session(), None)
        (True, Turn(reason='resumed'))
        """
        if not session.running:
            return []
        if carried_on:
            self._carry_on = True
            return [TurnEnded(turn=session.turn, steps=session.step, reason="released")]
        answers: list[Event] = [
            ToolReturned(turn=session.turn, step=session.step, message=interrupted_result(call))
            for call in open_calls(session.transcript)
        ]
        return [*answers, TurnEnded(turn=session.turn, steps=session.step, reason="error",
                                    error=INTERRUPTED)]

    def arrived(self, events: Sequence[Event], session: Session) -> bool:
        """A batch was folded in (``session`` includes it): whether to start a run now.

        Only a send that asked to wake can start one (ruling 9: an injection never does, whatever
        older entry is queued); whose send it was does not matter. One that arrives while the
        run is stopping (it was cancelled, or no turn of it is open: its last one may have
        ended, cancelled or failed) is remembered: the run's ``Stop`` then says ``again``.

        >>> from nous_inbox.inbox import Inbox
        >>> from nous_inbox.message import Message
        >>> core, queued = OwnerCore(), Session(inbox=Inbox().steer("go"))
        >>> core.wake(queued), core.cancel()          # a run, cancelled: it is stopping
        (True, True)
        >>> prompt = MessageSent(seq=2, target="next_turn", wakeup=True, message=Message.user("hi"))
        >>> core.arrived([prompt], queued)             # not now: one run at a time ...
        False
        >>> core.next_turn(queued, True)               # ... but as it stops, the next run starts
        Stop(record=(), again=True)
        """
        for event in events:
            if type(event) is MessageSent and event.wakeup:
                if self._running and (self._cancelled or not session.running):
                    self._again = True
                return self.wake(session)
        return False

    def wake(self, session: Session) -> bool:
        """Whether to start a run now: none is going, the owner is open, and a waking message
        worth a model round is queued. ``True`` means the run counts as started."""
        if self._running or self._closed or not (self._carry_on or session.inbox.worth_waking()):
            return False
        self._running = True
        self._cancelled = self._again = False
        return True

    def prompt(self) -> None:
        """A person's prompt is about to be sent. Until its send settles (:meth:`prompted`),
        the next turn to open is taken for the prompt's: the run the prompt wakes may open that
        turn before the send has returned its seq."""
        self._sending += 1
        self._unseen += 1

    def prompted(self, seq: int | None, *, maybe_stored: bool = False) -> None:
        """The prompt's send settled. Stored at ``seq``: a turn opens as ``"prompt"`` while the
        session still holds it on ``next_turn``; once a turn claimed it, or anyone withdrew it
        (this owner, or another process whose ``MessageWithdrawn`` was folded in), it counts no
        more. Not stored (``seq`` ``None``): no turn is a prompt's on its account, unless
        ``maybe_stored`` (a commit whose answer was lost): the next turn to open then still
        counts as its, as the prompt may be what that turn claims.

        >>> from nous_inbox.inbox import Inbox
        >>> core, queued = OwnerCore(), Session(inbox=Inbox().send("hi", "next_turn", True, seq=1))
        >>> core.prompt(); core.prompted(1)
        >>> withdrawn = Session(inbox=queued.inbox.withdraw(1)[1].steer("go"))
        >>> core.wake(withdrawn), core.next_turn(withdrawn, None)
        (True, Turn(reason='wake'))
        """
        self._sending = max(self._sending - 1, 0)
        if seq is not None:
            self._prompts.add(seq)
        if seq is not None or not maybe_stored:
            self._unseen = min(self._unseen, self._sending)

    def _forget_gone(self, session: Session) -> None:
        """Forget the stored prompts ``session`` no longer holds: claimed, or withdrawn."""
        if self._prompts:
            holds = session.inbox.holds
            self._prompts = {seq for seq in self._prompts if holds(seq) is _TURN}

    def cancel(self) -> bool:
        """Cancel the current run; whether one was going (the driver then cancels its turn).
        What was sent before it waits for a new waking send (ruling 9)."""
        if not self._running:
            return False
        self._cancelled = True
        self._again = False
        return True

    def cancel_asked(self, session: Session) -> bool:
        """A batch was folded in (``session`` includes it): whether it asked the run's open turn
        to end. ``True`` once per run; the run then counts as cancelled (the driver cancels its
        turn). Whether a request reaches the open turn is the fold's (``Session.cancelling``).

        >>> from nous_inbox.events import TurnStarted
        >>> from nous_inbox.inbox import Inbox
        >>> core, turn = OwnerCore(), Session(inbox=Inbox().steer("go")).apply(TurnStarted(seq=1, turn=1))
        >>> asked = turn.apply(turn.cancel())
        >>> core.cancel_asked(asked), core.wake(turn), core.cancel_asked(asked), core.cancel_asked(asked)
        (False, True, True, False)
        """
        if not session.cancelling or not self._running or self._cancelled:
            return False
        self._cancelled = True
        self._again = False
        return True

    def next_turn(self, session: Session, took: bool | None) -> Turn | Stop:
        """Asked by the run before each turn: open another (and why), or stop.

        ``took`` says whether the turn just ended claimed anything (``None`` before the first
        turn). A turn that claimed none of the messages that woke it (a runner that never
        claims) stops the run with a warning: waking again would spin forever on them.
        """
        self._forget_gone(session)
        if self._carry_on and not (self._closed or self._cancelled):
            self._carry_on = False
            return Turn("resumed")
        if self._closed or self._cancelled or not session.inbox.worth_waking():
            return self._stop()
        if took is False:
            return self._stop(Warned(text=_NO_PROGRESS))
        prompted = bool(self._unseen or self._prompts)  # a prompt queued, or one being sent
        self._unseen = 0
        self._again = False
        return Turn("prompt" if prompted else "wake")

    def failed(self, session: Session, error: BaseException) -> Stop:
        """The run died (a failing model, a store that failed): stop, ending its open turn.
        Messages queued before it ended wait for a new waking send, as after a cancel, so a
        failing model is not asked again and again; one sent after its end starts the next run
        (``Stop.again``).

        A lost lease records nothing: the store fences this owner's appends, and the new owner
        closes the open turn when it resumes.
        """
        if isinstance(error, LeaseLostError):
            self.lease_lost(error)
        if not session.running or self._lost is not None:
            return self._stop()
        return self._stop(TurnEnded(turn=session.turn, steps=session.step, reason="error",
                                    error=f"{type(error).__name__}: {error}"))

    def close(self) -> bool:
        """Close the owner: nothing starts any more; whether a run was going (now cancelled)."""
        self._closed = True
        return self.cancel()

    def hand_over(self) -> bool:
        """The owner hands its session over: nothing starts any more, and the run going (if
        any) goes on to its next boundary rather than being cancelled. ``True``: the owner's
        port stops the run at that boundary from now on (:mod:`nous_inbox.owner.handover`)."""
        self._closed = True
        return True

    def let_go(self) -> Stop:
        """The run stopped where its owner let the session go: it records nothing (the open
        turn is the next holder's to end) and nothing starts after it."""
        return self._stop()

    def lease_lost(self, error: LeaseLostError) -> bool:
        """Another owner took the stream over: close for good, keeping ``error`` as :attr:`lost`
        (the driver raises it from later sends and waits). Whether a run was going.

        >>> core = OwnerCore()
        >>> core.lease_lost(LeaseLostError("taken over")), core.closed, str(core.lost)
        (False, True, 'taken over')
        """
        if self._lost is None:
            self._lost = error
        return self.close()

    def _stop(self, *record: Event) -> Stop:
        again = self._again and not self._closed
        self._running = self._cancelled = self._again = False
        return Stop(record, again)
