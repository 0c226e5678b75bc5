"""Owner leases: one owner per stream at a time, across threads, store instances and processes.

A session's log has one writer that runs it (the owner); anyone may still append messages to it.
``store.own(stream)`` takes the stream's lease: while it is held, another ``own`` of the same
stream, from any store on the same log, raises
:class:`~nous_inbox.errors.StreamOwnedError` naming the holder's pid.

>>> from nous_inbox.store import open_store
>>> store = open_store("memory:")
>>> with store.own("s1"):
...     store.own("s1")
Traceback (most recent call last):
...
nous_inbox.errors.StreamOwnedError: another owner holds stream 's1' of memory: (pid ...)
>>> store.own("s1").release()  # free again once the first lease was let go

Durable stores lock a sidecar file with ``flock``: ``PATH.owners/HASH.lock``, ``HASH`` the first
32 hex digits of the stream name's SHA-256 (directory 0700, files 0600). The kernel drops the
lock when its holder dies, even by SIGKILL, so a crashed owner never leaves a stream owned. The
file holds the holder's pid, for the message only. Releasing unlinks the file while still holding
the lock; a taker that locked a file already unlinked notices (its inode is no longer the path's)
and tries again, so two owners can never each lock a different file for one stream. Closing a
store releases the leases it holds.

The lease never follows a symbolic link and trusts nothing another user made: in a shared
directory, someone could plant ``PATH.owners/HASH.lock`` as a link to a file of ours, which the
owner would then truncate. So the directory is opened ``O_NOFOLLOW`` and the lock file by name
relative to it, ``O_NOFOLLOW`` too; a link, or a directory or lock file another user owns or may
write to, is a :class:`~nous_inbox.errors.StoreError` and is left untouched (see
:mod:`nous_inbox.store._safety`).

The lock belongs to the open file, which is opened close-on-exec: a program started with ``exec``
does not inherit it, but a child made by ``fork`` shares it until both have let go. The
``PATH.owners`` directory stays once made; its files go as their leases are released.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Callable
from types import TracebackType

import attrs

from nous_inbox.errors import StoreError, StreamOwnedError
from nous_inbox.store._safety import open_lock_file, open_private_directory

__all__ = ["Leases", "OwnerLease", "owned_error"]


@attrs.define(eq=False, repr=False)  # a lease is itself: two held leases are never "equal"
class OwnerLease:
    """The right to own one stream, until :meth:`release` (or the end of a ``with`` block).

    ``release`` is idempotent and thread-safe; closing the store releases its leases too.
    """

    stream: str
    _release: Callable[[], None] | None
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    @property
    def released(self) -> bool:
        """Whether the lease was let go (by :meth:`release` or by closing its store)."""
        return self._release is None

    def release(self) -> None:
        """Let the stream go so another owner may take it; a second call does nothing."""
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> OwnerLease:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"OwnerLease({self.stream!r}, {'released' if self.released else 'held'})"


def owned_error(stream: str, url: str, pid: int | None) -> StreamOwnedError:
    """The error for a stream another owner holds, naming the holder's pid when it is known."""
    holder = f" (pid {pid})" if pid is not None else ""
    return StreamOwnedError(
        f"another owner holds stream {stream!r} of {url}{holder}", stream=stream, pid=pid,
    )


@attrs.define(eq=False, repr=False)
class Leases:
    """The owner leases one store holds.

    With ``directory`` set, leases are ``flock`` locks on files in it, so they hold across
    processes; without, a set in this object (the ``memory:`` store, whose streams no other
    store can see). ``close`` releases every lease still held.
    """

    _url: str
    _directory: str | None
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _held: dict[str, OwnerLease] = attrs.field(factory=dict, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    def own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s lease or raise ``StreamOwnedError``; see :class:`OwnerLease`.

        The caller has checked the stream name.
        """
        with self._lock:
            if self._closed:
                raise ValueError(f"{self._url} store is closed")
            if stream in self._held:
                raise owned_error(stream, self._url, os.getpid())
            if self._directory is None:
                lease = OwnerLease(stream, lambda: self._forget(stream))
            else:
                held = self._lock_file(stream)
                lease = OwnerLease(stream, lambda: self._unlock(stream, held))
            self._held[stream] = lease
            return lease

    def holds(self, stream: str) -> bool:
        """Whether ``stream``'s lease is held through these leases."""
        with self._lock:
            return stream in self._held

    def close(self) -> None:
        """Release every lease still held; later ``own`` calls raise ``ValueError``."""
        with self._lock:
            self._closed = True
            held = list(self._held.values())
        for lease in held:
            lease.release()

    def _forget(self, stream: str) -> None:
        with self._lock:
            self._held.pop(stream, None)

    def _unlock(self, stream: str, held: tuple[int, str, int]) -> None:
        directory_fd, name, fd = held
        self._forget(stream)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=directory_fd)  # while still locked: see the module docstring
        finally:
            os.close(fd)
            os.close(directory_fd)

    def _lock_file(self, stream: str) -> tuple[int, str, int]:
        assert self._directory is not None
        directory = self._directory
        name = hashlib.sha256(stream.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".lock"
        path = os.path.join(directory, name)
        try:
            directory_fd = open_private_directory(self._url, directory)
            try:
                return directory_fd, name, self._take_file(stream, directory_fd, name, path)
            except BaseException:
                os.close(directory_fd)
                raise
        except OSError as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreError(
                f"{self._url}: cannot take the owner lease of stream {stream!r} "
                f"in {directory}: {exc.strerror or exc}"
            ) from exc

    def _take_file(self, stream: str, directory_fd: int, name: str, path: str) -> int:
        while True:
            fd = open_lock_file(self._url, directory_fd, name, path)
            try:
                if take_lock_file(fd, directory_fd, name):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                    return fd
            except BlockingIOError:
                pid = _read_pid(fd)
                os.close(fd)
                raise owned_error(stream, self._url, pid) from None
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # locked a file a releasing owner had just unlinked: again


def take_lock_file(fd: int, directory_fd: int, name: str) -> bool:
    """Lock ``fd``, the lock file ``name`` in ``directory_fd``; ``False`` when the file was
    unlinked or replaced meanwhile (open it again and retry).

    A releasing owner unlinks its lock file, so a lock taken on the old file would guard nothing:
    only the file the directory still names counts. Raises ``BlockingIOError`` when another
    holds the lock. A store of one's own that keeps lock files beside its log takes them so.
    """
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        now = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None  # the holder had not written it yet, or the file is not ours
