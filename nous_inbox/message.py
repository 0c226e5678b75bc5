"""Message: the one thing a queue holds.

A message is a plain, immutable value: a role, some text, and optionally a name, JSON-able
metadata, the tool calls an assistant asked for, or the id of the call a tool message answers.
Because a message may be written to a log and read back after a restart, nothing enters one that
cannot be serialized: a lock, a function or a socket anywhere inside ``metadata`` is refused when
the message is built, with an error that names the path to the offending value.

>>> m = Message.user("check the staging log instead", metadata={"from": "leo"})
>>> m.role, m.content
('user', 'check the staging log instead')
>>> m.metadata == {"from": "leo"}
True
>>> m == Message.user("check the staging log instead", metadata={"from": "leo"})
True
>>> Message.user("x", metadata={"lock": object()})
Traceback (most recent call last):
...
TypeError: Message.metadata['lock']: object is not JSON-able (allowed: None, bool, int, float, str, list, tuple, dict with str keys)

Design notes: ``Message`` is a frozen ``msgspec.Struct`` rather than an ``attrs`` class because it
is built once per send and decoded once per event on replay, and a Struct is both cheaper to build
and decoded natively by msgspec. Nested containers are frozen JSON trees
(:func:`~nous_inbox.frozen.freeze_json`, which says what "serializable" means) so a message is
hashable, and they compare equal to the dicts and lists given. Messages and tool calls are not
tracked by the cyclic garbage collector (``gc=False``): their frozen trees cannot refer back to
them, so a long transcript is not walked by every collection.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import msgspec
from pyrsistent import PMap, PVector

from nous_inbox.frozen import EMPTY, check_text, freeze_mapping

__all__ = ["ROLES", "Message", "Role", "ToolCall", "blank_text", "enc_hook"]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: Final = frozenset({"system", "user", "assistant", "tool"})

_set = msgspec.structs.force_setattr
_isascii: Final = str.isascii
"""``str.isascii`` unbound: one call checks that a value is a str (else ``TypeError``) and that
its text needs no further check (a non-ASCII str may hold a lone surrogate)."""


def blank_text(text: str) -> bool:
    """Whether ``text`` shows nothing: empty, whitespace, or invisible characters only (zero-width
    and other format characters, Unicode category Cf, such as U+200B). The one blank rule
    (ruling 4): a message decides it once, when it is built (:attr:`Message.blank`).

    >>> blank_text(" \\n"), blank_text("\\u200b \\ufeff"), blank_text("\\u200bgo")
    (True, True, False)
    """
    # Stops at the first visible character, so ordinary text costs a character or two.
    return all(ch.isspace() or unicodedata.category(ch) == "Cf" for ch in text)


def _check_optional_str(value: object, where: str) -> None:
    if value is not None:
        if not isinstance(value, str):
            raise TypeError(f"{where} must be a str or None, got {type(value).__name__}")
        check_text(value, where)



class ToolCall(msgspec.Struct, frozen=True, omit_defaults=True, repr_omit_defaults=True,
               gc=False):
    """A tool call an assistant message asks for: which tool, with which arguments.

    ``id`` ties the call to the ``tool`` message that answers it (``Message.tool(..., call_id)``).

    >>> call = ToolCall("c1", "read_file", {"path": "staging.log"})
    >>> call.arguments == {"path": "staging.log"}
    True
    """

    id: str
    name: str
    arguments: Mapping[str, Any] = EMPTY

    def __post_init__(self) -> None:
        self._check_id_and_name()
        if self.arguments is not EMPTY:
            _set(self, "arguments", freeze_mapping(self.arguments, "ToolCall.arguments"))

    def _check_id_and_name(self) -> None:
        if not isinstance(self.id, str) or not isinstance(self.name, str):
            raise TypeError(
                f"ToolCall.id and ToolCall.name must be str, got {type(self.id).__name__} "
                f"and {type(self.name).__name__}"
            )
        check_text(self.id, "ToolCall.id")
        check_text(self.name, "ToolCall.name")


def _tool_calls(value: object) -> tuple[ToolCall, ...]:
    if value == ():
        return ()
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(
            f"Message.tool_calls must be a sequence of ToolCall, got {type(value).__name__}"
        )
    calls = []
    for i, call in enumerate(value):
        if isinstance(call, ToolCall):
            calls.append(call)
        elif isinstance(call, Mapping):
            try:
                calls.append(ToolCall(**call))
            except (TypeError, ValueError) as exc:
                # Same error type, with the path inside the message in front of it.
                raise type(exc)(f"Message.tool_calls[{i}]: {exc}") from None
        else:
            raise TypeError(
                f"Message.tool_calls[{i}] must be a ToolCall or a mapping, "
                f"got {type(call).__name__}"
            )
    return tuple(calls)


#: The default ``tool_calls``: compared by identity in ``__post_init__`` so a message without
#: calls skips the tuple check (any empty tuple would also pass the slow check).
_NO_CALLS: Final[tuple[ToolCall, ...]] = ()


class Message(msgspec.Struct, frozen=True, omit_defaults=True, repr_omit_defaults=True,
              gc=False):
    """One message: what a queue holds and what a transcript is made of.

    Immutable, hashable and equal by value. Build one with a constructor named for its role:

    >>> Message.user("hi")
    Message(role='user', content='hi')
    >>> Message.tool("42 lines", "c1").tool_call_id
    'c1'
    >>> Message(role="robot", content="hi")
    Traceback (most recent call last):
    ...
    ValueError: Message.role must be one of 'assistant', 'system', 'tool', 'user'; got 'robot'
    """

    role: Role
    content: str
    name: str | None = None
    metadata: Mapping[str, Any] = EMPTY
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    id: str | None = None
    blank: bool = False
    """Whether the message holds nothing worth a model round: no tool calls, and content that
    :func:`blank_text` calls blank (ruling 4). Decided when the message is built, from its
    content and tool calls (a value passed in is replaced); on the wire only when true, so a
    log written before it existed reads back the same."""

    def __post_init__(self) -> None:
        # Replay runs this once per decoded message, so the common case (a known role, ASCII
        # text, the optional strings absent or ASCII, tool calls already ToolCalls) is a handful
        # of cheap checks; anything else goes the long way, which names the field at fault.
        # str.isascii refuses anything but a str, so one call checks a field's type and text.
        # The role's type is checked first: a non-str equal to a role (a UserString, say) would
        # pass the set look-up and then fail only when the message is encoded.
        try:
            plain = type(self.role) is str and self.role in ROLES and _isascii(self.content)
        except TypeError:  # an unhashable role, or content that is not a str
            plain = False
        if not plain:
            self._check_role_and_content()
        name, call_id, id_ = self.name, self.tool_call_id, self.id
        if name is not None or call_id is not None or id_ is not None:
            try:
                plain = (
                    (name is None or _isascii(name))
                    and (call_id is None or _isascii(call_id))
                    and (id_ is None or _isascii(id_))
                )
            except TypeError:
                plain = False
            if not plain:
                _check_optional_str(name, "Message.name")
                _check_optional_str(call_id, "Message.tool_call_id")
                _check_optional_str(id_, "Message.id")
        metadata = self.metadata
        if metadata is not EMPTY:
            _set(self, "metadata", freeze_mapping(metadata, "Message.metadata"))
        calls = self.tool_calls
        if calls is not _NO_CALLS:
            if type(calls) is tuple:  # what decoding gives: kept if all are ToolCalls (each
                for call in calls:    # checked as it was built)
                    if type(call) is not ToolCall:
                        _set(self, "tool_calls", _tool_calls(calls))
                        break
            elif calls != ():
                _set(self, "tool_calls", _tool_calls(calls))
        # Decided here, whatever was given: a log written before the field, or a copy made by
        # ``msgspec.structs.replace`` with other content, carries a value that may not hold.
        content = self.content  # blank_text, its common case first, without the call
        blank = not self.tool_calls and (not content or content.isspace() or (
            not content.isascii() and blank_text(content)))
        if blank is not self.blank:
            _set(self, "blank", blank)

    def _check_role_and_content(self) -> None:
        if not isinstance(self.role, str):
            raise TypeError(f"Message.role must be a str, got {type(self.role).__name__}")
        if self.role not in ROLES:
            choices = ", ".join(repr(r) for r in sorted(ROLES))
            raise ValueError(f"Message.role must be one of {choices}; got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"Message.content must be a str, got {type(self.content).__name__}")
        check_text(self.content, "Message.content")

    @classmethod
    def user(cls, content: str, **fields: Any) -> Message:
        """A person's (or another agent's) words: what ``send`` makes of a plain ``str``."""
        return cls("user", content, **fields)

    @classmethod
    def system(cls, content: str, **fields: Any) -> Message:
        """Instructions for the model."""
        return cls("system", content, **fields)

    @classmethod
    def assistant(
        cls, content: str = "", tool_calls: Iterable[ToolCall | Mapping[str, Any]] = (), **fields: Any
    ) -> Message:
        """A model reply: text, tool calls, or both.

        >>> Message.assistant(tool_calls=[{"id": "c1", "name": "ls"}]).tool_calls[0].name
        'ls'
        """
        return cls("assistant", content, tool_calls=_tool_calls(tuple(tool_calls)), **fields)

    @classmethod
    def tool(cls, content: str, tool_call_id: str, **fields: Any) -> Message:
        """A tool's result, answering the call whose id is ``tool_call_id``."""
        return cls("tool", content, tool_call_id=tool_call_id, **fields)

    def to_dict(self) -> dict[str, Any]:
        """A plain-dict form (defaults left out), as it is written to a log.

        >>> Message.user("hi", metadata={"k": [1]}).to_dict()
        {'role': 'user', 'content': 'hi', 'metadata': {'k': [1]}}
        """
        result: dict[str, Any] = msgspec.to_builtins(self, enc_hook=enc_hook)
        if "tool_calls" in result:
            # to_builtins keeps a tuple a tuple; a log read back holds a list, and so should this.
            result["tool_calls"] = list(result["tool_calls"])
        return result


def enc_hook(value: Any) -> Any:
    """msgspec encode hook for the frozen containers a message holds."""
    if isinstance(value, PMap):
        return dict(value)
    if isinstance(value, PVector):
        return list(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")
