"""The mailbox layer: addressed delivery between named agents (threads, wake classes, notices,
withdraw, replies), durable in the store's one event vocabulary.

See :mod:`nous_inbox.mailbox.post` for the rules, :mod:`nous_inbox.mailbox.notice` for when and
how an agent hears of its mail, and :mod:`nous_inbox.mailbox.state` for the fold.
:mod:`nous_inbox.mailbox.routing` holds the routing of hosts that keep one inbox value per agent
(addresses, a send clock, which followups a run is owed), which the aimu adapter is a face over.
"""

from nous_inbox.mailbox.notice import DEBOUNCE, MAX_WAIT, NOTICE, compose, plan, preview
from nous_inbox.mailbox.post import (
    KIND_ALIASES,
    MAX_QUEUE,
    STREAM,
    Letter,
    Mailbox,
    MailboxFullError,
    Receipt,
    ThreadSummary,
)
from nous_inbox.mailbox.state import KINDS, NO_ANSWER, REMEMBER, RETAIN, MailboxState, wakes
from nous_inbox.mailbox.wiring import Recipient

__all__ = [
    "DEBOUNCE",
    "KINDS",
    "KIND_ALIASES",
    "MAX_QUEUE",
    "MAX_WAIT",
    "NOTICE",
    "NO_ANSWER",
    "REMEMBER",
    "RETAIN",
    "STREAM",
    "Letter",
    "Mailbox",
    "MailboxFullError",
    "MailboxState",
    "Receipt",
    "Recipient",
    "ThreadSummary",
    "compose",
    "plan",
    "preview",
    "wakes",
]
