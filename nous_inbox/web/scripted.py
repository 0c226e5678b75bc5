"""The scripted agent of ``nous-inbox demo`` as a factory for ``nous-inbox serve``.

    nous-inbox serve --agent nous_inbox.web.scripted:agent

Each session gets its own :class:`~nous_inbox.runner.scripted.ScriptedAgent` (no LLM; a survey of logs,
one tool call per step, each taking a moment), so a person can open the page and steer it while it
works. ``$NOUS_INBOX_SCRIPTED_STEPS`` and ``$NOUS_INBOX_SCRIPTED_STEP_SECONDS`` change its pace.

>>> agent("s1").tools["read_log"].name
'read_log'
"""

from __future__ import annotations

import os

from nous_inbox.runner import Runner
from nous_inbox.runner.scripted import ScriptedAgent

__all__ = ["agent"]


def agent(session: str) -> Runner:
    """A runner driving a fresh scripted agent for ``session``."""
    scripted = ScriptedAgent(
        steps=int(os.environ.get("NOUS_INBOX_SCRIPTED_STEPS", "5")),
        step_seconds=float(os.environ.get("NOUS_INBOX_SCRIPTED_STEP_SECONDS", "0.5")),
    )
    return Runner(scripted, scripted.tools, max_steps=50)
