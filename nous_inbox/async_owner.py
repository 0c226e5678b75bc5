"""AsyncOwner: the owner's asyncio face, for hosts that live on an event loop.

The same actor as :class:`~nous_inbox.owner.Owner`, with the same rules (append before acting,
one run at a time, wake on a waking send and again at run end, cancel wakes nothing, resume from
the log), spoken in ``await``. It is a face, not a second owner: the rules live once, in
:class:`~nous_inbox.owner_core.OwnerCore`, which the threaded owner drives and this face drives
through it; only the two ends change. Sends, waits and reads are awaited, with
the store I/O done in a worker thread so the event loop never blocks on a disk or a database;
and the turns themselves run *on the host's event loop*, through the runner's ``arun_turn``
(an async model, async tools and a pydantic-ai agent stay on the loop they were built for).
Inside a turn the runner makes the port calls: the pydantic-ai
:class:`~nous_inbox.compat.pydantic_ai.AgentRunner` sends them to a thread too;
:class:`~nous_inbox.runner.Runner` still makes them inline (one short append each).

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

``events(after=seq)`` is every event of the session from a position on, live: the stored ones
first, then each as it is recorded (the owner's own, and sends other processes appended), with no
gap and no repeat between the two. A web client that reconnects resumes by its last seen ``seq``.

Design note: the threaded owner's worker decides when to run; for each turn it hands the turn to
the event loop (``run_coroutine_threadsafe``) and waits for its events. The cost is one parked
thread per *running* session, which buys one implementation of the wake rules for both faces.
A send from another process reaches an ``AsyncOwner`` exactly as it reaches an ``Owner``: its
watcher notices the store's version move.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final, Protocol

from nous_inbox.events import Event, MessageSent
from nous_inbox.inbox import Inbox, Target
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.port import SessionPort, sent_event
from nous_inbox.session import Session
from nous_inbox.store import MemoryStore, Store

__all__ = ["AsyncOwner", "AsyncTurnRunner"]

_DONE: Final = object()


class AsyncTurnRunner(Protocol):
    """What an ``AsyncOwner`` needs from a runner: one turn on a port, as an async stream."""

    def arun_turn(
        self, port: Any, *, reason: str = ..., cancel: asyncio.Event | None = ...
    ) -> AsyncIterator[Event]:
        """Run one turn; see ``nous_inbox.runner.Runner.arun_turn``."""


class _OnTheLoop:
    """The threaded owner's runner: each turn is run on the event loop, its events handed back."""

    def __init__(self, face: AsyncOwner, runner: AsyncTurnRunner,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._face = face
        self._runner = runner
        self._loop = loop

    def run_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        handed: queue.SimpleQueue[object] = queue.SimpleQueue()
        turn = asyncio.run_coroutine_threadsafe(self._pump(port, reason, cancel, handed), self._loop)
        while (item := handed.get()) is not _DONE:
            yield item  # type: ignore[misc]
        turn.result()  # a failure of the turn is the worker's, as with a threaded runner

    async def _pump(self, port: SessionPort, reason: str, cancel: threading.Event | None,
                    handed: queue.SimpleQueue[object]) -> None:
        stop = asyncio.Event()
        self._face._stop = stop
        if cancel is not None and cancel.is_set():
            stop.set()  # cancelled before the turn reached the loop
        try:
            async for event in self._runner.arun_turn(port, reason=reason, cancel=stop):
                handed.put(event)
        finally:
            self._face._stop = None
            handed.put(_DONE)


class AsyncOwner:
    """Holds one session (``stream`` in ``store``) and runs ``runner`` on the event loop whenever
    it should wake; use it as ``async with AsyncOwner(store, stream, runner) as owner``.

    ``runner`` is anything with ``arun_turn(port, *, reason, cancel)``: a
    :class:`~nous_inbox.runner.Runner`, or a pydantic-ai
    :class:`~nous_inbox.compat.pydantic_ai.AgentRunner`. ``watch`` and ``poll_interval`` are the
    threaded owner's (how it notices other processes' sends); ``workers`` bounds the threads
    store I/O uses. ``offload`` says whether store I/O goes to those threads; by default it does,
    except for a ``memory:`` store, whose "I/O" is a few microseconds of folding in this process
    and would cost more in the thread hop than in the call. ``start`` wakes right away, on
    opening, if the replayed inbox wants it (a waking message left queued by a previous process).
    """

    def __init__(
        self,
        store: Store,
        stream: str,
        runner: AsyncTurnRunner,
        *,
        watch: bool = True,
        poll_interval: float = 0.05,
        workers: int = 4,
        offload: bool | None = None,
        start: bool = True,
    ) -> None:
        if not callable(getattr(runner, "arun_turn", None)):
            raise TypeError(
                f"AsyncOwner needs a runner with arun_turn(port, *, reason, cancel); "
                f"{type(runner).__name__} has none"
            )
        self._store = store
        self._stream = stream
        self._runner = runner
        self._watch = watch
        self._start = start
        self._poll_interval = poll_interval
        self._offload = not isinstance(store, MemoryStore) if offload is None else bool(offload)
        self._io = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"nous-inbox io {stream}"
        )
        self._owner: Owner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._stop: asyncio.Event | None = None  # the running turn's cancel, set on the loop
        self._readers: set[asyncio.Queue[Event | None]] = set()

    async def _call(self, fn: Any, *args: Any) -> Any:
        if not self._offload:
            return fn(*args)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, fn, *args)

    @property
    def _live(self) -> Owner:
        if self._owner is None:
            raise RuntimeError(
                f"AsyncOwner of session {self._stream!r} is not open: use `async with AsyncOwner(...)`"
            )
        return self._owner

    # -- opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> AsyncOwner:
        if self._owner is not None:
            raise RuntimeError(f"AsyncOwner of session {self._stream!r} is already open")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        bridge = _OnTheLoop(self, self._runner, self._loop)
        # Opening takes the lease and replays the log: store I/O, so off the loop. It wakes
        # right away if the replayed inbox wants it (resume from the log).
        self._owner = await self._call(lambda: Owner(
            self._store, self._stream, bridge, listen=self._recorded, watch=self._watch,
            poll_interval=self._poll_interval, start=self._start,
        ))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel any run, wait for it to end, stop watching, give up the stream's lease.

        The store stays open (it is yours). Every ``events()`` reader ends.
        """
        owner = self._owner
        if owner is None:
            return
        self.cancel()
        await self._call(owner.close)
        self._owner = None
        for reader in self._readers:
            reader.put_nowait(None)
        self._io.shutdown(wait=False)

    # -- what a host reads ------------------------------------------------------------------------

    @property
    def stream(self) -> str:
        """The session's stream name in the store."""
        return self._stream

    @property
    def session(self) -> Session:
        """The session value as folded so far: equal to ``replay`` of the stored events."""
        return self._live.session

    @property
    def inbox(self) -> Inbox:
        """The inbox value now."""
        return self._live.inbox

    @property
    def transcript(self) -> list[Message]:
        """The transcript now, as a list."""
        return self._live.transcript

    @property
    def running(self) -> bool:
        """Whether a run is going (or about to start)."""
        return self._live.running

    async def events(self, after: int = 0) -> AsyncIterator[Event]:
        """Every event with ``seq > after``: the stored ones, then each as it is recorded, until
        the owner closes. Resume a stream by passing the last ``seq`` you saw."""
        live: asyncio.Queue[Event | None] = asyncio.Queue()
        # Listen first, read second: an event is then either in the read (stored before it)
        # or in ``live`` (published after we listened), possibly both; seq drops the repeat.
        self._readers.add(live)
        try:
            last = after
            for event in await self._call(lambda: list(self._live.events(after))):
                last = event.seq
                yield event
            while self._owner is not None or not live.empty():
                event = await live.get()
                if event is None:
                    return
                if event.seq > last:
                    last = event.seq
                    yield event
        finally:
            self._readers.discard(live)

    def _recorded(self, event: Event) -> None:
        # Called on whichever thread recorded the event, inside the owner's lock, in seq order;
        # the loop's callback queue keeps that order. With no reader there is nothing to tell:
        # a reader that registers later reads this event back from the store.
        loop = self._loop
        if not self._readers or loop is None or loop.is_closed():
            return
        if self._loop_thread == threading.get_ident():
            loop.call_soon(self._publish, event)  # no wake-up write needed on the loop itself
        else:
            loop.call_soon_threadsafe(self._publish, event)

    def _publish(self, event: Event) -> None:
        for reader in self._readers:
            reader.put_nowait(event)

    # -- what a host says -------------------------------------------------------------------------

    async def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` durably, then wake if it asks to and nothing runs.

        Bad input raises here, before anything is written. Returns the event as stored.
        """
        sent_event(message, target, wakeup)  # refuse bad input on the caller's own line
        owner = self._live
        stored: MessageSent = await self._call(owner.send, message, target, wakeup)
        return stored

    async def steer(self, message: Message | str) -> MessageSent:
        """Next step, wakes: "read this before your next model request"."""
        return await self.send(message, Target.NEXT_STEP, True)

    async def inject(self, message: Message | str) -> MessageSent:
        """Next step, no wake: "have this to hand if you make another request"."""
        return await self.send(message, Target.NEXT_STEP, False)

    async def followup(self, message: Message | str) -> MessageSent:
        """Next turn, wakes: "answer this after you finish what you are doing"."""
        return await self.send(message, Target.NEXT_TURN, True)

    async def prompt(self, text: Message | str) -> MessageSent:
        """A person's prompt: a turn of its own (recorded as ``"prompt"``), after any in progress."""
        sent_event(text, Target.NEXT_TURN, True)
        owner = self._live
        stored: MessageSent = await self._call(owner.prompt, text)
        return stored

    def cancel(self) -> bool:
        """End the current turn at its next boundary, as ``"cancelled"``; wake nothing after it.

        Returns whether a run was going. Queued messages stay queued.
        """
        owner = self._owner
        if owner is None:
            return False
        going = owner.cancel()
        if self._stop is not None:
            self._stop.set()
        return going

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no run is going; ``False`` if ``timeout`` seconds passed first.

        Re-raises (once) an exception that ended the last run, such as a failing model.
        """
        owner = self._live
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()

        def settle(outcome: Any, failed: bool) -> None:
            if not done.done():  # the awaiting task may have been cancelled meanwhile
                done.set_exception(outcome) if failed else done.set_result(outcome)

        def wait() -> None:
            outcome: Any
            try:
                outcome, failed = owner.wait_idle(timeout), False
            except BaseException as exc:
                outcome, failed = exc, True
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, outcome, failed)

        # A thread of its own, not the I/O pool: a long wait must never starve sends.
        threading.Thread(target=wait, name=f"nous-inbox wait {self._stream}", daemon=True).start()
        return await done

    def __repr__(self) -> str:
        state = "closed" if self._owner is None else f"version {self._owner.session.version}"
        return f"AsyncOwner({self._stream!r}, {state})"
