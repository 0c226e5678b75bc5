"""Owner: the actor that holds one session, its inbox value and its log, and decides when to wake.

A host embeds one owner per session. People and other agents call ``steer``, ``inject``,
``followup`` or ``prompt`` from any thread (or asyncio task: the calls never wait for a run). The
owner appends each send to its store, folds it into the session value and, when the send asks to
wake, asks the inbox ``worth_waking()`` (a waking message worth a model round is queued; a blank
one never is, ruling 4): if no run is going, it starts one on a worker thread. When a
run ends it asks again, so a steer that landed after the run's last claim still gets its run. It
never starts two runs at once. A send that does not ask to wake (an injection) never starts a run,
even when an older waking entry is still queued after a cancel (ruling 9).

>>> from nous_inbox.message import Message
>>> from nous_inbox.runner import Runner
>>> from nous_inbox.store import open_store
>>> def model(transcript, tools):
...     return Message.assistant(f"heard: {transcript[-1].content}")
>>> owner = Owner(open_store("memory:"), "demo", Runner(model))
>>> _ = owner.inject("fyi: nothing wakes for this")
>>> owner.wait_idle(timeout=5), owner.session.turn
(True, 0)
>>> _ = owner.steer("summarize")
>>> owner.wait_idle(timeout=5), [m.content for m in owner.transcript]
(True, ['fyi: nothing wakes for this', 'summarize', 'heard: summarize'])
>>> owner.close()

Durability. Every event is appended to the store before the owner acts on it, and a claim is one
``QueueClaimed`` event that both drains the queue and becomes the transcript entries (ruling 6):
kill the process at any moment and each message is either still queued or in the transcript.
An owner opened on an existing stream replays it and resumes with the same inbox and transcript;
a turn the log shows as open (the process died mid-run) is closed with reason ``"error"``, and a
waking message still queued starts a run. A stream has one owner at a time, in any process: the
owner holds the store's lease on it (``store.own``) until ``close()``, and a second owner is
refused with ``StreamOwnedError``. When a process dies without ``close()``, a file or SQLite
lease dies with it at once; a PostgreSQL lease only expires, ``lease`` seconds after its last
renewal.

A lease taken over is final. When a store whose leases expire (PostgreSQL) finds this owner's
lease was taken over by another owner (this host was paused or cut off for longer than the
lease), it fences every append with :class:`~nous_inbox.errors.LeaseLostError` and writes
nothing. The owner then stops for good: the run stops at its next append (without recording
anything: the session is someone else's now), nothing starts any more, the watcher stops, and
``lost`` holds the error, which ``wait_idle()`` and every later send raise. Close it and open a
new owner (which waits for the lease) if this host should run the session again.

Other processes. Appends are made with the stream's expected version. When another process (the
``nous-inbox steer`` command, say) has appended in between, the store refuses, the owner reads
what it missed, folds it in, and tries again; a watcher thread polls the store's cheap version
number so an idle owner wakes for such a send too (a store that offers
``subscribe(stream, callback)``, as the PostgreSQL store does, wakes the watcher instead, and
polls only as a slow backstop). A running owner also checks the version at each
claim, so a steer from another terminal reaches the run at its next step boundary.

Cancelling (ruling 9): ``cancel()`` ends the current turn as ``"cancelled"`` at its next boundary
and wakes nothing; queued messages wait for the next prompt or waking send.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Protocol

import attrs

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Inbox, Target
from nous_inbox.journal import Journal
from nous_inbox.message import Message
from nous_inbox.owner_core import OwnerCore, Stop
from nous_inbox.port import JournalPort, SendPresets, refused_unwritten, sent_event
from nous_inbox.session import Session
from nous_inbox.snapshot import SNAPSHOT_EVERY, check_snapshot_every
from nous_inbox.store import Store

__all__ = ["Owner", "TurnRunner"]

logger: Final = logging.getLogger("nous_inbox.owner")

Listener = Callable[[Event], None]


class TurnRunner(Protocol):
    """What an owner needs from a runner: run one turn on a port, yielding its events."""

    def run_turn(
        self, port: Any, *, reason: str = ..., cancel: threading.Event | None = ...
    ) -> Iterator[Event]:
        """Run one turn; see ``nous_inbox.runner.Runner.run_turn``."""


def _positive_seconds(owner: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0 or value == float("inf"):
        raise ValueError(f"Owner: {attribute.alias} must be a positive number of seconds, got {value!r}")


def _of(kind: type) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """An attrs validator whose error names the option as the caller spelled it."""

    def check(owner: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, kind):
            raise TypeError(f"Owner: {attribute.alias} must be a {kind.__name__}, "
                            f"got {type(value).__name__}")

    return check


def _optional_callable(owner: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"Owner: {attribute.alias} must be callable or None, got {type(value).__name__}")


def _check_runner(runner: object) -> None:
    if not callable(getattr(runner, "run_turn", None)):
        raise TypeError("Owner: runner must have run_turn(port, *, reason, cancel) (a "
                        f"nous_inbox.Runner), got {type(runner).__name__}")


def _snapshot_count(owner: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_snapshot_every(value, "Owner")


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Owner: poll_interval must be a number of seconds, got {type(value).__name__}")
    return float(value)


@attrs.define(slots=False, eq=False, repr=False, init=True)
class Owner(SendPresets):
    """Holds one session (``stream`` in ``store``) and runs ``runner`` whenever it should wake.

    ``listen`` callbacks see every event as it is recorded, in order (the owner's own and those
    another process appended); ``watch`` starts the thread that notices other processes' sends
    (``poll_interval`` seconds apart); ``start`` wakes right away if the replayed inbox wants it.
    ``snapshot_every`` is how many events pass between two snapshots of the session (0: none;
    see :mod:`nous_inbox.snapshot`): opening replays only what followed the newest one.
    ``freeze_gc`` (on by default) has the journal ``gc.freeze()`` a long session's history so
    the collector's full passes stop walking it (flat send latency; see
    :mod:`nous_inbox.journal`); the price: host objects caught in a reference cycle at a
    freeze are never collected. ``freeze_gc=False`` leaves the collector alone.
    The options are checked before the stream's lease is taken: a bad one is a ``TypeError`` or
    ``ValueError`` naming it, and nothing happened.

    >>> from nous_inbox.store import open_store
    >>> def model(transcript, tools):
    ...     return "ok"
    >>> Owner(open_store("memory:"), "s", model)
    Traceback (most recent call last):
    ...
    TypeError: Owner: runner must have run_turn(port, *, reason, cancel) (a nous_inbox.Runner), got function
    >>> from nous_inbox.runner import Runner
    >>> Owner(open_store("memory:"), "s", Runner(model), poll_interval=0)
    Traceback (most recent call last):
    ...
    ValueError: Owner: poll_interval must be a positive number of seconds, got 0.0
    """

    _store: Store
    _stream: str = attrs.field(validator=_of(str))
    _runner: TurnRunner = attrs.field(validator=lambda _, __, runner: _check_runner(runner))
    _listen: Listener | None = attrs.field(
        default=None, kw_only=True, validator=_optional_callable
    )
    _watch_others: bool = attrs.field(
        default=True, kw_only=True, alias="watch", validator=_of(bool)
    )
    _poll_interval: float = attrs.field(
        default=0.05, kw_only=True, converter=_seconds, validator=_positive_seconds
    )
    _start: bool = attrs.field(default=True, kw_only=True, validator=_of(bool))
    _snapshot_every: int = attrs.field(
        default=SNAPSHOT_EVERY, kw_only=True, alias="snapshot_every", validator=_snapshot_count
    )
    _freeze_gc: bool = attrs.field(
        default=True, kw_only=True, alias="freeze_gc", validator=_of(bool)
    )

    def __attrs_post_init__(self) -> None:
        store, stream, listen = self._store, self._stream, self._listen
        watch, poll_interval, start = self._watch_others, self._poll_interval, self._start
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._listeners: list[Listener] = [listen] if listen is not None else []
        self._worker: threading.Thread | None = None
        self._cancel: threading.Event | None = None
        self._closed = threading.Event()
        self._halt = threading.Event()  # closed or lost: the watcher stops
        self._nudge = threading.Event()  # the store says the stream may have changed (or close)
        self._failure: BaseException | None = None
        self._core = OwnerCore()  # every decision; this class does the threads and the I/O
        # One owner per stream, across processes: without the lease, a second owner would end
        # the first one's open turn as "interrupted" and run beside it.
        self._lease = store.own(stream)
        try:
            self._journal = Journal(store, stream, on_events=self._folded,
                                    snapshot_every=self._snapshot_every,
                                    freeze_gc=self._freeze_gc)
            # The runner reads and writes the session through the one port there is; the
            # journal's claim is the one claim path (a steer another process appended joins it).
            self._port = JournalPort(self._journal, self._lock)
            resumed = OwnerCore.resume(self._journal.session)
            if resumed:
                self._append(resumed)
        except BaseException:
            self._lease.release()
            raise
        self._watcher: threading.Thread | None = None
        if watch:
            self._watcher = threading.Thread(
                target=self._watch, args=(poll_interval,), name=f"nous-inbox watch {stream}",
                daemon=True,
            )
            self._watcher.start()
        if start:
            self._maybe_wake()

    # -- what a host reads ----------------------------------------------------------------------

    @property
    def stream(self) -> str:
        """The session's stream name in the store."""
        return self._stream

    @property
    def session(self) -> Session:
        """The session value as folded so far: equal to ``replay`` of the stored events."""
        return self._journal.session

    @property
    def inbox(self) -> Inbox:
        """The inbox value now."""
        return self._journal.session.inbox

    @property
    def transcript(self) -> list[Message]:
        """The transcript now, as a list."""
        return list(self._journal.session.transcript)

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called: from then on the owner refuses sends."""
        return self._closed.is_set()

    @property
    def lost(self) -> LeaseLostError | None:
        """The ``LeaseLostError`` that stopped this owner for good, or ``None``.

        Set once the store refused an append because another owner took the lease over (see the
        module notes); from then on ``wait_idle`` and every send raise it.
        """
        return self._core.lost

    @property
    def running(self) -> bool:
        """Whether a run is going (or about to start)."""
        return self._worker is not None

    def events(self, after: int = 0) -> list[Event]:
        """The session's stored events with ``seq > after``, read back from the store."""
        return list(self._store.read(self._stream, after))

    def listen(self, callback: Listener) -> None:
        """Call ``callback(event)`` for every event recorded from now on, in order.

        Callbacks run on the thread that recorded the event (for a send, whichever sender led
        its group commit), inside the owner's lock: keep them quick. A callback may itself send;
        that send is committed at once, not queued behind the commit calling it. One that raises
        is logged and does not stop the others or the run.
        """
        with self._lock:
            self._listeners.append(callback)

    # -- what a host says -----------------------------------------------------------------------

    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` durably, then wake if it asks to and nothing runs.

        Input is checked before anything is written: a bad message, target or wakeup raises and
        leaves the log and the value unchanged. Returns the event as stored.
        """
        event = sent_event(message, target, wakeup)
        self._check_open()
        # A group commit: concurrent sends share one transaction (see JournalPort.append); it
        # returns once that has committed. A waking send wakes as its batch is folded in.
        try:
            stored = self._port.append(event)
        except LeaseLostError as exc:
            self._lose(exc)
            raise
        return stored  # type: ignore[return-value]

    def prompt(self, text: Message | str) -> MessageSent:
        """A person's prompt: a turn of its own, after any turn in progress.

        It waits in ``next_turn`` with a wake, like a followup; the turn it opens is recorded
        with reason ``"prompt"`` rather than ``"wake"``.
        """
        with self._lock:
            self._core.prompt()
        try:
            return self.followup(text)
        except BaseException as exc:
            # Undone only when the prompt cannot be in the log: one whose commit may have landed
            # (``StoreError``, outcome unknown) still opens its turn as a prompt.
            if refused_unwritten(exc):
                with self._lock:
                    self._core.unprompt()
            raise

    def cancel(self) -> bool:
        """End the current turn at its next boundary, as ``"cancelled"``; wake nothing after it.

        Returns whether a run was going. Queued messages stay queued.
        """
        with self._lock:
            if not self._core.cancel():
                return False
            if self._cancel is not None:
                self._cancel.set()
            return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no run is going; ``False`` if ``timeout`` seconds passed first.

        Re-raises (once) an exception that ended the last run, such as a failing model; raises
        ``lost`` (every time, at once) when the owner's lease was taken over. ``lost`` wins: a
        failure of the last run is then dropped (it was logged when the run ended), since the
        owner is over either way.
        """
        with self._changed:
            idle = self._changed.wait_for(
                lambda: self._worker is None or self._core.lost is not None, timeout)
            failure, self._failure = self._failure, None
        self._raise_if_lost()
        if failure is not None:
            raise failure
        return idle

    def close(self, timeout: float | None = 10.0) -> None:
        """Cancel any run, stop the watcher, wait for both, and give up the stream's lease.

        The store stays open (it is yours). If the run does not stop within ``timeout``
        seconds the lease is kept, so no other owner can start a run beside it.
        """
        self._closed.set()
        self._halt.set()
        self._nudge.set()
        with self._lock:
            if self._core.close() and self._cancel is not None:
                self._cancel.set()
        with self._lock:
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)
        if self._watcher is not None:
            self._watcher.join(timeout)
        if worker is None or not worker.is_alive():
            self._lease.release()
        else:
            logger.warning("the run of session %r did not stop within %s s; keeping its lease",
                           self._stream, timeout)

    def __enter__(self) -> Owner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the log --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        self._raise_if_lost()
        if self._closed.is_set():
            raise RuntimeError(f"owner of session {self._stream!r} is closed")

    def _raise_if_lost(self) -> None:
        lost = self._core.lost
        if lost is not None:  # a new error each time, so no traceback grows on the stored one
            raise LeaseLostError(str(lost), stream=lost.stream, epoch=lost.epoch) from lost

    def _lose(self, error: LeaseLostError) -> None:
        """The store says the lease was taken over: stop for good (see the module notes)."""
        with self._lock:
            if self._core.lost is None:
                logger.error("the owner of session %r lost its lease and stops: %s",
                             self._stream, error)
            if self._core.lease_lost(error) and self._cancel is not None:
                self._cancel.set()
            self._changed.notify_all()
        self._halt.set()
        self._nudge.set()

    def _folded(self, events: Sequence[Event]) -> None:
        """Every batch the journal folds in: tell the listeners, and wake for a waking send."""
        for event in events:
            for listener in self._listeners:
                try:
                    listener(event)
                except Exception:
                    logger.exception("a listener of session %r failed on event #%d",
                                     self._stream, event.seq)
        self._changed.notify_all()
        # Ours or another process's: a send that asks to wake is answered (the core's rule).
        if self._core.arrived(events, self._journal.session):
            self._start_worker()

    def _append(self, events: Sequence[Event]) -> list[Event]:
        with self._lock:
            stored, _ = self._journal.commit(lambda session: (events, None))
            return stored

    # -- waking ---------------------------------------------------------------------------------

    def _maybe_wake(self) -> None:
        with self._lock:
            if self._core.wake(self._journal.session):
                self._start_worker()

    def _start_worker(self) -> None:
        """The core said start (called with the lock held)."""
        # The first turn's cancel exists as soon as the run does, so a cancel() right after the
        # send that woke it is honoured before the turn starts.
        self._cancel = threading.Event()
        self._worker = threading.Thread(
            target=self._work, name=f"nous-inbox run {self._stream}", daemon=True
        )
        self._worker.start()

    def _work(self) -> None:
        took: bool | None = None  # whether the last turn claimed anything; None before the first
        try:
            while True:
                with self._lock:
                    # Deciding to stop and saying so (worker = None) happen under one lock hold,
                    # so a send that lands meanwhile either is seen here or starts a new worker.
                    answer = self._core.next_turn(self._journal.session, took)
                    if isinstance(answer, Stop):
                        self._stop_working(answer)
                        return
                    if took is not None:
                        self._cancel = threading.Event()
                    cancel = self._cancel
                    assert cancel is not None
                took = False
                for event in self._runner.run_turn(self._port, reason=answer.reason, cancel=cancel):
                    took = took or type(event) is QueueClaimed
        except LeaseLostError as exc:
            self._lose(exc)
            with self._lock:  # records nothing: the session is another owner's now
                self._stop_working(self._core.failed(self._journal.session, exc))
        except BaseException as exc:
            logger.exception("the run of session %r failed", self._stream)
            with self._lock:
                self._failure = exc
                self._stop_working(self._core.failed(self._journal.session, exc), failing=True)

    def _stop_working(self, stop: Stop, failing: bool = False) -> None:
        """Append what the core's ``Stop`` records, then go idle (called with the lock held)."""
        try:
            if stop.record:
                self._append(list(stop.record))
        except Exception as exc:
            if not failing:
                raise
            if isinstance(exc, LeaseLostError):
                self._lose(exc)
            else:
                logger.exception("could not record the end of session %r's failed turn",
                                 self._stream)
        finally:
            self._worker = None
            self._cancel = None
            self._changed.notify_all()

    def _watch(self, interval: float) -> None:
        # The wake-up hook: a store with ``subscribe(stream, callback) -> unsubscribe`` (the
        # PostgreSQL store: LISTEN/NOTIFY, with its own slow poll as the backstop) calls back
        # when the stream may have changed, and the watcher waits for that instead of polling.
        subscribe = getattr(self._store, "subscribe", None)
        unsubscribe = subscribe(self._stream, self._nudge.set) if callable(subscribe) else None
        try:
            while True:
                if unsubscribe is None:
                    if self._halt.wait(interval):
                        return
                else:
                    self._nudge.wait()
                    self._nudge.clear()
                    if self._halt.is_set():
                        return
                if getattr(self._lease, "lost", False) is True:  # a renewal found it taken
                    self._lose(LeaseLostError(
                        f"stream {self._stream!r}: this owner's lease was taken over by another "
                        f"owner", stream=self._stream, epoch=getattr(self._lease, "epoch", 0)))
                    return
                try:
                    if self._store.version(self._stream) != self._journal.session.version:
                        with self._lock:
                            self._journal.catch_up()
                except Exception:
                    logger.exception("watching session %r failed; retrying", self._stream)
        finally:
            if unsubscribe is not None:
                unsubscribe()
