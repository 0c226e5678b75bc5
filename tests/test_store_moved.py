"""Store.moved: which streams moved since the last look, on every store, so a host's look for
sessions that want a wake costs what changed, not what is stored. The first look is a full one;
a later one names the streams appended to or deleted since, whichever store instance wrote."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from nous_inbox.events import Warned
from nous_inbox.store import Store, open_store


def note(store: Store, stream: str) -> None:
    store.append(stream, [Warned(text="x")])


def test_the_first_look_names_every_stream_and_says_it_is_full(store: Store) -> None:
    note(store, "b")
    note(store, "a")
    first = store.moved()
    assert (first.streams, first.full) == (["a", "b"], True)


def test_a_later_look_names_only_the_streams_that_moved_since(store: Store) -> None:
    for name in ("a", "b", "c"):
        note(store, name)
    cursor = store.moved().cursor
    assert store.moved(cursor)[::2] == ([], False)
    note(store, "c")
    note(store, "d")
    note(store, "c")
    later = store.moved(cursor)
    assert (later.streams, later.full) == (["c", "d"], False)
    assert store.moved(later.cursor).streams == []


def test_a_stream_another_store_instance_moved_is_named(url: str, store: Store) -> None:
    if url == "memory:":
        pytest.skip("a memory: store has no other instance")
    note(store, "a")
    cursor = store.moved().cursor
    with open_store(url) as other:
        note(other, "b")
        note(other, "a")
    later = store.moved(cursor)
    assert (later.streams, later.full) == (["a", "b"], False)


def test_a_deleted_stream_has_moved(url: str, store: Store) -> None:
    note(store, "a")
    note(store, "b")
    cursor = store.moved().cursor
    store.delete("a")
    later = store.moved(cursor)
    # A file store's delete rewrites the file, which it then reads afresh: a full look.
    assert "a" in later.streams or (later.full and later.streams == ["b"])
    assert store.moved(later.cursor).streams == []


def test_a_cursor_this_store_did_not_give_is_refused(store: Store) -> None:
    for bad in ("7", -1, ("x", 1), 1.5):
        with pytest.raises(ValueError, match="not a cursor this store gave"):
            store.moved(bad)


def test_a_sqlite_store_made_before_moves_were_kept_is_read_and_gains_them(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with open_store(f"sqlite:{path}") as store:
        note(store, "a")
    with sqlite3.connect(path) as db:  # the layout before: no moves table
        db.execute("DROP TABLE moves")
    with open_store(f"sqlite:{path}", read_only=True) as old:
        first = old.moved()
        assert (first.streams, first.full) == (["a"], True)
        assert old.moved(first.cursor).full  # it cannot tell what moved: every look is full
    with open_store(f"sqlite:{path}") as store:
        cursor = store.moved().cursor
        note(store, "b")
        assert store.moved(cursor)[::2] == (["b"], False)


OLD_LAYOUT = ('DROP INDEX "SCHEMA".nous_inbox_streams_moved; '
              'ALTER TABLE "SCHEMA".nous_inbox_streams DROP COLUMN moved')


def test_a_postgres_store_made_before_moves_were_kept_is_read_and_gains_them(
        postgres_url: str) -> None:
    from tests.test_store_postgres import sql

    with open_store(postgres_url) as store:
        note(store, "a")
    sql(postgres_url, OLD_LAYOUT)  # the layout an earlier version made
    with open_store(postgres_url, read_only=True) as old:  # read-only: nothing added
        first = old.moved()
        assert (first.streams, first.full) == (["a"], True)
        assert old.moved(first.cursor).full
    with open_store(postgres_url) as store:
        cursor = store.moved().cursor
        note(store, "b")
        assert store.moved(cursor)[::2] == (["b"], False)


def test_a_role_that_cannot_add_the_moved_column_opens_the_store_and_looks_in_full(
        postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    from nous_inbox.store.postgres import PostgresStore
    from tests.test_store_postgres import least_privileged, sql

    with PostgresStore(postgres_url) as store:
        note(store, "a")
        schema = store.schema
    sql(postgres_url, OLD_LAYOUT)
    with least_privileged(postgres_url, schema) as url, open_store(url) as app:
        assert "cannot add the streams' moved column" in caplog.text
        note(app, "b")  # an append works without it
        assert app.moved(app.moved().cursor)[::2] == (["a", "b"], True)


def test_a_sqlite_cursor_older_than_the_moves_kept_gets_a_full_look(tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'busy.sqlite'}") as store:
        note(store, "a")
        old = store.moved().cursor
        burst = [Warned(text="x")] * 4096
        for _ in range(17):  # a move per event: past the 65,536 kept
            store.append("b", burst)
        recent = store.moved(old)
        assert (recent.streams, recent.full) == (["a", "b"], True)
        note(store, "c")
        assert store.moved(recent.cursor)[::2] == (["c"], False)
