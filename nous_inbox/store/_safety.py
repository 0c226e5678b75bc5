"""Path safety for durable stores: trust no file or directory another user could have planted.

A store may live in a directory others can write to (``/tmp``, a shared project folder). There,
another user can create our store file before we do, make it writable by everyone, or plant a
symbolic link where our owner lease will be written. So before a store trusts a path:

- a store file (and SQLite's ``-wal``/``-shm``, next to the file a link names, where SQLite
  keeps them) must be a regular file, owned by us (the effective user), and writable by nobody
  else; one of ours that others may read is tightened to 0600 when the store opens it for
  writing, and one with more than one name (a hard link, maybe to another file of ours) is
  refused then: writing it would change that other file too. Anything else is a
  :class:`~nous_inbox.errors.StoreError` saying whose file it is and how to fix it.
- the owner-lease directory ``PATH.owners`` and its lock files are opened without following
  symbolic links (``O_NOFOLLOW``, and lock files by name relative to the directory's descriptor,
  so the directory cannot be swapped meanwhile) and must be ours and writable by nobody else.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "log.jsonl")
>>> with open(path, "w") as f:
...     pass
>>> os.chmod(path, 0o666)
>>> check_store_file("file:" + path, path, read_only=True)
Traceback (most recent call last):
...
nous_inbox.errors.StoreError: file:...: ... is writable by group and others (mode 0666), so anyone could forge its events; if you trust its contents, `chmod 600 ...` and try again

The checks cost one ``stat`` per file when a store opens. Root is no exception: a file another
user owns is refused for root too (root reading someone's store can ``chown`` a copy).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import urllib.parse
from typing import Final

from nous_inbox.errors import StoreError

__all__ = [
    "check_store_file",
    "check_trusted",
    "open_lock_file",
    "open_private_directory",
    "read_only_sqlite_uri",
]

_OTHERS_WRITE: Final = stat.S_IWGRP | stat.S_IWOTH


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _writers(mode: int) -> str:
    both = mode & _OTHERS_WRITE == _OTHERS_WRITE
    return "group and others" if both else ("group" if mode & stat.S_IWGRP else "others")


def check_trusted(url: str, path: str, st: os.stat_result, what: str, fix: str) -> None:
    """Refuse (``StoreError``) what ``st`` describes unless we own it and nobody else may write
    it; ``what`` names it and ``fix`` says what to do about another user's."""
    me = os.geteuid()
    if st.st_uid != me:
        raise StoreError(
            f"{url}: {what} {path} belongs to uid {st.st_uid}, not to you (uid {me}); a file "
            f"another user made is never trusted with your messages: {fix}"
        )
    if st.st_mode & _OTHERS_WRITE:
        raise StoreError(
            f"{url}: {what} {path} is writable by {_writers(st.st_mode)} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}), so anyone could forge its events; if you "
            f"trust its contents, `chmod {'700' if stat.S_ISDIR(st.st_mode) else '600'} {path}` "
            f"and try again"
        )


def check_store_file(
    url: str, path: str, *, fd: int | None = None, read_only: bool,
    companions: tuple[str, ...] = (),
) -> None:
    """Refuse a store file we should not trust; tighten one of ours to 0600 unless ``read_only``.

    With ``fd`` the open file is checked (``fstat``, no race with the path). Without, ``path`` is
    looked at without opening it (so a FIFO there cannot hang us); a missing one is created empty,
    mode 0600, unless ``read_only``, so nobody can plant a file there between this check and the
    store's own open (a read-only store reports the missing file itself). ``companions`` are
    suffixes of files that go with ``path`` (SQLite's ``-wal`` and ``-shm``), checked the same
    way when they exist.
    """
    if fd is None and not read_only:
        _create_private(path)
    _check_link(url, path, companion=False)
    _check_one(url, path, fd, read_only)
    real = os.path.realpath(path)  # SQLite keeps its -wal/-shm next to the file a link names
    for suffix in companions:
        _check_link(url, real + suffix, companion=True)
        _check_one(url, real + suffix, None, read_only)


