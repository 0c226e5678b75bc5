"""A drop-in for PraisonAI's agent mailbox, over the library's durable mailbox.

``praisonaiagents.messaging`` gives agents an addressed mailbox: ``InProcessMailbox`` (``send``,
``receive``, ``subscribe``, ``pending``) carrying ``AgentMessage``s. This module has the same
names, constructor, methods, fields and behaviour, so swapping the import is the whole change:

>>> mailbox = InProcessMailbox()
>>> seen = []
>>> mailbox.subscribe("writer", lambda msg: seen.append(msg.body))
>>> _ = mailbox.send("writer", "Need a title", sender="researcher", correlation_id="q1")
>>> for req in mailbox.receive("writer"):
...     _ = mailbox.send(req.sender, "RAG in Practice", sender="writer",
...                      correlation_id=req.correlation_id)
>>> [m.body for m in mailbox.receive("researcher") if m.correlation_id == "q1"], seen
(['RAG in Practice'], ['Need a title'])

What is the same: ``max_inbox`` (keyword only, default 1000, ``ValueError`` when not positive)
bounds each recipient's queue, and at the bound the oldest message is dropped to make room, with
no exception; ``receive`` drains up to ``limit`` (50) oldest first; subscribers run on the
sender's thread outside the lock, and one that raises is logged without stopping the others;
``AgentMessage`` has ``sender``, ``recipient``, ``body``, ``id`` (a uuid4 by default), ``ts``,
``correlation_id``, ``to_dict()`` and ``from_dict()``. It satisfies PraisonAI's
``AgentMailboxProtocol`` by shape; this module never imports PraisonAI.

What is better: a drop is not silent here. It is recorded and counted (``dropped(agent_id)``).
Give ``store`` (a URL such as ``"sqlite:mail.sqlite"``, or a store) and every message survives a
restart: a new ``InProcessMailbox`` on the same store has the same queues.

What differs, on purpose: a ``body`` must be JSON-able (the library never queues what it could
not write down), so a send of anything else is a ``TypeError`` naming it, and nothing is queued;
and a received ``body`` is an equal copy of what was sent, not the same object. PraisonAI's
calls name the agent they act as, so the drop-in acts as each agent through its handle on the
mailbox underneath, taken the first time it sends as or receives for that agent: an agent whose
handle was given out before (``mailbox.agent(name)``) acts only through it, and the drop-in's
``send`` as it and ``receive`` for it are refused with ``PermissionError``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import msgspec

from nous_inbox.events import MailSent
from nous_inbox.frozen import thaw_json
from nous_inbox.mailbox import AgentHandle, Mailbox
from nous_inbox.mailbox.names import text
from nous_inbox.store import Store

__all__ = ["STREAM", "AgentMessage", "InProcessMailbox"]

STREAM: Final = "praisonai"
"""The store stream an ``InProcessMailbox`` keeps its messages in, unless told another."""


def _uuid() -> str:
    return str(uuid.uuid4())


class AgentMessage(msgspec.Struct, gc=False):
    """An addressed message between two agents, with PraisonAI's fields and defaults.

    >>> msg = AgentMessage("researcher", "writer", {"findings": [1, 2]}, id="m1", ts=1.5)
    >>> msg.to_dict()
    {'id': 'm1', 'sender': 'researcher', 'recipient': 'writer', 'body': {'findings': [1, 2]}, 'ts': 1.5, 'correlation_id': None}
    >>> AgentMessage.from_dict(msg.to_dict()) == msg
    True
    """

    sender: str
    recipient: str
    body: Any
    id: str = msgspec.field(default_factory=_uuid)
    ts: float = msgspec.field(default_factory=time.time)
    correlation_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The message as a plain dict (PraisonAI's keys)."""
        return {"id": self.id, "sender": self.sender, "recipient": self.recipient,
                "body": self.body, "ts": self.ts, "correlation_id": self.correlation_id}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AgentMessage:
        """A message from a plain dict; a missing ``id`` or ``ts`` gets a new one."""
        return cls(sender=data["sender"], recipient=data["recipient"], body=data.get("body"),
                   id=data["id"] if "id" in data else _uuid(),
                   ts=data["ts"] if "ts" in data else time.time(),
                   correlation_id=data.get("correlation_id"))


