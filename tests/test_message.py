"""Message: the one thing a queue holds.

These tests read as the specification of a message: how one is built, that it never changes and is
equal (and hashes) by value, and that nothing a log could not hold ever gets into one. Every refusal
names the path to the offending value, so a caller can find it in a deeply nested payload.
"""

from __future__ import annotations

import math
import re
import socket
import threading
from collections import OrderedDict, UserString
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pyrsistent import pmap, pvector

from nous_inbox import Message, ToolCall
from nous_inbox.frozen import MAX_DEPTH, freeze_json, thaw_json
from nous_inbox.message import ROLES, enc_hook

# -- building -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "role"),
    [
        (lambda: Message.user("hello"), "user"),
        (lambda: Message.system("hello"), "system"),
        (lambda: Message.assistant("hello"), "assistant"),
        (lambda: Message.tool("hello", "call-1"), "tool"),
    ],
)
def test_each_constructor_names_its_role(build: Any, role: str) -> None:
    message = build()
    assert message.role == role
    assert message.content == "hello"


def test_the_plain_constructor_takes_role_and_content() -> None:
    assert Message("user", "hi") == Message.user("hi")
    assert Message(role="system", content="be brief") == Message.system("be brief")


def test_optional_fields_default_to_nothing() -> None:
    message = Message.user("hi")
    assert message.name is None
    assert message.metadata == {}
    assert message.tool_calls == ()
    assert message.tool_call_id is None
    assert message.id is None


def test_constructors_accept_the_optional_fields() -> None:
    message = Message.user("hi", name="leo", id="m-1", metadata={"channel": "slack"})
    assert (message.name, message.id, message.metadata) == ("leo", "m-1", {"channel": "slack"})


def test_a_tool_message_carries_the_id_of_the_call_it_answers() -> None:
    assert Message.tool("42 lines", "call-7").tool_call_id == "call-7"


def test_an_assistant_may_reply_with_tool_calls_and_no_text() -> None:
    message = Message.assistant(tool_calls=[ToolCall("c1", "ls")])
    assert message.content == ""
    assert message.tool_calls == (ToolCall("c1", "ls"),)


def test_every_role_in_roles_is_accepted() -> None:
    assert {Message(role, "x").role for role in ROLES} == {"system", "user", "assistant", "tool"}


# -- immutability -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["role", "content", "name", "metadata", "tool_calls", "id"])
def test_assigning_any_field_raises(field: str) -> None:
    message = Message.user("hi")
    with pytest.raises(AttributeError):
        setattr(message, field, "changed")
    assert message == Message.user("hi")


def test_a_new_attribute_cannot_be_added() -> None:
    with pytest.raises(AttributeError):
        Message.user("hi").extra = 1  # type: ignore[attr-defined]


def test_the_metadata_cannot_be_changed_through_the_message() -> None:
    message = Message.user("hi", metadata={"tags": ["a"], "nested": {"k": 1}})
    with pytest.raises((TypeError, AttributeError)):
        message.metadata["new"] = 1  # type: ignore[index]
    with pytest.raises((TypeError, AttributeError)):
        message.metadata["tags"][0] = "b"
    with pytest.raises((TypeError, AttributeError)):
        message.metadata["tags"].append("b")
    with pytest.raises((TypeError, AttributeError)):
        message.metadata["nested"]["k"] = 2
    assert message.metadata == {"tags": ["a"], "nested": {"k": 1}}


def test_changing_the_dict_given_later_does_not_change_the_message() -> None:
    given: dict[str, Any] = {"tags": ["a"], "nested": {"k": 1}}
    message = Message.user("hi", metadata=given)
    given["tags"].append("b")
    given["nested"]["k"] = 2
    given["new"] = True
    assert message.metadata == {"tags": ["a"], "nested": {"k": 1}}


# -- equal and hashed by value ------------------------------------------------------------------


