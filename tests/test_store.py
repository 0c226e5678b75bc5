"""The Store contract, one suite run against every store: memory:, file:PATH and sqlite:PATH."""

from __future__ import annotations

import os
import re
import stat
import threading

import pytest

from nous_inbox.codec import MAX_RECORD_SIZE, Record, encode_header, json_lines
from nous_inbox.errors import ConcurrencyError, DecodeError, RecordTooLargeError, StoreError
from nous_inbox.events import MessageSent, QueueClaimed, Warned
from nous_inbox.message import Message
from nous_inbox.session import replay
from nous_inbox.store import (
    FileStore,
    MemoryStore,
    SqliteStore,
    Store,
    StoreLockedError,
    default_store_path,
    default_store_url,
    open_store,
)
from nous_inbox.verbs import Target


def sent(text: str, target: Target = Target.NEXT_STEP, wakeup: bool = True) -> MessageSent:
    return MessageSent(target=target, wakeup=wakeup, message=Message.user(text))


# -- appending and reading -----------------------------------------------------------------------


def test_every_store_is_a_store(store):
    assert isinstance(store, Store)


def test_a_new_stream_is_empty(store):
    assert store.version("s") == 0
    assert list(store.read("s")) == []
    assert store.streams() == []


def test_append_numbers_events_and_returns_them_as_stored(store):
    stored = store.append("s", [sent("a"), sent("b", wakeup=False)])
    assert [e.seq for e in stored] == [1, 2]
    assert [e.message.content for e in stored] == ["a", "b"]
    assert store.version("s") == 2
    assert list(store.read("s")) == stored


def test_the_store_ignores_any_seq_the_caller_set(store):
    store.append("s", [Warned(text="a", seq=40)])
    stored = store.append("s", [Warned(text="b", seq=7), Warned(text="c", seq=7)])
    assert [e.seq for e in stored] == [2, 3]
    assert [e.seq for e in store.read("s")] == [1, 2, 3]


def test_at_is_stamped_where_the_caller_left_it_zero(store):
    stored = store.append("s", [Warned(text="a"), Warned(text="b", at=12.5)])
    assert stored[0].at > 1_000_000_000  # now, as a Unix time
    assert stored[1].at == 12.5
    assert list(store.read("s")) == stored


def test_read_after_returns_only_later_events(store):
    store.append("s", [Warned(text=str(i)) for i in range(1, 6)])
    assert [e.text for e in store.read("s", after=3)] == ["4", "5"]
    assert list(store.read("s", after=5)) == []
    assert list(store.read("s", after=99)) == []


def test_streams_are_separate_and_listed_sorted(store):
    store.append("zeta", [Warned(text="z")])
    store.append("alpha", [Warned(text="a1"), Warned(text="a2")])
    store.append("mid ✓", [Warned(text="m")])
    assert store.streams() == ["alpha", "mid ✓", "zeta"]
    assert [store.version(s) for s in ("alpha", "mid ✓", "zeta")] == [2, 1, 1]
    assert [e.text for e in store.read("alpha")] == ["a1", "a2"]


def test_an_empty_append_is_a_no_op(store):
    assert store.append("s", []) == []
    assert store.version("s") == 0
    assert store.streams() == []


def test_many_pages_read_back_in_order(store):
    for start in range(0, 1200, 100):
        store.append("s", [Warned(text=str(i)) for i in range(start, start + 100)])
    assert [e.text for e in store.read("s")] == [str(i) for i in range(1200)]
    assert [e.seq for e in store.read("s", after=1000)] == list(range(1001, 1201))


# -- optimistic concurrency ----------------------------------------------------------------------


def test_an_append_at_the_expected_version_succeeds(store):
    store.append("s", [Warned(text="a")], expected_version=0)
    store.append("s", [Warned(text="b")], expected_version=1)
    assert store.version("s") == 2


def test_a_stale_expected_version_raises_and_writes_nothing(store):
    store.append("s", [Warned(text="a")])
    with pytest.raises(ConcurrencyError) as info:
        store.append("s", [Warned(text="b"), Warned(text="c")], expected_version=0)
    assert "stream 's'" in str(info.value)
    assert "expected version 0" in str(info.value)
    assert "at 1" in str(info.value)
    assert store.version("s") == 1
    assert [e.text for e in store.read("s")] == ["a"]


