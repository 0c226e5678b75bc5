"""The owner benchmark runs and renders its table (structure only: timings belong to bench/)."""

from bench import owner_bench


def test_owner_bench_quick_renders_every_table_and_share() -> None:
    table = owner_bench.run(quick=True)
    assert "| Owner, memory: |" in table
    assert "| Owner, sqlite: (durable) |" in table
    assert table.count("\n|") >= 5
    assert "| sqlite: | 8 |" in table and "| file: | 8 |" in table
    assert "| sqlite: | 32 |" in table and "| file: | 32 |" in table
    floors = table[table.index("| side | against the ceiling"):]
    for side in ("| 8 threads on `Owner` |", "| 8 asyncio tasks on `AsyncOwner` |"):
        row = floors[floors.index(side):].splitlines()[0]
        assert row.count(": met") + row.count(": NOT met") == 2, row
    assert "floor: at least 0.8" in floors and "floor: at least 1.5x" in floors
    assert "The ceiling (8 threads through the group commit alone, a raw commit)" in table


def test_the_hand_written_group_commit_writes_every_row_once() -> None:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        assert owner_bench.hand_written(Path(tmp) / "hand.sqlite", 160) > 0  # asserts the rows