def test_messages_with_equal_fields_are_equal_and_hash_equal() -> None:
    a = Message.user("hi", name="leo", metadata={"x": [1, {"y": None}]})
    b = Message.user("hi", name="leo", metadata={"x": [1, {"y": None}]})
    assert a is not b
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize(
    "other",
    [
        Message.system("hi"),
        Message.user("hello"),
        Message.user("hi", name="ana"),
        Message.user("hi", metadata={"x": 2}),
        Message.user("hi", id="m-2"),
    ],
)
def test_messages_differing_in_any_field_are_unequal(other: Message) -> None:
    assert Message.user("hi") != other


def test_a_message_with_metadata_can_be_a_dict_key() -> None:
    message = Message.user("hi", metadata={"a": [1, 2], "b": {"c": "d"}})
    assert {message: "seen"}[Message.user("hi", metadata={"a": [1, 2], "b": {"c": "d"}})] == "seen"


def test_metadata_compares_equal_to_the_dict_given_at_every_depth() -> None:
    given = {"from": "leo", "tags": ["urgent", "ops"], "ctx": {"ticket": 42, "ids": [1, [2, 3]]}}
    message = Message.user("hi", metadata=given)
    assert message.metadata == given
    assert message.metadata["ctx"] == given["ctx"]
    assert message.metadata["ctx"]["ids"] == [1, [2, 3]]
    assert thaw_json(message.metadata) == given


def test_tuples_in_metadata_are_kept_as_sequences() -> None:
    assert Message.user("x", metadata={"pair": (1, 2)}).metadata["pair"] == [1, 2]


def test_metadata_given_as_any_mapping_or_as_frozen_containers_is_equal() -> None:
    plain = Message.user("x", metadata={"a": [1]})
    assert Message.user("x", metadata=OrderedDict(a=[1])) == plain
    assert Message.user("x", metadata=pmap({"a": pvector([1])})) == plain


def test_empty_metadata_is_the_same_as_none_given() -> None:
    assert Message.user("x", metadata={}) == Message.user("x")
    assert Message.user("x", metadata=pmap()) == Message.user("x")


# -- tool calls ---------------------------------------------------------------------------------


def test_tool_calls_may_be_given_as_mappings_or_as_tool_calls() -> None:
    as_mappings = Message.assistant(
        tool_calls=[{"id": "c1", "name": "read", "arguments": {"path": "a.log"}}]
    )
    as_objects = Message.assistant(tool_calls=[ToolCall("c1", "read", {"path": "a.log"})])
    assert as_mappings == as_objects
    assert isinstance(as_mappings.tool_calls[0], ToolCall)
    assert as_mappings.tool_calls[0].arguments == {"path": "a.log"}


def test_tool_calls_given_to_the_plain_constructor_are_normalized_too() -> None:
    message = Message("assistant", "", tool_calls=[{"id": "c1", "name": "ls"}])  # type: ignore[list-item]
    assert message.tool_calls == (ToolCall("c1", "ls"),)


def test_tool_calls_are_a_tuple_in_the_order_given() -> None:
    message = Message.assistant(tool_calls=[ToolCall("c1", "a"), {"id": "c2", "name": "b"}])
    assert [call.id for call in message.tool_calls] == ["c1", "c2"]
    assert isinstance(message.tool_calls, tuple)


def test_a_tool_call_is_frozen_and_hashable() -> None:
    call = ToolCall("c1", "read", {"path": ["a", "b"]})
    with pytest.raises(AttributeError):
        call.name = "write"  # type: ignore[misc]
    assert hash(call) == hash(ToolCall("c1", "read", {"path": ["a", "b"]}))


