"""Snapshots, specified: a snapshot is a cache of the session at a seq, never the truth.

Opening from a snapshot gives exactly the full replay, on every store; a snapshot that cannot be
trusted (damaged, planted, from another format or another log, beyond the stream) is ignored with
a warning and the open replays from the start; a journal (so an owner) saves one every
``snapshot_every`` events and opens from it; a read-only store reads snapshots and saves none.
"""

from __future__ import annotations

import fcntl
import gc
import itertools
import logging
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_inbox import Message, ToolCall
from nous_inbox.events import (
    Event,
    MessageSent,
    ModelReplied,
    QueueClaimed,
    StepStarted,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.session import Session, replay
from nous_inbox.store import open_store
from nous_inbox.store.journal import Journal
from nous_inbox.store.snapshot import (
    SNAPSHOT_VERSION,
    TIP_EVENTS,
    SnapshotFile,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot,
    load_session,
    save_snapshot,
)
from nous_inbox.verbs import Target

STRESS = max(1, int(os.environ.get("NOUS_INBOX_STRESS", "1") or 1))
STEP, TURN = Target.NEXT_STEP, Target.NEXT_TURN
_names = itertools.count()


def sent(text: str, target: Target = STEP, wakeup: bool = True, **fields: Any) -> MessageSent:
    return MessageSent(target=target, wakeup=wakeup, message=Message.user(text, **fields))


def fill(store: Any, stream: str, n: int) -> list[Event]:
    """``n`` events of a plausible session: sends, claims, replies, turns."""
    events: list[Event] = []
    queued = 0
    for i in range(n):
        kind = i % 5
        if kind == 0:
            events.append(sent(f"m{i}", metadata={"i": i, "tags": ["a", "b"]}))
            queued += 1
        elif kind == 1:
            events.append(QueueClaimed(target=STEP, count=queued))
            queued = 0
        elif kind == 2:
            events.append(ModelReplied(turn=1, step=i, message=Message.assistant(
                f"r{i}", tool_calls=[ToolCall(f"c{i}", "ls", {"path": "."})])))
        elif kind == 3:
            events.append(sent(f"later {i}", TURN, wakeup=bool(i % 2)))
        else:
            events.append(StepStarted(turn=1, step=i))
    return store.append(stream, events)


# -- the value round-trips exactly --------------------------------------------------------------


def test_a_snapshot_decodes_to_the_session_it_encodes() -> None:
    events = [
        sent("a", metadata={"nested": {"x": [1, 2.5, None, True]}}),
        sent("b", TURN, wakeup=False),
        QueueClaimed(target=STEP, count=1),
        TurnStarted(turn=1, reason="wake"),
        StepStarted(turn=1, step=1),
        ModelReplied(turn=1, step=1, message=Message.assistant(
            "hm", tool_calls=[ToolCall("c1", "ls", {"p": 1})])),
        ToolReturned(turn=1, step=1, message=Message.tool("42", "c1", name="ls")),
        sent("c", STEP, wakeup=False),
    ]
    numbered = [msgspec.structs.replace(e, seq=i, at=float(i)) for i, e in enumerate(events, 1)]
    session = replay(numbered)
    assert session.running and session.inbox.count() == 2
    data = encode_snapshot("s", session, numbered)
    assert decode_snapshot(data, "s", numbered) == session


_text = st.text(st.characters(blacklist_categories=["Cs", "Cc"]), max_size=8)
_actions = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from([STEP, TURN]), st.booleans(), _text),
    st.tuples(st.just("claim"), st.sampled_from([STEP, TURN]), st.integers(0, 3)),
    st.tuples(st.just("reply"), _text),
    st.tuples(st.just("turn"), st.booleans()),
    st.tuples(st.just("warn"), _text),
), min_size=1, max_size=40)


