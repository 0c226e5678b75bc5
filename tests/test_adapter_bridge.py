"""The bridge every framework adapter shares, driven sans-I/O: what a turn's end records of the
run, and the usage counts a framework reports, the same for every adapter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from nous_inbox.adapters.bridge import CLAIMS, TurnBridge
from nous_inbox.events import Event, ModelReplied, TurnEnded
from nous_inbox.happenings import ModelAnswered
from nous_inbox.loop import new_state
from nous_inbox.message import Message
from nous_inbox.runner.port import LocalSession
from nous_inbox.session import Session
from nous_inbox.verbs import Target


class PlainPort:
    """A port that is not a journal: each boundary recorded one port call at a time."""

    def __init__(self) -> None:
        self.local = LocalSession()

    @property
    def session(self) -> Session:
        return self.local.session

    def claim(self, target: Target, *, wake_only: bool = False) -> object:
        return self.local.claim(target, wake_only=wake_only)

    def record(self, events: Sequence[Event]) -> Sequence[Event]:
        return self.local.record(events)


PORTS = {"journal": LocalSession, "plain": PlainPort}


def answer_with(kind: str, reply: str, output: object) -> TurnEnded:
    """A turn whose model answers ``reply`` and whose run reports ``output``, the reply and the
    claim at the would-be final answer recorded at one boundary; its recorded end."""
    port = PORTS[kind]()
    local = port if isinstance(port, LocalSession) else port.local
    local.followup("hello")
    bridge = TurnBridge(port, new_state(added_only=True))
    bridge.open("wake")
    bridge.output = output
    bridge.write(ModelAnswered(Message.assistant(reply)), CLAIMS)
    return next(e for e in reversed(local.events) if type(e) is TurnEnded)


@pytest.mark.parametrize("kind", PORTS)
def test_a_text_output_that_is_the_final_reply_is_not_recorded_again(kind: str) -> None:
    assert answer_with(kind, "the answer is 4", "the answer is 4").output is None


@pytest.mark.parametrize("kind", PORTS)
def test_an_output_that_is_more_than_the_final_reply_is_the_turns_output(kind: str) -> None:
    assert answer_with(kind, "done", {"value": 4}).output == {"value": 4}
    assert answer_with(kind, "hello", "hello there").output == "hello there"


def test_langgraph_usage_keeps_only_finite_numbers() -> None:
    pytest.importorskip("langgraph")
    from nous_inbox.adapters.langgraph.hooks import GraphTurn

    turn = GraphTurn(TurnBridge(LocalSession(), new_state(added_only=True)))
    turn.add_usage({"input_tokens": 10, "output_tokens": float("nan"), "cost": float("inf")})
    turn.add_usage({"input_tokens": 5, "output_tokens": 2})
    assert turn.usage == {"input_tokens": 15, "output_tokens": 2}



def langgraph_runner() -> Any:
    pytest.importorskip("langgraph")
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from nous_inbox.adapters.langgraph import GraphRunner, InboxMiddleware

    model = GenericFakeChatModel(messages=iter([AIMessage("hi"), AIMessage("hi again")]))
    return GraphRunner(create_agent(model, middleware=[InboxMiddleware()]), offload=False)


def openai_agents_runner() -> Any:
    pytest.importorskip("agents")
    from agents import Agent
    from agents.testing import ScriptedModel, assistant_message

    from nous_inbox.adapters.openai_agents import AgentRunner

    model = ScriptedModel([[assistant_message("hi")], [assistant_message("hi again")]])
    return AgentRunner(Agent("a", model=model), offload=False, tracing_disabled=True)


def pydantic_ai_runner() -> Any:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    model = FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("hi")]))
    return AgentRunner(Agent(model), offload=False)


RUNNERS = {"langgraph": langgraph_runner, "openai_agents": openai_agents_runner,
           "pydantic_ai": pydantic_ai_runner}


@pytest.mark.parametrize("framework", RUNNERS)
def test_a_turn_whose_message_was_withdrawn_before_its_opening_ends_quietly(framework: str) -> None:
    # The owner decided to wake for a message; it was withdrawn before the opening claimed it,
    # so the opening claims nothing and the transcript ends with the model's last reply.
    runner = RUNNERS[framework]()
    local = LocalSession()
    local.followup("hello")
    list(runner.run_turn(local))
    sent = local.followup("one more thing")
    withdrawn = local.session.withdraw(sent.seq)
    assert withdrawn is not None
    local.record([withdrawn])

    events = list(runner.run_turn(local))

    end = events[-1]
    assert type(end) is TurnEnded and end.reason == "cancelled" and end.error is None
    assert not any(type(e) is ModelReplied for e in events)  # the model was not asked again
    assert [m.content for m in local.session.transcript] == ["hello", "hi"]
