"""The inbox value, specified by example.

The sections follow Nous's published test list for ``Nous.Session.Inbox`` (FIFO per queue,
independent queues, each preset's queue and wake flag, the wake rules, claiming, the turn-before-step
order), then what the Python value adds: input normalization and refusal, ``Target``, immutability,
equality and hashing, persistence, the two wire formats and their errors, the pipeline-style module
functions and the ``Claimed`` view.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

import nous_inbox
from nous_inbox import Claimed, DecodeError, Inbox, Message, Target, pipeline

TURN = "next_turn"
STEP = "next_step"


def contents(messages: Sequence[Message]) -> list[str]:
    return [m.content for m in messages]


def flags(inbox: Inbox, target: str) -> list[bool]:
    return [wakeup for _, wakeup in inbox.entries(target)]


# -- FIFO per queue, queues independent -----------------------------------------------------------


def test_each_queue_is_claimed_in_send_order() -> None:
    inbox = Inbox().steer("1").inject("2").steer("3").followup("a").followup("b")
    steps, inbox = inbox.claim(STEP)
    turns, inbox = inbox.claim(TURN)
    assert contents(steps) == ["1", "2", "3"]
    assert contents(turns) == ["a", "b"]


def test_interleaved_sends_keep_each_queue_in_its_own_order() -> None:
    inbox = Inbox()
    for i in range(10):
        inbox = inbox.followup(f"t{i}") if i % 3 == 0 else inbox.inject(f"s{i}")
    assert contents(inbox.claim(TURN)[0]) == ["t0", "t3", "t6", "t9"]
    assert contents(inbox.claim(STEP)[0]) == ["s1", "s2", "s4", "s5", "s7", "s8"]


def test_the_queues_are_independent() -> None:
    only_turn = Inbox().followup("later")
    only_step = Inbox().steer("now")
    assert only_turn.count(STEP) == 0 and only_turn.count(TURN) == 1
    assert only_step.count(TURN) == 0 and only_step.count(STEP) == 1
    assert Inbox().followup("later").steer("now").entries(TURN) == only_turn.entries(TURN)


# -- each preset's queue and wake flag ------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "target", "wakeup"),
    [("followup", TURN, True), ("steer", STEP, True), ("inject", STEP, False)],
)
def test_each_preset_queues_on_its_target_with_its_wake_flag(
    preset: str, target: str, wakeup: bool
) -> None:
    inbox = getattr(Inbox(), preset)("hi")
    other = STEP if target == TURN else TURN
    assert list(inbox.entries(target)) == [(Message.user("hi"), wakeup)]
    assert inbox.count(other) == 0
    assert inbox.wants_wake() is wakeup
    assert inbox == Inbox().send("hi", target, wakeup)


def test_send_allows_the_fourth_combination_a_turn_message_without_a_wake() -> None:
    inbox = Inbox().send("whenever", TURN, False)
    assert flags(inbox, TURN) == [False]
    assert inbox.wants_wake() is False
    assert inbox.has_pending(TURN)


# -- wants_wake ------------------------------------------------------------------------------------


def test_an_empty_inbox_wants_no_wake() -> None:
    assert Inbox().wants_wake() is False


def test_wake_is_false_when_only_injections_are_queued() -> None:
    assert Inbox().inject("a").inject("b").inject("c").wants_wake() is False


@pytest.mark.parametrize(
    "build",
    [
        lambda: Inbox().steer("go"),
        lambda: Inbox().followup("later"),
        lambda: Inbox().inject("fyi").steer("go"),
        lambda: Inbox().steer("go").inject("fyi"),
        lambda: Inbox().inject("fyi").followup("later"),
        lambda: Inbox().send("x", TURN, False).send("y", STEP, True),
        lambda: Inbox().send("x", STEP, False).send("y", TURN, True),
    ],
)
def test_wake_is_true_for_any_wake_entry_in_either_queue(build: Any) -> None:
    assert build().wants_wake() is True


def test_wake_does_not_survive_its_own_queue_being_drained() -> None:
    _, inbox = Inbox().steer("go").followup("x").claim(TURN)
    _, inbox = inbox.claim(STEP)
    assert inbox.wants_wake() is False
    _, drained = Inbox().inject("fyi").steer("go").claim(STEP)
    assert drained.wants_wake() is False


def test_wake_survives_a_drain_when_the_other_queue_holds_a_wake() -> None:
    _, inbox = Inbox().steer("now").followup("later").claim(STEP)
    assert inbox.wants_wake() is True
    _, inbox = Inbox().steer("now").followup("later").claim(TURN)
    assert inbox.wants_wake() is True


def test_a_non_waking_entry_in_the_other_queue_does_not_keep_the_wake() -> None:
    _, inbox = Inbox().steer("now").send("later", TURN, False).claim(STEP)
    assert inbox.has_pending() and inbox.wants_wake() is False
    _, inbox = Inbox().followup("later").inject("fyi").claim(TURN)
    assert inbox.has_pending() and inbox.wants_wake() is False


def test_a_late_steer_is_still_owed_a_wake_after_the_run_ends() -> None:
    # The run claimed its last step, then a steer landed: nothing claims it, so the owner's
    # question at run end must still say yes.
    _, inbox = Inbox().inject("context").claim(STEP)
    inbox = inbox.steer("one more thing")
    assert inbox.wants_wake() is True


# -- claim ------------------------------------------------------------------------------------------


def test_claim_drains_only_its_queue() -> None:
    inbox = Inbox().followup("later").steer("now").inject("fyi")
    turns, after_turn = inbox.claim(TURN)
    assert contents(turns) == ["later"]
    assert after_turn.entries(STEP) == inbox.entries(STEP)
    steps, after_step = inbox.claim(STEP)
    assert contents(steps) == ["now", "fyi"]
    assert after_step.entries(TURN) == inbox.entries(TURN)


def test_a_second_claim_is_empty() -> None:
    _, inbox = Inbox().steer("a").steer("b").claim(STEP)
    again, inbox2 = inbox.claim(STEP)
    assert len(again) == 0 and list(again) == []
    assert inbox2 == inbox


@pytest.mark.parametrize("target", [TURN, STEP])
def test_claiming_an_empty_queue_is_a_no_op_returning_the_same_value(target: str) -> None:
    for inbox in (Inbox(), Inbox().followup("x") if target == STEP else Inbox().steer("x")):
        claimed, after = inbox.claim(target)
        assert claimed == []
        assert after is inbox
        assert after == inbox


def test_a_claim_resets_the_claimed_queue_to_empty() -> None:
    _, inbox = Inbox().steer("a").claim(STEP)
    _, inbox = inbox.claim(TURN)
    assert inbox == Inbox()
    assert hash(inbox) == hash(Inbox())


def test_the_turn_claim_precedes_the_step_claim() -> None:
    # Nous's order of a run: turn opens -> claim(next_turn) -> step boundary -> claim(next_step)
    # -> model request. With both queues populated, every turn message reaches the transcript
    # ahead of every step message, whatever order they were sent in.
    inbox = Inbox().steer("s1").followup("t1").inject("s2").followup("t2")
    transcript: list[Message] = []
    claimed, inbox = inbox.claim(TURN)  # the turn opens
    transcript.extend(claimed)
    claimed, inbox = inbox.claim(STEP)  # the first step boundary
    transcript.extend(claimed)
    assert contents(transcript) == ["t1", "t2", "s1", "s2"]
    assert inbox == Inbox()


def test_later_steps_of_a_turn_claim_only_the_step_queue() -> None:
    _, inbox = Inbox().followup("t1").claim(TURN)
    _, inbox = inbox.claim(STEP)
    inbox = inbox.followup("for the next turn").steer("for the next step")
    claimed, inbox = inbox.claim(STEP)  # step 2
    assert contents(claimed) == ["for the next step"]
    assert [m.content for m, _ in inbox.entries(TURN)] == ["for the next turn"]


@pytest.mark.parametrize("target", ["later", "NEXT_STEP", "next-step", "", None, 1, b"next_step"])
def test_claim_with_a_bad_target_is_a_value_error(target: Any) -> None:
    inbox = Inbox().steer("x")
    with pytest.raises(ValueError, match="target must be 'next_turn' or 'next_step', got"):
        inbox.claim(target)
    assert inbox == Inbox().steer("x")


# -- send: normalization and refusal -----------------------------------------------------------------


def test_a_str_becomes_a_user_message() -> None:
    (message, _), *_ = Inbox().send("hello", STEP, True).entries(STEP)
    assert message == Message.user("hello")
    assert message.role == "user"


@pytest.mark.parametrize("preset", ["send", "followup", "steer", "inject"])
def test_a_message_passes_through_untouched(preset: str) -> None:
    message = Message.system("be brief", name="ops", metadata={"k": [1]})
    if preset == "send":
        inbox = Inbox().send(message, STEP, False)
    else:
        inbox = getattr(Inbox(), preset)(message)
    ((queued, _),) = inbox.entries(TURN if preset == "followup" else STEP)
    assert queued is message


@pytest.mark.parametrize("preset", ["send", "followup", "steer", "inject"])
@pytest.mark.parametrize("bad", [42, None, b"bytes", ["hi"], {"role": "user", "content": "hi"}])
def test_anything_else_is_a_type_error(preset: str, bad: Any) -> None:
    inbox = Inbox().inject("keep")
    with pytest.raises(TypeError, match="message must be a Message or a str, got"):
        if preset == "send":
            inbox.send(bad, STEP, True)
        else:
            getattr(inbox, preset)(bad)
    assert inbox == Inbox().inject("keep")


@pytest.mark.parametrize("target", ["later", "NEXT_TURN", "", None, 0, object()])
def test_send_with_a_bad_target_is_a_value_error(target: Any) -> None:
    with pytest.raises(ValueError, match="target must be 'next_turn' or 'next_step'"):
        Inbox().send("hi", target, True)


@pytest.mark.parametrize("wakeup", [1, 0, None, "yes", "", 1.0, [True]])
def test_a_wakeup_that_is_not_a_bool_is_a_type_error(wakeup: Any) -> None:
    with pytest.raises(TypeError, match=f"wakeup must be a bool, got {type(wakeup).__name__}"):
        Inbox().send("hi", STEP, wakeup)


def test_a_str_that_cannot_be_serialized_never_enters_the_inbox() -> None:
    inbox = Inbox()
    with pytest.raises(ValueError, match=re.escape("Message.content: ")):
        inbox.steer("bad \ud800")
    assert inbox.count() == 0


# -- Target ------------------------------------------------------------------------------------------


def test_target_is_a_str_enum_equal_to_its_plain_string() -> None:
    assert Target.NEXT_TURN == "next_turn" and Target.NEXT_STEP == "next_step"
    assert str(Target.NEXT_STEP) == "next_step"
    assert Target("next_turn") is Target.NEXT_TURN


@pytest.mark.parametrize(("enum", "plain"), [(Target.NEXT_TURN, TURN), (Target.NEXT_STEP, STEP)])
def test_the_enum_and_the_plain_string_work_alike_everywhere(enum: Target, plain: str) -> None:
    by_enum = Inbox().send("a", enum, True)
    by_str = Inbox().send("a", plain, True)
    assert by_enum == by_str
    assert by_enum.count(enum) == by_enum.count(plain) == 1
    assert by_enum.has_pending(enum) and by_enum.has_pending(plain)
    assert by_enum.entries(enum) == by_enum.entries(plain)
    assert by_enum.claim(enum) == by_enum.claim(plain)


# -- a value: new, frozen, equal, hashable, persistent ---------------------------------------------


def test_new_and_the_bare_constructor_give_equal_empty_inboxes() -> None:
    assert Inbox.new() == Inbox()
    assert hash(Inbox.new()) == hash(Inbox())
    assert Inbox.new().count() == 0 and not Inbox.new().has_pending()


@pytest.mark.parametrize("attribute", ["_turn", "_step", "_turn_flags", "_step_flags", "anything"])
def test_assigning_an_attribute_raises(attribute: str) -> None:
    inbox = Inbox().steer("x")
    with pytest.raises(AttributeError):
        setattr(inbox, attribute, 0)
    assert inbox == Inbox().steer("x")


def test_equal_contents_give_equal_values_and_equal_hashes() -> None:
    a = Inbox().followup("t").inject("s1").steer(Message.user("s2", metadata={"k": [1]}))
    b = Inbox().inject("s1").followup("t").steer(Message.user("s2", metadata={"k": [1]}))
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_a_value_reached_by_claiming_equals_one_built_directly() -> None:
    _, claimed_down = Inbox().steer("x").followup("y").claim(STEP)
    assert claimed_down == Inbox().followup("y")
    assert hash(claimed_down) == hash(Inbox().followup("y"))


@pytest.mark.parametrize(
    "other",
    [
        Inbox().steer("x"),  # same message, different wake flag
        Inbox().send("x", TURN, False),  # same flag, different queue
        Inbox().inject("y"),  # different message
        Inbox().inject("x").inject("x"),  # more of them
    ],
)
def test_different_contents_give_unequal_values(other: Inbox) -> None:
    assert Inbox().inject("x") != other


def test_an_inbox_is_not_equal_to_other_types() -> None:
    assert Inbox() != []
    assert Inbox() != {"next_turn": [], "next_step": []}


def test_every_earlier_value_stays_usable_and_unchanged() -> None:
    v0 = Inbox()
    v1 = v0.followup("t")
    v2 = v1.steer("s")
    v3 = v2.inject("i")
    claimed, v4 = v3.claim(STEP)
    _, v5 = v4.claim(TURN)
    assert [v.count() for v in (v0, v1, v2, v3, v4, v5)] == [0, 1, 2, 3, 1, 0]
    assert [v.wants_wake() for v in (v0, v1, v2, v3, v4, v5)] == [
        False,
        True,
        True,
        True,
        True,
        False,
    ]
    # Branching from an old value does not disturb the new ones.
    branch = v2.inject("other")
    assert contents(branch.claim(STEP)[0]) == ["s", "other"]
    assert contents(v3.claim(STEP)[0]) == ["s", "i"]
    assert contents(claimed) == ["s", "i"]
    assert v2 == Inbox().followup("t").steer("s")


def test_a_claimed_sequence_does_not_change_when_the_inbox_goes_on() -> None:
    inbox = Inbox().steer("a")
    claimed, after = inbox.claim(STEP)
    inbox.steer("b")
    after.steer("c")
    assert contents(claimed) == ["a"]


def test_repr_shows_both_queues_with_their_wake_flags() -> None:
    assert repr(Inbox().followup("t").inject("i")) == (
        "Inbox(next_turn=[('t', True)], next_step=[('i', False)])"
    )


# -- count, has_pending, entries ---------------------------------------------------------------------


def test_count_and_has_pending_with_and_without_target() -> None:
    inbox = Inbox().followup("t").steer("s1").inject("s2")
    assert (inbox.count(), inbox.count(TURN), inbox.count(STEP)) == (3, 1, 2)
    assert inbox.has_pending() and inbox.has_pending(TURN) and inbox.has_pending(STEP)
    _, only_turn = inbox.claim(STEP)
    assert (only_turn.count(), only_turn.count(TURN), only_turn.count(STEP)) == (1, 1, 0)
    assert only_turn.has_pending() and only_turn.has_pending(TURN)
    assert not only_turn.has_pending(STEP)
    _, empty = only_turn.claim(TURN)
    assert (empty.count(), empty.has_pending()) == (0, False)


@pytest.mark.parametrize("method", ["count", "has_pending", "entries"])
def test_asking_about_a_bad_target_is_a_value_error(method: str) -> None:
    with pytest.raises(ValueError, match="target must be 'next_turn' or 'next_step'"):
        getattr(Inbox(), method)("somewhere")


def test_entries_shows_messages_and_wake_flags_without_claiming() -> None:
    inbox = Inbox().inject("a").steer("b")
    assert list(inbox.entries(STEP)) == [(Message.user("a"), False), (Message.user("b"), True)]
    assert inbox.count() == 2


# -- serialization -----------------------------------------------------------------------------------


def _rich_inbox() -> Inbox:
    return (
        Inbox()
        .followup("later")
        .send(Message.system("no wake turn", name="ops"), TURN, False)
        .inject(Message.user("ctx", metadata={"k": [1, {"x": None}], "f": 1.5, "b": True}))
        .steer(
            Message.assistant(
                "calling", tool_calls=[{"id": "c1", "name": "ls", "arguments": {"d": "/"}}]
            )
        )
        .steer(Message.tool("42 files", "c1", id="m-7"))
        .inject("é ✓ 🙂")
    )


@pytest.mark.parametrize(
    ("dump", "load"), [("to_json", "from_json"), ("to_msgpack", "from_msgpack")]
)
@pytest.mark.parametrize("inbox", [Inbox(), Inbox().inject("x"), _rich_inbox()], ids=repr)
def test_both_wire_formats_round_trip_exactly(inbox: Inbox, dump: str, load: str) -> None:
    data = getattr(inbox, dump)()
    assert isinstance(data, bytes)
    back = getattr(Inbox, load)(data)
    assert back == inbox
    assert hash(back) == hash(inbox)
    for target in (TURN, STEP):
        assert flags(back, target) == flags(inbox, target)
    assert back.wants_wake() is inbox.wants_wake()
    assert getattr(back, dump)() == data


def test_wake_flags_survive_the_round_trip_in_each_combination() -> None:
    inbox = Inbox().send("a", TURN, False).send("b", TURN, True)
    inbox = inbox.send("c", STEP, False).send("d", STEP, True)
    for back in (Inbox.from_json(inbox.to_json()), Inbox.from_msgpack(inbox.to_msgpack())):
        assert flags(back, TURN) == [False, True] and flags(back, STEP) == [False, True]
        _, step_drained = back.claim(STEP)
        assert step_drained.wants_wake() is True
        _, turn_drained = back.send("e", TURN, False).claim(TURN)
        assert turn_drained.wants_wake() is True


def test_a_round_tripped_injection_still_wants_no_wake() -> None:
    assert Inbox.from_json(Inbox().inject("x").to_json()).wants_wake() is False
    assert Inbox.from_msgpack(Inbox().inject("x").to_msgpack()).wants_wake() is False


def test_from_json_accepts_str_and_bytearray() -> None:
    data = _rich_inbox().to_json()
    assert Inbox.from_json(data.decode()) == _rich_inbox()
    assert Inbox.from_json(bytearray(data)) == _rich_inbox()
    assert Inbox.from_msgpack(memoryview(_rich_inbox().to_msgpack())) == _rich_inbox()


def test_the_json_form_is_readable() -> None:
    assert Inbox().followup("hi").to_json() == (
        b'{"next_turn":[{"message":{"role":"user","content":"hi"},"wakeup":true}],"next_step":[]}'
    )


def _entry(message: dict[str, Any], wakeup: Any = True) -> dict[str, Any]:
    return {"message": message, "wakeup": wakeup}


_GOOD = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (
            {"next_step": [_entry({"role": "user", "content": 7})]},
            "Expected `str`, got `int` - at `$.next_step[0].message.content`",
        ),
        (
            {"next_turn": [_entry(_GOOD), _entry(_GOOD, wakeup="yes")]},
            "Expected `bool`, got `str` - at `$.next_turn[1].wakeup`",
        ),
        (
            {"next_step": [{"message": _GOOD}]},
            "Object missing required field `wakeup` - at `$.next_step[0]`",
        ),
        (
            {"next_step": [_entry({"content": "hi"})]},
            "Object missing required field `role` - at `$.next_step[0].message`",
        ),
        (
            {"next_step": [_entry({"role": "robot", "content": "hi"})]},
            "Invalid enum value 'robot' - at `$.next_step[0].message.role`",
        ),
        ({"next_step": {"a": 1}}, "Expected `array`, got `object` - at `$.next_step`"),
        ([], "Expected `object`, got `array`"),
        (
            b'{"next_step": [{"message": {"role": "user", "content": "hi", '
            b'"metadata": {"n": [1, {"x": 1e400}]}}, "wakeup": true}]}',
            "Number out of range - at `$.next_step[0].message.metadata",
        ),
    ],
)
def test_json_with_the_wrong_shape_is_a_decode_error_saying_what_and_where(
    document: Any, says: str
) -> None:
    data = document if isinstance(document, bytes) else msgspec.json.encode(document)
    with pytest.raises(DecodeError, match=re.escape(says)) as caught:
        Inbox.from_json(data)
    assert str(caught.value).startswith("invalid inbox JSON: ")
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "Input data was truncated"),
        (b'{"next_step": [{"message": {"role": "us', "Input data was truncated"),
        (b"hello", "JSON is malformed: invalid character (byte 0)"),
        (b'{"next_step" []}', "JSON is malformed: expected ':' (byte 13)"),
        (b'{"next_step": [],}', "JSON is malformed: trailing comma in object (byte 17)"),
        (b'{"next_step": []} trailing', "JSON is malformed: trailing characters (byte 19)"),
    ],
)
def test_bytes_that_are_not_json_are_a_decode_error(data: bytes, says: str) -> None:
    with pytest.raises(DecodeError, match=re.escape(says)):
        Inbox.from_json(data)


def test_a_truncated_copy_of_real_output_is_a_decode_error_at_every_cut() -> None:
    for dump, load in (("to_json", Inbox.from_json), ("to_msgpack", Inbox.from_msgpack)):
        data = getattr(_rich_inbox(), dump)()
        for cut in range(len(data)):
            with pytest.raises(DecodeError):
                load(data[:cut])


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (
            {"next_step": [_entry({**_GOOD, "metadata": {"x": {1: 2}}})]},
            "Message.metadata['x']: key 1 is int, keys must be str - at `$.next_step[0].message`",
        ),
        (
            {"next_step": [_entry({**_GOOD, "metadata": {"x": float("nan")}})]},
            "Message.metadata['x']: nan cannot be serialized",
        ),
        (
            {"next_turn": [_entry({**_GOOD, "metadata": {"raw": b"\x00"}})]},
            "Message.metadata['raw']: bytes is not JSON-able (allowed: None, bool, int, float, "
            "str, list, tuple, dict with str keys) - at `$.next_turn[0].message`",
        ),
        (
            {"next_step": [_entry({"role": "user", "content": "hi"}, wakeup=1)]},
            "Expected `bool`, got `int` - at `$.next_step[0].wakeup`",
        ),
        ({"next_step": "nope"}, "Expected `array`, got `str` - at `$.next_step`"),
    ],
)
def test_msgpack_with_the_wrong_shape_is_a_decode_error_saying_what_and_where(
    document: Any, says: str
) -> None:
    with pytest.raises(DecodeError, match=re.escape(says)) as caught:
        Inbox.from_msgpack(msgspec.msgpack.encode(document))
    assert str(caught.value).startswith("invalid inbox MessagePack: ")


def test_msgpack_that_is_cut_short_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="Input data was truncated"):
        Inbox.from_msgpack(Inbox().steer("hello").to_msgpack()[:-3])


def test_a_decode_error_is_a_value_error_from_the_public_module() -> None:
    assert nous_inbox.DecodeError is DecodeError
    assert issubclass(DecodeError, ValueError)


@pytest.mark.parametrize("data", [None, 42, ["{}"], {"next_step": []}])
def test_reading_something_that_is_not_bytes_is_a_type_error(data: Any) -> None:
    with pytest.raises(TypeError, match=re.escape("Inbox.from_json needs bytes or str, got")):
        Inbox.from_json(data)
    with pytest.raises(TypeError, match=re.escape("Inbox.from_msgpack needs bytes, got")):
        Inbox.from_msgpack(data)


def test_from_msgpack_refuses_a_str() -> None:
    with pytest.raises(TypeError, match=re.escape("Inbox.from_msgpack needs bytes, got str")):
        Inbox.from_msgpack("\x80")  # type: ignore[arg-type]


# -- module-level functions mirror the methods -------------------------------------------------------


def test_the_module_functions_mirror_the_methods() -> None:
    m = Message.user("m")
    inbox = Inbox().inject("x")
    assert pipeline.send(inbox, m, TURN, False) == inbox.send(m, TURN, False)
    assert pipeline.followup(inbox, m) == inbox.followup(m)
    assert pipeline.steer(inbox, m) == inbox.steer(m)
    assert pipeline.inject(inbox, m) == inbox.inject(m)
    assert pipeline.claim(inbox, STEP) == inbox.claim(STEP)
    assert pipeline.wants_wake(inbox) is inbox.wants_wake()
    for target in (None, TURN, STEP):
        assert pipeline.has_pending(inbox, target) is inbox.has_pending(target)
        assert pipeline.count(inbox, target) == inbox.count(target)
    assert pipeline.has_pending(inbox) and pipeline.count(inbox) == 1


def test_pipeline_style_reads_like_the_nous_example() -> None:
    inbox = pipeline.steer(pipeline.inject(Inbox.new(), "recall: frozen"), "summarize")
    assert pipeline.wants_wake(inbox)
    claimed, inbox = pipeline.claim(inbox, Target.NEXT_STEP)
    assert contents(claimed) == ["recall: frozen", "summarize"]
    assert not pipeline.has_pending(inbox)


def test_the_module_functions_refuse_bad_input_like_the_methods() -> None:
    with pytest.raises(TypeError):
        pipeline.steer(Inbox(), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pipeline.claim(Inbox(), "nowhere")
    with pytest.raises(TypeError):
        pipeline.send(Inbox(), "x", STEP, None)  # type: ignore[arg-type]


# -- the Claimed view ----------------------------------------------------------------------------


def _claimed() -> Claimed:
    claimed, _ = Inbox().steer("a").inject("b").steer("c").claim(STEP)
    return claimed


def test_claimed_is_a_sequence_of_messages() -> None:
    claimed = _claimed()
    assert isinstance(claimed, Sequence)
    assert len(claimed) == 3
    assert claimed[0] == Message.user("a") and claimed[-1] == Message.user("c")
    assert [m.content for m in claimed] == ["a", "b", "c"]
    assert claimed.index(Message.user("b")) == 1
    assert Message.user("c") in claimed and Message.user("z") not in claimed
    assert claimed.count(Message.user("a")) == 1
    assert [m.content for m in reversed(claimed)] == ["c", "b", "a"]


def test_claimed_slices_are_claimed_views_too() -> None:
    claimed = _claimed()
    assert isinstance(claimed[1:], Claimed)
    assert claimed[1:] == [Message.user("b"), Message.user("c")]
    assert claimed[::2] == [Message.user("a"), Message.user("c")]
    assert claimed[5:] == []


def test_claimed_indexing_out_of_range_is_an_index_error() -> None:
    with pytest.raises(IndexError):
        _claimed()[3]


def test_claimed_equals_lists_tuples_and_other_claims_with_the_same_messages() -> None:
    expected = [Message.user("a"), Message.user("b"), Message.user("c")]
    assert _claimed() == expected
    assert _claimed() == tuple(expected)
    assert _claimed() == _claimed()
    assert _claimed() != expected[:2]
    assert _claimed() != [*expected[:2], Message.user("z")]
    assert _claimed() != "abc"
    assert hash(_claimed()) == hash(tuple(expected))


def test_an_empty_claim_is_an_empty_claimed_view() -> None:
    claimed, _ = Inbox().claim(TURN)
    assert isinstance(claimed, Claimed)
    assert len(claimed) == 0 and not claimed and claimed == [] and claimed == ()


def test_claimed_repr_lists_the_messages() -> None:
    claimed, _ = Inbox().steer("a").claim(STEP)
    assert repr(claimed) == "Claimed([Message(role='user', content='a')])"


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_bytes_nested_too_deeply_are_a_decode_error_not_a_recursion_error(fmt: str) -> None:
    import msgspec as _msgspec

    depth = 100_000
    shell = {"next_turn": [], "next_step": [
        {"message": {"role": "user", "content": "x", "metadata": {"a": "HOLE"}}, "wakeup": True}]}
    if fmt == "json":
        data = _msgspec.json.encode(shell).replace(b'"HOLE"', b"[" * depth + b"]" * depth)
    else:  # 0x91: an array of one element; 0x90: an empty array
        data = _msgspec.msgpack.encode(shell).replace(b"\xa4HOLE", b"\x91" * depth + b"\x90")
    read = Inbox.from_json if fmt == "json" else Inbox.from_msgpack
    with pytest.raises(DecodeError, match="nested too deeply"):
        read(data)


# -- a claim of the oldest few --------------------------------------------------------------------


def test_a_limited_claim_takes_the_oldest_and_leaves_the_rest_queued_with_their_wakes() -> None:
    inbox = Inbox().followup("a").send("b", "next_turn", False).followup("c").steer("s")
    claimed, rest = inbox.claim("next_turn", limit=2)
    assert [m.content for m in claimed] == ["a", "b"]
    assert list(rest.entries("next_turn")) == [(Message.user("c"), True)]
    assert rest.entries("next_step") == inbox.entries("next_step")
    assert rest.wants_wake() and rest == Inbox().followup("c").steer("s")
    _, only_quiet = Inbox().followup("a").send("b", "next_turn", False).claim("next_turn", 1)
    assert not only_quiet.wants_wake()


def test_a_limit_at_or_past_the_queue_length_is_a_whole_claim_and_zero_takes_nothing() -> None:
    inbox = Inbox().steer("a").steer("b")
    assert inbox.claim("next_step", limit=5) == inbox.claim("next_step")
    claimed, same = inbox.claim("next_step", limit=0)
    assert list(claimed) == [] and same is inbox


@pytest.mark.parametrize(("limit", "error"), [(-1, ValueError), (1.0, TypeError), (True, TypeError)])
def test_a_bad_limit_is_refused(limit: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="limit"):
        Inbox().steer("a").claim("next_step", limit=limit)


# -- asking one queue, and whether a wake is worth a model round (ruling 4) ------------------------


def test_wants_wake_can_ask_about_one_queue() -> None:
    inbox = Inbox().followup("later").inject("fyi")
    assert inbox.wants_wake(TURN) and not inbox.wants_wake(STEP)
    assert inbox.wants_wake() and inbox.wants_wake(None)
    assert Inbox().steer("now").wants_wake(Target.NEXT_STEP)
    assert not Inbox().steer("now").wants_wake(Target.NEXT_TURN)


@pytest.mark.parametrize("method", ["wants_wake", "worth_waking"])
def test_asking_whether_a_bad_target_wants_a_wake_is_a_value_error(method: str) -> None:
    with pytest.raises(ValueError, match="target must be"):
        getattr(Inbox().steer("x"), method)("soon")


def test_a_waking_message_with_content_is_worth_waking_for() -> None:
    assert Inbox().steer("stop").worth_waking()
    assert Inbox().followup("then this").worth_waking()
    assert Inbox().send("x", TURN, True).worth_waking(TURN)


@pytest.mark.parametrize(
    "blank", ["", " ", "\n", " \t\r\n ", "\u3000", "\u200b", "\u200c\u200d", "\u2060", "\ufeff",
              " \u200b\n\ufeff "],
)
def test_a_blank_waking_message_asks_for_a_wake_but_is_not_worth_one(blank: str) -> None:
    for inbox in (Inbox().steer(blank), Inbox().followup(blank)):
        assert inbox.wants_wake()
        assert not inbox.worth_waking()


def test_a_waking_message_with_tool_calls_is_worth_waking_for_even_without_content() -> None:
    calls = [{"id": "c1", "name": "ls", "arguments": {}}]
    assert Inbox().steer(Message.assistant("", tool_calls=calls)).worth_waking()


def test_an_injection_is_never_worth_waking_for_however_much_it_says() -> None:
    inbox = Inbox().inject("the deploy is frozen").send("tidy up", TURN, False)
    assert not inbox.wants_wake() and not inbox.worth_waking()


def test_worth_waking_asks_of_the_same_entry_that_asked_for_the_wake() -> None:
    # A blank steer beside a non-blank injection: one asked, the other has something to say;
    # neither both, so no round is owed.
    inbox = Inbox().inject("context").steer("   ")
    assert inbox.wants_wake() and not inbox.worth_waking()


def test_worth_waking_can_ask_about_one_queue() -> None:
    inbox = Inbox().followup("later").steer(" ")
    assert inbox.worth_waking(TURN) and not inbox.worth_waking(STEP)
    assert inbox.worth_waking()


def test_worth_waking_goes_when_its_queue_is_claimed_and_stays_when_the_other_is() -> None:
    inbox = Inbox().followup("later").steer("now")
    _, after_step = inbox.claim(STEP)
    assert after_step.worth_waking(TURN) and not after_step.worth_waking(STEP)
    _, after_both = after_step.claim(TURN)
    assert not after_both.worth_waking()


def test_a_limited_claim_keeps_worth_waking_for_what_it_leaves() -> None:
    inbox = Inbox().steer("first").steer(" ").steer("third")
    _, rest = inbox.claim(STEP, limit=1)
    assert rest.worth_waking(STEP)
    _, rest = inbox.claim(STEP, limit=2)
    assert rest.worth_waking(STEP)
    _, blank_left = Inbox().steer("first").steer(" ").claim(STEP, limit=1)
    assert blank_left.wants_wake(STEP) and not blank_left.worth_waking(STEP)


def test_worth_waking_survives_both_wire_formats() -> None:
    inbox = Inbox().steer(" ").followup("go").inject("fyi")
    for back in (Inbox.from_json(inbox.to_json()), Inbox.from_msgpack(inbox.to_msgpack())):
        assert back == inbox
        assert back.worth_waking(TURN) and not back.worth_waking(STEP)


def test_the_module_functions_mirror_the_new_questions() -> None:
    inbox = Inbox().followup("later").steer(" ")
    for target in (None, TURN, STEP):
        assert pipeline.wants_wake(inbox, target) is inbox.wants_wake(target)
        assert pipeline.worth_waking(inbox, target) is inbox.worth_waking(target)
    assert pipeline.claim(inbox, STEP, wake_only=True) == inbox.claim(STEP, wake_only=True)


# -- the wake-only claim: does a waking message extend a run at a would-be final answer? ----------


def test_a_wake_only_claim_takes_everything_when_a_waking_message_is_worth_a_round() -> None:
    inbox = Inbox().inject("fyi").steer("stop and summarize").followup("later")
    claimed, rest = inbox.claim(STEP, wake_only=True)
    assert contents(claimed) == ["fyi", "stop and summarize"]
    assert rest == Inbox().followup("later")


def test_a_wake_only_claim_leaves_a_lone_injection_queued() -> None:
    inbox = Inbox().inject("fyi")
    claimed, same = inbox.claim(STEP, wake_only=True)
    assert list(claimed) == [] and same is inbox


def test_a_wake_only_claim_leaves_a_blank_steer_queued() -> None:
    inbox = Inbox().steer("  \n").inject("fyi")
    claimed, same = inbox.claim(STEP, wake_only=True)
    assert list(claimed) == [] and same is inbox


def test_a_wake_only_claim_looks_only_at_its_own_queue() -> None:
    inbox = Inbox().followup("later").inject("fyi")
    claimed, same = inbox.claim(STEP, wake_only=True)
    assert list(claimed) == [] and same is inbox
    claimed, _ = inbox.claim(TURN, wake_only=True)
    assert contents(claimed) == ["later"]


def test_a_wake_only_claim_of_an_empty_queue_is_a_no_op() -> None:
    claimed, same = Inbox().claim(STEP, wake_only=True)
    assert isinstance(claimed, Claimed) and list(claimed) == [] and same == Inbox()


def test_a_wake_only_claim_with_a_limit_takes_the_oldest_when_it_claims() -> None:
    inbox = Inbox().inject("a").steer("b").steer("c")
    claimed, rest = inbox.claim(STEP, limit=2, wake_only=True)
    assert contents(claimed) == ["a", "b"] and rest == Inbox().steer("c")


def test_a_wake_only_claim_with_a_bad_limit_is_refused_even_when_it_would_take_nothing() -> None:
    with pytest.raises(ValueError, match="limit"):
        Inbox().inject("a").claim(STEP, limit=-1, wake_only=True)


@pytest.mark.parametrize("wake_only", [1, None, "yes"])
def test_a_wake_only_that_is_not_a_bool_is_a_type_error(wake_only: Any) -> None:
    with pytest.raises(TypeError, match="wake_only must be a bool"):
        Inbox().steer("a").claim(STEP, wake_only=wake_only)


def test_the_blank_test_is_the_inboxs() -> None:
    from nous_inbox import inbox

    assert inbox.is_blank([]) and inbox.is_blank([Message.user(" "), Message.user("\t")])
    assert not inbox.is_blank([Message.user(" "), Message.user("go")])


def test_an_inbox_that_numbers_a_send_twice_or_below_zero_does_not_decode() -> None:
    def entry(seq: int) -> str:
        return f'{{"message": {{"role": "user", "content": "x"}}, "wakeup": true, "seq": {seq}}}'

    with pytest.raises(DecodeError, match="seq 3 is queued twice"):
        Inbox.from_json(f'{{"next_turn": [{entry(3)}], "next_step": [{entry(3)}]}}')
    with pytest.raises(DecodeError, match=r"Expected `int` >= 0"):
        Inbox.from_json(f'{{"next_step": [{entry(-5)}]}}')


def test_a_queues_entries_compare_as_the_pairs_they_show() -> None:
    numbered = Inbox().send("a", STEP, True, seq=4)
    bare = Inbox().steer("a")
    assert numbered.entries(STEP) == bare.entries(STEP) == [(Message.user("a"), True)]
    assert hash(numbered.entries(STEP)) == hash(bare.entries(STEP))
