"""What the library says through ``logging``: nothing to a host that set none up, and one clear
warning (no traceback) when a model calls a tool with arguments that do not fit."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from nous_inbox import Message, ToolCall
from nous_inbox.runner import LocalSession, Runner

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_logger_has_a_null_handler() -> None:
    handlers = logging.getLogger("nous_inbox").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)


HOST = r"""
from nous_inbox.runner import LocalSession, Runner
from nous_inbox import Message, ToolCall

def broken() -> str:
    raise RuntimeError("disk on fire")

replies = [Message.assistant(tool_calls=[ToolCall("c1", "broken")]), Message.assistant("done")]
session = LocalSession()
session.followup("go")
events = list(Runner(lambda transcript, tools: replies.pop(0), [broken]).run_turn(session))
print(events[-1].reason)
"""


def test_a_host_without_logging_set_up_gets_nothing_on_stderr() -> None:
    # A tool that raises is logged as a warning with its exception: without a handler of the
    # library's own, Python's last resort would print it, traceback and all, on stderr.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", HOST], capture_output=True, text=True, cwd=ROOT,
                          env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "final\n" and done.stderr == ""


class Model:
    """Asks for ``add`` with a string where the tool takes an int, then answers."""

    def __init__(self) -> None:
        self.replies = [
            Message.assistant(tool_calls=[ToolCall("c1", "add", {"a": "2", "b": 3})]),
            Message.assistant("done"),
        ]
        self.seen: list[Message] = []

    def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        self.seen = list(transcript)
        return self.replies.pop(0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_wrong_argument_type_is_one_warning_and_the_model_hears_its_arguments_were_refused(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    def add(a: int, b: int) -> int:
        ran.append(a)
        return a + b

    model, session = Model(), LocalSession()
    session.followup("add")
    runner = Runner(model, [add])
    with caplog.at_level(logging.WARNING, logger="nous_inbox"):
        if mode == "sync":
            list(runner.run_turn(session))
        else:
            async def drive() -> None:
                async for _ in runner.arun_turn(session):
                    pass

            asyncio.run(drive())
    assert ran == []  # the tool never ran
    (record,) = [r for r in caplog.records if r.name.startswith("nous_inbox")]
    assert record.levelno == logging.WARNING and record.exc_info is None
    text = record.getMessage()
    assert "tool 'add': arguments refused, the tool did not run" in text
    assert "argument 'a': Expected `int`, got `str`" in text
    result = model.seen[-1]
    assert result.role == "tool" and result.metadata["error"] == "arguments_refused"
    assert result.content.startswith("error: arguments refused, the tool did not run: ")
    assert "raised" not in result.content
