"""Text from a log, made safe to put on a terminal: the CLI prints nothing a message could steer.

A message, a tool result, a stream name or an error quoting any of them can carry characters a
terminal obeys rather than shows: escape sequences (ESC, or the one-byte C1 CSI ``U+009B``) that
move the cursor, recolour, retitle the window or worse, ``DEL``, and Unicode's bidirectional
overrides (``U+202A``-``U+202E``, ``U+2066``-``U+2069``) that make a line read in an order other
than the one it is stored in ("Trojan Source"). Every path from such text to the terminal goes
through one of these functions:

- ``printable`` for text mode: controls become ``\\x1b``-style escapes, bidi controls
  ``\\u202e``-style ones, so a person sees that they are there;
- ``one_line`` for error and warning lines: the same, on one line;
- :func:`nous_inbox.safe_json.json_safe` for ``--json`` output (and ``event_json`` beside it for
  an event): a JSON document whose strings carry those characters as ``\\u`` escapes. JSON
  encoders escape only C0 controls, yet ``\\u009b`` and the raw character decode to the same
  string, so the output still decodes to the exact log. It lives outside the command line
  because the web face's event stream sends events in the same form.

>>> print(printable("\\x1b[2Jgone\\tand\\nback\\x9b \\u202eevil"))
\\x1b[2Jgone\\x09and\\x0aback\\x9b \\u202eevil
>>> one_line("no such session 'a\\x1b]0;pwned\\x07'\\n   (see --help)")
"no such session 'a\\\\x1b]0;pwned\\\\x07' (see --help)"

This module imports nothing, so ``main`` can use it before the rest of the package is loaded.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BIDI_CONTROLS", "one_line", "printable"]

#: The bidirectional embedding, override and isolate controls.
BIDI_CONTROLS: Final = frozenset((*range(0x202A, 0x202F), *range(0x2066, 0x206A)))

# C0 controls, DEL and C1 controls (Unicode category Cc) become their repr-style escapes.
_ESCAPES: Final = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    **{c: f"\\u{c:04x}" for c in BIDI_CONTROLS},
}


def printable(text: str) -> str:
    """``text`` safe to print on a terminal: controls and bidi controls shown as escapes.

    >>> printable("plain text stays as it is")
    'plain text stays as it is'
    """
    return text.translate(_ESCAPES)


def one_line(text: str) -> str:
    """``text`` as one safe line: runs of whitespace become one space, controls are escaped.

    For error messages and warnings, which may quote a stream name or a log's content.
    """
    return printable(" ".join(text.split()))
