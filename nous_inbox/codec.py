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
{"format":"nous-inbox","version":5}
{"type":"message_sent","target":"next_step","wakeup":true,"message":{"role":"user","content":"go"},"seq":1}
{"type":"queue_claimed","target":"next_step","count":1,"seq":2}
>>> [(line, offset, type(event).__name__) for line, offset, event in iter_events(log)]
[(2, 36, 'MessageSent'), (3, 144, 'QueueClaimed')]
>>> list(iter_events(log.replace(b'"seq":2', b'"seq":"2"'), name="events.jsonl"))
Traceback (most recent call last):
...
nous_inbox.errors.DecodeError: events.jsonl line 3 (byte 144): Expected `int`, got `str` - at `$.seq`

What is refused: an unknown event ``type`` (as a newer nous-inbox's, with "upgrade", whatever
the header says), a wrong type anywhere, malformed JSON or MessagePack,
a blank line, a record cut short (no final newline, or a frame shorter than its length), a frame
whose checksum does not match, a record above ``max_record_size`` (16 MiB by default;
:class:`~nous_inbox.errors.RecordTooLargeError`), and a header from a newer schema version than
this library reads. A record written before a defaulted field was added still decodes: the field
takes its default.

A multi-stream log (the ``file:`` store) holds :class:`Record` envelopes instead of bare events:
the stream name, the event, and ``more``, how many records of the same atomic append follow this
one, so a reader can tell a batch cut short by a crash from a complete one.

Formats are objects. :data:`JSON_LINES` and :data:`MSGPACK` are the two :class:`LogFormat` objects;
each knows how to encode a value, frame a record, write and check a header, and read a whole log.
The functions below take ``fmt`` as one of them or by name (``"json"``, ``"msgpack"``), and a
store holds the one it writes with, so nothing threads a format string through its code.

>>> from nous_inbox.events import Event, Warned
>>> MSGPACK.decode(MSGPACK.encode(Warned(seq=1, text="hi")), Event)
Warned(text='hi', seq=1)

Design notes. Decoders are built once per type and reused; reading a log's bytes (lines, frames,
the place of a bad record) is ``nous_inbox._log_reader``'s. A bulk decode or fold pauses the
cyclic garbage collector (``nous_inbox._collector.collector_paused``): everything it builds is
acyclic, and the collector's full passes over the objects already built would grow with the log;
the caller's collector state (enabled or not) is restored on the way out, errors included. The
MessagePack frame is ``length (4 bytes, big-endian) | crc32 (4 bytes) | payload``: MessagePack has
little redundancy, so without the checksum a flipped byte inside a string would decode silently as
other text.
"""

from __future__ import annotations

import abc
import os
import zlib
from collections.abc import Iterable, Iterator
from typing import IO, Any, Final, Literal

import msgspec

from nous_inbox._log_reader import (
    DECODE_ERRORS,
    FRAME,
    FRAME_HEADER_SIZE,
    iter_json,
    iter_msgpack,
    read_json_file,
    read_msgpack_file,
    reason_of,
)
from nous_inbox.errors import DecodeError, RecordTooLargeError
from nous_inbox.events import SCHEMA_VERSION, Event
from nous_inbox.message import enc_hook

__all__ = [
    "DECODE_ERRORS",
    "FORMAT_NAME",
    "FRAME_HEADER_SIZE",
    "JSON_LINES",
    "MAX_RECORD_SIZE",
    "MAX_STREAM_NAME",
    "MSGPACK",
    "Format",
    "Header",
    "LogFormat",
    "Record",
    "check_header",
    "decode_event",
    "decode_events",
    "decode_record",
    "encode_event",
    "encode_header",
    "encode_record",
    "frame",
    "get_format",
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

MAX_STREAM_NAME: Final = 256
"""The longest stream (session) name a record may carry, in characters: a store refuses a longer
one, and a record's size is bounded with it."""

Format = Literal["json", "msgpack"]
"""A format by name, as the functions below accept it (or pass a :class:`LogFormat`)."""



class Header(msgspec.Struct, frozen=True, kw_only=True):
    """The first record of a log: which format, which schema version wrote it."""

    format: str
    version: int

    def check(self, where: str) -> Header:
        """Return the header if this library can read what it heads, else raise ``DecodeError``.

        A log (or database) from a newer schema version is refused rather than misread; an
        older one is fine. ``where`` names the place in the error.

        >>> Header(format="nous-inbox", version=99).check("a.jsonl line 1")
        Traceback (most recent call last):
        ...
        nous_inbox.errors.DecodeError: a.jsonl line 1: written with schema version 99, newer than this nous-inbox reads (5); upgrade nous-inbox to read it
        """
        if self.format != FORMAT_NAME:
            raise DecodeError(f"{where}: not a nous-inbox log (format {self.format!r})")
        if self.version > SCHEMA_VERSION:
            raise DecodeError(
                f"{where}: written with schema version {self.version}, newer than this "
                f"nous-inbox reads ({SCHEMA_VERSION}); upgrade nous-inbox to read it"
            )
        if self.version < 1:
            raise DecodeError(f"{where}: invalid schema version {self.version}")
        return self


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


