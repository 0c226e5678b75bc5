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
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_config
from langgraph.runtime import get_runtime
from langgraph.types import interrupt

from nous_inbox import Message, replay
from nous_inbox.adapters.langgraph import GraphRunner, InboxMiddleware, from_lc_message
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner.port import LocalSession
from nous_inbox.store import open_store
from tests.helpers import WAIT, async_wait_until
from tests.langgraph_kit import ScriptedChatModel, Seen, call, shown

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


class Graph:
    """A ``create_agent`` graph with the inbox over a scripted model (``replies``: a reply or a
    list of tool calls, each ``(name, id)``) and a checkpointer; ``requests`` keeps what each
    request showed, ``ran`` the tools that ran."""

    def __init__(self, replies: list[Any], tools: list[Any]) -> None:
        self.replies = replies
        self.requests: list[Seen] = []
        self.sent: list[list[BaseMessage]] = []
        self.graph = create_agent(ScriptedChatModel(reply=self.reply), tools,
                                  middleware=[InboxMiddleware()], checkpointer=InMemorySaver())
        self.runner = GraphRunner(self.graph, offload=False)
        self.local = LocalSession()
        self.config = {"configurable": {"thread_id": self.runner.thread_of(self.local)}}

    def reply(self, messages: list[BaseMessage]) -> AIMessage:
        self.requests.append(shown(messages))
        self.sent.append(list(messages))
        n = len(self.requests) - 1
        answer = self.replies[n] if n < len(self.replies) else "done"
        if isinstance(answer, str):
            return AIMessage(answer)
        return AIMessage("", tool_calls=[{"name": name, "args": {}, "id": cid,
                                          "type": "tool_call"} for name, cid in answer])

    def turn(self, text: str) -> list[Any]:
        self.local.followup(text)

        async def go() -> list[Any]:
            return [e async for e in self.runner.arun_turn(self.local)]
        return asyncio.run(go())

    def held(self) -> list[Message]:
        return [from_lc_message(m) for m in self.graph.get_state(self.config).values["messages"]]

    def logged(self) -> list[Message]:
        return [Message(m.role, m.content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id,
                        name=m.name) for m in replay(self.local.events).transcript]


def test_a_run_stopped_inside_a_tool_leaves_the_next_turn_clean() -> None:
    ran: list[str] = []

    def fast() -> str:
        """Answer at once."""
        ran.append("fast")
        return "fast answer"

    async def slow() -> str:
        """Take forever."""
        ran.append("slow")
        # The fast tool's answer is in the checkpoint (its pending write) before the stop.
        await async_wait_until(lambda: any(t.result for t in g.graph.get_state(g.config).tasks),
                               what="the fast tool's write in the checkpoint")
        await asyncio.Event().wait()
        return "never"

    g = Graph([[("fast", "c1"), ("slow", "c2")], "first answer", "second answer"], [fast, slow])
    g.local.followup("go")

    async def stopped() -> None:
        run = asyncio.ensure_future(_drain(g.runner.arun_turn(g.local)))
        await async_wait_until(lambda: "slow" in ran, what="the slow tool running")
        await async_wait_until(lambda: any(t.result for t in g.graph.get_state(g.config).tasks),
                               what="the fast tool done")
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    asyncio.run(stopped())
    assert g.graph.get_state(g.config).next == ("tools",)  # the slow call, pending in LangGraph
    kept = g.logged()
    assert [(m.role, m.content[:12]) for m in kept[-2:]] == [
        ("tool", "fast answer"), ("tool", "interrupted:")]  # the result that ran is kept
    first_ids = [m.id for m in g.sent[0]]
    g.turn("next")
    assert sorted(ran) == ["fast", "slow"]  # the stopped run's tasks are not run again
    assert g.requests[1] == [("user", "go"), ("call", "fast"), ("call", "slow"),
                             ("tool", "fast answer"), ("tool", kept[-1].content), ("user", "next")]
    assert [m.id for m in g.sent[1][:len(first_ids)]] == first_ids  # the thread kept, not rewritten
    assert g.graph.get_state(g.config).next == ()
    assert g.held() == g.logged()


async def _drain(events: Any) -> None:
    async for _ in events:
        pass


