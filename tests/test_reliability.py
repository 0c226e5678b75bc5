"""Reliability, with real files and real processes: crashes, torn tails, corruption, racing writers.

What is promised: an acknowledged append survives a SIGKILL of its writer; a record (or batch) cut
short at the tail is dropped and nothing else is; damage before the tail is a ``DecodeError``
naming the line, never skipped; concurrent writers with expected versions lose nothing and
duplicate nothing; the decoders let nothing but ``DecodeError`` escape; and replaying what was
stored gives exactly the value the live code held.

Sizes are small by default so the file runs in seconds. ``NOUS_INBOX_STRESS=N`` (an integer,
default 1) multiplies the hypothesis example counts and the process burst sizes; the tests marked
``slow`` are the ones worth running with a large N.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_inbox.codec import (
    Record,
    decode_event,
    decode_record,
    iter_events,
    iter_records,
    json_lines,
    msgpack_frames,
)
from nous_inbox.errors import DecodeError
from nous_inbox.events import (
    MessageSent,
    ModelReplied,
    Nudged,
    QueueClaimed,
    StepEnded,
    StepStarted,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message
from nous_inbox.session import Session, replay
from nous_inbox.store import FileStore, MemoryStore, SqliteStore, open_store
from nous_inbox.verbs import Target

STRESS = int(os.environ.get("NOUS_INBOX_STRESS", "1") or 1)
ROOT = Path(__file__).resolve().parent.parent


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=examples * STRESS, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- a sample log --------------------------------------------------------------------------------

TEXTS = ["plain", "héllo ✓", "日本語のメッセージ", "emoji 🚀🔥", 'quote " and \\ slash', "new\nline", ""]


def sample_appends() -> list[tuple[str, list]]:
    """A few dozen events in single appends and batches, over three streams, unicode included."""
    appends: list[tuple[str, list]] = []
    for i in range(12):
        stream = ["alpha", "βeta", "gamma"][i % 3]
        text = TEXTS[i % len(TEXTS)]
        if i % 4 == 1:
            appends.append((stream, [
                MessageSent(target=Target.NEXT_STEP, wakeup=True, message=Message.user(text + "1"),
                            at=1.0),
                MessageSent(target=Target.NEXT_TURN, wakeup=False, message=Message.user(text + "2"),
                            at=1.0),
                Warned(text=text, at=1.0),
            ]))
        else:
            appends.append((stream, [MessageSent(
                target=Target.NEXT_STEP, wakeup=i % 2 == 0,
                message=Message.user(text, metadata={"i": i, "from": "léo"}), at=1.0)]))
    return appends


def write_sample(path: Path) -> tuple[bytes, list[tuple[int, dict[str, list]]]]:
    """Write the sample through a FileStore; return the bytes and, after each append, its end
    offset and the streams as they stood."""
    ends: list[tuple[int, dict[str, list]]] = []
    with FileStore(path) as store:
        header_end = path.stat().st_size
        ends.append((header_end, {}))
        for stream, events in sample_appends():
            store.append(stream, events)
            ends.append((path.stat().st_size,
                         {s: list(store.read(s)) for s in store.streams()}))
    return path.read_bytes(), ends


def as_read(store: FileStore) -> dict[str, list]:
    return {s: list(store.read(s)) for s in store.streams()}


# -- torn tails ----------------------------------------------------------------------------------


def test_a_file_log_cut_at_every_byte_gives_back_exactly_the_complete_appends(tmp_path):
    data, ends = write_sample(tmp_path / "full.jsonl")
    assert len(data) > 2000  # a few dozen events
    cut_path = tmp_path / "cut.jsonl"
    for cut in range(len(data) + 1):
        cut_path.write_bytes(data[:cut])
        expected = {}
        for end, streams in ends:
            if end <= cut:
                expected = streams
        with FileStore(cut_path, read_only=True) as store:
            assert as_read(store) == expected, f"cut at byte {cut}"


def test_a_writer_opening_a_torn_log_cuts_off_only_the_torn_append(tmp_path):
    data, ends = write_sample(tmp_path / "full.jsonl")
    cut_path = tmp_path / "cut.jsonl"
    header_end = ends[0][0]
    # Every offset in the header and the first append, then a stride through the rest.
    cuts = list(range(0, ends[1][0] + 2)) + list(range(ends[1][0] + 2, len(data) + 1, 13))
    for cut in cuts:
        cut_path.write_bytes(data[:cut])
        complete = max(end for end, _ in ends if end <= cut) if cut >= header_end else 0
        expected = next((s for end, s in ends if end == complete), {})
        with FileStore(cut_path) as store:
            assert as_read(store) == expected, f"cut at byte {cut}"
            assert cut_path.read_bytes() == data[:max(complete, header_end)]
            stored = store.append("alpha", [Warned(text="after the crash")])
        with FileStore(cut_path, read_only=True) as store:
            assert list(store.read("alpha"))[-1] == stored[-1]


def test_a_json_or_msgpack_log_cut_anywhere_reads_a_prefix_or_says_truncated():
    events = [e for _, batch in sample_appends() for e in batch]
    events = [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events, 1)]
    for data, fmt in ((json_lines(events), "json"), (msgpack_frames(events), "msgpack")):
        for cut in range(len(data) + 1):
            got = []
            try:
                for _, _, event in iter_events(data[:cut], fmt):  # type: ignore[arg-type]
                    got.append(event)
            except DecodeError as exc:
                assert "truncated" in str(exc), (fmt, cut, str(exc))
            assert got == events[:len(got)], (fmt, cut)


# -- corruption before the tail ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (b'"seq":2', b'"seq":"2"', "Expected `int`, got `str`"),
        (b'"type":"message_sent"', b'"type":"message_lost"', "unknown event type 'message_lost'"),
        (b'"seq":2', b'"seq":5', "has seq 5 where 2 was due"),
        (b'"event":{"type"', b'"event":{ "type"', None),  # harmless whitespace: still valid
        (b'"stream":"alpha"', b'"stream":"alp\\u0000a"', "control character"),
    ],
)
def test_damage_in_the_middle_is_an_error_naming_the_line_never_skipped(tmp_path, old, new, message):
    data, _ = write_sample(tmp_path / "log.jsonl")
    lines = data.split(b"\n")
    target = next(i for i, line in enumerate(lines) if old in line and i > 3)
    lines[target] = lines[target].replace(old, new, 1)
    damaged = b"\n".join(lines)
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(damaged)
    if message is None:
        with FileStore(path, read_only=True) as store:
            assert store.streams() == ["alpha", "gamma", "βeta"]
            assert as_read(store) == as_read(FileStore(tmp_path / "log.jsonl", read_only=True))
        return
    offset = len(b"\n".join(lines[:target])) + 1
    for read_only in (True, False):
        # The store opens; whoever touches the damaged stream (or lists them all) is told where.
        with FileStore(path, read_only=read_only) as store, pytest.raises(DecodeError) as info:
            as_read(store)
            if not read_only:
                store.append("alpha", [Warned(text="x")])
        assert f"line {target + 1} (byte {offset})" in str(info.value)
        assert message in str(info.value)
    assert path.read_bytes() == damaged  # a writer refused it and left it alone


def test_a_line_garbled_by_a_random_byte_is_refused(tmp_path):
    data, _ = write_sample(tmp_path / "log.jsonl")
    lines = data.split(b"\n")
    lines[5] = lines[5][:20] + b"\xff\x00" + lines[5][22:]
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(b"\n".join(lines))
    with FileStore(path, read_only=True) as store, pytest.raises(
        DecodeError, match=r"line 6 \(byte \d+\)"
    ):
        as_read(store)


# -- writers killed mid-burst --------------------------------------------------------------------

WRITER = textwrap.dedent("""
    import sys
    from nous_inbox.events import MessageSent, Warned
    from nous_inbox.message import Message
    from nous_inbox.store import open_store
    store = open_store(sys.argv[1])
    n = store.version("burst")
    while True:
        size = 1 if n % 3 else 3
        batch = [MessageSent(target="next_step", wakeup=True,
                             message=Message.user(f"m{n + i + 1} ✓"))
                 for i in range(size - 1)] + [Warned(text=f"w{n + size}")]
        stored = store.append("burst", batch)
        n = stored[-1].seq
        print(n, flush=True)
