"""Codec: events to bytes and back, as JSON Lines or framed MessagePack, strictly.

A log is a header naming the format and its schema version, then one record per event. JSON Lines
is for people and tools (one event a line, ``tail -f``-able, ``grep``-able); MessagePack is the
compact form (each record framed by its length and a checksum). Both go through msgspec, and both
are strict: a byte that does not belong is a :class:`~nous_inbox.errors.DecodeError` that says
where, never a guess.

>>> from nous_inbox.events import MessageSent, QueueClaimed
>>> from nous_inbox.message import Message
>>> log = json_lines([
...     MessageSent(seq=1, target="next_step", wakeup=True, message=Message.user("go")),
...     QueueClaimed(seq=2, target="next_step", count=1),
... ])
>>> print(log.decode(), end="")
{"format":"nous-inbox","version":2}
{"type":"message_sent","target":"next_step","wakeup":true,"message":{"role":"user","content":"go"},"seq":1}
{"type":"queue_claimed","target":"next_step","count":1,"seq":2}
>>> [(line, offset, type(event).__name__) for line, offset, event in iter_events(log)]
[(2, 36, 'MessageSent'), (3, 144, 'QueueClaimed')]
>>> list(iter_events(log.replace(b'"seq":2', b'"seq":"2"'), name="events.jsonl"))
Traceback (most recent call last):
...
nous_inbox.errors.DecodeError: events.jsonl line 3 (byte 144): Expected `int`, got `str` - at `$.seq`

What is refused: an unknown event ``type``, a wrong type anywhere, malformed JSON or MessagePack,
a blank line, a record cut short (no final newline, or a frame shorter than its length), a frame
whose checksum does not match, a record above ``max_record_size`` (16 MiB by default;
:class:`~nous_inbox.errors.RecordTooLargeError`), and a header from a newer schema version than
this library reads. A record written before a defaulted field was added still decodes: the field
takes its default.

A multi-stream log (the ``file:`` store) holds :class:`Record` envelopes instead of bare events:
the stream name, the event, and ``more``, how many records of the same atomic append follow this
one, so a reader can tell a batch cut short by a crash from a complete one.

Design notes. Decoders are built once per type and reused. A buffer is split into lines and the
lines decoded by ``map`` over the compiled decoder, so the per-line cost is msgspec's own; only
when a line fails is the buffer walked again in Python to name the line and byte offset. The
MessagePack frame is ``length (4 bytes, big-endian) | crc32 (4 bytes) | payload``: MessagePack has
little redundancy, so without the checksum a flipped byte inside a string would decode silently as
other text.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable, Iterator
from itertools import accumulate, count
from typing import Any, Final, Literal

import msgspec

from nous_inbox.errors import DecodeError, RecordTooLargeError
from nous_inbox.events import SCHEMA_VERSION, Event
from nous_inbox.message import enc_hook

__all__ = [
    "FORMAT_NAME",
    "FRAME_HEADER_SIZE",
    "MAX_RECORD_SIZE",
    "Format",
    "Header",
    "Record",
    "check_header",
    "decode_event",
    "decode_events",
    "decode_record",
    "encode_event",
    "encode_header",
    "encode_record",
    "frame",
    "iter_events",
    "iter_records",
    "json_lines",
    "msgpack_frames",
    "read_events",
    "read_records",
]

FORMAT_NAME: Final = "nous-inbox"
MAX_RECORD_SIZE: Final = 16 * 1024 * 1024
"""Default size limit of one record (its JSON line or MessagePack payload), in bytes."""

Format = Literal["json", "msgpack"]

FRAME_HEADER_SIZE: Final = 8
_FRAME: Final = struct.Struct(">II")
_CHUNK: Final = 4 * 1024 * 1024
_SLICE: Final = 4096


class Header(msgspec.Struct, frozen=True, kw_only=True):
    """The first record of a log: which format, which schema version wrote it."""

    format: str
    version: int


class Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event of a multi-stream log: the ``stream`` it belongs to and the ``event``.

    ``more`` counts the records of the same append that follow this one (0 for the last, and
    left out of the encoding), so an append of three events is written ``more`` = 2, 1, 0.

    >>> from nous_inbox.events import Warned
    >>> encode_record(Record(stream="s1", event=Warned(seq=4, text="slow")))
    b'{"stream":"s1","event":{"type":"warned","text":"slow","seq":4}}'
    """

    stream: str
    event: Event
    more: int = 0


