"""The fallback server: on a machine without PostgreSQL, the test extra's ``pgserver`` bundle runs.

The PostgreSQL suites prefer the machine's own binaries, so on these machines the bundle is never
what they use; this test starts a cluster from the bundle itself, so the fallback is known to work
before a machine that needs it meets it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
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


def test_binaries_in_a_checkout_under_a_private_directory_run_as_root(tmp_path: Path) -> None:
    # A clone under a 0700 home, run as root, its virtualenv (and the bundle) inside it: the
    # unprivileged user the server runs as cannot reach the binaries there.
    if os.geteuid() != 0:
        pytest.skip("only root runs the server as another user")
    bundled = postgres_server.bundled_binaries()
    if not bundled:
        postgres_server.unavailable("pgserver (in the test extra) is not installed")
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    tree = bundled[0].parent
    site = private / "venv" / "site-packages"
    shutil.copytree(tree, site / tree.parent.name / tree.name, symlinks=True)
    libs = tree.parent.parent / f"{tree.parent.name}.libs"  # the wheel's bundled libraries
    if libs.is_dir():
        shutil.copytree(libs, site / libs.name, symlinks=True)
    import psycopg

    cluster = postgres_server.Cluster(site / tree.parent.name / tree.name / "bin")
    try:
        assert private not in cluster.binaries.parents  # what runs is where its user reaches
        cluster.init()
        cluster.start()
        with psycopg.connect(cluster.url, connect_timeout=10) as conn:
            assert conn.execute("select 6 * 7").fetchone() == (42,)
    finally:
        cluster.destroy()


def test_the_machines_own_binaries_come_before_the_bundle() -> None:
    own = [p for p in glob.glob("/usr/lib/postgresql/*/bin")
           if (Path(p) / "initdb").exists()]
    if not own:
        pytest.skip("this machine has no PostgreSQL of its own to prefer")
    assert postgres_server.find_binaries() not in postgres_server.bundled_binaries()


def _private_tmpdir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Point TMPDIR at a 0700 directory of ours (as pam_tmpdir gives root), for this test."""
    private = tmp_path / "private-tmp"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches the directory it chose
    assert tempfile.gettempdir() == str(private)
    return private


def test_the_cluster_runs_under_a_private_tmpdir(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    # As root the server runs as an unprivileged user, who cannot reach a 0700 TMPDIR of root's.
    private = _private_tmpdir(monkeypatch, tmp_path)
    binaries = postgres_server.find_binaries()
    if binaries is None:
        postgres_server.unavailable("no PostgreSQL binaries on this machine")
    postgres_server.require_psycopg()
    import psycopg

    cluster = postgres_server.Cluster(binaries)
    try:
        if os.geteuid() == 0:
            assert private not in cluster.root.parents  # its files are where its user reaches
        cluster.init()
        cluster.start()
        with psycopg.connect(cluster.url, connect_timeout=10) as conn:
            assert conn.execute("select 6 * 7").fetchone() == (42,)
    finally:
        cluster.destroy()
    assert not cluster.root.exists()


def test_a_skipped_postgresql_suite_says_why_in_the_summary() -> None:
    # Outside CI a PostgreSQL suite with no server skips; the summary says so and why, unasked
    # (no -rs), so nobody takes the skips for a pass.
    postgres_server.require_psycopg()  # else the suite skips for that, not for the server
    closed = "postgresql://nous@127.0.0.1:1/postgres"  # port 1: nothing listens there
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env[postgres_server.ENV] = closed
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_store_postgres_urls.py", "-k", "socket"],
        cwd=Path(__file__).resolve().parent.parent, env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout
    assert "PostgreSQL tests skipped" in summary
    assert f"{postgres_server.ENV}={closed!r} does not answer" in summary