""")


def _kill_mid_burst(url: str, acks_wanted: int) -> tuple[int, set[int]]:
    """Run a writer, read its acknowledgements, SIGKILL it; return (last ack, batch ends)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=ROOT, text=True,
    )
    acked = 0
    ends = {0}
    try:
        assert proc.stdout is not None
        for _ in range(acks_wanted):
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"writer died early: {proc.stderr.read() if proc.stderr else ''}")
            acked = int(line)
            ends.add(acked)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
    return acked, ends


def _check_burst(events: list, acked: int) -> None:
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1))
    assert len(events) >= acked, f"acknowledged {acked}, found {len(events)}"
    for e in events:
        text = e.text if isinstance(e, Warned) else e.message.content
        assert text in (f"w{e.seq}", f"m{e.seq} ✓")
    assert isinstance(events[-1], Warned), "a batch was cut in half"


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_a_writer_killed_mid_burst_loses_no_acknowledged_event(kind, url):
    acked, _ = _kill_mid_burst(url, 40 * STRESS)
    with open_store(url) as store:
        events = list(store.read("burst"))
        _check_burst(events, acked)
        # And the store takes appends again (the file store cuts off any torn tail first).
        store.append("burst", [Warned(text=f"w{len(events) + 1}")])
    with open_store(url) as store:
        _check_burst(list(store.read("burst")), acked + 1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_repeated_kills_accumulate_a_consistent_log(kind, url):
    total = 0
    for _ in range(3 * STRESS):
        acked, _ = _kill_mid_burst(url, 15)
        assert acked > total
        with open_store(url) as store:
            events = list(store.read("burst"))
        _check_burst(events, acked)
        total = len(events)


# -- racing writers ------------------------------------------------------------------------------

RACER = textwrap.dedent("""
    import sys
    from nous_inbox.errors import ConcurrencyError
    from nous_inbox.events import Warned
    from nous_inbox.store import open_store
    url, me, free = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = open_store(url)
    n = 0
    # Lockstep rounds: both racers read the version, then both append expecting it.
    for command in sys.stdin:
        if command.strip() == "read":
            version = store.version("race")
            print("version", version, flush=True)
        elif command.strip() == "append":
            try:
                store.append("race", [Warned(text=f"{me}-{n}")], expected_version=version)
                n += 1
                print("ok", flush=True)
            except ConcurrencyError:
                print("conflict", flush=True)
        elif command.strip() == "free":
            break
    # Free run: append `free` more, re-reading the version after every conflict.
    conflicts = 0
    while n < free:
        try:
            store.append("race", [Warned(text=f"{me}-{n}")],
                         expected_version=store.version("race"))
            n += 1
        except ConcurrencyError:
            conflicts += 1
    print("done", n, conflicts, flush=True)
""")


@pytest.mark.parametrize("kind", ["sqlite", "file", "postgres"])
def test_two_processes_racing_with_expected_versions_lose_and_duplicate_nothing(kind, url):
    open_store(url).close()
    free = 60 * STRESS
    procs = [subprocess.Popen([sys.executable, "-c", RACER, url, me, str(free)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for me in ("A", "B")]

    def ask(proc: subprocess.Popen, command: str) -> str:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    try:
        rounds = 8
        outcomes = []
        for _ in range(rounds):
            versions = {ask(p, "read") for p in procs}
            assert len(versions) == 1  # both saw the same version
            outcomes.append(sorted(ask(p, "append") for p in procs))
        # Exactly one of each lockstep pair won; the other got a ConcurrencyError.
        assert outcomes == [["conflict", "ok"]] * rounds
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("free\n")
            p.stdin.close()
        results = [p.stdout.readline().split() for p in procs if p.stdout is not None]
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()
    assert [r[:2] for r in results] == [["done", str(free)]] * 2
    with open_store(url) as store:
        events = list(store.read("race"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    texts = [e.text for e in events]
    assert len(texts) == len(set(texts)) == 2 * free  # none lost, none duplicated
    for me in ("A", "B"):  # each racer's own events are in its order
        assert [t for t in texts if t.startswith(me)] == [f"{me}-{i}" for i in range(free)]


# -- fuzzing the decoders ------------------------------------------------------------------------


def _valid_logs() -> list[tuple[bytes, str, bool]]:
    events = [msgspec.structs.replace(e, seq=i)
              for i, e in enumerate((e for _, b in sample_appends() for e in b), 1)]
    records = [Record(stream="s", event=e) for e in events[:6]]
    return [(json_lines(events[:6]), "json", False), (msgpack_frames(events[:6]), "msgpack", False),
            (json_lines(records), "json", True), (msgpack_frames(records), "msgpack", True)]


VALID = _valid_logs()


def _only_decode_errors(data: bytes, fmt: str, records: bool) -> None:
    reader = iter_records if records else iter_events
    try:
        for _ in reader(data, fmt):  # type: ignore[operator]
            pass
    except DecodeError:
        pass
    for one in (decode_record, decode_event):
        with contextlib.suppress(DecodeError):
            one(data, fmt)  # type: ignore[operator]


@fuzz_settings(150)
@given(data=st.binary(max_size=300), fmt=st.sampled_from(["json", "msgpack"]),
       records=st.booleans(), header=st.booleans())
def test_random_bytes_raise_nothing_but_decode_error(data, fmt, records, header):
    if header:
        data = (VALID[0][0] if fmt == "json" else VALID[1][0]).split(b"\n")[0] + b"\n" + data \
            if fmt == "json" else VALID[1][0][:36] + data
    _only_decode_errors(data, fmt, records)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[bytes, str, bool]:
    data, fmt, records = draw(st.sampled_from(VALID))
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not buf:
            break
        at = draw(st.integers(0, len(buf) - 1))
        action = draw(st.sampled_from(["flip", "set", "delete", "insert", "cut"]))
        if action == "flip":
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "set":
            buf[at] = draw(st.integers(0, 255))
        elif action == "delete":
            del buf[at]
        elif action == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del buf[at:]
    return bytes(buf), fmt, records


@fuzz_settings(300)
@given(case=mutated())
def test_mutated_valid_logs_raise_nothing_but_decode_error(case):
    _only_decode_errors(*case)


@fuzz_settings(60)
@given(case=mutated())
def test_a_mutated_file_store_log_opens_or_raises_decode_error(case):
    data, fmt, records = case
    if fmt != "json" or not records:
        data = json_lines([Record(stream="s", event=decode_event(line))
                           for line in VALID[0][0].split(b"\n")[1:-1]])
        data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x20]) + data[len(data) // 2 + 1:]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.jsonl"
        path.write_bytes(data)
        try:
            with FileStore(path, read_only=True) as store:
                for stream in store.streams():
                    list(store.read(stream))
        except DecodeError:
            pass


@fuzz_settings(60)
@given(body=st.binary(max_size=200))
def test_a_bad_sqlite_row_raises_nothing_but_decode_error(body):
    import sqlite3

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inbox.sqlite"
        with SqliteStore(path) as store:
            store.append("s", [Warned(text="ok")])
        db = sqlite3.connect(path)
        db.execute("UPDATE events SET body = ?", (body,))
        db.commit()
        db.close()
        with SqliteStore(path) as store:
            try:
                list(store.read("s"))
            except DecodeError as exc:
                assert "stream 's' seq 1" in str(exc)


_SQLITE_SAMPLE: list[bytes] = []


def _sqlite_sample() -> bytes:
    """The bytes of a small SQLite store holding the sample log (built once)."""
    if not _SQLITE_SAMPLE:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "inbox.sqlite"
            with SqliteStore(path) as store:
                for stream, events in sample_appends():
                    store.append(stream, events)
            _SQLITE_SAMPLE.append(path.read_bytes())  # checkpointed into the file on close
    return _SQLITE_SAMPLE[0]


@fuzz_settings(60)
@given(damage=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                       min_size=1, max_size=8),
       read_only=st.booleans())
def test_a_damaged_sqlite_file_raises_nothing_but_store_or_decode_errors(damage, read_only):
    from nous_inbox.errors import StoreError

    data = bytearray(_sqlite_sample())
    for where, value in damage:
        data[int(where * len(data))] = value
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inbox.sqlite"
        path.write_bytes(bytes(data))
        try:
            with SqliteStore(path, read_only=read_only) as store:
                for stream in store.streams():
                    store.version(stream)
                    list(store.read(stream))
        except (StoreError, DecodeError):
            pass


# -- live value == replayed value ----------------------------------------------------------------

texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.sampled_from(list(Target)), st.booleans(), texts),
        st.tuples(st.just("claim"), st.sampled_from(list(Target))),
        st.tuples(st.just("claim_oldest"), st.sampled_from(list(Target)), st.integers(0, 4)),
        st.tuples(st.just("turn")),
        st.tuples(st.just("reply"), texts),
    ),
    max_size=30,
)