def _events(actions: list[tuple[Any, ...]]) -> list[Event]:
    """A valid log from random actions: claims take what is queued (all, or the oldest few)."""
    queued = {STEP: 0, TURN: 0}
    events: list[Event] = []
    turn = 0
    for action in actions:
        if action[0] == "send":
            _, target, wakeup, text = action
            events.append(sent(text, target, wakeup, metadata={"t": text}))
            queued[target] += 1
        elif action[0] == "claim":
            _, target, limit = action
            count = min(limit, queued[target]) if limit else queued[target]
            if count:
                rest = queued[target] - count
                events.append(QueueClaimed(target=target, count=count, rest=rest))
                queued[target] = rest
        elif action[0] == "reply":
            events.append(ModelReplied(turn=turn, step=1, message=Message.assistant(action[1])))
        elif action[0] == "turn":
            if action[1]:
                turn += 1
                events.append(TurnStarted(turn=turn, reason="wake"))
            else:
                events.append(TurnEnded(turn=turn, steps=1, reason="final"))
        else:
            events.append(Warned(text=action[1]))
    return events or [Warned(text="x")]


def _property(store: Any, data: st.DataObject, actions: list[tuple[Any, ...]]) -> None:
    stream = f"s{next(_names)}"
    stored = store.append(stream, _events(actions))
    at = data.draw(st.integers(1, len(stored)), label="snapshot at")
    assert save_snapshot(store, stream, replay(stored[:at]))
    more = data.draw(st.lists(_text, max_size=3), label="sent after the snapshot")
    if more:
        store.append(stream, [sent(text) for text in more])
    opened = load_session(store, stream)
    assert opened.session == replay(store.read(stream))
    assert (opened.snapshot, opened.replayed) == (at, store.version(stream) - at)


_PROPERTY = settings(max_examples=40 * STRESS, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture])


@_PROPERTY
@given(data=st.data(), actions=_actions)
def test_opening_from_a_snapshot_equals_the_full_replay(
    store: Any, data: st.DataObject, actions: list[tuple[Any, ...]]
) -> None:
    _property(store, data, actions)


