"""nous_inbox: talk to an AI agent while it is working.

A message sent to a running agent waits in an inbox and joins the run at its next step boundary (or
its next turn), so the run is redirected instead of restarted, and nothing is lost, even across a
crash. This module is the public face: it re-exports and defines nothing.

>>> import nous_inbox as ni
>>> inbox = ni.Inbox().inject("the deploy is frozen").steer("stop and summarize")
>>> ni.wants_wake(inbox)
True
>>> messages, inbox = ni.claim(inbox, "next_step")
>>> [m.content for m in messages]
['the deploy is frozen', 'stop and summarize']
"""

import logging as _logging
from importlib import metadata as _metadata

from nous_inbox.async_owner import AsyncOwner
from nous_inbox.boundary import Boundary, BoundaryKind
from nous_inbox.errors import (
    ConcurrencyError,
    DecodeError,
    LeaseLostError,
    OutcomeUnknownError,
    RecordTooLargeError,
    ReplayError,
    StoreError,
    StreamOwnedError,
    UnexpectedHappeningError,
)
from nous_inbox.events import (
    SCHEMA_VERSION,
    CancelRequested,
    Event,
    MailSent,
    MessageSent,
    ModelReplied,
    ModelRequested,
    Nudged,
    QueueClaimed,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.inbox import (
    Claimed,
    Entry,
    Inbox,
    Target,
    claim,
    count,
    followup,
    has_pending,
    inject,
    send,
    steer,
    wants_wake,
    worth_waking,
)
from nous_inbox.loop import ToolSpec
from nous_inbox.mailbox import (
    KIND_ALIASES,
    AgentHandle,
    Letter,
    Mailbox,
    MailboxFullError,
    Receipt,
    ThreadSummary,
    mailbox_tools,
)
from nous_inbox.message import Message, Role, ToolCall
from nous_inbox.owner import Owner
from nous_inbox.owner_body import request_cancel
from nous_inbox.port import LocalSession, SessionPort
from nous_inbox.runner import Runner, Tool, tool
from nous_inbox.session import Session, replay
from nous_inbox.store import (
    FileStore,
    MemoryStore,
    OwnerLease,
    SqliteStore,
    Store,
    StoreLockedError,
    default_store_url,
    open_store,
)
from nous_inbox.turn_result import (
    AsyncTurnHandle,
    TurnCancelled,
    TurnError,
    TurnFailed,
    TurnHandle,
    TurnResult,
)

try:  # one source of truth for the version: the installed distribution's metadata
    __version__ = _metadata.version("nous-inbox")
except _metadata.PackageNotFoundError:  # a bare checkout on sys.path, never installed
    __version__ = "0+unknown"

# A host that set up no logging hears nothing from the library (not Python's last-resort stderr).
_logging.getLogger("nous_inbox").addHandler(_logging.NullHandler())

__all__ = [
    "SCHEMA_VERSION",
    "AgentHandle",
    "AsyncOwner",
    "AsyncTurnHandle",
    "Boundary",
    "BoundaryKind",
    "CancelRequested",
    "Claimed",
    "ConcurrencyError",
    "DecodeError",
    "LeaseLostError",
    "OutcomeUnknownError",
    "Entry",
    "Event",
    "FileStore",
    "Inbox",
    "KIND_ALIASES",
    "Letter",
    "LocalSession",
    "Owner",
    "MemoryStore",
    "MailSent",
    "Mailbox",
    "MailboxFullError",
    "Message",
    "MessageSent",
    "ModelReplied",
    "ModelRequested",
    "Nudged",
    "OwnerLease",
    "QueueClaimed",
    "Receipt",
    "RecordTooLargeError",
    "ReplayError",
    "Role",
    "Runner",
    "Session",
    "SessionPort",
    "SqliteStore",
    "StepEnded",
    "StepStarted",
    "Store",
    "StoreError",
    "StoreLockedError",
    "StreamOwnedError",
    "Target",
    "ThreadSummary",
    "Tool",
    "ToolCall",
    "ToolCalled",
    "ToolReturned",
    "ToolSpec",
    "TurnCancelled",
    "TurnEnded",
    "TurnError",
    "TurnFailed",
    "TurnHandle",
    "TurnResult",
    "TurnStarted",
    "UnexpectedHappeningError",
    "Warned",
    "claim",
    "count",
    "default_store_url",
    "followup",
    "has_pending",
    "inject",
    "mailbox_tools",
    "open_store",
    "replay",
    "request_cancel",
    "send",
    "steer",
    "tool",
    "wants_wake",
    "worth_waking",
]
