"""The file store's bounded stream cache: letting a stream go never costs an append a rescan.

At most ``CACHED_STREAMS`` streams stay decoded. An owner process serving more sessions than
that appends to each in turn; an append needs only the stream's version, so one to a stream
out of the cache must not decode the file again (each would otherwise rescan it all).
"""

from __future__ import annotations

from pathlib import Path

from nous_inbox.events import Warned
from nous_inbox.session import replay
from nous_inbox.store import open_store
from nous_inbox.store.file import FileStore
from nous_inbox.store.file.index import CACHED_STREAMS

STREAMS = CACHED_STREAMS + 6


def test_appends_round_robin_over_more_streams_than_the_cache_decode_nothing_again(
    tmp_path: Path,
) -> None:
    with open_store(f"file:{tmp_path / 'log.jsonl'}") as store:
        assert isinstance(store, FileStore)
        names = [f"s{i}" for i in range(STREAMS)]
        for name in names:
            store.append(name, [Warned(text="first"), Warned(text="second")])
        scans = store.scans
        for round_ in range(3):
            for name in names:
                stored = store.append(name, [Warned(text=f"round {round_}")], 2 + round_)
                assert stored[0].seq == 3 + round_
                assert store.version(name) == 3 + round_
        assert store.scans == scans  # no stream was searched for again
    with open_store(f"file:{tmp_path / 'log.jsonl'}") as store:  # what a fresh open reads
        for name in names:
            texts = [event.text for event in store.read(name)]  # type: ignore[attr-defined]
            assert texts == ["first", "second", "round 0", "round 1", "round 2"]


def test_a_stream_out_of_the_cache_that_another_writer_appended_to_is_read_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    with open_store(f"file:{path}") as store, open_store(f"file:{path}") as other:
        for i in range(STREAMS):
            store.append(f"s{i}", [Warned(text="a")])
        other.append("s0", [Warned(text="b")])  # s0 is out of `store`'s cache by now
        assert store.version("s0") == 2
        assert store.append("s0", [Warned(text="c")], 2)[0].seq == 3
        assert [e.text for e in store.read("s0")] == ["a", "b", "c"]  # type: ignore[attr-defined]
        assert replay(store.read("s0")).version == 3
