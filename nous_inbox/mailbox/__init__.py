"""The mailbox layer: addressed delivery between named agents (threads, wake classes, notices,
withdraw, replies), durable in the store's one event vocabulary.

:mod:`nous_inbox.mailbox.mailbox` is the mailbox, :mod:`nous_inbox.mailbox.handle` the
handle an agent acts through (:mod:`nous_inbox.mailbox.names` how its name is read) (its answers and errors are :mod:`nous_inbox.mailbox.answers`);
:mod:`nous_inbox.mailbox.tools` the tools a model reads and answers its mail with; :mod:`nous_inbox.mailbox.rules`
its rules (message classes, who may wake whom, settling, bounds, what a notice says and when it
is due); :mod:`nous_inbox.mailbox.changes` the events each verb that writes appends;
:mod:`nous_inbox.mailbox.state` the fold its events make, and :mod:`nous_inbox.mailbox.records`
what that fold keeps; and :mod:`nous_inbox.mailbox.owner_link` the link to the owners that run
its agents, through which notices are delivered.
"""

from nous_inbox.mailbox.answers import (
    AskTimeoutError,
    Letter,
    MailboxFullError,
    Receipt,
    ThreadSummary,
)
from nous_inbox.mailbox.handle import AgentHandle
from nous_inbox.mailbox.mailbox import STREAM, Mailbox
from nous_inbox.mailbox.owner_link import Recipient
from nous_inbox.mailbox.rules import (
    DEBOUNCE,
    KIND_ALIASES,
    KINDS,
    MAX_QUEUE,
    MAX_WAIT,
    NO_ANSWER,
    NOTICE,
    REMEMBER,
    RETAIN,
    compose,
    plan,
    preview,
    wakes,
)
from nous_inbox.mailbox.state import MailboxState
from nous_inbox.mailbox.tools import mailbox_tools

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
    "AgentHandle",
    "AskTimeoutError",
    "Letter",
    "Mailbox",
    "MailboxFullError",
    "MailboxState",
    "Receipt",
    "Recipient",
    "ThreadSummary",
    "compose",
    "mailbox_tools",
    "plan",
    "preview",
    "wakes",
]
