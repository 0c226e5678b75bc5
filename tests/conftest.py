"""Fixtures shared by the store tests: one of each store kind, opened on a fresh path.

``postgres`` is a real PostgreSQL server (see ``tests/postgres_server.py``): one per test session,
a fresh schema per test. Where there is none its tests skip (fail in CI), and the summary of the
run says how many and why, without ``-rs``: a quiet row of ``s`` is easy to take for a pass.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from nous_inbox.store import Store, open_store
from tests import pgbouncer_server, postgres_server

KINDS = ["memory", "file", "sqlite", "postgres"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[postgres_server.Server]:
    """The PostgreSQL server of this test session (skipped where there is none, failed in CI)."""
    with postgres_server.for_tests() as server:
        yield server


@pytest.fixture
def postgres_url(postgres: postgres_server.Server) -> Iterator[str]:
    """A ``postgresql://`` URL naming a schema of its own, dropped after the test."""
    url, schema = postgres.fresh_url()
    yield url
    postgres.drop(schema)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Each store kind in turn (a test that names ``kind`` runs once per kind)."""
    return str(request.param)


@pytest.fixture
def url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A URL of that kind on a path (or PostgreSQL schema) nothing has used."""
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return {"memory": "memory:", "file": f"file:{tmp_path / 'log.jsonl'}",
            "sqlite": f"sqlite:{tmp_path / 'inbox.sqlite'}"}[kind]


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    """That store, opened, and closed after the test."""
    with open_store(url) as opened:
        yield opened


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say, unasked, how many PostgreSQL tests skipped for want of a server (or of a PgBouncer
    in front of it), and why."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reason = str(longrepr[2]).removeprefix("Skipped: ")
            if reason.startswith((postgres_server.SKIP_REASON, pgbouncer_server.SKIP_REASON)):
                reasons[reason] += 1
    if not reasons:
        return
    terminalreporter.section("PostgreSQL tests skipped", sep="-", yellow=True, bold=True)
    for reason, count in reasons.items():
        terminalreporter.line(f"{count} skipped: {reason}", yellow=True)
    terminalreporter.line(
        f"They test nothing here. Install PostgreSQL (or the test extra's pgserver), or point "
        f"{postgres_server.ENV} at a server, and install PgBouncer (apt-get install pgbouncer); "
        f"with CI=true a missing server or PgBouncer fails the run.")
