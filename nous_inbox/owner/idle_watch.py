"""How an owner watches its store: the one step both owners' watchers take, and, for an asyncio
owner, one watch while idle shared by every idle owner of a loop and store, instead of one look
each.

An owner notices what another process appended to its session (a steer from the command line, a
send from another host) by looking at the store's version of its stream. Both owners' watchers
take the same step (:func:`watch_step`): a lease taken over stops the watcher (the owner loses it, for
good); otherwise what others appended is folded in, and a look that fails is logged and tried
again. Both subscribe the same way (:func:`subscription`): a store that hints (PostgreSQL's
NOTIFY) is waited on, and one whose subscription fails is polled. Only their waiting differs: the
threaded :class:`~nous_inbox.owner.Owner` waits on a thread of its own, every ``poll_interval``
or at each hint; an :class:`~nous_inbox.owner.async_owner.AsyncOwner`'s :class:`OwnerWatch` does
the same while a run goes, so a steer reaches the run at its next step. An idle owner needs far
less, and a host holding a thousand idle sessions must keep neither a thousand looks a second
nor a thread each to make them. So an idle asyncio owner joins the one watch of its event loop
and store, which looks at every member's stream together, in one job on one thread of its own
(a :class:`~nous_inbox.owner.store_worker.LingeringThread`; on the loop for ``memory:``), every
:data:`IDLE_LOOK` seconds (a member whose store hints: when hinted), and wakes each member whose
look says its stream moved; the owner then takes its own step.

A send another process makes to an idle asyncio owner is so noticed within ``IDLE_LOOK`` seconds
(or the owner's ``every``, if longer) plus the time of one job. One look that stalls (a store
reconnecting) delays the others with it, as a store that stalls would delay them all alike.

>>> import asyncio
>>> from nous_inbox.events import Warned
>>> from nous_inbox.store import open_store
>>> store = open_store("memory:")
>>> async def main():
...     moved = asyncio.Event()
...     member = watch_idle(store, lambda: store.version("s") > 0, moved.set)
...     _ = store.append("s", [Warned(text="sent from elsewhere")])
...     await moved.wait()  # at the watch's next look
...     member.leave()
...     return "woken"
>>> asyncio.run(main())
'woken'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Any, ClassVar, Final

from nous_inbox.errors import LeaseLostError
from nous_inbox.owner.store_worker import LingeringThread, StoreWorker
from nous_inbox.store import Store

__all__ = [
    "IDLE_LOOK", "Member", "OwnerWatch", "check_poll_interval", "subscription", "taken_over",
    "watch_idle", "watch_step",
]

IDLE_LOOK: Final = 0.5
"""Seconds between two looks of the shared watch at its members' streams."""

logger: Final = logging.getLogger("nous_inbox.owner")

Look = Callable[[], bool]
"""A member's look, on the watch's thread (store I/O): whether its owner must look itself."""


def subscription(store: Store, stream: str, hint: Callable[[], object],
                 ) -> Callable[[], object] | None:
    """The store's hints for ``stream``, if it gives them: ``hint()`` is called (on the store's
    thread) each time the stream may have changed, and the watcher waits for that instead of
    polling. Returns the call that unsubscribes, or ``None`` to poll: a store without
    ``subscribe(stream, callback)``, or one whose subscription failed (logged)."""
    subscribe = getattr(store, "subscribe", None)
    if not callable(subscribe):
        return None
    try:
        unsubscribe = subscribe(stream, hint)
    except Exception:
        logger.exception("could not subscribe to session %r; polling", stream)
        return None
    return unsubscribe if callable(unsubscribe) else None


