"""The pool benchmark runs three real ``nous-inbox serve`` processes on the test server and renders
its table (structure only: figures belong to bench/)."""

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from bench import pool_bench
from tests import postgres_server

postgres_server.require_psycopg()


def test_pool_bench_quick_renders_every_row(postgres_url: str) -> None:
    table = pool_bench.run(quick=True, url=postgres_url)
    for row in ("| sessions per process, once all 12 active are held (min / max) |",
                "| the prompts' append to every active session held |",
                "to the model request, p50 |", "| the same, p99 |",
                "| SIGTERM one: all its ", "| SIGKILL one (after a fresh process replaced the first)"):
        assert row in table
    assert "(quick run:" in table
