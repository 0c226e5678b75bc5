"""A tool's answer as the log can hold it: every call is answered, whatever the tool returned.

A run records each tool's answer as a ``ToolReturned`` event, and a store refuses a record above
its size limit (``max_record_size``) or text that is not valid UTF-8 (a lone surrogate, as
``os.listdir`` returns for a name that is not UTF-8). A result the log could not hold would end
the turn with a store error and leave the call unanswered, so :func:`tool_message` turns such a
result into an error message the model reads instead, and :func:`fitting_error` cuts a long
error text (a tool that raised with a whole payload in its message) to fit. The transcript stays
well-formed either way.

Measuring a record means encoding it, so only a result that could be near the limit is measured:
a character takes at most 6 bytes in a record (JSON-escaped), and the record's envelope (stream
name, numbers) at most :data:`_ENVELOPE` bytes, so shorter text is let through unencoded.
"""

from __future__ import annotations

import json
import logging
from typing import Final

from nous_inbox.codec import MAX_STREAM_NAME, Record, encode_record
from nous_inbox.events import ToolReturned
from nous_inbox.message import Message, ToolCall

__all__ = ["error_result", "fitting_error", "tool_message"]

logger: Final = logging.getLogger("nous_inbox.runner")


def error_result(call: ToolCall, kind: str, text: str) -> Message:
    """The tool message that answers ``call`` with an error of ``kind`` (its metadata's
    ``"error"``, for a reader that tells them apart) the model reads as ``text``.

    >>> error_result(ToolCall("c1", "ls"), "unknown_tool", "unknown tool 'ls'").content
    "error: unknown tool 'ls'"
    """
    return Message.tool(f"error: {text}", call.id, name=call.name, metadata={"error": kind})


def fitting_error(call: ToolCall, kind: str, text: str, limit: int) -> Message:
    """:func:`error_result`, its text cut short when the record would be above ``limit`` (the
    store's record limit): a tool that raised with a long message, under a store with a small
    limit, must still answer its call rather than end the turn with a store error."""
    # As in tool_message: a character takes at most 6 bytes in a record.
    fixed = (len(call.id) + len(call.name) + len(kind)) * 6 + _ENVELOPE + _FIXED
    if len(text) * 6 + fixed <= limit or _record_size(
            error_result(call, kind, text)) + _ENVELOPE <= limit:
        return error_result(call, kind, text)
    room = max(0, (limit - fixed) // 6 - len(_CUT))
    logger.warning("tool %r: its error text is cut to fit a record", call.name)
    return error_result(call, kind, text[:room] + _CUT)


_CUT: Final = "... (cut to fit the log's record limit)"

_ENVELOPE: Final = 4 * MAX_STREAM_NAME + 256
"""Bytes a ToolReturned record may take beyond what :func:`_record_size` measures: the stream's
name (at most ``MAX_STREAM_NAME`` characters, 4 bytes each at most), the seq, time, turn, step
and batch position at their longest, and MessagePack's longer string headers. A bound, not a
guess: a result under it is one every store of this package takes (a host's own store
with another envelope says so by a smaller ``max_record_size``)."""

_FIXED: Final = 512
"""Bytes a ToolReturned record of empty text, id and name takes at most, envelope aside (131):
with :data:`_ENVELOPE`, what lets a short result through without encoding it twice."""


def _record_size(message: Message) -> int:
    """The size of ``message``'s ToolReturned record as the ``file:`` store writes it (JSON, the
    larger encoding), with an empty stream name and its numbers at zero: :data:`_ENVELOPE`
    covers those."""
    event = ToolReturned(turn=0, step=0, message=message)
    return len(encode_record(Record(stream="", event=event)))


def tool_message(call: ToolCall, value: object, limit: int) -> Message:
    """A tool's return value as its tool message, or an error message when the log cannot hold
    it: text with a lone surrogate, or a record above ``limit``, the size limit of the
    store the port records into. The transcript stays well-formed either way: every call gets
    its answer (unless the call's own id and name are beyond the limit: then no answer fits).

    The runner answers each call through it; a loop of one's own can too, to record what the
    runner would::

        >>> tool_message(ToolCall("c1", "dump"), "x" * 9000, 8192).metadata["error"]
        'result_too_large'
    """
    try:
        if isinstance(value, str):
            text = value
        elif isinstance(value, (dict, list, tuple)):
            text = json.dumps(value, ensure_ascii=False, default=str)
        else:
            text = str(value)
        message = Message.tool(text, call.id, name=call.name)
    except (TypeError, ValueError, RecursionError) as exc:
        logger.warning("tool %r returned a result the log cannot hold", call.name)
        return error_result(call, "unstorable_result", f"the result cannot be stored: {exc}")
    # A character takes at most 6 bytes in a record (JSON-escaped), so only long text, a long
    # call id or tool name (the model's), can be near the limit: the rest are not encoded twice.
    if (len(text) + len(call.id) + len(call.name)) * 6 + _ENVELOPE + _FIXED > limit:
        try:
            size = _record_size(message) + _ENVELOPE
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            logger.warning("tool %r returned a result the log cannot hold", call.name)
            return error_result(call, "unstorable_result",
                                 f"the result cannot be stored: {exc}")
        if size > limit:
            logger.warning("tool %r returned %d bytes, above the record limit", call.name, size)
            return error_result(
                call, "result_too_large",
                f"the result is at most {size} bytes as a log record, above the limit of "
                f"{limit} bytes; return less (a summary, a page, a path)",
            )
    return message
