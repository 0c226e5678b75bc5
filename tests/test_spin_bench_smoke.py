"""The CPU-burning agent benchmark runs a real ``serve`` three times and renders its table
(structure only: figures belong to bench/)."""

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from bench import spin_bench


def test_spin_bench_quick_renders_its_rows() -> None:
    table = spin_bench.run(quick=True)
    for row in ("idle", "spins in Python", "spins in one C call at a time"):
        assert f"| {row} |" in table
