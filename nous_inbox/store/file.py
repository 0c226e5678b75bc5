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
the log: readers ignore it, and the next writer cuts it off before appending. Anything wrong
*before* the tail (a line that does not decode, a sequence number out of place, a batch broken
off in the middle) is a :class:`~nous_inbox.errors.DecodeError` naming the line and byte offset,
never a silent skip.

Writers. Each append takes an exclusive ``flock`` on the file, catches up with what others wrote,
checks the expected version, writes, syncs and lets go. So writers in several processes take
turns (a CLI can steer a session whose owner has the file open), and one that cannot get the
lock within ``lock_timeout`` seconds gets a :class:`~nous_inbox.store.base.StoreLockedError`.
Readers never lock. ``read_only=True`` opens without write access at all: the file must exist
(else :class:`~nous_inbox.errors.StoreError`), nothing is created, locked or cut off (a torn tail
is left where it is and simply not read), and ``append``/``own`` raise ``ValueError``.

Owners. ``own(stream)`` locks ``PATH.owners/<hash>.lock`` (see :mod:`nous_inbox.store.lease`),
next to the log's real path, so every store on this log, in any process, sees the lease.

Readers. The streams are indexed in memory on open. ``version`` is a ``fstat``: only when the
file grew is the new tail read, so polling it is cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator
from typing import Final

import msgspec

from nous_inbox.codec import JSON_LINES, MAX_RECORD_SIZE, Record
from nous_inbox.errors import DecodeError, RecordTooLargeError, StoreError
from nous_inbox.events import Event
from nous_inbox.store._safety import check_store_file
from nous_inbox.store.base import StoreBase, StoreLockedError, check_stream
from nous_inbox.store.lease import Leases

__all__ = ["FileStore"]

_CHUNK: Final = 4 * 1024 * 1024
_HEADER: Final = JSON_LINES.header()


