"""The tools a model reads and answers its mail with: ``inbox_read``, ``inbox_reply`` and
``inbox_send``, bound to one agent's handle.

A notice tells the agent what is new ("read a thread to see it whole"); these are how it does. They
are plain functions with annotations and docstrings wrapped as :class:`~nous_inbox.runner.tools.Tool` s, so
the runner offers them as they are, and a framework that takes plain functions (pydantic-ai's
``Agent(tools=[...])``) takes each one's ``.fn``. They act as the handle's agent only: a model
cannot read another agent's mail through them.

>>> from nous_inbox.mailbox import Mailbox
>>> box = Mailbox()
>>> lead, dev = box.agent("lead"), box.agent("dev")
>>> _ = lead.send("dev", "which branch?", kind="question")
>>> read, reply, send = mailbox_tools(dev)
>>> print(read())
lead: 1 message, 1 unread, 1 new from lead: which branch?
>>> print(read("lead"))
[blocker] lead: which branch?
>>> reply("lead", "main")
'replied to lead'
>>> [m.body for m in lead.receive()]
['main']
"""

from __future__ import annotations

import json
from typing import Any, Literal

from nous_inbox.frozen import thaw_json
from nous_inbox.mailbox.handle import AgentHandle
from nous_inbox.runner.tools import Tool

__all__ = ["mailbox_tools"]


def _text(body: Any) -> str:
    return body if isinstance(body, str) else json.dumps(thaw_json(body), ensure_ascii=False)


def mailbox_tools(handle: AgentHandle) -> list[Tool]:
    """``inbox_read``, ``inbox_reply`` and ``inbox_send`` acting as ``handle``'s agent."""
    if not isinstance(handle, AgentHandle):
        raise TypeError(f"mailbox_tools: expected an AgentHandle (box.agent(name)), got "
                        f"{handle!r}")

    def inbox_read(thread: str | None = None) -> str:
        """Read your mailbox: with no thread, list your threads; with one, read that thread
        whole (which marks it read)."""
        if thread is None:
            lines = [f"{t.thread}: {t.count} message{'s' if t.count != 1 else ''}, "
                     f"{t.unread} unread, {t.new} new from {', '.join(t.senders)}: {t.preview}"
                     for t in handle.threads()]
            return "\n".join(lines) or "Your mailbox is empty."
        lines = []
        for letter in handle.read(thread):
            tag = "" if letter.kind in ("action", "reply") else f"[{letter.kind}] "
            state = " (retracted by its sender)" if letter.state == "retracted" else ""
            lines.append(f"{tag}{letter.sender}: {_text(letter.body)}{state}")
        return "\n".join(lines)

    def inbox_reply(thread: str, text: str, kind: Literal["reply", "blocker"] = "reply") -> str:
        """Answer a thread of your mailbox (to its last other writer); kind "blocker" makes
        the answer a question that needs theirs, and wakes them."""
        receipt = handle.reply(thread, text, kind=kind)
        return f"replied to {handle.message(receipt.id).recipient}"

    def inbox_send(to: str, text: str,
                   kind: Literal["action", "blocker", "result", "report", "fyi"] = "action",
                   thread: str | None = None) -> str:
        """Send a message to another agent by name; kind is "action" (work for them),
        "blocker" (a question needing their answer), "result" (of work they gave you),
        "report" or "fyi" (wakes nobody)."""
        receipt = handle.send(to, text, kind=kind, thread=thread)
        return f"sent to {to} (id {receipt.id})"

    return [Tool(inbox_read), Tool(inbox_reply), Tool(inbox_send)]