@settings(max_examples=30 * STRESS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=_actions, every=st.integers(1, 12), split=st.integers(0, 40))
def test_a_journal_reopened_at_any_point_holds_the_full_replay(
    actions: list[tuple[Any, ...]], every: int, split: int
) -> None:
    """Whatever the interval, and whenever the owner stops and another opens: the same value."""
    store = open_store("memory:")
    events = _events(actions)
    journal = Journal(store, "s", snapshot_every=every, freeze_gc=False)
    for i, event in enumerate(events):
        if i == split:
            journal = Journal(store, "s", snapshot_every=every, freeze_gc=False)
        journal.commit(lambda s, e=event: ([e], None))
    reopened = Journal(store, "s", snapshot_every=every, freeze_gc=False)
    assert reopened.session == journal.session == replay(store.read("s"))
    assert reopened.replayed < max(every, store.version("s") // 10 + 1)


# -- every store keeps the newest snapshot per stream --------------------------------------------


def test_every_store_keeps_snapshots(store: Any) -> None:
    assert isinstance(store, SnapshotStore)
    fill(store, "s", 10)
    assert store.load_snapshot("s") is None
    assert store.save_snapshot("s", 4, b"four")
    assert store.save_snapshot("s", 9, b"nine")
    assert store.load_snapshot("s") == (9, b"nine")
    assert store.load_snapshot("other") is None


def test_a_store_keeps_a_newer_snapshot_of_its_log_and_says_so(store: Any) -> None:
    stored = fill(store, "s", 20)
    assert save_snapshot(store, "s", replay(stored[:15]))
    kept = store.load_snapshot("s")
    assert not save_snapshot(store, "s", replay(stored[:10]))  # nothing written: False
    assert store.load_snapshot("s") == kept


def test_a_store_replaces_a_newer_snapshot_of_another_log(store: Any) -> None:
    """Newer, but it can never be used here: keeping it would block every save after."""
    stored = fill(store, "s", 20)
    other = open_store("memory:")
    elsewhere = other.append("s", [Warned(text=str(i)) for i in range(15)])
    store.save_snapshot("s", 15, encode_snapshot("s", replay(elsewhere), elsewhere[-TIP_EVENTS:]))
    assert save_snapshot(store, "s", replay(stored[:10]))
    assert store.load_snapshot("s")[0] == 10
    assert load_session(store, "s").snapshot == 10


@pytest.mark.parametrize("seq", [0, -1, 11, 1.0, True])
def test_a_snapshot_seq_must_be_within_the_stream(store: Any, seq: Any) -> None:
    fill(store, "s", 10)
    with pytest.raises(ValueError, match="seq"):
        store.save_snapshot("s", seq, b"x")
    assert store.load_snapshot("s") is None


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_a_snapshot_survives_reopening_the_store(url: str) -> None:
    with open_store(url) as store:
        fill(store, "s", 30)
        assert save_snapshot(store, "s", replay(store.read("s")))
    with open_store(url) as store:
        opened = load_session(store, "s")
        assert (opened.snapshot, opened.replayed) == (30, 0)
        assert opened.session == replay(store.read("s"))


# -- a snapshot that cannot be trusted is ignored, with a warning ------------------------------


def _ignored(store: Any, caplog: pytest.LogCaptureFixture, reason: str) -> None:
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.snapshot"):
        opened = load_session(store, "s")
    assert opened.snapshot == 0
    assert opened.session == replay(store.read("s"))
    assert reason in caplog.text


def _good(store: Any) -> tuple[int, bytes]:
    fill(store, "s", 20)
    assert save_snapshot(store, "s", replay(list(store.read("s"))[:15]))
    found = store.load_snapshot("s")
    assert found is not None
    return found


def _resave(store: Any, seq: int, head: SnapshotFile | dict[str, Any], body: bytes) -> None:
    encoded = msgspec.msgpack.encode(head)
    store.save_snapshot("s", seq, len(encoded).to_bytes(4, "big") + encoded + body)


def _split(data: bytes) -> tuple[SnapshotFile, bytes]:
    length = int.from_bytes(data[:4], "big")
    return msgspec.msgpack.decode(data[4:4 + length], type=SnapshotFile), data[4 + length:]


def test_a_snapshot_that_does_not_decode_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    store = open_store("memory:")
    seq, _ = _good(store)
    store.save_snapshot("s", seq, b"\x93garbage")
    _ignored(store, caplog, "does not decode")


@pytest.mark.parametrize("cut", [0, 3, 10, -1])
def test_a_snapshot_cut_short_is_ignored(caplog: pytest.LogCaptureFixture, cut: int) -> None:
    store = open_store("memory:")
    seq, data = _good(store)
    store.save_snapshot("s", seq, data[:cut])
    _ignored(store, caplog, "snapshot at seq")


def test_a_damaged_snapshot_body_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    store = open_store("memory:")
    seq, data = _good(store)
    head, body = _split(data)
    damaged = bytearray(body)
    damaged[len(damaged) // 2] ^= 0x01
    _resave(store, seq, head, bytes(damaged))
    _ignored(store, caplog, "checksum")


@pytest.mark.parametrize("version", [SNAPSHOT_VERSION + 1, SNAPSHOT_VERSION - 1])
def test_a_snapshot_of_another_format_version_is_ignored(
    caplog: pytest.LogCaptureFixture, version: int
) -> None:
    store = open_store("memory:")
    seq, data = _good(store)
    head, body = _split(data)
    _resave(store, seq, msgspec.structs.replace(head, version=version), body)
    _ignored(store, caplog, "newer" if version > SNAPSHOT_VERSION else "older")


def test_a_newer_format_is_ignored_before_its_body_is_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_store("memory:")
    seq, _ = _good(store)
    _resave(store, seq, {"format": "nous-inbox-snapshot", "version": SNAPSHOT_VERSION + 1,
                         "layout": [1, "new"]}, b"\xc1 whatever a newer body is")
    _ignored(store, caplog, "newer")


def test_a_snapshot_of_another_stream_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    store = open_store("memory:")
    seq, data = _good(store)
    head, body = _split(data)
    _resave(store, seq, msgspec.structs.replace(head, stream="t"), body)
    _ignored(store, caplog, "belongs to stream 't'")


def test_a_snapshot_of_another_log_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The log was deleted and begun again: the old snapshot's tip is not the new log's."""
    path = tmp_path / "log.jsonl"
    with open_store(f"file:{path}") as store:
        fill(store, "s", 20)
        assert save_snapshot(store, "s", replay(store.read("s")))
    path.unlink()
    with open_store(f"file:{path}") as store:
        store.append("s", [Warned(text=str(i)) for i in range(25)])
        _ignored(store, caplog, "another log")


def test_a_snapshot_of_another_log_is_ignored_when_the_clock_repeats(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fixed clock (tests, simulations) gives both logs' events the same type and time: the
    tip compares the events' content, so the old snapshot is still not taken for the new log's."""
    path = tmp_path / "log.jsonl"

    def fixed() -> float:
        return 1.7e9

    with open_store(f"file:{path}") as store:
        journal = Journal(store, "s", snapshot_every=10, clock=fixed)
        for i in range(10):
            journal.commit(lambda s, i=i: ([sent(f"OLD {i}", TURN)], None))
        assert store.load_snapshot("s")[0] == 10
    path.unlink()
    with open_store(f"file:{path}") as store:
        journal = Journal(store, "s", snapshot_every=0, clock=fixed)
        for i in range(12):
            journal.commit(lambda s, i=i: ([sent(f"NEW {i}", TURN)], None))
        _ignored(store, caplog, "another log")


def test_a_snapshot_beyond_the_stream_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "log.jsonl"
    with open_store(f"file:{path}") as store:
        fill(store, "s", 20)
        assert save_snapshot(store, "s", replay(store.read("s")))
    path.unlink()
    with open_store(f"file:{path}") as store:
        fill(store, "s", 5)
        _ignored(store, caplog, "beyond the stream")


def test_a_log_begun_again_replaces_the_old_logs_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The old snapshot is beyond the new log: it neither blocks the new log's saves nor keeps
    the deleted transcript once the new log saves its own."""
    path = tmp_path / "log.jsonl"
    with open_store(f"file:{path}") as store:
        journal = Journal(store, "s", snapshot_every=10)
        for i in range(50):
            journal.commit(lambda s, i=i: ([sent(f"secret {i}", TURN)], None))
        assert store.load_snapshot("s")[0] == 50
    path.unlink()
    with open_store(f"file:{path}") as store:
        journal = Journal(store, "s", snapshot_every=10)
        for i in range(35):
            journal.commit(lambda s, i=i: ([sent(f"new {i}", TURN)], None))
        assert store.load_snapshot("s")[0] == 30
        assert journal.snapshot()
        assert store.load_snapshot("s")[0] == 35
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nous_inbox.store.snapshot"):
            opened = load_session(store, "s")
        assert (opened.snapshot, opened.replayed) == (35, 0)
        assert "ignored" not in caplog.text
    leftovers = [p.read_bytes() for p in (tmp_path / "log.jsonl.snapshots").iterdir()]
    assert len(leftovers) == 1 and b"secret" not in leftovers[0]


def test_a_snapshot_the_log_does_not_continue_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tip and checksum agree, but the value disagrees with what follows (a claim of more than
    it holds): the log wins."""
    store = open_store("memory:")
    store.append("s", [sent("a"), Warned(text="x")])
    session = replay(store.read("s"))
    tip = list(store.read("s"))
    emptied = msgspec.structs.replace(session, inbox=replay([]).inbox)
    store.save_snapshot("s", 2, encode_snapshot("s", emptied, tip))
    store.append("s", [QueueClaimed(target=STEP, count=1)])
    _ignored(store, caplog, "do not fold onto it")


def test_a_store_that_fails_to_load_a_snapshot_is_replayed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = open_store("memory:")
    fill(store, "s", 10)

    def broken(stream: str) -> None:
        raise OSError("disk on fire")

    store.load_snapshot = broken  # type: ignore[method-assign]
    _ignored(store, caplog, "disk on fire")


def test_a_hosts_own_store_without_snapshots_still_opens() -> None:
    class Plain:  # the Log protocol and nothing else
        def __init__(self) -> None:
            self.inner = open_store("memory:")

        def append(self, stream: str, events: Any, expected_version: int | None = None) -> Any:
            return self.inner.append(stream, events, expected_version)

        def read(self, stream: str, after: int = 0) -> Iterator[Event]:
            return self.inner.read(stream, after)

        def version(self, stream: str) -> int:
            return self.inner.version(stream)

    plain = Plain()
    journal = Journal(plain, "s", snapshot_every=2)
    for i in range(5):
        journal.commit(lambda s, i=i: ([sent(str(i))], None))
    assert not save_snapshot(plain, "s", journal.session)
    assert Journal(plain, "s").session == journal.session


# -- the file store's side files trust nothing planted ------------------------------------------


def _file_store_with_snapshot(tmp_path: Path) -> tuple[Any, Path]:
    store = open_store(f"file:{tmp_path / 'log.jsonl'}")
    fill(store, "s", 20)
    assert save_snapshot(store, "s", replay(store.read("s")))
    directory = tmp_path / "log.jsonl.snapshots"
    (snapshot,) = directory.iterdir()
    return store, snapshot


def test_snapshot_files_are_private(tmp_path: Path) -> None:
    _, snapshot = _file_store_with_snapshot(tmp_path)
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    assert stat.S_IMODE(snapshot.parent.stat().st_mode) == 0o700
    assert [p.name for p in snapshot.parent.iterdir()] == [snapshot.name]  # no temp file left


_KILLED_SAVE = """
import os, signal, sys
from nous_inbox.store import open_store
store = open_store("file:" + sys.argv[1])
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed midway through the save
store.save_snapshot("s", 1, b"y" * 100_000)
"""


def test_saves_killed_midway_leave_at_most_one_stray_file_which_the_next_save_removes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.jsonl"
    with open_store(f"file:{path}") as store:
        store.append("s", [Warned(text="x")])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(path)], env=env,
                              check=False)
        assert done.returncode == -signal.SIGKILL
    directory = tmp_path / "log.jsonl.snapshots"
    assert len([p for p in directory.iterdir() if p.name.endswith(".tmp")]) == 1
    with open_store(f"file:{path}") as store:
        assert save_snapshot(store, "s", replay(store.read("s")))
        assert [p.name.endswith(".snapshot") for p in directory.iterdir()] == [True]
        assert load_session(store, "s").snapshot == 1


