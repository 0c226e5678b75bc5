"""Logs written before still read, and a log from a newer version says to upgrade.

``tests/data/schemaN.*`` hold one short run as nous-inbox wrote it at schema version N, on every
kind of store: the ``file:`` store's JSON Lines (``schemaN.jsonl``), a framed MessagePack log
(``schemaN.msgpack``) and the ``sqlite:`` store, whose rows are MessagePack (``schemaN.sqlite``).
Schema 1's run is a followup and a turn of two steps with a tool call and a steer that arrived
during the tool; from schema 2 on the run (``tests.fixture_logs``) holds every event type of its
version. Schema 2 renamed ``ModelRequested.messages`` to ``count``; schema 3 added
``cancel_requested``, ``mail_agent`` and ``TurnEnded``'s ``output`` and ``usage``; schema 4,
``message_withdrawn``; schema 5, ``session_released`` and ``TurnEnded``'s ``"released"``. Each test copies
a fixture before opening it, so the checked-in bytes never change.

The event vocabulary is pinned here, version by version: a new event type fails
``test_the_vocabulary_is_the_newest_schema_versions`` until ``SCHEMA_VERSION`` moves and that
version's fixtures are written (``python -m tests.fixture_logs tests/data``), so a log holding
the new type is refused by an older reader with "upgrade", never misread.
"""

from __future__ import annotations

import shutil
import sqlite3
import typing
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import msgspec
import pytest

from nous_inbox import SCHEMA_VERSION, DecodeError, Session, replay
from nous_inbox.__main__ import main
from nous_inbox.codec import (
    MSGPACK,
    encode_event,
    frame,
    iter_events,
    iter_records,
    json_lines,
    msgpack_frames,
    read_events,
)
from nous_inbox.events import Event, ModelRequested, TurnEnded, TurnStarted
from nous_inbox.mailbox.state import MailboxState
from nous_inbox.store import open_store
from tests import fixture_logs

DATA = Path(__file__).parent / "data"
STORES = {"file": "schema1.jsonl", "sqlite": "schema1.sqlite"}
TRANSCRIPT = [
    "tidy the staging logs", "", "42 lines", "check a.log only", "a.log has 42 lines",
]
VERSIONS = range(1, SCHEMA_VERSION + 1)
#: The versions whose fixtures ``tests.fixture_logs`` makes (schema 1's came before it).
SAMPLED = range(2, SCHEMA_VERSION + 1)

_SCHEMA_1 = frozenset({
    "message_sent", "queue_claimed", "turn_started", "step_started", "model_requested",
    "model_replied", "tool_called", "tool_returned", "step_ended", "nudged", "turn_ended", "warned",
})
_SCHEMA_2 = _SCHEMA_1 | {"mail_sent", "mail_dropped", "mail_received", "mail_noticed", "mail_read",
                         "mail_answered", "mail_withdrawn"}
#: The event types each schema version knows.
_SCHEMA_3 = _SCHEMA_2 | {"cancel_requested", "mail_agent"}
_SCHEMA_4 = _SCHEMA_3 | {"message_withdrawn"}
VOCABULARY = {1: _SCHEMA_1, 2: _SCHEMA_2, 3: _SCHEMA_3, 4: _SCHEMA_4,
              5: _SCHEMA_4 | {"session_released"}}


def _copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copyfile(DATA / name, target)
    return target


@pytest.fixture(params=sorted(STORES))
def old_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    kind = request.param
    yield f"{kind}:{_copy(tmp_path, STORES[kind])}"


def _requests(events: list[Event]) -> list[tuple[int, int]]:
    return [(e.step, e.count) for e in events if isinstance(e, ModelRequested)]


def test_the_fixtures_really_are_schema_1() -> None:
    head = (DATA / "schema1.jsonl").read_bytes().split(b"\n", 1)[0]
    assert head == b'{"format":"nous-inbox","version":1}'
    assert b'"messages":4' in (DATA / "schema1.jsonl").read_bytes()
    assert b"\xa8messages" in (DATA / "schema1.msgpack").read_bytes()


