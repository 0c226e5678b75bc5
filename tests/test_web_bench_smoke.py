"""The web benchmark runs and renders its three tables (structure only: timings belong to bench/)."""

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from bench import web_bench


def test_web_bench_quick_renders_its_tables() -> None:
    tables = web_bench.run(quick=True)
    assert "| SessionHost + AsyncOwner |" in tables
    for side in ("AsyncOwner.steer, in-process", "SessionHost.send", "POST .../messages over HTTP",
                 "AsyncOwner.events(), 20 readers", "SSE, 1 subscriber", "SSE, 20 subscribers"):
        assert f"| {side} |" in tables