def test_a_snapshot_file_others_may_write_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, snapshot = _file_store_with_snapshot(tmp_path)
    snapshot.chmod(0o666)
    _ignored(store, caplog, "is writable by")


def test_a_snapshot_directory_others_may_write_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, snapshot = _file_store_with_snapshot(tmp_path)
    snapshot.parent.chmod(0o777)
    _ignored(store, caplog, "is writable by")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_snapshot_file_another_user_owns_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, snapshot = _file_store_with_snapshot(tmp_path)
    os.chown(snapshot, 4321, 4321)
    _ignored(store, caplog, "not to you")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_snapshot_directory_another_user_owns_is_ignored_and_never_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, snapshot = _file_store_with_snapshot(tmp_path)
    os.chown(snapshot.parent, 4321, 4321)
    _ignored(store, caplog, "not to you")
    before = snapshot.read_bytes()
    store.append("s", [Warned(text="one more")])
    with pytest.raises(OSError, match="not to you"):
        save_snapshot(store, "s", replay(store.read("s")))
    assert snapshot.read_bytes() == before


def test_a_planted_snapshot_link_is_never_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, snapshot = _file_store_with_snapshot(tmp_path)
    victim = tmp_path / "victim"
    original = snapshot.read_bytes()
    victim.write_bytes(original)
    snapshot.unlink()
    snapshot.symlink_to(victim)
    _ignored(store, caplog, "symbolic link")
    store.append("s", [Warned(text="one more")])  # so the save below writes other bytes
    assert save_snapshot(store, "s", replay(store.read("s")))  # replaces the link itself
    assert not snapshot.is_symlink()
    assert victim.read_bytes() == original
    assert snapshot.read_bytes() != original


