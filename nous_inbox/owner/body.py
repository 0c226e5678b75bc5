"""The body both owners share: what an owner is, with neither its threads nor its event loop.

An owner holds one session and decides when to run; its decisions are
:class:`~nous_inbox.owner.core.OwnerCore`'s. What is the same whether the turns run on a worker
thread (:class:`~nous_inbox.owner.Owner`) or as an asyncio task
(:class:`~nous_inbox.owner.async_owner.AsyncOwner`) lives here once: options and checks, views,
opening (lease, journal, resume), the send verbs over one path, listeners, the boundary hook
(:mod:`nous_inbox.boundary`), a refused prompt's undo, a run's failure, a lost lease, closing,
the watcher's look. Turn answers are :class:`~nous_inbox.owner.turn_result.TurnAnswers`'; each
owner adds its pump; what crosses its edge is :mod:`nous_inbox.owner.port`'s.

One send path: every verb is one line over ``_send``, which commits at once (a store that does
not block, or a thread holding the owner's lock) or queues the send for the next group commit
(:mod:`nous_inbox.owner.group_commit`), its parts checked once, before anything is written. A
cancel is a ``CancelRequested`` in the log (:mod:`nous_inbox.owner.port`); it wakes nothing.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final, Generic, TypeVar

from nous_inbox.boundary import Boundaries, Boundary
from nous_inbox.errors import HandedOverError, LeaseLostError
from nous_inbox.events import Event, MessageSent
from nous_inbox.inbox import Inbox, as_message
from nous_inbox.message import Message
from nous_inbox.owner.core import OwnerCore, Stop
from nous_inbox.owner.group_commit import refused_unwritten
from nous_inbox.owner.handover import carried_on
from nous_inbox.owner.idle_watch import check_poll_interval, taken_over
from nous_inbox.owner.port import OwnerPort, RunOptions, cancel_open_turn
from nous_inbox.owner.turn_result import TurnAnswers
from nous_inbox.runner.deltas import Deltas
from nous_inbox.runner.tracing import carried
from nous_inbox.session import Session
from nous_inbox.store import Store
from nous_inbox.store.base import check_stream
from nous_inbox.store.journal import Journal
from nous_inbox.store.snapshot import SNAPSHOT_EVERY, check_snapshot_every
from nous_inbox.verbs import FOLLOWUP, INJECT, PROMPT, STEER, Target, Verb

__all__ = ["Listener", "OwnerBody"]

logger: Final = logging.getLogger("nous_inbox.owner")

R = TypeVar("R")
H = TypeVar("H")
Listener = Callable[[Event], None]


class OwnerBody(Generic[R, H], abc.ABC):
    """What both owners are, less their pumps (see the module notes). ``R`` is what a send verb
    returns: the stored ``MessageSent``, or an awaitable of it; ``H`` what ``prompt`` and
    ``followup`` return: a handle on the turn they start or join (:mod:`nous_inbox.owner.turn_result`)."""

    _who: ClassVar[str]
    _run_method: ClassVar[str]

    def __init__(
        self, store: Store, stream: str, runner: Any, *, watch: bool = True,
        poll_interval: float = 0.05, start: bool = True, snapshot_every: int = SNAPSHOT_EVERY,
        freeze_gc: bool = False,
    ) -> None:
        who = self._who
        if not callable(getattr(runner, self._run_method, None)):
            raise TypeError(f"{who}: runner must have {self._run_method}(port, *, reason, cancel) "
                            f"(a nous_inbox.runner.Runner), got {type(runner).__name__}")
        if not isinstance(stream, str):
            raise TypeError(f"{who}: stream must be a str, got {type(stream).__name__}")
        check_stream(stream)
        for name, value in (("watch", watch), ("start", start), ("freeze_gc", freeze_gc)):
            if type(value) is not bool:
                raise TypeError(f"{who}: {name} must be a bool, got {type(value).__name__}")
        interval = check_poll_interval(poll_interval, who)
        check_snapshot_every(snapshot_every, who)
        self._store, self._stream, self._runner = store, stream, runner
        self._watch_others, self._poll_interval, self._start = watch, interval, start
        self._snapshot_every, self._freeze_gc = snapshot_every, freeze_gc
        self._lock = threading.RLock()  # guards the journal, wherever it is called from
        self._core = OwnerCore()  # every decision
        self._listeners: list[Listener] = []
        self._boundaries = Boundaries(stream)
        self._journal: Journal | None = None
        self._port: OwnerPort | None = None
        self._failure: BaseException | None = None
        self._closed = False  # close() (aclose()) was called: the owner refuses sends
        self._run: object | None = None  # the run going: the pump's thread or task
        self._cancel: threading.Event | asyncio.Event | None = None  # the open turn's cancel
        self._run_options = RunOptions()  # kept for the turns of the sends they came with
        load = getattr(runner, "load_output", None)
        self._answers = TurnAnswers(stream, self._read, load if callable(load) else None)
        check = getattr(runner, "check_message", None)
        self._check_message: Callable[[Message], object] | None = check if callable(check) else None

    # -- what a host reads ------------------------------------------------------------------------

    @property
    def stream(self) -> str:
        """The session's stream name in the store."""
        return self._stream

    @property
    def session(self) -> Session:
        """The session value as folded so far: equal to ``replay`` of the stored events."""
        return self._opened().session

    @property
    def inbox(self) -> Inbox:
        """The inbox value now."""
        return self.session.inbox

    @property
    def transcript(self) -> list[Message]:
        """The transcript now, as a list."""
        return list(self.session.transcript)

    @property
    def replayed(self) -> int:
        """How many events the open replayed past the session's snapshot (all, with none): what
        ``snapshot_every`` saves a reopen. 23 events, a snapshot every 10: it opens with 3."""
        return self._opened().replayed

    @property
    def lost(self) -> LeaseLostError | None:
        """The ``LeaseLostError`` that stopped this owner for good (another took the stream
        over), or ``None``; from then on its sends and waits raise it."""
        return self._core.lost

    @property
    def closed(self) -> bool:
        """Whether the owner was closed or lost its lease: from then on it refuses sends."""
        return self._closed or self._core.lost is not None

    @property
    def running(self) -> bool:
        """Whether a run is going (from the send that woke it until its end is recorded)."""
        return self._run is not None

    def listen(self, callback: Listener) -> None:
        """Call ``callback(event)`` for every event recorded from now on, in order (the owner's
        own and those another process appended). Keep it quick; one that raises is logged and
        stops neither the others nor the run. A callback may send with the owner's verbs (an
        ``AsyncOwner``'s is queued, unless made inside ``owner.at_once()``)."""
        if not callable(callback):
            raise TypeError(f"listen needs a callable, got {type(callback).__name__}")
        with self._lock:
            self._listeners.append(callback)

    def on_boundary(self, callback: Callable[[Boundary], object]) -> Callable[[], None]:
        """Tell ``callback`` each time a run reaches a boundary, before the claim there; returns
        the call that unsubscribes it. See :mod:`nous_inbox.boundary`.

        >>> from nous_inbox.owner import Owner; from nous_inbox.runner import Runner
        >>> from nous_inbox.store import open_store
        >>> owner = Owner(open_store("memory:"), "demo", Runner(lambda transcript, tools: "ok"))
        >>> def at(boundary):   # what it sends joins the claim that follows
        ...     print(boundary.kind, boundary.turn)
        >>> unsubscribe = owner.on_boundary(at)
        >>> _ = owner.steer("go")
        >>> owner.wait_idle(timeout=5)   # a stop: where the run would stop (ruling 2)
        turn_opening 1
        step 1
        stop 1
        turn_ended 1
        True
        >>> owner.close()
        """
        with self._lock:
            return self._boundaries.subscribe(callback)

    def __repr__(self) -> str:
        state = ("not open" if self._journal is None else "closed" if self.closed
                 else f"version {self.session.version}")
        return f"{self._who}({self._stream!r}, {state})"

    # -- what a host says -------------------------------------------------------------------------

    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> R:
        """Queue ``message`` on ``target`` durably, then wake if it asks to and nothing runs.

        Bad input is refused before anything is written, and so is a message the runner says it
        cannot deliver (its ``check_message``). A failure (a refusal, or a commit whose outcome
        is unknown) is raised by the threaded owner at the call, by an ``AsyncOwner`` when what
        it returned is awaited. Returns the event as stored, once it is.
        """
        try:
            return self._send(self._deliverable(message), target, wakeup)
        except Exception as exc:
            return self._refused(exc)

    def steer(self, message: Message | str) -> R:
        """The ``steer`` verb: next step, wakes, "read this before your next model request"."""
        return self.send(message, STEER.target, STEER.wakeup)

    def inject(self, message: Message | str) -> R:
        """The ``inject`` verb: next step, no wake, "have this if you make another request"."""
        return self.send(message, INJECT.target, INJECT.wakeup)

    def followup(self, message: Message | str, **run_options: Any) -> H:
        """The ``followup`` verb: next turn, wakes, "answer this after you finish what you are
        doing". Returns a handle on the turn that will answer it; ``run_options`` and a blank
        message as for :meth:`prompt`."""
        return self._turn(message, FOLLOWUP, run_options)

    def prompt(self, text: Message | str, **run_options: Any) -> H:
        """The ``prompt`` verb: a person's prompt, a turn of its own (recorded as ``"prompt"``),
        after any turn in progress. It waits in ``next_turn`` with a wake, like a followup.

        Returns a handle on the turn it starts (or joins, with what was queued beside it):
        ``sent`` is the stored send, and the handle's result is the turn's
        :class:`~nous_inbox.owner.turn_ledger.TurnResult`. ``run_options`` reach the runner for that
        turn only (a pydantic-ai ``AgentRunner``: ``deps``, ``model_settings``, ...; a runner
        that takes none refuses them), and a prompt with some joins no other send: options are
        never merged. They are not logged: a turn a new owner opens after a restart runs
        without them. A blank prompt is refused, as no turn would ever answer it (ruling 4);
        ``send`` it to ``next_turn`` to have it ride along. A refusal comes before anything is
        written: raised at the call, or (``AsyncOwner``) where the handle is awaited.

        >>> from nous_inbox.owner import Owner; from nous_inbox.runner import Runner
        >>> from nous_inbox.store import open_store
        >>> with Owner(open_store("memory:"), "s", Runner(lambda transcript, tools: "ok")) as owner:
        ...     owner.prompt("  ")
        Traceback (most recent call last):
        ...
        ValueError: prompt: the message is blank, and a blank message never opens a turn ...
        """
        return self._turn(text, PROMPT, run_options)

    def _turn(self, message: Message | str, verb: Verb, run_options: dict[str, Any]) -> H:
        """A prompt or followup (``verb``), checked, then the pump's send of it (or its refusal)."""
        try:
            checked = as_message(self._deliverable(message))
            if checked.blank:
                raise ValueError(f"{verb.name}: the message is blank, and a blank message never "
                                 f"opens a turn (ruling 4), so no turn would answer it; nothing "
                                 f"was sent")
            return self._turn_send(checked, verb, RunOptions.checked(self._runner, run_options))
        except Exception as exc:
            return self._turn_refused(exc)

    @abc.abstractmethod
    def _turn_send(self, message: Message | str, verb: Verb,
                   options: dict[str, Any] | None) -> H:
        """The pump's send of a prompt or followup (``verb``), answered by a handle on its turn."""

    @abc.abstractmethod
    def _refused(self, error: Exception) -> R:
        """A send refused: raise ``error`` now, or answer what raises it when awaited."""

    @abc.abstractmethod
    def _turn_refused(self, error: Exception) -> H:
        """A prompt or followup refused, as :meth:`_refused`."""

    # -- turn results -----------------------------------------------------------------------------

    def _unanswered(self, seq: int) -> None:
        """The send at ``seq`` has no result yet: raise if none will come from this owner."""
        self._raise_if_lost()
        if self.closed and not self.running:
            raise RuntimeError(f"{self._who} of session {self._stream!r} closed before the turn "
                               f"of the send at seq {seq} ended (a new owner answers for it: "
                               f"turn_handle({seq}))")

    @abc.abstractmethod
    def _send(self, message: Message | str, target: Target | str, wakeup: bool,
              prompt: bool = False) -> R:
        """The pump's one send path: store the send (inline or batched) and answer it."""

    def _deliverable(self, message: Message | str) -> Message | str:
        """``message``, once the runner's ``check_message`` (when it has one) let it through: a
        message the runner could not deliver to its model as sent is refused here, before
        anything is written, so the log never holds what the model was never shown."""
        message = carried(message)  # the sender's span: the step that claims it links to it
        if self._check_message is None:
            return message
        self._check_message(checked := as_message(message))
        return checked

    # -- the body's rules -------------------------------------------------------------------------

    def _outlet(self) -> Deltas | None:  # the text-delta outlet once open: a reader asks at start
        return None if self._port is None else self._port.deltas

    def _opened(self) -> Journal:
        if self._journal is None:
            raise RuntimeError(f"{self._who} of session {self._stream!r} is not open: "
                               f"use `async with {self._who}(...)`")
        return self._journal

    def _check_open(self) -> Journal:
        """The journal, if the owner takes sends; else the error saying why not."""
        journal = self._opened()
        self._raise_if_lost()
        if self._closed:
            raise RuntimeError(f"{self._who} of session {self._stream!r} is closed")
        return journal

    def _raise_if_lost(self) -> None:
        lost = self._core.lost
        if lost is not None:  # a new error each time, so no traceback grows on the stored one
            raise LeaseLostError(str(lost), stream=lost.stream, epoch=lost.epoch) from lost

    def _waited(self, idle: bool) -> bool:
        """A wait for the run ended (``idle``: not timed out): raise ``lost``, or (once) what
        ended the last run; a lost lease wins, as the owner is over either way."""
        with self._lock:
            failure, self._failure = self._failure, None
        self._raise_if_lost()
        if failure is not None:
            raise failure
        return idle

    def _open_session(self, call_io: Callable[..., Any] | None = None) -> Any:
        """Take the stream's lease, fold the session, close (or carry on) a turn the log shows
        open; returns the lease (store I/O: an ``AsyncOwner`` calls it on its worker).

        One owner per stream, across processes: without the lease, a second owner would end the
        first one's open turn as "interrupted" and run beside it."""
        lease = self._store.own(self._stream)
        try:
            with self._lock:
                journal = Journal(self._store, self._stream, on_events=self._folded,
                                  snapshot_every=self._snapshot_every, freeze_gc=self._freeze_gc)
                self._journal = journal
                answers, options = self._answers, self._run_options
                self._port = OwnerPort(
                    journal, self._lock, self._boundaries, call_io,
                    options=lambda: options.of_turn(answers.ledger.claimed_now),
                    limit=lambda target: options.limit(target, answers.ledger.queued))
                self._answers.start(journal.session)
                carry = carried_on(self._store, self._stream, journal.session)
                resumed = self._core.resume(journal.session, carry)
                if resumed:
                    journal.append(resumed)
        except BaseException:
            lease.release()
            raise
        return lease

    def _sent_now(self, message: Message | str, target: Target | str, wakeup: bool,
                  options: dict[str, Any] | None = None) -> MessageSent:
        """Commit one send at once (the journal checks its parts before anything is written),
        keeping its run ``options`` for the turn that claims it in the same lock hold, so no
        claim can come first."""
        with self._lock:
            sent = self._opened().send(message, target, wakeup)
            if options is not None:
                self._run_options.keep(sent.seq, options)
            return sent

    def _read(self, after: int) -> list[Event]:
        """The stored events with ``seq > after``, read from the store (I/O)."""
        return list(self._store.read(self._stream, after))

    def _commit(self, events: Sequence[Event]) -> Sequence[Event]:
        """Append ``events`` in one transaction (a group commit's batch, a run's last record)."""
        with self._lock:
            return self._opened().append(events)

    def _holds_lock(self) -> bool:
        """Whether this thread holds the owner's lock (a listener, a boundary subscriber, a run
        inside a claim): a send from it commits at once, as queueing would wait for itself."""
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]

    def _sent_failed(self, error: BaseException, prompt: bool) -> None:
        """A send raised ``error``: a lost lease ends the owner; a prompt that cannot be in the
        log opens no turn as a prompt (one whose commit may have landed still does)."""
        if isinstance(error, LeaseLostError):
            self._lose(error)
        if prompt:
            self._prompt_settled(None, not refused_unwritten(error))

    @abc.abstractmethod
    def _prompt_settled(self, seq: int | None, maybe_stored: bool = False) -> None:
        """A prompt's send settled: the core hears it (``OwnerCore.prompted``) where it decides."""

    def _folded(self, events: Sequence[Event]) -> None:
        """The journal folded ``events`` in (under the lock, on the thread that appended or caught
        up): hand them on, tell the boundary subscribers of a turn that ended. Never raises."""
        try:
            self._run_options.fold(events)  # a withdrawn send's options: no turn will read them
            if self._answers.fold(events):
                self._turn_ended()
            self._deliver(events)
        except Exception:
            logger.exception("handing on the events of session %r failed", self._stream)
        self._boundaries.ended(events)

    def _turn_ended(self) -> None:
        """An answer came (a turn ended, a prompt was withdrawn, a send settled): wake waiters."""

    def _deliver(self, events: Sequence[Event]) -> None:
        self._tell(events)

    def _tell(self, events: Sequence[Event]) -> None:
        """Tell the listeners of each event, in order, then ask the core whether to wake."""
        listeners = tuple(self._listeners)
        for event in events if listeners else ():
            for listener in listeners:
                try:
                    listener(event)
                except Exception:
                    logger.exception("a listener of session %r failed on event #%d",
                                     self._stream, event.seq)
        if self._journal is not None:
            self._answer(events, self._journal.session)

    def _answer(self, events: Sequence[Event], session: Session) -> None:
        """Ours or another's: a batch asking the open turn to end cancels it; a waking send wakes."""
        if self._core.cancel_asked(session):
            self._cancel_turn()
        if self._core.arrived(events, session):
            self._start_run()

    def _cancel_now(self) -> bool:
        """Cancel the run in this process (under the lock, or on the loop): whether one was going."""
        if not self._core.cancel():
            return False
        self._cancel_turn()
        return True

    def _record_cancel(self) -> None:
        """Record a cancel of the open turn, if one is open and not asked yet (store I/O, under
        the lock). A store that fails is logged: the cancel still holds in this process."""
        try:
            with self._lock:
                self._opened().commit(cancel_open_turn)
        except LeaseLostError as exc:
            self._lose(exc)
        except Exception:
            logger.exception("could not record the cancel of session %r", self._stream)

    @abc.abstractmethod
    def _start_run(self) -> None:
        """Start a run on the pump's worker thread or as its task."""

    def _run_failed(self, error: BaseException) -> Stop:
        """The run died with ``error`` (under the lock, or on the loop): the core's ``Stop``. A
        handover's records nothing; a lost lease ends the owner; any other failure is logged
        and kept for the next wait to raise."""
        if isinstance(error, HandedOverError):
            return self._core.let_go()
        if isinstance(error, LeaseLostError):
            self._lose(error)
        else:
            logger.error("the run of session %r failed", self._stream, exc_info=error)
            self._failure = error
        return self._core.failed(self.session, error)

    def _record_stop(self, stop: Stop) -> None:
        """Append what the core's ``Stop`` records (store I/O). The run is over either way: a
        lost lease ends the owner, and any other failure is logged and kept for the next wait."""
        if not stop.record:
            return
        try:
            self._commit(stop.record)
        except Exception as exc:
            logger.exception("could not record the end of session %r's run", self._stream)
            if isinstance(exc, LeaseLostError):
                self._lose(exc)
            else:
                with self._lock:
                    self._failure = self._failure or exc

    def _lose(self, error: LeaseLostError) -> None:
        """The store says another owner took the stream over: stop for good."""
        with self._lock:
            if self._core.lost is None:
                logger.error("the owner of session %r lost its lease and stops: %s",
                             self._stream, error)
            if self._core.lease_lost(error):
                self._cancel_turn()
        self._halted()

    def _cancel_turn(self) -> None:
        """Cancel the turn in flight: set its cancel (a thread's event, or the loop's)."""
        if self._cancel is not None:
            self._cancel.set()

    def _halted(self) -> None:
        """The owner is over (a lost lease): wake its waiters, stop its watcher."""

    def _behind(self, lease: object) -> bool:
        """The look an idle owner's shared watch makes for it (store I/O, without the lock):
        whether the store holds events this owner has not folded, or its lease was taken over
        (either way the owner must look itself)."""
        return (taken_over(lease, self._stream) is not None
                or self._store.version(self._stream) != self._opened().session.version)

    def _catch_up(self) -> None:
        """The watcher's look at the store: fold in what another process appended."""
        journal = self._opened()
        if self._store.version(self._stream) != journal.session.version:
            with self._lock:
                journal.catch_up()
