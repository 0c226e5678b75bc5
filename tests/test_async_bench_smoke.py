"""The asyncio benchmark runs and renders its tables (structure only: timings belong to bench/)."""

from bench import async_bench


def test_async_bench_quick_renders_its_tables() -> None:
    table = async_bench.run(quick=True)
    assert "| asyncio.Queue |" in table
    assert "| AsyncOwner, memory: |" in table
    assert "| AsyncOwner, sqlite: (durable) |" in table
    assert "| AsyncOwner.inject (memory:) |" in table
    assert "| pydantic-ai Agent, bare |" in table or "pydantic-ai is not installed" in table