_HEADER: Final = Header(format=FORMAT_NAME, version=SCHEMA_VERSION)


class LogFormat(abc.ABC):
    """One way of writing a log: how a value is encoded, a record framed, a whole log read.

    The two instances are :data:`JSON_LINES` and :data:`MSGPACK`. ``decode`` and ``iter`` take
    the type to decode (:data:`~nous_inbox.events.Event`, :class:`Record` or :class:`Header`);
    decoders are built once per format and type. Each shows as the name to import it by:

    >>> JSON_LINES, get_format("msgpack")
    (nous_inbox.codec.JSON_LINES, nous_inbox.codec.MSGPACK)
    """

    name: str
    """The format's name, as ``fmt`` strings spell it: ``"json"`` or ``"msgpack"``."""

    def __init__(self) -> None:
        self._decoders: dict[Any, Any] = {
            kind: self._decoder(kind) for kind in (Event, Record, Header)
        }

    def __repr__(self) -> str:
        return f"{__name__}.{'JSON_LINES' if self.name == 'json' else 'MSGPACK'}"

    @abc.abstractmethod
    def _decoder(self, kind: Any) -> Any: ...

    @abc.abstractmethod
    def encode(self, value: Event | Record | Header) -> bytes:
        """One value, bare: JSON without its newline, MessagePack without its frame."""

    @abc.abstractmethod
    def frame(self, payload: bytes) -> bytes:
        """One encoded value as it sits in a log: a JSON line, or a MessagePack frame."""

    def header(self) -> bytes:
        """The first record of a log of this format, framed and ready to write."""
        return self.frame(self.encode(_HEADER))

    def log(self, items: Iterable[Event | Record], *, header: bool = True) -> bytes:
        """A whole log: the header (unless ``header=False``), then one record per item."""
        encode, frame_ = self.encode, self.frame
        body = b"".join([frame_(encode(item)) for item in items])
        return self.header() + body if header else body

    def decoder(self, kind: Any) -> Any:
        """The compiled msgspec decoder of ``kind`` (raises msgspec's own errors, unplaced)."""
        return self._decoders[kind]

    def decode(
        self, data: Any, kind: Any, where: str = "record", max_size: int = MAX_RECORD_SIZE,
    ) -> Any:
        """One bare value of type ``kind``; ``DecodeError`` (naming ``where``) if it is not one."""
        if not isinstance(data, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"{where}: expected bytes, got {type(data).__name__}")
        size = len(data.encode() if isinstance(data, str) else data)
        if size > max_size:
            raise RecordTooLargeError(
                f"{where}: record of {size} bytes is above the limit of {max_size} bytes"
            )
        try:
            return self._decoders[kind].decode(data)
        except DECODE_ERRORS as exc:
            raise DecodeError(f"{where}: {reason_of(exc, data)}") from None

    def check_header(self, data: bytes, where: str = "header") -> Header:
        """Decode a header record (unframed) and refuse what this library cannot read."""
        try:
            header: Header = self._decoders[Header].decode(data)
        except DECODE_ERRORS as exc:
            raise DecodeError(f"{where}: not a nous-inbox log header: {reason_of(exc, data)}") from None
        return header.check(where)

    @abc.abstractmethod
    def iter(
        self, data: object, kind: Any, *, name: str = "<bytes>", header: bool = True,
        max_size: int = MAX_RECORD_SIZE, start: int = 1, base: int = 0, positions: bool = True,
    ) -> Iterator[Any]:
        """Decode a whole log held in ``data``: ``(number, offset, value)`` in order, or the bare
        values with ``positions=False`` (positions are then worked out only to name an error)."""

    @abc.abstractmethod
    def read_file(self, file: IO[bytes], name: str, kind: Any, max_size: int) -> Iterator[Any]:
        """Stream ``(number, offset, value)`` from an open binary file, a few MiB at a time."""