@pytest.mark.parametrize(
    ("tool_calls", "error", "where"),
    [
        ("ls", TypeError, "Message.tool_calls must be a sequence"),
        ({"id": "c1", "name": "ls"}, TypeError, "Message.tool_calls must be a sequence"),
        (42, TypeError, "Message.tool_calls must be a sequence"),
        ([42], TypeError, "Message.tool_calls[0] must be a ToolCall or a mapping, got int"),
        ([{"id": "c1"}], TypeError, "Message.tool_calls[0]:"),
        ([{"id": 1, "name": "ls"}], TypeError, "Message.tool_calls[0]: ToolCall.id"),
        ([{"id": "c1", "name": "ls", "extra": 1}], TypeError, "Message.tool_calls[0]:"),
        (
            [
                ToolCall("c0", "ok"),
                {"id": "c1", "name": "ls", "arguments": {"f": threading.Lock()}},
            ],
            TypeError,
            "Message.tool_calls[1]: ToolCall.arguments['f']: lock is not JSON-able",
        ),
        (
            [{"id": "c1", "name": "ls", "arguments": {"n": math.nan}}],
            ValueError,
            "Message.tool_calls[0]: ToolCall.arguments['n']: nan cannot be serialized",
        ),
        (
            [{"id": "c1", "name": "ls", "arguments": [1]}],
            TypeError,
            "Message.tool_calls[0]: ToolCall.arguments must be a mapping, got list",
        ),
    ],
)
def test_bad_tool_calls_are_refused_naming_the_place(
    tool_calls: Any, error: type[Exception], where: str
) -> None:
    with pytest.raises(error) as caught:
        Message("assistant", "", tool_calls=tool_calls)
    assert where in str(caught.value)


def test_a_tool_call_refuses_unserializable_arguments_naming_the_path() -> None:
    with pytest.raises(TypeError, match=r"ToolCall.arguments\['cb'\]: function is not JSON-able"):
        ToolCall("c1", "ls", {"cb": lambda: None})


# -- refusing what a log could not hold -----------------------------------------------------------


class _Opaque:
    pass


def _function() -> None:
    pass


@pytest.fixture
def a_socket() -> Any:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    yield sock
    sock.close()


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"lock": threading.Lock()}, "Message.metadata['lock']: lock is not JSON-able"),
        ({"f": _function}, "Message.metadata['f']: function is not JSON-able"),
        ({"f": print}, "Message.metadata['f']: builtin_function_or_method is not JSON-able"),
        ({"o": _Opaque()}, "Message.metadata['o']: _Opaque is not JSON-able"),
        ({"o": object()}, "Message.metadata['o']: object is not JSON-able"),
        ({"s": {1, 2}}, "Message.metadata['s']: set is not JSON-able"),
        ({"b": b"raw"}, "Message.metadata['b']: bytes is not JSON-able"),
        ({"a": [1, [2, {"deep": threading.Lock()}]]}, "Message.metadata['a'][1][1]['deep']: lock"),
        ({"a": ({"t": _Opaque()},)}, "Message.metadata['a'][0]['t']: _Opaque is not JSON-able"),
        ({1: "x"}, "Message.metadata: key 1 is int, keys must be str"),
        ({"a": {("t",): 1}}, "Message.metadata['a']: key ('t',) is tuple, keys must be str"),
        ({"a": {None: 1}}, "Message.metadata['a']: key None is NoneType, keys must be str"),
    ],
)
def test_unserializable_metadata_is_refused_with_a_type_error_naming_the_path(
    metadata: Any, where: str
) -> None:
    with pytest.raises(TypeError) as caught:
        Message.user("hi", metadata=metadata)
    assert str(caught.value).startswith(where)


