"""AsyncOwner: the owner for hosts that live on an event loop, driven on that loop.

The same actor as :class:`~nous_inbox.owner.Owner`, with the same rules (append before acting,
one run at a time, wake on a waking send and again at run end, cancel wakes nothing, resume from
the log, a lost lease ends the owner), spoken in ``await``: both are one body
(:mod:`nous_inbox.owner_body`) with two pumps. This one runs its turns as an asyncio task through
the runner's ``arun_turn`` (an async model, async tools and a pydantic-ai agent stay on the loop
they were built for).

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
lock, a network; only ``memory:`` says no). A non-blocking store is called inline on the loop. A
blocking store is called from one worker thread of the owner's own, never from the loop: sends,
the run's claims and records, the reads of ``events()`` and the watcher's looks queue there in
order, and sends that arrive while the worker is busy share one append (a group commit,
:mod:`nous_inbox.group_commit`); each sender resumes once its transaction committed. The runner
reaches the worker through its port's ``call_io``.

A send verb does its checks, and an inline send its whole work, when it is called; it returns a
coroutine of the stored event. Called from a listener or a boundary subscriber (which hold the
owner's lock), it commits at once, so a sync callback may send without awaiting.

What the loop does. Every batch of events folded into the session, the owner's own and those
another process appended, is handed to the loop in log order; there the owner tells its
``events()`` readers and ``listen`` callbacks, and asks the core whether to wake.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Sequence
from typing import Any, Protocol, TypeVar

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.group_commit import (
    GroupCommit,
    Outcome,
    Ticket,
    one_senders,
    refused_unwritten,
    settle,
)
from nous_inbox.inbox import Target
from nous_inbox.message import Message
from nous_inbox.owner_body import OwnerBody, logger
from nous_inbox.owner_core import Stop
from nous_inbox.port import sent_event
from nous_inbox.snapshot import SNAPSHOT_EVERY
from nous_inbox.store import Store

__all__ = ["AsyncOwner", "AsyncTurnRunner"]

_T = TypeVar("_T")
_Future = asyncio.Future[MessageSent]


class AsyncTurnRunner(Protocol):
    """What an ``AsyncOwner`` needs from a runner: one turn on a port, as an async stream."""

    def arun_turn(
        self, port: Any, *, reason: str = ..., cancel: asyncio.Event | None = ...
    ) -> AsyncIterator[Event]:
        """Run one turn; see ``nous_inbox.runner.Runner.arun_turn``."""


class _Stored(Coroutine[Any, Any, MessageSent]):
    """A coroutine of a send already stored: awaiting it (or a task running it) returns the
    event at once, and one never awaited is no error (a sync callback's send)."""

    __slots__ = ("event",)

    def __init__(self, event: MessageSent) -> None:
        self.event = event

    def send(self, value: Any) -> Any:
        raise StopIteration(self.event)

    def throw(self, *error: Any) -> Any:
        raise error[1] if len(error) > 1 and error[1] is not None else error[0]

    def close(self) -> None:
        pass

    def __await__(self) -> Generator[Any, None, MessageSent]:
        return self.event
        yield  # a generator: awaiting it returns at once


async def _stored(future: _Future) -> MessageSent:
    return await future


class AsyncOwner(OwnerBody[Coroutine[Any, Any, MessageSent]]):
    """Holds one session (``stream`` in ``store``) and runs ``runner`` on the event loop whenever
    it should wake; use it as ``async with AsyncOwner(store, stream, runner) as owner``.

    ``runner`` is anything with ``arun_turn(port, *, reason, cancel)``: a
    :class:`~nous_inbox.runner.Runner`, or a pydantic-ai
    :class:`~nous_inbox.compat.pydantic_ai.AgentRunner`. ``offload`` says whether store calls go
    to the owner's worker thread (by default when ``store.blocking``). The other options are the
    threaded owner's (:class:`~nous_inbox.owner.Owner`), ``freeze_gc`` included: off by default;
    turned on, an asyncio task or future caught in a reference cycle at a freeze is never
    collected. Options are checked here, before anything is opened: a bad one names itself.

    >>> from nous_inbox.store import open_store
    >>> AsyncOwner(open_store("memory:"), "s", object())
    Traceback (most recent call last):
    ...
    TypeError: AsyncOwner: runner must have arun_turn(port, *, reason, cancel) (a nous_inbox.Runner), got object
    """

    _who = "AsyncOwner"
    _run_method = "arun_turn"

    def __init__(
        self, store: Store, stream: str, runner: AsyncTurnRunner, *, watch: bool = True,
        poll_interval: float = 0.05, offload: bool | None = None, start: bool = True,
        snapshot_every: int = SNAPSHOT_EVERY, freeze_gc: bool = False,
    ) -> None:
        super().__init__(store, stream, runner, watch=watch, poll_interval=poll_interval,
                         start=start, snapshot_every=snapshot_every, freeze_gc=freeze_gc)
        if offload is not None and type(offload) is not bool:
            raise TypeError(f"AsyncOwner: offload must be a bool or None, got {type(offload).__name__}")
        self._blocking = bool(getattr(store, "blocking", True)) if offload is None else offload
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._io: concurrent.futures.ThreadPoolExecutor | None = None
        self._lease: Any = None
        self._entered = self._closed = False
        self._run: asyncio.Task[None] | None = None
        self._cancel: asyncio.Event | None = None
        self._settled = asyncio.Event()  # no run going, or the lease was lost: wait_idle returns
        self._settled.set()
        # Folded batches on their way to the loop, in log order (appended under the journal lock).
        self._batches: collections.deque[Sequence[Event]] = collections.deque()
        self._batches_lock = threading.Lock()
        self._react_scheduled = self._reacting = False
        self._readers: set[asyncio.Queue[Event | None]] = set()
        self._group: GroupCommit[_Future] = GroupCommit()
        self._queue_lock = threading.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._closing: asyncio.Task[None] | None = None  # one teardown for every aclose

    # -- opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> AsyncOwner:
        if self._entered:
            raise RuntimeError(f"AsyncOwner of session {self._stream!r} was already opened")
        self._entered = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if self._blocking:
            self._io = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"nous-inbox io {self._stream}")
        try:
            await self._call(self._open)
        except BaseException:
            self._closed = True
            if self._io is not None:
                # Cancelled while the open runs on: it still takes the lease. The one worker
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
        # Kept by the job itself: an open cancelled meanwhile still takes the lease, and the
        # give-back queued after it on the worker finds it here.
        self._lease = self._open_session(self._call_io if self._io is not None else None)

    def _give_back(self) -> None:
        """Drop the store subscription and give the lease back (on the worker, after every job
        queued before it: a subscribe or an open a cancel left running ends first)."""
        lease, self._lease = self._lease, None
        try:
            self._drop_subscription()
        finally:
            if lease is not None:
                lease.release()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, timeout: float | None = 10.0) -> None:
        """Cancel any run, wait for it to end, stop watching, give up the stream's lease.

        A run still going ``timeout`` seconds after its cancel has its task cancelled; if even
        that does not end it, a warning is logged and the lease is kept until the run ends. Every
        ``events()`` reader ends. Called from inside the run, it does not wait for that run: the
        lease goes back when the run ends. The teardown is one task of its own: cancelling
        ``aclose`` stops the wait, not the teardown.
        """
        if not self._entered:
            return
        if self._closing is not None and asyncio.current_task() in (self._run, self._watcher):
            return  # the teardown under way waits for this very task: waiting for it would stall
        if self._closing is None:
            if self._closed:
                return  # the open failed and cleaned up after itself
            self._closed = True
            self._closing = asyncio.get_running_loop().create_task(
                self._close(timeout, asyncio.current_task()), name=f"nous-inbox close {self._stream}")
        await asyncio.shield(self._closing)

    async def _close(self, timeout: float | None, caller: asyncio.Task[Any] | None) -> None:
        if self._core.close():
            self._cancel_turn()
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
            try:  # shielded: a cancel of this task must not drop the job before the worker runs it
                if not lasting:
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
                    run.add_done_callback(self._give_back_after_run)
                elif self._io is not None:
                    self._io.shutdown(wait=False)

    def _give_back_after_run(self, run: asyncio.Task[None]) -> None:
        """The run a teardown could not wait for ended: its lease goes back now (on the worker,
        as a release may block on store I/O), then the worker stops."""
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
            logger.error("could not give back the lease of session %r", self._stream, exc_info=exc)

    # -- what a host reads and says ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a run is going (from the send that woke it until its end is recorded)."""
        return self._run is not None

    @property
    def closed(self) -> bool:
        """Whether the owner was closed (``aclose``, or a lost lease): it refuses sends."""
        return self._closed or self._core.lost is not None

    async def events(self, after: int = 0) -> AsyncIterator[Event]:
        """Every event with ``seq > after``: the stored ones, then each as it is recorded, until
        the owner closes. Resume a stream by passing the last ``seq`` you saw.

        The reader listens before it reads the store, so an event recorded meanwhile is in one
        or both (the repeat is dropped by ``seq``); a reader that falls behind has its events
        queued for it, in order. Closing the iterator stops listening.
        """
        if type(after) is not int:
            raise TypeError(f"events: after must be an int seq, got {type(after).__name__}")
        self._check_open(self._closed)
        live: asyncio.Queue[Event | None] = asyncio.Queue()
        self._readers.add(live)
        try:
            last = after
            for event in await self._call(self._read, after):
                last = event.seq
                yield event
            while (event := await live.get()) is not None:  # type: ignore[assignment]
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

    def _send(self, message: Message | str, target: Target | str, wakeup: bool,
              prompt: bool = False) -> Coroutine[Any, Any, MessageSent]:
        journal = self._journal
        if journal is None or self._closed or self._core.lost is not None:
            self._check_open(self._closed)  # raises, saying why
        if prompt:
            self._core.prompt()  # before the send: the run it wakes starts before it returns
        try:
            if self._io is None or self._holds_lock():
                with self._lock:
                    return _Stored(journal.send(message, target, wakeup))  # type: ignore[union-attr]
            assert self._loop is not None
            ticket: Ticket[_Future] = Ticket(sent_event(message, target, wakeup),
                                             self._loop.create_future())
        except BaseException as exc:
            self._sent_failed(exc, prompt)
            raise
        with self._queue_lock:
            lead = self._group.queue(ticket)
        if lead:
            self._io.submit(self._flush)
        ticket.waiter.add_done_callback(functools.partial(self._sent, ticket, prompt))
        return _stored(ticket.waiter)

    def _sent(self, ticket: Ticket[_Future], prompt: bool, future: _Future) -> None:
        """On the loop, a queued send's future is done. Cancelled (the sender gave up) before
        a batch took it: taken back. A prompt that cannot be in the log is no prompt."""
        if future.cancelled():
            with self._queue_lock:
                taken_back, _ = self._group.withdraw(ticket)
            if taken_back and prompt:
                self._core.unprompt()
        elif prompt and refused_unwritten(future.exception() or Exception()):
            self._core.unprompt()

    def cancel(self) -> bool:
        """End the current turn at its next boundary, as ``"cancelled"``; wake nothing after it.
        Returns whether a run was going; queued messages stay queued. Call it on the loop."""
        if not self._core.cancel():
            return False
        self._cancel_turn()
        return True

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no run is going; ``False`` if ``timeout`` seconds passed first. Re-raises
        (once) an exception that ended the last run; raises ``lost`` (every time, at once)."""
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
        state = ("not open" if not self._entered else "closed" if self.closed
                 else f"version {self.session.version}")
        return f"AsyncOwner({self._stream!r}, {state})"

    # -- the store's side -------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` where store calls belong: inline, or on the worker."""
        return fn(*args) if self._io is None else await self._call_io(fn, *args)

    def _call_soon(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        """``fn()`` where store calls belong, queued now, as a future (done already inline)."""
        if self._io is not None:
            return self._call_io(fn)
        assert self._loop is not None
        done: asyncio.Future[_T] = self._loop.create_future()
        try:
            done.set_result(fn())
        except Exception as exc:
            done.set_exception(exc)
        return done

    def _call_io(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        assert self._loop is not None and self._io is not None
        return self._loop.run_in_executor(self._io, fn, *args)

    def _drop_subscription(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def _subscribe(self, subscribe: Callable[..., Callable[[], None]], poke: Callable[[], None]) -> None:
        # Kept by the job itself: a watcher cancelled meanwhile (aclose) would drop it, and
        # aclose's unsubscribe, queued on the worker after this job, finds it here.
        self._unsubscribe = subscribe(self._stream, poke)

    def _flush(self) -> None:
        """On the worker: commit what the group commit queued, one batch, then hand each sender
        its outcome on the loop (and queue the next batch, if more came)."""
        with self._queue_lock:
            batch = self._group.take()
        begin, outcomes = time.monotonic(), list[Outcome]()
        try:
            outcomes = settle(self._commit, [ticket.event for ticket in batch])
        except BaseException as exc:  # not a store's failure: its senders hear it too
            outcomes = [(None, exc)] * len(batch)
            raise
        finally:
            with self._queue_lock:
                more = self._group.finish(batch, outcomes, time.monotonic() - begin)
            assert self._loop is not None and self._io is not None
            with contextlib.suppress(RuntimeError):  # the loop or the worker is gone
                self._loop.call_soon_threadsafe(self._settle, batch)
                if more is not None:
                    self._io.submit(self._flush)

    def _settle(self, batch: Sequence[Ticket[_Future]]) -> None:
        self._react()  # a run a send woke has started before its sender resumes
        for ticket in batch:
            if isinstance(ticket.error, LeaseLostError):
                self._lose(ticket.error)
            if ticket.waiter.done():  # the sender stopped waiting
                continue
            if ticket.error is not None:
                ticket.waiter.set_exception(one_senders(ticket.error))
            else:
                ticket.waiter.set_result(ticket.stored)  # type: ignore[arg-type]

    async def _watch(self) -> None:
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
            lost = self._taken_over(self._lease)
            if lost is not None:
                self._lose(lost)
                return
            try:
                await self._call(self._catch_up)
            except Exception:
                logger.exception("watching session %r failed; retrying", self._stream)

    # -- the loop's side --------------------------------------------------------------------------

    def _on_loop(self) -> bool:
        return threading.get_ident() == self._loop_thread

    def _deliver(self, events: Sequence[Event]) -> None:
        """The journal folded ``events`` in (on any thread, under the journal lock): tell them
        on the loop, in order (at once when folded there with nothing before them)."""
        if not self._batches and not self._reacting and self._on_loop():
            if not self._readers and not self._listeners:  # nobody to tell: the core decides
                if self._core.arrived(events, self.session):
                    self._start_run()
                return
            self._reacting = True  # (no other thread queues a batch: each does so under the
            try:                   # journal lock, which this thread holds)
                self._tell(events)
            finally:
                self._reacting = False
            if self._batches:  # a listener's own send, folded while we told
                self._react()
            return
        with self._batches_lock:
            self._batches.append(events)
            here = self._on_loop()
            schedule = not here and not self._react_scheduled
            if schedule:
                self._react_scheduled = True
        if here:
            self._react()
        elif schedule and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                self._loop.call_soon_threadsafe(self._react)

    def _react(self) -> None:
        """On the loop: tell each folded batch, in order (a listener's own send, folded while
        one is told, is told after it)."""
        if self._reacting:
            return
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
        for reader in tuple(self._readers) if self._readers else ():
            for event in events:
                reader.put_nowait(event)
        super()._tell(events)

    def _cancel_turn(self) -> None:
        if self._cancel is not None:
            self._cancel.set()

    def _lose(self, error: LeaseLostError) -> None:
        if not self._on_loop() and self._loop is not None:  # a subscriber's send, off the loop
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(super()._lose, error)
            return
        super()._lose(error)

    def _halted(self) -> None:
        self._settled.set()
        for reader in self._readers:  # the owner is over: so is every events() reader
            reader.put_nowait(None)
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()

    def _start_run(self) -> None:
        """The core said start. The first turn's cancel exists as soon as the run does, so a
        cancel() right after the waking send is honoured before the turn starts."""
        assert self._loop is not None
        self._cancel = asyncio.Event()
        self._settled.clear()
        self._run = self._loop.create_task(self._work(self._cancel), name=f"nous-inbox run {self._stream}")

    async def _work(self, cancel: asyncio.Event) -> None:
        me, port = asyncio.current_task(), self._port
        took: bool | None = None  # whether the last turn claimed anything; None before the first
        stop: Stop | None = None
        try:
            try:
                while not isinstance(answer := self._core.next_turn(self.session, took), Stop):
                    if took is not None:
                        cancel = self._cancel = asyncio.Event()
                    took = False
                    async for event in self._runner.arun_turn(port, reason=answer.reason, cancel=cancel):
                        took = took or type(event) is QueueClaimed
                stop = answer
            except asyncio.CancelledError:
                self._core.failed(self.session, asyncio.CancelledError())  # the runner recorded it
                raise
            except Exception as exc:
                logger.exception("the run of session %r failed", self._stream)
                if isinstance(exc, LeaseLostError):
                    self._lose(exc)
                self._failure = exc
                stop = self._core.failed(self.session, exc)
            # The core has stopped this run (a send may start the next one from here on), so
            # nothing below may touch it. The record is queued before any later run's events.
            if stop.record:
                try:
                    await self._call_soon(functools.partial(self._commit, stop.record))
                except Exception as exc:
                    logger.exception("could not record the end of session %r's run", self._stream)
                    if isinstance(exc, LeaseLostError):
                        self._lose(exc)
                    elif self._failure is None:
                        self._failure = exc
        finally:
            if self._run is me:
                self._run, self._cancel = None, None
                self._settled.set()
