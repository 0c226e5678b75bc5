"""The codec, as a specification: what goes in comes back; what does not belong is refused, with a place."""

from __future__ import annotations

import io

import msgspec
import pytest

from nous_inbox import codec
from nous_inbox.codec import (
    Header,
    Record,
    check_header,
    decode_event,
    decode_record,
    encode_event,
    encode_header,
    encode_record,
    frame,
    get_format,
    iter_events,
    iter_records,
    json_lines,
    msgpack_frames,
)
from nous_inbox.errors import DecodeError, RecordTooLargeError
from nous_inbox.events import (
    SCHEMA_VERSION,
    Event,
    MessageSent,
    ModelReplied,
    ModelRequested,
    Nudged,
    QueueClaimed,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.message import Message, ToolCall
from nous_inbox.verbs import Target

FORMATS = ["json", "msgpack"]


def every_kind() -> list:
    """One event of each type, with unicode, metadata and tool calls in it."""
    call = ToolCall("c1", "read_file", {"path": "staging.log", "lines": [1, 2]})
    return [
        MessageSent(seq=1, at=1.5, target=Target.NEXT_STEP, wakeup=True,
                    message=Message.user("héllo ✓ 🚀", metadata={"from": "leo", "n": [1, None]})),
        QueueClaimed(seq=2, at=2.0, target=Target.NEXT_STEP, count=1),
        TurnStarted(seq=3, turn=1, reason="prompt"),
        StepStarted(seq=4, turn=1, step=1),
        ModelRequested(seq=5, turn=1, step=1, count=3),
        ModelReplied(seq=6, turn=1, step=1, message=Message.assistant("", tool_calls=[call])),
        ToolCalled(seq=7, turn=1, step=1, call=call),
        ToolReturned(seq=8, turn=1, step=1, message=Message.tool("42 lines", "c1")),
        StepEnded(seq=9, turn=1, step=1),
        Nudged(seq=10, turn=1, step=2,
               message=Message.user("continue", metadata={"provenance": "loop"})),
        TurnEnded(seq=11, turn=1, steps=2, reason="error", error="boom"),
        Warned(seq=12, text="a source failed\nwith a newline"),
    ]


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_event_round_trips_equal(fmt):
    for event in every_kind():
        assert decode_event(encode_event(event, fmt), fmt) == event


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_record_round_trips_with_its_stream_and_batch_count(fmt):
    record = Record(stream="sess/1 ✓", event=Warned(seq=3, text="x"), more=2)
    assert decode_record(encode_record(record, fmt), fmt) == record


def test_json_is_one_human_readable_line_per_event():
    log = json_lines(every_kind())
    lines = log.decode().splitlines()
    assert len(lines) == 1 + len(every_kind())
    assert lines[0] == f'{{"format":"nous-inbox","version":{SCHEMA_VERSION}}}'
    assert "héllo ✓ 🚀" in lines[1]  # unicode as itself, not \u escapes
    assert log.endswith(b"\n")


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_whole_log_decodes_to_its_events_with_positions(fmt):
    events = every_kind()
    data = json_lines(events) if fmt == "json" else msgpack_frames(events)
    got = list(iter_events(data, fmt))
    assert [event for _, _, event in got] == events
    assert [number for number, _, _ in got] == list(range(2, 2 + len(events)))
    # Each offset points at the start of its record.
    for _, offset, event in got:
        payload = encode_event(event, fmt)
        if fmt == "json":
            assert data[offset:offset + len(payload)] == payload
        else:
            assert data[offset + codec.FRAME_HEADER_SIZE:][:len(payload)] == payload


@pytest.mark.parametrize("fmt", FORMATS)
def test_records_of_a_multi_stream_log_decode(fmt):
    records = [Record(stream=f"s{i % 3}", event=Warned(seq=i, text=str(i))) for i in range(1, 9)]
    data = json_lines(records) if fmt == "json" else msgpack_frames(records)
    assert [r for _, _, r in iter_records(data, fmt)] == records


class Trickle(io.BytesIO):
    """A file that gives at most ``piece`` bytes a read, as a pipe may: every record is split."""

    def __init__(self, data: bytes, piece: int) -> None:
        super().__init__(data)
        self.piece = piece

    def read(self, size: int | None = -1) -> bytes:
        return super().read(self.piece if size is None or size < 0 else min(size, self.piece))


@pytest.mark.parametrize("fmt", FORMATS)
def test_files_are_read_in_chunks_with_the_same_result(fmt):
    events = every_kind() * 3
    data = json_lines(events) if fmt == "json" else msgpack_frames(events)
    size = codec.MAX_RECORD_SIZE
    read = get_format(fmt).read_file(Trickle(data, 97), "log", Event, size)
    assert list(read) == list(iter_events(data, fmt))
    records = [Record(stream="a", event=e) for e in events]
    data = json_lines(records) if fmt == "json" else msgpack_frames(records)
    read = get_format(fmt).read_file(Trickle(data, 97), "log", Record, size)
    assert [r for _, _, r in read] == records


def test_empty_input_is_an_empty_log():
    assert list(iter_events(b"")) == []
    assert list(iter_events(encode_header())) == []
    assert list(iter_events(encode_header("msgpack"), "msgpack")) == []


def test_a_fragment_without_header_reads_with_header_false():
    data = json_lines([Warned(seq=1, text="a")], header=False)
    assert [e for _, _, e in iter_events(data, header=False)] == [Warned(seq=1, text="a")]


# -- strictness ----------------------------------------------------------------------------------


def _log(*lines: bytes) -> bytes:
    return encode_header() + b"".join(line + b"\n" for line in lines)


GOOD = b'{"type":"warned","text":"ok","seq":1}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"type":"teleported","seq":2}', f"unknown event type 'teleported' (this nous-inbox "
                                           f"reads schema {SCHEMA_VERSION} and older): written by "
                                           "a newer nous-inbox; upgrade nous-inbox to read it"),
        (b'{"type":"warned","text":"x","seq":"2"}', "Expected `int`, got `str` - at `$.seq`"),
        (b'{"type":"warned","text":"x","seq":2', "truncated"),
        (b'{"type":"warned" "text"}', "malformed"),
        (b"", "empty record"),
        (b'{"type":"message_sent","target":"later","wakeup":true,'
         b'"message":{"role":"user","content":"x"},"seq":2}', "`$.target`"),
        (b'{"type":"message_sent","target":"next_step","wakeup":true,'
         b'"message":{"role":"robot","content":"x"},"seq":2}', "`$.message.role`"),
        (b'{"text":"no tag","seq":2}', "missing required field `type`"),
    ],
)
def test_a_bad_line_is_refused_naming_file_line_and_byte(line, message):
    data = _log(GOOD, line, GOOD)
    offset = len(encode_header()) + len(GOOD) + 1
    got = []
    with pytest.raises(DecodeError) as info:
        for item in iter_events(data, name="events.jsonl"):
            got.append(item)
    assert str(info.value).startswith(f"events.jsonl line 3 (byte {offset}): ")
    assert message in str(info.value)
    assert [e for _, _, e in got] == [decode_event(GOOD)]  # the good prefix came first


