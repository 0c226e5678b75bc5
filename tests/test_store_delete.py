"""``store.delete(stream)``: a session's log removed whole, on every store, under its lease.

Afterwards the stream is as if it had never been written: version 0, nothing to read, not
listed, its next append numbered 1, and no snapshot left to start a replay from. Another owner's
stream is never deleted, and a read-only store deletes nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_inbox.codec import encode_header
from nous_inbox.errors import StreamOwnedError
from nous_inbox.events import Warned
from nous_inbox.session import replay
from nous_inbox.store import FileStore, open_store
from nous_inbox.store.journal import Journal
from nous_inbox.store.snapshot import load_session, save_snapshot


def texts(store, stream: str) -> list[str]:
    return [e.text for e in store.read(stream)]


def test_a_deleted_stream_is_as_if_never_written(store):
    store.append("s", [Warned(text="a"), Warned(text="b")])
    store.append("other", [Warned(text="kept")])
    store.append("s", [Warned(text="c")])
    store.delete("s")
    assert store.version("s") == 0
    assert list(store.read("s")) == []
    assert store.streams() == ["other"]
    assert [e.seq for e in store.append("s", [Warned(text="new")])] == [1]
    assert texts(store, "s") == ["new"] and texts(store, "other") == ["kept"]


def test_replay_after_a_delete_is_empty(store):
    journal = Journal(store, "s")
    journal.send("go", "next_step", True)
    journal.send("fyi", "next_turn", False)
    store.delete("s")
    assert replay(store.read("s")).version == 0
    assert Journal(store, "s").session == replay([])


def test_a_snapshot_does_not_survive_a_delete(store):
    for i in range(5):
        store.append("s", [Warned(text=str(i))])
    assert save_snapshot(store, "s", load_session(store, "s").session)
    assert store.load_snapshot("s") is not None
    store.delete("s")
    assert store.load_snapshot("s") is None
    store.append("s", [Warned(text="again")])
    assert load_session(store, "s").session == replay(store.read("s"))


def test_deleting_an_unknown_stream_does_nothing(store):
    store.append("s", [Warned(text="a")])
    store.delete("nobody")
    assert store.streams() == ["s"] and texts(store, "s") == ["a"]


def test_the_owner_of_a_stream_deletes_it_through_its_own_store(store):
    store.append("s", [Warned(text="a")])
    with store.own("s") as lease:
        store.delete("s")
        assert not lease.released  # still the owner, of an empty stream
        assert store.version("s") == 0


def test_a_stream_another_owner_holds_is_not_deleted(kind, url):
    if kind == "memory":
        pytest.skip("a memory: store's streams have no owner in another store")
    with open_store(url) as owner, open_store(url) as other:
        owner.append("s", [Warned(text="a")])
        with owner.own("s"):
            with pytest.raises(StreamOwnedError, match="another owner holds stream 's'"):
                other.delete("s")
            assert texts(other, "s") == ["a"] and texts(owner, "s") == ["a"]
        other.delete("s")  # let go of: deleted
        assert owner.version("s") == 0
        owner.own("s").release()  # and the delete kept no lease


def test_a_read_only_store_deletes_nothing(kind, url):
    if kind == "memory":
        pytest.skip("a read-only memory: store is empty")
    with open_store(url) as writer:
        writer.append("s", [Warned(text="a")])
    with open_store(url, read_only=True) as reader:
        with pytest.raises(ValueError, match="read-only"):
            reader.delete("s")
        assert texts(reader, "s") == ["a"]


def test_a_store_opened_before_the_delete_sees_it(kind, url):
    if kind == "memory":
        pytest.skip("no other store sees a memory: store's streams")
    with open_store(url) as early, open_store(url, read_only=True) as reader:
        early.append("s", [Warned(text="a")])
        early.append("t", [Warned(text="b")])
        assert texts(reader, "s") == ["a"] and reader.streams() == ["s", "t"]
        with open_store(url) as deleter:
            deleter.delete("s")
        assert reader.version("s") == 0 and reader.streams() == ["t"]
        assert [e.seq for e in early.append("s", [Warned(text="new")])] == [1]
        early.append("t", [Warned(text="c")])
        assert texts(reader, "s") == ["new"] and texts(reader, "t") == ["b", "c"]


def test_an_identity_from_before_a_delete_does_not_answer_for_the_new_log(store):
    store.append("s", [Warned(text="old")], identity="send-1")
    store.delete("s")
    store.append("s", [Warned(text="new")])
    again = store.append("s", [Warned(text="old")], identity="send-1")
    assert [e.seq for e in again] == [2] and texts(store, "s") == ["new", "old"]


def test_an_identity_remembered_before_another_stores_delete_answers_for_nothing_new(kind, url):
    # The store that remembers the identity never saw the delete: the events now at the seqs it
    # remembers are another writer's, and the retry must write its own, not take theirs.
    if kind == "memory":
        pytest.skip("no other store deletes a memory: store's streams")
    with open_store(url) as early, open_store(url) as deleter:
        early.append("s", [Warned(text="old")], identity="send-1")
        deleter.delete("s")
        deleter.append("s", [Warned(text="theirs")])
        again = early.append("s", [Warned(text="old")], identity="send-1")
        assert [(e.seq, e.text) for e in again] == [(2, "old")]
        assert texts(early, "s") == ["theirs", "old"]


# -- the file: store rewrites its one file -------------------------------------------------------


def test_a_file_delete_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path: Path):
    path = tmp_path / "log.jsonl"
    with FileStore(path) as store:
        store.append("s", [Warned(text="a", at=1.0), Warned(text="b", at=1.0)])
        store.append("t", [Warned(text="c", at=1.0)])
        store.delete("s")
    assert path.read_text().splitlines() == [
        encode_header().decode().rstrip("\n"),
        '{"stream":"t","event":{"type":"warned","text":"c","seq":1,"at":1.0}}',
    ]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "log.jsonl.owners"]


def test_a_file_delete_through_a_link_of_ours_keeps_the_link(tmp_path: Path):
    real = tmp_path / "real.jsonl"
    link = tmp_path / "log.jsonl"
    with FileStore(real) as store:
        store.append("s", [Warned(text="a")])
        store.append("t", [Warned(text="b")])
    os.symlink(real, link)
    with FileStore(link) as store:
        store.delete("s")
    assert link.is_symlink() and os.readlink(link) == str(real)
    with FileStore(real, read_only=True) as store:
        assert store.streams() == ["t"]


@settings(max_examples=30, deadline=None)
@given(
    appends=st.lists(st.tuples(st.sampled_from(["a", "b", "c ✓"]), st.integers(1, 3)),
                     min_size=1, max_size=12),
    gone=st.sampled_from(["a", "b", "c ✓"]),
)
def test_a_file_delete_keeps_every_other_stream_as_it_was(appends, gone):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "log.jsonl")
        with FileStore(path) as store:
            for stream, count in appends:
                store.append(stream, [Warned(text=f"{stream}{i}") for i in range(count)])
            before = {name: list(store.read(name)) for name in store.streams()}
            store.delete(gone)
            after = {name: list(store.read(name)) for name in store.streams()}
        before.pop(gone, None)
        assert after == before
        with FileStore(path, read_only=True) as reopened:
            assert {name: list(reopened.read(name)) for name in reopened.streams()} == before