_json_encoder: Final = msgspec.json.Encoder(enc_hook=enc_hook)
_msgpack_encoder: Final = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_json_event: Final = msgspec.json.Decoder(Event)
_json_record: Final = msgspec.json.Decoder(Record)
_json_header: Final = msgspec.json.Decoder(Header)
_msgpack_event: Final = msgspec.msgpack.Decoder(Event)
_msgpack_record: Final = msgspec.msgpack.Decoder(Record)
_msgpack_header: Final = msgspec.msgpack.Decoder(Header)

# What a decoder may raise on bad bytes: msgspec's own error (ValidationError is a subclass) and,
# for absurdly deep nesting, RecursionError; both become our DecodeError with a place.
_BAD: Final = (msgspec.DecodeError, RecursionError)


def _check_format(fmt: str) -> None:
    if fmt != "json" and fmt != "msgpack":
        raise ValueError(f"format must be 'json' or 'msgpack', got {fmt!r}")


# -- single values ---------------------------------------------------------------------------------


def encode_event(event: Event, fmt: Format = "json") -> bytes:
    """One event as JSON (no newline) or bare MessagePack (no frame).

    >>> from nous_inbox.events import Warned
    >>> encode_event(Warned(seq=1, text="hi"))
    b'{"type":"warned","text":"hi","seq":1}'
    >>> decode_event(encode_event(Warned(seq=1, text="hi"), "msgpack"), "msgpack")
    Warned(text='hi', seq=1)
    """
    _check_format(fmt)
    return _json_encoder.encode(event) if fmt == "json" else _msgpack_encoder.encode(event)


def encode_record(record: Record, fmt: Format = "json") -> bytes:
    """One :class:`Record` as JSON (no newline) or bare MessagePack (no frame)."""
    _check_format(fmt)
    return _json_encoder.encode(record) if fmt == "json" else _msgpack_encoder.encode(record)


def _decode_one(decoder: Any, data: Any, where: str, max_size: int) -> Any:
    if not isinstance(data, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"{where}: expected bytes, got {type(data).__name__}")
    size = len(data.encode() if isinstance(data, str) else data)
    if size > max_size:
        raise RecordTooLargeError(
            f"{where}: record of {size} bytes is above the limit of {max_size} bytes"
        )
    try:
        return decoder.decode(data)
    except _BAD as exc:
        raise DecodeError(f"{where}: {_reason(exc, data)}") from None


def decode_event(
    data: bytes | str, fmt: Format = "json", *, where: str = "event",
    max_record_size: int = MAX_RECORD_SIZE,
) -> Event:
    """Read one event written by :func:`encode_event`; ``where`` names it in errors.

    >>> decode_event(b'{"type":"warned","text":"hi","seq":"one"}', where="stream 's' seq 1")
    Traceback (most recent call last):
    ...
    nous_inbox.errors.DecodeError: stream 's' seq 1: Expected `int`, got `str` - at `$.seq`
    """
    _check_format(fmt)
    decoder = _json_event if fmt == "json" else _msgpack_event
    event: Event = _decode_one(decoder, data, where, max_record_size)
    return event


def decode_record(
    data: bytes | str, fmt: Format = "json", *, where: str = "record",
    max_record_size: int = MAX_RECORD_SIZE,
) -> Record:
    """Read one :class:`Record` written by :func:`encode_record`."""
    _check_format(fmt)
    decoder = _json_record if fmt == "json" else _msgpack_record
    record: Record = _decode_one(decoder, data, where, max_record_size)
    return record


# -- headers ---------------------------------------------------------------------------------------


