"""The one event vocabulary: every change to a session is one of these.

The runner's stream, the log on disk and the input of replay are the same events. Each is a frozen,
tagged ``msgspec.Struct`` carrying its stream sequence number ``seq`` (1, 2, 3, ... per stream,
assigned by the store that appends it) and the wall-clock time ``at`` it happened. The tag (the
``type`` key on the wire) names the event; readers refuse tags they do not know.

>>> import msgspec
>>> event = MessageSent(target=Target.NEXT_STEP, wakeup=True, message=Message.user("go"), seq=1)
>>> msgspec.json.encode(event)
b'{"type":"message_sent","target":"next_step","wakeup":true,"message":{"role":"user","content":"go"},"seq":1}'

Three events change the inbox: ``MessageSent``, ``QueueClaimed`` and ``MessageWithdrawn``. A
claim records how many messages it took so replay can check itself, and it *is* the transcript
entry those messages become: a crash can leave a message queued or in the transcript, never
both, never neither. A withdraw names the send it takes back by that send's ``seq``, the number
its acknowledgement carried.

The rest are the runner's bookkeeping, in one vocabulary so a UI, the log and replay agree: a turn
opens (``TurnStarted``), each step asks the model (``StepStarted``, ``ModelRequested``,
``ModelReplied``), runs tools (``ToolCalled``, ``ToolReturned``) and ends (``StepEnded``); the loop
may add its own nudge (``Nudged``), and the turn ends with its step count and reason
(``TurnEnded``). ``Warned`` records a problem the run survived. ``CancelRequested`` is anyone's
request, from any thread or process, that the open turn end at its next boundary.

Schema evolution: ``SCHEMA_VERSION`` is written in every log header. A field added later always
has a default, so records written by an older version still decode; a log from a *newer* version
is refused with a clear error rather than misread. A renamed field keeps its old wire name as a
private, defaulted field that the event's ``__post_init__`` folds into the new one, so the
upgrade happens in the type itself: every decoder (JSON Lines, MessagePack, a store's own) reads
both spellings, record by record, and no decoder needs to know the history. Schema 2 renamed
``ModelRequested.messages`` to ``count`` this way. A new event type moves the version too: an
older reader cannot know the tag, so the header tells it to upgrade before it meets one (and a
reader meeting a tag it does not know says the same, whatever the header claims).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from nous_inbox.message import Message, ToolCall
from nous_inbox.verbs import Target

__all__ = [
    "EVENT_TYPES",
    "MAIL_EVENT_TYPES",
    "SCHEMA_VERSION",
    "CancelRequested",
    "Event",
    "MailAgent",
    "MailAnswered",
    "MailDropped",
    "MailEvent",
    "MailNoticed",
    "MailRead",
    "MailReceived",
    "MailSent",
    "MailWithdrawn",
    "MessageSent",
    "MessageWithdrawn",
    "ModelReplied",
    "ModelRequested",
    "Nudged",
    "QueueClaimed",
    "SessionReleased",
    "StepEnded",
    "StepStarted",
    "ToolCalled",
    "ToolReturned",
    "TurnEndReason",
    "TurnEnded",
    "TurnStarted",
    "Warned",
]

SCHEMA_VERSION: Final = 5
"""The version of the event schema this library writes; it reads every version up to it.

