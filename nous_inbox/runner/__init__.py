"""The runner: one turn of an agent, driven with a model and tools, sync or asyncio.

A :class:`Runner` pumps the loop's turn body (:mod:`nous_inbox.loop`) against a session port: the
in-memory :class:`LocalSession`, or an owner's port over a durable log. Tools are plain callables
(:class:`Tool`, :func:`tool`).

>>> from nous_inbox.message import Message
>>> from nous_inbox.runner import LocalSession, Runner
>>> local = LocalSession()
>>> _ = local.followup("say hello")
>>> _ = list(Runner(lambda transcript, tools: Message.assistant("hello")).run_turn(local))
>>> local.session.transcript[-1].content
'hello'
"""

from nous_inbox.commands import ToolSpec
from nous_inbox.runner.port import LocalSession, SessionPort
from nous_inbox.runner.runner import Runner
from nous_inbox.runner.tools import Tool, tool

__all__ = ["LocalSession", "Runner", "SessionPort", "Tool", "ToolSpec", "tool"]
