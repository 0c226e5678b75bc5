"""The LangGraph bench runs and reports what it says it reports (its shape only, never a
timing: performance is measured by the benchmark itself, on a quiet machine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph")

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import langgraph_bench  # noqa: E402


def test_the_bench_reports_the_ratio_against_the_bare_graph_and_the_steer_latencies() -> None:
    report = langgraph_bench.run(quick=True)
    assert "| bare graph | GraphRunner | ratio | pairs: median (range) | CPU ratio | floor |" in report
    assert "at most 1.1x: met" in report or "at most 1.1x: NOT met" in report
    assert "| p50 | p99 |" in report