def test_a_graph_stopped_at_its_own_interrupt_ends_the_turn_waiting_with_its_value() -> None:
    ran: list[Any] = []

    def deploy() -> str:
        """Deploy, once a person approves."""
        ran.append(interrupt({"question": "deploy to production?"}))
        return "deployed"

    g = Graph([[("deploy", "c1")], "it waits for you", "understood"], [deploy])
    events = g.turn("ship it")
    assert events[-1].reason == "final" and events[-1].error is None
    waiting = g.logged()[-1]
    assert waiting.role == "tool" and waiting.tool_call_id == "c1"
    assert waiting.content.startswith("waiting: the graph stopped for a person")
    assert "deploy to production?" in waiting.content
    g.turn("yes, go ahead")  # the next prompt answers, from the log: the graph starts afresh
    assert g.requests[1][-2:] == [("tool", waiting.content), ("user", "yes, go ahead")]
    assert ran == []  # the waiting tool was not resumed
    assert g.graph.get_state(g.config).next == ()
    assert g.held() == g.logged()


def test_a_steer_waiting_when_the_graph_stops_at_its_interrupt_goes_on_with_the_run() -> None:
    g: Graph

    def deploy() -> str:
        """Deploy, once a person approves."""
        g.local.steer("actually, deploy to staging")
        return str(interrupt("deploy to production?"))

    g = Graph([[("deploy", "c1")], "staging it is"], [deploy])
    events = g.turn("ship it")
    assert g.requests[1][-1] == ("user", "actually, deploy to staging")
    assert events[-1].reason == "final" and g.logged()[-1].content == "staging it is"
    assert g.held() == g.logged()


def _checkpoint_url(postgres_url: str) -> str:
    """The test's schema, as a libpq URL the checkpointer connects to (it searches there)."""
    import psycopg

    base, _, schema = postgres_url.rpartition("schema=")
    base = base.rstrip("?&")
    with psycopg.connect(base, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    return f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"


def test_a_postgres_checkpoint_and_the_log_hold_one_conversation_across_a_restart(
        postgres_url: str) -> None:
    pytest.importorskip("langgraph.checkpoint.postgres")
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    checkpoints = _checkpoint_url(postgres_url)
    requests: list[Seen] = []
    sent: list[list[BaseMessage]] = []
    steered: list[bool] = []

    def reply(messages: list[BaseMessage]) -> AIMessage:
        requests.append(shown(messages))
        sent.append(list(messages))
        return call("work", f"c{len(requests)}") if len(requests) == 1 else AIMessage(
            f"answer {len(requests)}")

    async def session(text: str) -> None:
        async with AsyncPostgresSaver.from_conn_string(checkpoints) as saver:
            await saver.setup()
            holder: dict[str, AsyncOwner] = {}

            async def work() -> str:
                """Do a piece of work."""
                if not steered:
                    steered.append(True)
                    await holder["owner"].steer("and check b.py")
                return "result"

            graph = create_agent(ScriptedChatModel(reply=reply), [work],
                                 middleware=[InboxMiddleware()], checkpointer=saver)
            async with AsyncOwner(open_store(postgres_url), "s", GraphRunner(graph)) as owner:
                holder["owner"] = owner
                await owner.prompt(text)
                logged = [(m.role, m.content, m.tool_call_id) for m in owner.transcript]
            held = await graph.aget_state({"configurable": {"thread_id": "s"}})
            assert [(m.role, m.content, m.tool_call_id) for m in
                    (from_lc_message(m) for m in held.values["messages"])] == logged

    asyncio.run(session("one"))
    assert requests[1][-2:] == [("tool", "result"), ("user", "and check b.py")]
    first = [m.id for m in sent[-1]]
    asyncio.run(session("two"))  # a new process: a new owner, a new saver on the same server
    assert requests[-1][-2:] == [("text", "answer 2"), ("user", "two")]
    assert [m.id for m in sent[-1][:len(first)]] == first  # the thread kept, not rewritten


def test_langchains_human_in_the_loop_middleware_ends_the_turn_waiting_for_approval() -> None:
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    ran: list[str] = []

    def deploy() -> str:
        """Deploy."""
        ran.append("deploy")
        return "deployed"

    g = Graph([[("deploy", "c1")], "not deployed: approve it first"], [deploy])
    g.graph = create_agent(ScriptedChatModel(reply=g.reply), [deploy],
                           middleware=[InboxMiddleware(),
                                       HumanInTheLoopMiddleware(interrupt_on={"deploy": True})],
                           checkpointer=InMemorySaver())
    g.runner = GraphRunner(g.graph, offload=False)
    events = g.turn("ship it")
    assert events[-1].reason == "final" and ran == []
    assert g.logged()[-1].content.startswith("waiting: the graph stopped for a person")
    g.turn("no, wait")
    assert ran == [] and g.held() == g.logged()
