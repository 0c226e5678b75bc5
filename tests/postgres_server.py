"""A real PostgreSQL server for the tests: the one ``NOUS_INBOX_TEST_POSTGRES`` names, or our own.

With ``NOUS_INBOX_TEST_POSTGRES=postgresql://...`` set, the tests use that server (each test gets
a schema of its own in it, dropped afterwards). Otherwise one private cluster is started per test
session from the PostgreSQL binaries on the machine (``initdb``/``pg_ctl`` on ``PATH``, where
``pg_config --bindir`` says, or under ``/usr/lib/postgresql/*/bin``) or, failing those, from the
server the ``pgserver`` package of the test extra bundles, in a fresh private temporary directory,
listening on a free loopback port and on a unix socket in that directory, with ``trust``
authentication for a superuser ``nous``. As root (initdb refuses to run as root) the cluster runs
as an unprivileged user: ``postgres`` when the system has one, else ``nobody``. That user may reach
neither the checkout (a clone under a 0700 home) nor root's temporary directory (a private 0700
``TMPDIR``, as ``pam_tmpdir`` gives): the cluster's directory is made, the user's own, in the first
of ``TMPDIR``, ``/tmp`` and ``/var/tmp`` the user can reach, and binaries the user cannot reach (the
bundle, installed in a virtualenv inside the checkout) are copied into it first.

Where no server can be had, the PostgreSQL tests are skipped, and the run's summary says why
(``tests/conftest.py``), except in CI (``CI=true``), where a missing server is a failure: a suite
that silently skipped its server tests would pass in CI while testing nothing.

The cluster can be stopped (``stop(mode)``) and started again on the same port and data, which is
what the failure tests use to restart the server under a running writer.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

ENV = "NOUS_INBOX_TEST_POSTGRES"

#: How every skip for want of a server begins, so the run's summary can gather them.
SKIP_REASON = "no PostgreSQL server: "

#: Where a cluster's directory may go when root's own temporary directory is closed to its user.
SHARED_TEMPORARY = ("/tmp", "/var/tmp")


def in_ci() -> bool:
    """Whether we run in CI, where a PostgreSQL suite that cannot run is a failure, not a skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


class Unavailable(Exception):
    """No server can be had here; the message says why."""


