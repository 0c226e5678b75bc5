"""A session's history as pydantic-ai's, converted once: each turn converts only what followed
the last answer, and the history is always the whole transcript's."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from hypothesis import given
from hypothesis import strategies as st

from nous_inbox.adapters.pydantic_ai.transcript import History, to_model_messages
from nous_inbox.message import Message, ToolCall


def spelled(history: list[Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """A history as what it says (pydantic-ai's messages carry timestamps of their making)."""
    return [(type(m).__name__, [(p.part_kind, str(getattr(p, "content", None) or getattr(p, "tool_name", "")))
                                for p in m.parts]) for m in history]


messages = st.one_of(
    st.builds(Message.user, st.text(min_size=1, max_size=5)),
    st.builds(Message.system, st.text(min_size=1, max_size=5)),
    st.builds(lambda text: Message.assistant(text), st.text(max_size=5)),
    st.builds(lambda n: Message.assistant(tool_calls=[ToolCall(f"c{n}", "ls", {})]), st.integers(0, 9)),
    st.builds(lambda n: Message.tool("out", f"c{n}", name="ls"), st.integers(0, 9)),
)


@given(st.lists(st.tuples(st.lists(messages, max_size=6), st.booleans()), max_size=8))
def test_every_turn_sees_the_whole_transcript_as_a_fresh_conversion_would(
        turns: list[tuple[list[Message], bool]]) -> None:
    history = History()
    transcript: list[Message] = []
    for added, another_session in turns:
        transcript = list(added) if another_session else [*transcript, *added]
        converted, fresh = history.of(transcript)
        assert spelled(converted) == spelled(to_model_messages(transcript))
        assert all(type(m).__name__ == "ModelRequest" for m in converted[fresh:])
        answers = [i for i, m in enumerate(converted) if type(m).__name__ == "ModelResponse"]
        assert fresh == (answers[-1] + 1 if answers else 0)


def test_a_next_turn_reuses_what_was_converted() -> None:
    history = History()
    first = [Message.user("survey the logs"), Message.assistant("done")]
    converted, _ = history.of(first)
    again, fresh = history.of([*first, Message.user("which was worst?")])
    assert again[0] is converted[0] and again[1] is converted[1]
    assert fresh == 2


def test_a_transcript_equal_but_not_the_same_is_converted_whole() -> None:
    history = History()
    converted, _ = history.of([Message.user("hi"), Message.assistant("hello")])
    again, _ = history.of([Message.user("hi"), Message.assistant("hello")])
    assert spelled(again) == spelled(converted) and again[0] is not converted[0]
