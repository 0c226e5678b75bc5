"""FileStore (``file:PATH``): every session's events in one JSON Lines file you can ``tail -f``.

The file is a header line, then one :class:`~nous_inbox.codec.Record` a line: the stream name and
the event. An append of several events is one ``write()`` of several lines, then ``fsync``, so an
acknowledged append is on disk.

>>> import tempfile, os
>>> from nous_inbox.events import Warned
>>> path = os.path.join(tempfile.mkdtemp(), "inbox.jsonl")
>>> with FileStore(path) as store:
...     _ = store.append("s1", [Warned(text="a", at=1.0), Warned(text="b", at=1.0)])
>>> print(open(path).read(), end="")
{"format":"nous-inbox","version":2}
{"stream":"s1","event":{"type":"warned","text":"a","seq":1,"at":1.0},"more":1}
{"stream":"s1","event":{"type":"warned","text":"b","seq":2,"at":1.0}}
>>> with FileStore(path, read_only=True) as store:
...     [e.text for e in store.read("s1")]
['a', 'b']

Crash safety. ``more`` counts the records of the same append still to come, so a reader knows a
batch is complete only when it sees its ``more``-less last line. What a crash can leave at the
tail (a line without its newline, or the first lines of a batch without its last) is not part of
the log: readers ignore it, and the next writer cuts it off before appending. A power loss can
leave worse at the tail: an unacknowledged append whose blocks never reached the disk reads as
NUL bytes then a newline, or a new file's header as NULs. Such a tail (lines holding NUL bytes,
after the last complete append) is set aside: a writer moves it to a side file
``PATH.torn-<offset>`` (mode 0600) before cutting it off, and says so in a warning on the
``nous_inbox.store.file`` logger; a reader leaves it where it is, unread, and warns. Nothing
acknowledged is set aside: an acknowledged append was synced before it was acknowledged, and the
tail starts after the last complete one. A complete line without NUL bytes that does not
decode is never taken for a torn append, even last: it is damage (below), so a damaged
acknowledged record is never set aside and its seq never reused. A line of NUL bytes before a
complete append (a hole a torn append left) holds no record: it is skipped with a warning, and
a record it swallowed shows as its stream's seq gap. Anything else wrong *before* the tail (a line that does not
decode, a sequence number out of place, a batch broken off in the middle) is a
:class:`~nous_inbox.errors.DecodeError` naming the line and byte offset, never a silent skip; it
is raised to whoever reads the stream it belongs to. A store already open meets what others
append as a store opened then would: a hole skipped, damage refused to its own stream only.

Writers. Each append takes an exclusive ``flock`` on the file, catches up with what others wrote,
checks the expected version, writes, syncs and lets go. So writers in several processes take
turns (a CLI can steer a session whose owner has the file open), and one that cannot get the
lock within ``lock_timeout`` seconds (10 by default; ``open_store(url, lock_timeout=...)``)
gets a :class:`~nous_inbox.store.base.StoreLockedError`. The wait blocks the calling thread,
an asyncio loop's included: an owner's sends run on its worker thread, but a direct
``store.append`` from a coroutine should go through ``asyncio.to_thread``. A write that fails
(a full disk, a quota) is a :class:`~nous_inbox.errors.StoreError` naming the store and the
stream, and leaves the file as it was.
Readers never lock. ``read_only=True`` opens without write access at all: the file must exist
(else :class:`~nous_inbox.errors.StoreError`), nothing is created, locked or cut off (a torn tail
is left where it is and simply not read), and ``append``/``own`` raise ``ValueError``.

Owners. ``own(stream)`` locks ``PATH.owners/<hash>.lock`` (see :mod:`nous_inbox.store.lease`),
next to the log's real path, so every store on this log, in any process, sees the lease.
Snapshots (:mod:`nous_inbox.snapshot`) live beside it in ``PATH.snapshots/<hash>.snapshot``,
private files replaced atomically (see :mod:`nous_inbox.store._snapshots`).

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

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from typing import Final

import msgspec

from nous_inbox._collector import collector_paused
from nous_inbox.codec import (
    _BAD,
    JSON_LINES,
    MAX_RECORD_SIZE,
    Record,
    _decode_lines,
    _reason,
    _span,
)
from nous_inbox.errors import DecodeError, RecordTooLargeError, StoreError
from nous_inbox.events import Event
from nous_inbox.store._safety import check_store_file
from nous_inbox.store._snapshots import SnapshotFiles
from nous_inbox.store.base import (
    StoreBase,
    StoreLockedError,
    check_max_record_size,
    check_stream,
)
from nous_inbox.store.lease import Leases

__all__ = ["FileStore"]

logger: Final = logging.getLogger("nous_inbox.store.file")

_CHUNK: Final = 256 * 1024
"""How much of the file is read and searched at once: small enough that its lines are still in
the processor's cache when they are decoded."""
_TAIL: Final = 64 * 1024
_HEADER: Final = JSON_LINES.header()
_record: Final = JSON_LINES.decoder(Record)
_encode_name: Final = msgspec.json.Encoder().encode
# The envelope every record line begins with; the stream name is a JSON string.
_ENVELOPE: Final = re.compile(rb'\n\{"stream":("(?:[^"\\\n]|\\.)*"),"event":')
_NO_SPACE: Final = (errno.ENOSPC, errno.EDQUOT)
_CACHED_STREAMS: Final = 64
"""How many streams a store keeps decoded at most; the least recently touched goes first."""