def test_a_record_cut_short_is_refused_by_the_strict_reader():
    data = _log(GOOD) + GOOD[:10]
    with pytest.raises(DecodeError, match=r"line 3 \(byte \d+\): truncated record \(10 bytes"):
        list(iter_events(data, name="x"))


def test_the_error_message_names_the_place_like_msgspec_does():
    data = _log(GOOD, GOOD, b'{"type":"warned","text":"x","seq":"3"}')
    with pytest.raises(DecodeError) as info:
        list(iter_events(data, name="events.jsonl"))
    assert str(info.value) == (
        "events.jsonl line 4 (byte 112): Expected `int`, got `str` - at `$.seq`"
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_records_above_the_size_limit_are_refused(fmt):
    big = Warned(seq=1, text="x" * 1000)
    data = json_lines([big]) if fmt == "json" else msgpack_frames([big])
    with pytest.raises(RecordTooLargeError, match="above the limit of 500 bytes"):
        list(iter_events(data, fmt, max_record_size=500))
    with pytest.raises(RecordTooLargeError):
        decode_event(encode_event(big, fmt), fmt, max_record_size=500)
    assert issubclass(RecordTooLargeError, DecodeError)


def test_the_default_size_limit_is_16_mib():
    assert codec.MAX_RECORD_SIZE == 16 * 1024 * 1024


def test_an_endless_line_in_a_file_is_refused_without_reading_it_all():
    log = Trickle(encode_header() + b"x" * 10_000, 64)
    with pytest.raises(RecordTooLargeError, match="line 2"):
        list(get_format("json").read_file(log, "log", Event, 1000))
    assert log.tell() < 2000  # refused once past the limit, not at the end


def test_a_newer_schema_version_is_refused_clearly():
    data = b'{"format":"nous-inbox","version":%d}\n' % (SCHEMA_VERSION + 1) + GOOD + b"\n"
    with pytest.raises(DecodeError, match="newer than this nous-inbox reads"):
        list(iter_events(data, name="future.jsonl"))


@pytest.mark.parametrize(
    "header",
    [b'{"format":"other","version":1}', b'{"format":"nous-inbox"}', GOOD, b"[]",
     b'{"format":"nous-inbox","version":0}'],
)
def test_anything_but_our_header_first_is_refused(header):
    with pytest.raises(DecodeError, match=r"^x line 1 \(byte 0\): "):
        list(iter_events(header + b"\n" + GOOD + b"\n", name="x"))


def test_an_older_record_without_a_later_defaulted_field_still_decodes():
    # Written before TurnStarted.reason and TurnEnded.error existed (both have defaults).
    old = (b'{"format":"nous-inbox","version":1}\n'
           b'{"type":"turn_started","turn":1,"seq":1,"at":1.0}\n'
           b'{"type":"turn_ended","turn":1,"steps":3,"reason":"final","seq":2}\n')
    events = [e for _, _, e in iter_events(old)]
    assert events == [TurnStarted(turn=1, seq=1, at=1.0),
                      TurnEnded(turn=1, steps=3, reason="final", seq=2)]
    assert events[0].reason == "wake" and events[1].error is None
    # The same for MessagePack, where the record is a map without the field.
    packed = msgspec.msgpack.encode({"type": "turn_started", "turn": 2, "seq": 1})
    assert decode_event(packed, "msgpack") == TurnStarted(turn=2, seq=1)


def test_check_header_accepts_ours():
    assert check_header(encode_header()[:-1]) == Header(format="nous-inbox",
                                                        version=SCHEMA_VERSION)


# -- MessagePack framing -------------------------------------------------------------------------


def test_a_frame_is_length_and_checksum_then_payload():
    payload = encode_event(Warned(seq=1, text="hi"), "msgpack")
    framed = frame(payload)
    assert len(framed) == codec.FRAME_HEADER_SIZE + len(payload)
    assert int.from_bytes(framed[:4], "big") == len(payload)


def test_a_flipped_byte_inside_a_msgpack_string_is_caught_by_the_checksum():
    data = bytearray(msgpack_frames([Warned(seq=1, text="hello"), Warned(seq=2, text="x")]))
    data[data.index(b"hello")] ^= 0x01  # "hello" -> "iello": valid MessagePack, wrong text
    with pytest.raises(DecodeError, match=r"record 2 \(byte \d+\): checksum mismatch"):
        list(iter_events(bytes(data), "msgpack"))


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 9])
def test_a_truncated_msgpack_frame_is_refused(cut):
    data = msgpack_frames([Warned(seq=1, text="hello")])
    header_len = len(encode_header("msgpack"))
    with pytest.raises(DecodeError, match=r"record 2 \(byte \d+\): truncated record"):
        list(iter_events(data[:header_len + cut], "msgpack"))


def test_a_msgpack_payload_of_the_wrong_shape_names_the_record():
    payload = msgspec.msgpack.encode({"type": "warned", "text": 7, "seq": 1})
    data = encode_header("msgpack") + frame(payload)
    with pytest.raises(DecodeError, match=r"x record 2 \(byte 36\): Expected `str`, got `int`"):
        list(iter_events(data, "msgpack", name="x"))


def test_absurd_nesting_is_a_decode_error_not_a_recursion_error():
    deep = b'{"type":"message_sent","target":"next_step","wakeup":true,"message":{"role":"user",' \
           b'"content":"x","metadata":{"a":' + b"[" * 20000 + b"]" * 20000 + b"}},\"seq\":1}"
    with pytest.raises(DecodeError, match="nested too deeply"):
        decode_event(deep)


def test_an_unknown_format_name_is_a_value_error():
    with pytest.raises(ValueError, match="format must be 'json' or 'msgpack'"):
        encode_event(Warned(text="x"), "yaml")  # type: ignore[arg-type]
