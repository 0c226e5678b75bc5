"""The TEXT of a send: from the command line, from stdin (``-``) or from a file (``--file``).

A shell caps one argument (about 128 KB on Linux), so a long message, a pasted log say, comes
through stdin or a file: ``nous-inbox steer s - < notes.txt``. Whichever way it comes, it is
read as UTF-8, at most ``MAX_TEXT_BYTES`` of it, and must say something (the core's blank rule,
:func:`~nous_inbox.inbox.is_blank`, decides what says nothing): a mistake in any of these is a
usage error that names where the text came from.

>>> import io
>>> message_text(None, "-", io.BytesIO("read cdn.log next\\n".encode()))
'read cdn.log next\\n'
>>> message_text(None, None, io.BytesIO())
Traceback (most recent call last):
...
nous_inbox.cli.usage.UsageError: no message: give TEXT, - to read it from stdin, or --file PATH
"""

from __future__ import annotations

from typing import IO, Final

from nous_inbox.cli.usage import UsageError
from nous_inbox.inbox import is_blank
from nous_inbox.message import Message

__all__ = ["MAX_TEXT_BYTES", "message_text"]

#: The most a message may take, in UTF-8 bytes: well inside one event's record limit (16 MiB),
#: so a text this long is stored by every store at its default limit.
MAX_TEXT_BYTES: Final = 4 * 1024 * 1024


def _read_bytes(stream: IO[bytes], where: str) -> bytes:
    data = stream.read(MAX_TEXT_BYTES + 1)
    if len(data) > MAX_TEXT_BYTES:
        raise UsageError(
            f"the message from {where} is larger than {MAX_TEXT_BYTES:,} bytes, the most one "
            "message may take; nothing was sent"
        )
    return data


def _decoded(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"the message from {where} is not valid UTF-8 (at byte {exc.start}); "
            "no store can keep it"
        ) from None


def message_text(file: str | None, text: str | None, stdin: IO[bytes] | None) -> str:
    """The message a send carries: ``text``, stdin's bytes when ``text`` is ``-``, or ``file``'s.
    ``stdin`` is ``None`` for a process started without one (its stdin closed).

    Raises :class:`UsageError` for no message, both a TEXT and a ``--file``, a text above
    ``MAX_TEXT_BYTES``, one that is not UTF-8 and one the core counts blank (whitespace only);
    a file that cannot be read is an ``OSError`` naming it.
    """
    if file is not None and text is not None:
        raise UsageError("give TEXT or --file PATH, not both")
    if file is not None:
        with open(file, "rb") as stream:
            message = _decoded(_read_bytes(stream, f"--file {file}"), f"--file {file}")
    elif text == "-":
        if stdin is None:
            raise UsageError("- reads the message from stdin, but there is no stdin (it is closed)")
        message = _decoded(_read_bytes(stdin, "stdin"), "stdin")
    elif text is None:
        raise UsageError("no message: give TEXT, - to read it from stdin, or --file PATH")
    else:
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:  # a byte the shell passed that decodes to nothing
                raise UsageError(
                    f"TEXT is not valid UTF-8 (a byte that decodes to nothing, at character "
                    f"{exc.start}); no store can keep it"
                ) from None
        if len(text) * 4 > MAX_TEXT_BYTES and len(text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise UsageError(f"TEXT is larger than {MAX_TEXT_BYTES:,} bytes; nothing was sent")
        message = text
    if is_blank((Message.user(message),)):
        raise UsageError("the message is empty; an empty message is never worth a model round")
    return message