class FileStore(StoreBase):
    """A :class:`~nous_inbox.store.base.Store` over one JSON Lines file.

    ``path`` is created (mode 0600) unless ``read_only``. ``lock_timeout`` bounds the wait for
    another writer's append (seconds); ``max_record_size`` bounds one line, read or written. A
    path that cannot be opened as a log (missing when read-only, a directory, unreadable) is a
    :class:`~nous_inbox.errors.StoreError` naming it.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, read_only: bool = False,
        lock_timeout: float = 10.0, max_record_size: int = MAX_RECORD_SIZE,
    ) -> None:
        if type(lock_timeout) not in (int, float) or not 0 <= lock_timeout < float("inf"):
            raise ValueError(f"lock_timeout must be a number of seconds >= 0, got {lock_timeout!r}")
        self.path = os.fspath(path)
        self.url = f"file:{self.path}"
        self.read_only = read_only
        self.lock_timeout = float(lock_timeout)
        self.max_record_size = self._max = check_max_record_size(self.url, max_record_size)
        self._format = JSON_LINES
        self._lock = threading.RLock()
        self._fd = self._open()
        self._reset()
        self._leases = Leases(self.url, os.path.realpath(self.path) + ".owners")
        self._snapshots = SnapshotFiles(self.url, os.path.realpath(self.path) + ".snapshots")
        try:
            if read_only:
                self._catch_up()
            else:
                with self._file_lock():
                    self._catch_up()
                    self._repair()
        except BaseException:
            os.close(self._fd)
            raise

    def _reset(self) -> None:
        """Know nothing of the file yet: what a store just opened knows."""
        self._streams: dict[str, list[Event]] = {}  # the streams touched so far, decoded
        # The version of each stream let go of from the cache: an append needs only that, so
        # one to a stream out of the cache appends without decoding it again.
        self._evicted: dict[str, int] = {}
        self._names: set[str] | None = None  # every stream's name, once streams() looked
        self._counts: dict[str, int] = {}  # a stream's records, counted when streams() looked
        self._header = 0  # offset just past the header line (0: no header yet)
        self._end = 0  # offset just past the last complete append taken in
        self._torn = -1  # where a tail set aside (read-only) or left unread begins
        self._checked = 0  # lines before this offset were checked to begin with the envelope
        self._stray: dict[str, int] = {}  # stream -> a line of it without the usual envelope
        self._stray_bad: tuple[int, str] | None = None  # a line without envelope, undecodable
        self._holes: set[int] = set()  # lines of NULs a torn append left, already reported
        self._seen: tuple[int, int, int] = (-1, -1, -1)

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"FileStore({self.path!r}{mode})"

    # -- the hooks (called with the lock held) ---------------------------------------------------

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ValueError(f"{self.url} store is closed")

    @contextlib.contextmanager
    def _appending(self, stream: str) -> Iterator[int]:
        with self._file_lock():
            self._catch_up()
            self._repair()
            yield self._append_version(stream)

    def _encode(self, stream: str, events: list[Event]) -> list[bytes]:
        last = len(events) - 1
        encode = self._format.encode
        return [encode(Record(stream=stream, event=event, more=last - i))
                for i, event in enumerate(events)]

    def _decode(self, stream: str, record: bytes) -> Event:
        try:
            decoded: Record = _record.decode(record)
        except _BAD:
            pass
        else:
            return decoded.event
        try:  # again, for an error that says where
            decoded = self._format.decode(record, Record, "it would not read back",
                                          self.max_record_size)
        except DecodeError as exc:  # name the path inside the event, not inside the envelope
            raise DecodeError(str(exc).replace("`$.event.", "`$.")) from None
        return decoded.event

    def _write(self, stream: str, events: list[Event], records: list[bytes], *,
               batch: object | None = None) -> None:
        data = b"".join([record + b"\n" for record in records])
        try:
            self._write_bytes(data)
        except OSError as exc:
            raise self._write_failed(f"append to stream {stream!r}", exc) from exc
        log = self._streams.get(stream)
        if log is not None:
            log.extend(events)
        else:  # out of the cache (_append_version): its version is all that is kept
            self._evicted[stream] = events[-1].seq
        if self._names is not None:
            self._names.add(stream)
            self._counts[stream] = events[-1].seq
        self._end += len(data)
        self._seen = self._stat()

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        self._catch_up()
        return iter(self._load(stream)[after:])

    def _version(self, stream: str) -> int:
        self._catch_up()
        log = self._streams.get(stream)
        if log is not None:
            return len(log)  # a version does not refresh a stream's place in the cache
        if stream in self._evicted:
            return self._evicted[stream]
        if self._names is not None and stream not in self._stray:
            # Counted by streams() in its one pass: no rescan, nothing decoded or kept.
            return self._counts.get(stream, 0)
        return len(self._load(stream))

    def _stream_names(self) -> list[str]:
        self._catch_up()
        if self._names is None:
            self._names = self._scan_names()
        return sorted(self._names)

    def _save_snapshot(self, stream: str, seq: int, data: bytes) -> bool:
        return self._snapshots.save(stream, seq, data)

    def _load_snapshot(self, stream: str) -> tuple[int, bytes] | None:
        return self._snapshots.load(stream)

    def _snapshot_seq(self, stream: str) -> int | None:
        return self._snapshots.seq(stream)  # its first 8 bytes, not the whole snapshot

    def _delete(self, stream: str) -> None:
        self._snapshots.remove(stream)  # first: a snapshot without its log would be a stale cache
        with self._file_lock():
            self._catch_up()
            self._repair()
            self._rewrite_without(stream)

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._streams = {}
            self._evicted = {}
            self._names = None
            self._counts = {}

    # -- opening, locking, writing ---------------------------------------------------------------

    def _open(self) -> int:
        if os.path.isdir(self.path):
            raise StoreError(f"{self.url} is not a usable log file: it is a directory")
        try:
            fd = self._open_file()
        except FileNotFoundError as exc:
            if self.read_only:
                raise StoreError(
                    f"{self.url}: no store at {self.path} (opened read-only, so nothing was "
                    f"created)"
                ) from exc
            raise StoreError(
                f"{self.url} is not a usable log file: its directory "
                f"{os.path.dirname(os.path.abspath(self.path))} does not exist"
            ) from exc
        except OSError as exc:
            raise StoreError(f"{self.url} is not a usable log file: {exc.strerror or exc}") from exc
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise StoreError(
                    f"{self.url} is not a usable log file: it is "
                    f"{'a directory' if stat.S_ISDIR(mode) else 'not a regular file'}"
                )
            check_store_file(self.url, self.path, fd=fd, read_only=self.read_only)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_file(self) -> int:
        # O_NONBLOCK so a FIFO at the path is refused below instead of hanging the open; it
        # changes nothing for a regular file.
        if self.read_only:
            return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return os.open(self.path, flags)
        try:
            os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
            _sync_directory(self.path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.001
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(self._fd).st_nlink:
                    break
                # A delete replaced the file while we waited: its lock guards nothing now.
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                self._reopen()
                continue
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"{self.url}: another writer held the file lock for more than "
                        f"{self.lock_timeout:g}s; nothing was written"
                    ) from None
                time.sleep(delay)  # flock has no timeout of its own: poll, backing off
                delay = min(delay * 2, 0.05)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _repair(self) -> None:
        # Under the lock: whatever lies past the last complete append was left by a writer that
        # died mid-append (live writers finish before they unlock), so it is cut off; a tail of
        # lines that do not decode is first copied to a side file.
        size = os.fstat(self._fd).st_size
        if size > self._end:
            if self._torn >= 0:
                self._set_aside(self._torn, size)
            try:
                os.ftruncate(self._fd, self._end)
                os.fsync(self._fd)
            except OSError as exc:
                raise self._write_failed("cutting off a torn append", exc) from exc
            self._torn = -1
        if not self._header:
            try:
                self._write_bytes(_HEADER)
            except OSError as exc:
                raise self._write_failed("writing the header", exc) from exc
            self._header = self._end = len(_HEADER)
        self._seen = self._stat()

    def _reopen(self) -> None:
        """Open the file now at the path in place of ours (a delete renamed a new one over it)."""
        old, self._fd = self._fd, self._open()
        os.close(old)
        self._reset()

    def _rewrite_without(self, stream: str) -> None:
        """Replace the file (under its lock, repaired) by a copy without ``stream``'s records:
        written beside it (mode 0600, a new name, never through a link), synced and renamed over
        it, so a crash leaves the old file or the new one. A store that has the old one open
        notices its name is gone and opens the new one."""
        key = b'{"stream":' + _encode_name(stream) + b',"event":'
        real = os.path.realpath(self.path)
        temp = f"{real}.deleting-{os.urandom(6).hex()}"
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o600)
        dropped = 0
        try:
            os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)  # new: nobody else has it
            out = [self._pread(0, self._header)]
            for _, data, cut in self._chunks(self._header):
                for line in data[1:cut].split(b"\n"):
                    if line.startswith(key) or (
                        not line.startswith(b'{"stream":"') and _stray_of(line) == stream
                    ):
                        dropped += 1
                    else:
                        out.append(line + b"\n")
                _write_all(fd, b"".join(out))
                out = []
            if out:
                _write_all(fd, b"".join(out))
            if dropped:
                os.fsync(fd)
                os.rename(temp, real)
                _sync_directory(real)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise self._write_failed(f"delete of stream {stream!r}", exc) from exc
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        if not dropped:
            os.close(fd)
            os.unlink(temp)
            return
        old, self._fd = self._fd, fd
        os.close(old)
        self._reset()
        self._catch_up()

    def _set_aside(self, start: int, size: int) -> None:
        data = os.pread(self._fd, size - start, start)
        base = f"{self.path}.torn-{start}"
        side, n = base, 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        while True:
            try:
                fd = os.open(side, flags, 0o600)
                break
            except FileExistsError:
                n += 1
                side = f"{base}.{n}"
        try:
            os.fchmod(fd, 0o600)
            view, written = memoryview(data), 0
            while written < len(data):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        _sync_directory(side)
        logger.warning(
            "%s: set aside %d bytes at byte %d that no complete append holds (an append torn "
            "by a crash or power loss, never acknowledged) in %s", self.url, len(data), start,
            side,
        )

    def _write_bytes(self, data: bytes) -> None:
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):  # one write() unless the kernel takes it in parts
                written += os.write(self._fd, view[written:])
            os.fsync(self._fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._end)  # all or nothing
            raise

    def _write_failed(self, what: str, exc: OSError) -> StoreError:
        if exc.errno in _NO_SPACE:
            reason = "no space left on the device" if exc.errno == errno.ENOSPC else (
                "the disk quota is exhausted")
        else:
            reason = exc.strerror or str(exc)
        error = StoreError(f"{self.url}: {what} failed: {reason} (writing {self.path}); "
                           f"nothing was written")
        error.errno = exc.errno
        return error

    def _stat(self) -> tuple[int, int, int]:
        st = os.fstat(self._fd)
        return st.st_size, st.st_mtime_ns, st.st_nlink

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

    def _read_header(self, size: int) -> bool:
        head = os.pread(self._fd, min(size, 4096), 0)
        newline = head.find(b"\n")
        if newline < 0 and _HEADER.startswith(head):
            return False  # a header cut short: the log is empty
        first = head if newline < 0 else head[:newline]
        written = first.rstrip(b"\0")
        if (b"\0" in first and _HEADER.startswith(written)
                and not self._pread(len(written), size).strip(b"\0\n")):
            # A header lost or torn by a power loss (none, or its first bytes, then NULs) and
            # only NULs after it: nothing was ever acknowledged in this file.
            self._lost_header(size)
            return False
        if newline < 0:
            raise DecodeError(f"{self.path} line 1 (byte 0): not a nous-inbox log (no header)")
        JSON_LINES.check_header(head[:newline], f"{self.path} line 1 (byte 0)")
        self._header = self._end = newline + 1
        return True

    def _lost_header(self, size: int) -> None:
        if self._torn != 0 and self.read_only:
            logger.warning("%s: the header was lost or torn (%d bytes, NULs after at most its "
                           "first bytes, a file created just before a power loss); it reads as "
                           "empty, and a writer will set them aside",
                           self.url, size)
        self._torn = 0

    def _complete_end(self, start: int, size: int) -> int:
        """Where the last complete append in ``[start, size)`` ends (``start`` if none).

        Walks back from the end over the lines no complete append holds: a line cut short, the
        first lines of an append without its last, or (after a power loss) lines that do not
        decode at all. Those last are noted in ``_torn`` to be set aside.
        """
        window = _TAIL
        while True:
            low = max(start, size - window)
            data = self._pread(low, size)
            lines = data.split(b"\n")
            partial = lines.pop()
            self._check_partial(partial, size)
            first = 0 if low == start else 1  # the first piece may be a line's end only
            offset = size - len(partial)
            garbage = False
            for index in range(len(lines) - 1, first - 1, -1):
                line = lines[index]
                offset -= len(line) + 1
                try:
                    record = _record.decode(line)
                except _BAD:
                    if b"\0" not in line:
                        # Not what a torn append leaves (its lost blocks read as NULs): a
                        # damaged acknowledged record stays in the log, a DecodeError to
                        # whoever reads its stream, and its seq is never reused.
                        end = offset + len(line) + 1
                        self._note_torn(end, size, garbage)
                        return end
                    garbage = True
                    continue
                if record.more == 0:
                    end = offset + len(line) + 1
                    self._note_torn(end, size, garbage)
                    return end
            if low == start:
                self._note_torn(start, size, garbage)
                return start
            window *= 4

    def _note_torn(self, end: int, size: int, garbage: bool) -> None:
        if not garbage:
            self._torn = -1
            return
        if self._torn != end:
            if self.read_only:
                logger.warning(
                    "%s: %d bytes at byte %d that no complete append holds (an append torn by "
                    "a crash or power loss) are not read; a writer will set them aside",
                    self.url, size - end, end,
                )
            self._torn = end

    def _check_partial(self, partial: bytes, size: int) -> None:
        # The unfinished tail is normally a record being written, or cut short by a crash; one
        # longer than any writer could have written is damage, not a torn append.
        if len(partial) > self._max + 1:
            raise RecordTooLargeError(
                f"{self.path} (byte {size - len(partial)}): {len(partial)} bytes without a "
                f"newline, above the record limit of {self._max} bytes"
            )

    def _pread(self, start: int, end: int) -> bytes:
        return os.pread(self._fd, end - start, start)

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
            records, bad = _decode_lines(_record, lines, self._max)
            if bad is not None:
                raise bad.error(self._place(pos + _span(lines, len(records))))
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
                self._end = offset
            pos += cut

    def _load(self, stream: str) -> list[Event]:
        """The events of ``stream``, read from the file the first time it is touched.

        At most ``_CACHED_STREAMS`` streams stay decoded: touching one more lets go of the one
        touched longest ago (it is read from the file again if it is read again; its version is
        kept, so appends and versions need no read), so a long-lived store that serves many
        sessions does not grow without bound.
        """
        streams = self._streams
        log = streams.pop(stream, None)
        if log is None:
            if self._end > self._header:
                with collector_paused():
                    log = self._scan(stream)
            else:
                log = []
            self._evicted.pop(stream, None)
            while len(streams) >= _CACHED_STREAMS:
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
                    record = _record.decode(line)
                except _BAD as exc:
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
                        self._stray_bad = (offset, _reason(exc, line))
                else:
                    self._stray.setdefault(record.stream, offset)
            offset += len(line) + 1

    def _scan(self, stream: str) -> list[Event]:
        # Find the stream's lines by their envelope, a chunk at a time, decode them in one batch
        # (msgspec's own loop) and check them in order; check every line's envelope in the same
        # pass (once: the result is kept). Where a line starts is worked out only for an error,
        # or to see that the records of one append sit on adjacent lines.
        checked = self._checked
        key = b'\n{"stream":' + _encode_name(stream) + b',"event":'
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
            records, bad = _decode_lines(_record, found.lines, self._max)
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
                _record.decode(line)
            except _BAD as exc:
                raise self._damage(pos, _reason(exc, line)) from None
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
        return self.base + 1 + _span(self.lines, index)

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
            return self.base + 1 + _span(self.lines, index)  # adjacent, by construction
        return self.starts[index - 1] + len(self.lines[index - 1]) + 1

    @staticmethod
    def began(batch: tuple[_Lines, int] | None) -> tuple[int]:
        """Where the append ``batch`` (its lines and index) began, for an error message."""
        return (batch[0].start(batch[1]),) if batch is not None else (0,)


def _write_all(fd: int, data: bytes) -> None:
    view, written = memoryview(data), 0
    while written < len(data):
        written += os.write(fd, view[written:])


def _stray_of(line: bytes) -> str | None:
    """The stream of a record line without the usual envelope (``None``: not a record)."""
    try:
        record: Record = _record.decode(line)
    except _BAD:
        return None
    return record.stream


def _sync_directory(path: str) -> None:
    # A new file's name is durable only once its directory is synced.
    directory = os.path.dirname(os.path.abspath(path))
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
