"""One transcript, two spellings: ours (:class:`~nous_inbox.message.Message`) and LangChain's
(``HumanMessage``, ``AIMessage``, ``ToolMessage``, ``SystemMessage``).

A graph's ``messages`` state is the conversation the model is shown; a turn gives the graph the
messages the inbox claimed (:func:`to_lc_messages`) and keeps each of the model's replies and
each tool's answer as the ``Message`` the log records (:func:`from_lc_message`), so a replay of
the log gives back what the model was shown, and :func:`same_as_shown` tells whether a graph's
checkpoint holds that same conversation.

>>> [type(m).__name__ for m in to_lc_messages([Message.user("hi"), Message.assistant("hello")])]
['HumanMessage', 'AIMessage']
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from nous_inbox.message import Message, ToolCall

__all__ = ["from_lc_message", "same_as_shown", "to_lc_message", "to_lc_messages"]


def to_lc_messages(transcript: Iterable[Message]) -> list[BaseMessage]:
    """Our messages as LangChain's, each with an id of its own (so a graph's ``add_messages``
    appends it, and the adapter knows it for one it has recorded).

    >>> from nous_inbox.message import ToolCall
    >>> [(type(m).__name__, m.text) for m in to_lc_messages([
    ...     Message.user("list files"),
    ...     Message.assistant(tool_calls=[ToolCall("c1", "ls", {})]),
    ...     Message.tool("a.txt", "c1", name="ls"),
    ... ])]
    [('HumanMessage', 'list files'), ('AIMessage', ''), ('ToolMessage', 'a.txt')]
    """
    return [to_lc_message(message) for message in transcript]


def to_lc_message(message: Message) -> BaseMessage:
    """One of our messages as the LangChain message that carries it to the model."""
    mid = uuid.uuid4().hex
    if message.role == "assistant":
        calls: list[Any] = [{"name": c.name, "args": dict(c.arguments), "id": c.id,
                             "type": "tool_call"} for c in message.tool_calls]
        return AIMessage(content=message.content, tool_calls=calls, id=mid)
    if message.role == "tool":
        error = isinstance(message.metadata, dict) and "error" in message.metadata
        return ToolMessage(content=message.content, tool_call_id=message.tool_call_id or "",
                           name=message.name, id=mid, status="error" if error else "success")
    if message.role == "system":
        return SystemMessage(content=message.content, id=mid)
    return HumanMessage(content=message.content, id=mid)


def from_lc_message(message: BaseMessage) -> Message:
    """A LangChain message as the ``Message`` the transcript keeps: its text (content blocks
    other than text are not part of what a later request shows as text) and, for a reply, each
    tool call with its id, name and arguments.

    >>> from_lc_message(AIMessage("looking", tool_calls=[{"name": "ls", "args": {"d": "."}, "id": "c1"}]))
    Message(role='assistant', content='looking', tool_calls=(ToolCall(id='c1', name='ls', arguments={'d': '.'}),))
    """
    text = str(message.text)  # a str subclass of LangChain's; ours are plain
    if isinstance(message, AIMessage):
        calls = [ToolCall(call.get("id") or "", call["name"], dict(call.get("args") or {}))
                 for call in message.tool_calls]
        return Message.assistant(text, calls)
    if isinstance(message, ToolMessage):
        return Message.tool(text, message.tool_call_id, name=message.name)
    if isinstance(message, SystemMessage):
        return Message.system(text)
    return Message.user(text)


def _shown(message: Message) -> tuple[object, ...]:
    return (message.role, message.content, message.tool_call_id or "",
            tuple((c.id, c.name, c.arguments) for c in message.tool_calls))


def same_as_shown(held: Sequence[BaseMessage], transcript: Sequence[Message]) -> bool:
    """Whether a graph's ``messages`` show the model what ``transcript`` shows it: the same
    roles, words, tool calls and answers, in order (ids, names and metadata aside).

    >>> same_as_shown(to_lc_messages([Message.user("hi")]), [Message.user("hi")])
    True
    >>> same_as_shown(to_lc_messages([Message.user("hi")]), [])
    False
    """
    return len(held) == len(transcript) and all(
        _shown(from_lc_message(h)) == _shown(t) for h, t in zip(held, transcript, strict=True))