1: the first. 2: ``ModelRequested.messages`` is renamed ``count`` (it always held a count).
3: new event types ``cancel_requested`` and ``mail_agent``; ``TurnEnded`` gains ``output`` and
``usage``. 4: new event type ``message_withdrawn``. 5: new event type ``session_released``;
``TurnEnded`` may end ``"released"``.
"""


# A count or number that is never negative. msgspec checks the bound when it decodes, so an
# event built with a negative one is refused by the store's read-back proof before it is written.
_Count = Annotated[int, msgspec.Meta(ge=0)]


# Events are not tracked by the cyclic garbage collector (gc=False, inherited by every event): an
# event holds numbers, text and messages, none of which can refer back to it, so a store or an
# owner holding a long log does not make every collection walk all of it.
class _Base(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True,
            repr_omit_defaults=True, gc=False):
    seq: int = 0
    at: float = 0.0


class MessageSent(_Base, tag="message_sent", frozen=True):
    """A message was queued on ``target`` (``wakeup``: whether it should wake an idle agent)."""

    target: Target
    wakeup: bool
    message: Message


class MessageWithdrawn(_Base, tag="message_withdrawn", frozen=True):
    """The message the send at seq ``sent`` queued on ``target`` was taken back before any
    claim took it: it never reaches the model.

    Recorded only while that message is still queued (:meth:`Session.withdraw
    <nous_inbox.session.Session.withdraw>` decides), so replay checks it: a withdraw of a
    message that is not waiting on ``target`` is a ``ReplayError``.
    """

    sent: Annotated[int, msgspec.Meta(ge=1)]
    target: Target


class QueueClaimed(_Base, tag="queue_claimed", frozen=True):
    """The oldest ``count`` messages queued on ``target`` entered the transcript, in order.

    ``rest`` is how many stayed queued behind them: 0 (the default, and every claim a run
    makes) means the claim took the whole queue. Replay checks ``count + rest`` against the
    queue, so a log that disagrees with itself is caught either way.

    Claiming: ``loop.Claim`` asks, ``loop.ClaimAnswered`` answers, ``QueueClaimed`` is recorded,
    ``inbox.Claimed`` is the view.
    """

    target: Target
    count: _Count
    rest: _Count = 0


class TurnStarted(_Base, tag="turn_started", frozen=True):
    """Turn number ``turn`` (1, 2, ...) opened; ``reason`` says what opened it ("wake", "prompt")."""

    turn: _Count
    reason: str = "wake"


class StepStarted(_Base, tag="step_started", frozen=True):
    """Step ``step`` (1, 2, ...) of turn ``turn`` began: a step is one model request and its tools."""

    turn: _Count
    step: _Count


class ModelRequested(_Base, tag="model_requested", frozen=True):
    """The model was asked, with a transcript of ``count`` entries.

    Schema 1 called the field ``messages``; a record written so still decodes, into ``count``
    (see the module's note on schema evolution).

    >>> import msgspec
    >>> old = b'{"type":"model_requested","turn":1,"step":2,"messages":5}'
    >>> msgspec.json.decode(old, type=Event)
    ModelRequested(turn=1, step=2, count=5)
    """

    turn: _Count
    step: _Count
    count: int = -1  # required: the default only lets a schema-1 record decode (checked below)
    _schema1_messages: int | None = msgspec.field(default=None, name="messages")

    def __post_init__(self) -> None:
        # Upgrade a schema-1 record as it is decoded, whatever its log's header says: a log
        # begun by an older version may have been appended to by a newer one.
        if self._schema1_messages is not None or type(self.count) is not int or self.count < 0:
            self._upgrade_or_refuse()

    def _upgrade_or_refuse(self) -> None:
        old = self._schema1_messages
        if old is not None:
            if self.count != -1:  # never both: a fourth positional argument, or a mangled record
                raise ValueError(
                    f"ModelRequested takes count; messages={old!r} is count's schema-1 name, "
                    "not a second field"
                )
            msgspec.structs.force_setattr(self, "count", old)
            msgspec.structs.force_setattr(self, "_schema1_messages", None)
        count = self.count
        if type(count) is not int or count < 0:
            if count == -1:
                raise ValueError("ModelRequested needs count (schema 1 called it messages)")
            raise ValueError(f"ModelRequested.count must be an int >= 0, got {count!r}")


class ModelReplied(_Base, tag="model_replied", frozen=True):
    """The model answered; ``message`` (an assistant message) joins the transcript."""

    turn: _Count
    step: _Count
    message: Message


class ToolCalled(_Base, tag="tool_called", frozen=True):
    """A tool call the model asked for is about to run."""

    turn: _Count
    step: _Count
    call: ToolCall


class ToolReturned(_Base, tag="tool_returned", frozen=True):
    """A tool finished (or failed); its ``tool`` message joins the transcript."""

    turn: _Count
    step: _Count
    message: Message


class StepEnded(_Base, tag="step_ended", frozen=True):
    """Step ``step`` of turn ``turn`` finished."""

    turn: _Count
    step: _Count


class Nudged(_Base, tag="nudged", frozen=True):
    """The loop added a message of its own (a continuation nudge); it joins the transcript.

    Its ``metadata["provenance"]`` says so, unlike a delivered message, which is a plain user
    message: the words of a person are never attributed to the loop, nor the loop's to a person.
    """

    turn: _Count
    step: _Count
    message: Message


TurnEndReason = Literal["final", "budget", "cancelled", "error", "released"]
"""How a turn ended. ``"released"``: its holder let the session go at a boundary of the turn (a
rolling restart's drain, :class:`SessionReleased`), and the next holder carries the work on in a
turn of its own, opened as ``"resumed"``."""


class TurnEnded(_Base, tag="turn_ended", frozen=True):
    """Turn ``turn`` ended after ``steps`` steps, for ``reason``.

    ``output`` is the turn's typed output as JSON, where the runner has one (a pydantic-ai
    ``output_type``); ``usage`` the counts the model reported over the turn (tokens,
    requests), where it reports them. Both are read back by
    :class:`~nous_inbox.owner.turn_ledger.TurnResult`.
    """

    turn: _Count
    steps: _Count
    reason: TurnEndReason
    error: str | None = None
    output: Any = None
    usage: dict[str, int | float] | None = None


class CancelRequested(_Base, tag="cancel_requested", frozen=True):
    """Someone (any thread, any process) asked that turn ``turn`` end as ``"cancelled"``.

    Recorded only while that turn is open and not yet asked to end
    (:meth:`Session.cancel <nous_inbox.session.Session.cancel>`), so it never reaches a later turn.
    The session's owner ends the turn at its next boundary and wakes nothing after it (ruling 9).
    """

    turn: _Count


class SessionReleased(_Base, tag="session_released", frozen=True):
    """The session's holder let it go on purpose (a host draining for a rolling restart), so
    another holder may take it at once rather than wait for the lease to expire.

    ``turn`` is the open turn it stopped at a boundary, between two steps, for the next holder
    to carry on: that holder ends it as ``"released"`` and opens a ``"resumed"`` turn at once.
    0: no turn was stopped so (the session was idle, or its turn was cut off mid-step, which
    the next holder closes as it closes the turn of a holder that died).
    """

    turn: _Count = 0


class Warned(_Base, tag="warned", frozen=True):
    """Something went wrong that the run survived (a failing message source, a capped budget)."""

    text: str


# -- The mailbox's events (nous_inbox.mailbox) -------------------------------------------------------
# Addressed delivery between named agents lives in a stream of its own (never a session's), folded
# by nous_inbox.mailbox.state, not by Session.apply (which passes them by, as it does any event it
# has no use for). One fact each: sent, dropped at the bound, received, noticed, read, answered,
# withdrawn, an agent's parent and first turn. They are not tracked by the cyclic garbage collector (gc=False: a JSON body cannot
# refer back to its event), so a mailbox holding many queued messages does not make every
# collection walk them all.


class MailSent(_Base, tag="mail_sent", frozen=True, gc=False):
    """Message ``id`` from ``sender`` to ``recipient``: a JSON-able ``body``, of class ``kind``
    (``"action"``, ``"blocker"``, ``"report"``, ``"fyi"`` or ``"reply"``), in ``thread`` (the
    sender's name when it named none); ``reply_to`` is the id a reply answers."""

    id: str
    sender: str
    recipient: str
    body: Any = None
    kind: str = "action"
    thread: str = ""
    correlation_id: str | None = None
    reply_to: str | None = None


class MailDropped(_Base, tag="mail_dropped", frozen=True, gc=False):
    """Message ``id``, the oldest queued for ``recipient``, was dropped to make room (drop_oldest)."""

    id: str
    recipient: str


class MailReceived(_Base, tag="mail_received", frozen=True, gc=False):
    """``recipient`` took ``ids`` out of the mailbox (``receive``): they are its caller's now."""

    recipient: str
    ids: tuple[str, ...]


class MailNoticed(_Base, tag="mail_noticed", frozen=True, gc=False):
    """The notice ``notice`` carrying ``ids`` went into ``recipient``'s run (it was claimed)."""

    recipient: str
    notice: str
    ids: tuple[str, ...]


class MailRead(_Base, tag="mail_read", frozen=True, gc=False):
    """``recipient`` read ``ids`` (a thread read whole)."""

    recipient: str
    ids: tuple[str, ...]


class MailAnswered(_Base, tag="mail_answered", frozen=True, gc=False):
    """``ids`` (messages to ``recipient``) were answered by the reply ``by``."""

    recipient: str
    ids: tuple[str, ...]
    by: str


class MailWithdrawn(_Base, tag="mail_withdrawn", frozen=True, gc=False):
    """Its sender withdrew message ``id``: unsent (no notice had carried it) or ``retracted``."""

    id: str
    recipient: str
    retracted: bool = False


class MailAgent(_Base, tag="mail_agent", frozen=True, gc=False):
    """What the mailbox knows of ``agent`` beyond its mail: the ``parent`` declared for it (None:
    none declared by this record) and whether it has ``worked`` (had a turn of its own)."""

    agent: str
    parent: str | None = None
    worked: bool = False


MailEvent = (
    MailSent | MailDropped | MailReceived | MailNoticed | MailRead | MailAnswered | MailWithdrawn
    | MailAgent
)
"""Any of the mailbox's events."""

MAIL_EVENT_TYPES: Final[tuple[type[_Base], ...]] = (
    MailSent, MailDropped, MailReceived, MailNoticed, MailRead, MailAnswered, MailWithdrawn,
    MailAgent,
)
# -- end of the mailbox's events ----------------------------------------------------------------------


Event = (
    MessageSent
    | QueueClaimed
    | MessageWithdrawn
    | TurnStarted
    | StepStarted
    | ModelRequested
    | ModelReplied
    | ToolCalled
    | ToolReturned
    | StepEnded
    | Nudged
    | TurnEnded
    | Warned
    | CancelRequested
    | SessionReleased
    | MailEvent
)
"""Any event of the vocabulary (a tagged union msgspec decodes by its ``type`` key)."""

EVENT_TYPES: Final[tuple[type[_Base], ...]] = (
    MessageSent,
    QueueClaimed,
    MessageWithdrawn,
    TurnStarted,
    StepStarted,
    ModelRequested,
    ModelReplied,
    ToolCalled,
    ToolReturned,
    StepEnded,
    Nudged,
    TurnEnded,
    Warned,
    CancelRequested,
    SessionReleased,
    *MAIL_EVENT_TYPES,
)
