"""Snapshot side files for the ``file:`` store: ``PATH.snapshots/<hash>.snapshot``, one a stream.

A snapshot (:mod:`nous_inbox.store.snapshot`) is a cache beside the log, and a file in a directory is
exactly what another user could plant, so these files are handled by the rules of
:mod:`nous_inbox.store._safety`: the directory is made mode 0700, opened without following a
link and refused when it is not ours or others may write to it; a snapshot file is opened by
name relative to that directory's descriptor with ``O_NOFOLLOW``, and read only when it is a
regular file of ours that nobody else may write. A save writes a temporary file (mode 0600,
``O_EXCL``) in that directory, syncs it and renames it over the old one, so a reader sees the
old snapshot or the new, never half of one. The temporary file has one fixed name per stream
(``.<hash>.snapshot.tmp``) and saves hold an ``flock`` on the directory, so a save killed
midway (``SIGKILL``, a power cut) leaves at most one stray file per stream, which the stream's
next save removes first: nothing accumulates. That ``flock`` is never waited for: a save runs
under the store's lock on the send path, and a process stopped while holding the directory
(``SIGSTOP``, a debugger, a hung ``fsync``) must not stop every other one's sends. A save that
finds it taken writes nothing and answers ``False``; the cache loses only this one refresh.

The directory belongs with the log: it holds a copy of each session's content. Deleting a
stream (``store.delete``) removes its snapshot first; deleting the whole log? Delete
``PATH.snapshots/`` too. One left behind is harmless to the new log (its snapshots
are of another log: ignored, and replaced by the next save) but keeps the old transcript on
disk.

A file is the seq (8 bytes, big-endian) then the encoded snapshot. Loading only hands the bytes
on: :func:`nous_inbox.store.snapshot.load_session` checks them (and ignores, with a warning, anything
refused here: a load never fails an open).

>>> import os, tempfile
>>> files = SnapshotFiles("file:x", os.path.join(tempfile.mkdtemp(), "x.snapshots"))
>>> files.load("s") is None
True
>>> files.save("s", 7, b"data")
True
>>> files.load("s")
(7, b'data')
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import stat
import struct
from typing import Final

from nous_inbox.errors import StoreError
from nous_inbox.store._safety import check_trusted, open_private_directory

__all__ = ["SnapshotFiles"]

_SEQ: Final = struct.Struct(">Q")
_WHAT: Final = "snapshot directory"
_FIX: Final = "a snapshot is only a cache: delete it (or the snapshot directory)"
logger: Final = logging.getLogger("nous_inbox.store.file")


class SnapshotFiles:
    """The snapshot side files of one store, in ``directory`` (made on the first save)."""

    def __init__(self, url: str, directory: str) -> None:
        self.url = url
        self.directory = directory

    def save(self, stream: str, seq: int, data: bytes) -> bool:
        """Replace ``stream``'s snapshot with ``data`` at ``seq``, atomically.

        Whether to replace is the store's decision (:meth:`StoreBase.save_snapshot
        <nous_inbox.store.base.StoreBase.save_snapshot>`); this only writes. ``False``, and
        nothing written, when another save holds the directory: see the module docstring.
        """
        name = _name(stream)
        temp = f".{name}.tmp"
        directory_fd = open_private_directory(self.url, self.directory, _WHAT)
        try:
            # Saves of this store, in any process, take turns: the fixed temporary name is then
            # only ever one save's, and what is found there is a killed save's leftover. Never
            # waited for: the caller holds the store's lock, and a snapshot is only a cache.
            try:
                fcntl.flock(directory_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                logger.info("%s: another save holds the snapshot directory; the snapshot of %r "
                            "is not refreshed this time", self.url, stream)
                return False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=directory_fd)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=directory_fd)
            try:
                try:
                    with os.fdopen(fd, "wb", closefd=False) as out:
                        out.write(_SEQ.pack(seq))
                        out.write(data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=directory_fd)
                raise
            os.fsync(directory_fd)
            return True
        except OSError as exc:
            raise StoreError(f"{self.url}: saving the snapshot of {stream!r} failed: {exc}") from exc
        finally:
            os.close(directory_fd)  # releases the flock

    def remove(self, stream: str) -> None:
        """Remove ``stream``'s snapshot, if there is one (the name itself: a link is never
        followed)."""
        try:
            directory_fd = open_private_directory(self.url, self.directory, _WHAT, create=False)
        except FileNotFoundError:
            return
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"{self.url}: the {_WHAT} cannot be read: {exc}") from exc
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_name(stream), dir_fd=directory_fd)
                os.fsync(directory_fd)
        except OSError as exc:
            raise StoreError(f"{self.url}: removing the snapshot of {stream!r} failed: {exc}"
                             ) from exc
        finally:
            os.close(directory_fd)

    def seq(self, stream: str) -> int | None:
        """The seq of ``stream``'s snapshot, reading only its first bytes; ``None`` when there
        is none; ``StoreError`` for one that cannot be trusted."""
        found = self._open_and_read(stream, header_only=True)
        return None if found is None else found[0]

    def load(self, stream: str) -> tuple[int, bytes] | None:
        """``stream``'s snapshot as ``(seq, data)``; ``None`` when there is none; ``StoreError``
        for one that cannot be trusted (planted, a link, writable by others)."""
        return self._open_and_read(stream, header_only=False)

    def _open_and_read(self, stream: str, *, header_only: bool) -> tuple[int, bytes] | None:
        try:
            directory_fd = open_private_directory(self.url, self.directory, _WHAT, create=False)
        except FileNotFoundError:
            return None
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"{self.url}: the {_WHAT} cannot be read: {exc}") from exc
        try:
            return self._read(directory_fd, _name(stream), header_only=header_only)
        finally:
            os.close(directory_fd)

    def _read(self, directory_fd: int, name: str, *, header_only: bool) -> tuple[int, bytes] | None:
        where = os.path.join(self.directory, name)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=directory_fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(f"{self.url}: the snapshot {where} is a symbolic link; it is "
                                 f"never followed") from None
            raise StoreError(f"{self.url}: the snapshot {where} cannot be read: {exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise StoreError(f"{self.url}: the snapshot {where} is not a regular file")
            check_trusted(self.url, where, st, "the snapshot", _FIX)
            with os.fdopen(fd, "rb", closefd=False) as file:
                head = file.read(_SEQ.size)
                if len(head) < _SEQ.size:
                    raise StoreError(f"{self.url}: the snapshot {where} is cut short")
                (seq,) = _SEQ.unpack(head)
                return seq, (b"" if header_only else file.read())
        finally:
            os.close(fd)


def _name(stream: str) -> str:
    return hashlib.sha256(stream.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".snapshot"
