r"""Reading a log's bytes: split them into JSON lines or MessagePack frames, decode each batch in
msgspec's own loop, and name the line (or record) and byte offset of the first bad one.

The formats in :mod:`nous_inbox.codec` read through these functions; the ``file:`` store reuses
the line decoder (:func:`decode_lines`). The module is the library's own (a user reads logs
through the codec), so its names are for the codec and the stores. They take the format's ``check_header`` to read a log's first record, and a
compiled msgspec decoder for the rest. A buffer is split into lines and the lines decoded by
``map`` over the compiled decoder; only when a line fails is the batch walked again in Python to
name the line and byte offset (``decode_lines``, the one home of that check). Without positions,
the events of each piece are a list walked by ``itertools.chain``: no generator frame is resumed
per event.

>>> import msgspec
>>> decoder = msgspec.json.Decoder(int)
>>> no_header = lambda data, where: None
>>> list(iter_json(no_header, b"1\n2\n", decoder, "log", False, 100, 1, 0, True))
[(1, 0, 1), (2, 2, 2)]
>>> list(iter_json(no_header, b"1\nx\n", decoder, "log", False, 100, 1, 0, True))
Traceback (most recent call last):
...
nous_inbox.errors.DecodeError: log line 2 (byte 2): JSON is malformed: invalid character (byte 0)
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, chain, count, takewhile
from typing import IO, Any, Final, NamedTuple

import msgspec

from nous_inbox.errors import DecodeError, RecordTooLargeError
from nous_inbox.events import SCHEMA_VERSION

__all__ = [
    "DECODE_ERRORS",
    "FRAME",
    "FRAME_HEADER_SIZE",
    "BadLine",
    "CheckHeader",
    "bytes_before",
    "decode_lines",
    "iter_json",
    "iter_msgpack",
    "read_json_file",
    "read_msgpack_file",
    "reason_of",
]

CheckHeader = Callable[[bytes, str], object]
"""A format's check of a log's first record (unframed), given the place to name in an error."""

FRAME_HEADER_SIZE: Final = 8
FRAME: Final = struct.Struct(">II")
"""A MessagePack frame's header: the payload's length and its crc32, both 4 bytes, big-endian."""
_CHUNK: Final = 4 * 1024 * 1024
_PIECE: Final = 32 * 1024
"""Bytes of JSON Lines decoded per batch. Small enough that a batch's lines and events (a few
hundred of each) stay in a core's L2 cache until the reader has used them; larger batches
spill it and make typed decoding slower."""

DECODE_ERRORS: Final = (msgspec.DecodeError, RecursionError)
"""What a msgspec decoder may raise on bad bytes: its own error (``ValidationError`` is a subclass)
and, for absurdly deep nesting, ``RecursionError``. A reader catches these and raises
:class:`~nous_inbox.errors.DecodeError` naming the place; :mod:`nous_inbox.codec` exports it for
whoever decodes records with a format's own decoder (the stores do)."""


def read_json_file(
    check_header: CheckHeader, file: IO[bytes], name: str, decoder: Any, max_size: int,
) -> Iterator[Any]:
    """Stream ``(line, offset, value)`` from an open JSON Lines file, a few MiB at a time."""
    line, offset, header, pending = 1, 0, True, b""
    while chunk := file.read(_CHUNK):
        pending += chunk
        cut = pending.rfind(b"\n") + 1
        if not cut:
            if len(pending) > max_size:
                raise RecordTooLargeError(
                    f"{name} line {line} (byte {offset}): record of more than {max_size} "
                    f"bytes is above the limit"
                )
            continue
        complete, pending = pending[:cut], pending[cut:]
        yield from iter_json(check_header, complete, decoder, name, header, max_size, line,
                              offset, True)
        line += complete.count(b"\n")
        offset += cut
        header = False
    if pending:
        raise _truncated(name, "line", line, offset, len(pending))