def _events_for(ops: list[tuple]) -> tuple[Inbox, list[list]]:
    """Apply ``ops`` to a live Inbox; return it and the appends (batches) that record them."""
    inbox = Inbox()
    appends: list[list] = []
    turn = step = 0
    for op in ops:
        if op[0] == "send":
            _, target, wakeup, text = op
            inbox = inbox.send(text, target, wakeup)
            appends.append([MessageSent(target=target, wakeup=wakeup, message=Message.user(text))])
        elif op[0] == "claim":
            claimed, inbox = inbox.claim(op[1])
            appends.append([QueueClaimed(target=op[1], count=len(claimed))])
        elif op[0] == "claim_oldest":
            claimed, inbox = inbox.claim(op[1], limit=op[2])
            rest = inbox.count(op[1])
            appends.append([QueueClaimed(target=op[1], count=len(claimed), rest=rest)])
        elif op[0] == "turn":
            turn, step = turn + 1, 1
            appends.append([TurnStarted(turn=turn), StepStarted(turn=turn, step=step)])
        else:
            claimed, inbox = inbox.claim(Target.NEXT_STEP)
            appends.append([
                QueueClaimed(target=Target.NEXT_STEP, count=len(claimed)),
                ModelReplied(turn=turn, step=step, message=Message.assistant(op[1])),
                ToolReturned(turn=turn, step=step, message=Message.tool("r", "c1")),
                Nudged(turn=turn, step=step, message=Message.user("go on")),
                StepEnded(turn=turn, step=step),
                TurnEnded(turn=turn, steps=step, reason="final"),
            ])
    return inbox, appends


