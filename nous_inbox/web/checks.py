"""What the API checks in a request before anything is written: its body, its query, its numbers.

Each check raises :class:`Refused` with the status and a reason naming the place at fault; the
app answers it as ``{"error": reason}`` (:class:`~nous_inbox.web.schema.ApiError`), the one shape
of every 4xx.

>>> whole("12", "seq must be a whole number")
12
>>> whole("1.5", "seq must be a whole number")
Traceback (most recent call last):
...
nous_inbox.web.checks.Refused: seq must be a whole number, got '1.5'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import msgspec
from starlette.requests import Request

from nous_inbox.web.schema import SHAPES

__all__ = ["MAX_WHOLE", "Refused", "cut", "field_error", "json_body", "query_values", "whole"]

#: The largest whole number a query parameter or a path's seq may be: 18 digits, so every store
#: (SQLite's and PostgreSQL's 64-bit integers included) can compare it.
MAX_WHOLE: Final = 10**18 - 1

_Body = TypeVar("_Body", bound=msgspec.Struct)


class Refused(Exception):
    """A request the API refuses: its status and the reason, sent as ``{"error": reason}``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def query_values(request: Request, takes: Mapping[str, int], maxima: Mapping[str, int],
                 texts: Mapping[str, Callable[[str], str]] | None = None,
                 ) -> tuple[dict[str, int], dict[str, str]]:
    """The query's whole numbers and texts, by name: each parameter ``takes`` (the numbers, with
    their defaults; ``maxima`` the largest each may be) or ``texts`` (each with its check, ``""``
    when not given) names, at most once, none other."""
    checks = texts or {}
    values = dict(takes)
    said = dict.fromkeys(checks, "")
    seen: set[str] = set()
    for key, raw in request.query_params.multi_items():
        if key not in takes and key not in checks:
            names = [*takes, *checks]
            known = f"it takes {', '.join(names)}" if names else "it takes none"
            raise Refused(400, f"unknown query parameter {cut(key)!r}: {known}")
        if key in seen:
            raise Refused(400, f"query parameter {key} is given more than once")
        seen.add(key)
        if key in checks:
            said[key] = checks[key](raw)
            continue
        values[key] = whole(raw, f"{key} must be a whole number >= 0")
        largest = maxima.get(key, MAX_WHOLE)
        if values[key] > largest:
            allowed = "0 or 1" if largest == 1 else f"from 0 to {largest}"
            raise Refused(400, f"{key} must be {allowed}, got {values[key]}")
    return values, said


def whole(raw: str, must: str) -> int:
    """``raw`` as a whole number of at most 18 ASCII digits, or :class:`Refused` (400) with
    ``must`` and what was given."""
    # ASCII digits only: ``str.isdigit`` also passes digits ``int`` cannot read, such as "²".
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise Refused(400, f"{must}, got {cut(raw)!r}")
    return int(raw)


async def json_body(request: Request, kind: type[_Body], limit: int, *,
                    optional: bool = False) -> _Body:
    """The request's body as ``kind``, read no further than ``limit`` bytes; refused with the
    field at fault (a wrong type, a value out of range, a field missing or unknown)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    declared = request.headers.get("content-length")
    if declared is not None and whole(declared, "Content-Length must be a number of bytes") > limit:
        raise Refused(413, f"the body is {declared} bytes; at most {limit} are read")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refused(413, f"the body is over {limit} bytes")
    if optional and not body:
        body += b"{}"
    elif media_type != "application/json":
        raise Refused(415, "the body must be JSON (Content-Type: application/json), got "
                           f"{cut(media_type) or 'none'!r}")
    try:
        return msgspec.json.decode(bytes(body), type=kind)
    except msgspec.ValidationError as exc:
        raise Refused(400, f"{field_error(str(exc))}; send {SHAPES[kind]}") from None
    except msgspec.DecodeError as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from None


def field_error(reason: str) -> str:
    """msgspec's reason, led by the field it is about: ``mode: Expected `str`, got `array```.

    >>> field_error("Invalid enum value 'shout' - at `$.mode`")
    "mode: Invalid enum value 'shout'"
    >>> field_error("Expected `object`, got `array`")
    'the body: Expected `object`, got `array`'
    """
    what, at, path = reason.rpartition(" - at `$")
    if at and path.startswith(".") and path.endswith("`"):
        return f"{cut(path[1:-1])}: {what}"
    return cut(reason, 200) if "field `" in reason else f"the body: {reason}"


def cut(text: str, limit: int = 40) -> str:
    """A name the client sent, cut to ``limit`` characters: a body may hold 64 KiB of it.

    >>> cut("x" * 50, 10)
    'xxxxxxxxx…'
    """
    return text if len(text) <= limit else text[:limit - 1] + "…"