class _JsonLines(LogFormat):
    name = "json"
    _encoder: Final = msgspec.json.Encoder(enc_hook=enc_hook)

    def _decoder(self, kind: Any) -> Any:
        return msgspec.json.Decoder(kind)

    def encode(self, value: Event | Record | Header) -> bytes:
        return self._encoder.encode(value)

    def frame(self, payload: bytes) -> bytes:
        return payload + b"\n"

    def log(self, items: Iterable[Event | Record], *, header: bool = True) -> bytes:
        encode = self._encoder.encode
        body = b"".join([encode(item) + b"\n" for item in items])
        return self.header() + body if header else body

    def iter(
        self, data: object, kind: Any, *, name: str = "<bytes>", header: bool = True,
        max_size: int = MAX_RECORD_SIZE, start: int = 1, base: int = 0, positions: bool = True,
    ) -> Iterator[Any]:
        return iter_json(self.check_header, data, self._decoders[kind], name, header, max_size,
                         start, base, positions)

    def read_file(self, file: IO[bytes], name: str, kind: Any, max_size: int) -> Iterator[Any]:
        return read_json_file(self.check_header, file, name, self._decoders[kind], max_size)


class _MsgpackFrames(LogFormat):
    name = "msgpack"
    _encoder: Final = msgspec.msgpack.Encoder(enc_hook=enc_hook)

    def _decoder(self, kind: Any) -> Any:
        return msgspec.msgpack.Decoder(kind)

    def encode(self, value: Event | Record | Header) -> bytes:
        return self._encoder.encode(value)

    def frame(self, payload: bytes) -> bytes:
        return FRAME.pack(len(payload), zlib.crc32(payload)) + payload

    def iter(
        self, data: object, kind: Any, *, name: str = "<bytes>", header: bool = True,
        max_size: int = MAX_RECORD_SIZE, start: int = 1, base: int = 0, positions: bool = True,
    ) -> Iterator[Any]:
        items = iter_msgpack(self.check_header, data, self._decoders[kind], name, header,
                             max_size, start, base)
        return items if positions else (item for _, _, item in items)

    def read_file(self, file: IO[bytes], name: str, kind: Any, max_size: int) -> Iterator[Any]:
        return read_msgpack_file(self.check_header, file, name, self._decoders[kind], max_size)


JSON_LINES: Final[LogFormat] = _JsonLines()
"""JSON Lines: a header line, then one record a line (the ``file:`` store's format)."""

MSGPACK: Final[LogFormat] = _MsgpackFrames()
"""Framed MessagePack: each record ``length | crc32 | payload`` (a ``sqlite:`` row's body is a
bare MessagePack payload)."""

_FORMATS: Final = {"json": JSON_LINES, "msgpack": MSGPACK}


def get_format(fmt: Format | LogFormat) -> LogFormat:
    """The :class:`LogFormat` that ``fmt`` names (a format object passes through).

    >>> get_format("msgpack") is MSGPACK
    True
    >>> get_format("yaml")
    Traceback (most recent call last):
    ...
    ValueError: format must be 'json' or 'msgpack', got 'yaml'
    """
    if isinstance(fmt, LogFormat):
        return fmt
    found = _FORMATS.get(fmt) if isinstance(fmt, str) else None
    if found is None:
        raise ValueError(f"format must be 'json' or 'msgpack', got {fmt!r}")
    return found


# -- single values ---------------------------------------------------------------------------------


def encode_event(event: Event, fmt: Format | LogFormat = "json") -> bytes:
    """One event as JSON (no newline) or bare MessagePack (no frame).

    >>> from nous_inbox.events import Warned
    >>> encode_event(Warned(seq=1, text="hi"))
    b'{"type":"warned","text":"hi","seq":1}'
    >>> decode_event(encode_event(Warned(seq=1, text="hi"), "msgpack"), "msgpack")
    Warned(text='hi', seq=1)
    """
    return get_format(fmt).encode(event)


def encode_record(record: Record, fmt: Format | LogFormat = "json") -> bytes:
    """One :class:`Record` as JSON (no newline) or bare MessagePack (no frame)."""
    return get_format(fmt).encode(record)


def decode_event(
    data: bytes | str, fmt: Format | LogFormat = "json", *, where: str = "event",
    max_record_size: int = MAX_RECORD_SIZE,
) -> Event:
    """Read one event written by :func:`encode_event`; ``where`` names it in errors.

    >>> decode_event(b'{"type":"warned","text":"hi","seq":"one"}', where="stream 's' seq 1")
    Traceback (most recent call last):
    ...
    nous_inbox.errors.DecodeError: stream 's' seq 1: Expected `int`, got `str` - at `$.seq`
    """
    event: Event = get_format(fmt).decode(data, Event, where, max_record_size)
    return event


