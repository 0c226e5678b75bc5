"""A progress bar on stderr for long replays, shown only on a terminal and only when worth it."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, TypeVar

__all__ = ["with_progress"]

T = TypeVar("T")

#: Below this many events a replay is over before a bar could say anything useful.
MIN_EVENTS = 20_000


def with_progress(
    items: Iterable[T], total: int, label: str, stream: IO[str] | None = None
) -> Iterator[T]:
    """Yield ``items`` unchanged, drawing ``label [#####.....] n/total`` on a terminal.

    Nothing is drawn when ``stream`` (stderr by default) is not a terminal or ``total`` is small,
    so pipes and tests see clean output.

    >>> list(with_progress(range(3), 3, "replay"))
    [0, 1, 2]
    """
    stream = sys.stderr if stream is None else stream
    if total < MIN_EVENTS or not stream.isatty():
        yield from items
        return
    width = 30
    step = max(1, total // 100)
    started = time.monotonic()
    done = 0
    for done, item in enumerate(items, 1):
        if done % step == 0:
            filled = width * done // total
            stream.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,}")
            stream.flush()
        yield item
    stream.write(f"\r{label}: {done:,} events in {time.monotonic() - started:.1f}s{' ' * width}\n")
    stream.flush()