def test_a_planted_snapshot_directory_link_is_never_followed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, snapshot = _file_store_with_snapshot(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    snapshot.parent.rename(elsewhere)
    snapshot.parent.symlink_to(elsewhere)
    _ignored(store, caplog, "never followed")
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.journal"):
        assert not Journal(store, "s", snapshot_every=1).snapshot()
    assert "never followed" in caplog.text


# -- a journal (so an owner) saves snapshots and opens from them ------------------------------


class Counting:
    """A store wrapper that counts the events read through it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.read_count = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        for event in self.store.read(stream, after):
            self.read_count += 1
            yield event


def _send(journal: Journal, n: int) -> None:
    for i in range(n):
        journal.commit(lambda s, i=i: ([sent(f"m{i}", wakeup=False)], None))


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_a_journal_saves_every_n_events_and_reopens_from_the_snapshot(url: str) -> None:
    with open_store(url) as store:
        _send(Journal(store, "s", snapshot_every=10), 25)
        assert store.load_snapshot("s")[0] == 20
    with open_store(url) as store:
        counting = Counting(store)
        journal = Journal(counting, "s", snapshot_every=10)
        assert journal.session == replay(store.read("s"))
        assert journal.replayed == 5
        # its tip (the 16 events up to it, checked by content), then the five after
        assert counting.read_count == TIP_EVENTS + 5


def test_an_open_that_replayed_a_long_tail_saves_a_snapshot() -> None:
    store = open_store("memory:")
    fill(store, "s", 30)
    assert Journal(store, "s", snapshot_every=10).replayed == 30
    assert store.load_snapshot("s")[0] == 30
    assert Journal(store, "s", snapshot_every=10).replayed == 0


def test_snapshot_every_zero_never_saves() -> None:
    store = open_store("memory:")
    _send(Journal(store, "s", snapshot_every=0), 25)
    assert store.load_snapshot("s") is None


@pytest.mark.parametrize("bad", [-1, 1.5, "10", None])
def test_a_bad_snapshot_every_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="snapshot_every"):
        Journal(open_store("memory:"), "s", snapshot_every=bad)


def test_a_journal_without_the_transcript_never_saves() -> None:
    """Its session lacks the transcript: saved, it would lose it for every other reader."""
    store = open_store("memory:")
    _send(Journal(store, "s", snapshot_every=5, transcript=False), 12)
    assert store.load_snapshot("s") is None


def test_a_failed_save_is_logged_and_the_send_succeeds(caplog: pytest.LogCaptureFixture) -> None:
    store = open_store("memory:")

    def broken(stream: str, seq: int, data: bytes) -> bool:
        raise OSError("disk full")

    store.save_snapshot = broken  # type: ignore[method-assign]
    journal = Journal(store, "s", snapshot_every=3)
    with caplog.at_level(logging.WARNING, logger="nous_inbox.store.journal"):
        _send(journal, 4)
    assert journal.session.version == 4 == store.version("s")
    assert "disk full" in caplog.text


def test_an_owner_reopens_from_its_snapshot(tmp_path: Path) -> None:
    from nous_inbox.owner import Owner
    from nous_inbox.runner import Runner

    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    runner = Runner(lambda transcript, tools: "ok")
    with open_store(url) as store:
        owner = Owner(store, "s", runner, snapshot_every=10, watch=False, start=False)
        for i in range(23):
            owner.inject(f"fyi {i}")
        owner.close()
        assert store.load_snapshot("s")[0] == 20
    with open_store(url) as store:
        owner = Owner(store, "s", runner, snapshot_every=10, watch=False, start=False)
        assert owner.replayed == 3  # past the snapshot at 20
        assert owner.session == replay(store.read("s"))
        owner.close()


def test_an_async_owner_reopens_from_its_snapshot(tmp_path: Path) -> None:
    import asyncio

    from nous_inbox.owner import AsyncOwner
    from nous_inbox.runner import Runner

    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    runner = Runner(lambda transcript, tools: "ok")

    async def main() -> None:
        with open_store(url) as store:
            async with AsyncOwner(store, "s", runner, snapshot_every=10, watch=False,
                                  start=False) as owner:
                assert owner.replayed == 0  # a new stream: nothing to replay
                for i in range(23):
                    await owner.inject(f"fyi {i}")
        with open_store(url) as store:
            async with AsyncOwner(store, "s", runner, snapshot_every=10, watch=False,
                                  start=False) as owner:
                assert owner.replayed == 3  # past the snapshot at 20
                assert owner.session == replay(store.read("s"))

    asyncio.run(main())


@pytest.mark.parametrize("bad", [-1, 2.0])
def test_an_owner_refuses_a_bad_snapshot_every(bad: Any) -> None:
    from nous_inbox.owner import Owner
    from nous_inbox.runner import Runner

    with pytest.raises(ValueError, match="snapshot_every"):
        Owner(open_store("memory:"), "s", Runner(lambda t, tools: "ok"), snapshot_every=bad)


# -- read-only stores read snapshots and save none -----------------------------------------------


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_a_read_only_store_opens_from_a_snapshot_and_saves_none(url: str) -> None:
    with open_store(url) as store:
        fill(store, "s", 30)
        assert save_snapshot(store, "s", replay(list(store.read("s"))[:20]))
    with open_store(url, read_only=True) as store:
        opened = load_session(store, "s")
        assert (opened.snapshot, opened.replayed) == (20, 10)
        assert opened.session == replay(store.read("s"))
        assert not save_snapshot(store, "s", opened.session)
        assert not store.save_snapshot("s", 30, b"x")
        assert store.load_snapshot("s")[0] == 20


def test_sqlite_does_not_keep_a_snapshot_sized_wal(tmp_path: Path) -> None:
    """A save writes its blob through the WAL; once checkpointed, the -wal is cut back."""
    path = tmp_path / "inbox.sqlite"
    with open_store(f"sqlite:{path}") as store:
        store.append("s", [Warned(text="x")])
        store.save_snapshot("s", 1, b"y" * 12_000_000)
        for _ in range(300):
            store.append("s", [Warned(text="z" * 1000)])
        assert os.path.getsize(f"{path}-wal") <= 4 * 1024 * 1024


def test_a_read_only_sqlite_store_from_before_snapshots_has_none(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    with open_store(url) as store:
        fill(store, "s", 5)
    with open_store(url, read_only=True) as store:
        assert store.load_snapshot("s") is None
        assert load_session(store, "s").replayed == 5


# -- a long session: the collector is kept out of its history --------------------------------


def test_a_journal_freezes_a_long_session_out_of_the_collector_only_when_asked() -> None:
    # gc.freeze is process-wide: a library leaves its host's collector alone by default.
    store = open_store("memory:")
    fill(store, "s", 50)
    gc.unfreeze()
    try:
        journal = Journal(store, "s", snapshot_every=10)
        for i in range(30):
            journal.send(f"fyi {i}", "next_step", False)
        assert gc.get_freeze_count() == 0
        Journal(store, "s", snapshot_every=10, freeze_gc=True)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_both_owners_leave_the_collector_alone_with_freeze_gc_false() -> None:
    """A freeze keeps every host object caught in a reference cycle at that moment forever: an
    owner's host may opt out (the journal's option, passed through)."""
    import asyncio

    from nous_inbox.owner import Owner
    from nous_inbox.owner.async_owner import AsyncOwner
    from nous_inbox.runner import Runner

    store = open_store("memory:")
    fill(store, "s", 50)
    runner = Runner(lambda transcript, tools: "ok")
    gc.unfreeze()
    try:
        owner = Owner(store, "s", runner, snapshot_every=10, watch=False, start=False,
                      freeze_gc=False)
        for i in range(30):
            owner.inject(f"fyi {i}")
        owner.close()
        assert gc.get_freeze_count() == 0

        async def run() -> None:
            async with AsyncOwner(store, "s", runner, snapshot_every=10, watch=False,
                                  start=False, freeze_gc=False) as owner:
                for i in range(30):
                    await owner.inject(f"later {i}")

        asyncio.run(run())
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("bad", [0, None, "no"])
def test_both_owners_refuse_a_freeze_gc_that_is_not_a_bool(bad: Any) -> None:
    from nous_inbox.owner import Owner
    from nous_inbox.owner.async_owner import AsyncOwner
    from nous_inbox.runner import Runner

    runner = Runner(lambda transcript, tools: "ok")
    with pytest.raises(TypeError, match="freeze_gc must be a bool"):
        Owner(open_store("memory:"), "s", runner, freeze_gc=bad)
    with pytest.raises(TypeError, match="freeze_gc must be a bool"):
        AsyncOwner(open_store("memory:"), "s", runner, freeze_gc=bad)
    with pytest.raises(TypeError, match="freeze_gc must be a bool"):
        Journal(open_store("memory:"), "s", freeze_gc=bad)


def test_a_session_value_is_the_same_with_or_without_snapshots() -> None:
    """The knob changes where an open starts, never what it gives."""
    a, b = open_store("memory:"), open_store("memory:")
    ja, jb = Journal(a, "s", snapshot_every=3), Journal(b, "s", snapshot_every=0)
    _send(ja, 10)
    _send(jb, 10)
    assert Journal(a, "s").session == Journal(b, "s").session == ja.session
    assert Session() == Journal(open_store("memory:"), "s").session


# -- the command line saves one on demand ------------------------------------------------------


def test_the_snapshot_command_saves_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nous_inbox.__main__ import main

    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    with open_store(url) as store:
        fill(store, "s", 12)
    assert main(["snapshot", "--store", url, "s"]) == 0
    assert "snapshot saved at seq 12" in capsys.readouterr().out
    with open_store(url) as store:
        assert load_session(store, "s").snapshot == 12


def test_the_snapshot_command_says_when_a_newer_snapshot_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner appended and saved after the command opened the session: nothing is written,
    and the command says so rather than that the store keeps no snapshots."""
    from nous_inbox.__main__ import main
    from nous_inbox.cli import commands
    from nous_inbox.store.snapshot import Opened

    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    with open_store(url) as store:
        stored = fill(store, "s", 12)
        assert save_snapshot(store, "s", replay(stored))
    monkeypatch.setattr(commands, "load_session",
                        lambda store, stream: Opened(replay(stored[:5]), 0, 5))
    assert main(["snapshot", "--store", url, "s"]) == 0
    assert "a newer snapshot (seq 12) is kept already; nothing saved" in capsys.readouterr().out
    with open_store(url) as store:
        assert store.load_snapshot("s")[0] == 12


