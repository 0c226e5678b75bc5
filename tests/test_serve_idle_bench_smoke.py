"""The idle-serve benchmark runs a real ``nous-inbox serve`` over a seeded store and renders its
table (structure only: figures belong to bench/)."""

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from bench import serve_idle


def test_serve_idle_quick_renders_its_table() -> None:
    table = serve_idle.run(quick=True)
    assert "| `sqlite:` | 500 |" in table
    assert "CPU at rest" in table
