"""A ``GraphRunner`` turn makes no thread hop the bare graph does not: LangSmith's bookkeeping
of the middleware's model call runs in place while nothing traces it, and only then."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any

import langsmith
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage

from nous_inbox.adapters.langgraph import GraphRunner, InboxMiddleware
from nous_inbox.runner.port import LocalSession
from tests.langgraph_kit import ScriptedChatModel, call


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting what is handed to a thread."""

    def __init__(self) -> None:
        super().__init__(2)
        self.handed = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        self.handed += 1
        return super().submit(fn, *args, **kwargs)


def _agent() -> Any:
    async def reply(messages: list[BaseMessage]) -> AIMessage:
        done = sum(1 for m in messages if m.type == "tool")
        return call("work", f"c{done}", n=done) if done < 3 else AIMessage("done")

    async def work(n: int) -> str:
        """Do a piece of work."""
        return f"result {n}"

    return create_agent(ScriptedChatModel(reply=reply), [work], middleware=[InboxMiddleware()])


def _handed(run: Callable[[Any], Any]) -> int:
    async def main() -> int:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        await run(_agent())
        return executor.handed

    return asyncio.run(main())


async def _turn(graph: Any) -> None:
    local = LocalSession()
    local.followup("go")
    async for _ in GraphRunner(graph, offload=False).arun_turn(local):
        pass


def test_a_turn_hands_nothing_to_a_thread_while_nothing_traces() -> None:
    assert _handed(_turn) == 0


def test_a_graph_run_by_hand_keeps_langsmiths_own_path() -> None:
    GraphRunner(_agent())  # the override is installed; it serves turns only

    async def by_hand(graph: Any) -> None:
        await graph.ainvoke({"messages": [("user", "go")]})

    assert _handed(by_hand) > 0


def test_an_applications_own_override_is_left_alone() -> None:
    seen: list[str] = []

    async def theirs(default: Any, ctx: Any, func: Any, /, *args: Any, **kwargs: Any) -> Any:
        seen.append("asked")
        return await default(ctx, func, *args, **kwargs)

    langsmith.set_runtime_overrides(aio_to_thread=theirs)
    try:
        asyncio.run(_turn(_agent()))  # a GraphRunner made now must not replace it
        assert seen
    finally:
        langsmith.set_runtime_overrides()
        GraphRunner(_agent())  # ours again, for the tests after this one