def encode_header(fmt: Format = "json") -> bytes:
    """The first record of a log, ready to write: a JSON line, or a MessagePack frame.

    >>> encode_header()
    b'{"format":"nous-inbox","version":2}\\n'
    """
    _check_format(fmt)
    header = Header(format=FORMAT_NAME, version=SCHEMA_VERSION)
    if fmt == "json":
        return _json_encoder.encode(header) + b"\n"
    return frame(_msgpack_encoder.encode(header))


def check_header(data: bytes, fmt: Format = "json", *, where: str = "header") -> Header:
    """Decode a header record (without newline or frame) and refuse what this library cannot read.

    A log from a newer schema version is refused rather than misread; an older one is fine.

    >>> check_header(b'{"format":"nous-inbox","version":99}', where="a.jsonl line 1")
    Traceback (most recent call last):
    ...
    nous_inbox.errors.DecodeError: a.jsonl line 1: written with schema version 99, newer than this nous-inbox reads (2); upgrade nous-inbox to read it
    """
    _check_format(fmt)
    decoder = _json_header if fmt == "json" else _msgpack_header
    try:
        header: Header = decoder.decode(data)
    except _BAD as exc:
        raise DecodeError(f"{where}: not a nous-inbox log header: {_reason(exc, data)}") from None
    if header.format != FORMAT_NAME:
        raise DecodeError(f"{where}: not a nous-inbox log (format {header.format!r})")
    if header.version > SCHEMA_VERSION:
        raise DecodeError(
            f"{where}: written with schema version {header.version}, newer than this nous-inbox "
            f"reads ({SCHEMA_VERSION}); upgrade nous-inbox to read it"
        )
    if header.version < 1:
        raise DecodeError(f"{where}: invalid schema version {header.version}")
    return header


# -- whole logs: writing ---------------------------------------------------------------------------


def json_lines(items: Iterable[Event | Record], *, header: bool = True) -> bytes:
    """A JSON Lines log: the header line (unless ``header=False``), then one line per item."""
    encode = _json_encoder.encode
    body = b"".join([encode(item) + b"\n" for item in items])
    return encode_header("json") + body if header else body


def frame(payload: bytes) -> bytes:
    """Frame one MessagePack payload: its length and crc32 (big-endian) before it."""
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def msgpack_frames(items: Iterable[Event | Record], *, header: bool = True) -> bytes:
    """A framed MessagePack log: the header frame (unless ``header=False``), then one per item."""
    encode = _msgpack_encoder.encode
    body = b"".join([frame(encode(item)) for item in items])
    return encode_header("msgpack") + body if header else body


# -- whole logs: reading ---------------------------------------------------------------------------


def iter_events(
    data: bytes, fmt: Format = "json", *, name: str = "<bytes>", header: bool = True,
    max_record_size: int = MAX_RECORD_SIZE, start_line: int = 1, start_offset: int = 0,
) -> Iterator[tuple[int, int, Event]]:
    """Decode a whole log held in ``data``, yielding ``(line, offset, event)`` in order.

    ``line`` is the 1-based line number (in MessagePack, the record number; the header counts
    as the first) and ``offset`` the byte offset where the record starts. ``name`` names the
    source in errors. ``header=False`` reads a bare run of records (no header expected);
    ``start_line`` and ``start_offset`` place ``data`` inside a larger file. The records before
    a bad one are yielded before the error is raised, as a file reader would.
    """
    _check_format(fmt)
    if fmt == "json":
        return _iter_json(data, _json_event, name, header, max_record_size, start_line,
                          start_offset)
    return _iter_msgpack(data, _msgpack_event, name, header, max_record_size, start_line,
                         start_offset)


def iter_records(
    data: bytes, fmt: Format = "json", *, name: str = "<bytes>", header: bool = True,
    max_record_size: int = MAX_RECORD_SIZE, start_line: int = 1, start_offset: int = 0,
) -> Iterator[tuple[int, int, Record]]:
    """Like :func:`iter_events` for a multi-stream log of :class:`Record` envelopes."""
    _check_format(fmt)
    if fmt == "json":
        return _iter_json(data, _json_record, name, header, max_record_size, start_line,
                          start_offset)
    return _iter_msgpack(data, _msgpack_record, name, header, max_record_size, start_line,
                         start_offset)


