"""A scripted LangChain chat model for the LangGraph adapter's tests: no network.

``ScriptedChatModel(reply)`` calls ``reply(messages)`` for every model call, with the messages
the model is shown, and answers with the ``AIMessage`` it returns (tool calls included).
``bind_tools`` keeps the model as it is: the script decides which tools it calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

Seen = list[tuple[str, str]]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose every reply is ``reply(messages)``."""

    reply: Callable[[list[BaseMessage]], Any]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.reply(messages))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        answer = self.reply(messages)
        if hasattr(answer, "__await__"):
            answer = await answer
        return ChatResult(generations=[ChatGeneration(message=answer)])


def call(name: str, call_id: str, **args: Any) -> AIMessage:
    """A reply that calls one tool."""
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id,
                                      "type": "tool_call"}])


def shown(messages: Sequence[BaseMessage]) -> Seen:
    """What a request showed the model, as (kind, text) pairs, read off LangChain's messages."""
    out: Seen = []
    for m in messages:
        if isinstance(m, AIMessage):
            if m.text:
                out.append(("text", m.text))
            out.extend(("call", c["name"]) for c in m.tool_calls)
        elif isinstance(m, ToolMessage):
            out.append(("tool", m.text))
        elif isinstance(m, SystemMessage):
            out.append(("system", m.text))
        elif isinstance(m, HumanMessage):
            out.append(("user", m.text))
    return out


def agent(session: str) -> Any:
    """A ``serve --agent tests.langgraph_kit:agent`` factory: a ``create_agent`` graph with the
    inbox's middleware over a model that answers each request with what it was last told."""
    from langchain.agents import create_agent

    from nous_inbox.adapters.langgraph import GraphRunner, InboxMiddleware

    def reply(messages: list[BaseMessage]) -> AIMessage:
        return AIMessage(f"{session} heard {messages[-1].text}")

    return GraphRunner(create_agent(ScriptedChatModel(reply=reply),
                                    middleware=[InboxMiddleware()]))
