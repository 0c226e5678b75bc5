"""The snapshot benchmark runs end to end on a tiny session and renders its three tables (structure
only: timings belong to bench/)."""

from __future__ import annotations

from bench import snapshot_bench


def test_the_snapshot_bench_renders_open_send_and_save_point_tables() -> None:
    table = snapshot_bench.run(events=3_000, sends=20, every=1_100)
    assert "| full replay (baseline) | 3,000 |" in table
    assert "| from the snapshot | 1,000 |" in table
    assert "| 100 events |" in table
    assert "`freeze_gc=True`" in table and "`freeze_gc=False` (default)" in table
    assert "| the send that saved |" in table
    assert table.count("\n|---") == 3
