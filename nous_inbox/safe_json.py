"""JSON for people and their tools: the one form ``nous-inbox log --json`` prints an event in,
and the web face's event stream sends it in.

JSON encoders escape only C0 controls. A message can carry more that a terminal obeys rather than
shows (DEL, the one-byte C1 forms of ESC such as ``U+009B``), bidi controls that make a line read
in an order other than the one it is stored in, and the line separators U+2028/U+2029 that
JavaScript and line splitters choke on. Inside a JSON string each can be written as a ``\\u``
escape that decodes to the same character, so the output is inert and still decodes to the exact
log. One encoder for both faces keeps them the same, byte for byte.

>>> from nous_inbox.events import Warned
>>> print(event_json(Warned(seq=1, text="\\x9b2J \\u202eevil")))
{"type":"warned","text":"\\u009b2J \\u202eevil","seq":1}
"""

from __future__ import annotations

from typing import Final

from nous_inbox.codec import JSON_LINES
from nous_inbox.events import Event

__all__ = ["event_json", "json_safe"]

# DEL, C1 controls, the bidi embedding, override and isolate controls, U+2028 and U+2029.
_JSON_ESCAPES: Final = {
    c: f"\\u{c:04x}"
    for c in (*range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
}


def json_safe(document: str) -> str:
    """A JSON text with DEL, C1 controls, bidi controls and U+2028/9 escaped as ``\\uXXXX``:
    safe to print on a terminal or hand to a page, and it decodes to the same value (those
    characters can only stand inside JSON strings, where the escape means the same).

    >>> json_safe('{"content": "\\x9b31m\\x7f\\u2066"}')
    '{"content": "\\\\u009b31m\\\\u007f\\\\u2066"}'
    >>> json_safe('["ascii passes untouched"]')
    '["ascii passes untouched"]'
    """
    if document.isascii() and "\x7f" not in document:
        return document  # the common case, decided in O(1) and one scan
    return document.translate(_JSON_ESCAPES)


def event_json(event: Event) -> str:
    """The event as one line of JSON for people and their tools: what ``nous-inbox log --json``
    prints and the web face's event stream sends as ``data:``, one encoder for both.

    It is the JSON Lines record (:func:`~nous_inbox.codec.encode_event`) through :func:`json_safe`, so it decodes
    to the exact event while a message's escape sequences and bidi controls stay inert.

    >>> from nous_inbox.events import Warned
    >>> event_json(Warned(seq=1, text="\\x9b2J \\u202eevil"))
    '{"type":"warned","text":"\\\\u009b2J \\\\u202eevil","seq":1}'
    """
    return json_safe(JSON_LINES.encode(event).decode())
