"""The inbox behind a real LangGraph agent: steer a graph's run, durably, from anywhere.

Offline, with a scripted LangChain chat model (tests/langgraph_kit.py): each test scripts the
replies and keeps every request the model was shown. Mid-run sends are made by a tool while it
runs, which is "a person typed while the agent was working" and needs no sleeps.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain")

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.chat_agent_executor import create_react_agent

from nous_inbox import Message, ToolCall, replay
from nous_inbox.adapters.langgraph import (
    GraphRunner,
    InboxMiddleware,
    after_model_node,
    before_model_node,
    from_lc_message,
    post_model_hook,
    route_after_model,
    to_lc_messages,
)
from nous_inbox.events import ModelReplied, ModelRequested, TurnEnded
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.runner.port import LocalSession
from nous_inbox.store import open_store
from nous_inbox.web.host import SessionHost
from nous_inbox.web.serve import load_agent
from tests.helpers import WAIT, async_wait_until
from tests.langgraph_kit import ScriptedChatModel, Seen, call, shown

ROOT = Path(__file__).resolve().parent.parent


class Script:
    """Replies in order ("tool" calls the tool ``work``, any other string is the text);
    ``requests`` keeps what each request showed, ``sent`` the LangChain messages themselves."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.requests: list[Seen] = []
        self.sent: list[list[BaseMessage]] = []
        self.during: dict[int, Callable[[], object]] = {}

    def reply(self, messages: list[BaseMessage]) -> AIMessage:
        n = len(self.requests)
        self.requests.append(shown(messages))
        self.sent.append(list(messages))
        text = self.replies[n] if n < len(self.replies) else "done"
        return call("work", f"c{n}", n=n) if text == "tool" else AIMessage(text)

    def model(self) -> ScriptedChatModel:
        return ScriptedChatModel(reply=self.reply)


def agent_of(script: Script, work: Callable[..., Any], **options: Any) -> Any:
    return create_agent(script.model(), [work], middleware=[InboxMiddleware()], **options)


def turn(runner: GraphRunner, local: LocalSession, **options: Any) -> list[Any]:
    async def go() -> list[Any]:
        return [e async for e in runner.arun_turn(local, **options)]
    return asyncio.run(go())


def test_a_steer_sent_during_a_tool_call_joins_the_next_request_after_the_tools_result() -> None:
    script = Script("tool", "done")
    local = LocalSession()

    def work(n: int) -> str:
        """Do a piece of work."""
        local.steer("check b.py too")
        return f"result {n}"

    local.followup("fix a.py")
    turn(GraphRunner(agent_of(script, work), offload=False), local)
    assert ("user", "check b.py too") not in script.requests[0]
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "check b.py too")]


def test_the_replayed_transcript_is_what_the_model_was_shown_and_what_the_checkpoint_holds() -> None:
    script = Script("tool", "answer", "summary")
    local = LocalSession()
    saver = InMemorySaver()

    def work(n: int) -> str:
        """Do a piece of work."""
        local.steer("and summarize")
        return f"result {n}"

    graph = agent_of(script, work, checkpointer=saver)
    runner = GraphRunner(graph, offload=False)
    local.followup("go")
    turn(runner, local)
    transcript = replay(local.events).transcript
    last = [from_lc_message(m) for m in script.sent[-1]]
    assert [(m.role, m.content) for m in last] == [(m.role, m.content) for m in transcript[:-1]]
    held = graph.get_state({"configurable": {"thread_id": runner.thread_of(local)}})
    assert [from_lc_message(m) for m in held.values["messages"]] == [
        Message(m.role, m.content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id,
                name=m.name) for m in transcript]


def test_a_new_turn_gives_a_checkpointed_thread_only_what_is_new() -> None:
    script = Script("first answer", "second answer")
    local = LocalSession()
    def work(n: int) -> str:
        """Do a piece of work."""
        return ""

    graph = agent_of(script, work, checkpointer=InMemorySaver())
    runner = GraphRunner(graph, offload=False)
    local.followup("one")
    turn(runner, local)
    first_ids = [m.id for m in script.sent[0]]
    local.followup("two")
    turn(runner, local)
    assert script.requests[1] == [("user", "one"), ("text", "first answer"), ("user", "two")]
    assert [m.id for m in script.sent[1][:1]] == first_ids  # the thread's own messages, kept


