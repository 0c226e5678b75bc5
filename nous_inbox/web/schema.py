"""The HTTP API's types: what each request body must be and what each answer is.

One set of ``msgspec.Struct`` s does three jobs, so they cannot drift apart: a request body is
decoded into its Struct (every field's type checked, an unknown field refused), an answer is
encoded from its Struct, and the OpenAPI document (:mod:`nous_inbox.web.openapi`) is the JSON
Schema msgspec derives from the same classes. A client generated from the document reads and
writes exactly these shapes.

>>> import msgspec
>>> msgspec.json.decode(b'{"mode": "steer", "text": "look at the logs"}', type=SendRequest)
SendRequest(mode='steer', text='look at the logs')
>>> msgspec.json.encode(ApiError(error="missing or wrong bearer token"))
b'{"error":"missing or wrong bearer token"}'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from nous_inbox.message import Message
from nous_inbox.verbs import VERBS, VerbName

__all__ = [
    "SHAPES",
    "ApiError",
    "CancelAnswer",
    "CancelRequest",
    "InboxCounts",
    "SendAccepted",
    "SendRequest",
    "SessionList",
    "SessionState",
    "SessionSummary",
    "WithdrawRequest",
]


# -- request bodies: decoded strictly, so a wrong type or an unknown field is a 400 naming it ----


class SendRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A message for a session: ``mode`` is the send verb (``steer`` and ``inject`` join the run
    at its next step, ``followup`` and ``prompt`` wait for a turn; ``steer``, ``followup`` and
    ``prompt`` wake the agent), ``text`` what the person says (not blank)."""

    mode: VerbName
    text: str


class CancelRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A cancel takes no fields: send no body, or ``{}``."""


class WithdrawRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A withdraw takes no fields: send no body, or ``{}``."""


#: What each body looks like, for the error that refuses another.
SHAPES: Final[Mapping[type[msgspec.Struct], str]] = {
    SendRequest: '{"mode": ' + " | ".join(f'"{mode}"' for mode in VERBS) + ', "text": "..."}',
    CancelRequest: "no body, or {}",
    WithdrawRequest: "no body, or {}",
}


# -- answers ------------------------------------------------------------------------------------


class ApiError(msgspec.Struct, frozen=True):
    """Every refusal (each 4xx answer) has this one shape: ``error`` says what was wrong and
    where (the field, the query parameter, the header), and nothing was written."""

    error: str


class SessionSummary(msgspec.Struct, frozen=True):
    """A session of the store: its id, and whether this server holds it now."""

    id: str
    hosted: bool


class SessionList(msgspec.Struct, frozen=True):
    """Every session the store has, in its order."""

    sessions: list[SessionSummary]


class InboxCounts(msgspec.Struct, frozen=True):
    """How many messages wait on each queue, and whether one of them wants to wake the agent."""

    next_turn: int
    next_step: int
    wants_wake: bool


class SessionState(msgspec.Struct, frozen=True):
    """A session as it stands: ``version`` is the seq of its last event; ``running``, ``turn``
    and ``step`` its run; ``inbox`` its queues; ``transcript`` the page of its transcript from
    ``offset`` (of ``transcript_length`` messages in all)."""

    id: str
    version: int
    hosted: bool
    running: bool
    turn: int
    step: int
    inbox: InboxCounts
    transcript_length: int
    offset: int
    transcript: list[Message]


class SendAccepted(msgspec.Struct, frozen=True):
    """A send, stored: ``seq`` is its event's seq (the number to ask its receipt or withdraw it
    by), ``mode`` the verb it was sent with."""

    seq: int
    mode: VerbName


class CancelAnswer(msgspec.Struct, frozen=True):
    """Whether a run was going here to cancel, or a cancel was recorded for one held
    elsewhere."""

    cancelled: bool
