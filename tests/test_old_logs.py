"""Logs written before still read: schema 1, checked in as written by nous-inbox at schema 1.

``tests/data/schema1.*`` hold one short run (a followup, a turn of two steps with a tool call and a
steer that arrived during the tool) as nous-inbox 0.x wrote it at schema version 1, on every kind
of store: the ``file:`` store's JSON Lines (``schema1.jsonl``), a framed MessagePack log
(``schema1.msgpack``) and the ``sqlite:`` store, whose rows are MessagePack (``schema1.sqlite``).
Schema 2 renamed ``ModelRequested.messages`` to ``count``. Each test copies a fixture before
opening it, so the checked-in bytes never change.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from nous_inbox import SCHEMA_VERSION, DecodeError, Session, replay
from nous_inbox.codec import encode_event, iter_events, json_lines, msgpack_frames, read_events
from nous_inbox.events import Event, ModelRequested, TurnEnded, TurnStarted
from nous_inbox.store import open_store

DATA = Path(__file__).parent / "data"
STORES = {"file": "schema1.jsonl", "sqlite": "schema1.sqlite"}
TRANSCRIPT = [
    "tidy the staging logs", "", "42 lines", "check a.log only", "a.log has 42 lines",
]


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
    assert SCHEMA_VERSION == 2
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
def test_a_new_log_says_schema_2_in_its_header(fmt: str) -> None:
    log = (json_lines if fmt == "json" else msgpack_frames)([ModelRequested(turn=1, step=1,
                                                                          count=3, seq=1)])
    [(_, _, event)] = list(iter_events(log, fmt))  # type: ignore[arg-type]
    assert event == ModelRequested(turn=1, step=1, count=3, seq=1)
    if fmt == "json":
        assert log.startswith(b'{"format":"nous-inbox","version":2}\n')


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
