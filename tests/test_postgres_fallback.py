"""The fallback server: on a machine without PostgreSQL, the test extra's ``pgserver`` bundle runs.

The PostgreSQL suites prefer the machine's own binaries, so on these machines the bundle is never
what they use; this test starts a cluster from the bundle itself, so the fallback is known to work
before a machine that needs it meets it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import postgres_server


def test_the_pgserver_bundle_runs_a_private_cluster() -> None:
    bundled = postgres_server.bundled_binaries()
    if not bundled:
        postgres_server.unavailable("pgserver (in the test extra) is not installed")
    import psycopg

    cluster = postgres_server.Cluster(bundled[0])
    try:
        cluster.init()
        cluster.start()
        with psycopg.connect(cluster.url, connect_timeout=10) as conn:
            row = conn.execute("select 6 * 7").fetchone()
        assert row == (42,)
    finally:
        cluster.destroy()


def test_the_machines_own_binaries_come_before_the_bundle() -> None:
    own = [p for p in postgres_server.glob.glob("/usr/lib/postgresql/*/bin")
           if (Path(p) / "initdb").exists()]
    if not own:
        pytest.skip("this machine has no PostgreSQL of its own to prefer")
    assert postgres_server.find_binaries() not in postgres_server.bundled_binaries()