def test_a_socket_anywhere_in_metadata_is_refused(a_socket: socket.socket) -> None:
    with pytest.raises(TypeError, match=r"^Message.metadata\['conn'\]\['s'\]: socket is not"):
        Message.user("hi", metadata={"conn": {"s": a_socket}})


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"x": math.nan}, "Message.metadata['x']: nan cannot be serialized"),
        ({"x": [math.inf]}, "Message.metadata['x'][0]: inf cannot be serialized"),
        ({"x": {"y": -math.inf}}, "Message.metadata['x']['y']: -inf cannot be serialized"),
        ({"big": 2**64}, "Message.metadata['big']: 18446744073709551616 cannot be serialized"),
        ({"small": -(2**63) - 1}, "Message.metadata['small']: -9223372036854775809 cannot"),
        ({"s": "ok \ud800"}, "Message.metadata['s']: '\\ud800' at index 3 cannot be serialized"),
        ({"\udc80": 1}, "Message.metadata key: '\\udc80' at index 0 cannot be serialized"),
    ],
)
def test_values_no_log_format_can_carry_are_refused_with_a_value_error_naming_the_path(
    metadata: Any, where: str
) -> None:
    with pytest.raises(ValueError) as caught:
        Message.user("hi", metadata=metadata)
    assert str(caught.value).startswith(where)


def test_integers_at_the_64_bit_limits_are_accepted() -> None:
    message = Message.user("hi", metadata={"lo": -(2**63), "hi": 2**64 - 1})
    assert message.metadata == {"lo": -(2**63), "hi": 2**64 - 1}


def test_every_json_scalar_is_accepted() -> None:
    given = {"n": None, "t": True, "f": False, "i": -3, "x": 1.5, "s": "é ✓ 🙂", "l": [], "d": {}}
    assert Message.user("hi", metadata=given).metadata == given


def test_metadata_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(TypeError, match=re.escape("Message.metadata must be a mapping, got list")):
        Message.user("hi", metadata=[("a", 1)])  # type: ignore[arg-type]


def test_freeze_json_names_the_root_it_is_given() -> None:
    with pytest.raises(TypeError, match=r"^payload\[2\]: lock is not JSON-able"):
        freeze_json([1, 2, threading.Lock()], "payload")


# -- bad role and content types -----------------------------------------------------------------


@pytest.mark.parametrize("role", ["robot", "User", "", "function"])
def test_an_unknown_role_is_a_value_error_listing_the_roles(role: str) -> None:
    with pytest.raises(
        ValueError, match=re.escape("Message.role must be one of 'assistant', 'system'")
    ):
        Message(role, "hi")  # type: ignore[arg-type]


@pytest.mark.parametrize("role", [1, None, ["user"], b"user", UserString("user")])
def test_a_role_that_is_not_a_str_is_a_type_error(role: Any) -> None:
    with pytest.raises(TypeError, match=re.escape("Message.role must be a str, got")):
        Message(role, "hi")


@pytest.mark.parametrize("content", [None, 42, b"bytes", ["hi"], {"text": "hi"}])
def test_content_that_is_not_a_str_is_a_type_error(content: Any) -> None:
    with pytest.raises(
        TypeError, match=re.escape(f"Message.content must be a str, got {type(content).__name__}")
    ):
        Message.user(content)


def test_content_with_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("Message.content: '\\ud83d' at index 2 cannot")):
        Message.user("hi\ud83d")


@pytest.mark.parametrize("field", ["name", "tool_call_id", "id"])
def test_optional_text_fields_must_be_str_or_none(field: str) -> None:
    with pytest.raises(
        TypeError, match=re.escape(f"Message.{field} must be a str or None, got int")
    ):
        Message("user", "hi", **{field: 7})
    with pytest.raises(ValueError, match=re.escape(f"Message.{field}: ")):
        Message("user", "hi", **{field: "\udfff"})


def test_a_tool_call_needs_str_id_and_name() -> None:
    with pytest.raises(
        TypeError, match=re.escape("ToolCall.id and ToolCall.name must be str, got int and str")
    ):
        ToolCall(1, "ls")  # type: ignore[arg-type]


# -- serialized form ----------------------------------------------------------------------------


def test_to_dict_leaves_defaults_out_and_thaws_containers() -> None:
    message = Message.assistant(
        "ok", tool_calls=[ToolCall("c1", "read", {"p": ["a"]})], metadata={"k": {"v": 1}}
    )
    assert message.to_dict() == {
        "role": "assistant",
        "content": "ok",
        "metadata": {"k": {"v": 1}},
        "tool_calls": [{"id": "c1", "name": "read", "arguments": {"p": ["a"]}}],
    }
    assert message.to_dict() == msgspec.json.decode(msgspec.json.encode(message, enc_hook=enc_hook))