@pytest.mark.parametrize("read_only", [True, False])
def test_a_schema_1_store_reads_with_counts_where_messages_were(
    old_store_url: str, read_only: bool
) -> None:
    with open_store(old_store_url, read_only=read_only) as store:
        events = list(store.read("run"))
    assert _requests(events) == [(1, 1), (2, 4)]
    session = replay(events, stream="run")
    assert [m.content for m in session.transcript] == TRANSCRIPT
    assert (session.version, session.turn, session.step, session.running) == (17, 1, 2, False)


def test_a_schema_1_messagepack_log_reads_with_counts(tmp_path: Path) -> None:
    events = [event for _, _, event in read_events(_copy(tmp_path, "schema1.msgpack"), "msgpack")]
    assert _requests(events) == [(1, 1), (2, 4)]
    assert [m.content for m in replay(events).transcript] == TRANSCRIPT


def test_a_schema_1_store_takes_new_appends_and_reads_both_spellings(old_store_url: str) -> None:
    with open_store(old_store_url) as store:
        stored = store.append("run", [
            TurnStarted(turn=2), ModelRequested(turn=2, step=1, count=6),
            TurnEnded(turn=2, steps=1, reason="cancelled"),
        ], expected_version=17)
        assert [e.seq for e in stored] == [18, 19, 20]
    with open_store(old_store_url, read_only=True) as store:
        events = list(store.read("run"))
    assert _requests(events) == [(1, 1), (2, 4), (1, 6)]
    assert replay(events).version == 20


def test_an_upgraded_event_equals_one_built_now() -> None:
    old = b'{"type":"model_requested","turn":1,"step":2,"messages":5,"seq":7}'
    assert msgspec.json.decode(old, type=Event) == ModelRequested(turn=1, step=2, count=5, seq=7)


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_new_records_are_written_with_count_only(fmt: str) -> None:
    data = encode_event(ModelRequested(turn=1, step=1, count=3), fmt)  # type: ignore[arg-type]
    assert (b"count" in data) and (b"messages" not in data)


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_new_log_says_the_newest_schema_in_its_header(fmt: str) -> None:
    log = (json_lines if fmt == "json" else msgpack_frames)([ModelRequested(turn=1, step=1,
                                                                          count=3, seq=1)])
    [(_, _, event)] = list(iter_events(log, fmt))  # type: ignore[arg-type]
    assert event == ModelRequested(turn=1, step=1, count=3, seq=1)
    assert _version(log, fmt) == SCHEMA_VERSION


def test_a_request_record_with_no_count_is_a_decode_error_naming_the_line() -> None:
    log = (b'{"format":"nous-inbox","version":1}\n'
           b'{"type":"model_requested","turn":1,"step":1,"seq":1}\n')
    with pytest.raises(DecodeError, match=r"old\.jsonl line 2 \(byte 36\): ModelRequested needs "
                                          r"count \(schema 1 called it messages\)"):
        list(iter_events(log, name="old.jsonl"))


def test_building_a_request_without_a_count_or_with_a_bad_one_is_refused() -> None:
    with pytest.raises(ValueError, match="ModelRequested needs count"):
        ModelRequested(turn=1, step=1)
    with pytest.raises(ValueError, match="count must be an int >= 0, got -2"):
        ModelRequested(turn=1, step=1, count=-2)
    with pytest.raises(ValueError, match="count must be an int >= 0, got True"):
        ModelRequested(turn=1, step=1, count=True)


def test_the_old_name_never_shows_in_a_repr_or_a_replayed_session() -> None:
    event = msgspec.json.decode(
        b'{"type":"model_requested","turn":1,"step":1,"messages":2,"seq":1}', type=Event
    )
    assert repr(event) == "ModelRequested(turn=1, step=1, count=2, seq=1)"
    assert replay([event]) == Session(version=1)


