"""Owner: the actor that holds one session, its inbox value and its log, and decides when to wake.

A host embeds one owner per session. People and other agents call ``steer``, ``inject``,
``followup`` or ``prompt`` from any thread (or asyncio task: the calls never wait for a run). The
owner appends each send to its store, folds it into the session value and, when the send asks to
wake, asks the inbox ``worth_waking()`` (a waking message worth a model round is queued; a blank
one never is, ruling 4): if no run is going, it starts one on a worker thread. When a run ends it
asks again, so a steer that landed after the run's last claim still gets its run. It never starts
two runs at once. A send that does not ask to wake (an injection) never starts a run, even when
an older waking entry is still queued after a cancel (ruling 9).

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

Concurrent sends to a store that blocks (every store but ``memory:``) share transactions: a
group commit (:mod:`nous_inbox.owner.group_commit`); each returns once its own transaction committed.

A lease taken over is final. When a store whose leases expire (PostgreSQL) finds this owner's
lease was taken over by another owner, it fences every append with
:class:`~nous_inbox.errors.LeaseLostError` and writes nothing. The owner then stops for good: the
run stops at its next append (recording nothing: the session is someone else's now), nothing
starts any more, the watcher stops, and ``lost`` holds the error, which ``wait_idle()`` and every
later send raise. Close it and open a new owner if this host should run the session again.

Other processes. Appends are made with the stream's expected version. When another process (the
``nous-inbox steer`` command, say) has appended in between, the store refuses, the owner reads
what it missed, folds it in, and tries again; a watcher thread polls the store's cheap version
number so an idle owner wakes for such a send too (a store that offers
``subscribe(stream, callback)``, as the PostgreSQL store does, wakes the watcher instead, and
polls only as a slow backstop). A running owner also checks the version at each claim, so a
steer from another terminal reaches the run at its next step boundary.

Results. ``prompt()`` and ``followup()`` return a :class:`~nous_inbox.owner.turn_result.TurnHandle`
on the turn that answers them: ``handle.sent`` is the stored send, ``handle.result(timeout=)``
the turn's :class:`~nous_inbox.owner.turn_ledger.TurnResult` (its last reply, typed output, usage,
seqs and end reason; a failed or cancelled turn raises). The answer is read from the log, so
``turn_handle(seq)`` and ``turn_result(turn)`` on a new owner give it after a restart.

Cancelling (ruling 9): ``cancel()``, from any thread, ends the current turn as ``"cancelled"`` at
its next boundary and wakes nothing; queued messages wait for the next prompt or waking send, and
one sent after the cancel starts the next run even while the cancelled one is still stopping (so
does one sent after a failed turn ended: see :mod:`nous_inbox.owner.core`). The
request is a ``CancelRequested`` in the log, so another process reaches the run the same way
(``request_cancel(store, stream)``, the ``nous-inbox cancel`` command): the watcher folds it in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, Literal, TypeVar, overload

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.message import Message
from nous_inbox.owner.body import Listener, OwnerBody
from nous_inbox.owner.core import Stop
from nous_inbox.owner.event_readers import EventReaders
from nous_inbox.owner.group_commit import GroupCommit, GroupCommitState, commit_in_threads
from nous_inbox.owner.handover import hand_over_thread
from nous_inbox.owner.idle_watch import subscription, taken_over, watch_step
from nous_inbox.owner.port import TurnRunner
from nous_inbox.owner.turn_ledger import TurnResult
from nous_inbox.owner.turn_result import TurnHandle, pump
from nous_inbox.receipts import Receipt
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.store import Store
from nous_inbox.store.journal import sent_event
from nous_inbox.store.snapshot import SNAPSHOT_EVERY
from nous_inbox.verbs import Target, Verb

__all__ = ["Owner"]

logger: Final = logging.getLogger("nous_inbox.owner")
_T = TypeVar("_T")


class Owner(OwnerBody[MessageSent, TurnHandle]):
    """Holds one session (``stream`` in ``store``) and runs ``runner`` whenever it should wake.

    ``listen`` is a first listener (see :meth:`listen`), told of the resume too; ``watch`` starts
    the thread that notices other processes' sends (``poll_interval`` seconds apart); ``start``
    wakes right away if the replayed inbox wants it. ``snapshot_every`` is how many events pass
    between two snapshots of the session (0: none; see :mod:`nous_inbox.store.snapshot`). ``freeze_gc``
    (off by default) has the journal ``gc.freeze()`` a long session's history, so the
    collector's full passes stop walking it: a long-lived host with a history of hundreds of
    thousands of events gets shorter full collections. The price: ``gc.freeze`` is
    process-wide, and any object alive at a freeze that is later part of a reference cycle is
    never collected. The options are checked before the stream's lease is taken: a bad one is a
    ``TypeError`` or ``ValueError`` naming it, and nothing happened.

    >>> from nous_inbox.store import open_store
    >>> def model(transcript, tools):
    ...     return "ok"
    >>> Owner(open_store("memory:"), "s", model)
    Traceback (most recent call last):
    ...
    TypeError: Owner: runner must have run_turn(port, *, reason, cancel) (a nous_inbox.runner.Runner), got function
    >>> from nous_inbox.runner import Runner
    >>> Owner(open_store("memory:"), "s", Runner(model), poll_interval=0)
    Traceback (most recent call last):
    ...
    ValueError: Owner: poll_interval must be a positive number of seconds, got 0.0
    """

    _who = "Owner"
    _run_method = "run_turn"

    def __init__(
        self, store: Store, stream: str, runner: TurnRunner, *, listen: Listener | None = None,
        watch: bool = True, poll_interval: float = 0.05, start: bool = True,
        snapshot_every: int = SNAPSHOT_EVERY, freeze_gc: bool = False,
    ) -> None:
        super().__init__(store, stream, runner, watch=watch, poll_interval=poll_interval,
                         start=start, snapshot_every=snapshot_every, freeze_gc=freeze_gc)
        if listen is not None and not callable(listen):
            raise TypeError(f"Owner: listen must be callable or None, got {type(listen).__name__}")
        if listen is not None:
            self._listeners.append(listen)
        self._changed = threading.Condition(self._lock)
        self._run: threading.Thread | None = None
        self._cancel: threading.Event | None = None
        self._halt = threading.Event()  # closed or lost: the watcher stops
        self._nudge = threading.Event()  # the store says the stream may have changed (or close)
        self._group: GroupCommit[threading.Lock] | None = (
            GroupCommit() if getattr(store, "blocking", True) else None)
        self._queue_lock = threading.Lock()  # the group commit's; never held across I/O
        self._readers = EventReaders()  # the follow() readers
        self._lease = self._open_session()
        self._watcher: threading.Thread | None = None
        if watch:
            self._watcher = threading.Thread(target=self._watch, name=f"nous-inbox watch {stream}",
                                             daemon=True)
            self._watcher.start()
        if start:
            with self._lock:
                if self._core.wake(self.session):
                    self._start_run()

    # -- what a host reads ----------------------------------------------------------------------

    def events(self, after: int = 0) -> list[Event]:
        """The session's stored events with ``seq > after``, read back from the store."""
        return self._read(after)

    @property
    def group_commit(self) -> GroupCommitState | None:
        """The owner's group commit now: how many sends wait for the next transaction, whether
        one is under way (:class:`~nous_inbox.owner.group_commit.GroupCommitState`); ``None``
        over a store that does not block (``memory:``), where each send commits at once. A host
        watches it as its send backlog, and a test waits on it rather than sleep.

        >>> from nous_inbox.runner import Runner
        >>> from nous_inbox.store import open_store
        >>> with Owner(open_store("memory:"), "s", Runner(lambda transcript, tools: "ok")) as owner:
        ...     owner.group_commit is None
        True
        """
        if self._group is None:
            return None
        with self._queue_lock:
            return self._group.state()

    @overload
    def follow(self, after: int = 0, *, deltas: Literal[False] = False,
               timeout: float | None = None) -> Iterator[Event]: ...
    @overload
    def follow(self, after: int = 0, *, deltas: bool,
               timeout: float | None = None) -> Iterator[Event | TextDelta]: ...

    def follow(self, after: int = 0, *, deltas: bool = False,
               timeout: float | None = None) -> Iterator[Event | TextDelta]:
        """Every event with ``seq > after``, live: the stored ones, then each as it is
        recorded, until the owner closes; a thread's reader, as ``AsyncOwner.events`` is a
        loop's. A wait longer than ``timeout`` seconds for the next one raises
        ``TimeoutError``; closing the iterator stops listening. ``deltas=True`` adds the model's text as it streams
        (:class:`~nous_inbox.runner.deltas.TextDelta`, in order with the events, never stored);
        the unread deltas of a slow reader are joined, so it never slows the run.

        >>> from nous_inbox.runner import Runner; from nous_inbox.store import open_store
        >>> owner = Owner(open_store("memory:"), "demo", Runner(lambda transcript, tools: "ok"))
        >>> reader = owner.follow(timeout=5)
        >>> _ = owner.steer("go")
        >>> [type(next(reader)).__name__ for _ in range(2)]
        ['MessageSent', 'TurnStarted']
        >>> owner.close()
        """
        if type(deltas) is not bool:
            raise TypeError(f"follow: deltas must be a bool, got {type(deltas).__name__}")
        return self._readers.follow(after, self._read, self._check_open,
                                    self._outlet if deltas else None, timeout)

    # -- what a host says -----------------------------------------------------------------------

    def _send(self, message: Message | str, target: Target | str, wakeup: bool,
              prompt: bool = False, options: dict[str, Any] | None = None) -> MessageSent:
        self._check_open()
        if prompt:
            with self._lock:
                self._core.prompt()
        try:
            if options is not None or self._group is None or self._holds_lock():
                sent = self._sent_now(message, target, wakeup, options)
            else:
                event = sent_event(message, target, wakeup)
                sent = commit_in_threads(self._group, self._queue_lock, event,  # type: ignore[assignment]
                                         self._commit)
        except BaseException as exc:
            self._sent_failed(exc, prompt)
            raise
        if prompt:
            self._prompt_settled(sent.seq)
        return sent

    def _prompt_settled(self, seq: int | None, maybe_stored: bool = False) -> None:
        with self._lock:
            self._core.prompted(seq, maybe_stored=maybe_stored)

    def _turn_send(self, message: Message | str, verb: Verb,
                   options: dict[str, Any] | None) -> TurnHandle:
        return TurnHandle(self._send(message, verb.target, verb.wakeup, verb.own_turn, options),
                          self._result, self.delivered)

    def _refused(self, error: Exception) -> MessageSent:
        raise error  # at the call: the send returns the stored event, not an awaitable

    def _turn_refused(self, error: Exception) -> TurnHandle:
        raise error

    def turn_result(self, turn: int) -> TurnResult:
        """How ``turn`` ended, from this owner's ledger or else the log (a turn an earlier owner
        ran): a :class:`~nous_inbox.owner.turn_ledger.TurnResult`, or ``TurnFailed`` /
        ``TurnCancelled``; ``LookupError`` for a turn that has not ended."""
        with self._lock:
            return pump(self._answers.of_turn(turn), call=self._unlocked)

    def turn_handle(self, seq: int) -> TurnHandle:
        """A handle on the turn of the prompt or followup stored at ``seq`` (one this owner or
        an earlier one took: the log says which turn answered it); ``ValueError`` if ``seq``
        is not such a send."""
        return TurnHandle(pump(self._answers.sent(seq)), self._result, self.delivered)

    def _result(self, seq: int, timeout: float | None) -> TurnResult:
        """Wait for the turn of the send at ``seq`` (a handle's ``result``): the body's steps,
        waiting on the owner's condition between two looks."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def wait() -> None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"the turn of the send at seq {seq} of session "
                                   f"{self._stream!r} did not end within {timeout} s (the "
                                   f"turn goes on: wait again, or cancel() it)")
            self._changed.wait(left)

        with self._changed:
            return pump(self._answers.of_send(seq, self._unanswered), wait, self._unlocked)

    def _unlocked(self, read: Callable[[], _T]) -> _T:
        """``read()`` (the log, read whole) with the owner's lock released, so a long log holds
        up no send and no run; an answer that comes meanwhile moves the ledger, and the pump
        looks again."""
        self._lock.release()
        try:
            return read()
        finally:
            self._lock.acquire()

    # -- where sends went ----------------------------------------------------------------------

    def receipt(self, seq: int) -> Receipt:
        """Where the send stored at ``seq`` went: still queued, claimed (by which turn, for
        which step) or withdrawn (a :class:`~nous_inbox.receipts.Receipt`); ``LookupError`` or
        ``ValueError`` when ``seq`` is no send of this session."""
        receipts = self._answers.receipts
        with self._lock:
            found = receipts.now(self._opened().session, seq)
        return found or receipts.logged(seq)  # the log read without the lock

    def delivered(self, seq: int, timeout: float | None = None) -> Receipt:
        """Wait until the message the send at ``seq`` queued is claimed or withdrawn, and say
        where it went (:meth:`receipt`); ``TimeoutError`` after ``timeout`` seconds while it is
        still queued (it stays queued: wait again, or :meth:`withdraw` it).

        >>> from nous_inbox.runner import Runner
        >>> from nous_inbox.store import open_store
        >>> with Owner(open_store("memory:"), "s", Runner(lambda transcript, tools: "ok")) as owner:
        ...     print(owner.delivered(owner.steer("go").seq, timeout=5))
        the message sent at seq 1 was claimed by turn 1 for step 1 (event #3)
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        receipts = self._answers.receipts
        with self._changed:
            receipts.watch(seq)
            try:
                while ((found := receipts.now(self._opened().session, seq)) is not None
                       and not found.settled):
                    self._raise_if_lost()
                    if self._closed:
                        raise RuntimeError(f"Owner of session {self._stream!r} closed while the "
                                           f"message sent at seq {seq} was still queued")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"the message sent at seq {seq} of session "
                                           f"{self._stream!r} was still queued after {timeout} s "
                                           f"(wait again, or withdraw it)")
                    self._changed.wait(left)
            finally:
                receipts.unwatch(seq)
        return found or receipts.logged(seq)  # settled before it was watched: the log says

    def withdraw(self, seq: int) -> Receipt:
        """Take back the message the send at ``seq`` queued, if no claim took it yet: a
        ``MessageWithdrawn`` is recorded and the receipt says ``"withdrawn"``. A message
        already claimed answers which turn and step took it; one withdrawn already says so.

        >>> from nous_inbox.runner import Runner
        >>> from nous_inbox.store import open_store
        >>> with Owner(open_store("memory:"), "s", Runner(lambda transcript, tools: "ok")) as owner:
        ...     print(owner.withdraw(owner.inject("never mind").seq))
        the message sent at seq 1 was withdrawn (event #2)
        """
        receipts = self._answers.receipts
        with self._lock:
            journal = self._check_open()
            try:
                found = receipts.withdraw(journal, seq)
            except LeaseLostError as exc:
                self._lose(exc)
                raise
        return found or receipts.logged(seq)  # the log read without the lock

    def cancel(self) -> bool:
        """End the current turn at its next boundary, as ``"cancelled"``; wake nothing after it.

        Returns whether a run was going. Queued messages stay queued. Call it from any thread;
        the request is recorded in the log when a turn is open (see
        :func:`~nous_inbox.owner.port.request_cancel`, which reaches an owner in another process).
        """
        with self._lock:
            if not self._closed:
                self._record_cancel()
            return self._cancel_now()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no run is going; ``False`` if ``timeout`` seconds passed first.

        Re-raises (once) an exception that ended the last run, such as a failing model; raises
        ``lost`` (every time, at once) when the owner's lease was taken over. ``lost`` wins: a
        failure of the last run is then dropped (it was logged when the run ended).
        """
        with self._changed:
            idle = self._changed.wait_for(
                lambda: self._run is None or self._core.lost is not None, timeout)
        return self._waited(idle)

    def close(self, timeout: float | None = 10.0, *, hand_over: bool = False) -> None:
        """Cancel any run, stop the watcher, wait for both, and give up the stream's lease.

        The store stays open (it is yours). A run that does not stop within ``timeout`` seconds
        keeps the lease until it ends, so no other owner runs beside it. ``hand_over``: let
        another holder carry the run on from its next boundary (:mod:`nous_inbox.owner.handover`);
        each of its waits is bounded by ``timeout``, so a run that outlives its cut-off holds
        ``close`` about three times that."""
        self._closed = True
        self._halt.set()
        self._nudge.set()
        port = self._port if hand_over and self._core.lost is None else None
        with self._lock:
            if port is not None:  # no boundary is passed from now on
                port.handover.asked = self._core.hand_over()
            elif self._core.close():
                self._cancel_turn()
            worker = self._run
            self._changed.notify_all()  # a handle waiting for a turn that will not come
        if port is not None:
            hand_over_thread(worker, port.handover, timeout, self._cancel_turn, self._commit)
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout)
        if worker is None or not worker.is_alive():
            self._lease.release()
        else:
            logger.warning("the run of session %r did not stop within %s s; keeping its lease "
                           "until it does", self._stream, timeout)
        self._readers.end()  # after the run's last events: every follow() reader ends

    def __enter__(self) -> Owner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pump -------------------------------------------------------------------------------

    def _deliver(self, events: Any) -> None:
        self._readers.tell(events)
        self._tell(events)
        self._changed.notify_all()

    def _halted(self) -> None:
        with self._lock:
            self._changed.notify_all()
        self._readers.end()
        self._halt.set()
        self._nudge.set()

    def _start_run(self) -> None:
        """The core said start (called with the lock held). The first turn's cancel exists as
        soon as the run does, so a cancel() right after the waking send is honoured."""
        self._cancel = threading.Event()
        self._run = threading.Thread(target=self._work, name=f"nous-inbox run {self._stream}",
                                     daemon=True)
        self._run.start()

    def _work(self) -> None:
        took: bool | None = None  # whether the last turn claimed anything; None before the first
        try:
            while True:
                with self._lock:
                    # Deciding to stop and saying so (run = None) happen under one lock hold,
                    # so a send that lands meanwhile either is seen here or starts a new run.
                    answer = self._core.next_turn(self.session, took)
                    if isinstance(answer, Stop):
                        self._stop_working(answer)
                        return
                    if took is not None:
                        self._cancel = threading.Event()
                    cancel = self._cancel
                took = False
                for event in self._runner.run_turn(self._port, reason=answer.reason, cancel=cancel):
                    took = took or type(event) is QueueClaimed
        except BaseException as exc:
            with self._lock:
                self._stop_working(self._run_failed(exc))

    def _stop_working(self, stop: Stop) -> None:
        """Append what the core's ``Stop`` records, then go idle, or start the next run when a
        waking send arrived while this one was stopping (called with the lock held, so no send
        falls between the two). The record's append may fold another process's send that
        starts the next run itself: this run then leaves that one's thread and cancel alone."""
        try:
            self._record_stop(stop)
        finally:
            if self._run is threading.current_thread():
                self._run = None
                self._cancel = None
                if self._closed:  # a close that gave up waiting for this run kept the lease
                    self._lease.release()
            if stop.again and self._core.wake(self.session):
                self._start_run()
            self._changed.notify_all()

    def _watch(self) -> None:
        """The watcher thread: poll every ``poll_interval``, or wait for the store's hints when
        it gives them, and take the watcher's step (:func:`~nous_inbox.owner.idle_watch.watch_step`)
        each time, until the owner closes or its lease is lost."""
        unsubscribe = subscription(self._store, self._stream, self._nudge.set)
        try:
            while True:
                if unsubscribe is None:
                    if self._halt.wait(self._poll_interval):
                        return
                else:
                    self._nudge.wait()
                    self._nudge.clear()
                    if self._halt.is_set():
                        return
                if not watch_step(self._stream, lambda: taken_over(self._lease, self._stream),
                                  self._lose, self._catch_up):
                    return
        finally:
            if unsubscribe is not None:
                unsubscribe()