@pytest.mark.parametrize("module", [msgspec.json, msgspec.msgpack])
def test_a_message_round_trips_through_both_wire_formats(module: Any) -> None:
    message = Message.assistant(
        "done",
        tool_calls=[ToolCall("c1", "read", {"path": "a", "opts": [1, 2.5, None, True]})],
        name="bot",
        id="m-9",
        metadata={"nested": {"deep": [{"x": "é"}]}, "big": 2**64 - 1},
    )
    data = module.encode(message, enc_hook=enc_hook)
    assert module.decode(data, type=Message) == message


def test_decoding_validates_like_building() -> None:
    with pytest.raises(
        msgspec.ValidationError, match=re.escape("Message.metadata['x']: key 1 is int")
    ):
        msgspec.msgpack.decode(
            msgspec.msgpack.encode({"role": "user", "content": "hi", "metadata": {"x": {1: 2}}}),
            type=Message,
        )


# -- the quick walk and the careful walk agree -----------------------------------------------------

_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(), st.text(), st.sampled_from(["\ud800", "é", object(), b"x", (1, 2)]),
)
_trees = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 3)), inner, max_size=4),
    ),
    max_leaves=20,
)


def _outcome(build: Any) -> tuple[str, Any]:
    try:
        return "value", build()
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@given(st.dictionaries(st.text(max_size=3), _trees, max_size=4))
def test_metadata_decoded_or_given_gets_the_same_value_or_the_same_error_as_freeze_json(
    tree: dict[str, Any],
) -> None:
    # Message checks plain dicts and lists on a quick walk that keeps no path, and falls back to
    # freeze_json's careful walk for anything unusual: a user must not tell the two apart.
    kind, got = _outcome(lambda: Message.user("x", metadata=tree).metadata)
    expected_kind, expected = _outcome(lambda: freeze_json(tree, "Message.metadata"))
    assert kind == expected_kind
    if kind == "value":
        assert got == expected or not tree
    else:
        assert got == expected


_edges = st.sampled_from([
    2**30 - 1, 2**30, -(2**30 - 1), -(2**30), 2**63 - 1, -(2**63), 2**64 - 1, 2**64,
    -(2**63) - 1, float("inf"), float("nan"), -0.0,
])


