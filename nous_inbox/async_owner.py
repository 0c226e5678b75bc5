"""AsyncOwner: the owner for hosts that live on an event loop, driven on that loop.

The same actor as :class:`~nous_inbox.owner.Owner`, with the same rules (append before acting,
one run at a time, wake on a waking send and again at run end, cancel wakes nothing, resume from
the log, a lost lease ends the owner), spoken in ``await``. The rules live once, in
:class:`~nous_inbox.owner_core.OwnerCore`; the threaded owner pumps it from its threads under a
lock, this one pumps it from the event loop. Only the two ends differ: the turns run as an
asyncio task through the runner's ``arun_turn`` (an async model, async tools and a pydantic-ai
agent stay on the loop they were built for), and the store is called where its calls belong.

>>> import asyncio
>>> from nous_inbox.message import Message
>>> from nous_inbox.runner import Runner
>>> from nous_inbox.store import open_store
>>> async def model(transcript, tools):
...     return Message.assistant(f"heard: {transcript[-1].content}")
>>> async def main():
...     async with AsyncOwner(open_store("memory:"), "demo", Runner(model)) as owner:
...         sent = await owner.steer("summarize")
...         await owner.wait_idle()
...         return sent.seq, [m.content for m in owner.transcript]
>>> asyncio.run(main())
(1, ['summarize', 'heard: summarize'])

Where the store is called. A store says whether its calls block (``store.blocking``: a disk, a
lock, a network; only ``memory:`` says no). A non-blocking store is called inline on the loop:
a send is one append and a fold, with no thread hop. A blocking store is called from one worker
thread of the owner's own, never from the loop: sends, the run's claims and records, the reads
of ``events()`` and the watcher's polls queue there in order. Sends that arrive while the worker
is busy are committed together in one append (a group commit), and each sender resumes once its
transaction committed. The runner reaches the worker through its port's ``call_io``: the
built-in :class:`~nous_inbox.runner.Runner` and the pydantic-ai
:class:`~nous_inbox.compat.pydantic_ai.AgentRunner` both use it, so store I/O never runs on the
event loop. The journal is still guarded by a lock (a runner that ignores ``call_io`` and calls
the port from a thread of its own stays correct, only slower).

What the loop does. Every batch of events folded into the session, the owner's own and those
another process appended, is handed to the loop in log order; there the owner tells its
``events()`` readers and ``listen`` callbacks, and asks the core whether to wake. Every decision
is taken on the loop, so the decisions need no lock. A send from another process reaches an
``AsyncOwner`` as it reaches an ``Owner``: a watcher task polls the store's version (or waits for
the store's ``subscribe`` callback, as on PostgreSQL) and catches up.

``events(after=seq)`` is every event of the session from a position on, live: the stored ones
first, then each as it is recorded, with no gap and no repeat between the two. A web client that
reconnects resumes by its last seen ``seq``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final, Protocol, TypeVar

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Inbox, Target, as_message
from nous_inbox.journal import Journal
from nous_inbox.message import Message
from nous_inbox.owner_core import OwnerCore, Stop
from nous_inbox.port import JournalPort, commit_batch, one_senders, refused_unwritten, sent_event
from nous_inbox.session import Session
from nous_inbox.snapshot import SNAPSHOT_EVERY, check_snapshot_every
from nous_inbox.store import Store
from nous_inbox.store.base import check_stream
from nous_inbox.store.lease import OwnerLease

__all__ = ["AsyncOwner", "AsyncTurnRunner"]

logger: Final = logging.getLogger("nous_inbox.async_owner")

_T = TypeVar("_T")
_thread_id: Final = threading.get_ident
_STEP: Final = Target.NEXT_STEP
_TURN: Final = Target.NEXT_TURN

Listener = Callable[[Event], None]


class AsyncTurnRunner(Protocol):
    """What an ``AsyncOwner`` needs from a runner: one turn on a port, as an async stream."""

    def arun_turn(
        self, port: Any, *, reason: str = ..., cancel: asyncio.Event | None = ...
    ) -> AsyncIterator[Event]:
        """Run one turn; see ``nous_inbox.runner.Runner.arun_turn``."""


class _LoopPort(JournalPort):
    """The port an AsyncOwner's runs use: the journal under the owner's lock, and ``call_io``,
    how a runner reaches the owner's store worker (``None``: the store does not block, call the
    port inline)."""

    __slots__ = ("call_io",)

    def __init__(
        self, journal: Journal, lock: threading.RLock,
        call_io: Callable[..., asyncio.Future[Any]] | None,
    ) -> None:
        super().__init__(journal, lock)
        self.call_io = call_io


class AsyncOwner:
    """Holds one session (``stream`` in ``store``) and runs ``runner`` on the event loop whenever
    it should wake; use it as ``async with AsyncOwner(store, stream, runner) as owner``.

    ``runner`` is anything with ``arun_turn(port, *, reason, cancel)``: a
    :class:`~nous_inbox.runner.Runner`, or a pydantic-ai
    :class:`~nous_inbox.compat.pydantic_ai.AgentRunner`. ``watch`` starts the task that notices
    other processes' sends, polling every ``poll_interval`` seconds (or waiting for the store's
    ``subscribe`` callback). ``offload`` says whether store calls go to the owner's worker
    thread; by default they do when the store says its calls block (``store.blocking``, true of
    every store but ``memory:``). ``start`` wakes right away, on opening, if the replayed inbox
    wants it (a waking message left queued by a previous process). ``snapshot_every`` and
    ``freeze_gc`` are the threaded owner's (see :class:`~nous_inbox.owner.Owner`; with
    ``freeze_gc``, the default, an asyncio task or future caught in a reference cycle at a
    freeze is never collected). On a store called inline (``memory:``) a snapshot is encoded
    on the event loop, and it only serves a reopen in the same process, so a host with a long
    ``memory:`` session may pass ``snapshot_every=0``.

    Options are checked here, before anything is opened: a bad one names itself.

    >>> from nous_inbox.store import open_store
    >>> AsyncOwner(open_store("memory:"), "s", object())
    Traceback (most recent call last):
    ...
    TypeError: AsyncOwner needs a runner with arun_turn(port, *, reason, cancel); object has none
    """

    def __init__(
        self,
        store: Store,
        stream: str,
        runner: AsyncTurnRunner,
        *,
        watch: bool = True,
        poll_interval: float = 0.05,
        offload: bool | None = None,
        start: bool = True,
        snapshot_every: int = SNAPSHOT_EVERY,
        freeze_gc: bool = True,
    ) -> None:
        if not callable(getattr(runner, "arun_turn", None)):
            raise TypeError(
                f"AsyncOwner needs a runner with arun_turn(port, *, reason, cancel); "
                f"{type(runner).__name__} has none"
            )
        check_stream(stream)
        for name, value in (("watch", watch), ("start", start), ("freeze_gc", freeze_gc)):
            if type(value) is not bool:
                raise TypeError(f"AsyncOwner: {name} must be a bool, got {type(value).__name__}")
        if offload is not None and type(offload) is not bool:
            raise TypeError(f"AsyncOwner: offload must be a bool or None, got {type(offload).__name__}")
        if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)):
            raise TypeError(f"AsyncOwner: poll_interval must be a number of seconds, "
                            f"got {type(poll_interval).__name__}")
        if not 0 < poll_interval < float("inf"):
            raise ValueError(f"AsyncOwner: poll_interval must be a positive number of seconds, "
                             f"got {poll_interval!r}")
        check_snapshot_every(snapshot_every, "AsyncOwner")
        self._store = store
        self._stream = stream
        self._runner = runner
        self._snapshot_every = snapshot_every
        self._freeze_gc = freeze_gc
        self._watch_others = watch
        self._poll_interval = float(poll_interval)
        self._start = start
        self._blocking = bool(getattr(store, "blocking", True)) if offload is None else offload
        self._lock = threading.RLock()  # guards the journal, wherever it is called from
        self._core = OwnerCore()  # every decision; called on the loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._io: concurrent.futures.ThreadPoolExecutor | None = None
        self._lease: OwnerLease | None = None
        self._journal: Journal | None = None
        self._port: _LoopPort | None = None
        self._opened = False
        self._closed = False
        # The run: its task, the current turn's cancel, "no run" as an event, how the last ended.
        self._run: asyncio.Task[None] | None = None
        self._cancel: asyncio.Event | None = None
        self._settled = asyncio.Event()  # no run going, or the lease was lost: wait_idle returns
        self._settled.set()
        self._failure: BaseException | None = None
        # Folded batches on their way to the loop, in log order (appended under the journal lock).
        self._batches: collections.deque[Sequence[Event]] = collections.deque()
        self._batches_lock = threading.Lock()
        self._react_scheduled = False
        self._reacting = False
        self._readers: set[asyncio.Queue[Event | None]] = set()
        self._listeners: list[Listener] = []
        # Sends waiting for the worker's next group commit.
        self._sends: list[tuple[MessageSent, asyncio.Future[MessageSent]]] = []
        self._sends_lock = threading.Lock()
        self._flushing = False
        self._watcher: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        # The teardown, one task for every aclose: a cancelled aclose leaves it running.
        self._closing: asyncio.Task[None] | None = None

    # -- opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> AsyncOwner:
        if self._opened:
            raise RuntimeError(f"AsyncOwner of session {self._stream!r} was already opened")
        self._opened = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if self._blocking:
            self._io = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"nous-inbox io {self._stream}"
            )
        try:
            # The lease, the replay and the resume: store I/O, so on the worker.
            await self._call(self._open)
        except BaseException:
            self._closed = True
            if self._io is not None:
                # Cancelled while ``_open`` runs on: it still takes the lease. The one worker
                # runs this after it, so whatever it took is given back.
                self._io.submit(self._give_back)
                self._io.shutdown(wait=False)
            raise
        if self._watch_others:
            self._watcher = self._loop.create_task(self._watch(), name=f"nous-inbox watch {self._stream}")
        if self._start:
            self._react()  # what the resume recorded, before the first decision
            if self._core.wake(self.session):
                self._start_run()
        return self

    def _open(self) -> None:
        # One owner per stream, across processes: without the lease, a second owner would end
        # the first one's open turn as "interrupted" and run beside it.
        lease = self._store.own(self._stream)
        try:
            with self._lock:
                self._journal = Journal(self._store, self._stream, on_events=self._folded,
                                        snapshot_every=self._snapshot_every,
                                        freeze_gc=self._freeze_gc)
                call_io = self._call_io if self._io is not None else None
                self._port = _LoopPort(self._journal, self._lock, call_io)
                resumed = OwnerCore.resume(self._journal.session)
                if resumed:
                    self._journal.commit(lambda session: (resumed, None))
        except BaseException:
            lease.release()
            raise
        self._lease = lease

    def _give_back(self) -> None:
        """Drop the store subscription and give the lease back (on the worker, after every job
        queued before it: a subscribe or an open a cancel left running ends first)."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        lease, self._lease = self._lease, None
        try:
            if unsubscribe is not None:
                unsubscribe()
        finally:
            if lease is not None:
                lease.release()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, timeout: float | None = 10.0) -> None:
        """Cancel any run, wait for it to end, stop watching, give up the stream's lease.

        A run that has not ended ``timeout`` seconds after its cancel (a model request that
        ignores it) has its task cancelled; if even that does not end it, a warning is logged and
        the lease is kept until the run does end, so no other owner can start a run beside it.
        The store stays open (it is yours). Every ``events()`` reader ends.

        Called from inside the run (a tool, the runner), it does not wait for that run, which
        cannot end while it waits: the lease goes back when the run ends.

        The teardown runs as one task of its own: cancelling ``aclose`` (a second Ctrl-C, an
        ``asyncio.timeout`` around ``async with``) stops the wait, not the teardown, so the
        lease, the worker thread and the watcher are still released. A second call waits for
        that same teardown, except from the run or the watcher, which that teardown waits for.
        """
        if not self._opened:
            return
        if self._closing is not None and asyncio.current_task() in (self._run, self._watcher):
            return  # the teardown under way waits for this very task: waiting for it would stall
        if self._closing is None:
            if self._closed:
                return  # the open failed and cleaned up after itself
            self._closed = True
            loop = asyncio.get_running_loop()
            self._closing = loop.create_task(self._close(timeout, asyncio.current_task()),
                                             name=f"nous-inbox close {self._stream}")
        await asyncio.shield(self._closing)

    async def _close(self, timeout: float | None, caller: asyncio.Task[Any] | None) -> None:
        # ``caller``: the task that asked to close. When it is the run or the watcher itself,
        # waiting for it here would wait for ourselves.
        if self._core.close() and self._cancel is not None:
            self._cancel.set()
        run = self._run
        try:
            if run is not None and run is not caller:
                await asyncio.wait((run,), timeout=timeout)
                if not run.done():
                    run.cancel()
                    await asyncio.wait((run,), timeout=timeout)
            if self._watcher is not None and self._watcher is not caller:
                self._watcher.cancel()
                await asyncio.wait((self._watcher,))
        finally:
            lasting = run is not None and not run.done()
            try:
                # Shielded: a cancel of this task itself (``asyncio.run`` cancelling every task
                # after a Ctrl-C) would cancel the job before the worker took it up.
                if not lasting:
                    # On the worker it runs after a subscribe still going.
                    await asyncio.shield(self._call_soon(self._give_back))
                else:
                    if run is not caller:
                        logger.warning("the run of session %r did not stop; keeping its lease "
                                       "until it ends", self._stream)
                    await asyncio.shield(self._call_soon(self._drop_subscription))
            finally:
                self._react()  # the last batches reach the readers before they end
                for reader in self._readers:
                    reader.put_nowait(None)
                if lasting:
                    assert run is not None
                    # The worker stays up for the give-back: a lease released on a plain thread
                    # or the loop would block it on store I/O, and nothing else would release it.
                    run.add_done_callback(self._give_back_after_run)
                elif self._io is not None:
                    self._io.shutdown(wait=False)

    def _give_back_after_run(self, run: asyncio.Task[None]) -> None:
        """The run a teardown could not wait for (the caller itself, or a stubborn one) ended:
        its lease goes back now, then the worker stops."""
        if self._io is None:
            try:
                self._give_back()
            except Exception:
                logger.exception("could not give back the lease of session %r", self._stream)
            return
        done = self._io.submit(self._give_back)
        self._io.shutdown(wait=False)
        done.add_done_callback(self._log_failed_give_back)

    def _log_failed_give_back(self, done: concurrent.futures.Future[None]) -> None:
        if not done.cancelled() and (exc := done.exception()) is not None:
            logger.error("could not give back the lease of session %r", self._stream,
                         exc_info=exc)

    # -- what a host reads ------------------------------------------------------------------------

    @property
    def stream(self) -> str:
        """The session's stream name in the store."""
        return self._stream

    @property
    def session(self) -> Session:
        """The session value as folded so far: equal to ``replay`` of the stored events."""
        return self._open_journal().session

    @property
    def inbox(self) -> Inbox:
        """The inbox value now."""
        return self.session.inbox

    @property
    def transcript(self) -> list[Message]:
        """The transcript now, as a list."""
        return list(self.session.transcript)

    @property
    def running(self) -> bool:
        """Whether a run is going (from the send that woke it until its end is recorded)."""
        return self._run is not None

    @property
    def closed(self) -> bool:
        """Whether the owner was closed (``aclose``, or a lost lease): it refuses sends."""
        return self._closed or self._core.lost is not None

    @property
    def lost(self) -> LeaseLostError | None:
        """The ``LeaseLostError`` that ended this owner (another owner took the stream over), or
        ``None``. A lost owner runs nothing more, and its sends and waits raise this error."""
        return self._core.lost

    async def events(self, after: int = 0) -> AsyncIterator[Event]:
        """Every event with ``seq > after``: the stored ones, then each as it is recorded, until
        the owner closes. Resume a stream by passing the last ``seq`` you saw.

        >>> import asyncio
        >>> from nous_inbox.store import open_store
        >>> from nous_inbox.runner import Runner
        >>> async def main():
        ...     async with AsyncOwner(open_store("memory:"), "s", Runner(lambda t, tools: "ok")) as owner:
        ...         for text in ("a", "b", "c"):
        ...             await owner.inject(text)
        ...         reader = owner.events(after=1)          # a client that saw #1 reconnects
        ...         return [(await anext(reader)).seq, (await anext(reader)).seq]
        >>> asyncio.run(main())
        [2, 3]

        The reader listens before it reads the store, so an event recorded meanwhile is in one
        or both (the repeat is dropped by ``seq``); a reader that falls behind has its events
        queued for it, in order. Closing the iterator (``aclose``, ``break``) stops listening.
        """
        if type(after) is not int:
            raise TypeError(f"events: after must be an int seq, got {type(after).__name__}")
        self._check_open()
        live: asyncio.Queue[Event | None] = asyncio.Queue()
        self._readers.add(live)
        try:
            last = after
            for event in await self._call(self._read, after):
                last = event.seq
                yield event
            while (got := await live.get()) is not None:
                event = got
                if event.seq <= last:
                    continue  # read from the store already
                if event.seq > last + 1:  # never expected: fill the gap from the log itself
                    for missed in await self._call(self._read, last):
                        if missed.seq >= event.seq:
                            break
                        last = missed.seq
                        yield missed
                last = event.seq
                yield event
        finally:
            self._readers.discard(live)

    def _read(self, after: int) -> list[Event]:
        return list(self._store.read(self._stream, after))

    def listen(self, callback: Listener) -> None:
        """Call ``callback(event)`` on the event loop for every event recorded from now on, in
        order (the owner's own and those another process appended). Keep it quick; one that
        raises is logged and does not stop the others or the run. A callback cannot await, so
        one that sends schedules it: ``asyncio.ensure_future(owner.steer(...))`` (keep the
        task, and await or check it, to hear of a failure)."""
        self._listeners.append(callback)

    # -- what a host says -------------------------------------------------------------------------
    # The five verbs (send, steer, inject, followup, prompt) each end in the same inline-or-queued
    # branch, written out rather than shared (see send): a change to one must be made to all five.

    async def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` durably, then wake if it asks to and nothing runs.

        Bad input raises here, before anything is written. Returns the event as stored, once
        it is: a run it wakes has started by then. Cancelling the awaiting task (a timeout)
        takes the send back if the worker has not taken it up yet, so a caller that retries
        does not send it twice; one the worker took up is committed (it may be already).
        """
        # Bad input is refused on the caller's own line. Parts already checked (a built
        # Message, a Target, a bool) need no second look.
        if type(message) is not Message or type(target) is not Target or type(wakeup) is not bool:
            event = sent_event(message, target, wakeup)
            message, target, wakeup = event.message, event.target, event.wakeup
        # Each verb stores inline itself rather than awaiting a shared coroutine: on a store
        # that does not block, a send completes within the caller's one coroutine.
        if self._io is None:
            return self._store_now(message, target, wakeup)
        return await self._store_queued(MessageSent(target=target, wakeup=wakeup, message=message))

    async def steer(self, message: Message | str) -> MessageSent:
        """Next step, wakes: "read this before your next model request"."""
        if type(message) is not Message:
            message = as_message(message)
        if self._io is None:
            return self._store_now(message, _STEP, True)
        return await self._store_queued(MessageSent(target=_STEP, wakeup=True, message=message))

    async def inject(self, message: Message | str) -> MessageSent:
        """Next step, no wake: "have this to hand if you make another request"."""
        if type(message) is not Message:
            message = as_message(message)
        if self._io is None:
            return self._store_now(message, _STEP, False)
        return await self._store_queued(MessageSent(target=_STEP, wakeup=False, message=message))

    async def followup(self, message: Message | str) -> MessageSent:
        """Next turn, wakes: "answer this after you finish what you are doing"."""
        if type(message) is not Message:
            message = as_message(message)
        if self._io is None:
            return self._store_now(message, _TURN, True)
        return await self._store_queued(MessageSent(target=_TURN, wakeup=True, message=message))

    async def prompt(self, text: Message | str) -> MessageSent:
        """A person's prompt: a turn of its own (recorded as ``"prompt"``), after any in progress."""
        message = as_message(text)
        self._core.prompt()  # before the send: the run it wakes starts before it returns
        # Undone only when the prompt cannot be in the log: one that may be (a cancel after the
        # worker took it, a commit whose outcome is unknown) still opens its turn as a prompt.
        if self._io is None:
            return self._store_now(message, _TURN, True, self._core.unprompt)
        return await self._store_queued(MessageSent(target=_TURN, wakeup=True, message=message),
                                        self._core.unprompt)

    def _store_now(self, message: Message, target: Target, wakeup: bool,
                   unwritten: Callable[[], None] | None = None) -> MessageSent:
        """Store the send of these checked parts inline (a store that does not block; see
        :meth:`send`), the wake decided as it folds in: the journal builds the event once,
        numbered. ``unwritten`` is called when it fails and nothing can have been stored:
        refused before the store, or by it (a lost lease wrote nothing, either)."""
        journal = self._journal
        if journal is None or self._closed or self._core.lost is not None:
            try:
                journal = self._check_open()  # raises, saying why
            except BaseException:
                if unwritten is not None:
                    unwritten()
                raise
        try:
            with self._lock:
                return journal.send(message, target, wakeup)
        except BaseException as exc:
            if isinstance(exc, LeaseLostError):
                self._lease_lost(exc)
            if unwritten is not None and refused_unwritten(exc):
                unwritten()
            raise

    async def _store_queued(self, event: MessageSent,
                            unwritten: Callable[[], None] | None = None) -> MessageSent:
        """Store ``event`` in the worker's next group commit (a store that blocks); see
        :meth:`send`. ``unwritten`` as for :meth:`_store_now`, or when the send was taken back."""
        try:
            self._check_open()
        except BaseException:
            if unwritten is not None:
                unwritten()
            raise
        assert self._loop is not None and self._io is not None
        future: asyncio.Future[MessageSent] = self._loop.create_future()
        with self._sends_lock:
            self._sends.append((event, future))
            lead, self._flushing = not self._flushing, True
        if lead:
            self._io.submit(self._flush)
        try:
            return await future
        except asyncio.CancelledError:
            # ``_flush`` takes the whole list under this lock: still here means not taken.
            # Taken means it is committed, or may be: not unwritten.
            taken_back = False
            with self._sends_lock, contextlib.suppress(ValueError):
                self._sends.remove((event, future))
                taken_back = True
            if taken_back and unwritten is not None:
                unwritten()
            raise
        except BaseException as exc:
            if unwritten is not None and refused_unwritten(exc):
                unwritten()
            raise

    def cancel(self) -> bool:
        """End the current turn at its next boundary, as ``"cancelled"``; wake nothing after it.

        Returns whether a run was going. Queued messages stay queued; a waking send that lands
        while the cancelled run winds down starts nothing either. Call it on the owner's loop.
        """
        if not self._core.cancel():
            return False
        if self._cancel is not None:
            self._cancel.set()
        return True

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no run is going; ``False`` if ``timeout`` seconds passed first.

        Re-raises (once) an exception that ended the last run, such as a failing model; raises
        ``lost`` (every time, at once, without waiting for the run) when another owner took the
        stream over.
        """
        if timeout is None:
            await self._settled.wait()
        else:
            try:
                await asyncio.wait_for(self._settled.wait(), timeout)
            except TimeoutError:
                return False
        self._raise_if_lost()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        return True

    def __repr__(self) -> str:
        if not self._opened:
            state = "not open"
        elif self.closed:
            state = "closed"
        else:
            state = f"version {self.session.version}"
        return f"AsyncOwner({self._stream!r}, {state})"

    # -- the store's side -------------------------------------------------------------------------

    def _open_journal(self) -> Journal:
        if self._journal is None:
            raise RuntimeError(
                f"AsyncOwner of session {self._stream!r} is not open: "
                "use `async with AsyncOwner(...)`"
            )
        return self._journal

    def _check_open(self) -> Journal:
        """The journal, if the owner is open; else the error saying why it is not."""
        journal = self._open_journal()
        self._raise_if_lost()
        if self._closed:
            raise RuntimeError(f"AsyncOwner of session {self._stream!r} is closed")
        return journal

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` where store calls belong: inline, or on the worker."""
        if self._io is None:
            return fn(*args)
        return await self._call_io(fn, *args)

    def _call_soon(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        """``fn()`` where store calls belong, as a future (done already when inline)."""
        if self._io is not None:
            return self._call_io(fn)
        assert self._loop is not None
        done: asyncio.Future[_T] = self._loop.create_future()
        try:
            done.set_result(fn())
        except Exception as exc:
            done.set_exception(exc)
        return done

    def _drop_subscription(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def _subscribe(self, subscribe: Callable[..., Callable[[], None]], poke: Callable[[], None]) -> None:
        # Kept by the job itself: a watcher cancelled meanwhile (aclose) would drop it, and
        # aclose's unsubscribe, queued on the worker after this job, finds it here.
        self._unsubscribe = subscribe(self._stream, poke)

    def _call_io(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        assert self._loop is not None and self._io is not None
        return self._loop.run_in_executor(self._io, fn, *args)

    def _commit(self, events: Sequence[Event]) -> list[Event]:
        with self._lock:
            return self._open_journal().append(events)

    def _commit_now(self, events: Sequence[Event]) -> list[Event]:
        """Commit inline (a store that does not block): a lost lease is taken in at once."""
        try:
            return self._commit(events)
        except LeaseLostError as exc:
            self._lease_lost(exc)
            raise

    def _append_soon(self, events: Sequence[Event]) -> asyncio.Future[list[Event]]:
        """Append ``events`` now, or queue them on the worker now (so they precede whatever is
        queued later, such as the next run's first record); await the result."""
        if self._io is not None:
            return self._call_io(self._commit, events)
        assert self._loop is not None
        done: asyncio.Future[list[Event]] = self._loop.create_future()
        try:
            done.set_result(self._commit_now(events))
        except Exception as exc:
            done.set_exception(exc)
        return done

    def _flush(self) -> None:
        """The worker's group commit: every send queued so far, in one append, settled by the
        threaded port's rule (:func:`~nous_inbox.port.commit_batch`)."""
        with self._sends_lock:
            batch, self._sends = self._sends, []
            self._flushing = False
        if not batch:
            return  # every sender it was queued for took its send back
        outcomes: list[tuple[asyncio.Future[MessageSent], Event | None, BaseException | None]]
        try:
            with self._lock:
                settled = commit_batch(self._open_journal(), [event for event, _ in batch])
            outcomes = [(future, stored, error)
                        for (_, future), (stored, error) in zip(batch, settled, strict=True)]
        except BaseException as exc:  # not a store's failure: its senders hear it, it goes on
            outcomes = [(future, None, exc) for _, future in batch]
            self._hand_back(outcomes)
            raise
        self._hand_back(outcomes)

    def _hand_back(
        self, outcomes: list[tuple[asyncio.Future[MessageSent], Event | None, BaseException | None]]
    ) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self._loop.call_soon_threadsafe(self._settle, outcomes)

    def _settle(
        self, outcomes: list[tuple[asyncio.Future[MessageSent], Event | None, BaseException | None]]
    ) -> None:
        self._react()  # a run a send woke has started before its sender resumes
        for future, stored, error in outcomes:
            if isinstance(error, LeaseLostError):
                self._lease_lost(error)
            if future.done():  # the sender stopped waiting
                continue
            if error is not None:
                future.set_exception(one_senders(error))  # each sender its own
            else:
                future.set_result(stored)  # type: ignore[arg-type]

    def _catch_up(self) -> None:
        journal = self._open_journal()
        if self._store.version(self._stream) != journal.session.version:
            with self._lock:
                journal.catch_up()

    async def _watch(self) -> None:
        # The wake-up hook: a store with ``subscribe(stream, callback) -> unsubscribe`` (the
        # PostgreSQL store: LISTEN/NOTIFY, with its own slow poll as the backstop) calls back
        # when the stream may have changed; the watcher waits for that instead of polling.
        loop = asyncio.get_running_loop()
        nudge = asyncio.Event()

        def poke() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(nudge.set)

        subscribe = getattr(self._store, "subscribe", None)
        if callable(subscribe):
            try:
                await self._call(self._subscribe, subscribe, poke)
            except Exception:
                logger.exception("could not subscribe to session %r; polling", self._stream)
        while True:
            if self._unsubscribe is None:
                await asyncio.sleep(self._poll_interval)
            else:
                await nudge.wait()
                nudge.clear()
            if getattr(self._lease, "lost", False) is True:  # a renewal found it taken over
                self._lease_lost(LeaseLostError(
                    f"stream {self._stream!r}: this owner's lease was taken over by another "
                    f"owner", stream=self._stream, epoch=getattr(self._lease, "epoch", 0)))
                return
            try:
                await self._call(self._catch_up)
            except Exception:
                logger.exception("watching session %r failed; retrying", self._stream)

    # -- the loop's side: reacting to what was folded, and the run --------------------------------

    def _folded(self, events: Sequence[Event]) -> None:
        """The journal folded ``events`` in (on any thread, under the journal lock): hand them
        to the loop, in order."""
        if _thread_id() == self._loop_thread and not self._reacting and not self._batches:
            # Folded on the loop with nothing before it to tell (an inline send or claim):
            # told at once. No other thread can queue a batch meanwhile, since each does so
            # under the journal lock this thread holds.
            if not self._readers and not self._listeners:  # nobody to tell: the core decides
                journal = self._journal
                if journal is not None and self._core.arrived(events, journal.session):
                    self._start_run()
                return
            self._reacting = True
            try:
                self._tell(events)
            finally:
                self._reacting = False
            if self._batches:  # a listener's own send, folded while we told
                self._react()
            return
        with self._batches_lock:
            self._batches.append(events)
            here = threading.get_ident() == self._loop_thread
            schedule = not here and not self._react_scheduled
            if schedule:
                self._react_scheduled = True
        if here:
            self._react()
        elif schedule and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                self._loop.call_soon_threadsafe(self._react)

    def _react(self) -> None:
        """On the loop: tell the readers and listeners of each folded batch, in order, and ask
        the core whether to wake."""
        if self._reacting:
            return  # a listener's own send, folded while we tell: told after this batch
        self._reacting = True
        try:
            while True:
                with self._batches_lock:
                    if not self._batches:
                        self._react_scheduled = False
                        return
                    events = self._batches.popleft()
                self._tell(events)
        finally:
            self._reacting = False

    def _tell(self, events: Sequence[Event]) -> None:
        """On the loop, for one folded batch: tell the readers and listeners of each event, in
        order, then ask the core whether to wake."""
        if self._readers or self._listeners:
            readers = tuple(self._readers)
            for event in events:
                for reader in readers:
                    reader.put_nowait(event)
                for listener in list(self._listeners):
                    try:
                        listener(event)
                    except Exception:
                        logger.exception("a listener of session %r failed on event #%d",
                                         self._stream, event.seq)
        # Ours or another process's: a send that asks to wake is answered (the core's rule).
        if self._journal is not None and self._core.arrived(events, self._journal.session):
            self._start_run()

    def _raise_if_lost(self) -> None:
        lost = self._core.lost
        if lost is not None:  # a new error each time, so no traceback grows on the stored one
            raise LeaseLostError(str(lost), stream=lost.stream, epoch=lost.epoch) from lost

    def _lease_lost(self, error: LeaseLostError) -> None:
        """The store says another owner took the stream over: stop for good (on the loop)."""
        if self._core.lost is None:
            logger.error("the owner of session %r lost its lease and stops: %s",
                         self._stream, error)
        if self._core.lease_lost(error) and self._cancel is not None:
            self._cancel.set()
        self._settled.set()
        for reader in self._readers:  # the owner is over: so is every events() reader
            reader.put_nowait(None)
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()

    def _start_run(self) -> None:
        """The core said start. The first turn's cancel exists as soon as the run does, so a
        cancel() right after the send that woke it is honoured before the turn starts."""
        assert self._loop is not None
        self._cancel = asyncio.Event()
        self._settled.clear()
        self._run = self._loop.create_task(self._work(self._cancel),
                                           name=f"nous-inbox run {self._stream}")

    async def _work(self, cancel: asyncio.Event) -> None:
        me = asyncio.current_task()
        journal, port = self._open_journal(), self._port
        took: bool | None = None  # whether the last turn claimed anything; None before the first
        stop: Stop | None = None
        try:
            try:
                while True:
                    answer = self._core.next_turn(journal.session, took)
                    if isinstance(answer, Stop):
                        stop = answer
                        break
                    if took is not None:
                        cancel = self._cancel = asyncio.Event()
                    took = False
                    async for event in self._runner.arun_turn(
                        port, reason=answer.reason, cancel=cancel
                    ):
                        took = took or type(event) is QueueClaimed
            except asyncio.CancelledError:
                self._core.failed(journal.session, asyncio.CancelledError())  # runner recorded it
                raise
            except Exception as exc:
                logger.exception("the run of session %r failed", self._stream)
                self._failure = exc
                stop = self._core.failed(journal.session, exc)
            # The core has stopped this run (a send may start the next one from here on), so
            # nothing below may touch it. The record is queued before any later run's events.
            if stop.record:
                try:
                    await self._append_soon(stop.record)
                except Exception as exc:
                    logger.exception("could not record the end of session %r's run", self._stream)
                    if isinstance(exc, LeaseLostError):
                        self._lease_lost(exc)
                    elif self._failure is None:
                        self._failure = exc
        finally:
            if self._run is me:
                self._run = None
                self._cancel = None
                self._settled.set()
