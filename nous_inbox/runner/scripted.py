"""The scripted agent behind ``nous-inbox demo`` and ``nous-inbox run``: no LLM, real tools.

It works through a small task, "survey the logs", one tool call per step, and each tool takes a
moment (``step_seconds``) the way real tools do, so there is time to talk to it while it works.
The "model" is a plain function of the transcript, and it reacts to what the inbox delivers the
way a model would: it acknowledges a delivered message in its next reply, reads a log a steer
names next, stops early when told to stop, and answers a followup as a turn of its own.

>>> from nous_inbox.message import Message
>>> agent = ScriptedAgent(steps=2, step_seconds=0)
>>> reply = agent([Message.user("survey the logs")], [])
>>> [c.name for c in reply.tool_calls]
['read_log']
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from typing import Any, Final

import attrs

from nous_inbox.message import Message, ToolCall
from nous_inbox.runner.tools import Tool

__all__ = ["LOGS", "MAX_STEPS", "ScriptedAgent", "log_names"]

LOGS: Final = ("api.log", "worker.log", "db.log", "cache.log", "auth.log", "queue.log", "cdn.log")

#: A run longer than this is a mistake, not a demo (each step is one model request and tool call).
MAX_STEPS: Final = 1000


def log_names(steps: int) -> list[str]:
    """The logs a task of ``steps`` reads: the named ones first, then numbered shards.

    >>> log_names(9)[-3:]
    ['cdn.log', 'shard-1.log', 'shard-2.log']
    """
    return [*LOGS[:steps], *(f"shard-{i}.log" for i in range(1, steps - len(LOGS) + 1))]

#: A log's name in a message. The look-behind starts a match only where a name can start: without
#: it, a long word with no ``.log`` in it is tried from each of its letters, a time quadratic in
#: its length with the interpreter's lock held (a 20 KB steer: four seconds a step).
_LOG_NAME: Final = re.compile(r"(?<![\w-])[\w-]+\.log")

_FINDINGS: Final = {
    "api.log": "3 timeouts on /checkout between 09:12 and 09:14",
    "worker.log": "the retry queue drained at 09:20; no poison messages",
    "db.log": "one slow query (2.1 s) on orders_by_customer",
    "cache.log": "hit rate fell from 97% to 81% at 09:11",
    "auth.log": "nothing unusual",
    "queue.log": "backlog peaked at 1,204 messages",
    "cdn.log": "a 502 burst from one edge (fra2) at 09:13",
}


def _turn_slice(transcript: Sequence[Message]) -> list[Message]:
    """The messages of the current turn: everything after the last final answer."""
    for i in range(len(transcript) - 1, -1, -1):
        message = transcript[i]
        if message.role == "assistant" and not message.tool_calls:
            return list(transcript[i + 1 :])
    return list(transcript)


def _at_least_one(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be at least 1, got {value}")


def _seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    # NaN slips past every comparison, so ask isfinite first.
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value}")


@attrs.define(eq=False)  # an agent is itself, not its settings
class ScriptedAgent:
    """A deterministic stand-in for a model: ``agent(transcript, tools) -> Message``.

    ``steps`` is how many logs the task reads (one tool step each) and ``step_seconds`` how long
    each read takes. ``tools`` gives the tools it calls, ready for a ``Runner``.

    >>> ScriptedAgent(steps=0)
    Traceback (most recent call last):
    ...
    ValueError: steps must be at least 1, got 0
    """

    steps: int = attrs.field(default=5, validator=_at_least_one)
    step_seconds: float = attrs.field(default=0.5, converter=float, validator=_seconds)
    tools: list[Tool] = attrs.field(init=False, repr=False)

    @tools.default
    def _tools(self) -> list[Tool]:
        return [Tool(self.read_log, name="read_log", description="Read one log file.")]

    def read_log(self, name: str) -> str:
        """Read a log (takes ``step_seconds``, like a real tool)."""
        time.sleep(self.step_seconds)
        finding = _FINDINGS.get(name, "nothing unusual" if name.startswith("shard-") else None)
        return f"{name}: {finding or 'no such log here'}"

    def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        turn = _turn_slice(transcript)
        people = [m for m in turn if m.role == "user" and "provenance" not in m.metadata]
        if not people:
            return Message.assistant("Nothing to do.")
        if not any(m.role == "tool" for m in turn) and len(people) == 1 and self._is_followup(turn):
            return Message.assistant(f"Follow-up done: {people[0].content}")
        fresh = self._fresh(turn)
        notes = [m.content for m in fresh if m is not people[0]]
        ack = " ".join(f"Noted: {n!r}." for n in notes)
        if any(re.search(r"\bstop\b", n, re.IGNORECASE) for n in notes):
            return Message.assistant(f"{ack} Stopping here. {self._summary(turn)}".strip())
        plan = self._plan(people)
        done = [m.content.split(":", 1)[0] for m in turn if m.role == "tool"]
        todo = [name for name in plan if name not in done]
        if todo:
            call = ToolCall(f"read-{len(done) + 1}", "read_log", {"name": todo[0]})
            return Message.assistant(ack, tool_calls=[call])
        return Message.assistant(f"{ack} {self._summary(turn)}".strip())

    def _is_followup(self, turn: list[Message]) -> bool:
        """A turn that opened on a followup (not the task) is answered in one reply."""
        return bool(turn) and turn[0].role == "user" and not turn[0].content.lower().startswith(
            ("survey", "check", "read")
        )

    def _fresh(self, turn: list[Message]) -> list[Message]:
        """User messages delivered since the last assistant reply."""
        fresh: list[Message] = []
        for message in reversed(turn):
            if message.role == "assistant":
                break
            if message.role == "user":
                fresh.append(message)
        return fresh[::-1]

    def _plan(self, people: list[Message]) -> list[str]:
        """The logs to read in order: a later message naming a log puts it next in line,
        whether or not the plan held it already (the latest message's logs first)."""
        plan = log_names(self.steps)
        for message in people[1:]:
            for name in reversed(_LOG_NAME.findall(message.content)):
                if name in plan:
                    plan.remove(name)
                plan.insert(1, name)
        return plan

    def _summary(self, turn: list[Message]) -> str:
        findings = [m.content for m in turn if m.role == "tool"]
        notes = [
            m.content for m in turn[1:] if m.role == "user" and "provenance" not in m.metadata
        ]
        text = f"Read {len(findings)} log(s): " + "; ".join(findings) + "."
        if notes:
            text += " Taken into account along the way: " + "; ".join(repr(n) for n in notes) + "."
        return text
