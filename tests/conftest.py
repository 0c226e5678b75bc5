"""Fixtures shared by the store tests: one of each store kind, opened on a fresh path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nous_inbox.store import Store, open_store

KINDS = ["memory", "file", "sqlite"]


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Each store kind in turn (a test that names ``kind`` runs once per kind)."""
    return str(request.param)


@pytest.fixture
def url(kind: str, tmp_path: Path) -> str:
    """A URL of that kind on a path nothing has used."""
    return {"memory": "memory:", "file": f"file:{tmp_path / 'log.jsonl'}",
            "sqlite": f"sqlite:{tmp_path / 'inbox.sqlite'}"}[kind]


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    """That store, opened, and closed after the test."""
    with open_store(url) as opened:
        yield opened
