"""What a driver reports back to the loop (its happenings), and the answers the loop gives a tool
call that never got its own.

A driver performs the loop's command, then tells :func:`~nous_inbox.loop.advance` what happened:
a turn opened (:class:`TurnOpened`), a claim took these messages (:class:`ClaimAnswered`), the
model answered (:class:`ModelAnswered`), the tools finished (:class:`ToolsFinished`), its
framework retried on its own (:class:`Retried`), someone cancelled (:class:`Cancelled`) or the
run failed (:class:`Failed`). The loop refuses one that does not fit where it stands.

A turn that ends with tool calls unanswered answers each, so the transcript stays well-formed: as
cancelled before it ran (:func:`cancelled_result`) or as interrupted while it ran
(:func:`interrupted_result`); :func:`open_calls` finds them.

>>> ClaimAnswered(Target.NEXT_STEP, [Message.user("check b.py")]).messages[0].content
'check b.py'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from nous_inbox.message import Message, ToolCall
from nous_inbox.verbs import Target

__all__ = [
    "Cancelled",
    "ClaimAnswered",
    "Failed",
    "Happening",
    "ModelAnswered",
    "Retried",
    "ToolsFinished",
    "TurnOpened",
    "cancelled_result",
    "interrupted_result",
    "open_calls",
]


class TurnOpened(msgspec.Struct, frozen=True):
    """Turn ``turn`` opens for ``reason`` on the session's ``transcript`` so far."""

    turn: int
    reason: str = "wake"
    transcript: Sequence[Message] = ()


class ClaimAnswered(msgspec.Struct, frozen=True):
    """The happening that answers a ``Claim``: what the claim of ``target`` took (possibly
    nothing).

    Claiming: ``Claim`` asks, ``ClaimAnswered`` answers, ``QueueClaimed`` is recorded, ``Claimed``
    is the view."""

    target: Target
    messages: Sequence[Message] = ()


class ModelAnswered(msgspec.Struct, frozen=True):
    """The model replied with this assistant message."""

    message: Message


class ToolsFinished(msgspec.Struct, frozen=True):
    """The tool calls ran; one ``tool`` message per call, in call order.

    ``final`` says the results are the answer (a framework's output tool, whose return ends its
    run): the boundary after them is then a would-be final answer's (ruling 2), not a step's."""

    results: Sequence[Message]
    final: bool = False


class Retried(msgspec.Struct, frozen=True):
    """The driver's framework answered the reply itself with ``message`` (a user message, its
    own nudge: a retry after an empty reply or a refused answer) and will ask the model again.

    The request is one the run makes anyway, so the claim before it is a plain one: a pending
    message joins the framework's words (rulings 1 and 3). It is the framework's own request, so
    a budget of added requests only (``added_only``, ruling 5) does not spend on it.
    """

    message: Message


class Cancelled(msgspec.Struct, frozen=True):
    """Someone cancelled the turn. ``results`` are the answers the driver has for the calls it
    was running (a tool that ran before the cancel, or :func:`interrupted_result` for one cut
    off in flight), in any order; a call without one is answered with :func:`cancelled_result`.
    """

    results: Sequence[Message] = ()


class Failed(msgspec.Struct, frozen=True):
    """The model (or the driver) failed in a way the run cannot go on from; ``error`` says how."""

    error: str


Happening = (TurnOpened | ClaimAnswered | ModelAnswered | ToolsFinished | Retried | Cancelled
             | Failed)


def cancelled_result(call: ToolCall) -> Message:
    """The tool message that answers a call the turn ended before running."""
    return Message.tool(
        "cancelled: the turn ended before this tool ran", call.id, name=call.name,
        metadata={"error": "cancelled"},
    )


def interrupted_result(call: ToolCall, cause: str = "the owner stopped") -> Message:
    """The tool message that answers a call cut off while its tool ran: the owner stopped
    mid-turn, or (``cause``) the turn was cancelled. The tool started; whether it finished, and
    what it did, is unknown.

    >>> interrupted_result(ToolCall("c1", "deploy"), "the turn was cancelled").content
    'interrupted: the turn was cancelled before this tool answered'
    """
    return Message.tool(
        f"interrupted: {cause} before this tool answered", call.id, name=call.name,
        metadata={"error": "interrupted"},
    )


def open_calls(transcript: Sequence[Message], answered: Iterable[str] = ()) -> list[ToolCall]:
    """The calls of the transcript's last assistant message that no later tool message (nor an
    id in ``answered``) answers: what a turn must answer before the transcript is well-formed.

    >>> open_calls([Message.assistant(tool_calls=[ToolCall("a", "ls"), ToolCall("b", "cat")]),
    ...             Message.tool("x", "a")])
    [ToolCall(id='b', name='cat')]
    """
    done = set(answered)
    for index in range(len(transcript) - 1, -1, -1):
        message = transcript[index]
        if message.role == "assistant":
            return [call for call in message.tool_calls if call.id not in done]
        if message.role == "tool" and message.tool_call_id is not None:
            done.add(message.tool_call_id)
    return []
