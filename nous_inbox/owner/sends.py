"""What an :class:`~nous_inbox.owner.async_owner.AsyncOwner`'s send verbs return: a coroutine of the
send's outcome, made when the send was, so sends keep the order they were made in whoever awaits.

A send is stored at once (an inline store, a caller under the owner's lock or off its loop:
:class:`Stored`), queued for the store worker's next group commit (:class:`QueuedSend`, of the
future :meth:`StoreWorker.send <nous_inbox.owner.store_worker.StoreWorker.send>` answers), or refused
before anything was written (:class:`Refused`, which raises where it is awaited, as any
awaitable reports its failure). Each is a real ``Coroutine``: ``await`` it, or hand it to
``asyncio.gather``, ``create_task`` or ``asyncio.run``. Each can be followed to where its message
went too: ``await send.delivered()`` waits, once the send is stored, until a claim takes the
message into a run (or it is withdrawn), and answers the owner's
:class:`~nous_inbox.receipts.Receipt`.

>>> import asyncio
>>> async def main():
...     return await asyncio.gather(Stored("stored"), Refused(ValueError("bad")),
...                                 return_exceptions=True)
>>> asyncio.run(main())
['stored', ValueError('bad')]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

if TYPE_CHECKING:
    from nous_inbox.receipts import Receipt

__all__ = ["Follow", "QueuedSend", "Refused", "Stored", "awaited"]

_T = TypeVar("_T")

logger: Final = logging.getLogger("nous_inbox.owner")

Follow = Callable[[int, "float | None"], Awaitable["Receipt"]]
"""An owner's wait for where the send at a seq went (``AsyncOwner.delivered``)."""


async def _followed(send: Awaitable[Any], follow: Follow | None, timeout: float | None) -> Receipt:
    if follow is None:
        raise RuntimeError("this send has no owner to follow it")
    sent = await send
    return await follow(sent.seq, timeout)


class Stored(Coroutine[Any, Any, _T], Generic[_T]):
    """A coroutine of a result already there (a send stored inline): awaiting it, or a task
    running it, returns ``value`` at once, and one never awaited is no error (the send a sync
    callback makes)."""

    __slots__ = ("_follow", "value")

    def __init__(self, value: _T, follow: Follow | None = None) -> None:
        self.value = value
        self._follow = follow

    def delivered(self, timeout: float | None = None) -> Coroutine[Any, Any, Receipt]:
        """Where the stored send's message went, once a claim took it (or it was withdrawn)."""
        return _followed(self, self._follow, timeout)

    def send(self, _: Any) -> Any:
        raise StopIteration(self.value)

    def throw(self, *error: Any) -> Any:
        raise error[1] if len(error) > 1 and error[1] is not None else error[0]

    def close(self) -> None:
        """A finished coroutine has nothing to release when closed."""
        return

    def __await__(self) -> Generator[Any, None, _T]:
        return self.value
        yield  # a generator: awaiting it returns at once


class Refused(Coroutine[Any, Any, _T], Generic[_T]):
    """A coroutine of a send that failed when it was made: refused before anything was written
    (bad input, a record too large, a closed owner), or an inline commit that failed (an
    ``OutcomeUnknownError`` says the send may be stored). Awaiting it raises ``error``, as an
    awaitable reports its failure when awaited. So ``asyncio.gather(..., return_exceptions=True)`` over sends gives
    each one's error beside the others' events. One never awaited (a sync callback's send) has
    its error logged when it is dropped, as asyncio logs a future's exception nobody retrieved.

    """

    __slots__ = ("_heard", "error")

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self._heard = False

    def delivered(self, timeout: float | None = None) -> Coroutine[Any, Any, Receipt]:
        """Raises the send's error where it is awaited: a refused send went nowhere."""
        return _followed(self, _unreachable, timeout)

    def send(self, _: Any) -> Any:
        self._heard = True
        raise self.error

    def throw(self, *error: Any) -> Any:
        self._heard = True
        raise error[1] if len(error) > 1 and error[1] is not None else error[0]

    def close(self) -> None:
        """Dropped on purpose: its error is not logged."""
        self._heard = True

    def __await__(self) -> Generator[Any, None, _T]:
        self._heard = True
        raise self.error
        yield  # a generator: the error is raised when it is awaited

    def __del__(self) -> None:
        if not self._heard:
            with contextlib.suppress(Exception):  # (an interpreter shutting down)
                logger.error("a send was refused and nobody awaited it: %s", self.error,
                             exc_info=self.error)


class QueuedSend(Coroutine[Any, Any, _T], Generic[_T]):
    """What an :class:`~nous_inbox.owner.async_owner.AsyncOwner`'s send verb returns for a send queued
    on its store worker (:meth:`StoreWorker.send <nous_inbox.owner.store_worker.StoreWorker.send>`): a
    coroutine of the stored event. Awaiting it
    (or a task running it) waits for the commit, and cancelling that wait takes the send back
    if no commit took it yet. One never awaited is no error: a sync callback on the loop (a
    listener, a mailbox's notice) may send without awaiting, and the send is stored all the
    same (where :class:`Stored` is the coroutine of a send already stored)."""

    __slots__ = ("_follow", "_future", "_steps")

    def __init__(self, future: asyncio.Future[_T], follow: Follow | None = None) -> None:
        self._future, self._steps = future, future.__await__()
        self._follow = follow

    async def delivered(self, timeout: float | None = None) -> Receipt:
        """Where the send's message went, once it is stored and a claim took it (or it was
        withdrawn); cancelling this wait does not take the send back."""
        return await _followed(asyncio.shield(self._future), self._follow, timeout)

    def __await__(self) -> Generator[Any, None, _T]:
        return self._future.__await__()

    def send(self, value: Any) -> Any:
        """Go on waiting (a task running it)."""
        return self._steps.send(value)

    def throw(self, *error: Any) -> Any:
        """Stop waiting with ``error`` (a task cancelled while running it)."""
        return self._steps.throw(*error)

    def close(self) -> None:
        """Stop waiting; the send stays queued unless its wait was cancelled."""
        self._steps.close()


async def _unreachable(seq: int, timeout: float | None) -> Receipt:
    raise AssertionError("a refused send raises before it is followed")


async def awaited(future: asyncio.Future[_T]) -> _T:
    """``future``'s result, as a coroutine (what ``asyncio.run`` and ``create_task`` take)."""
    return await future
