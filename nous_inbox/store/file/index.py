"""The ``file:`` store's stream index: what it knows of each session in the file, kept up with it.

:class:`StreamIndex` reads a stream the first time it is touched, counts and lists the streams,
takes in what other writers appended, and names the line and byte of anything wrong.

Readers. Opening reads the header and the last few lines (to find where the last complete
append ends), nothing else: a stream is read the first time it is touched, by searching the
file, a quarter MiB at a time, for the lines that begin with its envelope
``{"stream":<name>,"event":``, as this library writes them, and decoding only those. So opening
a large log to steer one session costs what that session holds, and a damaged record of one
session never keeps another from being read. ``streams()`` scans the envelopes of every line
once, without decoding events, and counts each stream's records as it goes: a ``version`` of a
stream not yet read is then that count, without reading the file again or keeping any event
(what ``nous-inbox sessions`` needs). After that, ``version`` is a ``fstat``: only when the file grew
is the new tail read, and only the streams already touched keep its events. At most 64 streams
stay decoded; touching one more lets go of the one touched longest ago, which is simply read
from the file again when it is next touched, so a long-lived store serving many sessions stays
bounded.

Reading fast. A chunk's lines of the stream are decoded in one batch, in msgspec's own loop (a
chunk holding only that stream's lines, as a file of one session does, is split in C), and
checked in one pass; a line's place in the file (line number, byte offset) is worked out only
for an error. The cyclic garbage collector is paused while a stream or a tail is read (see
``nous_inbox.codec``): what is read is acyclic, and the collector's passes over every event
already read would make a long read several times slower; the caller's collector state is restored.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Final

import msgspec

from nous_inbox._collector import collector_paused
from nous_inbox._log_reader import bytes_before, decode_lines, reason_of
from nous_inbox.codec import DECODE_ERRORS
from nous_inbox.errors import DecodeError
from nous_inbox.events import Event
from nous_inbox.store.base import check_stream
from nous_inbox.store.base.moves import MoveLog
from nous_inbox.store.file.log import RECORD_DECODER, LogFile

__all__ = ["CACHED_STREAMS", "StreamIndex", "envelope"]

logger: Final = logging.getLogger("nous_inbox.store.file")

_CHUNK: Final = 256 * 1024
"""How much of the file is read and searched at once: small enough that its lines are still in
the processor's cache when they are decoded."""
_encode_name: Final = msgspec.json.Encoder().encode
# The envelope every record line begins with; the stream name is a JSON string.
_ENVELOPE: Final = re.compile(rb'\n\{"stream":("(?:[^"\\\n]|\\.)*"),"event":')
CACHED_STREAMS: Final = 64
"""How many streams a store keeps decoded at most; the least recently touched goes first."""


def envelope(stream: str) -> bytes:
    """How every record line of ``stream`` begins, as this library writes it: a line is found
    by its envelope without decoding it.

    >>> envelope("s1")
    b'{"stream":"s1","event":'
    """
    return b'{"stream":' + _encode_name(stream) + b',"event":'


