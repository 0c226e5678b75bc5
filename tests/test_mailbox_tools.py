"""The model's mailbox tools: a scripted model reads a thread and replies inside a run, through the
library's runner and through the pydantic-ai adapter; the tools act as their agent only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from nous_inbox.mailbox import Mailbox
from nous_inbox.mailbox.tools import mailbox_tools
from nous_inbox.message import Message, ToolCall
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store

WAIT = 30  # seconds: a bound for a wait that should end at once, never a synchronisation sleep


@pytest.fixture(params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    """In memory and on SQLite (this module's stores)."""
    return str(request.param)


class ReadThenReply:
    """Reads the thread its notice names, replies "main" there, then ends its turn."""

    def __init__(self) -> None:
        self.results: list[str] = []
        self.thread = ""

    def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        last = transcript[-1]
        if last.role == "tool":
            self.results.append(str(last.content))
        calls = sum(1 for m in transcript if m.role == "tool")
        if calls == 0:
            self.thread = last.metadata["threads"][0]
            return Message.assistant(tool_calls=[ToolCall("c1", "inbox_read",
                                                          {"thread": self.thread})])
        if calls == 1:
            return Message.assistant(tool_calls=[ToolCall(
                "c2", "inbox_reply", {"thread": self.thread, "text": "main"})])
        return Message.assistant("answered")


def test_a_model_reads_a_thread_and_replies_inside_a_run_while_the_sender_waits(
        store: Store) -> None:
    box = Mailbox(store, debounce=0.0)
    lead, dev = box.agent("lead"), box.agent("dev")
    model = ReadThenReply()
    owner = Owner(open_store("memory:"), "dev", Runner(model, mailbox_tools(dev)), watch=False)
    box.attach("dev", owner)
    reply = lead.ask("dev", "which branch?", timeout=WAIT)
    assert (reply.sender, reply.body) == ("dev", "main")
    # ask() returns once the reply is stored, inside the tool call; the model sees the tool's
    # result on its next request, so the run is waited for before what the model saw is checked.
    assert owner.wait_idle(WAIT)
    assert model.results == ["[blocker] lead: which branch?", "replied to lead"]
    assert [(t.thread, t.unread) for t in dev.threads()] == [(model.thread, 0)]
    owner.close()
    box.close()


def test_the_tools_list_threads_and_read_only_their_agents_mail() -> None:
    box = Mailbox()
    lead = box.agent("lead")
    lead.send("dev", {"files": 3}, thread="t1")
    lead.send("qa", "secret for qa")
    read, _, send = mailbox_tools(box.agent("dev"))
    assert read() == 't1: 1 message, 1 unread, 1 new from lead: {"files": 3}'
    assert read("t1") == 'lead: {"files": 3}'
    with pytest.raises(LookupError):
        read("lead")  # qa's thread from lead is not dev's
    assert send("lead", "done", kind="result").startswith("sent to lead")
    assert [(m.body, m.kind) for m in lead.receive()] == [("done", "result")]


def test_the_tools_offer_the_model_their_names_and_classes() -> None:
    read, reply, send = (t.spec for t in mailbox_tools(Mailbox().agent("dev")))
    assert (read.name, reply.name, send.name) == ("inbox_read", "inbox_reply", "inbox_send")
    assert reply.parameters["properties"]["kind"] == {"enum": ["blocker", "reply"]}
    assert send.parameters["required"] == ["to", "text"]


def test_tools_need_a_handle() -> None:
    with pytest.raises(TypeError, match="expected an AgentHandle"):
        mailbox_tools("dev")  # type: ignore[arg-type]


def test_a_pydantic_ai_agent_reads_and_replies_through_the_same_tools() -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = [p for m in messages for p in m.parts if p.part_kind == "tool-return"]
        if not returned:  # list the threads; the first line names the question's
            return ModelResponse(parts=[ToolCallPart("inbox_read", {})])
        if len(returned) == 1:
            thread = str(returned[0].content).split(":", 1)[0]
            return ModelResponse(parts=[ToolCallPart("inbox_reply",
                                                     {"thread": thread, "text": "main"})])
        return ModelResponse(parts=[TextPart("answered")])

    box = Mailbox(debounce=0.0)
    lead, dev = box.agent("lead"), box.agent("dev")
    agent = Agent(FunctionModel(model), tools=[t.fn for t in mailbox_tools(dev)])
    owner = Owner(open_store("memory:"), "dev", AgentRunner(agent), watch=False)
    box.attach("dev", owner)
    assert lead.ask("dev", "which branch?", timeout=WAIT).body == "main"
    owner.close()
