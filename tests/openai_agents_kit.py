"""Scripted OpenAI Agents SDK agents for the tests: the SDK's own ``ScriptedModel`` answering
each call with a function of what the call showed, and what a call showed as (kind, text) pairs.

Every step is ``ModelStep.respond``, so a script never runs dry: ``reply(shown)`` decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from agents import Agent, FunctionTool, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

Seen = list[tuple[str, str]]


def pairs_of_input(items: Any) -> Seen:
    """What a model call showed, as (kind, text) pairs: user/system messages by role, a tool's
    result as ``tool``, the model's own text as ``text`` and its calls as ``call``."""
    out: Seen = []
    for item in items if isinstance(items, list) else [{"role": "user", "content": items}]:
        item = item if isinstance(item, dict) else item.model_dump(exclude_unset=True)
        kind = item.get("type")
        if kind == "function_call_output":
            out.append(("tool", str(item.get("output"))))
        elif kind == "function_call":
            out.append(("call", item["name"]))
        elif item.get("role") == "assistant":
            content = item.get("content")
            text = content if isinstance(content, str) else "".join(
                part.get("text", "") for part in content or ())
            if text:
                out.append(("text", text))
        elif "role" in item:
            content = item.get("content")
            out.append((item["role"], content if isinstance(content, str) else json.dumps(content)))
    return out


def reply_with(text: str, n: int, tool: str = "work") -> list[Any]:
    """A reply: ``"tool"`` calls ``tool`` with ``n`` (call id ``c{n}``), else the text."""
    if text == "tool":
        return [function_call(tool, {"n": n}, call_id=f"c{n}")]
    return [assistant_message(text)]


def scripted_agent(reply: Callable[[Seen, ModelCall], list[Any]], *,
                   tools: list[FunctionTool] | None = None, calls: int = 64,
                   **agent_kwargs: Any) -> Agent[Any]:
    """An agent whose model answers each call with ``reply(pairs shown, the call)``."""
    model = ScriptedModel([ModelStep.respond(lambda call: reply(pairs_of_input(call.input), call))]
                          * calls)
    return Agent("worker", model=model, tools=list(tools or ()), **agent_kwargs)


def tool(fn: Callable[..., Any]) -> FunctionTool:
    """``fn`` as the SDK's function tool."""
    return function_tool(fn)


def served_agent(session: str) -> Any:
    """A factory for ``nous-inbox serve --agent tests.openai_agents_kit:served_agent``: an Agents
    SDK agent that runs its tool once, then says what it heard last."""
    from nous_inbox.adapters.openai_agents import AgentRunner

    def survey() -> str:
        """Survey the logs."""
        return "3 errors"

    def reply(seen: Seen, call: ModelCall) -> list[Any]:
        if seen[-1][0] == "user":
            return reply_with("tool", len(seen), tool="survey")
        return [assistant_message(f"heard: {seen[-1][1]}")]

    return AgentRunner(scripted_agent(reply, tools=[tool(survey)]), tracing_disabled=True)