@pytest.mark.parametrize("saver", ["none", "fresh"])
def test_a_thread_that_does_not_hold_the_log_is_given_the_whole_transcript(saver: str) -> None:
    # No checkpointer, or a fresh one after a restart: the log is what the model was shown.
    script = Script("first answer", "second answer")
    local = LocalSession()

    def work(n: int) -> str:
        """Do a piece of work."""
        return ""

    local.followup("one")
    turn(GraphRunner(agent_of(script, work, checkpointer=InMemorySaver()), offload=False), local)
    options = {} if saver == "none" else {"checkpointer": InMemorySaver()}
    local.followup("two")
    turn(GraphRunner(agent_of(script, work, **options), offload=False), local)
    assert script.requests[1] == [("user", "one"), ("text", "first answer"), ("user", "two")]


def test_cancel_ends_the_run_at_its_next_model_boundary_and_the_checkpoint_agrees() -> None:
    script = Script("tool", "tool", "done")
    local = LocalSession()
    cancel = threading.Event()

    def work(n: int) -> str:
        """Do a piece of work."""
        local.steer("queued while cancelling")
        cancel.set()
        return f"result {n}"

    graph = agent_of(script, work, checkpointer=InMemorySaver())
    runner = GraphRunner(graph, offload=False)
    local.followup("go")
    events = turn(runner, local, cancel=cancel)
    assert events[-1].reason == "cancelled" and len(script.requests) == 1
    transcript = local.session.transcript
    assert transcript[-1].content == "result 0"  # the tool that ran is kept
    held = graph.get_state({"configurable": {"thread_id": runner.thread_of(local)}})
    assert [m.content for m in (from_lc_message(m) for m in held.values["messages"])] == [
        m.content for m in transcript]
    assert [m.content for m, _ in local.session.inbox.entries("next_step")] == [
        "queued while cancelling"]


def test_a_cancel_while_the_model_answers_answers_its_calls_as_cancelled_in_both() -> None:
    cancel = threading.Event()
    local = LocalSession()

    def reply(messages: list[BaseMessage]) -> AIMessage:
        cancel.set()
        return call("work", "c0", n=0)

    def work(n: int) -> str:
        """Do a piece of work."""
        raise AssertionError("a cancelled turn runs no tool")

    graph = create_agent(ScriptedChatModel(reply=reply), [work], middleware=[InboxMiddleware()],
                         checkpointer=InMemorySaver())
    runner = GraphRunner(graph, offload=False)
    local.followup("go")
    events = turn(runner, local, cancel=cancel)
    assert events[-1].reason == "cancelled"
    assert local.session.transcript[-1].metadata == {"error": "cancelled"}
    held = graph.get_state({"configurable": {"thread_id": runner.thread_of(local)}})
    assert held.values["messages"][-1].text == local.session.transcript[-1].content


def test_the_prebuilt_react_agent_takes_the_inbox_through_its_model_hooks() -> None:
    script = Script("tool", "answer", "summary")
    local = LocalSession()

    def work(n: int) -> str:
        """Do a piece of work."""
        local.steer("check b.py too")
        return f"result {n}"

    def steer_at_answer(messages: list[BaseMessage]) -> AIMessage:
        if len(script.requests) == 1:
            local.steer("and summarize")
        return script.reply(messages)

    with pytest.warns(Warning):  # LangGraph deprecates it in favour of create_agent
        graph = create_react_agent(ScriptedChatModel(reply=steer_at_answer), [work],
                                   pre_model_hook=before_model_node,
                                   post_model_hook=post_model_hook)
    local.followup("go")
    events = turn(GraphRunner(graph, offload=False), local)
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "check b.py too")]
    assert script.requests[2][-2:] == [("text", "answer"), ("user", "and summarize")]
    assert events[-1].reason == "final" and local.session.transcript[-1].content == "summary"


def test_a_plain_state_graph_takes_the_inbox_as_nodes_around_its_model() -> None:
    script = Script("tool", "answer", "summary")
    local = LocalSession()

    def work(n: int) -> str:
        """Do a piece of work."""
        local.steer("check b.py too")
        return f"result {n}"

    def steer_at_answer(messages: list[BaseMessage]) -> AIMessage:
        if len(script.requests) == 1:
            local.steer("and summarize")
        return script.reply(messages)

    model = ScriptedChatModel(reply=steer_at_answer)
    graph = StateGraph(MessagesState)
    graph.add_node("inbox", before_model_node)
    graph.add_node("model", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("inbox_after", after_model_node)
    graph.add_node("tools", ToolNode([work]))
    graph.add_edge(START, "inbox")
    graph.add_edge("inbox", "model")
    graph.add_edge("model", "inbox_after")
    graph.add_conditional_edges("inbox_after", route_after_model,
                                {"model": "inbox", "tools": "tools", END: END})
    graph.add_edge("tools", "inbox")
    local.followup("go")
    events = turn(GraphRunner(graph.compile(), offload=False), local)
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "check b.py too")]
    assert script.requests[2][-2:] == [("text", "answer"), ("user", "and summarize")]
    assert events[-1].reason == "final"