class StreamIndex(LogFile):
    """What a store knows of each stream in its file: the streams touched, decoded (at most
    ``CACHED_STREAMS``), the counts and names ``streams()`` found, and the lines that are
    not in the usual form; kept up with the file by :meth:`_catch_up`."""

    _scans = 0  # how many times the file was searched for one stream's records

    def _reset(self) -> None:
        """Know nothing of the file yet: what a store just opened knows."""
        super()._reset()
        self._streams: dict[str, list[Event]] = {}  # the streams touched so far, decoded
        # The version of each stream let go of from the cache: an append needs only that, so
        # one to a stream out of the cache appends without decoding it again.
        self._evicted: dict[str, int] = {}
        self._names: set[str] | None = None  # every stream's name, once streams() looked
        self._counts: dict[str, int] = {}  # a stream's records, counted when streams() looked
        self._checked = 0  # lines before this offset were checked to begin with the envelope
        self._stray: dict[str, int] = {}  # stream -> a line of it without the usual envelope
        self._stray_bad: tuple[int, str] | None = None  # a line without envelope, undecodable
        self._holes: set[int] = set()  # lines of NULs a torn append left, already reported
        # The streams seen to move since: a new file (a delete's copy) is read afresh, so what
        # moved before is forgotten and a host's next look is a full one.
        moves: MoveLog | None = self.__dict__.get("_moves")
        if moves is None:
            self._moves = MoveLog()
        else:
            moves.forget()

    # -- reading ---------------------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Take in what was appended since the last look; a ``fstat`` when nothing was."""
        seen = self._stat()
        if seen == self._seen:
            return
        if not seen[2]:  # replaced by a delete (or removed): read the file now at the path
            self._reopen()
            seen = self._stat()
        size = seen[0]
        if size < self._end:
            raise DecodeError(
                f"{self.path}: the log is {size} bytes, shorter than the {self._end} bytes "
                f"already read; it was truncated or replaced behind this store's back"
            )
        if not self._header and not self._read_header(size):
            self._seen = seen
            return
        good = self._complete_end(self._end, size)
        if self._seen[0] < 0:
            self._end = good  # opening: the streams are read when touched, not now
        elif good > self._end:
            try:
                self._take_in(self._end, good)
            except DecodeError:
                # What others appended is not a clean run of appends: a hole a torn append
                # left, or a damaged record. Raising here would stop this store for every
                # session, at every later call, where a store opened now reads each session
                # from the file (a hole skipped, damage refused to its own session only): so
                # forget what was decoded and be that store.
                self._forget()
                self._end = good
        self._seen = seen

    def _forget(self) -> None:
        """Let go of every decoded stream and count: each is read from the file when touched."""
        self._streams = {}
        self._evicted = {}
        self._names = None
        self._counts = {}
        self._moves.forget()

    def _take_in(self, start: int, end: int) -> None:
        """Take in the complete appends of ``[start, end)`` that others wrote since the last
        look: every line is decoded (the whole tail, in msgspec's own loop; positions worked
        out only for an error), checked, and kept for the streams already touched."""
        with collector_paused():
            self._take_in_paused(start, end)

    def _take_in_paused(self, start: int, end: int) -> None:
        streams, names = self._streams, self._names
        pos = start
        due = 0  # records of the current append still to come
        batch: list[Event] = []
        batch_stream, batch_start = "", 0
        while pos < end:
            data = self._pread(pos, min(end, pos + _CHUNK))
            cut = data.rfind(b"\n") + 1
            if not cut:  # one line longer than the chunk: read through to its end
                data = self._pread(pos, end)
                cut = data.find(b"\n") + 1
            lines = data[:cut].split(b"\n")
            lines.pop()
            records, bad = decode_lines(RECORD_DECODER, lines, self._max)
            if bad is not None:
                raise bad.error(self._place(pos + bytes_before(lines, len(records))))
            offset = pos
            for line, record in zip(lines, records, strict=True):
                stream = record.stream
                if due:
                    if stream != batch_stream or record.more != due - 1:
                        raise self._broken(offset, batch_start, due, batch_stream)
                else:
                    if stream not in streams and (names is None or stream not in names):
                        try:
                            check_stream(stream)
                        except ValueError as exc:
                            raise self._damage(offset, str(exc)) from None
                    if record.more < 0:
                        raise self._damage(offset, f"invalid more={record.more}")
                    batch_stream, batch_start = stream, offset
                log = streams.get(stream)
                if log is not None:
                    expected = len(log) + len(batch) + 1
                    if record.event.seq != expected:
                        raise self._damage(offset, f"stream {stream!r} has seq "
                                                   f"{record.event.seq} where {expected} was due")
                    batch.append(record.event)
                due = record.more
                offset += len(line) + 1
                if due:
                    continue
                if log is not None:
                    log.extend(batch)
                    batch = []
                elif stream in self._evicted:
                    del self._evicted[stream]  # read (and checked) again when next touched
                if names is not None:
                    names.add(stream)
                    self._counts[stream] = record.event.seq if log is None else len(log)
                self._moves.note(stream)
                self._end = offset
            pos += cut

    def _load(self, stream: str) -> list[Event]:
        """The events of ``stream``, read from the file the first time it is touched.

        At most ``CACHED_STREAMS`` streams stay decoded: touching one more lets go of the one
        touched longest ago (it is read from the file again if it is read again; its version is
        kept, so appends and versions need no read), so a long-lived store that serves many
        sessions does not grow without bound.
        """
        streams = self._streams
        log = streams.pop(stream, None)
        if log is None:
            if self._end > self._header:
                self._scans += 1
                with collector_paused():
                    log = self._scan(stream)
            else:
                log = []
            self._evicted.pop(stream, None)
            while len(streams) >= CACHED_STREAMS:
                oldest = next(iter(streams))
                self._evicted[oldest] = len(streams.pop(oldest))
        streams[stream] = log  # the most recently touched last
        return log

    def _append_version(self, stream: str) -> int:
        """The version an append to ``stream`` continues from, decoding it only when this store
        has never read it: one let go of from the cache is not read again for an append (with
        more sessions than the cache holds, each append would rescan the file)."""
        if stream in self._evicted:
            return self._evicted[stream]
        return len(self._load(stream))

    def _check_envelopes(self) -> None:
        """Check that every line begins with the envelope this library writes; cached.

        Two byte counts per chunk, in C: the lines, and the lines that begin
        ``{"stream":"``. Only a chunk where they differ is walked line by line; a line found
        there is decoded: one that does not decode is damage no stream can be read past, one
        that does is refused to its own stream's readers only. ``_scan`` does the same as it
        goes, in its one pass.
        """
        for base, data, cut in self._chunks(max(self._checked, self._header)):
            self._check_chunk(base, data, cut)
        self._checked = self._end
        self._refuse_strays(None)

    def _refuse_strays(self, stream: str | None) -> None:
        if self._stray_bad is not None:
            raise self._damage(*self._stray_bad)
        if stream in self._stray:
            raise self._damage(self._stray[stream], f"a record of stream {stream!r} not in the "
                               f'form this library writes ({{"stream":...,"event":...}})')

    def _chunks(self, start: int) -> Iterator[tuple[int, bytes, int]]:
        """The whole lines of ``[start, _end)``, ``_CHUNK`` bytes at a time: ``(base, data, cut)``
        where ``data[:cut]`` is the file from ``base`` (the newline before the first line) to
        the last line's end. Read with ``pread``, so nothing stays in memory or mapped."""
        pos, end = start - 1, self._end - 1
        while pos < end:
            data = self._pread(pos, min(end, pos + _CHUNK) + 1)
            cut = data.rfind(b"\n")
            if cut <= 0:  # one line longer than the chunk
                data = self._pread(pos, end + 1)
                cut = data.rfind(b"\n")
            yield pos, data, cut
            pos += cut

    def _check_chunk(self, base: int, data: bytes, cut: int) -> None:
        if data.count(b"\n", 0, cut) != data.count(b'\n{"stream":"', 0, cut):
            self._find_strays(data[:cut], base)

    def _find_strays(self, chunk: bytes, base: int) -> None:
        lines = chunk.split(b"\n")
        offset = base + 1
        for line in lines[1:]:
            if not line.startswith(b'{"stream":"'):
                try:
                    record = RECORD_DECODER.decode(line)
                except DECODE_ERRORS as exc:
                    if b"\0" in line:
                        # A hole a torn append left (its lost blocks read as NULs): it holds
                        # no record this library wrote, so no session is refused for it; a
                        # record it swallowed is a seq gap its own stream's readers see.
                        if offset not in self._holes:
                            self._holes.add(offset)
                            logger.warning("%s: line at byte %d holds NUL bytes (an append torn "
                                           "by a power loss), not a record; skipped",
                                           self.url, offset)
                    elif self._stray_bad is None:
                        self._stray_bad = (offset, reason_of(exc, line))
                else:
                    self._stray.setdefault(record.stream, offset)
            offset += len(line) + 1

    def _scan(self, stream: str) -> list[Event]:
        # Find the stream's lines by their envelope, a chunk at a time, decode them in one batch
        # (msgspec's own loop) and check them in order; check every line's envelope in the same
        # pass (once: the result is kept). Where a line starts is worked out only for an error,
        # or to see that the records of one append sit on adjacent lines.
        checked = self._checked
        key = b"\n" + envelope(stream)
        events: list[Event] = []
        append = events.append
        due = 0
        batch: tuple[_Lines, int] | None = None  # where the current append began
        previous = -1  # where the line after the last one found begins
        for base, chunk, cut in self._chunks(self._header):
            found = _Lines.find(chunk, cut, key, base)
            if found.starts is not None and base + cut > checked:
                self._check_chunk(base, chunk, cut)  # (a chunk of the stream's lines only is)
            if not found.lines:
                continue
            records, bad = decode_lines(RECORD_DECODER, found.lines, self._max)
            apart = found.starts is not None  # the stream's lines may have others between
            seq = len(events)
            for index, record in enumerate(records):
                more = record.more
                if due:
                    if (apart or not index) and not found.adjacent(index, previous):
                        raise self._broken(found.after(index, previous), *found.began(batch),
                                           due, stream)
                    if more != due - 1:
                        raise self._broken(found.start(index), *found.began(batch), due, stream)
                else:
                    if more < 0:
                        raise self._damage(found.start(index), f"invalid more={more}")
                    batch = (found, index)
                event = record.event
                seq += 1
                if event.seq != seq:
                    # A record missing from the stream's lines: most likely a line whose
                    # envelope is damaged, so name the first line between that does not decode.
                    after = found.after(index, previous)
                    self._find_damage(after if after > 0 else self._header, found.start(index))
                    self._refuse_strays(stream)
                    raise self._damage(found.start(index), f"stream {stream!r} has seq "
                                                           f"{event.seq} where {seq} was due")
                append(event)
                due = more
            if bad is not None:
                index = len(records)
                if due and not found.adjacent(index, previous):
                    raise self._broken(found.after(index, previous), *found.began(batch), due,
                                       stream)
                raise bad.error(self._place(found.start(index)))
            previous = found.after(len(found.lines), previous)
        self._checked = self._end
        self._refuse_strays(stream)
        if due:
            raise self._broken(previous, *_Lines.began(batch), due, stream)
        return events

    def _find_damage(self, start: int, end: int) -> None:
        pos = start
        for line in self._pread(start, end).split(b"\n")[:-1]:
            try:
                RECORD_DECODER.decode(line)
            except DECODE_ERRORS as exc:
                raise self._damage(pos, reason_of(exc, line)) from None
            pos += len(line) + 1

    def _scan_names(self) -> set[str]:
        # Every line's envelope, no event decoded; a line without one was named by the check.
        self._check_envelopes()
        found: dict[bytes, int] = {}
        counted: dict[bytes, int] = {}
        for base, chunk, cut in self._chunks(self._header):
            for match in _ENVELOPE.finditer(chunk, 0, cut):
                raw = match.group(1)
                if raw in counted:
                    counted[raw] += 1
                else:
                    counted[raw] = 1
                    found[raw] = base + match.start() + 1
        names = set(self._stray)
        counts: dict[str, int] = {}
        for raw, offset in found.items():
            try:
                name = check_stream(msgspec.json.decode(raw, type=str))
            except (ValueError, msgspec.DecodeError) as exc:
                raise self._damage(offset, str(exc)) from None
            names.add(name)
            counts[name] = counts.get(name, 0) + counted[raw]
        self._counts = counts
        return names

    # -- errors that name the line (worked out only when there is one) ---------------------------

    def _line_at(self, offset: int) -> int:
        line, pos = 1, 0
        while pos < offset:
            chunk = self._pread(pos, min(offset, pos + _CHUNK))
            if not chunk:
                break
            line += chunk.count(b"\n")
            pos += len(chunk)
        return line

    def _place(self, offset: int) -> str:
        return f"{self.path} line {self._line_at(offset)} (byte {offset})"

    def _damage(self, offset: int, reason: str) -> DecodeError:
        return DecodeError(f"{self._place(offset)}: {reason}")

    def _broken(self, offset: int, batch_start: int, due: int, stream: str) -> DecodeError:
        return self._damage(
            offset, f"the append that began at line {self._line_at(batch_start)} is broken off "
                    f"({due} more record(s) of stream {stream!r} were due)")


