"""The ``file:`` store opens cheaply, survives torn appends, and names itself when a write fails.

- Opening costs what the session you touch holds: a stream is decoded the first time it is
  touched, and damage in one session never keeps another from being read or written.
- A power loss can leave an unacknowledged append as NUL bytes then a newline, or a new file's
  header as NULs: the store still opens, sets the torn bytes aside (a side file and a logged
  warning) and goes on; nothing acknowledged is lost.
- A full disk is a ``StoreError`` naming the store and the stream; the write-lock wait is set
  with ``open_store(url, lock_timeout=...)`` or ``$NOUS_INBOX_LOCK_TIMEOUT``.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

import pytest

from nous_inbox.codec import Record, encode_header, json_lines
from nous_inbox.errors import DecodeError, StoreError
from nous_inbox.events import Warned
from nous_inbox.store import FileStore, StoreLockedError, open_store
from nous_inbox.store.file import index as file_module  # its tunables and decoder


def two_sessions(path: Path, n: int = 50) -> None:
    with FileStore(path) as store:
        for i in range(n):
            store.append("a", [Warned(text=f"a{i}")])
            store.append("b", [Warned(text=f"b{i}"), Warned(text=f"b{i}'")])


class CountingDecoder:
    """Stands in for the store's record decoder and counts the lines it decodes."""

    def __init__(self) -> None:
        self.real = file_module.RECORD_DECODER
        self.calls = 0

    def decode(self, data: bytes) -> Record:
        self.calls += 1
        return self.real.decode(data)


# -- opening costs what the touched session holds -------------------------------------------------