def read_msgpack_file(
    check_header: CheckHeader, file: IO[bytes], name: str, decoder: Any, max_size: int,
) -> Iterator[Any]:
    """Stream ``(record, offset, value)`` from an open framed MessagePack file, a few MiB at a
    time."""
    number, offset, header, pending = 1, 0, True, b""
    while chunk := file.read(_CHUNK):
        pending += chunk
        # Cut after the last whole frame so each piece decodes on its own.
        pos = frames = 0
        while len(pending) - pos >= FRAME_HEADER_SIZE:
            size = FRAME.unpack_from(pending, pos)[0]
            if size > max_size:  # hand it over: iter refuses it, naming the place
                pos, frames = len(pending), frames + 1
                break
            if pos + FRAME_HEADER_SIZE + size > len(pending):
                break
            pos += FRAME_HEADER_SIZE + size
            frames += 1
        if not frames:
            continue
        complete, pending = pending[:pos], pending[pos:]
        yield from iter_msgpack(check_header, complete, decoder, name, header, max_size,
                                 number, offset)
        number += frames
        offset += pos
        header = False
    if pending:
        raise _truncated(name, "record", number, offset, len(pending))


# msgspec's words for a tag outside the union: an event's (bare, or in a Record envelope).
_UNKNOWN_TYPE: Final = re.compile(r"Invalid value '(.*)' - at `\$(?:\.event)?\.type`", re.DOTALL)


def reason_of(exc: BaseException, data: Any) -> str:
    """Why a record did not decode, in words for the person reading the log.

    An event type this library does not know is what a newer nous-inbox writes, whatever the
    log's header says (a log begun by an older version may have been appended to by a newer
    one), so it says so rather than quoting the decoder.

    >>> reason_of(RecursionError(), b"[[[[") , reason_of(msgspec.DecodeError("x"), b"")
    ('nested too deeply', 'empty record')
    >>> reason_of(msgspec.ValidationError("Invalid value 'moved' - at `$.type`"), b"{}")
    "unknown event type 'moved' (this nous-inbox reads schema 5 and older): written by a newer nous-inbox; upgrade nous-inbox to read it"
    """
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if not data:
        return "empty record"
    reason = str(exc)
    unknown = _UNKNOWN_TYPE.fullmatch(reason)
    if unknown is not None:
        tag = unknown[1] if len(unknown[1]) <= 60 else unknown[1][:59] + "…"
        return (f"unknown event type {tag!r} (this nous-inbox reads schema {SCHEMA_VERSION} and "
                "older): written by a newer nous-inbox; upgrade nous-inbox to read it")
    return reason


class BadLine(NamedTuple):
    """Why a line of a batch was refused (:func:`decode_lines`); ``error(place)`` builds the
    error naming its place, once the caller has worked the place out."""

    reason: str
    too_large: bool

    def error(self, place: str) -> DecodeError:
        kind = RecordTooLargeError if self.too_large else DecodeError
        return kind(f"{place}: {self.reason}")


def decode_lines(
    decoder: Any, lines: list[bytes], max_size: int, span: int | None = None,
) -> tuple[list[Any], BadLine | None]:
    """Decode a batch of lines in msgspec's own loop: ``(values, None)`` when all are good.

    Otherwise the values of the lines before the first bad one (too large, or not decoding),
    and why that one is bad: its index is ``len(values)``. Only then are the lines walked one
    by one, so a caller works out where a line sits only when there is an error to place. The
    one home of this check: the codec's readers and the ``file:`` store both use it.

    ``span``, when the caller knows it, is how many bytes the lines came from: if that is
    within ``max_size``, no line can be above it, and the lines are not measured one by one
    (a piece whose bytes fit the limit cannot hold a line above it, so replay's pieces skip the
    walk under the default limit).
    """
    if not lines:
        return [], None
    good = lines
    too_large = (span is None or span > max_size) and max(map(len, lines)) > max_size
    if too_large:
        good = list(takewhile(lambda text: len(text) <= max_size, lines))
    try:
        values = list(map(decoder.decode, good))
    except DECODE_ERRORS:
        values = []
        for text in good:
            try:
                values.append(decoder.decode(text))
            except DECODE_ERRORS as exc:
                return values, BadLine(reason_of(exc, text), False)
        raise AssertionError("a line failed to decode once but not twice") from None  # pragma: no cover
    if too_large:
        size = len(lines[len(values)])
        return values, BadLine(f"record of {size} bytes is above the limit of {max_size} bytes",
                                True)
    return values, None


def bytes_before(lines: list[bytes], index: int) -> int:
    """How many bytes the first ``index`` lines take, newlines included: where line ``index``
    begins, counted from the first line's start.

    >>> bytes_before([b"ab", b"c", b"d"], 2)
    5
    """
    return sum(map(len, lines[:index])) + index


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"expected bytes, got {type(data).__name__}")


