"""A real PgBouncer for the tests, in front of the tests' PostgreSQL server (``postgres_server``).

Operators put PgBouncer between their hosts and PostgreSQL, in session pooling (a client keeps
one server connection while it is connected) or in transaction pooling (a client has a server
connection only while a transaction runs, so session settings, prepared statements and LISTEN
do not stay with it). :func:`bouncer` starts Debian's ``pgbouncer`` in either mode, in a fresh
private directory, listening on a free loopback port, logging in to the server as the server
URL's user (``auth_type = any``: PgBouncer asks the client for nothing). As root it runs as the
same unprivileged user as the private PostgreSQL cluster, in a directory that user can reach
(root's ``TMPDIR`` may be a private 0700 one), as PgBouncer refuses to run as root.

Where there is no ``pgbouncer`` binary its tests are skipped, and the run's summary says why,
except in CI (``CI=true``), where that is a failure: ``.ci/run`` installs Debian's package.

>>> with bouncer(server, "transaction") as pooled:  # doctest: +SKIP
...     PostgresStore(pooled.url + "&pooler=transaction")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests import postgres_server
from tests.helpers import wait_until

#: How every skip for want of a PgBouncer begins, so the run's summary can gather them.
SKIP_REASON = "no PgBouncer: "

#: Where Debian's package puts the binary (``/usr/sbin`` is not on every user's ``PATH``).
PLACES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")

MODES = ("session", "transaction")


def unavailable(reason: str) -> NoReturn:
    """Skip (locally) or fail (in CI) because there is no PgBouncer to test with."""
    if postgres_server.in_ci():
        pytest.fail(f"PgBouncer tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"{SKIP_REASON}{reason}", allow_module_level=True)


def find_binary() -> Path | None:
    """The ``pgbouncer`` program: on ``PATH``, else where Debian's package installs it."""
    found = shutil.which("pgbouncer")
    candidates = [Path(found)] if found else []
    candidates += [Path(place) for place in PLACES]
    return next((path for path in candidates if os.access(path, os.X_OK)), None)


class Bouncer:
    """A running PgBouncer: ``url`` reaches the server's database through it."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], root: Path) -> None:
        self.url = url
        self.process = process
        self.root = root

    def fresh_url(self, server: postgres_server.Server) -> tuple[str, str]:
        """A URL through this PgBouncer naming a schema nothing has used yet, and its name."""
        direct, schema = server.fresh_url()
        return f"{self.url}?{direct.partition('?')[2]}", schema

    def log(self) -> str:
        """What PgBouncer logged so far (for a failing test's message)."""
        with contextlib.suppress(OSError):
            return (self.root / "log").read_text(errors="replace")
        return ""


def _config(server_url: str, mode: str, port: int, root: Path, pool_size: int) -> str:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(server_url)
    # Every database through one entry, logging in as the server URL's user (and password).
    target = " ".join(f"{key}={params[key]}" for key in ("host", "port", "user", "password")
                      if params.get(key))
    return "\n".join([
        "[databases]",
        f"* = {target}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = any",
        f"pool_mode = {mode}",
        "max_client_conn = 1000",
        f"default_pool_size = {pool_size}",
        f"logfile = {root / 'log'}",
        "ignore_startup_parameters = extra_float_digits",
        "",
    ])


@contextlib.contextmanager
def bouncer(server: postgres_server.Server, mode: str, pool_size: int = 100) -> Iterator[Bouncer]:
    """A PgBouncer in ``mode`` (``session`` or ``transaction``) in front of ``server``, with at
    most ``pool_size`` server connections per database; stopped and removed afterwards.

    Skipped where there is no ``pgbouncer`` (failed in CI); a PgBouncer that does not start is a
    failure naming what it logged."""
    import psycopg

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    binary = find_binary()
    if binary is None:
        unavailable(f"no pgbouncer on PATH or in {', '.join(PLACES)} (apt-get install pgbouncer)")
    user = postgres_server.unprivileged_user()
    root = postgres_server.server_directory(user, prefix="nous-inbox-pgbouncer-")
    port = postgres_server.free_port()
    dbname = psycopg.conninfo.conninfo_to_dict(server.url).get("dbname") or "postgres"
    (root / "pgbouncer.ini").write_text(_config(server.url, mode, port, root, pool_size))
    demote: dict[str, object] = {}
    if user is not None:
        os.chown(root / "pgbouncer.ini", user.pw_uid, user.pw_gid)
        demote = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    process = subprocess.Popen(  # type: ignore[call-overload]
        [str(binary), "-q", str(root / "pgbouncer.ini")], cwd=root, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **demote)
    running = Bouncer(f"postgresql://nous@127.0.0.1:{port}/{dbname}", process, root)
    try:
        def answers() -> bool:
            if process.poll() is not None:
                stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
                raise AssertionError(f"pgbouncer exited ({process.returncode}): "
                                     f"{stderr}{running.log()}")
            try:
                psycopg.connect(running.url, connect_timeout=2).close()
            except psycopg.OperationalError:
                return False
            return True

        wait_until(answers, what=f"pgbouncer ({mode} pooling) accepts connections",
                   timeout=30, pace=0.05)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(root, ignore_errors=True)