class FileStore(StoreBase):
    """A :class:`~nous_inbox.store.base.Store` over one JSON Lines file.

    ``path`` is created (mode 0600) unless ``read_only``. ``lock_timeout`` bounds the wait for
    another writer's append; ``max_record_size`` bounds one line, read or written. A path that
    cannot be opened as a log (missing when read-only, a directory, unreadable) is a
    :class:`~nous_inbox.errors.StoreError` naming it.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, read_only: bool = False,
        lock_timeout: float = 10.0, max_record_size: int = MAX_RECORD_SIZE,
    ) -> None:
        self.path = os.fspath(path)
        self.url = f"file:{self.path}"
        self.read_only = read_only
        self._timeout = lock_timeout
        self.max_record_size = self._max = max_record_size
        self._format = JSON_LINES
        self._lock = threading.RLock()
        self._streams: dict[str, list[Event]] = {}
        self._header = False
        self._end = 0  # offset just past the last complete batch folded in
        self._line = 1  # the line number at _end
        self._seen: tuple[int, int] = (-1, -1)
        self._fd = self._open()
        self._leases = Leases(self.url, os.path.realpath(self.path) + ".owners")
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
            yield len(self._streams.get(stream, ()))

    def _encode(self, stream: str, events: list[Event]) -> list[bytes]:
        last = len(events) - 1
        encode = self._format.encode
        return [encode(Record(stream=stream, event=event, more=last - i))
                for i, event in enumerate(events)]

    def _decode(self, stream: str, record: bytes) -> Event:
        try:
            decoded: Record = self._format.decoder(Record).decode(record)
        except (msgspec.DecodeError, RecursionError):
            pass
        else:
            return decoded.event
        try:  # again, for an error that says where
            decoded = self._format.decode(record, Record, "it would not read back",
                                          self.max_record_size)
        except DecodeError as exc:  # name the path inside the event, not inside the envelope
            raise DecodeError(str(exc).replace("`$.event.", "`$.")) from None
        return decoded.event

    def _write(self, stream: str, events: list[Event], records: list[bytes]) -> None:
        records.append(b"")
        data = b"\n".join(records)
        records.pop()
        self._write_bytes(data)
        self._streams.setdefault(stream, []).extend(events)
        self._end += len(data)
        self._line += len(events)
        self._seen = self._stat()

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        self._catch_up()
        return iter(self._streams.get(stream, [])[after:])

    def _version(self, stream: str) -> int:
        self._catch_up()
        return len(self._streams.get(stream, ()))

    def _stream_names(self) -> list[str]:
        self._catch_up()
        return sorted(self._streams)

    def _close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._streams = {}

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
        deadline = time.monotonic() + self._timeout
        delay = 0.001
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"{self.url}: another writer held the file lock for more than "
                        f"{self._timeout:g}s; nothing was written"
                    ) from None
                time.sleep(delay)  # flock has no timeout of its own: poll, backing off
                delay = min(delay * 2, 0.05)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _repair(self) -> None:
        # Under the lock: whatever lies past the last complete batch was left by a writer that
        # died mid-append (live writers finish before they unlock), so it is cut off.
        if os.fstat(self._fd).st_size > self._end:
            os.ftruncate(self._fd, self._end)
            os.fsync(self._fd)
        if not self._header:
            self._write_bytes(_HEADER)
            self._header = True
            self._end, self._line = len(_HEADER), 2
        self._seen = self._stat()

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

    def _stat(self) -> tuple[int, int]:
        st = os.fstat(self._fd)
        return st.st_size, st.st_mtime_ns

    # -- reading ---------------------------------------------------------------------------------

    def _catch_up(self) -> None:
        """Fold in what was appended since the last look; a ``fstat`` when nothing was."""
        seen = self._stat()
        size = seen[0]
        if seen == self._seen and size == self._end:
            return
        if size < self._end:
            raise DecodeError(
                f"{self.path}: the log is {size} bytes, shorter than the {self._end} bytes "
                f"already read; it was truncated or replaced behind this store's back"
            )
        if not self._header and not self._read_header(size):
            self._seen = seen
            return
        pos = self._end
        window = _CHUNK
        while pos < size:
            data = os.pread(self._fd, min(size - pos, window), pos)
            if not data:
                break
            consumed = self._ingest(data, pos)
            if consumed:
                pos += consumed
                window = _CHUNK
            elif pos + len(data) >= size:
                self._check_tail(data, pos)
                break
            else:
                window *= 2  # one batch longer than the window: look further
        self._seen = seen

    def _read_header(self, size: int) -> bool:
        head = os.pread(self._fd, min(size, 4096), 0)
        newline = head.find(b"\n")
        if newline < 0:
            if _HEADER.startswith(head):
                return False  # a header cut short: the log is empty
            raise DecodeError(f"{self.path} line 1 (byte 0): not a nous-inbox log (no header)")
        JSON_LINES.check_header(head[:newline], f"{self.path} line 1 (byte 0)")
        self._header = True
        self._end, self._line = newline + 1, 2
        return True

    def _check_tail(self, data: bytes, pos: int) -> None:
        # The unfinished tail is normally a record being written, or cut short by a crash; one
        # longer than any writer could have written is damage, not a torn append.
        partial = len(data) - (data.rfind(b"\n") + 1)
        if partial > self._max + 1:
            raise RecordTooLargeError(
                f"{self.path} (byte {pos + len(data) - partial}): {partial} bytes without a "
                f"newline, above the record limit of {self._max} bytes"
            )

    def _ingest(self, data: bytes, pos: int) -> int:
        """Fold in the complete batches of ``data`` (read at offset ``pos``); bytes consumed."""
        cut = data.rfind(b"\n") + 1
        if not cut:
            return 0
        streams = self._streams
        consumed = 0
        batch: list[Event] = []
        batch_stream = ""
        batch_line = 0
        expect_more = 0
        for line, offset, record in JSON_LINES.iter(
            data[:cut], Record, name=self.path, header=False, max_size=self._max,
            start=self._line, base=pos,
        ):
            stream = record.stream
            if batch:
                if stream != batch_stream or record.more != expect_more:
                    raise DecodeError(
                        f"{self.path} line {line} (byte {offset}): the append that began at "
                        f"line {batch_line} is broken off ({expect_more + 1} more record(s) "
                        f"of stream {batch_stream!r} were due)"
                    )
            else:
                if stream not in streams:
                    try:
                        check_stream(stream)
                    except ValueError as exc:
                        raise DecodeError(f"{self.path} line {line} (byte {offset}): {exc}") from None
                if record.more < 0:
                    raise DecodeError(
                        f"{self.path} line {line} (byte {offset}): invalid more={record.more}"
                    )
                batch_stream, batch_line = stream, line
            log = streams.get(stream)
            expected = (len(log) if log else 0) + len(batch) + 1
            event = record.event
            if event.seq != expected:
                raise DecodeError(
                    f"{self.path} line {line} (byte {offset}): stream {stream!r} has seq "
                    f"{event.seq} where {expected} was due"
                )
            batch.append(event)
            if record.more:
                expect_more = record.more - 1
                continue
            if log is None:
                streams[stream] = batch
            else:
                log.extend(batch)
            batch = []
            consumed = data.index(b"\n", offset - pos) + 1
            self._end = pos + consumed
            self._line = line + 1
        return consumed


def _sync_directory(path: str) -> None:
    # A new file's name is durable only once its directory is synced.
    directory = os.path.dirname(os.path.abspath(path))
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
