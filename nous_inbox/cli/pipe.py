"""A reader that goes away: ``nous-inbox run s --json | head -3`` ends quietly, not in tracebacks.

When the reader of a pipe exits, the next write raises ``BrokenPipeError``. A C tool would die of
SIGPIPE without a word; Python ignores that signal, so the CLI does the equivalent by hand: stop
writing, point the stream's file descriptor at ``os.devnull`` (so the flush at interpreter exit
finds somewhere to go instead of raising again, as the Python docs on SIGPIPE recommend), and
exit with status 0, since the reader took all it wanted.

>>> import io
>>> is_broken_pipe(BrokenPipeError()), is_broken_pipe(OSError(32, "EPIPE")), is_broken_pipe(OSError())
(True, True, False)
>>> quiet_broken_pipe(io.StringIO())  # no file descriptor: nothing to redirect
"""

from __future__ import annotations

import errno
import io
import os
from typing import IO

__all__ = ["is_broken_pipe", "quiet_broken_pipe"]


def is_broken_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` says the reader of our output has gone (``EPIPE``)."""
    return isinstance(exc, BrokenPipeError) or (
        isinstance(exc, OSError) and exc.errno == errno.EPIPE
    )


def quiet_broken_pipe(stream: IO[str]) -> None:
    """Send the rest of ``stream``'s output to ``os.devnull``, so nothing raises at exit.

    A stream without a file descriptor (a ``StringIO`` in tests) is left alone.
    """
    try:
        fd = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)
