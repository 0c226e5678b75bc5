"""The text-delta benchmark runs and renders its table (structure only: figures belong to bench/)."""

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("pydantic_ai")

from bench import delta_bench


def test_delta_bench_quick_renders_its_table() -> None:
    table = delta_bench.run(quick=True)
    for side in ("AsyncOwner.events(deltas=True), in-process",
                 "the page's event stream (SSE over HTTP, ?deltas=1)"):
        assert f"| {side} |" in table