def test_the_threaded_owner_drives_a_graph_too() -> None:
    script = Script("tool", "done")
    holder: dict[str, Owner] = {}

    def work(n: int) -> str:
        """Do a piece of work."""
        holder["owner"].steer("from another thread")
        return f"result {n}"

    with Owner(open_store("memory:"), "s", GraphRunner(agent_of(script, work))) as owner:
        holder["owner"] = owner
        owner.followup("go")
        assert owner.wait_idle(WAIT)
        transcript = owner.transcript
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "from another thread")]
    assert transcript[-1].content == "done"


def test_a_steer_from_another_terminal_reaches_a_running_agent(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    script = Script("tool", "done")

    def work(n: int) -> str:
        """Do a piece of work."""
        subprocess.run([sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s",
                        "from the CLI"], check=True, capture_output=True, cwd=ROOT)
        return f"result {n}"

    async def main() -> None:
        async with AsyncOwner(open_store(url), "s", GraphRunner(agent_of(script, work))) as owner:
            await owner.prompt("go")
    asyncio.run(main())
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "from the CLI")]
    with open_store(url) as store:
        assert replay(store.read("s")).transcript[-1].content == "done"


def test_serve_hosts_a_graph_agent_from_its_module_and_factory(tmp_path: Path) -> None:
    factory = load_agent("tests.langgraph_kit:agent")

    async def main() -> None:
        with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
            async with SessionHost(store, factory, scan_interval=None) as host:
                await host.send("s1", "prompt", "hello")
                await async_wait_until(
                    lambda: len(replay(store.read("s1")).transcript) == 2, what="s1 answered")
                assert replay(store.read("s1")).transcript[-1].content == "s1 heard hello"

    asyncio.run(main())


def test_messages_cross_between_the_two_spellings() -> None:
    transcript = [Message.user("list files"), Message.assistant(
        "looking", [ToolCall("c1", "ls", {"d": "."})]),
        Message.tool("a.txt", "c1", name="ls"), Message.system("be brief")]
    assert [from_lc_message(m) for m in to_lc_messages(transcript)] == transcript


def test_bad_arguments_are_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match="compiled LangGraph graph"):
        GraphRunner(object())  # type: ignore[arg-type]
    graph = create_agent(ScriptedChatModel(reply=lambda m: AIMessage("x")),
                         middleware=[InboxMiddleware()])
    with pytest.raises(TypeError, match=r"configurable\['thread_id'\]"):
        GraphRunner(graph, config={"configurable": {"thread_id": "mine"}})
    with pytest.raises(TypeError, match="not deps"):
        GraphRunner.check_run_options({"deps": 1})
    with pytest.raises(ValueError, match="'assistant' message"):
        GraphRunner(graph).check_message(Message.assistant("hi"))


def test_the_models_text_reaches_a_deltas_reader_before_the_reply_and_is_never_logged() -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    async def main() -> None:
        store = open_store("memory:")
        graph = create_agent(GenericFakeChatModel(messages=iter([AIMessage("two words")])),
                             middleware=[InboxMiddleware()])
        async with AsyncOwner(store, "s", GraphRunner(graph)) as owner:
            await owner.inject("a note")  # an injection never wakes: the reader's first event
            reader = owner.events(deltas=True)
            seen: list[Any] = [await anext(reader)]  # listening from here on
            prompt = await owner.prompt("go")
            async for item in reader:
                seen.append(item)
                if type(item) is TurnEnded:
                    break
            assert prompt.text == "two words"  # logged whole, once
        deltas = [item for item in seen if type(item) is TextDelta]
        assert "".join(d.text for d in deltas) == "two words"
        kinds = [type(item) for item in seen]
        assert kinds.index(ModelRequested) < kinds.index(TextDelta)
        assert max(i for i, k in enumerate(kinds) if k is TextDelta) < kinds.index(ModelReplied)
        assert [item for item in seen if type(item) is not TextDelta] == list(store.read("s"))

    asyncio.run(main())


def test_a_sqlite_checkpoint_and_the_log_hold_one_conversation_across_a_restart(
        tmp_path: Path) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    script = Script("tool", "first answer", "second answer")

    def work(n: int) -> str:
        """Do a piece of work."""
        return f"result {n}"

    async def session(text: str) -> list[Message]:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "graph.sqlite")) as saver:
            graph = agent_of(script, work, checkpointer=saver)
            runner = GraphRunner(graph)
            async with AsyncOwner(open_store(url), "s", runner) as owner:
                await owner.prompt(text)
                transcript = list(owner.transcript)
            held = await graph.aget_state({"configurable": {"thread_id": "s"}})
            assert [from_lc_message(m).content for m in held.values["messages"]] == [
                m.content for m in transcript]
            return transcript

    asyncio.run(session("one"))
    first = [m.id for m in script.sent[-1]]
    asyncio.run(session("two"))  # a new process: a new owner, a new saver on the same files
    assert script.requests[-1][-2:] == [("text", "first answer"), ("user", "two")]
    assert [m.id for m in script.sent[-1][:len(first)]] == first  # the thread kept, not rewritten


