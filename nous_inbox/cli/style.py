"""Terminal styling for the CLI: colour on a terminal, plain text in a pipe or with NO_COLOR set."""

from __future__ import annotations

import os
from typing import IO, Final

__all__ = ["Style"]

_CODES: Final = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


class Style:
    """Wraps text in ANSI colours only when the stream is a terminal and NO_COLOR is unset.

    >>> import io
    >>> Style(io.StringIO()).paint("hi", "green")
    'hi'
    """

    def __init__(self, stream: IO[str] | None, force: bool | None = None) -> None:
        if force is None:
            isatty = getattr(stream, "isatty", None)
            force = bool(isatty and isatty()) and "NO_COLOR" not in os.environ
        self.enabled = force

    def paint(self, text: str, *styles: str) -> str:
        """``text`` in the given styles (names from ``bold dim red green yellow blue magenta cyan``)."""
        if not self.enabled or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"
