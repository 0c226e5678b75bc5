"""Where an asyncio owner's store calls run: inline on the loop, or on one worker thread.

A store says whether its calls block (``store.blocking``: a disk, a lock, a network; only
``memory:`` says no). An event loop must never wait on one, so an
:class:`~nous_inbox.owner.async_owner.AsyncOwner` over a blocking store sends every store call (its
sends, its run's claims and records, its readers' reads, its watcher's looks while it runs) to
one worker of its own, in order; over a store that does not block it calls inline. Sends that
arrive while the worker is busy share one append: this is the group commit's asyncio pump
(:mod:`nous_inbox.owner.group_commit`: one job per batch, each sender's future settled on the loop).

The worker is a :class:`LingeringThread`: its thread lives only while there is work, and goes
once it has had none for :data:`LINGER` seconds; the next call starts another. An idle owner
(whose looks at the store its loop's shared watch makes, :mod:`nous_inbox.owner.idle_watch`) so holds
no thread, and a host may hold many idle sessions for the price of their memory alone.

>>> import asyncio
>>> from nous_inbox.events import Warned
>>> async def main():
...     worker = StoreWorker(asyncio.get_running_loop(), True, "demo", commit=list)
...     sent = [worker.send(Warned(text=text)) for text in "abc"]
...     stored = [await future for future in sent]
...     worker.shutdown()
...     return [event.text for event in stored]
>>> asyncio.run(main())
['a', 'b', 'c']
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, ParamSpec, TypeVar

from nous_inbox.events import Event
from nous_inbox.owner.group_commit import (
    GroupCommit,
    GroupCommitState,
    Outcome,
    Ticket,
    copy_for_sender,
    interrupted,
    refused_unwritten,
    settle,
)

__all__ = ["LINGER", "LingeringThread", "SendTicket", "StoreWorker"]

_T = TypeVar("_T")
_P = ParamSpec("_P")

LINGER: Final = 1.0
"""Seconds a worker's thread waits for more work before it goes (a run calls its store far more
often, so in practice only an idle owner's thread goes)."""

logger: Final = logging.getLogger("nous_inbox.owner")

SendTicket = Ticket["asyncio.Future[Event]"]
"""A send queued on the worker, its waiter the future its sender awaits."""


