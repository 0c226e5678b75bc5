"""Real aimu agents, offline: a scripted model client and the pieces of aimu a test drives.

A ``Client`` answers from a script and records every request it was sent (``requests``); a reply
that is a callable runs while the model "thinks" (a person typing while it composes its answer),
a ``list`` of calls asks for tools, an exception fails the request. Needs the optional ``aimu``
extra: :func:`aimu_kit` skips the test without it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import pytest

Reply = str | list[dict[str, Any]] | Exception | Callable[[], Any]


def _build() -> SimpleNamespace:
    from aimu.agents import Agent
    from aimu.agents.inbox import Inbox as AimuProtocol
    from aimu.aio import Agent as AsyncAgent
    from aimu.aio._base import AsyncBaseModelClient
    from aimu.models.base import (
        AdHocModel,
        BaseModelClient,
        ModelSpec,
        StreamChunk,
        StreamingContentType,
    )
    from aimu.tools import tool

    def answer(client: Any, stream: bool) -> Any:
        client.requests.append(copy.deepcopy(client.messages))
        reply = client.script.pop(0)
        while callable(reply):  # something that happens while the model "thinks"
            reply = reply()
        if isinstance(reply, Exception):
            raise reply
        if isinstance(reply, list):
            client._record_tool_calls([dict(call) for call in reply])
            text = ""
        else:
            client._append_message({"role": "assistant", "content": reply})
            text = reply
        if stream:
            return [StreamChunk(StreamingContentType.GENERATING, text)] if text else []
        return text

    class ScriptedClient(BaseModelClient):
        """A model that answers from ``script`` and records every request, offline."""

        def __init__(self, script: Iterable[Reply]) -> None:
            super().__init__(AdHocModel(ModelSpec(id="scripted", tools=True)))
            self.script = list(script)
            self.requests: list[list[dict[str, Any]]] = []

        def _generate(self, prompt: str, *args: Any, **kwargs: Any) -> str:
            raise NotImplementedError("the agent loop only chats")

        def _chat(
            self,
            user_message: str | None = None,
            generate_kwargs: dict[str, Any] | None = None,
            use_tools: bool = True,
            stream: bool = False,
            images: list[Any] | None = None,
            audio: list[Any] | None = None,
            response_format: dict[str, Any] | None = None,
        ) -> Any:
            self._chat_setup(user_message, generate_kwargs, use_tools, images=images, audio=audio)
            result = answer(self, stream)
            return iter(result) if stream else result

    class AsyncScriptedClient(AsyncBaseModelClient):
        """The same, for aimu's asyncio surface."""

        def __init__(self, script: Iterable[Reply]) -> None:
            super().__init__(AdHocModel(ModelSpec(id="scripted", tools=True)))
            self.script = list(script)
            self.requests: list[list[dict[str, Any]]] = []

        async def _generate(self, prompt: str, *args: Any, **kwargs: Any) -> str:
            raise NotImplementedError("the agent loop only chats")

        async def _chat(
            self,
            user_message: str | None = None,
            generate_kwargs: dict[str, Any] | None = None,
            use_tools: bool = True,
            stream: bool = False,
            images: list[Any] | None = None,
            audio: list[Any] | None = None,
            response_format: dict[str, Any] | None = None,
        ) -> Any:
            await self._chat_setup(user_message, generate_kwargs, use_tools, images=images, audio=audio)
            return answer(self, stream=False)

    return SimpleNamespace(
        Agent=Agent,
        AsyncAgent=AsyncAgent,
        Client=ScriptedClient,
        AsyncClient=AsyncScriptedClient,
        Protocol=AimuProtocol,
        tool=tool,
    )


_KIT: list[SimpleNamespace] = []


def aimu_kit() -> SimpleNamespace:
    """aimu's ``Agent`` and ``AsyncAgent``, the scripted ``Client`` and ``AsyncClient``, its
    ``Inbox`` protocol and ``tool`` decorator; skips the test when aimu is not installed."""
    pytest.importorskip("aimu.agents")
    if not _KIT:
        _KIT.append(_build())
    return _KIT[0]


def call(name: str, **arguments: Any) -> list[dict[str, Any]]:
    """A model reply asking for one tool call."""
    return [{"name": name, "arguments": arguments}]


def said(request: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """A request as (role, text) pairs: what the model was shown."""
    return [(m["role"], m.get("content") or "") for m in request]
