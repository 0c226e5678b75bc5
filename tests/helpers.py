"""What the tests share: a bounded wait for a state another thread, task or process reaches, and
an async owner's log read through its public event stream.

A test never sleeps a guessed time to let something happen: it polls for the state it needs, up to
a deadline far above any healthy run, and fails naming what it waited for when the deadline
passes. The deadline only bounds a hang; it asserts nothing about speed. Written once here, so
every wait reads the same and fails the same way::

    wait_until(lambda: store.version("s") == 3, what="the owner wrote its three events")
    await async_wait_until(lambda: host.held == [], what="the idle session was let go")

Each returns what the predicate last gave (when true), so a wait can also fetch what it waited for.

``await events_so_far(owner)`` is what an ``AsyncOwner`` has recorded up to now, read as a host
reads it (``owner.events()``, which otherwise follows the log until the owner closes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from nous_inbox.events import Event
from nous_inbox.owner.async_owner import AsyncOwner

__all__ = ["WAIT", "async_wait_until", "events_so_far", "wait_until"]

_T = TypeVar("_T")

#: Seconds: the bound on what should happen soon, never a sleep to synchronise.
WAIT = 20.0
#: Seconds between two looks: short enough that a wait ends soon after its state is reached.
PACE = 0.01


def wait_until(predicate: Callable[[], _T], *, what: str, timeout: float = WAIT,
               pace: float = PACE) -> _T:
    """Call ``predicate`` every ``pace`` seconds until it gives something true, and return that.

    Raises ``AssertionError`` naming ``what`` once ``timeout`` seconds have passed without it.
    ``pace=0`` looks again at once: for a state held only for an instant.
    """
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(pace)
    return found


async def async_wait_until(predicate: Callable[[], _T], *, what: str, timeout: float = WAIT,
                           pace: float = PACE) -> _T:
    """``wait_until`` for a test on an event loop: the loop runs on between two looks."""
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(pace)
    return found


async def events_so_far(owner: AsyncOwner, after: int = 0) -> list[Event]:
    """The events ``owner`` has recorded with ``seq > after``, up to its session's version now."""
    last = owner.session.version
    events: list[Event] = []
    if last <= after:
        return events
    async for event in owner.events(after):
        events.append(event)
        if event.seq >= last:
            break
    return events
