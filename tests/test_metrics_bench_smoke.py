"""The metrics benchmark runs and renders its table (structure only: timings belong to bench/)."""

from bench import metrics_bench


def test_metrics_bench_quick_renders_every_side_with_its_verdict() -> None:
    table = metrics_bench.run(quick=True)
    for side in ("Owner, memory:", "Owner, sqlite:", "AsyncOwner, memory:", "AsyncOwner, sqlite:"):
        row = table[table.index(f"| {side} |"):].splitlines()[0]
        assert row.endswith("| met |") or row.endswith("| NOT met |"), row
    assert "load average" in table
