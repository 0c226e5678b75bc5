"""Benchmarks for nous_inbox, each measured side by side against the baseline a user would write.

Run one with ``python -m bench.inbox_bench`` (add ``--quick`` for a fast, rough pass).
"""
