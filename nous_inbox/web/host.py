"""SessionHost: one asyncio process holding owners for many sessions of one store.

A web service hosts many sessions, not one ``AsyncOwner`` each by hand. The host opens an owner
for a session when someone writes to it or when its log shows it wants a wake, lets an idle one
go after ``idle_timeout`` seconds, and holds at most ``max_sessions`` at once, which also bounds
how many run at once. Whether a session wants a wake is the inbox's decision
(``Inbox.worth_waking``), and what an owner does once open is the owner's: the host only decides
which sessions to hold. A held idle session costs its memory and little else: its owner's store
worker lets its thread go, and one watch looks for every idle owner of the loop at once
(:mod:`nous_inbox.owner.idle_watch`), so another process's send to it is noticed within half a second.

Several hosts (processes, machines) may share one store: a session is held by whichever takes its
owner lease first, and a host that holds more waits a little longer before it tries (a random
delay of up to ``FAIR_SPREAD`` seconds times the share of its slots in use), so a pool spreads
the sessions that wake rather than one process taking them all. A send to a session held elsewhere, or arriving while this host is full, is
appended to the log, where its holder's watcher (or a host's scan, once a slot frees or a lease
expires) picks it up. A host whose process dies leaves its turns open in the log; another host's
scan sees a session that is running or wants a wake, takes it once the lease has expired, and the
owner's resume closes the interrupted turn (ruling 2: nothing queued is lost).

A rolling restart does not wait for leases: :meth:`SessionHost.drain` takes no more sessions and
hands each held one over at its run's next boundary (:mod:`nous_inbox.owner.handover`); on
PostgreSQL each lease given back is a notification, on which the other hosts take the session at
once, and carry its turn on.

>>> import asyncio
>>> from nous_inbox.runner import Runner
>>> from nous_inbox.store import open_store
>>> async def main():
...     agent = lambda session: Runner(lambda transcript, tools: "done")
...     async with SessionHost(open_store("memory:"), agent) as host:
...         sent = await host.send("s1", "prompt", "start")
...         owner = host.hosted("s1")
...         await owner.wait_idle()
...         return sent.seq, [m.content for m in owner.transcript]
>>> asyncio.run(main())
(1, ['start', 'done'])
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TypeVar

from nous_inbox.errors import StreamOwnedError
from nous_inbox.events import Event, MessageSent
from nous_inbox.inbox import is_blank
from nous_inbox.message import Message
from nous_inbox.observe.metrics import Metrics
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.port import AsyncTurnRunner, request_cancel
from nous_inbox.owner.receipts import receipt_in, request_withdraw
from nous_inbox.owner.turn_result import AsyncTurnHandle
from nous_inbox.receipts import Receipt
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.runner.tracing import carried
from nous_inbox.session import Session
from nous_inbox.store import Store
from nous_inbox.store.base import check_stream
from nous_inbox.store.journal import send_to
from nous_inbox.store.snapshot import load_session
from nous_inbox.verbs import as_verb
from nous_inbox.web.reads import caught_up, read_after, released_last

__all__ = ["FAIR_SPREAD", "AgentFactory", "SessionHost", "checked_text"]

logger: Final = logging.getLogger("nous_inbox.web")

#: The longest a host with every slot in use would wait before it tries to take a session that
#: wants a holder (one with none in use tries at once): the pool's fair rule, in seconds.
FAIR_SPREAD: Final = 0.2

_T = TypeVar("_T")

AgentFactory = Callable[[str], AsyncTurnRunner]
"""Makes the runner for a session, given its name: ``factory("s1") -> Runner(...)``."""


def checked_text(text: object) -> Message:
    """The user message ``text`` makes, refused as the command line refuses it: not a str, empty
    or whitespace only, or no UTF-8 form (``ValueError`` or ``TypeError`` saying which).

    >>> checked_text("go").content
    'go'
    >>> checked_text("  ")
    Traceback (most recent call last):
    ...
    ValueError: text is empty; an empty message is never worth a model round
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    message = Message.user(text)  # refuses a text with no UTF-8 form
    if is_blank([message]):  # the inbox's one blank test (ruling 4)
        raise ValueError("text is empty; an empty message is never worth a model round")
    return message


