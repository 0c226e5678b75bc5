"""The Agents SDK adapter's benchmark runs and renders its two tables (structure only: timings
belong to bench/)."""

import pytest

pytest.importorskip("agents")

from bench import openai_agents_bench


def test_openai_agents_bench_quick_renders_its_tables() -> None:
    table = openai_agents_bench.run(quick=True)
    assert "| Runner.run, bare |" in table
    assert "| AgentRunner, in-memory session |" in table
    assert "| p50 | p99 |" in table
