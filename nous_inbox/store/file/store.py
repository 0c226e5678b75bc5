"""FileStore: the :class:`~nous_inbox.store.base.StoreBase` hooks over the log file and its index.

An append is made under the file's lock, after catching up with what others wrote; a delete
rewrites the file without the stream's records and renames the copy over it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

from nous_inbox.codec import DECODE_ERRORS, JSON_LINES, MAX_RECORD_SIZE, Record
from nous_inbox.errors import DecodeError
from nous_inbox.events import Event
from nous_inbox.store._snapshots import SnapshotFiles
from nous_inbox.store.base import Moved, StoreBase, check_max_record_size
from nous_inbox.store.file.index import StreamIndex, envelope
from nous_inbox.store.file.log import RECORD_DECODER, sync_directory
from nous_inbox.store.lease import Leases

__all__ = ["FileStore"]


class FileStore(StreamIndex, StoreBase):
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

    def __repr__(self) -> str:
        mode = ", read_only=True" if self.read_only else ""
        return f"FileStore({self.path!r}{mode})"

    @property
    def cached_streams(self) -> list[str]:
        """The streams this store keeps decoded, the one touched longest ago first: at most
        :data:`~nous_inbox.store.file.index.CACHED_STREAMS`, so a store serving many sessions
        stays bounded; one that is not here is read from the file again when it is read.

        >>> import tempfile, os
        >>> from nous_inbox.events import Warned
        >>> with FileStore(os.path.join(tempfile.mkdtemp(), "inbox.jsonl")) as store:
        ...     _ = store.append("s1", [Warned(text="a")])
        ...     _ = store.append("s2", [Warned(text="b")])
        ...     store.cached_streams
        ['s1', 's2']
        """
        with self._lock:
            return list(self._streams)

    @property
    def scans(self) -> int:
        """How many times this store searched its file for one stream's records: a stream read
        for the first time, or again once it left the cache (:attr:`cached_streams`). What
        touching a session costs beyond a ``fstat``: a host that sees it grow with every
        append serves more sessions than the cache holds, and an append must never scan.

        >>> import tempfile, os
        >>> from nous_inbox.events import Warned
        >>> path = os.path.join(tempfile.mkdtemp(), "inbox.jsonl")
        >>> with FileStore(path) as store:
        ...     _ = store.append("s1", [Warned(text="a")])
        >>> with FileStore(path) as store:   # a store opened on it reads s1 when touched ...
        ...     _ = store.append("s1", [Warned(text="b")], 1)
        ...     _ = store.append("s1", [Warned(text="c")], 2)   # ... once: then it is kept
        ...     store.scans
        1
        """
        return self._scans

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
            decoded: Record = RECORD_DECODER.decode(record)
        except DECODE_ERRORS:
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
        self._moves.note(stream)
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

    def _moved(self, since: object) -> Moved:
        # What others appended since the last look is taken in (noted as it is read), so a
        # look reads the file's new tail, never the whole file again.
        self._catch_up()
        moved = self._moves.since(since)
        if moved is None:
            names = self._stream_names()
            return Moved(names, self._moves.cursor(), True)
        return Moved(moved, self._moves.cursor(), False)

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

    def _rewrite_without(self, stream: str) -> None:
        """Replace the file (under its lock, repaired) by a copy without ``stream``'s records:
        written beside it (mode 0600, a new name, never through a link), synced and renamed over
        it, so a crash leaves the old file or the new one. A store that has the old one open
        notices its name is gone and opens the new one."""
        key = envelope(stream)
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
                sync_directory(real)
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


def _write_all(fd: int, data: bytes) -> None:
    view, written = memoryview(data), 0
    while written < len(data):
        written += os.write(fd, view[written:])


def _stray_of(line: bytes) -> str | None:
    """The stream of a record line without the usual envelope (``None``: not a record)."""
    try:
        record: Record = RECORD_DECODER.decode(line)
    except DECODE_ERRORS:
        return None
    return record.stream