def decode_record(
    data: bytes | str, fmt: Format | LogFormat = "json", *, where: str = "record",
    max_record_size: int = MAX_RECORD_SIZE,
) -> Record:
    """Read one :class:`Record` written by :func:`encode_record`."""
    record: Record = get_format(fmt).decode(data, Record, where, max_record_size)
    return record


# -- headers ---------------------------------------------------------------------------------------


def encode_header(fmt: Format | LogFormat = "json") -> bytes:
    """The first record of a log, ready to write: a JSON line, or a MessagePack frame.

    >>> encode_header()
    b'{"format":"nous-inbox","version":5}\\n'
    """
    return get_format(fmt).header()


def check_header(data: bytes, fmt: Format | LogFormat = "json", *, where: str = "header") -> Header:
    """Decode a header record (without newline or frame) and refuse what this library cannot read.

    A log from a newer schema version is refused rather than misread; an older one is fine.

    >>> check_header(b'{"format":"nous-inbox","version":99}', where="a.jsonl line 1")
    Traceback (most recent call last):
    ...
    nous_inbox.errors.DecodeError: a.jsonl line 1: written with schema version 99, newer than this nous-inbox reads (5); upgrade nous-inbox to read it
    """
    return get_format(fmt).check_header(data, where)


# -- whole logs: writing ---------------------------------------------------------------------------


def json_lines(items: Iterable[Event | Record], *, header: bool = True) -> bytes:
    """A JSON Lines log: the header line (unless ``header=False``), then one line per item."""
    return JSON_LINES.log(items, header=header)


def frame(payload: bytes) -> bytes:
    """Frame one MessagePack payload: its length and crc32 (big-endian) before it."""
    return MSGPACK.frame(payload)


def msgpack_frames(items: Iterable[Event | Record], *, header: bool = True) -> bytes:
    """A framed MessagePack log: the header frame (unless ``header=False``), then one per item."""
    return MSGPACK.log(items, header=header)


# -- whole logs: reading ---------------------------------------------------------------------------


def iter_events(
    data: bytes, fmt: Format | LogFormat = "json", *, name: str = "<bytes>", header: bool = True,
    max_record_size: int = MAX_RECORD_SIZE, start_line: int = 1, start_offset: int = 0,
) -> Iterator[tuple[int, int, Event]]:
    """Decode a whole log held in ``data``, yielding ``(line, offset, event)`` in order.

    ``line`` is the 1-based line number (in MessagePack, the record number; the header counts
    as the first) and ``offset`` the byte offset where the record starts. ``name`` names the
    source in errors. ``header=False`` reads a bare run of records (no header expected);
    ``start_line`` and ``start_offset`` place ``data`` inside a larger file. The records before
    a bad one are yielded before the error is raised, as a file reader would.
    """
    return get_format(fmt).iter(data, Event, name=name, header=header, max_size=max_record_size,
                                start=start_line, base=start_offset)


def iter_records(
    data: bytes, fmt: Format | LogFormat = "json", *, name: str = "<bytes>", header: bool = True,
    max_record_size: int = MAX_RECORD_SIZE, start_line: int = 1, start_offset: int = 0,
) -> Iterator[tuple[int, int, Record]]:
    """Like :func:`iter_events` for a multi-stream log of :class:`Record` envelopes."""
    return get_format(fmt).iter(data, Record, name=name, header=header,
                                max_size=max_record_size, start=start_line, base=start_offset)


def decode_events(
    data: bytes, fmt: Format | LogFormat = "json", *, name: str = "<bytes>", header: bool = True,
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
    return get_format(fmt).iter(data, Event, name=name, header=header,
                                max_size=max_record_size, positions=False)


def read_events(
    path: str | os.PathLike[str], fmt: Format | LogFormat = "json", *,
    max_record_size: int = MAX_RECORD_SIZE,
) -> Iterator[tuple[int, int, Event]]:
    """Stream the events of a log file, a few MiB at a time: ``(line, offset, event)``.

    The file must start with a header. Errors name the file, the line and the byte offset.
    """
    return _read_file(path, get_format(fmt), Event, max_record_size)


def read_records(
    path: str | os.PathLike[str], fmt: Format | LogFormat = "json", *,
    max_record_size: int = MAX_RECORD_SIZE,
) -> Iterator[tuple[int, int, Record]]:
    """Like :func:`read_events` for a multi-stream log of :class:`Record` envelopes."""
    return _read_file(path, get_format(fmt), Record, max_record_size)


# -- internals -------------------------------------------------------------------------------------


def _read_file(
    path: str | os.PathLike[str], fmt: LogFormat, kind: Any, max_size: int,
) -> Iterator[Any]:
    name = os.fspath(path)
    with open(path, "rb") as file:
        yield from fmt.read_file(file, name, kind, max_size)
