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
from typing import Annotated, Final

import msgspec

from nous_inbox.message import Message
from nous_inbox.verbs import VERBS, VerbName

__all__ = [
    "BLANK_RANGES",
    "NOT_BLANK",
    "SHAPES",
    "ApiError",
    "CancelAnswer",
    "CancelRequest",
    "InboxCounts",
    "ModelView",
    "QueuedEntry",
    "Queues",
    "SendAccepted",
    "SendRequest",
    "SessionBrief",
    "SessionList",
    "SessionState",
    "SessionSummary",
    "WithdrawRequest",
]


# -- request bodies: decoded strictly, so a wrong type or an unknown field is a 400 naming it ----

#: The characters a blank text is made of (ruling 4: whitespace and the invisible format
#: characters, :func:`~nous_inbox.message.blank_text`), as ranges of code points, Unicode 14
#: (Python 3.11). Written out rather than found at import, which would read every code point;
#: the tests hold it to ``blank_text``.
BLANK_RANGES: Final = (
    (0x9, 0xD), (0x1C, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0xAD, 0xAD), (0x600, 0x605),
    (0x61C, 0x61C), (0x6DD, 0x6DD), (0x70F, 0x70F), (0x890, 0x891), (0x8E2, 0x8E2),
    (0x1680, 0x1680), (0x180E, 0x180E), (0x2000, 0x200F), (0x2028, 0x202F), (0x205F, 0x2064),
    (0x2066, 0x206F), (0x3000, 0x3000), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)

#: A text worth a model round, as a JSON Schema pattern: one character at least that is not
#: blank. The document says it; the server's check is ``checked_text``'s, the one blank rule.
NOT_BLANK: Final = "[^" + "".join(
    chr(first) if first == last else f"{chr(first)}-{chr(last)}" for first, last in BLANK_RANGES
) + "]"


class SendRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A message for a session: ``mode`` is the send verb (``steer`` and ``inject`` join the run
    at its next step, ``followup`` and ``prompt`` wait for a turn; ``steer``, ``followup`` and
    ``prompt`` wake the agent), ``text`` what the person says (not blank)."""

    mode: VerbName
    text: Annotated[str, msgspec.Meta(extra_json_schema={"minLength": 1, "pattern": NOT_BLANK})]


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


class InboxCounts(msgspec.Struct, frozen=True):
    """How many messages wait on each queue, and whether one of them wants to wake the agent."""

    next_turn: int
    next_step: int
    wants_wake: bool


class SessionBrief(msgspec.Struct, frozen=True):
    """A session's state as the server knows it without reading its log: ``version`` the seq of
    the last event it knows; ``running``, ``turn`` and ``step`` its run; ``inbox`` its queues.
    Live for a session held here; for one held elsewhere, as of the server's last scan."""

    version: int
    running: bool
    turn: int
    step: int
    inbox: InboxCounts


class SessionSummary(msgspec.Struct, frozen=True):
    """A session of the store: its id, whether this server holds it now, and its ``state`` as
    this server knows it (``null``: not read here; open the session to read its log)."""

    id: str
    hosted: bool
    state: SessionBrief | None


class SessionList(msgspec.Struct, frozen=True):
    """A page of the store's sessions, sorted by id: those from ``offset`` of the ``total``
    whose id starts with the prefix asked for."""

    sessions: list[SessionSummary]
    total: int
    offset: int


class QueuedEntry(msgspec.Struct, frozen=True):
    """A message waiting on a queue: ``seq`` is its send's seq (the number to withdraw it by),
    ``wakeup`` whether its send asked to wake the agent."""

    seq: int
    message: Message
    wakeup: bool


class Queues(msgspec.Struct, frozen=True):
    """The first messages waiting on each queue, in the order they were sent (the counts say how
    many wait in all)."""

    next_turn: list[QueuedEntry]
    next_step: list[QueuedEntry]


class SessionState(msgspec.Struct, frozen=True):
    """A session as it stands: ``version`` is the seq of its last event; ``running``, ``turn``
    and ``step`` its run; ``inbox`` its queues' counts and ``queued`` their first messages;
    ``transcript`` the page of its transcript from ``offset`` (of ``transcript_length`` messages
    in all)."""

    id: str
    version: int
    hosted: bool
    running: bool
    turn: int
    step: int
    inbox: InboxCounts
    queued: Queues
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


class ModelView(msgspec.Struct, frozen=True):
    """What the model was shown at the request recorded at ``seq`` (turn ``turn``, step
    ``step``): the first ``count`` messages of the transcript, of which ``messages`` is the page
    from ``offset``. The transcript only grows, so its first ``count`` messages are the ones the
    model was asked with."""

    seq: int
    turn: int
    step: int
    count: int
    offset: int
    messages: list[Message]