def _message(event: MailSent) -> AgentMessage:
    """The PraisonAI message a mailbox event is, with a body the receiver may change (as
    ``receive`` builds them, written out there for its list)."""
    body = event.body
    return AgentMessage(event.sender, event.recipient,
                        body if type(body) is str else thaw_json(body), event.id, event.at,
                        event.correlation_id)


class InProcessMailbox:
    """PraisonAI's addressed mailbox, durable when given a ``store``; see the module notes.

    ``clock`` and ``ids`` are the mailbox's underneath (:class:`~nous_inbox.mailbox.Mailbox`):
    what stamps each message's ``ts``, and what makes up its ``id``.
    """

    def __init__(self, *, max_inbox: int = 1000, store: Store | str | None = None,
                 stream: str = STREAM, clock: Callable[[], float] = time.time,
                 ids: Callable[[], str] | None = None) -> None:
        if type(max_inbox) is not int:
            raise TypeError(f"InProcessMailbox: max_inbox must be an int, got {max_inbox!r}")
        if max_inbox <= 0:
            raise ValueError("max_inbox must be greater than zero")
        self._max_inbox = max_inbox
        self._mailbox = Mailbox(store, stream=stream, max_queue=max_inbox,
                                overflow="drop_oldest", clock=clock, ids=ids)
        self._agents: dict[str, AgentHandle] = {}  # the handles this drop-in acts through
        self._taking = threading.Lock()

    def _as(self, name: object, what: str, verb: str) -> AgentHandle:
        """The handle of agent ``name`` (the argument ``what`` of ``verb``), taken the first time;
        ``PermissionError`` if someone else was given it."""
        handle = self._agents.get(name) if type(name) is str else None
        if handle is not None:
            return handle
        plain = text(name, what, verb)
        with self._taking:
            handle = self._agents.get(plain)
            if handle is None:
                try:
                    handle = self._mailbox.agent(plain)
                except ValueError:
                    raise PermissionError(f"{verb}: {plain!r} acts only through its handle "
                                          f"(mailbox.agent({plain!r}) was given out)") from None
                self._agents[plain] = handle
        return handle

    def send(self, recipient: str, body: Any, *, sender: str,
             correlation_id: str | None = None) -> str:
        """Send ``body`` to the agent named ``recipient``; returns the message's id."""
        # The handle taken before, found without a call to _as: a send is the commonest call.
        handle = self._agents.get(sender) if type(sender) is str else None
        if handle is None:
            handle = self._as(sender, "sender", "send")
        return handle.send(recipient, body, correlation_id=correlation_id).id

    def receive(self, agent_id: str, *, limit: int = 50) -> list[AgentMessage]:
        """Take up to ``limit`` pending messages for ``agent_id``, oldest first."""
        handle = self._as(agent_id, "agent", "receive")
        if limit <= 0:
            return []
        return [AgentMessage(e.sender, e.recipient,
                             e.body if type(e.body) is str else thaw_json(e.body), e.id, e.at,
                             e.correlation_id)
                for e in handle.receive(limit=limit)]

    def subscribe(self, agent_id: str, callback: Callable[[AgentMessage], None]) -> None:
        """Call ``callback(message)`` for each message delivered to ``agent_id`` from now on."""
        if not callable(callback):
            raise TypeError(f"subscribe to {agent_id!r}: callback must be callable")
        self._mailbox.subscribe(agent_id, lambda event: callback(_message(event)))

    def pending(self, agent_id: str) -> int:
        """How many messages are queued for ``agent_id``."""
        return self._mailbox.pending(agent_id)

    def dropped(self, agent_id: str) -> int:
        """How many of ``agent_id``'s messages were dropped at the bound (PraisonAI drops them
        silently; here each is an event in the log, and counted)."""
        return self._mailbox.dropped(agent_id)

    @property
    def mailbox(self) -> Mailbox:
        """The library mailbox underneath: threads, notices, replies, withdraw."""
        return self._mailbox

    def close(self) -> None:
        """Close the store if this mailbox opened it from a URL."""
        self._mailbox.close()

    def __enter__(self) -> InProcessMailbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
