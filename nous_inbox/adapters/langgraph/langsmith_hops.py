"""LangSmith's bookkeeping of a middleware call, run in place inside a turn when nothing traces.

``create_agent`` wraps every middleware's ``awrap_model_call`` in LangSmith's ``traceable``,
which sets up and closes its run record in a worker thread (``run_in_executor``), twice per model
request, even with tracing off: two thread hops per request that the bare graph does not make,
most of what the adapter costs over it. LangSmith offers one documented way to change where that
bookkeeping runs, ``langsmith.set_runtime_overrides(aio_to_thread=...)``. The adapter installs
an override (once, and only when none is installed) that runs it in place when, and only when,
the call serves a ``GraphRunner`` turn and LangSmith is not tracing it; every other call,
traced or not ours, takes LangSmith's own path.

>>> install()  # idempotent; leaves an override the application installed alone
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import langsmith
from langsmith.utils import tracing_is_enabled

_installed: Callable[[], Any] | None
try:  # the getter lives beside the public setter; without it, an application's override is unknowable
    from langsmith._runtime_overrides import get_runtime_overrides as _installed
except ImportError:  # pragma: no cover - a LangSmith without runtime overrides
    _installed = None

__all__ = ["install"]

_lock = threading.Lock()


def install() -> None:
    """Install the override unless one (ours or the application's) is installed already, or
    this LangSmith cannot say whether one is."""
    if _installed is None or not hasattr(langsmith, "set_runtime_overrides"):
        return
    with _lock:
        if _installed().aio_to_thread is None:
            langsmith.set_runtime_overrides(aio_to_thread=_in_place_inside_a_turn)


async def _in_place_inside_a_turn(default: Callable[..., Awaitable[Any]],
                                  ctx: contextvars.Context, func: Callable[..., Any],
                                  /, *args: Any, **kwargs: Any) -> Any:
    from nous_inbox.adapters.langgraph.hooks import current_turn

    if ctx.run(current_turn) is not None and not ctx.run(tracing_is_enabled):
        return ctx.run(func, *args, **kwargs)
    return await default(ctx, func, *args, **kwargs)
