r"""What the mailbox answers: a send's :class:`Receipt`, a thread's :class:`Letter`\ s and
:class:`ThreadSummary`\ s, plain frozen records, so an answer never changes under its reader as
mail moves on; and its errors: :class:`MailboxFullError`, :class:`AskTimeoutError`, and the
refusal of a message that is not the caller's (:func:`not_yours`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from nous_inbox.mailbox.records import Mail

__all__ = ["AskTimeoutError", "Letter", "MailboxFullError", "Receipt", "ThreadSummary", "letter",
           "not_yours"]


class MailboxFullError(RuntimeError):
    """A send beyond a recipient's bound under the default ``overflow="refuse"``: nothing queued."""


class AskTimeoutError(TimeoutError):
    """An ask with no answer in time. Its question stays sent: ``id`` names it, so the asker
    can look for the answer later (``message(id)``) or take the question back
    (``withdraw(id)``)."""

    def __init__(self, message: str, id: str) -> None:
        super().__init__(message)
        self.id = id

    def __reduce__(self) -> tuple[type[AskTimeoutError], tuple[str, str]]:
        return type(self), (str(self), self.id)


def not_yours(where: str, id: str) -> PermissionError:
    """The refusal of message ``id`` to an agent that neither sent nor received it.

    It says that and nothing more, never who wrote to whom: ids are a mailbox's prefix and a
    counter, so an agent could try them one by one and map every correspondence from refusals
    that named the parties.

    >>> not_yours("message of 'qa'", "m-7")
    PermissionError("message of 'qa': message 'm-7' is not yours")
    """
    return PermissionError(f"{where}: message {id!r} is not yours")


class Receipt(msgspec.Struct, frozen=True, gc=False):
    """What a send answers: the message's ``id``, what became of it (``state``), whether the id
    had been sent before (``duplicate``) and, once answered, the reply that answered it."""

    id: str
    state: str
    duplicate: bool = False
    answer: str | None = None


class Letter(msgspec.Struct, frozen=True):
    """One message as a thread's read or a look-up by id shows it, with its ``state`` then (a
    read's, before the read), its ``recipient`` and the ``thread`` it is in there."""

    id: str
    sender: str
    body: Any
    kind: str
    at: float
    state: str
    correlation_id: str | None = None
    recipient: str = ""
    thread: str = ""


def letter(mail: Mail) -> Letter:
    """The :class:`Letter` a kept message shows as now."""
    event = mail.event
    return Letter(event.id, event.sender, event.body, event.kind, event.at, mail.state,
                  event.correlation_id, event.recipient, mail.thread)


class ThreadSummary(msgspec.Struct, frozen=True):
    """One of an agent's threads: who wrote in it, how many messages, unread and new ones."""

    thread: str
    senders: tuple[str, ...]
    count: int
    unread: int
    new: int
    newest_at: float
    preview: str