def decode_events(
    data: bytes, fmt: Format = "json", *, name: str = "<bytes>", header: bool = True,
    max_record_size: int = MAX_RECORD_SIZE,
) -> Iterator[Event]:
    """The events of a whole log, without positions: the fast path for ``replay``.

    The checks and errors are those of :func:`iter_events` (an error still names the line and
    byte offset, worked out only when there is one).

    >>> from nous_inbox.session import replay
    >>> from nous_inbox.events import Warned
    >>> replay(decode_events(json_lines([Warned(seq=1, text="x")]))).version
    1
    """
    _check_format(fmt)
    if fmt == "json":
        return _iter_json(data, _json_event, name, header, max_record_size, 1, 0, False)
    return (item for _, _, item in _iter_msgpack(data, _msgpack_event, name, header,
                                                 max_record_size, 1, 0))


def read_events(
    path: str | os.PathLike[str], fmt: Format = "json", *,
    max_record_size: int = MAX_RECORD_SIZE,
) -> Iterator[tuple[int, int, Event]]:
    """Stream the events of a log file, a few MiB at a time: ``(line, offset, event)``.

    The file must start with a header. Errors name the file, the line and the byte offset.
    """
    _check_format(fmt)
    decoder = _json_event if fmt == "json" else _msgpack_event
    return _read_file(path, fmt, decoder, max_record_size)


def read_records(
    path: str | os.PathLike[str], fmt: Format = "json", *,
    max_record_size: int = MAX_RECORD_SIZE,
) -> Iterator[tuple[int, int, Record]]:
    """Like :func:`read_events` for a multi-stream log of :class:`Record` envelopes."""
    _check_format(fmt)
    decoder = _json_record if fmt == "json" else _msgpack_record
    return _read_file(path, fmt, decoder, max_record_size)


# -- internals -------------------------------------------------------------------------------------


def _reason(exc: BaseException, data: Any) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if not data:
        return "empty record"
    return str(exc)


def _as_bytes(data: object) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"expected bytes, got {type(data).__name__}")


def _iter_json(
    data: object, decoder: Any, name: str, header: bool, max_size: int, line: int, base: int,
    positions: bool = True,
) -> Iterator[Any]:
    buf = _as_bytes(data)
    if not buf:
        return
    lines = buf.split(b"\n")
    tail = lines.pop()  # b"" when the buffer ends with a newline, else a record cut short
    offset = base
    if header:
        if not lines:
            raise _truncated(name, "line", line, offset, len(tail))
        check_header(lines[0], "json", where=f"{name} line {line} (byte {offset})")
        offset += len(lines[0]) + 1
        line += 1
        del lines[0]
    if lines and max(map(len, lines)) > max_size:
        _raise_too_large(lines, name, line, offset, max_size)
    # A slice at a time: the decoded events of one slice are handed on while still in cache,
    # and a long log never has all its events alive at once.
    for start in range(0, len(lines), _SLICE):
        part = lines[start:start + _SLICE]
        try:
            items = list(map(decoder.decode, part))
        except _BAD:
            walk = _walk_to_json_error(part, decoder, name, line, offset)
            yield from (walk if positions else (item for _, _, item in walk))
        if positions:
            yield from zip(count(line),
                           accumulate(map((1).__add__, map(len, part)), initial=offset),
                           items, strict=False)
        else:
            yield from items
        line += len(part)
        offset += sum(map(len, part)) + len(part)
    if tail:
        raise _truncated(name, "line", line, base + len(buf) - len(tail), len(tail))


def _truncated(name: str, unit: str, number: int, offset: int, size: int) -> DecodeError:
    ending = "no newline at its end" if unit == "line" else "shorter than its frame says"
    return DecodeError(
        f"{name} {unit} {number} (byte {offset}): truncated record ({size} bytes, {ending})"
    )


def _raise_too_large(lines: list[bytes], name: str, line: int, offset: int, max_size: int) -> None:
    for text in lines:
        if len(text) > max_size:
            raise RecordTooLargeError(
                f"{name} line {line} (byte {offset}): record of {len(text)} bytes is above the "
                f"limit of {max_size} bytes"
            )
        line += 1
        offset += len(text) + 1