def _plain(transcript: Any) -> list[Message]:
    return [Message(m.role, m.content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id,
                    name=m.name) for m in transcript]


def _held(graph: Any, runner: GraphRunner, local: LocalSession) -> list[Message]:
    state = graph.get_state({"configurable": {"thread_id": runner.thread_of(local)}})
    return [from_lc_message(m) for m in state.values["messages"]]


def test_the_middleware_adds_no_node_to_a_create_agent_graph() -> None:
    # Each node is a graph step on every request: the inbox joins inside the model node.
    def work(n: int) -> str:
        """Do a piece of work."""
        return ""

    model = ScriptedChatModel(reply=lambda m: AIMessage("x"))
    bare = create_agent(model, [work])
    with_inbox = create_agent(model, [work], middleware=[InboxMiddleware()])
    assert set(with_inbox.get_graph().nodes) == set(bare.get_graph().nodes)


def test_a_steer_at_a_final_answer_extends_the_run_and_the_checkpoint_keeps_it_in_place() -> None:
    script = Script("tool", "answer", "summary")
    local = LocalSession()

    def work(n: int) -> str:
        """Do a piece of work."""
        local.steer("check b.py too")
        return f"result {n}"

    def steer_at_answer(messages: list[BaseMessage]) -> AIMessage:
        if len(script.requests) == 1:
            local.steer("and summarize")
        return script.reply(messages)

    graph = create_agent(ScriptedChatModel(reply=steer_at_answer), [work],
                         middleware=[InboxMiddleware()], checkpointer=InMemorySaver())
    runner = GraphRunner(graph, offload=False)
    local.followup("go")
    events = turn(runner, local)
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "check b.py too")]
    assert script.requests[2][-2:] == [("text", "answer"), ("user", "and summarize")]
    assert events[-1].reason == "final"
    transcript = replay(local.events).transcript
    assert [(m.role, m.content) for m in transcript[-5:]] == [
        ("tool", "result 0"), ("user", "check b.py too"), ("assistant", "answer"),
        ("user", "and summarize"), ("assistant", "summary")]
    assert _held(graph, runner, local) == _plain(transcript)


def test_a_cancel_set_at_a_final_answer_ends_the_run_before_the_request_it_would_extend() -> None:
    cancel = threading.Event()
    local = LocalSession()
    script = Script("answer", "never asked")

    def steer_then_cancel(messages: list[BaseMessage]) -> AIMessage:
        local.steer("one more thing")
        cancel.set()
        return script.reply(messages)

    graph = create_agent(ScriptedChatModel(reply=steer_then_cancel),
                         middleware=[InboxMiddleware()], checkpointer=InMemorySaver())
    runner = GraphRunner(graph, offload=False)
    local.followup("go")
    events = turn(runner, local, cancel=cancel)
    assert events[-1].reason == "cancelled" and len(script.requests) == 1
    assert _held(graph, runner, local) == _plain(local.session.transcript)


def test_a_structured_response_is_the_turns_output_and_the_checkpoint_holds_its_answer() -> None:
    from langchain.agents.structured_output import ToolStrategy
    from pydantic import BaseModel

    class Verdict(BaseModel):
        ok: bool

    def reply(messages: list[BaseMessage]) -> AIMessage:
        return call("Verdict", "v1", ok=True)

    graph = create_agent(ScriptedChatModel(reply=reply), middleware=[InboxMiddleware()],
                         response_format=ToolStrategy(Verdict), checkpointer=InMemorySaver())
    runner = GraphRunner(graph, offload=False)
    local = LocalSession()
    local.followup("is it ok?")
    events = turn(runner, local)
    assert events[-1].reason == "final" and events[-1].output == {"ok": True}
    transcript = replay(local.events).transcript
    assert transcript[-1].role == "tool" and transcript[-1].tool_call_id == "v1"
    assert _held(graph, runner, local) == _plain(transcript)


def test_outside_a_turn_the_agent_runs_bare_sync_or_async() -> None:
    graph = create_agent(ScriptedChatModel(reply=lambda m: AIMessage("plain")),
                         middleware=[InboxMiddleware()])
    assert graph.invoke({"messages": [("user", "hi")]})["messages"][-1].text == "plain"
    done = asyncio.run(graph.ainvoke({"messages": [("user", "hi")]}))
    assert done["messages"][-1].text == "plain"
