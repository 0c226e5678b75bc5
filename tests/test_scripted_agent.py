"""The scripted agent of the demo and of ``serve``'s default: it reads what it is sent as a model
would, in time linear in what it reads."""

from __future__ import annotations

from nous_inbox.message import Message
from nous_inbox.runner.scripted import ScriptedAgent


def test_a_steer_naming_a_log_puts_it_next() -> None:
    agent = ScriptedAgent(steps=3, step_seconds=0)
    reply = agent([Message.user("survey the logs"), Message.user("read db.log next")], [])
    assert [call.arguments for call in reply.tool_calls] == [{"name": "api.log"}]
    first = agent([Message.user("survey the logs")], [])
    tool = Message.tool("api.log: fine", tool_call_id=first.tool_calls[0].id)
    steered = [Message.user("survey the logs"), first, tool, Message.user("read db.log next")]
    assert [call.arguments for call in agent(steered, []).tool_calls] == [{"name": "db.log"}]


def test_a_long_word_is_read_once_not_from_each_of_its_letters() -> None:
    # Two megabytes with no log name in them but at the end: a quadratic scan would take hours
    # holding the interpreter's lock, and every other session and request of the process with it.
    agent = ScriptedAgent(steps=3, step_seconds=0)
    first = agent([Message.user("survey the logs")], [])
    tool = Message.tool("api.log: fine", tool_call_id=first.tool_calls[0].id)
    long = "x" * 2_000_000 + " then cache.log"
    steered = [Message.user("survey the logs"), first, tool, Message.user(long)]
    assert [call.arguments for call in agent(steered, []).tool_calls] == [{"name": "cache.log"}]