def _walk_to_json_error(
    lines: list[bytes], decoder: Any, name: str, line: int, offset: int,
) -> Iterator[Any]:
    # The slow walk, taken only once a buffer is known to hold a bad line: yield the good lines
    # before it, then name it.
    for text in lines:
        try:
            item = decoder.decode(text)
        except _BAD as exc:
            raise DecodeError(f"{name} line {line} (byte {offset}): {_reason(exc, text)}") from None
        yield line, offset, item
        line += 1
        offset += len(text) + 1
    raise AssertionError("a line failed to decode once but not twice")  # pragma: no cover


def _iter_msgpack(
    data: object, decoder: Any, name: str, header: bool, max_size: int, number: int, base: int,
) -> Iterator[Any]:
    buf = _as_bytes(data)
    end = len(buf)
    pos = 0
    unpack = _FRAME.unpack_from
    crc32 = zlib.crc32
    decode = decoder.decode
    while pos < end:
        where = f"{name} record {number} (byte {base + pos})"
        if end - pos < FRAME_HEADER_SIZE:
            raise _truncated(name, "record", number, base + pos, end - pos)
        size, checksum = unpack(buf, pos)
        if size > max_size:
            raise RecordTooLargeError(
                f"{where}: record of {size} bytes is above the limit of {max_size} bytes"
            )
        start = pos + FRAME_HEADER_SIZE
        stop = start + size
        if stop > end:
            raise _truncated(name, "record", number, base + pos, end - pos)
        payload = buf[start:stop]
        if crc32(payload) != checksum:
            raise DecodeError(f"{where}: checksum mismatch (the record is corrupt)")
        if header:
            check_header(payload, "msgpack", where=where)
            header = False
        else:
            try:
                item = decode(payload)
            except _BAD as exc:
                raise DecodeError(f"{where}: {_reason(exc, payload)}") from None
            yield number, base + pos, item
        pos = stop
        number += 1


def _read_file(
    path: str | os.PathLike[str], fmt: Format, decoder: Any, max_size: int,
) -> Iterator[Any]:
    name = os.fspath(path)
    with open(path, "rb") as file:
        if fmt == "json":
            yield from _read_json_file(file, name, decoder, max_size)
        else:
            yield from _read_msgpack_file(file, name, decoder, max_size)


def _read_json_file(file: Any, name: str, decoder: Any, max_size: int) -> Iterator[Any]:
    line, offset, header, pending = 1, 0, True, b""
    while chunk := file.read(_CHUNK):
        pending += chunk
        cut = pending.rfind(b"\n") + 1
        if not cut:
            if len(pending) > max_size:
                raise RecordTooLargeError(
                    f"{name} line {line} (byte {offset}): record of more than {max_size} bytes "
                    f"is above the limit"
                )
            continue
        complete, pending = pending[:cut], pending[cut:]
        yield from _iter_json(complete, decoder, name, header, max_size, line, offset)
        line += complete.count(b"\n")
        offset += cut
        header = False
    if pending:
        raise _truncated(name, "line", line, offset, len(pending))


def _read_msgpack_file(file: Any, name: str, decoder: Any, max_size: int) -> Iterator[Any]:
    number, offset, header, pending = 1, 0, True, b""
    while chunk := file.read(_CHUNK):
        pending += chunk
        # Cut after the last whole frame so each piece decodes on its own.
        pos = frames = 0
        while len(pending) - pos >= FRAME_HEADER_SIZE:
            size = _FRAME.unpack_from(pending, pos)[0]
            if size > max_size:  # hand it over: _iter_msgpack refuses it, naming the place
                pos, frames = len(pending), frames + 1
                break
            if pos + FRAME_HEADER_SIZE + size > len(pending):
                break
            pos += FRAME_HEADER_SIZE + size
            frames += 1
        if not frames:
            continue
        complete, pending = pending[:pos], pending[pos:]
        yield from _iter_msgpack(complete, decoder, name, header, max_size, number, offset)
        number += frames
        offset += pos
        header = False
    if pending:
        raise _truncated(name, "record", number, offset, len(pending))
