"""A pydantic-ai agent that streams its reply, for ``nous-inbox serve --agent
tests.streaming_agent:agent`` in the page test: it writes its first words, then waits until the
file named by ``$NOUS_INBOX_TEST_RELEASE`` exists before it writes the rest, so a test can look
at the page while the reply is half written. No network: a ``FunctionModel`` with a
``stream_function`` only, so a request nobody streams fails rather than passing unseen."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nous_inbox.adapters.pydantic_ai import AgentRunner

FIRST = "Reading the incident log, "
REST = "the cdn timed out at 09:14."


async def _writes(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    yield FIRST
    release = Path(os.environ["NOUS_INBOX_TEST_RELEASE"])
    while not release.exists():  # the test releases it once it has seen the first words
        await asyncio.sleep(0.02)
    yield REST


def agent(session: str) -> AgentRunner:
    """A runner of the streaming agent for ``session``."""
    return AgentRunner(Agent(FunctionModel(stream_function=_writes)))