def _shape(value: Any) -> Any:
    """A value down to the exact type of every part (== alone takes 1 for 1.0 or True)."""
    if isinstance(value, dict):
        return type(value).__name__, [(key, _shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return type(value).__name__, [_shape(item) for item in value]
    return type(value).__name__, repr(value)


@given(st.dictionaries(
    st.one_of(st.text(max_size=3), st.integers(0, 3)),
    st.one_of(_trees, _edges, st.lists(st.one_of(_leaves, _edges), max_size=4)),
    max_size=4,
))
# Every refusal of the inline walk, each once for certain (the search above meets them by chance).
@example({"a": [2**64]})
@example({"a": [-(2**63) - 1]})
@example({"a": 2**64})
@example({"a": -(2**63) - 1})
@example({"a": [float("nan")]})
@example({"a": float("inf")})
@example({"a": ["\ud800"]})
@example({"a": "\ud800"})
@example({"\ud800": 1})
@example({1: 1})
@example({"a": {1: 1}})
def test_tool_arguments_get_the_same_value_or_the_same_error_as_freeze_json(
    tree: dict[Any, Any],
) -> None:
    # ToolCall freezes a plain dict on a walk written out in __post_init__ (replay's hot path)
    # and falls back to freeze_json's careful walk for anything unusual: the same value, down
    # to each part's type, or the same error.
    kind, got = _outcome(lambda: ToolCall("c1", "f", tree).arguments)
    expected_kind, expected = _outcome(lambda: freeze_json(tree, "ToolCall.arguments"))
    assert kind == expected_kind
    if kind == "value":
        assert _shape(got) == _shape(expected) or not tree
    else:
        assert got == expected


def test_metadata_nested_past_the_limit_is_refused_on_the_quick_walk_too() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^Message.metadata\['k'\]\[0\].*nested 65 containers"):
        Message.user("x", metadata={"k": deep})


# -- blankness: decided once, when the message is built (ruling 4) --------------------------------

INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u180e"]


@pytest.mark.parametrize(
    "content",
    ["", " ", "\n\t ", "\u3000", *INVISIBLE, "\u200c\u200d", " \u200b\n\ufeff ", "\u2060\t\u200b"],
)
def test_a_message_of_whitespace_or_invisible_characters_only_is_blank(content: str) -> None:
    assert Message.user(content).blank
    assert Message.assistant(content).blank  # a reply that says nothing is degenerate


@pytest.mark.parametrize("content", ["go", "\u200bgo", "stop\ufeff", " \u200b.", "\x00", "é"])
def test_a_message_with_anything_visible_is_not_blank(content: str) -> None:
    assert not Message.user(content).blank


def test_a_message_with_tool_calls_is_never_blank() -> None:
    assert not Message.assistant("\u200b", tool_calls=[ToolCall("c1", "ls")]).blank


def test_blankness_is_kept_on_the_wire_only_when_true_and_an_old_log_reads_back_the_same() -> None:
    assert b"blank" not in msgspec.json.encode(Message.user("go"))
    assert msgspec.json.encode(Message.user("\u200b")).endswith(b',"blank":true}')
    written_before = b'{"role":"user","content":"\\u200b "}'  # no blank field: decided again
    assert msgspec.json.decode(written_before, type=Message) == Message.user("\u200b ")
    assert msgspec.json.decode(written_before, type=Message).blank


def test_blankness_follows_a_replaced_content() -> None:
    assert not msgspec.structs.replace(Message.user(" "), content="go").blank
    assert msgspec.structs.replace(Message.user("go"), content="\ufeff").blank


def test_blankness_is_decided_not_given() -> None:
    assert not Message.user("go", blank=True).blank
    assert Message.user(" ", blank=False).blank  # what a log written before the field holds
    assert Message.user("go", blank=True) == Message.user("go")


@given(st.text())
def test_blank_means_nothing_but_whitespace_and_format_characters(content: str) -> None:
    import unicodedata

    try:
        message = Message.user(content)
    except ValueError:  # a lone surrogate: refused before blankness matters
        return
    visible = [c for c in content if not c.isspace() and unicodedata.category(c) != "Cf"]
    assert message.blank is (not visible)


@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_forged_blank_field_in_a_log_changes_nothing(fmt: str) -> None:
    # A log is data from elsewhere: its "blank" field is read and then decided again, so a
    # record claiming a blank steer has words (or the reverse) cannot wake, extend or stay put.
    from nous_inbox import replay
    from nous_inbox.codec import decode_event
    from nous_inbox.events import MessageSent

    def sent(seq: int, content: str, blank: bool) -> bytes:
        body = {"type": "message_sent", "target": "next_step", "wakeup": True, "seq": seq,
                "message": {"role": "user", "content": content, "blank": blank}}
        return msgspec.json.encode(body) if fmt == "json" else msgspec.msgpack.encode(body)

    events = [decode_event(sent(1, "\u200b ", False), fmt), decode_event(sent(2, "go", True), fmt)]
    assert [e.message.blank for e in events if isinstance(e, MessageSent)] == [True, False]
    inbox = replay(events).inbox
    assert inbox.worth_waking() and not replay(events[:1]).inbox.worth_waking()
    assert events[0] == MessageSent(seq=1, target="next_step", wakeup=True,
                                    message=Message.user("\u200b "))
