"""The LangGraph adapter's runs: what a prompt gives its run, a run stopped inside a tool, a
graph that waits for a person (``interrupt()``), and a PostgreSQL checkpointer.

Offline, with the scripted chat model of tests/langgraph_kit.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.config import get_config
from langgraph.runtime import get_runtime

from nous_inbox.adapters.langgraph import GraphRunner, InboxMiddleware
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.store import open_store
from tests.helpers import WAIT
from tests.langgraph_kit import ScriptedChatModel

FACES = ("async", "threaded")


def test_a_prompts_context_and_config_reach_its_run_and_only_its_run() -> None:
    seen: list[tuple[Any, Any, Any]] = []

    def reply(messages: list[BaseMessage]) -> AIMessage:
        config = get_config()
        seen.append((get_runtime().context, config["configurable"].get("user_id"),
                     config["metadata"].get("team")))
        return AIMessage("ok")

    graph = create_agent(ScriptedChatModel(reply=reply), middleware=[InboxMiddleware()])
    runner = GraphRunner(graph, context={"user": "default"},
                         config={"configurable": {"user_id": 0}, "metadata": {"team": "core"}})

    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", runner) as owner:
            await owner.prompt("one", context={"user": "ada"},
                               config={"configurable": {"user_id": 7}})
            await owner.prompt("two")
    asyncio.run(main())
    assert seen == [({"user": "ada"}, 7, "core"), ({"user": "default"}, 0, "core")]


@pytest.mark.parametrize("face", FACES)
def test_options_a_graph_run_does_not_take_are_refused_before_anything_is_written(
        face: str) -> None:
    graph = create_agent(ScriptedChatModel(reply=lambda m: AIMessage("ok")),
                         middleware=[InboxMiddleware()])
    store = open_store("memory:")
    if face == "threaded":
        with Owner(store, "s", GraphRunner(graph)) as owner:
            with pytest.raises(TypeError, match="not deps"):
                owner.prompt("go", deps=1)
            with pytest.raises(TypeError, match="thread_id"):
                owner.prompt("go", config={"configurable": {"thread_id": "other"}})
            assert owner.wait_idle(WAIT)
    else:
        async def main() -> None:
            async with AsyncOwner(store, "s", GraphRunner(graph)) as owner:
                with pytest.raises(TypeError, match="checkpoint_id"):
                    await owner.prompt("go", config={"configurable": {"checkpoint_id": "x"}})
        asyncio.run(main())
    assert list(store.read("s")) == []