def test_the_snapshot_command_refuses_an_unknown_session(tmp_path: Path) -> None:
    from nous_inbox.__main__ import main

    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    with open_store(url) as store:
        fill(store, "s", 3)
    assert main(["snapshot", "--store", url, "nobody"]) == 1
    assert main(["snapshot", "--store", f"sqlite:{tmp_path / 'typo.sqlite'}", "s"]) == 1
    assert not (tmp_path / "typo.sqlite").exists()


def test_the_interval_grows_to_a_tenth_of_the_session() -> None:
    """A save costs what the session holds: spaced by a tenth of it, the cost per event is flat."""
    store = open_store("memory:")
    fill(store, "s", 100)
    journal = Journal(store, "s", snapshot_every=2)
    assert store.load_snapshot("s")[0] == 100
    _send(journal, 9)
    assert store.load_snapshot("s")[0] == 100
    _send(journal, 1)
    assert store.load_snapshot("s")[0] == 110


def test_show_gives_the_same_inbox_from_a_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nous_inbox.__main__ import main

    path = tmp_path / "inbox.sqlite"
    url = f"sqlite:{path}"
    with open_store(url) as store:
        fill(store, "s", 40)
    assert main(["snapshot", "--store", url, "s"]) == 0
    with open_store(url) as store:
        fill(store, "s", 47)
    capsys.readouterr()
    assert main(["show", "--json", "--store", url, "s"]) == 0
    from_snapshot = capsys.readouterr().out
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM snapshots")
    assert main(["show", "--json", "--store", url, "s"]) == 0
    assert capsys.readouterr().out == from_snapshot


