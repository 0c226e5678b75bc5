"""The web benchmark runs and renders its three tables (structure only: figures belong to bench/).

Its idle-session table measures a real ``nous-inbox serve`` process from outside, as a user would:
this runs it too, at the quick size."""

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from bench import web_bench


def test_web_bench_quick_renders_its_tables() -> None:
    tables = web_bench.run(quick=True)
    for side in ("SessionHost + AsyncOwner in-process, one message each",
                 "SessionHost + AsyncOwner in-process, two turns each",
                 "`nous-inbox serve` from outside, two turns each"):
        assert f"| {side} |" in tables
    for side in ("AsyncOwner.steer, in-process", "SessionHost.send", "POST .../messages over HTTP",
                 "AsyncOwner.events(), 20 readers", "SSE, 1 subscriber", "SSE, 20 subscribers"):
        assert f"| {side} |" in tables