def test_a_model_request_built_with_both_count_and_its_schema1_name_is_refused() -> None:
    from nous_inbox.events import ModelRequested

    with pytest.raises(ValueError, match="schema-1 name"):
        ModelRequested(1, 2, 3, 7)


# -- every schema version ----------------------------------------------------------------------


def _version(log: bytes, fmt: str) -> int:
    """The schema version a log's header names."""
    head = log.split(b"\n", 1)[0] if fmt == "json" else log[8:8 + int.from_bytes(log[:4], "big")]
    decoded = (msgspec.json.decode if fmt == "json" else msgspec.msgpack.decode)(head)
    assert decoded["format"] == "nous-inbox"
    return int(decoded["version"])


def _sqlite_version(path: Path) -> int:
    with closing(sqlite3.connect(f"file:{path}?immutable=1", uri=True)) as db:
        (value,) = db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
    return int(value)


def _tag(kind: type) -> str:
    tag = kind.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _fold(events: list[Event]) -> object:
    state = MailboxState()
    for event in events:
        state.apply(event)
    return state.snapshot()


def test_the_vocabulary_is_the_newest_schema_versions() -> None:
    tags = {_tag(kind) for kind in typing.get_args(Event)}
    assert tags == VOCABULARY[SCHEMA_VERSION], (
        "the event vocabulary changed: a new event type moves SCHEMA_VERSION (an older reader "
        "must be told to upgrade, not meet a type it cannot read); add the version to VOCABULARY "
        "and write its fixtures with `python -m tests.fixture_logs tests/data`"
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_each_schema_version_has_fixtures_headed_by_it(version: int) -> None:
    assert _version((DATA / f"schema{version}.jsonl").read_bytes(), "json") == version
    assert _version((DATA / f"schema{version}.msgpack").read_bytes(), "msgpack") == version
    assert _sqlite_version(DATA / f"schema{version}.sqlite") == version


@pytest.mark.parametrize("version", SAMPLED)
def test_the_fixtures_of_a_version_hold_every_event_type_it_knows(version: int) -> None:
    log = (DATA / f"schema{version}.jsonl").read_bytes()
    held = {_tag(type(record.event)) for _, _, record in iter_records(log)}
    assert held == VOCABULARY[version]


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "writable"])
@pytest.mark.parametrize("kind", ["file", "sqlite"])
@pytest.mark.parametrize("version", SAMPLED)
def test_a_store_of_each_version_reads_as_it_was_written(
    tmp_path: Path, version: int, kind: str, read_only: bool,
) -> None:
    path = _copy(tmp_path, f"schema{version}.{'jsonl' if kind == 'file' else 'sqlite'}")
    with open_store(f"{kind}:{path}", read_only=read_only) as store:
        assert store.streams() == ["mailbox", "run"]
        run, mailbox = list(store.read("run")), list(store.read("mailbox"))
    assert run == fixture_logs.events(version, "run")
    assert mailbox == fixture_logs.events(version, "mailbox")
    session = replay(run, stream="run")
    assert [m.content for m in session.transcript] == fixture_logs.transcript(version)
    assert (session.turn, session.running) == (4 if version >= 5 else 2, False)
    assert _fold(mailbox) == _fold(fixture_logs.events(version, "mailbox"))


@pytest.mark.parametrize("version", SAMPLED)
def test_a_messagepack_log_of_each_version_reads(tmp_path: Path, version: int) -> None:
    path = _copy(tmp_path, f"schema{version}.msgpack")
    assert [e for _, _, e in read_events(path, "msgpack")] == fixture_logs.events(version, "run")


