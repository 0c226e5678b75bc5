"""The two faces of the owner, for running one semantic suite against both.

``test_owner.py`` is written against the threaded ``Owner``'s calls. ``AsyncOwnerFromThreads``
gives an ``AsyncOwner`` those same calls: it keeps an event loop on a thread of its own, opens the
``AsyncOwner`` there, and sends each call to it, so every rule is exercised through the asyncio
face (awaited sends, turns on the loop through ``arun_turn``) while the tests stay as written.
Reads (``session``, ``events()``, ``inbox``, ...) are the same on both faces and pass through.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from nous_inbox.events import Event, MessageSent
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.sends import Stored
from nous_inbox.owner.turn_result import AsyncTurnHandle, TurnHandle
from nous_inbox.receipts import Receipt
from nous_inbox.store import Store
from nous_inbox.verbs import Target

__all__ = ["FACES", "AsyncOwnerFromThreads", "build"]

#: The threaded owner; the AsyncOwner as its store places its calls (``memory:``: inline on the
#: loop); and the AsyncOwner with every store call on its worker thread (``offload=True``), the
#: path a durable store takes, where sends arriving together share one commit.
FACES = ("Owner", "AsyncOwner", "AsyncOwner+worker")

_T = TypeVar("_T")


class AsyncOwnerFromThreads:
    """An ``AsyncOwner`` answering the threaded owner's calls (for the shared suite)."""

    def __init__(self, store: Store, stream: str, runner: Any, **kwargs: Any) -> None:
        listen = kwargs.pop("listen", None)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="async owner face")
        self._thread.start()
        self._face = AsyncOwner(store, stream, runner, **kwargs)
        if listen is not None:
            self._face.listen(listen)  # before opening: it sees the resume, as Owner's does
        try:
            self._do(self._face.__aenter__())
        except BaseException:
            self._stop_loop()
            raise

    def _on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def _do(self, work: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _verb(self, verb: str, *args: Any) -> MessageSent:
        if not self._on_loop():
            return self._do(getattr(self._face, verb)(*args))
        # A listener runs on the loop, where a sync callback cannot await: its send commits at
        # once, as the threaded owner's listener's does.
        with self._face.at_once():
            sent = getattr(self._face, verb)(*args)
        assert isinstance(sent, Stored)  # done already: nothing to await
        return sent.value

    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        return self._verb("send", message, target, wakeup)

    def steer(self, message: Message | str) -> MessageSent:
        return self._verb("steer", message)

    def inject(self, message: Message | str) -> MessageSent:
        return self._verb("inject", message)

    def _turn_verb(self, verb: str, *args: Any, **options: Any) -> TurnHandle:
        """A prompt or followup: the threaded owner's handle, over the AsyncOwner's."""
        if self._on_loop():
            with self._face.at_once():  # as _verb's (see there)
                handle: AsyncTurnHandle = getattr(self._face, verb)(*args, **options)
        else:
            async def stored() -> AsyncTurnHandle:
                handle = getattr(self._face, verb)(*args, **options)
                await handle.stored()
                return handle
            handle = self._do(stored())

        def result(seq: int, timeout: float | None) -> Any:
            return self._do(handle.result(timeout))

        return TurnHandle(handle.sent, result)

    def followup(self, message: Message | str, **options: Any) -> TurnHandle:
        return self._turn_verb("followup", message, **options)

    def prompt(self, message: Message | str, **options: Any) -> TurnHandle:
        return self._turn_verb("prompt", message, **options)

    def turn_result(self, turn: int) -> Any:
        return self._do(self._face.turn_result(turn))

    def turn_handle(self, seq: int) -> TurnHandle:
        async def rebuilt() -> AsyncTurnHandle:
            return await self._face.turn_handle(seq)
        handle = self._do(rebuilt())

        def result(seq: int, timeout: float | None) -> Any:
            return self._do(handle.result(timeout))

        return TurnHandle(handle.sent, result)

    def withdraw(self, seq: int) -> Receipt:
        return self._do(self._face.withdraw(seq))

    def delivered(self, seq: int, timeout: float | None = None) -> Receipt:
        return self._do(self._face.delivered(seq, timeout))

    def cancel(self) -> bool:
        if self._on_loop():  # a listener's: the loop is this thread
            return self._face.cancel()

        async def cancel() -> bool:
            return self._face.cancel()
        return self._do(cancel())

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self._do(self._face.wait_idle(timeout))

    def events(self, after: int = 0) -> list[Event]:
        async def read() -> list[Event]:
            out = []
            async for event in self._face.events(after):
                out.append(event)
                if event.seq >= self._face.session.version:
                    break
            return out
        if self._face.session.version <= after:
            return []
        return self._do(read())

    def close(self) -> None:
        try:
            self._do(self._face.aclose())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> AsyncOwnerFromThreads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._face, name)  # reads: the same on both faces


def build(face: str, store: Store, stream: str, runner: Any, **kwargs: Any) -> Any:
    """An owner of the named face, over the same store, stream and runner."""
    if face == "Owner":
        return Owner(store, stream, runner, **kwargs)
    if face == "AsyncOwner+worker":
        kwargs.setdefault("offload", True)
    elif face != "AsyncOwner":
        raise ValueError(f"no owner face {face!r}; the faces are {', '.join(FACES)}")
    return AsyncOwnerFromThreads(store, stream, runner, **kwargs)