class _Lines:
    """One stream's lines in a chunk of the file, and where each starts, worked out on demand.

    When every line of the chunk is the stream's (a file of one session, or a long run of one
    session's appends), the chunk is split in C and no start is known until one is asked for
    (an error to place); otherwise the envelope search notes each line's start as it goes.
    """

    __slots__ = ("base", "lines", "starts")

    def __init__(self, lines: list[bytes], starts: list[int] | None, base: int) -> None:
        self.lines, self.starts, self.base = lines, starts, base

    @classmethod
    def find(cls, chunk: bytes, cut: int, key: bytes, base: int) -> _Lines:
        """The lines of ``chunk[:cut]`` (from ``base`` in the file) that begin with ``key``."""
        if chunk.count(key, 0, cut) == chunk.count(b"\n", 0, cut):
            return cls(chunk[1:cut].split(b"\n"), None, base)
        lines: list[bytes] = []
        starts: list[int] = []
        find = chunk.find
        hit = find(key, 0, cut)
        while hit >= 0:
            stop = find(b"\n", hit + 1, cut)
            if stop < 0:
                stop = cut
            lines.append(chunk[hit + 1:stop])
            starts.append(base + hit + 1)
            hit = find(key, stop, cut)
        return cls(lines, starts, base)

    def start(self, index: int) -> int:
        """Where line ``index`` starts in the file."""
        if self.starts is not None:
            return self.starts[index]
        return self.base + 1 + bytes_before(self.lines, index)

    def adjacent(self, index: int, previous: int) -> bool:
        """Whether line ``index`` follows the line before it (``previous``: where the line
        after the last one found in earlier chunks begins) with no other line between."""
        if not index:
            return self.start(0) == previous
        if self.starts is None:
            return True  # every line of the chunk is the stream's
        return self.starts[index] == self.starts[index - 1] + len(self.lines[index - 1]) + 1

    def after(self, index: int, previous: int) -> int:
        """Where the line after line ``index - 1`` starts (``previous`` for the first line)."""
        if not index:
            return previous
        if self.starts is None:
            return self.base + 1 + bytes_before(self.lines, index)  # adjacent, by construction
        return self.starts[index - 1] + len(self.lines[index - 1]) + 1

    @staticmethod
    def began(batch: tuple[_Lines, int] | None) -> tuple[int]:
        """Where the append ``batch`` (its lines and index) began, for an error message."""
        return (batch[0].start(batch[1]),) if batch is not None else (0,)

