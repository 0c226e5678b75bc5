"""One transcript, two spellings: ours (:class:`~nous_inbox.message.Message`) and the OpenAI Agents
SDK's (Responses API input items, and the model's ``ModelResponse``).

A turn's run starts from the session's transcript as the SDK's input list
(:func:`to_input_items`), and each reply of the model is kept as the assistant ``Message`` the
transcript records (:func:`from_model_response`), so a replay of the log gives back what the
model was shown. A tool's result is recorded from the ``function_call_output`` item the SDK
shows the model (:func:`tool_outputs`): the words the model saw, not the tool's raw value.

>>> [item.get("type", item.get("role")) for item in to_input_items(
...     [Message.user("hi"), Message.assistant("hello")])]
['user', 'assistant']
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from agents.items import ModelResponse
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

from nous_inbox.message import Message, ToolCall

__all__ = ["as_input_item", "from_model_response", "to_input_items", "tool_outputs"]


def to_input_items(transcript: Iterable[Message]) -> list[dict[str, Any]]:
    """Our transcript as the SDK's input list: what a new run starts from.

    An assistant entry is its text (if any) then one ``function_call`` item per tool call; a tool
    entry is the ``function_call_output`` that answers its call.

    >>> items = to_input_items([
    ...     Message.user("list files"),
    ...     Message.assistant(tool_calls=[ToolCall("c1", "ls", {"d": "."})]),
    ...     Message.tool("a.txt", "c1", name="ls"),
    ... ])
    >>> [(item.get("type") or item["role"]) for item in items]
    ['user', 'function_call', 'function_call_output']
    >>> items[1]["arguments"]
    '{"d":"."}'
    """
    items: list[dict[str, Any]] = []
    for message in transcript:
        if message.role == "assistant":
            if message.content:
                items.append({"role": "assistant", "content": message.content})
            items.extend(
                {"type": "function_call", "call_id": call.id, "name": call.name,
                 "arguments": json.dumps(call.arguments, separators=(",", ":"))}
                for call in message.tool_calls)
        else:
            items.append(as_input_item(message))
    return items


def as_input_item(message: Message) -> dict[str, Any]:
    """One of our messages (not an assistant's) as the input item that carries it: a tool
    result answers its call; a system or user message is a message of that role.

    >>> as_input_item(Message.user("skip the slow tests"))
    {'role': 'user', 'content': 'skip the slow tests'}
    """
    if message.role == "tool":
        return {"type": "function_call_output", "call_id": message.tool_call_id or "",
                "output": message.content}
    return {"role": message.role, "content": message.content}


def from_model_response(response: ModelResponse) -> Message:
    """The SDK's model response as the assistant ``Message`` the transcript keeps.

    The text of its output messages is joined; each function call (a tool's, or a handoff's)
    keeps its call id, name and arguments (arguments that are not a JSON object are kept under
    ``"arguments"``). Other items (reasoning, hosted tools) are not part of what a later turn
    shows the model as text.

    >>> from agents.testing import assistant_message, function_call
    >>> from agents.usage import Usage
    >>> from_model_response(ModelResponse(output=[assistant_message("looking"),
    ...     function_call("ls", {"d": "."}, call_id="c1")], usage=Usage(), response_id=None))
    Message(role='assistant', content='looking', tool_calls=(ToolCall(id='c1', name='ls', arguments={'d': '.'}),))
    """
    text: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output:
        if isinstance(item, ResponseOutputMessage):
            text.extend(getattr(part, "text", "") for part in item.content)
        elif isinstance(item, ResponseFunctionToolCall):
            calls.append(ToolCall(item.call_id, item.name, _arguments(item.arguments)))
    return Message.assistant("".join(text), calls)


def _arguments(raw: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {"arguments": raw}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}


def tool_outputs(items: Sequence[Any]) -> dict[str, str]:
    """The tool results among input ``items`` (``function_call_output``), by call id, as the
    text the model is shown (an output that is not text, as its JSON).

    >>> tool_outputs([{"type": "function_call_output", "call_id": "c1", "output": "3 failed"}])
    {'c1': '3 failed'}
    """
    found: dict[str, str] = {}
    for item in items:
        if not isinstance(item, dict) or item.get("type") != "function_call_output":
            continue
        output = item.get("output")
        found[str(item.get("call_id"))] = output if isinstance(output, str) else json.dumps(
            output, default=str)
    return found