def unavailable(reason: str) -> NoReturn:
    """Skip (locally) or fail (in CI) because there is no server to test against."""
    if in_ci():
        pytest.fail(f"PostgreSQL tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"{SKIP_REASON}{reason}", allow_module_level=True)


def require_psycopg() -> None:
    """Skip (locally) or fail (in CI) the calling test module when psycopg is not installed;
    call it before importing anything that imports psycopg."""
    if importlib.util.find_spec("psycopg") is None:
        unavailable("psycopg is not installed (pip install nous-inbox[postgres])")


def find_binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``.

    Looked for in the order a machine is most likely to have them: ``initdb`` on ``PATH``, what
    ``pg_config --bindir`` names, Debian's ``/usr/lib/postgresql/*/bin``, and last the server
    that the ``pgserver`` package (in the test extra) bundles, for a machine with no PostgreSQL
    of its own.
    """
    candidates: list[Path] = []
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).resolve().parent)
    candidates += _pg_config_bindir()
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    candidates += bundled_binaries()
    for directory in candidates:
        if all((directory / name).exists() for name in ("initdb", "pg_ctl", "postgres")):
            return directory
    return None


def _pg_config_bindir() -> list[Path]:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return []
    try:
        answer = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [Path(answer.stdout.strip())] if answer.stdout.strip() else []


def bundled_binaries() -> list[Path]:
    """The ``pgserver`` package's bundled ``bin`` directory, when that package is installed.

    Found without importing the package (only its files are used, never its Python API).
    """
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return []
    return [Path(spec.origin).parent / "pginstall" / "bin"]


def _copy_install(binaries: Path, into: Path) -> Path:
    """Copy the install tree of ``binaries`` (bin, lib, share side by side) into ``into``, with
    the libraries a wheel bundles beside its package (``pgserver.libs``, which the binaries find
    relative to themselves), keeping their places; the copied ``bin``."""
    tree = binaries.parent
    package = tree.parent
    target = into / package.name / tree.name
    shutil.copytree(tree, target, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, into / libs.name, symlinks=True)
    return target / binaries.name


def _searchable(directory: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` (not root) can pass through ``directory`` and every directory above it."""
    for each in (directory.resolve(), *directory.resolve().parents):
        info = each.stat()
        if info.st_uid == user.pw_uid:
            mode = info.st_mode >> 6
        elif info.st_gid == user.pw_gid:
            mode = info.st_mode >> 3
        else:
            mode = info.st_mode
        if not mode & 0o1:
            return False
    return True


def _reachable(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` (not root) can reach ``path``: every directory above it searchable."""
    return _searchable(path.resolve().parent, user)


def unprivileged_user() -> pwd.struct_passwd | None:
    """The user a server of the tests runs as when we are root (``postgres`` when the system has
    one, else ``nobody``: PostgreSQL and PgBouncer both refuse to run as root); ``None`` when we
    are not root (the server runs as us)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and no unprivileged user to run a server as")


def server_directory(user: pwd.struct_passwd | None, runs_programs: bool = False,
                     prefix: str = "nous-inbox-pg-") -> Path:
    """A fresh directory for a server of the tests, in a place the user it runs as can reach.

    Our own temporary directory when the server runs as us. As root, the server's user is another,
    and root's ``TMPDIR`` may be private to root (0700): then the first of :data:`SHARED_TEMPORARY`
    that the user can reach (and, when binaries are to be copied in, where programs may run).
    The directory is ``user``'s own.
    """
    if user is None:
        return Path(tempfile.mkdtemp(prefix=prefix))
    for base in (tempfile.gettempdir(), *SHARED_TEMPORARY):
        place = Path(base)
        if (place.is_dir() and _searchable(place, user)
                and not (runs_programs and os.statvfs(place).f_flag & os.ST_NOEXEC)):
            made = Path(tempfile.mkdtemp(prefix=prefix, dir=place))
            os.chown(made, user.pw_uid, user.pw_gid)
            return made
    closed = "closed to it or mounted noexec" if runs_programs else "closed to it"
    raise RuntimeError(
        f"no directory the user {user.pw_name!r} can reach to hold the server: TMPDIR "
        f"({tempfile.gettempdir()}) and {', '.join(SHARED_TEMPORARY)} are {closed}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """A private PostgreSQL cluster in a temporary directory (one per test session).

    Raises ``RuntimeError`` (or ``OSError``) when it has nowhere to go; :meth:`destroy` removes it.
    """

    def __init__(self, binaries: Path) -> None:
        self._user = unprivileged_user()
        copy = self._user is not None and not _reachable(binaries / "postgres", self._user)
        self.root = server_directory(self._user, runs_programs=copy)
        self.data = self.root / "data"
        self.socket_dir = self.root
        self.port = free_port()
        if self._user is not None:
            try:
                if copy:
                    binaries = _copy_install(binaries, self.root / "install")
                for path in (self.root, *self.root.rglob("*")):
                    os.chown(path, self._user.pw_uid, self._user.pw_gid, follow_symlinks=False)
            except BaseException:
                shutil.rmtree(self.root, ignore_errors=True)
                raise
        self.binaries = binaries
        self.url = f"postgresql://nous@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        env = dict(os.environ, LC_ALL="C", LANG="C")
        if self._user is not None:
            # Root's own HOME and TMPDIR may be closed to the server's user: give it its own.
            env["HOME"] = env["TMPDIR"] = str(self.root)
        demote: dict[str, object] = {}
        if self._user is not None:
            demote = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        done = subprocess.run(
            [str(self.binaries / args[0]), *args[1:]], cwd=self.root, env=env,
            capture_output=True, text=True, timeout=120, check=False, **demote,  # type: ignore[call-overload]
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr or done.stdout}")

    def init(self) -> None:
        """Create the cluster's data directory (``initdb``)."""
        self._run("initdb", "-D", str(self.data), "-U", "nous", "--auth=trust", "-E", "UTF8",
                  "--no-instructions", "--no-sync")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                   f"-c unix_socket_directories={self.root} -c fsync=on "
                   f"-c max_connections=200 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w",
                  "-t", "60", "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode`` as for ``pg_ctl stop -m``: smart, fast or immediate)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        """Stop the server if it runs and remove its directory."""
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class Server:
    """The server the tests use: its URL, a fresh schema per test, and (ours only) restarts."""

    def __init__(self, url: str, cluster: Cluster | None) -> None:
        self.url = url
        self.cluster = cluster

    def fresh_url(self) -> tuple[str, str]:
        """A URL naming a schema nothing has used yet, and that schema's name."""
        schema = f"t_{uuid.uuid4().hex[:16]}"
        joiner = "&" if "?" in self.url else "?"
        return f"{self.url}{joiner}schema={schema}", schema

    def drop(self, schema: str) -> None:
        """Drop a test's schema (and everything in it)."""
        import psycopg

        with contextlib.suppress(psycopg.Error), psycopg.connect(self.url, autocommit=True) as db:
            db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.contextmanager
def server() -> Iterator[Server]:
    """The session's server: the one the environment names, or a private cluster of ours.

    Raises :class:`Unavailable` when there is none (the benchmarks use this directly).
    """
    try:
        import psycopg
    except ImportError:
        raise Unavailable("psycopg is not installed (pip install nous-inbox[postgres])") from None
    given = os.environ.get(ENV, "")
    if given:
        try:
            psycopg.connect(given, connect_timeout=10).close()
        except psycopg.Error as exc:
            raise Unavailable(f"{ENV}={given!r} does not answer: {exc}") from None
        yield Server(given, None)
        return
    with private_server() as running:
        yield running


@contextlib.contextmanager
def private_server() -> Iterator[Server]:
    """A private cluster of ours, whatever the environment names (a test that restarts the
    server needs one). Raises :class:`Unavailable` when none can be started."""
    binaries = find_binaries()
    if binaries is None:
        raise Unavailable(f"no initdb/pg_ctl/postgres on PATH, in pg_config --bindir, in "
                          f"/usr/lib/postgresql or from the pgserver package, and {ENV} is not set")
    try:
        cluster = Cluster(binaries)
    except (OSError, RuntimeError) as exc:
        raise Unavailable(f"could not place a private cluster for {binaries}: {exc}") from None
    try:
        try:
            cluster.init()
            cluster.start()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"could not start a private cluster from {binaries}: {exc}") from None
        yield Server(cluster.url, cluster)
    finally:
        cluster.destroy()


@contextlib.contextmanager
def for_tests(private: bool = False) -> Iterator[Server]:
    """:func:`server` (with ``private``, :func:`private_server`), skipped where there is none,
    failed in CI."""
    try:
        context = private_server() if private else server()
        running = context.__enter__()
    except Unavailable as exc:
        unavailable(str(exc))
    try:
        yield running
    finally:
        context.__exit__(None, None, None)
