"""Names, and the mailbox's name-taking verbs.

A name is its value: :func:`text` makes any ``str``, a subclass included, the plain ``str`` of its
value, and every name the mailbox stores or compares goes through it first. A subclass cannot
then pass for another agent, by its type (a check of ``type(name) is str`` lets it by) or by an
``__eq__`` or ``__hash__`` of its own (a dict asks the key it is given to compare itself).

The name-taking verbs are deprecated: each acts as the agent it names, so whoever holds the
mailbox could act as anyone. An agent acts through its handle (``box.agent(name)``); these remain
for code written before handles, and refuse to act as an agent whose handle was given out: one
rule, :meth:`NamedVerbs._as_agent`, which every verb acting by name asks (the PraisonAI drop-in's
too).

>>> class Name(str): ...
>>> type(text(Name("dev"), "agent", "receive"))
<class 'str'>
>>> text(3, "agent", "receive")
Traceback (most recent call last):
...
TypeError: receive: agent must be a non-empty str, got 3
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nous_inbox.events import MailSent
from nous_inbox.mailbox.answers import Letter, Receipt, ThreadSummary

if TYPE_CHECKING:
    from nous_inbox.mailbox.handle import AgentHandle

__all__ = ["NamedVerbs", "send_names", "text"]


def text(value: object, what: str, where: str) -> str:
    """``value``, a non-empty ``str``, as the plain ``str`` of its value; else a ``TypeError``
    naming ``what`` and ``where``."""
    if type(value) is str and value:
        return value
    # str.__str__ gives the value as a plain str, whatever the subclass overrides.
    plain = str.__str__(value) if isinstance(value, str) else None
    if not plain:
        raise TypeError(f"{where}: {what} must be a non-empty str, got {value!r}")
    return plain


def send_names(recipient: object, sender: object, thread: object,
               correlation: object) -> tuple[str, str, str | None, str | None]:
    """A send's names (its ``recipient``, ``sender``, ``thread`` and ``correlation`` id) as
    plain ``str`` s, or the error naming the part that is not what it must be."""
    recipient = text(recipient, "recipient", "send")
    where = f"send to {recipient!r}"
    sender = text(sender, "sender", where)
    if thread is not None:
        thread = text(thread, "thread", where)
    if correlation is not None:
        if not isinstance(correlation, str):
            raise TypeError(f"{where}: correlation_id must be a str or None, "
                            f"got {correlation!r}")
        correlation = str.__str__(correlation)
    return recipient, sender, thread, correlation


class NamedVerbs:
    """The deprecated half of :class:`~nous_inbox.mailbox.mailbox.Mailbox` (which has these)."""

    _handles: dict[str, AgentHandle]
    _send: Callable[..., Receipt]
    _reply: Callable[..., Receipt]
    _withdraw: Callable[..., str]
    _receive: Callable[..., list[MailSent]]
    _threads: Callable[[str], list[ThreadSummary]]
    _read_thread: Callable[[str, str], list[Letter]]

    def _named(self, name: object, verb: str, what: str = "agent") -> str:
        """A name-taking verb acting as ``name``: deprecated, and refused for a handled agent."""
        warnings.warn(f"Mailbox.{verb}(...) acting as a named agent is deprecated: act through "
                      "box.agent(name)", DeprecationWarning, stacklevel=3)
        return self._as_agent(name, verb, what)

    def _as_agent(self, name: object, verb: str, what: str = "agent") -> str:
        """The plain name a verb acting by ``name`` (its argument ``what``) acts as; refused
        (``PermissionError``) once that agent's handle was given out, whatever type carries the
        name."""
        plain = text(name, what, verb)
        if plain in self._handles:
            raise PermissionError(f"{verb}: {plain!r} acts only through its handle "
                                  f"(box.agent({plain!r}) was given out)")
        return plain

    def send(self, recipient: str, body: Any, *, sender: str, **options: Any) -> Receipt:
        """Deprecated: ``box.agent(sender).send(recipient, body, ...)``."""
        return self._send(recipient, body, sender=self._named(sender, "send", "sender"), **options)

    def reply(self, agent: str, thread: str, body: Any, **options: Any) -> Receipt:
        """Deprecated: ``box.agent(agent).reply(thread, body, ...)``."""
        return self._reply(self._named(agent, "reply"), thread, body, **options)

    def withdraw(self, id: str, *, sender: str) -> str:
        """Deprecated: ``box.agent(sender).withdraw(id)``."""
        return self._withdraw(id, sender=self._named(sender, "withdraw", "sender"))

    def receive(self, agent: str, *, limit: int = 50) -> list[MailSent]:
        """Deprecated: ``box.agent(agent).receive(limit=...)``."""
        return self._receive(self._named(agent, "receive"), limit=limit)

    def threads(self, agent: str) -> list[ThreadSummary]:
        """Deprecated: ``box.agent(agent).threads()``."""
        return self._threads(self._named(agent, "threads"))

    def read_thread(self, agent: str, thread: str, *, reader: str | None = None) -> list[Letter]:
        """Deprecated: ``box.agent(agent).read(thread)`` (``reader`` other than ``agent`` is
        refused with ``PermissionError``)."""
        if reader is None:
            return self._read_thread(self._named(agent, "read_thread"), thread)
        reader = self._named(reader, "read_thread", "reader")
        agent = text(agent, "agent", "read_thread")
        if reader != agent:
            raise PermissionError(f"read of thread {thread!r} of {agent!r}: {reader!r} may not "
                                  "read another agent's threads")
        return self._read_thread(agent, thread)