def test_an_expected_version_ahead_of_the_stream_also_conflicts(store):
    with pytest.raises(ConcurrencyError):
        store.append("s", [Warned(text="a")], expected_version=3)
    assert store.streams() == []


@pytest.mark.parametrize("bad", [-1, 1.0, "0", True])
def test_a_malformed_expected_version_is_a_value_error(store, bad):
    with pytest.raises(ValueError, match="expected_version"):
        store.append("s", [Warned(text="a")], expected_version=bad)


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a\nb", "tab\there", "nul\x00", "del\x7f", "x" * 257, 7, None])
def test_bad_stream_names_are_refused_naming_them(store, name):
    for call in (lambda: store.append(name, [Warned(text="a")]), lambda: store.version(name),
                 lambda: list(store.read(name))):
        with pytest.raises(ValueError, match="stream name"):
            call()
    assert store.streams() == []


def test_the_longest_allowed_stream_name_works(store):
    name = "n" * 256
    store.append(name, [Warned(text="a")])
    assert store.streams() == [name]


@pytest.mark.parametrize("events", [[Warned(text="ok"), {"type": "warned"}], [Message.user("x")]])
def test_a_batch_holding_a_non_event_writes_nothing(store, events):
    with pytest.raises(TypeError, match=r"events\[\d\]"):
        store.append("s", events)
    assert store.version("s") == 0


def test_a_single_event_instead_of_a_list_is_refused(store):
    with pytest.raises(TypeError, match="sequence of events"):
        store.append("s", Warned(text="a"))  # type: ignore[arg-type]


def test_a_closed_store_refuses_use(url):
    store = open_store(url)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.version("s")
    with pytest.raises(ValueError, match="closed"):
        store.append("s", [Warned(text="a")])


# -- threads -------------------------------------------------------------------------------------


def test_appends_from_many_threads_lose_nothing(store):
    def work(n: int) -> None:
        for i in range(25):
            store.append("s", [Warned(text=f"{n}-{i}")])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    events = list(store.read("s"))
    assert [e.seq for e in events] == list(range(1, 101))
    assert sorted(e.text for e in events) == sorted(f"{n}-{i}" for n in range(4) for i in range(25))


# -- durability, files, modes --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_what_was_appended_is_there_after_reopening(url):
    with open_store(url) as store:
        store.append("s", [sent("a"), sent("b", Target.NEXT_TURN)])
        store.append("t", [QueueClaimed(target=Target.NEXT_STEP, count=0)])
        written = list(store.read("s"))
    with open_store(url) as store:
        assert list(store.read("s")) == written
        assert store.streams() == ["s", "t"]
        store.append("s", [QueueClaimed(target=Target.NEXT_STEP, count=1)])
        assert replay(store.read("s")).transcript == [Message.user("a")]


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_created_files_are_private(url, tmp_path):
    old = os.umask(0o022)
    try:
        with open_store(url) as store:
            store.append("s", [Warned(text="a")])
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    finally:
        os.umask(old)
    assert modes, "the store created no file"
    assert set(modes.values()) == {0o600}, modes
    if "sqlite" in url:
        assert {"inbox.sqlite", "inbox.sqlite-wal", "inbox.sqlite-shm"} <= set(modes)


@pytest.mark.parametrize("kind", ["file", "sqlite"])  # memory: is one store's own dict
def test_another_store_on_the_same_file_sees_new_events_through_version(kind, tmp_path):
    url = f"{kind}:{tmp_path / 'shared'}"
    with open_store(url) as writer, open_store(url) as watcher:
        assert watcher.version("s") == 0
        writer.append("s", [Warned(text="a")])
        assert watcher.version("s") == 1
        assert watcher.append("s", [Warned(text="b")], expected_version=1)[0].seq == 2
        assert writer.version("s") == 2
        with pytest.raises(ConcurrencyError):
            writer.append("s", [Warned(text="c")], expected_version=1)
        assert [e.text for e in writer.read("s")] == ["a", "b"]


# -- open_store and the default ------------------------------------------------------------------


def test_open_store_picks_by_scheme(tmp_path):
    assert isinstance(open_store("memory:"), MemoryStore)
    with open_store(f"file:{tmp_path / 'a.jsonl'}") as s:
        assert isinstance(s, FileStore)
    with open_store(f"sqlite:{tmp_path / 'a.sqlite'}") as s:
        assert isinstance(s, SqliteStore)
    with open_store(str(tmp_path / "bare.sqlite")) as s:
        assert isinstance(s, SqliteStore)


