"""The PostgreSQL benchmark runs against the test server and renders its table (structure only:
timings belong to bench/)."""

from bench import postgres_bench


def test_postgres_bench_quick_renders_every_row(postgres_url: str) -> None:
    table = postgres_bench.run(quick=True, url=postgres_url)
    for row in ("| single append (1 event) |", "| batched append, per event",
                "| owner send -> claim round trip |", "| 32 sender(s) into one owner",
                "acknowledged -> claimed at the next step, p50", "claimed at the next step, p99",
                "p99, postgresql by its polling backstop alone", "8 senders over 1 (floor 5x)"):
        assert row in table
    assert "(quick run:" in table