def test_this_version_writes_its_fixtures_byte_for_byte() -> None:
    """What this version writes is what its fixtures hold: a change to how an event is written
    shows here, and moves the schema version with new fixtures rather than edit these."""
    newest = f"schema{SCHEMA_VERSION}"
    assert (DATA / f"{newest}.jsonl").read_bytes() == json_lines(fixture_logs.records(SCHEMA_VERSION))
    assert (DATA / f"{newest}.msgpack").read_bytes() == msgpack_frames(
        fixture_logs.events(SCHEMA_VERSION, "run"))
    with closing(sqlite3.connect(f"file:{DATA / newest}.sqlite?immutable=1", uri=True)) as db:
        rows = db.execute("SELECT stream, seq, body FROM events ORDER BY stream, seq").fetchall()
    assert rows == [(stream, event.seq, MSGPACK.encode(event))
                    for stream in ("mailbox", "run") for event in fixture_logs.events(SCHEMA_VERSION, stream)]


# -- from a newer version: "upgrade" -------------------------------------------------------------

UPGRADE = "written by a newer nous-inbox; upgrade nous-inbox to read it"


def _unknown_type_in(tmp_path: Path, kind: str) -> str:
    """A store of this version's schema whose run holds, at seq 5, a type this version does not
    know: what a newer nous-inbox appends to a log begun by this one."""
    newest = f"schema{SCHEMA_VERSION}"
    if kind == "file":
        path = _copy(tmp_path, f"{newest}.jsonl")
        path.write_bytes(path.read_bytes().replace(b'"type":"step_started"', b'"type":"teleported"', 1))
    else:
        path = _copy(tmp_path, f"{newest}.sqlite")
        body = msgspec.msgpack.encode({"type": "teleported", "to": "mars", "seq": 5})
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE events SET body = ? WHERE stream = 'run' AND seq = 5", (body,))
    return f"{kind}:{path}"


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_an_event_type_this_version_does_not_know_says_upgrade(tmp_path: Path, kind: str) -> None:
    url = _unknown_type_in(tmp_path, kind)
    with open_store(url, read_only=True) as store, pytest.raises(DecodeError) as info:
        list(store.read("run"))
    assert "unknown event type 'teleported'" in str(info.value)
    assert str(info.value).endswith(UPGRADE)


def test_show_on_a_session_holding_an_unknown_type_says_upgrade(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    url = _unknown_type_in(tmp_path, "file")
    assert main(["show", "--store", url, "run"]) == 1
    error = capsys.readouterr().err
    assert "unknown event type 'teleported'" in error and UPGRADE in error


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_an_unknown_type_in_a_bare_log_says_upgrade(fmt: str) -> None:
    record = {"type": "teleported", "seq": 2}
    if fmt == "json":
        log = json_lines([]) + msgspec.json.encode(record) + b"\n"
    else:
        log = msgpack_frames([]) + frame(msgspec.msgpack.encode(record))
    with pytest.raises(DecodeError, match=r"(line|record) 2 \(byte \d+\): unknown event type "
                                          r"'teleported' \(this nous-inbox reads schema \d+ and older\)"):
        list(iter_events(log, fmt, name="log"))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_store_from_a_newer_schema_version_says_upgrade(tmp_path: Path, kind: str) -> None:
    newest = f"schema{SCHEMA_VERSION}"
    newer = SCHEMA_VERSION + 1
    if kind == "file":
        path = _copy(tmp_path, f"{newest}.jsonl")
        data = path.read_bytes()
        path.write_bytes(data.replace(b'"version":%d}' % SCHEMA_VERSION, b'"version":%d}' % newer, 1))
    else:
        path = _copy(tmp_path, f"{newest}.sqlite")
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE meta SET value = ? WHERE key = 'version'", (str(newer),))
    says = rf"schema version {newer}, newer than this nous-inbox reads \({SCHEMA_VERSION}\); upgrade"
    with pytest.raises(DecodeError, match=says), open_store(f"{kind}:{path}", read_only=True) as s:
        list(s.read("run"))