class LingeringThread(concurrent.futures.Executor):
    """An executor of one thread that runs its jobs in the order they came, started when a job
    comes and none is alive, gone once it has waited ``linger`` seconds with nothing to do (at
    once after :meth:`shutdown`, when what was queued has run).

    At most one thread runs its jobs at a time, so jobs never overlap and never reorder; an
    idle one costs no thread at all. The thread is not a daemon: what was queued runs even as
    the interpreter exits (which so waits at most ``linger`` for a worker nobody shut down).

    >>> worker = LingeringThread("demo", linger=0.01)
    >>> [worker.submit(pow, 2, n).result() for n in range(4)]
    [1, 2, 4, 8]
    >>> worker.shutdown()
    """

    def __init__(self, name: str, linger: float = LINGER) -> None:
        self._name = name
        self._linger = linger
        self._jobs: collections.deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
            collections.deque())
        self._changed = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._shut = False

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs,
               ) -> concurrent.futures.Future[_T]:
        """Queue ``fn(*args, **kwargs)`` behind every job queued before it; its future."""
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        with self._changed:
            if self._shut:
                raise RuntimeError(f"{self._name}: cannot take a job after shutdown")
            self._jobs.append((future, lambda: fn(*args, **kwargs)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name)
                self._thread.start()
            else:
                self._changed.notify()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more jobs; the thread goes once those queued have run (``wait``: wait for
        that, unless called from the thread itself). ``cancel_futures`` drops those not started."""
        with self._changed:
            self._shut = True
            if cancel_futures:
                while self._jobs:
                    self._jobs.popleft()[0].cancel()
            thread = self._thread
            self._changed.notify()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _work(self) -> None:
        while True:
            with self._changed:
                if not self._changed.wait_for(lambda: self._jobs or self._shut, self._linger) \
                        or not self._jobs:
                    self._thread = None  # (under the lock: a job queued from now starts another)
                    return
                future, job = self._jobs.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    result = job()
                except BaseException as exc:  # the job's caller hears it, as an executor's does
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, job  # what the job holds goes with it, not with the next wait


class StoreWorker:
    """``loop``'s store calls: on one worker thread (named for ``name``) when ``blocking``, else
    inline. ``commit`` appends a batch of sends in one transaction (on the worker); ``settled``,
    when given, hears each batch on the loop before its senders do (and after ``tell`` heard
    what it folded); ``tell`` hears on the loop, in log order, each batch of events
    :meth:`relay` is handed on any thread."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, blocking: bool, name: str,
        commit: Callable[[Sequence[Event]], Sequence[Event]],
        settled: Callable[[Sequence[SendTicket]], None] | None = None,
        tell: Callable[[Sequence[Event]], None] | None = None,
    ) -> None:
        self.loop, self._name = loop, name  # (the loop its calls come from)
        self._loop_thread = threading.get_ident()  # (made on the loop)
        self._tell = tell
        # Folded batches on their way to the loop, in log order (see relay).
        self._batches: collections.deque[Sequence[Event]] = collections.deque()
        self._batches_lock = threading.Lock()
        self._scheduled = self.telling = False
        self._batch_thread: int | None = None  # the worker, while it commits a batch
        self._io = LingeringThread(f"nous-inbox io {name}") if blocking else None
        self._commit = commit
        self._settled = settled
        self._group: GroupCommit[asyncio.Future[Event]] = GroupCommit()
        self._queue_lock = threading.Lock()
        self.lease: Any = None  # the stream's lease, taken by :meth:`hold`
        self._unsubscribe: Callable[[], object] | None = None

    async def hold(self, take: Callable[[], Any]) -> None:
        """Take the stream's lease with ``take()`` where store calls run. The job keeps it itself:
        should ``take`` fail, or its caller give up on it (a cancel), the worker gives back what
        the job took and stops."""
        def job() -> None:
            self.lease = take()
        try:
            await self.call(job)
        except BaseException:
            self.submit(self.give_back)  # an open a cancel left running still takes the lease
            self.shutdown()
            raise

    async def subscribe(self, subscribe: Callable[..., Callable[[], object] | None],
                        *args: Any) -> None:
        """``subscribe(*args)`` where store calls run; the job keeps the unsubscribe it returns
        itself (``None``: no subscription, the watcher polls), so a :meth:`give_back` or
        :meth:`drop_subscription` queued after it finds it."""
        def job() -> None:
            self._unsubscribe = subscribe(*args)
        await self.call(job)

    @property
    def subscribed(self) -> bool:
        """Whether a store subscription is held (else the watcher polls)."""
        return self._unsubscribe is not None

    def drop_subscription(self) -> None:
        """Drop the store subscription, if one is held (a job for the worker)."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()

    def give_back(self) -> None:
        """Store the sends still queued, drop the subscription and give the lease back (a job
        for the worker, after every job queued before it: a subscribe or an open a cancel left
        running ends first, and no batch is written once the stream is given up)."""
        lease, self.lease = self.lease, None
        try:
            while self._commit_batch():
                pass
            self.drop_subscription()
        finally:
            if lease is not None:
                lease.release()

    async def close(self, run: asyncio.Task[Any] | None,
                    caller: asyncio.Task[Any] | None = None) -> None:
        """Give the stream up and stop the worker once what is queued has run, every batch
        relayed so far told first. A ``run`` still going (one the owner's teardown could not
        stop) keeps the lease: only the subscription goes now, and the lease once ``run`` ends
        (a failure then is logged). Keeping it is logged too, unless ``run`` is ``caller``, the
        task the close came from (a run that closes its own owner). Cancelling the task awaiting
        this stops its wait, not the job."""
        lasting = run is not None and not run.done()
        if lasting and run is not caller:
            logger.warning("the run of session %r did not stop; keeping its lease until it ends",
                           self._name)
        try:  # shielded: a cancel of the task awaiting this must not drop the job unrun
            await asyncio.shield(self.soon(self.drop_subscription if lasting else self.give_back))
        finally:
            self.drain()  # the last batches reach the readers before they end
            if run is not None and lasting:
                run.add_done_callback(lambda run: self._give_back_last())
            else:
                self.shutdown()

    def _give_back_last(self) -> None:
        """:meth:`give_back` as the worker's last job, then stop it; a failure is logged."""
        if self._io is None:
            try:
                self.give_back()
            except Exception as exc:
                self._gave_back(exc)
            return
        done = self._io.submit(self.give_back)
        self._io.shutdown(wait=False)
        done.add_done_callback(lambda done: self._gave_back(done.exception()))

    def _gave_back(self, error: BaseException | None) -> None:
        if error is not None:
            logger.error("could not give back the lease of session %r", self._name, exc_info=error)

    def on_loop(self) -> bool:
        """Whether the calling thread is the loop's."""
        return threading.get_ident() == self._loop_thread

    def call_on_loop(self, call: Callable[..., object], *args: Any) -> None:
        """``call(*args)`` on the loop: now when called there, else as soon as the loop runs it
        (never, once the loop is gone: nothing waits there any more)."""
        if self.on_loop():
            call(*args)
        else:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(call, *args)

    def relay(self, events: Sequence[Event]) -> None:
        """Hand ``events``, folded on any thread under the journal lock, to ``tell`` on the
        loop, in log order: at once when folded on the loop, else as soon as the loop runs. What
        a group commit's own commit folds is told by that batch's ``_settle``, so the loop wakes
        once per batch; a relay from any other thread schedules its own drain, as nothing it
        holds may wait for the batch."""
        here = self.on_loop()
        with self._batches_lock:
            self._batches.append(events)
            schedule = (not here and not self._scheduled
                        and threading.get_ident() != self._batch_thread)
            self._scheduled = self._scheduled or schedule
        if here:
            self.drain()
        elif schedule:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                self.loop.call_soon_threadsafe(self.drain)

    @property
    def relaying(self) -> bool:
        """Whether batches wait to be told, or one is being told (a caller on the loop that
        would tell one itself must queue it behind them)."""
        return self.telling or bool(self._batches)

    def drain(self) -> None:
        """On the loop: tell each batch relayed so far, in order (one relayed while a batch is
        told, by a listener's own send, is told after it)."""
        if self.telling or self._tell is None:
            return
        self.telling = True
        try:
            while True:
                with self._batches_lock:
                    if not self._batches:
                        self._scheduled = False
                        return
                    events = self._batches.popleft()
                self._tell(events)
        finally:
            self.telling = False

    @property
    def inline(self) -> bool:
        """Whether store calls run inline on the loop (the store does not block)."""
        return self._io is None

    @property
    def group_commit(self) -> GroupCommitState | None:
        """The sends' group commit now; ``None`` inline, where each send commits at once."""
        if self._io is None:
            return None
        with self._queue_lock:
            return self._group.state()

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` where store calls belong: inline, or on the worker."""
        return fn(*args) if self._io is None else await self.call_io(fn, *args)

    def call_io(self, fn: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
        """``fn(*args)`` on the worker, as a future (the port's ``call_io`` for a runner)."""
        assert self._io is not None
        return self.loop.run_in_executor(self._io, fn, *args)

    def soon(self, fn: Callable[[], _T],
             failed: Callable[[BaseException], object] | None = None) -> asyncio.Future[_T]:
        """``fn()`` where store calls belong, queued now (ahead of whatever is queued later),
        as a future: done already when inline. ``failed``, when given, hears on the loop what
        ``fn`` raised (not a cancel of the future)."""
        if self._io is not None:
            done = self.call_io(fn)
        else:
            done = self.loop.create_future()
            try:
                done.set_result(fn())
            except Exception as exc:
                done.set_exception(exc)
        if failed is not None:
            done.add_done_callback(lambda done: done.cancelled()
                                   or (error := done.exception()) is None or failed(error))
        return done

    def submit(self, fn: Callable[[], _T]) -> concurrent.futures.Future[_T] | None:
        """``fn()`` on the worker after everything queued (a lease to give back; queue it before
        :meth:`shutdown`, after which the worker takes no job); ``None`` when inline (the caller
        calls it)."""
        return None if self._io is None else self._io.submit(fn)

    def shutdown(self) -> None:
        """Stop the worker once what is queued has run (without waiting for it)."""
        if self._io is not None:
            self._io.shutdown(wait=False)

    def send(self, event: Event, settled: Callable[[Event | None, bool], object] | None = None,
             ) -> asyncio.Future[Event]:
        """Queue ``event`` for the next group commit (the worker's only); a future of it as
        stored. Cancelling the future takes the send back, if no batch took it yet.
        ``settled`` hears (on the loop, once) how the send ended: ``(stored, False)``, or
        ``(None, unwritten)``, ``unwritten`` saying whether it surely wrote nothing (taken
        back, or refused before anything was written) rather than perhaps."""
        assert self._io is not None, "an inline store commits a send at once"
        ticket: SendTicket = Ticket(event, self.loop.create_future())
        with self._queue_lock:
            lead = self._group.queue(ticket)
        if lead:
            self._io.submit(self._flush)

        def done(future: asyncio.Future[Event]) -> None:
            if future.cancelled():
                with self._queue_lock:
                    taken_back, _ = self._group.withdraw(ticket)
                if settled is not None:
                    settled(None, taken_back)
            elif settled is not None:
                error = future.exception()
                if error is None:
                    settled(future.result(), False)
                else:
                    settled(None, refused_unwritten(error))

        ticket.waiter.add_done_callback(done)
        return ticket.waiter

    def _flush(self) -> None:
        """On the worker: commit one batch, and queue the next job if more came meanwhile
        (behind the jobs queued since, so a run's claims are not kept waiting by a stream
        of sends)."""
        if self._commit_batch():
            with contextlib.suppress(RuntimeError):  # the worker is gone: give_back took them
                self._io.submit(self._flush)  # type: ignore[union-attr]

    def _commit_batch(self) -> bool:
        """On the worker: commit the sends queued as one batch and settle their senders on the
        loop; whether more queued meanwhile. Nothing queued (an earlier job took them, or
        their only sender took its send back) writes nothing."""
        with self._queue_lock:
            batch = self._group.take()
        if not batch:
            return False
        self._batch_thread = threading.get_ident()  # what the commit relays, ``_settle`` tells
        begin, outcomes = time.monotonic(), list[Outcome]()
        try:
            outcomes = settle(self._commit, [ticket.event for ticket in batch])
        except BaseException as exc:  # not a store's failure: the worker's own
            outcomes = interrupted(exc, len(batch))
            raise
        finally:
            self._batch_thread = None
            with self._queue_lock:
                more = self._group.finish(batch, outcomes, time.monotonic() - begin)
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody awaits them
                self.loop.call_soon_threadsafe(self._settle, batch)
        return more is not None

    def _settle(self, batch: Sequence[SendTicket]) -> None:
        """On the loop: what the batch folded is told (a run a send woke starts before its
        sender resumes), ``settled`` hears the batch, then each sender its own outcome."""
        self.drain()
        if self._settled is not None:
            self._settled(batch)
        for ticket in batch:
            if ticket.waiter.done():  # the sender stopped waiting
                continue
            if ticket.error is not None:
                ticket.waiter.set_exception(copy_for_sender(ticket.error))
            else:
                ticket.waiter.set_result(ticket.stored)  # type: ignore[arg-type]