def test_a_save_never_waits_for_another_holding_the_snapshot_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A process stopped mid-save (SIGSTOP, a debugger) keeps the directory's flock; a save here
    # runs under the store's lock, so waiting would stop this process's sends too.
    path = tmp_path / "log.jsonl"
    with open_store(f"file:{path}") as store:
        store.append("s", [Warned(text="x")])
        assert save_snapshot(store, "s", replay(store.read("s")))
        directory = os.open(f"{path}.snapshots", os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(directory, fcntl.LOCK_EX)  # another descriptor: a lock of its own
            store.append("s", [Warned(text="y")])
            with caplog.at_level(logging.INFO, logger="nous_inbox.store.file"):
                assert store.save_snapshot("s", 2, b"new") is False
            assert "another save holds the snapshot directory" in caplog.text
            assert store.load_snapshot("s")[0] == 1  # the old one is kept
            store.append("s", [Warned(text="z")])
            assert store.version("s") == 3
        finally:
            os.close(directory)
        assert store.save_snapshot("s", 3, b"new")  # free again: saved
        assert store.load_snapshot("s") == (3, b"new")


def test_the_snapshot_command_says_to_try_again_when_another_save_holds_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nous_inbox.__main__ import main

    path = tmp_path / "log.jsonl"
    with open_store(f"file:{path}") as store:
        fill(store, "s", 3)
        assert save_snapshot(store, "s", replay(store.read("s")))
        fill(store, "s", 2)
    directory = os.open(f"{path}.snapshots", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        assert main(["snapshot", "--store", f"file:{path}", "s"]) == 1
    finally:
        os.close(directory)
    assert "another save was under way (then try again)" in capsys.readouterr().err
    assert main(["snapshot", "--store", f"file:{path}", "s"]) == 0