def check_poll_interval(value: object, who: str) -> float:
    """``value`` as the seconds between an owner's own looks at its store, refused naming
    ``who`` unless it is a positive, finite number.

    >>> check_poll_interval(0, "Owner")
    Traceback (most recent call last):
    ...
    ValueError: Owner: poll_interval must be a positive number of seconds, got 0.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{who}: poll_interval must be a number of seconds, "
                        f"got {type(value).__name__}")
    if not 0 < value < float("inf"):
        raise ValueError(f"{who}: poll_interval must be a positive number of seconds, "
                         f"got {float(value)!r}")
    return float(value)


def taken_over(lease: object, stream: str) -> LeaseLostError | None:
    """The watcher's look at an owner's ``lease``: the error to stop with when a renewal found
    it taken over by another owner, else ``None``."""
    if getattr(lease, "lost", False) is not True:
        return None
    return LeaseLostError(f"stream {stream!r}: this owner's lease was taken over by another owner",
                          stream=stream, epoch=getattr(lease, "epoch", 0))


def watch_step(stream: str, lost: Callable[[], LeaseLostError | None],
               lose: Callable[[LeaseLostError], object], catch_up: Callable[[], object]) -> bool:
    """One look of an owner's watcher at its store, made where the owner makes its store calls;
    whether to watch on. A lease taken over (``lost()`` says how) stops the watcher: the owner
    ``lose``s it and stops for good. Otherwise ``catch_up()`` folds in what other writers
    appended; one that fails is logged, and the next look tries again.

    >>> watch_step("s", lost=lambda: None, lose=print, catch_up=lambda: None)
    True
    """
    error = lost()
    if error is not None:
        lose(error)
        return False
    try:
        catch_up()
    except Exception:
        logger.exception("watching session %r failed; retrying", stream)
    return True


class Member:
    """One idle owner in its loop's watch, until :meth:`leave`. Every call is made on the loop."""

    __slots__ = ("_look", "_period", "_wake", "_watch", "due", "next_tick")

    def __init__(self, watch: _Watch, look: Look, wake: Callable[[], object],
                 period: int | None) -> None:
        self._watch, self._look, self._wake, self._period = watch, look, wake, period
        self.due = False  # hinted since the last look
        self.next_tick = watch.tick + (period or 0)

    def hint(self) -> None:
        """The store says this member's stream may have changed: look at it in the next job."""
        self.due = True
        self._watch.stir()

    def leave(self) -> None:
        """Leave the watch (the owner looks itself again, or is closing); a second call does
        nothing. The last to leave ends the watch: it leaves the table at once (so it holds
        neither loop nor store for a loop closed right after), and its task at its next turn."""
        watch = self._watch
        watch.members.discard(self)
        if not watch.members:
            watch.end()

    def looked(self) -> bool:
        """The member's look, on the watch's thread; a look that fails counts as moved, so its
        owner looks itself and says what failed."""
        try:
            return self._look()
        except Exception:
            return True

    def polled(self, tick: int) -> bool:
        """Whether the watch's ``tick`` is one this member is polled at (then its next is set)."""
        if self._period is None or tick < self.next_tick:
            return False
        self.next_tick = tick + self._period
        return True

    def wake(self) -> None:
        if self in self._watch.members:  # (not if it left while its look ran)
            self._wake()


def watch_idle(store: Store, look: Look, wake: Callable[[], object], *,
               every: float | None = IDLE_LOOK) -> Member:
    """Join the watch of the running loop and ``store``: ``look()`` runs on the watch's thread
    every ``every`` seconds (rounded up to whole ``IDLE_LOOK``; ``None``: only once hinted, see
    :meth:`Member.hint`), beside every other member's, and ``wake()`` is called on the loop when
    it returns true (or raises)."""
    if every is not None and not 0 < every < math.inf:
        raise ValueError(f"watch_idle: every must be a positive number of seconds or None, "
                         f"got {every!r}")
    loop = asyncio.get_running_loop()
    key = (id(loop), id(store))  # both held by the watch while it is in the table
    watch = _Watch.table.get(key)
    if watch is None or watch.task.done():
        watch = _Watch.table[key] = _Watch(loop, store, key)
    member = Member(watch, look, wake,
                    None if every is None else max(1, math.ceil(every / IDLE_LOOK - 1e-9)))
    watch.members.add(member)
    return member