@fuzz_settings(40)
@given(ops=operations)
def test_the_replayed_inbox_equals_the_live_one_in_every_store(ops):
    live, appends = _events_for(ops)
    with tempfile.TemporaryDirectory() as tmp:
        stores = [MemoryStore(), FileStore(Path(tmp) / "log.jsonl"),
                  SqliteStore(Path(tmp) / "inbox.sqlite")]
        try:
            for store in stores:
                session = Session()
                for batch in appends:
                    for event in store.append("s", batch, expected_version=session.version):
                        session = session.apply(event, "s")
                replayed = replay(store.read("s"), stream="s")
                for target in Target:  # the same messages and wake intents, in order (the
                    # replayed entries also know their sends' seqs, which a value built by hand lacks)
                    assert list(replayed.inbox.entries(target)) == list(live.entries(target))
                assert replayed == session  # the fast fold == one apply at a time
        finally:
            for store in stores:
                store.close()
        # The file store's log also replays, from a fresh reader.
        with FileStore(Path(tmp) / "log.jsonl", read_only=True) as reader:
            replayed = replay(reader.read("s")).inbox
            assert [list(replayed.entries(t)) for t in Target] == [list(live.entries(t)) for t in Target]


@fuzz_settings(100)
@given(ops=operations, split=st.integers(0, 40))
def test_replay_from_a_midpoint_session_equals_replay_from_the_start(ops, split):
    _, appends = _events_for(ops)
    events = [msgspec.structs.replace(e, seq=i)
              for i, e in enumerate((e for batch in appends for e in batch), 1)]
    whole = replay(events)
    middle = replay(events[:split])
    assert replay(events[split:], start=middle) == whole
    one_by_one = Session()
    for event in events:
        one_by_one = one_by_one.apply(event)
    assert one_by_one == whole


