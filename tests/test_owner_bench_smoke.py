"""The owner benchmark runs and renders its table (structure only: timings belong to bench/)."""

from bench import owner_bench


def test_owner_bench_quick_renders_every_table_and_share() -> None:
    table = owner_bench.run(quick=True)
    assert "| Owner, memory: |" in table
    assert "| Owner, sqlite: (durable) |" in table
    assert table.count("\n|") >= 5
    assert "| sqlite: | 8 |" in table and "| file: | 8 |" in table
    assert "| sqlite: | 32 |" in table and "| file: | 32 |" in table
    assert "- 8 threads on `Owner`: **" in table and "- 8 asyncio tasks on `AsyncOwner`: **" in table
    assert "- 8 threads through the group commit alone" in table
