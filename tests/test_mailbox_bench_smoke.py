"""The mailbox benchmark runs and renders its tables (structure only: timings belong to bench/)."""

import pytest

from bench import mailbox_bench

pytest.importorskip("praisonaiagents.messaging")


def test_mailbox_bench_quick_renders_every_table() -> None:
    table = mailbox_bench.run(quick=True)
    assert "| PraisonAI InProcessMailbox (baseline) |" in table
    assert "| drop-in InProcessMailbox, sqlite: (durable) |" in table
    assert "| drop-in InProcessMailbox, in memory, dict content |" in table
    assert "with str content" in table and "with a small dict as content" in table
    assert "bytes per queued message" in table
    assert table.count("| Mailbox(remember=1_000), in memory |") == 2  # retained after drain
    assert table.count("| send + notice |") == 3
    assert "| Mailbox, 8 senders |" in table and "(the limit) |" in table  # durable sends
