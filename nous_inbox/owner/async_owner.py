"""AsyncOwner: the owner for hosts that live on an event loop, driven on that loop.

The same actor as :class:`~nous_inbox.owner.Owner`, with the same rules (append before acting,
one run at a time, wake on a waking send and again at run end, cancel wakes nothing, resume from
the log, a lost lease ends the owner), spoken in ``await``: both are one body
(:mod:`nous_inbox.owner.body`) with two pumps. This one runs its turns as an asyncio task through
the runner's ``arun_turn`` (an async model, async tools and a pydantic-ai agent stay on the loop
they were built for), and calls its store where :mod:`nous_inbox.owner.store_worker` says: inline for
``memory:``, else on one worker thread of its own, so the loop never waits on a disk.

>>> import asyncio
>>> from nous_inbox.message import Message; from nous_inbox.runner import Runner
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

A send verb checks its input when called and returns a coroutine of the stored event: under the
owner's lock or off the loop it commits at once; on the loop it is queued for the store worker
(a listener may drop the coroutine unawaited: the send is stored all the same). A failed send
raises where it is awaited (:class:`~nous_inbox.owner.sends.Refused`), never at the call.
``prompt`` and ``followup`` return an :class:`~nous_inbox.owner.turn_result.AsyncTurnHandle`:
awaited, the :class:`~nous_inbox.owner.turn_ledger.TurnResult` of the turn that answers it
(``await handle.stored()``: the send alone). Batches are told on the loop, in log order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, Literal, TypeVar, overload

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.message import Message
from nous_inbox.owner.body import OwnerBody
from nous_inbox.owner.core import Stop
from nous_inbox.owner.event_readers import EventReaders
from nous_inbox.owner.group_commit import GroupCommitState
from nous_inbox.owner.handover import hand_over_run
from nous_inbox.owner.idle_watch import OwnerWatch, taken_over
from nous_inbox.owner.port import AsyncTurnRunner
from nous_inbox.owner.sends import QueuedSend, Refused, Stored
from nous_inbox.owner.store_worker import SendTicket, StoreWorker
from nous_inbox.owner.turn_ledger import TurnResult
from nous_inbox.owner.turn_result import AsyncTurnHandle, Steps, TurnEnds, apump
from nous_inbox.receipts import Receipt
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.store import Store
from nous_inbox.store.journal import sent_event
from nous_inbox.store.snapshot import SNAPSHOT_EVERY
from nous_inbox.verbs import Target, Verb

__all__ = ["AsyncOwner"]

_T = TypeVar("_T")


class AsyncOwner(OwnerBody[Coroutine[Any, Any, MessageSent], AsyncTurnHandle]):
    """Holds one session (``stream`` in ``store``) and runs ``runner`` on the event loop whenever
    it should wake; use it as ``async with AsyncOwner(store, stream, runner) as owner``.

    ``runner`` has ``arun_turn(port, *, reason, cancel)`` (a :class:`~nous_inbox.runner.Runner`,
    a pydantic-ai :class:`~nous_inbox.adapters.pydantic_ai.AgentRunner`). ``offload``: whether
    store calls go to the worker thread (default: ``store.blocking``). The other options are
    :class:`~nous_inbox.owner.Owner`'s, checked before anything is opened; ``freeze_gc`` is off by
    default (on, an asyncio task or future in a reference cycle at a freeze is never collected).

    ``watch``: while a run goes the owner looks for other processes' sends every
    ``poll_interval`` (or when its store hints: PostgreSQL's NOTIFY), so a steer reaches the run
    at its next step. An idle owner holds no thread nor look of its own: its loop's shared watch
    (:mod:`nous_inbox.owner.idle_watch`) looks for all its idle owners at once, within
    ``IDLE_LOOK`` (half a second) or ``poll_interval`` if longer, or at once on a store that hints.

    >>> from nous_inbox.store import open_store
    >>> AsyncOwner(open_store("memory:"), "s", object())
    Traceback (most recent call last):
    ...
    TypeError: AsyncOwner: runner must have arun_turn(port, *, reason, cancel) (a nous_inbox.runner.Runner), got object
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
        self._io: StoreWorker | None = None
        self._entered = False
        self._run: asyncio.Task[None] | None = None
        self._cancel: asyncio.Event | None = None
        self._settled = asyncio.Event()  # no run going, or the lease was lost: wait_idle returns
        self._settled.set()
        self._readers = EventReaders()
        self._watcher: OwnerWatch | None = None
        self._closing: asyncio.Task[None] | None = None  # one teardown for every aclose
        self._turn_over = TurnEnds()  # what a handle waiting for its turn waits on

    # -- opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> AsyncOwner:
        if self._entered:
            raise RuntimeError(f"AsyncOwner of session {self._stream!r} was already opened")
        self._entered = True
        self._io = io = StoreWorker(asyncio.get_running_loop(), self._blocking, self._stream,
                                    self._commit, self._batch_settled, self._tell)
        try:
            await io.hold(lambda: self._open_session(None if io.inline else io.call_io))
        except BaseException:
            self._closed = True  # (the worker gives back what the open took)
            raise
        if self._watch_others:
            self._watcher = OwnerWatch(
                io, self._store, self._stream, self._poll_interval, running=lambda: self.running,
                behind=lambda: self._behind(io.lease), lost=lambda: taken_over(io.lease, self._stream),
                lose=self._lose, catch_up=self._catch_up)
        if self._start:
            io.drain()  # what the resume recorded, before the first decision
            if self._core.wake(self.session):
                self._start_run()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self, timeout: float | None = 10.0, *, hand_over: bool = False) -> None:
        """Cancel any run, wait for it to end, stop watching, give up the stream's lease; every
        ``events()`` reader ends. A run still going ``timeout`` seconds after its cancel has its
        task cancelled; if even that does not end it, the lease is kept until it does (logged).
        From inside the run it does not wait for that run. The teardown is a task of its own:
        cancelling ``aclose`` stops the wait, not the teardown. ``hand_over``: let another holder
        carry the run on from its next boundary (:mod:`nous_inbox.owner.handover`)."""
        if not self._entered:
            return
        watcher = self._watcher and self._watcher.task
        if self._closing is not None and asyncio.current_task() in (self._run, watcher):
            return  # the teardown under way waits for this very task: waiting for it would stall
        if self._closing is None:
            if self._closed:
                return  # the open failed and cleaned up after itself
            self._closed = True
            if hand_over and self._port is not None:  # no boundary is passed from now on
                self._port.handover.asked = self._core.hand_over()
            self._closing = asyncio.get_running_loop().create_task(self._close(
                timeout, asyncio.current_task(), hand_over), name=f"nous-inbox close {self._stream}")
        await asyncio.shield(self._closing)

    async def _close(self, timeout: float | None, caller: asyncio.Task[Any] | None,
                     hand_over: bool = False) -> None:
        run, io, watcher = self._run, self._io, self._watcher
        assert io is not None
        if hand_over and self._port is not None and self._core.lost is None:
            await hand_over_run(run, caller, self._port.handover, timeout,
                                lambda events: io.call(self._commit, events))
        elif self._core.close():
            self._cancel_turn()
        try:
            if run is not None and run is not caller:
                await asyncio.wait((run,), timeout=timeout)
                if not run.done():
                    run.cancel()
                    await asyncio.wait((run,), timeout=timeout)
            if watcher is not None:
                await watcher.stopped(caller)
        finally:
            try:
                await io.close(run, caller)  # the lease now, or when that run ends
            finally:
                self._readers.end()

    # -- what a host reads and says ---------------------------------------------------------------

    @overload
    def events(self, after: int = 0, *, deltas: Literal[False] = False) -> AsyncIterator[Event]: ...
    @overload
    def events(self, after: int = 0, *, deltas: bool) -> AsyncIterator[Event | TextDelta]: ...

    def events(self, after: int = 0, *, deltas: bool = False) -> AsyncIterator[Event | TextDelta]:
        """Every event with ``seq > after``: the stored ones, then each as it is recorded, until
        the owner closes. Resume a stream by passing the last ``seq`` you saw.

        The reader listens before it reads the store (a repeat is dropped by ``seq``); one that
        falls behind has its events queued, in order. Closing the iterator stops listening.
        ``deltas=True`` adds the model's text as it streams, as
        :class:`~nous_inbox.runner.deltas.TextDelta` items in order with the events (each
        before the ``ModelReplied`` that holds its reply), from a runner that streams (the
        framework adapters). Deltas are never stored: a resumed reader reads events only, and
        the unread deltas of a slow reader are joined, so it never slows the run.
        """
        if type(deltas) is not bool:
            raise TypeError(f"events: deltas must be a bool, got {type(deltas).__name__}")
        return self._readers.read(after, self._stored, self._check_open,
                                  self._outlet if deltas else None)

    @property
    def group_commit(self) -> GroupCommitState | None:  # the store worker's (None on memory:)
        return None if self._io is None else self._io.group_commit

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """Within it, a send this thread makes commits at once, as a boundary subscriber's does:
        stored, folded and answered before the verb returns, which then returns a
        :class:`~nous_inbox.owner.sends.Stored` (its ``value`` is the stored event; a prompt's
        handle has its ``sent``). For sync code on the loop (a listener, a UI callback) whose
        send must be stored before it goes on; the thread, the loop's included, waits for it.

        >>> import asyncio
        >>> from nous_inbox.runner import Runner
        >>> from nous_inbox.store import open_store
        >>> async def main():
        ...     async with AsyncOwner(open_store("memory:"), "s", Runner(lambda t, tools: "ok"),
        ...                           start=False) as owner:
        ...         with owner.at_once():
        ...             sent = owner.inject("noted")
        ...         return sent.value.seq
        >>> asyncio.run(main())
        1
        """
        with self._lock:  # a send from the thread holding it commits at once (_store_send)
            yield

    def _stored(self, after: int) -> Awaitable[list[Event]]:
        """The stored events with ``seq > after``, read where store calls run."""
        assert self._io is not None
        return self._io.call(self._read, after)

    def _send(self, message: Message | str, target: Target | str, wakeup: bool,
              prompt: bool = False) -> Coroutine[Any, Any, MessageSent]:
        stored = self._store_send(message, target, wakeup, prompt)
        follow = self.delivered
        return (Stored(stored, follow) if type(stored) is MessageSent
                else QueuedSend(stored, follow))  # type: ignore[arg-type]

    def _store_send(self, message: Message | str, target: Target | str, wakeup: bool, prompt: bool,
                    options: dict[str, Any] | None = None) -> MessageSent | asyncio.Future[MessageSent]:
        """A send, stored at once (an inline store; a caller under the lock, or off the loop,
        whose thread may wait for it) or queued on the worker: the stored event, or a future of
        it. With run ``options``, it commits on its own, so they are kept before any claim."""
        io = self._io
        if io is None or self._journal is None or self.closed:
            self._check_open()  # raises, saying why
        assert io is not None
        if prompt:  # before the send: the run it wakes starts before it returns
            self._on_loop(self._core.prompt)
        try:
            if io.inline or self._holds_lock() or not io.on_loop():
                sent = self._sent_now(message, target, wakeup, options)
                if prompt:
                    self._prompt_settled(sent.seq)
                return sent
            if options is not None:  # (its outcome, heard on the loop, is a send's)
                stored = io.soon(lambda: self._sent_now(message, target, wakeup, options))
                stored.add_done_callback(lambda done: self._options_sent(done, prompt))
                return stored
            event = sent_event(message, target, wakeup)
        except BaseException as exc:
            self._sent_failed(exc, prompt)
            raise
        settled = (lambda stored, unwritten: self._prompt_settled(
            None if stored is None else stored.seq, not unwritten)) if prompt else None
        return io.send(event, settled)  # type: ignore[return-value]

    def _options_sent(self, done: asyncio.Future[MessageSent], prompt: bool) -> None:
        """On the loop: a send with run options, committed on its own, settled (a cancelled
        wait may have let it commit)."""
        if done.cancelled():
            if prompt:
                self._prompt_settled(None, True)
        elif (error := done.exception()) is not None:
            self._sent_failed(error, prompt)
        elif prompt:
            self._prompt_settled(done.result().seq)

    def _prompt_settled(self, seq: int | None, maybe_stored: bool = False) -> None:
        self._on_loop(lambda: self._core.prompted(seq, maybe_stored=maybe_stored))

    def _turn_send(self, message: Message | str, verb: Verb,
                   options: dict[str, Any] | None) -> AsyncTurnHandle:
        return AsyncTurnHandle(self._store_send(message, verb.target, verb.wakeup, verb.own_turn,
                                                options), self._result, self.delivered)

    def _refused(self, error: Exception) -> Coroutine[Any, Any, MessageSent]:
        return Refused(error)  # raised where it is awaited, as an awaitable's failure is

    def _turn_refused(self, error: Exception) -> AsyncTurnHandle:
        return AsyncTurnHandle(Refused(error), self._result)

    async def turn_result(self, turn: int) -> TurnResult:
        """How ``turn`` ended (see ``Owner.turn_result``), from the log if the ledger lacks it."""
        return await self._pumped(self._answers.of_turn(turn))

    async def turn_handle(self, seq: int) -> AsyncTurnHandle:
        """A handle on the turn of the prompt or followup stored at ``seq`` (``Owner.turn_handle``)."""
        self._check_open()
        return AsyncTurnHandle(await self._pumped(self._answers.sent(seq)), self._result,
                               self.delivered)

    async def _result(self, seq: int, timeout: float | None) -> TurnResult:
        """Wait for the turn of the send at ``seq`` (a handle's result); after ``timeout``
        seconds, a ``TimeoutError`` saying what timed out (the turn goes on). The ledger is
        read without the lock, which store I/O holds: a look that misses a fold just made is
        made again when the wake that fold sends arrives."""
        waiting = asyncio.timeout(timeout)
        try:
            async with waiting:
                return await self._pumped(self._answers.of_send(seq, self._unanswered))
        except TimeoutError:
            if not waiting.expired():
                raise  # (not this wait's: a store's own)
            raise TimeoutError(f"the turn of the send at seq {seq} of session {self._stream!r} "
                               f"did not end within {timeout} s (the turn goes on: wait "
                               f"again, or cancel() it)") from None

    async def _pumped(self, steps: Steps[_T]) -> _T:
        """The body's ``steps``, each log read on the store worker, each wait for a turn's end."""
        assert self._io is not None
        return await apump(steps, self._io.call, self._turn_over.wait)

    # -- where sends went ----------------------------------------------------------------------

    async def receipt(self, seq: int) -> Receipt:
        """Where the send stored at ``seq`` went (see :meth:`Owner.receipt
        <nous_inbox.owner.Owner.receipt>`), read from the log on the store worker when this
        owner did not see it settle."""
        receipts = self._answers.receipts
        found = receipts.now(self._opened().session, seq)
        if found is None:
            assert self._io is not None
            found = await self._io.call(receipts.logged, seq)
        return found

    async def delivered(self, seq: int, timeout: float | None = None) -> Receipt:
        """Wait until the message sent at ``seq`` is claimed or withdrawn and say where it went
        (:meth:`Owner.delivered <nous_inbox.owner.Owner.delivered>`); else ``TimeoutError``."""
        receipts = self._answers.receipts
        waiting = asyncio.timeout(timeout)
        receipts.watch(seq)
        try:
            async with waiting:
                while True:
                    moved = asyncio.ensure_future(self._turn_over.wait())  # before the look
                    try:
                        found = await self.receipt(seq)
                        if found.settled:
                            return found
                        self._raise_if_lost()
                        if self._closed:
                            raise RuntimeError(f"AsyncOwner of session {self._stream!r} closed; "
                                               f"the message sent at seq {seq} is still queued")
                        await moved
                    finally:
                        moved.cancel()
        except TimeoutError:
            if not waiting.expired():
                raise
            raise TimeoutError(f"the message sent at seq {seq} of session {self._stream!r} was "
                               f"still queued after {timeout} s (wait again, or withdraw it)") from None
        finally:
            receipts.unwatch(seq)

    async def withdraw(self, seq: int) -> Receipt:
        """Take back the message the send at ``seq`` queued, if no claim took it yet (see
        :meth:`Owner.withdraw <nous_inbox.owner.Owner.withdraw>`); the commit runs on the store
        worker."""
        journal = self._check_open()
        assert self._io is not None

        receipts = self._answers.receipts

        def withdrawn() -> Receipt:
            with self._lock:
                found = receipts.withdraw(journal, seq)
            return found or receipts.logged(seq)  # the log read without the lock

        try:
            return await self._io.call(withdrawn)
        except LeaseLostError as exc:
            self._lose(exc)
            raise

    def _turn_ended(self) -> None:
        self._on_loop(self._turn_over.ended)  # every handle waiting for its turn looks again

    def _on_loop(self, call: Callable[..., object], *args: Any) -> None:
        """``call(*args)`` on the loop, from any thread (only an open owner folds or sends)."""
        assert self._io is not None
        self._io.call_on_loop(call, *args)

    def cancel(self) -> bool:
        """End the current turn at its next boundary, as ``"cancelled"``, interrupting a model
        request or tool in flight; wake nothing after it. Returns whether a run was going;
        queued messages stay queued. Call it from any thread: the request is recorded in the
        log when a turn is open (ahead of the run's own later records), and the run is
        cancelled on the loop."""
        io = self._io
        if io is None or self.closed:
            return False
        if io.on_loop():
            io.soon(self._record_cancel)  # (logs its own failure)
            return self._cancel_now()
        run = self._run  # the run this call cancels: never one a later send starts
        self._record_cancel()
        if run is None:
            return False
        self._on_loop(lambda: self._run is run and self._cancel_now())
        return True

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no run is going (``False``: ``timeout`` seconds passed first); re-raises
        once what ended the last run, and ``lost`` every time."""
        try:
            await asyncio.wait_for(self._settled.wait(), timeout)
        except TimeoutError:
            return False
        return self._waited(True)

    # -- the loop's side --------------------------------------------------------------------------

    def _batch_settled(self, batch: Sequence[SendTicket]) -> None:
        for ticket in batch:
            if isinstance(ticket.error, LeaseLostError):
                self._lose(ticket.error)

    def _deliver(self, events: Sequence[Event]) -> None:
        """The journal folded ``events`` in (any thread, log order): the readers take them there
        (a delta said after an event is read after it), the listeners and core on the loop."""
        self._readers.tell(events)
        io = self._io
        assert io is not None
        if not self._listeners and not io.relaying and io.on_loop():
            self._answer(events, self.session)  # nobody to tell: the core decides
            return
        io.relay(events)

    def _lose(self, error: LeaseLostError) -> None:
        self._on_loop(super()._lose, error)  # (off the loop: a subscriber's send, a stop record)

    def _halted(self) -> None:
        self._settled.set()
        self._turn_over.ended()
        self._readers.end()  # the owner is over: so is every events() reader
        if self._watcher is not None:
            self._watcher.stop()

    def _start_run(self) -> None:
        """The core said start; the first turn's cancel exists at once (a cancel() right after
        the waking send is honoured before the turn starts)."""
        assert self._io is not None
        self._cancel = asyncio.Event()
        self._settled.clear()
        self._run = self._io.loop.create_task(self._work(self._cancel), name=f"nous-inbox run {self._stream}")
        if self._watcher is not None:
            self._watcher.run_started()  # an idle watch looks itself from now on

    async def _work(self, cancel: asyncio.Event) -> None:
        me, port, io = asyncio.current_task(), self._port, self._io
        assert io is not None
        took: bool | None = None  # whether the last turn claimed anything; None before the first
        again = False  # a waking send arrived while this run was stopping: start the next
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
                stop = self._run_failed(exc)
            # The core stopped this run (a send may start the next from here on): nothing below
            # touches it. The record is queued before any later run's events.
            again = stop.again
            if stop.record:
                await io.soon(lambda: self._record_stop(stop))
        finally:
            if self._run is me:
                self._run, self._cancel = None, None
                if again and self._core.wake(self.session):
                    self._start_run()  # never idle in between: wait_idle waits for this one too
                else:
                    self._settled.set()
                self._turn_over.ended()  # closed meanwhile: a handle still waiting hears it