def test_replay_errors_match_apply_errors():
    events = [MessageSent(seq=1, target=Target.NEXT_STEP, wakeup=True, message=Message.user("a")),
              QueueClaimed(seq=2, target=Target.NEXT_STEP, count=2)]
    with pytest.raises(ValueError) as fast:
        replay(events, stream="s")
    with pytest.raises(ValueError) as slow:
        Session().apply(events[0], "s").apply(events[1], "s")
    assert str(fast.value) == str(slow.value) == (
        "stream 's' seq 2: claim of next_step records 2 message(s) but 1 were queued"
    )


def test_a_claim_of_the_oldest_few_checks_what_it_leaves_too():
    sends = [MessageSent(seq=i, target=Target.NEXT_TURN, wakeup=True, message=Message.user(t))
             for i, t in enumerate("abc", 1)]
    partial = QueueClaimed(seq=4, target=Target.NEXT_TURN, count=2, rest=1)
    session = replay([*sends, partial])
    assert [m.content for m in session.transcript] == ["a", "b"]
    assert [m.content for m, _ in session.inbox.entries("next_turn")] == ["c"]
    assert session == Session().apply(sends[0]).apply(sends[1]).apply(sends[2]).apply(partial)
    wrong = QueueClaimed(seq=4, target=Target.NEXT_TURN, count=2, rest=2)
    with pytest.raises(ValueError, match="records 2 message\\(s\\) and leaves 2 but 3 were queued"):
        replay([*sends, wrong])


def test_replay_of_hand_built_events_normalizes_like_apply():
    events = [MessageSent(seq=1, target="next_turn", wakeup=False, message="hi")]  # type: ignore[arg-type]
    assert replay(events) == Session().apply(events[0])
    with pytest.raises(TypeError, match="wakeup must be a bool"):
        replay([MessageSent(seq=1, target="next_turn", wakeup=1, message="hi")])  # type: ignore[arg-type]


def test_the_sample_log_is_valid_json_lines_a_person_can_read(tmp_path):
    data, _ = write_sample(tmp_path / "log.jsonl")
    for line in data.decode().splitlines():
        json.loads(line)  # every line is a JSON document on its own
