"""Snapshot side files for the ``file:`` store: ``PATH.snapshots/<hash>.snapshot``, one a stream.

A snapshot (:mod:`nous_inbox.snapshot`) is a cache beside the log, and a file in a directory is
exactly what another user could plant, so these files are handled by the rules of
:mod:`nous_inbox.store._safety`: the directory is made mode 0700, opened without following a
link and refused when it is not ours or others may write to it; a snapshot file is opened by
name relative to that directory's descriptor with ``O_NOFOLLOW``, and read only when it is a
regular file of ours that nobody else may write. A save writes a temporary file (mode 0600,
``O_EXCL``) in that directory, syncs it and renames it over the old one, so a reader sees the
old snapshot or the new, never half of one.

A file is the seq (8 bytes, big-endian) then the encoded snapshot. Loading only hands the bytes
on: :func:`nous_inbox.snapshot.load_session` checks them (and ignores, with a warning, anything
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
import hashlib
import os
import stat
import struct
from typing import Final

from nous_inbox.errors import StoreError
from nous_inbox.store._safety import open_private_directory

__all__ = ["SnapshotFiles"]

_SEQ: Final = struct.Struct(">Q")
_WHAT: Final = "snapshot directory"


class SnapshotFiles:
    """The snapshot side files of one store, in ``directory`` (made on the first save)."""

    def __init__(self, url: str, directory: str) -> None:
        self.url = url
        self.directory = directory

    def save(self, stream: str, seq: int, data: bytes) -> bool:
        """Replace ``stream``'s snapshot with ``data`` at ``seq``, unless one is newer; atomic."""
        name = _name(stream)
        directory_fd = open_private_directory(self.url, self.directory, _WHAT)
        try:
            try:
                old = self._read(directory_fd, name, header_only=True)
            except StoreError:
                old = None  # replaced below: os.replace never follows what it replaces
            if old is not None and old[0] > seq:
                return True  # a newer one is there already
            temp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
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
            os.close(directory_fd)

    def load(self, stream: str) -> tuple[int, bytes] | None:
        """``stream``'s snapshot as ``(seq, data)``; ``None`` when there is none; ``StoreError``
        for one that cannot be trusted (planted, a link, writable by others)."""
        try:
            directory_fd = os.open(
                self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            )
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StoreError(
                    f"{self.url}: the {_WHAT} {self.directory} is not a directory of its own "
                    f"(a link or a file); it is never followed"
                ) from None
            raise StoreError(f"{self.url}: the {_WHAT} cannot be read: {exc}") from exc
        try:
            _check_ours(self.url, self.directory, os.fstat(directory_fd))
            return self._read(directory_fd, _name(stream), header_only=False)
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
            _check_ours(self.url, where, st)
            with os.fdopen(fd, "rb", closefd=False) as file:
                head = file.read(_SEQ.size)
                if len(head) < _SEQ.size:
                    raise StoreError(f"{self.url}: the snapshot {where} is cut short")
                (seq,) = _SEQ.unpack(head)
                return seq, (b"" if header_only else file.read())
        finally:
            os.close(fd)


def _check_ours(url: str, path: str, st: os.stat_result) -> None:
    me = os.geteuid()
    if st.st_uid != me:
        raise StoreError(f"{url}: {path} belongs to uid {st.st_uid}, not to you (uid {me}); "
                         f"a snapshot another user made is never trusted")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(f"{url}: {path} is writable by others "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}); a snapshot there is not trusted")


def _name(stream: str) -> str:
    return hashlib.sha256(stream.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".snapshot"
