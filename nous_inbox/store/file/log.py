"""The ``file:`` store's log file: its header, its records, and the torn tails a crash leaves.

:class:`LogFile` opens the file (never one we should not trust, see
:mod:`nous_inbox.store._safety`), takes turns with other writers (``flock``), writes and syncs
whole appends, and finds where the last complete append ends.

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
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import time
from collections.abc import Iterator
from typing import Final

from nous_inbox.codec import DECODE_ERRORS, JSON_LINES, Record
from nous_inbox.errors import DecodeError, RecordTooLargeError, StoreError
from nous_inbox.store._safety import check_store_file
from nous_inbox.store.base import StoreLockedError

__all__ = ["RECORD_DECODER", "LogFile", "sync_directory"]

logger: Final = logging.getLogger("nous_inbox.store.file")

_TAIL: Final = 64 * 1024
_HEADER: Final = JSON_LINES.header()
RECORD_DECODER: Final = JSON_LINES.decoder(Record)
"""The decoder of the file's record lines (a :class:`~nous_inbox.codec.Record` each): built once,
shared by the log, its index and its store."""
_NO_SPACE: Final = (errno.ENOSPC, errno.EDQUOT)


class LogFile:
    """One JSON Lines log open for a store: the descriptor, its lock, where its appends end.

    The store sets ``path``, ``url``, ``read_only``, ``lock_timeout`` and ``_max`` (the record
    limit) before it opens the file (``_fd = _open()``, then ``_reset()``).
    """

    url: str
    path: str
    read_only: bool
    lock_timeout: float
    _max: int
    _fd: int

    def _reset(self) -> None:
        """Know nothing of the file yet: what a store just opened knows."""
        self._header = 0  # offset just past the header line (0: no header yet)
        self._end = 0  # offset just past the last complete append taken in
        self._torn = -1  # where a tail set aside (read-only) or left unread begins
        self._seen: tuple[int, int, int] = (-1, -1, -1)

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
            sync_directory(self.path)
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
        sync_directory(side)
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
                    record = RECORD_DECODER.decode(line)
                except DECODE_ERRORS:
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


def sync_directory(path: str) -> None:
    """Sync the directory holding ``path``: a new file's name (a log just created, a copy
    renamed over the log) is durable only once its directory is."""
    directory = os.path.dirname(os.path.abspath(path))
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