def test_opening_a_file_store_decodes_no_session(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    two_sessions(path)
    counter = CountingDecoder()
    monkeypatch.setattr(file_module, "RECORD_DECODER", counter)
    with FileStore(path, read_only=True):
        assert counter.calls <= 1  # the last line, to find where the last append ends


def test_a_send_to_one_session_decodes_only_that_session(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    two_sessions(path)
    counter = CountingDecoder()
    monkeypatch.setattr(file_module, "RECORD_DECODER", counter)
    with FileStore(path) as store:
        stored = store.append("a", [Warned(text="steer")])
        assert stored[0].seq == 51
        assert counter.calls <= 50 + 1 + 1 + 1  # a's lines, the tail, the proof of the append


def test_damage_in_one_session_never_takes_another_down(tmp_path):
    path = tmp_path / "log.jsonl"
    two_sessions(path, n=3)
    data = path.read_bytes().replace(b'"text":"a1"', b'"text":11', 1)
    path.write_bytes(data)
    with FileStore(path) as store:
        assert [e.text for e in store.read("b")][:2] == ["b0", "b0'"]
        store.append("b", [Warned(text="still fine")])
        assert store.version("b") == 7
        with pytest.raises(DecodeError, match=r"line \d+ \(byte \d+\): Expected `str`, got `int`"):
            store.read("a")
        with pytest.raises(DecodeError, match="Expected `str`"):
            store.append("a", [Warned(text="refused: a's log is damaged")])


def test_a_record_in_another_spelling_is_refused_to_its_own_session_only(tmp_path):
    path = tmp_path / "log.jsonl"
    two_sessions(path, n=2)
    header, *lines = path.read_bytes().split(b"\n")[:-1]
    respelled = lines[0].replace(b'{"stream":"a",', b'{"stream": "a",')
    path.write_bytes(b"\n".join([header, respelled, *lines[1:]]) + b"\n")
    with FileStore(path, read_only=True) as store:
        assert store.version("b") == 4
        with pytest.raises(DecodeError, match=r"line 2 \(byte \d+\): a record of stream 'a' "
                                              r"not in the form this library writes"):
            store.read("a")


def test_streams_are_listed_without_decoding_events(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    two_sessions(path, n=10)
    counter = CountingDecoder()
    monkeypatch.setattr(file_module, "RECORD_DECODER", counter)
    with FileStore(path, read_only=True) as store:
        assert store.streams() == ["a", "b"]
    assert counter.calls <= 1


def test_versions_after_listing_the_streams_need_no_rescan(tmp_path, monkeypatch):
    # `nous-inbox sessions`: streams() counts each stream's records in its one pass, so a
    # version per stream after it neither reads the file again nor decodes and keeps events.
    path = tmp_path / "log.jsonl"
    two_sessions(path, n=10)
    with FileStore(path, read_only=True) as reader, FileStore(path) as writer:
        assert reader.streams() == ["a", "b"]
        counter = CountingDecoder()
        monkeypatch.setattr(file_module, "RECORD_DECODER", counter)
        monkeypatch.setattr(FileStore, "_scan", lambda self, stream: pytest.fail("rescanned"))
        assert [reader.version(name) for name in ["a", "b", "none"]] == [10, 20, 0]
        assert counter.calls == 0
        monkeypatch.undo()
        writer.append("b", [Warned(text="b-late")])
        writer.append("c", [Warned(text="new"), Warned(text="newer")])
        assert [reader.version(name) for name in ["a", "b", "c"]] == [10, 21, 2]
        assert [e.text for e in reader.read("c")] == ["new", "newer"]


def test_a_touched_stream_follows_what_others_append(tmp_path):
    path = tmp_path / "log.jsonl"
    two_sessions(path, n=2)
    with FileStore(path, read_only=True) as reader, FileStore(path) as writer:
        assert reader.version("a") == 2
        writer.append("b", [Warned(text="b-late")])
        writer.append("a", [Warned(text="a-late"), Warned(text="a-later")])
        assert reader.version("a") == 4
        assert [e.text for e in reader.read("a", after=2)] == ["a-late", "a-later"]
        assert reader.version("b") == 5  # first touched now: read from the file
        assert reader.streams() == ["a", "b"]
        writer.append("c", [Warned(text="new")])
        assert reader.streams() == ["a", "b", "c"]


# -- reading: one batch per chunk, a bounded cache ----------------------------------------------------


def one_session(path: Path, appends: int = 300) -> list[str]:
    texts = []
    with FileStore(path) as store:
        for i in range(appends):
            batch = [Warned(text=f"s{i}-{j}" * (1 + j * 40)) for j in range(1 + i % 3)]
            store.append("s", batch)
            texts += [event.text for event in batch]
    return texts


def test_a_file_of_one_session_reads_back_whole_across_chunks(tmp_path, monkeypatch):
    # Every line is the session's: its chunks are split and decoded in one batch each, and a
    # multi-record append may straddle two chunks.
    monkeypatch.setattr(file_module, "_CHUNK", 4096)
    path = tmp_path / "log.jsonl"
    texts = one_session(path)
    with FileStore(path, read_only=True) as store:
        events = list(store.read("s"))
    assert [e.text for e in events] == texts
    assert [e.seq for e in events] == list(range(1, len(texts) + 1))


@pytest.mark.parametrize("chunk", [4096, 256 * 1024])
def test_damage_in_a_one_session_file_names_its_line_and_byte(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(file_module, "_CHUNK", chunk)
    path = tmp_path / "log.jsonl"
    one_session(path)
    lines = path.read_bytes().split(b"\n")
    lines[200] = lines[200].replace(b'"seq":', b'"seq":"', 1)
    path.write_bytes(b"\n".join(lines))
    offset = sum(len(line) + 1 for line in lines[:200])
    with FileStore(path, read_only=True) as store, pytest.raises(
        DecodeError, match=rf"line 201 \(byte {offset}\): ",
    ):
        store.read("s")


def test_an_append_broken_off_in_a_one_session_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(file_module, "_CHUNK", 4096)
    path = tmp_path / "log.jsonl"
    one_session(path, appends=60)
    lines = path.read_bytes().split(b"\n")
    first = next(i for i, line in enumerate(lines) if b'"more":2' in line and i > 40)
    del lines[first + 1]  # the middle record of a three-record append
    path.write_bytes(b"\n".join(lines))
    with FileStore(path, read_only=True) as store, pytest.raises(
        DecodeError, match=rf"the append that began at line {first + 1} is broken off",
    ):
        store.read("s")


def test_a_store_keeps_only_the_streams_touched_last_decoded(tmp_path, monkeypatch):
    # A long-lived store (an owner, the CLI) that touches many sessions keeps a bounded number
    # decoded; a session it let go of is read from the file again, with what others appended.
    monkeypatch.setattr(file_module, "CACHED_STREAMS", 3)
    path = tmp_path / "log.jsonl"
    names = [f"session-{i}" for i in range(6)]
    with FileStore(path) as writer:
        for name in names:
            writer.append(name, [Warned(text=f"{name} first")])
    with FileStore(path, read_only=True) as reader, FileStore(path) as writer:
        for name in names:
            assert reader.version(name) == 1
        assert reader.cached_streams == names[-3:]  # the bound: the last three touched
        writer.append("session-0", [Warned(text="session-0 late")])
        counter = CountingDecoder()
        monkeypatch.setattr(file_module, "RECORD_DECODER", counter)
        assert [e.text for e in reader.read("session-0")] == ["session-0 first", "session-0 late"]
        assert counter.calls >= 2  # let go of before: read from the file again
        assert reader.cached_streams == [*names[-2:], "session-0"]
        calls = counter.calls
        assert [e.text for e in reader.read("session-5")] == ["session-5 first"]
        assert counter.calls == calls  # still kept: nothing decoded


# -- torn appends from a power loss ---------------------------------------------------------------


def acknowledged(path: Path) -> bytes:
    with FileStore(path) as store:
        store.append("s", [Warned(text="one")])
        store.append("t", [Warned(text="two"), Warned(text="three")])
    return path.read_bytes()


@pytest.mark.parametrize("torn", [
    b"\0" * 64 + b"\n",  # the append's blocks never reached the disk
    b"\0" * 40 + b'"seq":3,"at":1.0}}\n',  # its first block lost, its last one there
    b"\0" * 64 + b"\n" + b"\0" * 10 + b"\n",
])
def test_a_writer_sets_a_torn_append_aside_and_goes_on(tmp_path, caplog, torn):
    path = tmp_path / "log.jsonl"
    good = acknowledged(path)
    path.write_bytes(good + torn)
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.file"), FileStore(path) as store:
        assert [e.text for e in store.read("t")] == ["two", "three"]
        store.append("s", [Warned(text="after")])
    assert "set aside" in caplog.text and "torn-" in caplog.text
    side = tmp_path / f"log.jsonl.torn-{len(good)}"
    assert side.read_bytes() == torn
    assert side.stat().st_mode & 0o777 == 0o600
    with FileStore(path, read_only=True) as store:
        assert [e.text for e in store.read("s")] == ["one", "after"]


def test_a_reader_leaves_a_torn_append_alone_and_says_so(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    good = acknowledged(path)
    path.write_bytes(good + b"\0" * 64 + b"\n")
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.file"), FileStore(
        path, read_only=True
    ) as store:
        assert store.streams() == ["s", "t"]
        assert [e.text for e in store.read("s")] == ["one"]
    assert "not read" in caplog.text
    assert path.read_bytes() == good + b"\0" * 64 + b"\n"


@pytest.mark.parametrize("lost", [
    b"\0" * 36, b"\0" * 36 + b"\n", b"\0" * 36 + b"\n" + b"\0" * 80,
    # A header write torn after its first bytes: the rest of its block reads as NULs.
    b'{"format":"nous-in' + b"\0" * 100, b'{"format":"nous-in' + b"\0" * 100 + b"\n",
    encode_header()[:-1] + b"\0" * 5000,
])
def test_a_header_lost_to_power_loss_opens_as_an_empty_log(tmp_path, caplog, lost):
    path = tmp_path / "log.jsonl"
    path.write_bytes(lost)
    os.chmod(path, 0o600)
    with FileStore(path, read_only=True) as store:
        assert store.streams() == []
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.file"), FileStore(path) as store:
        store.append("s", [Warned(text="fresh")])
    assert (tmp_path / "log.jsonl.torn-0").read_bytes() == lost
    with FileStore(path, read_only=True) as store:
        assert [e.text for e in store.read("s")] == ["fresh"]


@pytest.mark.parametrize("hole", [b"\0" * 20, b"\0" * 40 + b'"seq":3,"at":1.0}}'])
def test_a_nul_hole_before_a_complete_append_keeps_every_session_readable(tmp_path, caplog, hole):
    path = tmp_path / "log.jsonl"
    good = acknowledged(path)
    extra = json_lines([Record(stream="s", event=Warned(text="later", seq=2, at=1.0))],
                       header=False)
    path.write_bytes(good + hole + b"\n" + extra)
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.file"), FileStore(path) as store:
        # A line holding NUL bytes is a hole a torn append left, not a record of any session.
        assert [e.text for e in store.read("s")] == ["one", "later"]
        assert [e.text for e in store.read("t")] == ["two", "three"]
        assert store.streams() == ["s", "t"]
        store.append("u", [Warned(text="new")])
    assert "NUL bytes" in caplog.text


def test_a_nul_hole_that_swallowed_a_record_is_damage_to_that_session_only(tmp_path):
    path = tmp_path / "log.jsonl"
    good = acknowledged(path)
    extra = json_lines([Record(stream="s", event=Warned(text="later", seq=3, at=1.0))],
                       header=False)
    path.write_bytes(good + b"\0" * 20 + b"\n" + extra)
    with FileStore(path) as store:
        with pytest.raises(DecodeError, match=r"line 5 \(byte \d+\)"):
            store.read("s")
        assert [e.text for e in store.read("t")] == ["two", "three"]
    assert not list(tmp_path.glob("*.torn-*"))


def append_raw(path: Path, data: bytes) -> None:
    """What another process leaves at the end of the file: written behind the store's back."""
    with open(path, "ab") as f:
        f.write(data)


@pytest.mark.parametrize("read_only", [False, True], ids=["writer", "reader"])
@pytest.mark.parametrize("hole", [b"\0" * 20, b"\0" * 40 + b'"seq":3,"at":1.0}}'],
                         ids=["nuls", "nuls-then-a-record-end"])
def test_a_nul_hole_another_process_leaves_while_a_store_is_open_is_skipped_as_on_open(
    tmp_path, caplog, hole, read_only
):
    # The store is open (a session touched, the file's end taken in) when a torn append's hole
    # and a complete append after it arrive: it goes on as a store opened now would.
    path = tmp_path / "log.jsonl"
    acknowledged(path)
    extra = json_lines([Record(stream="s", event=Warned(text="later", seq=2, at=1.0))],
                       header=False)
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.file"), FileStore(
        path, read_only=read_only
    ) as store, FileStore(path) as other:
        assert [e.text for e in store.read("s")] == ["one"]
        assert store.version("t") == 2
        append_raw(path, hole + b"\n" + extra)
        assert [e.text for e in store.read("s")] == ["one", "later"]
        assert [e.text for e in store.read("t")] == ["two", "three"]
        assert store.streams() == ["s", "t"]
        if not read_only:
            store.append("s", [Warned(text="mine")])
        other.append("t", [Warned(text="theirs")])
        assert store.version("t") == 3
        assert [e.text for e in store.read("t", after=2)] == ["theirs"]
    assert "NUL bytes" in caplog.text
    with FileStore(path, read_only=True) as fresh:
        assert [e.text for e in fresh.read("s")] == ["one", "later"] + ["mine"] * (not read_only)


@pytest.mark.parametrize("damage", [
    b"\0" * 20 + b"\n",  # a hole that swallowed the record of seq 2
    b'{"stream":"s","event":{"type":"warnex","text":"x","seq":2,"at":1.0}}\n',  # bit rot
], ids=["hole", "bit-rot"])
def test_damage_another_process_leaves_while_a_store_is_open_is_refused_to_its_session_only(
    tmp_path, damage
):
    path = tmp_path / "log.jsonl"
    acknowledged(path)
    extra = json_lines([Record(stream="s", event=Warned(text="later", seq=3, at=1.0))],
                       header=False)
    with FileStore(path) as store:
        assert [e.text for e in store.read("s")] == ["one"]
        assert [e.text for e in store.read("t")] == ["two", "three"]
        append_raw(path, damage + extra)
        with pytest.raises(DecodeError, match=r"line 5 \(byte \d+\)"):
            store.read("s")
        with pytest.raises(DecodeError, match=r"line 5"):
            store.append("s", [Warned(text="new")])
        assert [e.text for e in store.read("t")] == ["two", "three"]
        store.append("t", [Warned(text="four")])
        store.append("u", [Warned(text="new")])
    with FileStore(path, read_only=True) as fresh:
        assert [e.text for e in fresh.read("t")] == ["two", "three", "four"]
        assert [e.text for e in fresh.read("u")] == ["new"]
    assert not list(tmp_path.glob("*.torn-*"))


def test_a_torn_tail_another_process_leaves_while_a_store_is_open_is_set_aside(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    good = acknowledged(path)
    torn = b"\0" * 64 + b"\n"
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.file"), FileStore(
        path
    ) as store:
        assert store.version("s") == 1
        append_raw(path, torn)
        assert [e.text for e in store.read("t")] == ["two", "three"]
        store.append("s", [Warned(text="after")])
    assert (tmp_path / f"log.jsonl.torn-{len(good)}").read_bytes() == torn
    with FileStore(path, read_only=True) as fresh:
        assert [e.text for e in fresh.read("s")] == ["one", "after"]


def test_a_damaged_last_acknowledged_record_is_damage_not_a_torn_tail(tmp_path):
    path = tmp_path / "log.jsonl"
    with FileStore(path) as store:
        store.append("a", [Warned(text="first")])
        store.append("b", [Warned(text="acked")])
    # One byte of the last complete line damaged (bit rot, a stray editor): no NUL bytes,
    # nothing a torn append leaves, so it is never set aside and its seq is never reused.
    path.write_bytes(path.read_bytes().replace(b'"warned","text":"acked', b'"warnex","text":"acked'))
    damaged = path.read_bytes()
    with FileStore(path) as store:
        with pytest.raises(DecodeError, match=r"line 3 \(byte \d+\)"):
            store.read("b")
        with pytest.raises(DecodeError, match=r"line 3"):
            store.append("b", [Warned(text="new")])
        assert [e.text for e in store.read("a")] == ["first"]
        store.append("a", [Warned(text="second")])
    assert not list(tmp_path.glob("*.torn-*"))
    assert path.read_bytes().startswith(damaged)


# -- failing writes and the lock wait -------------------------------------------------------------


def test_a_full_disk_is_a_store_error_naming_the_store_and_stream(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    with FileStore(path) as store:
        store.append("s", [Warned(text="before")])
        before = path.read_bytes()

        def full(fd: int, data: object) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "write", full)
        with pytest.raises(StoreError, match=r"file:.*log\.jsonl: append to stream 's' failed: "
                                             r"no space left on the device") as info:
            store.append("s", [Warned(text="lost?")])
        assert info.value.errno == errno.ENOSPC
        monkeypatch.undo()
        assert path.read_bytes() == before
        assert store.version("s") == 1
        store.append("s", [Warned(text="after")])
        assert store.version("s") == 2


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_write_lock_wait_is_configurable(tmp_path, monkeypatch, how):
    path = tmp_path / "log.jsonl"
    acknowledged(path)
    if how == "environment":
        monkeypatch.setenv("NOUS_INBOX_LOCK_TIMEOUT", "0.05")
        store = open_store(f"file:{path}")
    else:
        store = open_store(f"file:{path}", lock_timeout=0.05)
    holder = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(StoreLockedError, match=r"for more than 0\.05s; nothing was written"):
            store.append("s", [Warned(text="x")])
    finally:
        os.close(holder)
        store.close()


@pytest.mark.parametrize("bad", [-1, float("nan"), "soon", True])
def test_a_bad_lock_timeout_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="lock_timeout must be a number of seconds >= 0"):
        open_store(f"file:{tmp_path / 'log.jsonl'}", lock_timeout=bad)


def test_a_bad_lock_timeout_in_the_environment_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("NOUS_INBOX_LOCK_TIMEOUT", "ten")
    with pytest.raises(ValueError, match=r"\$NOUS_INBOX_LOCK_TIMEOUT must be a number"):
        open_store(f"sqlite:{tmp_path / 'inbox.sqlite'}")
