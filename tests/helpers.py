"""What the tests share: a bounded wait for a state another thread, task or process reaches.

A test never sleeps a guessed time to let something happen: it polls for the state it needs, up to
a deadline far above any healthy run, and fails naming what it waited for when the deadline
passes. The deadline only bounds a hang; it asserts nothing about speed. Written once here, so
every wait reads the same and fails the same way::

    wait_until(lambda: store.version("s") == 3, what="the owner wrote its three events")
    await async_wait_until(lambda: host.held == [], what="the idle session was let go")

Each returns what the predicate last gave (when true), so a wait can also fetch what it waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["WAIT", "async_wait_until", "wait_until"]

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
