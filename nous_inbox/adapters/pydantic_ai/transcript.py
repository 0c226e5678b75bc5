"""One transcript, two spellings: ours (:class:`~nous_inbox.message.Message`) and pydantic-ai's
(``ModelRequest``, ``ModelResponse``).

A turn's run continues from the session's transcript as pydantic-ai's message history
(:func:`to_model_messages`), and each reply of the model is kept as the assistant ``Message`` the
transcript records (:func:`from_model_response`), so a replay of the log gives back what the model
was shown. The request parts the run hooks read and add are spelled here too.

>>> [type(m).__name__ for m in to_model_messages([Message.user("hi"), Message.assistant("hello")])]
['ModelRequest', 'ModelResponse']
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from nous_inbox.message import Message, ToolCall

__all__ = ["as_request_part", "from_model_response", "to_model_messages", "trailing_parts"]


def to_model_messages(transcript: Iterable[Message]) -> list[ModelMessage]:
    """Our transcript as pydantic-ai's message history: what a new run continues from.

    Consecutive user, system and tool entries make one ``ModelRequest`` (as pydantic-ai builds
    them: tool results, then what joined them); an assistant entry is one ``ModelResponse``.

    >>> from nous_inbox.message import ToolCall
    >>> history = to_model_messages([
    ...     Message.user("list files"),
    ...     Message.assistant(tool_calls=[ToolCall("c1", "ls", {})]),
    ...     Message.tool("a.txt", "c1", name="ls"),
    ...     Message.user("only text files"),
    ... ])
    >>> [(type(m).__name__, [p.part_kind for p in m.parts]) for m in history]
    [('ModelRequest', ['user-prompt']), ('ModelResponse', ['tool-call']), ('ModelRequest', ['tool-return', 'user-prompt'])]
    """
    history: list[ModelMessage] = []
    parts: list[ModelRequestPart] = []
    for message in transcript:
        if message.role == "assistant":
            if parts:
                history.append(ModelRequest(parts=parts))
                parts = []
            history.append(_as_response(message))
        else:
            parts.append(as_request_part(message))
    if parts:
        history.append(ModelRequest(parts=parts))
    return history


def as_request_part(message: Message) -> ModelRequestPart:
    """One of our messages (not an assistant's) as the part of a pydantic-ai request that carries
    it: a system prompt, a tool return, or else a user prompt.

    >>> as_request_part(Message.tool("a.txt", "c1", name="ls")).part_kind
    'tool-return'
    """
    if message.role == "system":
        return SystemPromptPart(content=message.content)
    if message.role == "tool":
        return ToolReturnPart(
            tool_name=message.name or "", content=message.content,
            tool_call_id=message.tool_call_id or "",
        )
    return UserPromptPart(content=message.content)


def _as_response(message: Message) -> ModelResponse:
    parts: list[Any] = [TextPart(content=message.content)] if message.content else []
    parts.extend(
        ToolCallPart(tool_name=call.name, args=dict(call.arguments), tool_call_id=call.id)
        for call in message.tool_calls
    )
    return ModelResponse(parts=parts)


def from_model_response(response: ModelResponse) -> Message:
    """A pydantic-ai response as the assistant ``Message`` the transcript keeps.

    Text parts are joined; each tool call keeps its id, name and arguments. Other parts (thinking,
    files, native tool calls) are not part of what a later request shows the model as text.

    >>> from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    >>> from_model_response(ModelResponse(parts=[TextPart("looking"), ToolCallPart("ls", {"d": "."}, "c1")]))
    Message(role='assistant', content='looking', tool_calls=(ToolCall(id='c1', name='ls', arguments={'d': '.'}),))
    """
    text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
    calls = [
        ToolCall(p.tool_call_id, p.tool_name, p.args_as_dict())
        for p in response.parts
        if isinstance(p, ToolCallPart)
    ]
    return Message.assistant(text, calls)


def trailing_parts(messages: Sequence[ModelMessage]) -> list[ModelRequestPart]:
    """The parts of the requests after the last response: what the next request shows anew
    (pydantic-ai may keep them as several requests: an output tool's return, then what joined).

    >>> from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    >>> history = [ModelRequest(parts=[UserPromptPart("hi")]), ModelResponse(parts=[TextPart("ok")]),
    ...            ModelRequest(parts=[UserPromptPart("and now?")])]
    >>> [part.content for part in trailing_parts(history)]
    ['and now?']
    """
    parts: list[ModelRequestPart] = []
    for message in reversed(messages):
        if isinstance(message, ModelResponse):
            break
        parts[:0] = message.parts
    return parts