class _Watch:
    """The watch of one loop and store: a task on the loop, its looks on one lingering thread."""

    table: ClassVar[dict[tuple[int, int], _Watch]] = {}  # (loop, store) -> its watch

    def __init__(self, loop: asyncio.AbstractEventLoop, store: Store, key: tuple[int, int]) -> None:
        self.loop, self.store, self.key = loop, store, key
        self.members: set[Member] = set()
        self.tick = 0
        self._stirred = asyncio.Event()
        blocking = getattr(store, "blocking", True)  # (``memory:`` is looked at on the loop)
        self._thread = LingeringThread("nous-inbox idle watch") if blocking else None
        self.task = loop.create_task(self._run(), name="nous-inbox idle watch")
        self.task.add_done_callback(self._gone)

    def stir(self) -> None:
        self._stirred.set()

    def end(self) -> None:
        """No member is left: out of the table now (the next member joins a new watch), and the
        task ends as soon as it runs."""
        if _Watch.table.get(self.key) is self:
            del _Watch.table[self.key]
        self.stir()

    async def _run(self) -> None:
        loop = self.loop
        next_at = loop.time() + IDLE_LOOK
        while self.members:
            if (wait := next_at - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stirred.wait(), wait)
            self._stirred.clear()
            ticked = loop.time() >= next_at
            if ticked:
                self.tick += 1
                next_at = loop.time() + IDLE_LOOK
            due = [member for member in self.members
                   if member.due or (ticked and member.polled(self.tick))]
            for member in due:
                member.due = False
            if due:
                moved = (_looked(due) if self._thread is None
                         else await loop.run_in_executor(self._thread, _looked, due))
                for member in moved:
                    member.wake()

    def _gone(self, task: asyncio.Task[None]) -> None:
        """The task ended (its last member left, or its loop is closing): out of the table, so
        the next member joins a new watch, and its thread goes. A member still in it (the watch
        failed) is woken, to look itself and join the next."""
        self.end()
        if self._thread is not None:
            self._thread.shutdown(wait=False)
        if not task.cancelled() and task.exception() is not None:
            logger.error("the idle watch of %r failed", self.store, exc_info=task.exception())
        for member in tuple(self.members):
            member.wake()


def _looked(members: list[Member]) -> list[Member]:
    """On the watch's thread: the members whose look says their owner must look itself."""
    return [member for member in members if member.looked()]


class OwnerWatch:
    """One asyncio owner's watch of its store, a task on the loop (``task``) from the owner's
    open to its close. While ``running()`` it looks itself, every ``every`` seconds or, when
    the store hints (:func:`subscription`, made where ``io`` runs store calls, and ``io``'s to
    hold, so giving the stream back drops it), at each hint. While idle it waits in its loop's
    shared watch (:func:`watch_idle`), which makes the look ``behind()`` for it and wakes it
    when that says the stream moved. Each of its own looks is the step both owners take
    (:func:`watch_step`: ``lost``, ``lose``, ``catch_up``), where ``io`` runs store calls. When to look
    is the watch's; what a look finds and does stays the owner's, through these callbacks."""

    def __init__(
        self, io: StoreWorker, store: Store, stream: str, every: float, *,
        running: Callable[[], bool], behind: Look, lost: Callable[[], LeaseLostError | None],
        lose: Callable[[LeaseLostError], object], catch_up: Callable[[], object],
    ) -> None:
        self._io, self._store, self._stream, self._every = io, store, stream, every
        self._running, self._behind, self._lost, self._lose = running, behind, lost, lose
        self._catch_up = catch_up
        self._look: asyncio.Event | None = None  # set: the watch looks at the store now
        self.task = asyncio.get_running_loop().create_task(self._watch(),
                                                           name=f"nous-inbox watch {stream}")

    def run_started(self) -> None:
        """A run started: a watch waiting among the idle ones looks itself from now on."""
        if self._look is not None:
            self._look.set()

    def stop(self) -> None:
        """Stop watching (called from the watch's own task, it ends as that returns)."""
        if self.task is not asyncio.current_task():
            self.task.cancel()

    async def stopped(self, caller: asyncio.Task[Any] | None) -> None:
        """Stop watching and wait until the watch has, unless ``caller`` (the task an owner's
        close was called from) is the watch's own: it ends as that returns."""
        if self.task is not caller:
            self.task.cancel()
            await asyncio.wait((self.task,))

    async def _watch(self) -> None:
        loop, woken, io = asyncio.get_running_loop(), asyncio.Event(), self._io
        self._look = woken

        def hinted() -> None:  # the store's hint, from its thread
            with contextlib.suppress(RuntimeError):  # the loop is gone
                loop.call_soon_threadsafe(lambda: woken.set() if idle is None else idle.hint())

        idle: Member | None = None
        await io.subscribe(subscription, self._store, self._stream, hinted)
        while True:
            if not self._running():
                idle = watch_idle(self._store, self._behind, woken.set,
                                  every=None if io.subscribed else self._every)
                try:
                    await woken.wait()
                finally:
                    idle.leave()
                    idle = None
            elif io.subscribed:
                await woken.wait()
            else:
                await asyncio.sleep(self._every)
            woken.clear()
            if not await io.call(watch_step, self._stream, self._lost, self._lose, self._catch_up):
                return
