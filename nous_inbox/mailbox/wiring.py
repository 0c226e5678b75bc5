"""What the mailbox needs from the owner of an agent's session, and its note of each one.

The mailbox delivers notices through the owner's own verbs: a ``steer`` for a running turn, a
``followup`` to join a waiting prompt's turn or to wake an idle agent. It reads the ``session``
(is a run going? is a prompt waiting?) and ``listen``s for claims, since a notice counts as heard
only once a run claimed it. :class:`nous_inbox.owner.Owner` is such a recipient; so is anything
with these members.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from nous_inbox.events import Event
from nous_inbox.message import Message
from nous_inbox.session import Session

__all__ = ["Desk", "Recipient"]


@runtime_checkable
class Recipient(Protocol):
    """The owner of an attached agent's session, as the mailbox uses it."""

    @property
    def session(self) -> Session:
        """The session as folded so far."""

    @property
    def running(self) -> bool:
        """Whether a run is going."""

    def steer(self, message: Message) -> Any:
        """Queue ``message`` for the next step, waking."""

    def followup(self, message: Message) -> Any:
        """Queue ``message`` for the next turn, waking."""

    def listen(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback`` with every event the session records from now on."""


class Desk:
    """One attached agent: its owner and the notice in flight (id and the ids it carries)."""

    __slots__ = ("agent", "in_flight", "owner")

    def __init__(self, agent: str, owner: Recipient) -> None:
        self.agent = agent
        self.owner = owner
        self.in_flight: tuple[str, tuple[str, ...]] | None = None