def _check_link(url: str, path: str, *, companion: bool) -> None:
    # A store path may be a link the user made; a link another user made, or any link where
    # SQLite keeps its -wal/-shm (it never makes them links), would steer our writes elsewhere.
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISLNK(st.st_mode):
        return
    if companion or st.st_uid != os.geteuid():
        whose = "" if st.st_uid == os.geteuid() else f" made by uid {st.st_uid}"
        raise StoreError(
            f"{url}: {path} is a symbolic link{whose}; it is never followed: remove it if you "
            f"made it, and try again"
        )
    if not os.path.exists(path):
        raise StoreError(
            f"{url} is not a usable store: {path} is a symbolic link to nothing ({os.readlink(path)})"
        )


def _check_single_link(url: str, path: str, st: os.stat_result, what: str) -> None:
    # A file with another name elsewhere (a hard link someone planted) may be any file of ours:
    # writing, truncating or chmodding it through this name would change that one too. No name
    # at all (0) is a lock file another owner just removed: the lease protocol retries that.
    if st.st_nlink > 1:
        raise StoreError(
            f"{url}: {what} {path} has {st.st_nlink} names (hard links), so writing it could "
            f"change a file elsewhere; use a path of your own, or copy it (`cp`) and try again"
        )


def _create_private(path: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)  # 0600 exactly: the umask only ever takes bits away


def _check_one(url: str, path: str, fd: int | None, read_only: bool) -> None:
    try:
        st = os.fstat(fd) if fd is not None else os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{url} is not a usable store: {path} is {_kind(st.st_mode)}")
    check_trusted(
        url, path, st, "store file",
        "use a path of your own, or have its owner give it to you (`chown`)",
    )
    if not read_only:
        _check_single_link(url, path, st, "store file")
    if not read_only and st.st_mode & 0o077:
        if fd is not None:
            os.fchmod(fd, 0o600)
        else:
            os.chmod(path, 0o600)


def open_private_directory(
    url: str, path: str, what: str = "owner-lease directory", *, create: bool = True,
) -> int:
    """Make ``path`` (mode 0700) if it is not there, then open it without following a link.

    Returns a descriptor of the directory (``O_DIRECTORY | O_NOFOLLOW``), for opening files in it
    by name. A symbolic link, a non-directory, or a directory another user owns or may write to
    is a ``StoreError``; one of ours that others may read is tightened to 0700. ``what`` names
    the directory in those errors. ``create=False`` only opens: a missing directory is a
    ``FileNotFoundError`` (a reader has nothing to read, and makes nothing).
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if os.path.islink(path) else "not a directory"
            raise StoreError(
                f"{url}: the {what} {path} is {kind}; it is never followed: "
                f"remove it if you made it, and try again"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        check_trusted(
            url, path, st, what,
            "remove it (or have its owner remove it) and try again",
        )
        if create and stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # mkdir's mode is filtered by the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_lock_file(url: str, directory_fd: int, name: str, where: str) -> int:
    """Open (or create, mode 0600) the lock file ``name`` in the directory, never through a link.

    ``where`` is the file's full path, for messages. A symbolic link, a non-regular file, or a
    file another user owns or may write to is a ``StoreError``, and it is left untouched (never
    truncated or chmodded).
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, 0o600, dir_fd=directory_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(
                f"{url}: the lock file {where} is a symbolic link; it is never followed: "
                f"remove it if you made it, and try again"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{url}: the lock file {where} is {_kind(st.st_mode)}")
        check_trusted(url, where, st, "lock file", "remove it and try again")
        _check_single_link(url, where, st, "lock file")
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_only_sqlite_uri(path: str) -> str:
    """The URI that opens SQLite database ``path`` read-only, even on read-only media.

    A WAL database is read through its ``-shm`` index, which a reader creates when it is missing;
    in a directory we cannot write to (a read-only mount, a CD), that fails and nothing reads.
    There, with no ``-shm`` and no ``-wal`` beside the file, no writer can be at work (a writer
    keeps both), so the file is opened ``immutable=1``: SQLite reads it as it is, without
    locks or an index. Everywhere else it is ``mode=ro``, which sees other writers' commits.
    The URI has an empty authority, so no path can be read as a host name.
    """
    absolute = os.path.abspath(path)
    uri = "file://" + urllib.parse.quote(absolute) + "?mode=ro"
    real = os.path.realpath(path)  # where SQLite keeps -wal and -shm when path is a link
    directory = os.path.dirname(real) or "/"
    if (
        not os.access(directory, os.W_OK)
        and not os.path.exists(real + "-shm")
        and not os.path.exists(real + "-wal")
    ):
        uri += "&immutable=1"
    return uri