@pytest.mark.parametrize("url", ["redis://x", "s3:bucket", "memory:x", "file:", "sqlite:", ""])
def test_open_store_refuses_what_it_cannot_open_by_name(url):
    with pytest.raises(ValueError) as info:
        open_store(url)
    assert repr(url) in str(info.value) or "empty" in str(info.value)


def test_the_default_store_is_private_sqlite_under_xdg_state_home(tmp_path, monkeypatch):
    monkeypatch.delenv("NOUS_INBOX_STORE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    url = default_store_url()
    assert url == f"sqlite:{tmp_path / 'state' / 'nous-inbox' / 'inbox.sqlite'}"
    assert stat.S_IMODE((tmp_path / "state" / "nous-inbox").stat().st_mode) == 0o700
    with open_store(url) as store:
        store.append("s", [Warned(text="a")])
    monkeypatch.setenv("XDG_STATE_HOME", "relative/path")  # ignored, as XDG asks
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / ".local" / "state" / "nous-inbox" / "inbox.sqlite"


def test_the_environment_names_the_default_store(monkeypatch):
    monkeypatch.setenv("NOUS_INBOX_STORE", "memory:")
    assert default_store_url() == "memory:"


# -- file: specifics -----------------------------------------------------------------------------


def test_file_store_writes_one_record_per_line_with_batch_counts(tmp_path):
    path = tmp_path / "log.jsonl"
    with FileStore(path) as store:
        store.append("s", [Warned(text="a", at=1.0), Warned(text="b", at=1.0)])
        store.append("t", [Warned(text="c", at=1.0)])
    assert path.read_bytes() == json_lines([
        Record(stream="s", event=Warned(text="a", seq=1, at=1.0), more=1),
        Record(stream="s", event=Warned(text="b", seq=2, at=1.0)),
        Record(stream="t", event=Warned(text="c", seq=1, at=1.0)),
    ])


def test_file_store_read_only_mode_reads_but_never_writes(tmp_path):
    path = tmp_path / "log.jsonl"
    with pytest.raises(StoreError, match="no store at"):
        FileStore(path, read_only=True)
    assert not path.exists()
    with FileStore(path) as writer:
        writer.append("s", [Warned(text="a")])
        with FileStore(path, read_only=True) as reader:
            assert [e.text for e in reader.read("s")] == ["a"]
            with pytest.raises(OSError, match="read-only"):
                reader.append("s", [Warned(text="b")])


def test_a_writer_that_cannot_get_the_lock_gets_a_clear_error(tmp_path):
    import fcntl

    path = tmp_path / "log.jsonl"
    with FileStore(path, lock_timeout=0.05) as store:
        holder = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(holder, fcntl.LOCK_EX)
            with pytest.raises(StoreLockedError, match="another writer held the file lock"):
                store.append("s", [Warned(text="a")])
            assert isinstance(StoreLockedError("x"), ConcurrencyError)
        finally:
            os.close(holder)
        store.append("s", [Warned(text="a")])
        assert store.version("s") == 1


def test_file_store_refuses_a_file_that_is_not_a_log(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"dear diary\nnothing to see\n")
    with pytest.raises(DecodeError, match=r"line 1 \(byte 0\): not a nous-inbox log header"):
        FileStore(path)
    assert path.read_bytes() == b"dear diary\nnothing to see\n"  # untouched
    path.write_bytes(b"no newline at all")
    with pytest.raises(DecodeError, match="not a nous-inbox log"):
        FileStore(path)


def test_file_store_refuses_a_seq_out_of_place(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(json_lines([Record(stream="s", event=Warned(text="a", seq=1)),
                                 Record(stream="s", event=Warned(text="b", seq=3))]))
    with FileStore(path, read_only=True) as store, pytest.raises(
        DecodeError, match=r"line 3 \(byte \d+\): stream 's' has seq 3 where 2"
    ):
        store.read("s")


def test_file_store_refuses_a_batch_broken_off_in_the_middle(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes(json_lines([Record(stream="s", event=Warned(text="a", seq=1), more=1),
                                 Record(stream="t", event=Warned(text="b", seq=1))]))
    with FileStore(path, read_only=True) as store, pytest.raises(
        DecodeError, match=r"line 3 .*the append that began at line 2 is broken off"
    ):
        store.read("s")


def test_file_store_refuses_an_oversized_event_and_writes_nothing(tmp_path):
    path = tmp_path / "log.jsonl"
    with FileStore(path, max_record_size=200) as store:
        with pytest.raises(RecordTooLargeError, match="above the limit of 200 bytes"):
            store.append("s", [Warned(text="ok"), Warned(text="x" * 500)])
        assert store.version("s") == 0
    assert path.read_bytes() == encode_header()


def test_sqlite_store_refuses_a_newer_schema(tmp_path):
    import sqlite3

    path = tmp_path / "inbox.sqlite"
    SqliteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'version'")
    db.commit()
    db.close()
    with pytest.raises(DecodeError, match="schema version 99, newer than this nous-inbox reads"):
        SqliteStore(path)


def test_sqlite_store_names_stream_and_seq_of_a_bad_row(tmp_path):
    import sqlite3

    path = tmp_path / "inbox.sqlite"
    with SqliteStore(path) as store:
        store.append("s", [Warned(text="a"), Warned(text="b")])
    db = sqlite3.connect(path)
    db.execute("UPDATE events SET body = x'81a474797065a46e6f7065' WHERE seq = 2")
    db.commit()
    db.close()
    with SqliteStore(path) as store, pytest.raises(DecodeError) as info:
        list(store.read("s"))
    assert "stream 's' seq 2" in str(info.value)
    assert "unknown event type 'nope'" in str(info.value)  # a newer writer's, it says


def test_sqlite_store_refuses_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "x.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    for read_only in (False, True):
        with pytest.raises(StoreError) as info:
            SqliteStore(path, read_only=read_only)
        assert str(info.value) == f"sqlite:{path} is not a usable SQLite store: file is not a database"
    assert path.read_bytes() == b"this is not sqlite" * 100


# -- read-only opening ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_read_only_opening_of_a_missing_store_creates_nothing(url, tmp_path):
    with pytest.raises(StoreError) as info:
        open_store(url, read_only=True)
    path = url.split(":", 1)[1]
    assert f"no store at {path}" in str(info.value)
    assert isinstance(info.value, OSError)
    assert list(tmp_path.iterdir()) == []


def test_read_only_stores_read_what_a_writer_wrote_and_refuse_to_write(url):
    with open_store(url) as writer:
        writer.append("s", [Warned(text="a")])
        with open_store(url, read_only=True) as reader:
            if url == "memory:":  # another memory: store is another, empty, store
                assert reader.streams() == []
                expected = []
            else:
                assert reader.streams() == ["s"]
                expected = ["a"]
            assert [e.text for e in reader.read("s")] == expected
            with pytest.raises(ValueError, match="opened read-only"):
                reader.append("s", [Warned(text="b")])
            with pytest.raises(ValueError, match="opened read-only"):
                reader.own("s")
            with pytest.raises(ValueError, match="opened read-only"):
                reader.append("s", [])
            if url != "memory:":
                writer.append("s", [Warned(text="b")])
                assert reader.version("s") == 2  # it follows the writer
        assert writer.version("s") == (2 if url != "memory:" else 1)


def test_read_only_file_store_leaves_a_torn_tail_alone(tmp_path):
    path = tmp_path / "log.jsonl"
    with FileStore(path) as store:
        store.append("s", [Warned(text="a"), Warned(text="b")])
    torn = path.read_bytes() + b'{"stream":"s","event":{"type":"warned","te'
    path.write_bytes(torn)
    with FileStore(path, read_only=True) as reader:
        assert [e.text for e in reader.read("s")] == ["a", "b"]
    assert path.read_bytes() == torn
    assert {p.name for p in tmp_path.iterdir()} == {"log.jsonl"}  # no lock directory either
    with FileStore(path) as writer:  # a writer does cut it off
        assert writer.version("s") == 2
    assert len(path.read_bytes()) < len(torn)


def test_read_only_sqlite_store_writes_no_schema(tmp_path):
    import sqlite3

    path = tmp_path / "inbox.sqlite"
    path.write_bytes(b"")  # a database a crashed writer created but never set up
    with SqliteStore(path, read_only=True) as reader:
        assert reader.streams() == [] and reader.version("s") == 0 and list(reader.read("s")) == []
        assert path.read_bytes() == b""
        with SqliteStore(path) as writer:  # a writer sets it up; the reader sees it
            writer.append("s", [Warned(text="a")])
            assert reader.version("s") == 1
            assert [e.text for e in reader.read("s")] == ["a"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_memory_read_only_is_an_empty_store_that_refuses_appends():
    with open_store("memory:", read_only=True) as store:
        assert isinstance(store, MemoryStore) and store.read_only
        assert store.streams() == []
        with pytest.raises(ValueError, match="memory: was opened read-only"):
            store.append("s", [Warned(text="a")])
        assert repr(store) == "MemoryStore(read_only=True)"


# -- opening what is not a store -----------------------------------------------------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_a_directory_is_not_a_store(tmp_path, read_only):
    for url, what in ((f"sqlite:{tmp_path}", "is not a usable SQLite store"),
                      (f"file:{tmp_path}", "is not a usable log file")):
        with pytest.raises(StoreError) as info:
            open_store(url, read_only=read_only)
        assert str(info.value) == f"{url} {what}: it is a directory"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_store_in_a_missing_directory_is_a_store_error_naming_it(kind, tmp_path):
    url = f"{kind}:{tmp_path / 'nowhere' / 'inbox'}"
    with pytest.raises(StoreError) as info:
        open_store(url)
    assert str(info.value).startswith(url)
    assert not (tmp_path / "nowhere").exists()


def _database(path, *statements):
    import sqlite3

    db = sqlite3.connect(path)
    for statement in statements:
        db.execute(statement)
    db.commit()
    db.close()
    return path.read_bytes()


@pytest.mark.parametrize("read_only", [False, True])
def test_someone_elses_database_is_refused_untouched(tmp_path, read_only):
    path = tmp_path / "app.sqlite"
    before = _database(path, "CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT)",
                       "INSERT INTO events (what) VALUES ('launch')")
    with pytest.raises(StoreError) as info:
        SqliteStore(path, read_only=read_only)
    assert str(info.value) == (f"sqlite:{path} is not a usable SQLite store: it holds other tables "
                               f"(events) and no nous-inbox meta table")
    assert path.read_bytes() == before
    assert {p.name for p in tmp_path.iterdir()} == {"app.sqlite"}


@pytest.mark.parametrize(("statements", "message"), [
    (["CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT)"],
     "its events table has columns (id, what), not (stream, seq, body)"),
    ([], "it has a nous-inbox meta table but no events table"),
])
def test_a_damaged_schema_is_refused(tmp_path, statements, message):
    path = tmp_path / "inbox.sqlite"
    _database(path, "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
              "INSERT INTO meta VALUES ('format', 'nous-inbox'), ('version', '1')", *statements)
    with pytest.raises(StoreError, match=re.escape(message)):
        SqliteStore(path)


def test_a_database_of_another_format_is_refused(tmp_path):
    path = tmp_path / "inbox.sqlite"
    _database(path, "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
              "CREATE TABLE events (stream TEXT, seq INTEGER, body BLOB)",
              "INSERT INTO meta VALUES ('format', 'other-tool')")
    with pytest.raises(StoreError, match="not a nous-inbox store \\(meta format 'other-tool'\\)"):
        SqliteStore(path)


def test_a_meta_table_without_our_columns_is_refused(tmp_path):
    path = tmp_path / "inbox.sqlite"
    _database(path, "CREATE TABLE meta (name TEXT)", "CREATE TABLE events (stream, seq, body)")
    with pytest.raises(StoreError, match=re.escape("its meta table has columns (name), not (key, value)")):
        SqliteStore(path)


@pytest.mark.parametrize(("body", "kind"), [("5", "int"), ("'text'", "str"), ("NULL", "NoneType")])
def test_a_row_whose_body_is_not_bytes_names_stream_and_seq(tmp_path, body, kind):
    path = tmp_path / "inbox.sqlite"
    with SqliteStore(path) as store:
        store.append("s", [Warned(text="a"), Warned(text="b")])
    _database(path, "PRAGMA ignore_check_constraints = ON",
              "CREATE TABLE tmp AS SELECT * FROM events",
              "DROP TABLE events",
              "CREATE TABLE events (stream TEXT, seq INTEGER, body, PRIMARY KEY (stream, seq))",
              f"INSERT INTO events SELECT stream, seq, CASE seq WHEN 2 THEN {body} ELSE body END FROM tmp",
              "DROP TABLE tmp")
    with SqliteStore(path) as store, pytest.raises(DecodeError) as info:
        list(store.read("s"))
    assert str(info.value) == f"sqlite:{path} stream 's' seq 2: the stored body is {kind}, not bytes"


def test_a_failure_after_opening_is_a_store_error_naming_the_operation(tmp_path):
    path = tmp_path / "inbox.sqlite"
    with SqliteStore(path) as store:
        store.append("s", [Warned(text="a")])
        _database(path, "DROP TABLE events")  # pulled out from under the open store
        for call, what in ((lambda: store.version("s"), "version of stream 's'"),
                           (lambda: list(store.read("s")), "read of stream 's'"),
                           (store.streams, "listing the streams"),
                           (lambda: store.append("s", [Warned(text="b")]), "append to stream 's'")):
            with pytest.raises(StoreError) as info:
                call()
            assert str(info.value) == f"sqlite:{path}: {what} failed: no such table: events"


def test_a_damaged_seq_or_stream_name_is_a_decode_error_naming_it(tmp_path):
    path = tmp_path / "inbox.sqlite"
    with SqliteStore(path) as store:
        store.append("s", [Warned(text="a")])
    _database(path, "INSERT INTO events VALUES ('s', 'two', x'00')",
              "INSERT INTO events VALUES ('bad\nname', 1, x'00')")
    with SqliteStore(path) as store:
        with pytest.raises(DecodeError, match="stream 's': the last seq is 'two', not an integer"):
            store.version("s")
        with pytest.raises(DecodeError, match=r"a stored stream has an invalid name: .*control character"):
            store.streams()


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgresql"])
@pytest.mark.parametrize(("limit", "error"), [
    (65536.0, TypeError), (True, TypeError), ("4096", TypeError), (None, TypeError),
    (0, ValueError), (-1, ValueError),
])
def test_a_store_refuses_a_max_record_size_that_is_not_an_int_of_at_least_one_at_open(
    tmp_path, kind, limit, error
):
    # The runner holds tool results to the limit the store says: one the store would enforce
    # differently (a float, a bool) must not open at all. Nothing is created.
    from nous_inbox.store.postgres import PostgresStore

    path = tmp_path / "log"
    opener = {"file": lambda: FileStore(path, max_record_size=limit),
              "sqlite": lambda: SqliteStore(path, max_record_size=limit),
              "postgresql": lambda: PostgresStore("postgresql://localhost:1/none",
                                                  max_record_size=limit)}[kind]
    with pytest.raises(error, match=rf"max_record_size must be an int >= 1 \(bytes\), "
                                    rf"got {re.escape(repr(limit))}"):
        opener()
    if kind == "postgresql":
        # Nothing created means no connection made: with a good limit, the same URL (no server
        # on port 1) fails at connecting, so the refusal above came first.
        with pytest.raises(StoreError, match="cannot connect"):
            PostgresStore("postgresql://localhost:1/none", max_record_size=4096)
        return
    assert not path.exists()


def test_a_journal_says_the_store_s_max_record_size_as_it_is(tmp_path):
    from nous_inbox.store.journal import Journal

    with SqliteStore(tmp_path / "log", max_record_size=4096) as store:
        assert Journal(store, "s").max_record_size == 4096

    class OwnLog:  # a host's own log, not checked here: passed on, for the runner to refuse
        max_record_size = 65536.0

        def append(self, stream, events, expected_version=None):
            return events

        def read(self, stream, after=0):
            return []

        def version(self, stream):
            return 0

    assert Journal(OwnLog(), "s").max_record_size == 65536.0
    OwnLog.max_record_size = None  # names no limit: the runner holds it to the codec's default
    assert Journal(OwnLog(), "s").max_record_size is None
    del OwnLog.max_record_size  # says nothing: the codec's default
    assert Journal(OwnLog(), "s").max_record_size == MAX_RECORD_SIZE


# -- an append's identity: retried, written once ---------------------------------------------------


def test_an_append_retried_with_its_identity_is_written_once(store):
    import uuid

    identity = uuid.uuid4()
    first = store.append("s", [Warned(text="a"), Warned(text="b")], expected_version=0,
                         identity=identity)
    store.append("s", [Warned(text="c")])
    # The retry's expected version is stale by now: it is answered as the append was made,
    # before any version check, and nothing is written again.
    again = store.append("s", [Warned(text="a"), Warned(text="b")], expected_version=0,
                         identity=identity)
    assert again == first and [e.seq for e in again] == [1, 2]
    assert [e.text for e in store.read("s")] == ["a", "b", "c"]


def test_appends_with_other_identities_or_none_are_appends_of_their_own(store):
    import uuid

    store.append("s", [Warned(text="a")], identity=uuid.uuid4())
    store.append("s", [Warned(text="a")], identity=uuid.uuid4())
    store.append("s", [Warned(text="a")])
    store.append("t", [Warned(text="a")], identity="send-1")
    store.append("s", [Warned(text="a")], identity="send-1")  # another stream's identity
    assert store.version("s") == 4 and store.version("t") == 1


def test_an_identity_is_a_uuid_or_a_key_of_the_callers_own(store):
    import uuid

    identity = uuid.uuid4()
    store.append("s", [Warned(text="a")], identity=str(identity))
    assert [e.seq for e in store.append("s", [Warned(text="a")], identity=identity)] == [1]
    store.append("s", [Warned(text="b")], identity="send-42")
    assert [e.seq for e in store.append("s", [Warned(text="b")], identity="send-42")] == [2]
    for bad in ("", 42, b"send-42"):
        with pytest.raises(TypeError, match=r"identity must be a uuid\.UUID or a non-empty str"):
            store.append("s", [Warned(text="c")], identity=bad)
    assert store.version("s") == 2


def test_append_once_retries_an_unknown_outcome_with_its_identity(store, monkeypatch):
    from nous_inbox.errors import OutcomeUnknownError
    from nous_inbox.store import append_once

    real = store.append
    calls: list[object] = []

    def answer_lost(stream, events, expected_version=None, *, identity=None):
        # The first attempt is written, but its answer is lost on the way back.
        calls.append(identity)
        stored = real(stream, events, expected_version, identity=identity or "lost-1")
        if len(calls) == 1:
            raise OutcomeUnknownError("the answer was lost", stream=stream, identity="lost-1")
        return stored

    monkeypatch.setattr(store, "append", answer_lost)
    stored = append_once(store, "s", [Warned(text="a")], 0)
    assert calls == [None, "lost-1"] and [e.seq for e in stored] == [1]
    assert [e.text for e in store.read("s")] == ["a"]


def test_append_once_never_reports_nothing_written_when_a_retry_fails(store, monkeypatch):
    # The first attempt was written, its answer lost; the retry is refused (a server error, say)
    # before it could look. "Nothing was written" would be the retry's truth, not the append's.
    from nous_inbox.errors import OutcomeUnknownError, StoreError
    from nous_inbox.store import append_once

    real = store.append
    calls: list[object] = []

    def written_then_refused(stream, events, expected_version=None, *, identity=None):
        calls.append(identity)
        if len(calls) == 1:
            real(stream, events, expected_version, identity="lost-1")
            raise OutcomeUnknownError("the answer was lost", stream=stream, identity="lost-1")
        raise StoreError("the server refused the statement; nothing was written")

    monkeypatch.setattr(store, "append", written_then_refused)
    with pytest.raises(OutcomeUnknownError) as caught:
        append_once(store, "s", [Warned(text="a")])
    assert calls == [None, "lost-1"] and caught.value.identity == "lost-1"
    assert "nothing was written" not in str(caught.value)
    assert real.__self__.version("s") == 1  # as it was: the first attempt was written


def test_a_journal_send_whose_outcome_is_unknown_is_stored_once(store, monkeypatch):
    # Every owner, the mailbox and the CLI steer write through a journal or append_once: an
    # append written whose answer was lost is retried with its identity, never doubled.
    from nous_inbox.errors import OutcomeUnknownError
    from nous_inbox.store.journal import Journal

    real = store.append
    lost: list[str] = []

    def written_then_lost(stream, events, expected_version=None, *, identity=None):
        stored = real(stream, events, expected_version, identity=identity or "send-1")
        if not lost:
            lost.append(stream)
            raise OutcomeUnknownError("the answer was lost", stream=stream, identity="send-1")
        return stored

    journal = Journal(store, "s")
    monkeypatch.setattr(store, "append", written_then_lost)
    sent = journal.send("go", "next_step", True)
    assert lost == ["s"] and sent.seq == 1
    assert [e.message.content for e in store.read("s")] == ["go"]
    assert journal.session.version == 1 and journal.writes == 1
