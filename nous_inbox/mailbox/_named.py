"""The mailbox's name-taking verbs, deprecated: each acts as the agent it names, so whoever holds
the mailbox could act as anyone. An agent acts through its handle (``box.agent(name)``); these
remain for code written before handles, and refuse to act as an agent whose handle was given out.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nous_inbox.events import MailSent
from nous_inbox.mailbox.answers import Letter, Receipt, ThreadSummary

if TYPE_CHECKING:
    from nous_inbox.mailbox.handle import AgentHandle

__all__ = ["NamedVerbs"]


class NamedVerbs:
    """The deprecated half of :class:`~nous_inbox.mailbox.mailbox.Mailbox` (which has these)."""

    _handles: dict[str, AgentHandle]
    _send: Callable[..., Receipt]
    _reply: Callable[..., Receipt]
    _withdraw: Callable[..., str]
    _receive: Callable[..., list[MailSent]]
    _threads: Callable[[str], list[ThreadSummary]]
    _read_thread: Callable[[str, str], list[Letter]]

    def _named(self, name: object, verb: str) -> None:
        """A name-taking verb acting as ``name``: deprecated, and refused for a handled agent."""
        warnings.warn(f"Mailbox.{verb}(...) acting as a named agent is deprecated: act through "
                      "box.agent(name)", DeprecationWarning, stacklevel=3)
        self._unhandled(name, verb)

    def _unhandled(self, name: object, verb: str) -> None:
        """Refuse a verb acting as ``name`` by name once ``name``'s handle was given out (the
        PraisonAI drop-in's verbs ask this too)."""
        if type(name) is str and name in self._handles:
            raise PermissionError(f"{verb}: {name!r} acts only through its handle "
                                  f"(box.agent({name!r}) was given out)")

    def send(self, recipient: str, body: Any, *, sender: str, **options: Any) -> Receipt:
        """Deprecated: ``box.agent(sender).send(recipient, body, ...)``."""
        self._named(sender, "send")
        return self._send(recipient, body, sender=sender, **options)

    def reply(self, agent: str, thread: str, body: Any, **options: Any) -> Receipt:
        """Deprecated: ``box.agent(agent).reply(thread, body, ...)``."""
        self._named(agent, "reply")
        return self._reply(agent, thread, body, **options)

    def withdraw(self, id: str, *, sender: str) -> str:
        """Deprecated: ``box.agent(sender).withdraw(id)``."""
        self._named(sender, "withdraw")
        return self._withdraw(id, sender=sender)

    def receive(self, agent: str, *, limit: int = 50) -> list[MailSent]:
        """Deprecated: ``box.agent(agent).receive(limit=...)``."""
        self._named(agent, "receive")
        return self._receive(agent, limit=limit)

    def threads(self, agent: str) -> list[ThreadSummary]:
        """Deprecated: ``box.agent(agent).threads()``."""
        self._named(agent, "threads")
        return self._threads(agent)

    def read_thread(self, agent: str, thread: str, *, reader: str | None = None) -> list[Letter]:
        """Deprecated: ``box.agent(agent).read(thread)`` (``reader`` other than ``agent`` is
        refused with ``PermissionError``)."""
        self._named(agent if reader is None else reader, "read_thread")
        if reader is not None and reader != agent:
            raise PermissionError(f"read of thread {thread!r} of {agent!r}: {reader!r} may not "
                                  "read another agent's threads")
        return self._read_thread(agent, thread)

