"""Terminal styling for the CLI: colour on a terminal, plain text in a pipe or with NO_COLOR set."""

from __future__ import annotations

import os
from typing import IO, Final

import attrs

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


def _wants_colour(stream: IO[str] | None) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ


@attrs.frozen
class Style:
    """Wraps text in ANSI colours only when the stream is a terminal and NO_COLOR is unset.

    ``force`` decides instead of the stream (``True`` always colours, ``False`` never); the
    decision is taken once, when the style is made, and kept in ``enabled``.

    >>> import io
    >>> Style(io.StringIO()).paint("hi", "green")
    'hi'
    >>> Style(None, force=True).paint("hi", "green")
    '\\x1b[32mhi\\x1b[0m'
    """

    stream: IO[str] | None = attrs.field(repr=False)
    force: bool | None = None
    enabled: bool = attrs.field(init=False)

    @enabled.default
    def _enabled(self) -> bool:
        return _wants_colour(self.stream) if self.force is None else self.force

    def paint(self, text: str, *styles: str) -> str:
        """``text`` in the given styles (names from ``bold dim red green yellow blue magenta cyan``)."""
        if not self.enabled or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"