class SessionHost:
    """Holds owners for the sessions of ``store``, each made with ``agent(session)``'s runner;
    use it as ``async with SessionHost(store, agent) as host``.

    ``scan_interval`` is how often the host looks through the store for sessions that want a
    wake and for idle ones to let go (``None``: never; sessions are then taken only by a send);
    ``poll_interval`` is how often an event stream of a session held elsewhere reads the store.
    ``owner_options`` go to each ``AsyncOwner``. ``metrics`` counts what the host's owners and
    store do (:mod:`nous_inbox.observe.metrics`): a registry of the host's own by default.
    """

    def __init__(
        self,
        store: Store,
        agent: AgentFactory,
        *,
        max_sessions: int = 100,
        idle_timeout: float = 60.0,
        scan_interval: float | None = 1.0,
        poll_interval: float = 0.2,
        owner_options: dict[str, Any] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if not callable(agent):
            raise TypeError(f"SessionHost: agent must be a callable factory, got {type(agent).__name__}")
        if metrics is not None and not isinstance(metrics, Metrics):
            raise TypeError(f"SessionHost: metrics must be a Metrics, got {type(metrics).__name__}")
        if type(max_sessions) is not int or max_sessions < 1:
            raise ValueError(f"SessionHost: max_sessions must be an int >= 1, got {max_sessions!r}")
        for name, value in (("idle_timeout", idle_timeout), ("poll_interval", poll_interval),
                            ("scan_interval", 1.0 if scan_interval is None else scan_interval)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"SessionHost: {name} must be a positive number of seconds, got {value!r}")
        self.store = store
        self._agent = agent
        self.max_sessions = max_sessions
        self.idle_timeout = float(idle_timeout)
        self._scan_interval = scan_interval
        self._poll_interval = float(poll_interval)
        self._owner_options = dict(owner_options or {})
        self.metrics = Metrics() if metrics is None else metrics
        """What the host's owners and store do, for ``/metrics``."""
        self._untime: Callable[[], None] | None = None  # stops timing the store's appends
        self._owners: dict[str, AsyncOwner] = {}
        self._taking: dict[str, asyncio.Task[AsyncOwner | None]] = {}  # opens under way
        self._seen: dict[str, tuple[int, float]] = {}  # held session -> (version, since when)
        self._known: dict[str, Session] = {}  # sessions not held here, folded as far as read
        self._retry_at: dict[str, float] = {}  # held elsewhere: when to try its lease again
        self._cursor: object = None  # the store's cursor after the last scan (None: look at all)
        self._wake_wanted: set[str] = set()  # seen wanting a wake, not held here: looked at each scan
        self._io: concurrent.futures.ThreadPoolExecutor | None = None
        self._scanner: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()
        """Set when the host stops: every event stream ends."""
        self._taken = asyncio.Event()  # set (and replaced) when a session is taken or the host stops
        self._draining = False
        self._wanting: set[asyncio.Task[None]] = set()  # takes a lease given back elsewhere asked
        self._unhear: Callable[[], None] | None = None

    # -- opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> SessionHost:
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nous-inbox host")
        hear = getattr(self.store, "subscribe_released", None)  # PostgreSQL's NOTIFY
        if callable(hear):
            loop = asyncio.get_running_loop()
            self._unhear = hear(lambda stream: loop.call_soon_threadsafe(self._released, stream))
        self._untime = self.metrics.observe_store(self.store)
        if self._scan_interval is not None:
            self._scanner = asyncio.get_running_loop().create_task(self._scan(), name="nous-inbox scan")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End every event stream, stop scanning, close every owner (their leases go back)."""
        self.stopping.set()
        self._taken.set()
        self._stop_taking()
        if self._scanner is not None:
            await asyncio.gather(self._scanner, return_exceptions=True)
        await asyncio.gather(*self._taking.values(), return_exceptions=True)
        owners, self._owners = list(self._owners.values()), {}
        await asyncio.gather(*(owner.aclose() for owner in owners), return_exceptions=True)
        if self._io is not None:
            self._io.shutdown(wait=True)
        if self._untime is not None:
            self._untime()

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` began: the host takes no session any more, and ``/readyz`` says
        it is not ready, so a balancer sends its requests elsewhere."""
        return self._draining

    async def drain(self, timeout: float = 10.0) -> None:
        """Let every held session go for another host to take at once (a rolling restart):
        take no more (a send to a session not held here is appended to the log, where its next
        holder reads it), then hand each owner over: an idle one at once, a running one at its
        run's next boundary, or cut off after ``timeout`` seconds (its turn then closed by the
        next holder as a takeover closes it). Each records a ``SessionReleased`` and gives its
        lease back. Event streams go on, read from the store, until :meth:`aclose`."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise ValueError(f"drain: timeout must be a number of seconds >= 0, got {timeout!r}")
        self._draining = True
        self._stop_taking()
        await asyncio.gather(*self._taking.values(), return_exceptions=True)
        owners = list(self._owners.items())
        await asyncio.gather(*(owner.aclose(timeout, hand_over=True) for _, owner in owners),
                             return_exceptions=True)
        for name, owner in owners:
            self._drop(name, owner)
            self._known[name] = owner.session
        self._taken.set()  # an event stream of a session let go reads the store from now on
        self._taken = asyncio.Event()

    def _stop_taking(self) -> None:
        if self._unhear is not None:
            self._unhear()
            self._unhear = None
        if self._scanner is not None:
            self._scanner.cancel()
        for wanting in list(self._wanting):
            wanting.cancel()

    def _released(self, stream: str) -> None:
        """On the loop: another holder gave ``stream``'s lease back; take it now if it wants a
        holder, or its holder handed it over (a drain's, so the pool keeps holding it)."""
        if stream not in self._owners and not self._draining and not self.stopping.is_set():
            self._retry_at.pop(stream, None)
            self.want(stream, handed_over=True)

    def want(self, session: str, *, handed_over: bool = False) -> None:
        """Take ``session`` soon if it wants a holder (it is running: its holder let it go or
        died; or a waking message is queued; or, ``handed_over``, its log ends with a
        ``SessionReleased``) and this host has a slot, after the pool's fair delay (see
        ``FAIR_SPREAD``); what happens is logged, never raised."""
        ahead = len(self._taking) + len(self._wanting)  # a burst: each waits behind the others
        task = asyncio.get_running_loop().create_task(self._want(session, ahead, handed_over))
        self._wanting.add(task)
        task.add_done_callback(self._wanting.discard)

    async def _want(self, name: str, ahead: int, handed_over: bool) -> None:
        try:
            known = await self.call(caught_up, self.store, name, self._known.get(name))
            self._known[name] = known
            if not (known.running or known.inbox.worth_waking()) and not (
                    handed_over and await self.call(released_last, self.store, name, known)):
                return
            load = (len(self._owners) + ahead) / self.max_sessions
            if load:
                await asyncio.sleep(random.random() * FAIR_SPREAD * min(load, 1.0))
            await self.take(name)
        except asyncio.CancelledError:
            raise
        except Exception:  # one session's failure (its log, its agent) is not the others'
            logger.exception("could not take session %r; trying again at the next scan", name)

    # -- what the web face asks -------------------------------------------------------------------

    def hosted(self, session: str) -> AsyncOwner | None:
        """The owner this host holds for ``session``, or ``None``."""
        owner = self._owners.get(session)
        return None if owner is None or owner.closed else owner

    @property
    def held(self) -> list[str]:
        """The sessions this host holds now, sorted."""
        return sorted(name for name, owner in self._owners.items() if not owner.closed)

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the host's store thread: store calls block, the loop must not."""
        if self._io is None:
            raise RuntimeError("SessionHost is not open: use `async with SessionHost(...)`")
        return await asyncio.wrap_future(self._io.submit(fn, *args))

    async def sessions(self) -> list[str]:
        """The sessions in the store and those held here (one may be new), sorted."""
        stored = await self.call(self.store.streams)
        return sorted(set(stored).union(self.held))

    def known(self, session: str) -> Session | None:
        """What this host knows of ``session`` without reading the store: its owner's state if
        held here, else the state its last scan read (``None``: not read). A list of many
        sessions shows this, so it costs no replay whatever the store holds."""
        owner = self.hosted(session)
        return owner.session if owner is not None else self._known.get(session)

    async def session(self, session: str) -> Session | None:
        """``session``'s state: the owner's if held here, else replayed from the store; ``None``
        for a session that has no events."""
        check_stream(session)
        owner = self.hosted(session)
        if owner is not None:
            return owner.session
        loaded = await self.call(load_session, self.store, session)
        return loaded.session if loaded.session.version else None

    async def send(self, session: str, mode: str, text: object) -> MessageSent:
        """Send ``text`` to ``session`` with the verb called ``mode`` (one of
        :data:`~nous_inbox.verbs.VERBS`: steer, inject, followup, prompt); returns the event once
        it is stored. Bad input raises before anything is written.

        Held here (or taken now): the owner's verb. Held elsewhere, or this host is full: the send
        is appended to the log as it is (a prompt as a followup, a turn of its own only for the
        owner that opens it) by :func:`~nous_inbox.store.journal.send_to`, which stores it once
        even when the store could not learn an append's outcome, and the holder's watcher picks
        it up.
        """
        check_stream(session)
        verb = as_verb(mode, "mode")
        message = carried(checked_text(text))  # the request's span, for the claiming step
        owner = await self.take(session)
        if owner is not None:
            try:
                sending = getattr(owner, verb.name)(message)  # prompt, followup: a turn's handle
                sent: MessageSent = await (sending.stored() if isinstance(sending, AsyncTurnHandle)
                                           else sending)
                return sent
            except RuntimeError:
                # Closed meanwhile (let go as idle, or its lease taken over): refused before
                # anything was written, so the log takes it instead.
                if not owner.closed:
                    raise
                self._drop(session, owner)
        return await self.call(send_to, self.store, session, message, verb.target, verb.wakeup)

    async def cancel(self, session: str) -> bool:
        """Cancel ``session``'s run wherever it is held: here, by the owner's ``cancel()``;
        elsewhere, by a request in the log its holder folds in
        (:func:`~nous_inbox.owner.port.request_cancel`). Whether a run was going here, or a
        request was recorded for one held elsewhere."""
        check_stream(session)
        owner = self.hosted(session)
        if owner is not None and not owner.closed:
            return owner.cancel()
        return await self.call(request_cancel, self.store, session) is not None

    async def receipt(self, session: str, seq: int) -> Receipt:
        """Where the send at ``seq`` of ``session`` went (:mod:`nous_inbox.receipts`): from the
        owner while it is held here, else from the store's log. ``LookupError`` when the session
        has no event at ``seq``; ``ValueError`` when the event there is not a send."""
        check_stream(session)
        owner = self.hosted(session)
        if owner is not None and not owner.closed:
            return await owner.receipt(seq)
        return await self.call(receipt_in, self.store, session, seq)

    async def withdraw(self, session: str, seq: int) -> Receipt:
        """Take back the message the send at ``seq`` queued, wherever ``session`` is held
        (here: the owner's ``withdraw``; elsewhere: a ``MessageWithdrawn`` in the log its holder
        folds in, :func:`~nous_inbox.owner.receipts.request_withdraw`); a message already
        claimed answers where it went."""
        check_stream(session)
        owner = self.hosted(session)
        if owner is not None:
            try:
                return await owner.withdraw(seq)
            except RuntimeError:
                if not owner.closed:  # closed meanwhile: the log takes it, as a send's does
                    raise
        return await self.call(request_withdraw, self.store, session, seq)

    async def events(self, session: str, after: int = 0, *,
                     deltas: bool = False) -> AsyncIterator[Event | TextDelta]:
        """Every event of ``session`` with ``seq > after``, live, until the host stops: from the
        owner while it is held here, else read from the store every ``poll_interval`` (or at
        once when this host takes the session). ``deltas``: the model's text as it streams
        too, while the session is held here (see ``AsyncOwner.events``)."""
        check_stream(session)
        if type(after) is not int or after < 0:
            raise ValueError(f"after must be an int >= 0 (a seq), got {after!r}")
        last = after
        while not self.stopping.is_set():
            owner = self.hosted(session)
            if owner is not None:
                with contextlib.suppress(RuntimeError):  # closed meanwhile: read the store
                    async for item in owner.events(last, deltas=deltas):
                        if not isinstance(item, TextDelta):
                            last = item.seq
                        yield item
                continue
            taken = self._taken
            events = await self.call(read_after, self.store, session, last)
            for event in events:
                last = event.seq
                yield event
            if not events:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(taken.wait(), self._poll_interval)

    async def take(self, session: str) -> AsyncOwner | None:
        """The owner of ``session``, opened here if its lease is free and a slot is; ``None``
        when another process holds it or this host is full."""
        owner = self.hosted(session)
        if owner is not None:
            return owner
        opening = self._taking.get(session)
        if opening is None:
            if (self._draining or self.stopping.is_set()
                    or len(self.held) + len(self._taking) >= self.max_sessions):
                return None
            opening = asyncio.get_running_loop().create_task(self._open(session))
            self._taking[session] = opening
            opening.add_done_callback(lambda _: self._taking.pop(session, None))
        # Shielded: a caller that stops waiting (a client gone) leaves the open to the others.
        return await asyncio.shield(opening)

    async def _open(self, session: str) -> AsyncOwner | None:
        owner = AsyncOwner(self.store, session, self._agent(session), **self._owner_options)
        self.metrics.attach(owner)  # before it opens: a turn its open closes is a takeover
        try:
            await owner.__aenter__()
        except StreamOwnedError:
            # Held elsewhere: ask again once its holder could have died and its lease lapsed.
            self._retry_at[session] = time.monotonic() + getattr(self.store, "lease", 0.5) / 2
            return None
        if self.stopping.is_set() or self._draining:  # nobody would close it: let it go
            await owner.aclose(hand_over=self._draining)
            return None
        self._owners[session] = owner
        self._known.pop(session, None)
        self._seen[session] = (-1, time.monotonic())
        self._taken.set()  # an event stream of it reads from its owner now, deltas and all
        self._taken = asyncio.Event()
        return owner

    def _drop(self, session: str, owner: AsyncOwner) -> None:
        if self._owners.get(session) is owner:
            del self._owners[session]
            self._seen.pop(session, None)

    # -- the scan: sessions that want a wake, idle ones to let go ---------------------------------

    async def _scan(self) -> None:
        assert self._scan_interval is not None
        while True:
            try:
                await self.scan()
            except Exception:
                logger.exception("scanning the store for sessions failed; trying again")
            await asyncio.sleep(self._scan_interval)

    async def scan(self) -> None:
        """One look for the sessions that want a wake: take each that is running (its owner
        died) or wants a wake and is not held here; let go of held ones idle for
        ``idle_timeout`` with nothing queued that asks for a wake.

        A look reads only what moved since the last (``Store.moved``; the first is a full
        one), and the sessions last seen wanting a wake that another holds, or that this host
        could not take: so an idle host over many sessions costs what changed, not what is
        stored, and a session whose holder died is taken once its lease lets it be."""
        now = time.monotonic()
        look: set[str] = set()
        for name, owner in list(self._owners.items()):
            if owner.closed:  # its lease was taken over, or it failed: looked at again below
                self._drop(name, owner)
                look.add(name)
                continue
            session = owner.session
            version, since = self._seen.get(name, (-1, now))
            if session.version != version:
                self._seen[name] = (session.version, now)
            elif (now - since >= self.idle_timeout and not session.running
                  and not session.inbox.worth_waking()):
                # A waking entry its owner leaves queued (a cancelled run's, ruling 9) keeps the
                # session held: taken back, a fresh owner would wake for it with no new send.
                self._drop(name, owner)
                await owner.aclose()
                self._known[name] = owner.session
        moved = await self.call(self.store.moved, self._cursor)
        self._cursor = moved.cursor
        if moved.full:  # what the host knew of a stream no longer there is let go
            stored = set(moved.streams)
            for gone in [name for name in self._known if name not in stored]:
                del self._known[gone]
            self._wake_wanted &= stored
        look.update(moved.streams, self._wake_wanted)
        for name in sorted(look):
            if name in self._owners:  # held here: its owner watches it
                self._wake_wanted.discard(name)
                continue
            if name in self._taking or self._retry_at.get(name, 0) > now:
                self._wake_wanted.add(name)  # looked at again: the cursor has moved past it
                continue
            try:
                known = await self.call(caught_up, self.store, name, self._known.get(name))
                self._known[name] = known
                if known.running or known.inbox.worth_waking():
                    self._wake_wanted.add(name)  # until it is taken, here or elsewhere
                    self.want(name)  # at once, or after the pool's fair delay
                else:
                    self._wake_wanted.discard(name)
            except Exception:  # one session's failure (its log, its agent) is not the others'
                self._wake_wanted.add(name)
                logger.exception("could not take session %r; trying again at the next scan", name)
