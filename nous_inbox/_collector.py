"""The cyclic garbage collector paused around bulk work: a helper below every layer.

A replay's fold (``session``) and a bulk decode (``codec``, the ``file:`` store) build millions
of acyclic objects (events and messages hold only values), and with the collector on, each of
its full passes walks every object already built, so a long replay's time per event would
grow with the log. It lives here, importing nothing of the package, so the fold need not import
the codec above it (dependencies point downward only).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["collector_paused"]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for a bulk decode or fold, then restore it.

    Reference counting frees everything as usual. The caller's state is restored on the way
    out, an exception included; a caller that had the collector disabled keeps it so.

    >>> import gc
    >>> with collector_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