def iter_json(
    check_header: CheckHeader, data: object, decoder: Any, name: str, header: bool, max_size: int,
    line: int, base: int, positions: bool,
) -> Iterator[Any]:
    """The values of the JSON Lines in ``data``, as ``(line, offset, value)`` when
    ``positions``, else bare: ``header`` says whether the first line is the log's header (checked
    by ``check_header``, not yielded); ``line`` and ``base`` are the first line's number and byte
    offset, for the place an error names (see the module's example)."""
    pieces = _json_pieces(check_header, data, decoder, name, header, max_size, line, base,
                          positions)
    # Without positions, the events of a piece are a list, walked by ``chain`` in C: no
    # generator frame resumed per event.
    return chain.from_iterable(pieces)


def _json_pieces(
    check_header: CheckHeader, data: object, decoder: Any, name: str, header: bool, max_size: int,
    line: int, base: int, positions: bool,
) -> Iterator[Iterable[Any]]:
    buf = _as_bytes(data)
    if not buf:
        return
    end = buf.rfind(b"\n") + 1  # after it: b"" when the buffer ends with a newline, else a
    offset = base                # record cut short
    pos = 0
    if header:
        first = buf.find(b"\n")
        if first < 0:
            raise _truncated(name, "line", line, offset, len(buf))
        check_header(buf[:first], f"{name} line {line} (byte {offset})")
        offset += first + 1
        line += 1
        pos = first + 1
    # A piece of about _PIECE bytes at a time, split into lines and decoded in msgspec's own
    # loop: the lines of a piece are decoded while still in cache, the events handed on while
    # theirs are, and a long log never has all its lines or events alive at once.
    while pos < end:
        cut = buf.find(b"\n", min(pos + _PIECE, end - 1)) + 1 if pos + _PIECE < end else end
        part = buf[pos:cut].split(b"\n")
        part.pop()
        items, bad = decode_lines(decoder, part, max_size, cut - pos)
        if positions:
            yield zip(count(line), accumulate(map((1).__add__, map(len, part)), initial=offset),
                      items, strict=False)
        else:
            yield items
        if bad is not None:  # the good lines before it were handed on; now name it
            index = len(items)
            place = f"{name} line {line + index} (byte {offset + bytes_before(part, index)})"
            raise bad.error(place)
        line += len(part)
        offset += cut - pos
        pos = cut
    if end < len(buf):
        raise _truncated(name, "line", line, base + end, len(buf) - end)


def _truncated(name: str, unit: str, number: int, offset: int, size: int) -> DecodeError:
    ending = "no newline at its end" if unit == "line" else "shorter than its frame says"
    return DecodeError(
        f"{name} {unit} {number} (byte {offset}): truncated record ({size} bytes, {ending})"
    )


def iter_msgpack(
    check_header: CheckHeader, data: object, decoder: Any, name: str, header: bool, max_size: int,
    number: int, base: int,
) -> Iterator[Any]:
    """``(record, offset, value)`` for each framed MessagePack record in ``data``, each frame's
    length and checksum checked first: ``header``, ``number`` and ``base`` as for
    :func:`iter_json`."""
    buf = _as_bytes(data)
    end = len(buf)
    pos = 0
    unpack = FRAME.unpack_from
    crc32 = zlib.crc32
    decode = decoder.decode
    while pos < end:
        if end - pos < FRAME_HEADER_SIZE:
            raise _truncated(name, "record", number, base + pos, end - pos)
        size, checksum = unpack(buf, pos)
        if size > max_size:
            raise RecordTooLargeError(
                f"{name} record {number} (byte {base + pos}): record of {size} bytes is above "
                f"the limit of {max_size} bytes"
            )
        start = pos + FRAME_HEADER_SIZE
        stop = start + size
        if stop > end:
            raise _truncated(name, "record", number, base + pos, end - pos)
        payload = buf[start:stop]
        if crc32(payload) != checksum:
            raise DecodeError(
                f"{name} record {number} (byte {base + pos}): checksum mismatch (the record is "
                f"corrupt)"
            )
        if header:
            check_header(payload, f"{name} record {number} (byte {base + pos})")
            header = False
        else:
            try:
                item = decode(payload)
            except DECODE_ERRORS as exc:
                raise DecodeError(
                    f"{name} record {number} (byte {base + pos}): {reason_of(exc, payload)}"
                ) from None
            yield number, base + pos, item
        pos = stop
        number += 1
