"""nous_inbox: talk to an AI agent while it is working.

A message sent to a running agent waits in an inbox and joins the run at its next step boundary (or
its next turn), so the run is redirected instead of restarted, and nothing is lost, even across a
crash. This package is the core: the message, the two-queue inbox value, the one event vocabulary,
replay, the loop's table and the codec. It touches no disk, socket, thread or event loop; the shell
lives in subpackages imported when needed: :mod:`nous_inbox.store` (logs and stores),
:mod:`nous_inbox.runner` (a turn with a model and tools), :mod:`nous_inbox.owner` (the actors that
hold a session), :mod:`nous_inbox.mailbox`, :mod:`nous_inbox.adapters`, :mod:`nous_inbox.cli` and
:mod:`nous_inbox.web`.

>>> import nous_inbox as ni
>>> inbox = ni.Inbox().inject("the deploy is frozen").steer("stop and summarize")
>>> inbox.wants_wake()
True
>>> messages, inbox = inbox.claim("next_step")
>>> [m.content for m in messages]
['the deploy is frozen', 'stop and summarize']
"""

import logging as _logging
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from nous_inbox.codec import read_events
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
from nous_inbox.events import SCHEMA_VERSION, Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message, Role, ToolCall
from nous_inbox.queued import Claimed, Entry
from nous_inbox.session import Session, replay
from nous_inbox.verbs import Target

if _TYPE_CHECKING:
    __version__: str
else:  # a type checker sees the face alone, so a misspelt name is still refused

    def __getattr__(name: str) -> _Any:
        """``__version__``, read from the installed distribution's metadata when first asked:
        ``importlib.metadata`` loads ``email`` and ``socket``, which the core does not need."""
        if name != "__version__":
            raise AttributeError(f"module 'nous_inbox' has no attribute {name!r}")
        from importlib import metadata

        try:
            version = metadata.version("nous-inbox")
        except metadata.PackageNotFoundError:  # a bare checkout on sys.path, never installed
            version = "0+unknown"
        globals()["__version__"] = version
        return version


# A host that set up no logging hears nothing from the library (not Python's last-resort stderr).
_logging.getLogger("nous_inbox").addHandler(_logging.NullHandler())

__all__ = [
    "SCHEMA_VERSION",
    "Claimed",
    "ConcurrencyError",
    "DecodeError",
    "Entry",
    "Event",
    "Inbox",
    "LeaseLostError",
    "Message",
    "MessageSent",
    "OutcomeUnknownError",
    "QueueClaimed",
    "RecordTooLargeError",
    "ReplayError",
    "Role",
    "Session",
    "StoreError",
    "StreamOwnedError",
    "Target",
    "ToolCall",
    "UnexpectedHappeningError",
    "read_events",
    "replay",
]
