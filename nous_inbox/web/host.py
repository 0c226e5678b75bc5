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
owner lease first. A send to a session held elsewhere, or arriving while this host is full, is
appended to the log, where its holder's watcher (or a host's scan, once a slot frees or a lease
expires) picks it up. A host whose process dies leaves its turns open in the log; another host's
scan sees a session that is running or wants a wake, takes it once the lease has expired, and the
owner's resume closes the interrupted turn (ruling 2: nothing queued is lost).

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
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TypeVar

from nous_inbox.errors import StreamOwnedError
from nous_inbox.events import Event, MessageSent
from nous_inbox.inbox import is_blank
from nous_inbox.message import Message
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.port import AsyncTurnRunner, request_cancel
from nous_inbox.owner.receipts import receipt_in, request_withdraw
from nous_inbox.owner.turn_result import AsyncTurnHandle
from nous_inbox.receipts import Receipt
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.session import Session, replay
from nous_inbox.store import Store
from nous_inbox.store.base import check_stream
from nous_inbox.store.journal import send_to
from nous_inbox.store.snapshot import load_session
from nous_inbox.verbs import as_verb

__all__ = ["AgentFactory", "SessionHost", "checked_text"]

logger: Final = logging.getLogger("nous_inbox.web")

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
    ``owner_options`` go to each ``AsyncOwner``.
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
    ) -> None:
        if not callable(agent):
            raise TypeError(f"SessionHost: agent must be a callable factory, got {type(agent).__name__}")
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
        self._owners: dict[str, AsyncOwner] = {}
        self._taking: dict[str, asyncio.Task[AsyncOwner | None]] = {}  # opens under way
        self._seen: dict[str, tuple[int, float]] = {}  # held session -> (version, since when)
        self._known: dict[str, Session] = {}  # sessions not held here, folded as far as read
        self._retry_at: dict[str, float] = {}  # held elsewhere: when to try its lease again
        self._io: concurrent.futures.ThreadPoolExecutor | None = None
        self._scanner: asyncio.Task[None] | None = None
        self.stopping = asyncio.Event()
        """Set when the host stops: every event stream ends."""
        self._taken = asyncio.Event()  # set (and replaced) when a session is taken or the host stops

    # -- opening and closing ----------------------------------------------------------------------

    async def __aenter__(self) -> SessionHost:
        self._io = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="nous-inbox host")
        if self._scan_interval is not None:
            self._scanner = asyncio.get_running_loop().create_task(self._scan(), name="nous-inbox scan")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End every event stream, stop scanning, close every owner (their leases go back)."""
        self.stopping.set()
        self._taken.set()
        if self._scanner is not None:
            self._scanner.cancel()
            await asyncio.gather(self._scanner, return_exceptions=True)
        await asyncio.gather(*self._taking.values(), return_exceptions=True)
        owners, self._owners = list(self._owners.values()), {}
        await asyncio.gather(*(owner.aclose() for owner in owners), return_exceptions=True)
        if self._io is not None:
            self._io.shutdown(wait=True)

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
        message = checked_text(text)
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
            events = await self.call(_read, self.store, session, last)
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
            if self.stopping.is_set() or len(self.held) + len(self._taking) >= self.max_sessions:
                return None
            opening = asyncio.get_running_loop().create_task(self._open(session))
            self._taking[session] = opening
            opening.add_done_callback(lambda _: self._taking.pop(session, None))
        # Shielded: a caller that stops waiting (a client gone) leaves the open to the others.
        return await asyncio.shield(opening)

    async def _open(self, session: str) -> AsyncOwner | None:
        owner = AsyncOwner(self.store, session, self._agent(session), **self._owner_options)
        try:
            await owner.__aenter__()
        except StreamOwnedError:
            # Held elsewhere: ask again once its holder could have died and its lease lapsed.
            self._retry_at[session] = time.monotonic() + getattr(self.store, "lease", 0.5) / 2
            return None
        if self.stopping.is_set():  # the host closed while it opened: nobody would close it
            await owner.aclose()
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
        """One look through the store: take each session that is running (its owner died) or
        wants a wake and is not held here; let go of held ones idle for ``idle_timeout`` with
        nothing queued that asks for a wake."""
        now = time.monotonic()
        for name, owner in list(self._owners.items()):
            if owner.closed:  # its lease was taken over
                self._drop(name, owner)
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
        for name in await self.call(self.store.streams):
            if name in self._owners or name in self._taking or self._retry_at.get(name, 0) > now:
                continue
            try:
                known = await self.call(_caught_up, self.store, name, self._known.get(name))
                self._known[name] = known
                if known.running or known.inbox.worth_waking():
                    await self.take(name)
            except Exception:  # one session's failure (its log, its agent) is not the others'
                logger.exception("could not take session %r; trying again at the next scan", name)


def _read(store: Store, session: str, after: int) -> list[Event]:
    return list(store.read(session, after))


def _caught_up(store: Store, session: str, known: Session | None) -> Session:
    """``known`` with every event the store has after it folded in (replayed from the start, or
    from a snapshot, the first time)."""
    if known is None:
        return load_session(store, session).session
    if store.version(session) == known.version:
        return known
    return replay(store.read(session, known.version), start=known, stream=session)
