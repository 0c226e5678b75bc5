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
and decoded natively by msgspec. Nested containers are frozen (``FrozenDict`` and ``FrozenList``,
see ``nous_inbox.frozen``) so a message is hashable, and they compare equal to the dicts and lists
given. Messages and tool calls are not tracked by the cyclic garbage collector (``gc=False``):
their frozen trees cannot refer back to them, so a long transcript is not walked by every
collection.
"Serializable" means by both log formats, JSON and MessagePack: so integers must fit in 64 bits,
floats must be finite, text must have a UTF-8 form (no lone surrogates), and containers may nest
at most ``MAX_DEPTH`` (64) deep, well inside what every decoder here reads back.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import msgspec
from pyrsistent import PMap, PVector

from nous_inbox.frozen import FrozenDict, FrozenList

__all__ = [
    "MAX_DEPTH", "ROLES", "Message", "Role", "ToolCall", "blank_text", "enc_hook", "freeze_json",
    "thaw_json",
]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: Final = frozenset({"system", "user", "assistant", "tool"})

_EMPTY: Final = FrozenDict()
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
_set = msgspec.structs.force_setattr
_isfinite = math.isfinite

#: How many containers deep a JSON tree (a message's ``metadata``, a tool call's ``arguments``)
#: may nest, the outermost one counted as 1. Every reader here handles far more (msgspec's JSON and
#: MessagePack decoders and ``json.dumps`` stop near Python's recursion limit, some 500 to 1000
#: levels, less on a thread with a deep stack already), so a value accepted once is read back by
#: every store and printed by ``show --json``; real metadata is a few levels deep.
MAX_DEPTH: Final = 64


def freeze_json(value: Any, path: str) -> Any:
    """Return ``value`` as an immutable JSON-able tree, or raise naming ``path``.

    Mappings become ``FrozenDict``s and lists or tuples ``FrozenList``s; scalars pass through.
    Anything else (and any non-``str`` key, or a float that JSON cannot carry) is a ``TypeError``
    or ``ValueError`` whose message starts with ``path`` so the caller sees exactly where.

    >>> freeze_json({"a": [1, {"b": None}]}, "x") == {"a": [1, {"b": None}]}
    True
    >>> freeze_json({"a": float("nan")}, "x")
    Traceback (most recent call last):
    ...
    ValueError: x['a']: nan cannot be serialized (JSON has no NaN or infinity)

    A tree may nest ``MAX_DEPTH`` containers deep, the outermost counted as 1:

    >>> deep = [[[]]]
    >>> freeze_json(deep, "x") == deep
    True
    >>> for _ in range(MAX_DEPTH - 3):
    ...     deep = [deep]
    >>> freeze_json([deep], "x")
    Traceback (most recent call last):
    ...
    ValueError: x[0][0]...[0]: nested 65 containers deep, deeper than the limit of 64 (a log must be able to read back what it accepts)
    """
    kind = type(value)
    if kind is dict or kind is list:
        try:
            return _quick(value, 0)  # the walk without a path kept; any doubt, the careful one
        except _Slow:
            pass
    return _freeze(value, path, ())


def _where(root: str, trail: tuple[str | int, ...]) -> str:
    """The path to a value, built only when there is an error to report."""
    return root + "".join(f"[{step!r}]" for step in trail)


def _freeze(value: Any, root: str, trail: tuple[str | int, ...]) -> Any:
    kind = type(value)
    if kind is str:
        if not value.isascii():
            _check_text(value, _where(root, trail))
        return value
    if value is None or kind is bool:
        return value
    if isinstance(value, int):
        # MessagePack (the compact log format) carries 64-bit integers only; JSON would accept a
        # bigger one, so without this check a message could be written to one log and not another.
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(
                f"{_where(root, trail)}: {value} cannot be serialized (integers must fit in "
                "64 bits: -2**63 .. 2**64 - 1)"
            )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(
                f"{_where(root, trail)}: {value!r} cannot be serialized (JSON has no NaN or "
                "infinity)"
            )
        return value
    if isinstance(value, str):
        _check_text(value, _where(root, trail))
        return value
    if kind is dict or isinstance(value, Mapping):
        if len(trail) >= MAX_DEPTH:
            _too_deep(root, trail)
        items = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"{_where(root, trail)}: key {key!r} is {type(key).__name__}, keys must be str"
                )
            if not key.isascii():
                _check_text(key, f"{_where(root, trail)} key")
            if (type(item) is str and item.isascii()) or item is None:
                items[key] = item  # the commonest leaf, decided without a call (replay's hot path)
            else:
                items[key] = _freeze(item, root, (*trail, key))
        return FrozenDict(items)
    if isinstance(value, (list, tuple, PVector)):
        if len(trail) >= MAX_DEPTH:
            _too_deep(root, trail)
        return FrozenList([_freeze(item, root, (*trail, i)) for i, item in enumerate(value)])
    raise TypeError(
        f"{_where(root, trail)}: {type(value).__name__} is not JSON-able (allowed: None, bool, "
        "int, float, str, list, tuple, dict with str keys)"
    )


def _too_deep(root: str, trail: tuple[str | int, ...]) -> None:
    raise ValueError(
        f"{_where(root, trail)}: nested {len(trail) + 1} containers deep, deeper than the limit "
        f"of {MAX_DEPTH} (a log must be able to read back what it accepts)"
    )


def thaw_json(value: Any) -> Any:
    """Turn a frozen JSON tree back into plain dicts and lists (for printing or ``json.dumps``).

    >>> thaw_json(freeze_json({"a": [1, 2]}, "x"))
    {'a': [1, 2]}
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is FrozenDict or kind is dict or isinstance(value, Mapping):
        return {key: item if type(item) is str else thaw_json(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple, PVector)):
        return [thaw_json(item) for item in value]
    return value


class _Slow(Exception):
    """Raised by ``_quick`` at anything it does not settle itself: the careful walk takes over."""


def _quick(value: dict[Any, Any] | list[Any], depth: int) -> FrozenDict | FrozenList:
    """Freeze a tree of plain dicts, lists and scalars, the shape decoding and most callers give.

    The same checks as ``_freeze`` (64-bit ints, finite floats, UTF-8 text, str keys, depth), but
    with no path kept: a trail tuple per value was most of the cost of replaying a tool call.
    Anything unusual (another type, a value that fails a check) raises ``_Slow``, and the caller
    reruns ``_freeze`` from the top, which builds the same value or the error naming the place.
    """
    if type(value) is list or type(value) is FrozenList:
        return _quick_list(value, depth)
    return _quick_dict(value, depth)  # type: ignore[arg-type]  # a list returned above


def _quick_dict(value: dict[Any, Any], depth: int) -> FrozenDict:
    # Copied whole in C first, then only the nested containers are swapped for frozen ones:
    # no Python-level store per key. Replay runs this once per decoded tool call, and its Python
    # steps per value were most of the cost of decoding one.
    if depth >= MAX_DEPTH:
        raise _Slow
    out = FrozenDict(value)
    for key, item in value.items():
        if type(key) is not str:
            raise _Slow
        if not key.isascii():
            _utf8_or_slow(key)
        kind = type(item)
        if kind is str:
            if not item.isascii():
                _utf8_or_slow(item)
        elif kind is int:
            if item < _COMPACT_MIN or item > _COMPACT:
                _int64_or_slow(item)
        elif kind is list or kind is FrozenList:
            _dict_set(out, key, _quick_list(item, depth + 1))
        elif kind is dict or kind is FrozenDict:
            _dict_set(out, key, _quick_dict(item, depth + 1))
        elif kind is float:
            if not _isfinite(item):
                raise _Slow
        elif item is not None and kind is not bool:
            raise _Slow
    return out


def _quick_list(value: list[Any], depth: int) -> FrozenList:
    if depth >= MAX_DEPTH:
        raise _Slow
    for item in value:  # a list of scalars (the common case) is checked, then copied in C
        kind = type(item)
        if kind is str:
            if not item.isascii():
                _utf8_or_slow(item)
        elif kind is int:
            if item < _COMPACT_MIN or item > _COMPACT:
                _int64_or_slow(item)
        elif kind is dict or kind is list or kind is FrozenDict or kind is FrozenList:
            break
        elif kind is float:
            if not _isfinite(item):
                raise _Slow
        elif item is not None and kind is not bool:
            raise _Slow
    else:
        return FrozenList(value)
    # A container inside: built item by item, each container frozen in turn.
    out: list[Any] = []
    append = out.append
    for item in value:
        kind = type(item)
        if kind is dict or kind is FrozenDict:
            item = _quick_dict(item, depth + 1)
        elif kind is list or kind is FrozenList:
            item = _quick_list(item, depth + 1)
        elif kind is str:
            if not item.isascii():
                _utf8_or_slow(item)
        elif kind is int:
            if item < _COMPACT_MIN or item > _COMPACT:
                _int64_or_slow(item)
        elif kind is float:
            if not _isfinite(item):
                raise _Slow
        elif item is not None and kind is not bool:
            raise _Slow
        append(item)
    return FrozenList(out)


_dict_set: Final = dict.__setitem__
_isascii: Final = str.isascii
"""``str.isascii`` unbound: one call checks that a value is a str (else ``TypeError``) and that
its text needs no further check (a non-ASCII str may hold a lone surrogate)."""
_COMPACT_MIN: Final = -(2**30 - 1)
_COMPACT: Final = 2**30 - 1
"""Integers within these bounds fit one internal digit, which CPython 3.11 compares on its
specialised fast path; a hot check tests them first and the 64-bit bounds only beyond."""


def _int64_or_slow(value: int) -> None:
    if not _INT_MIN <= value <= _INT_MAX:
        raise _Slow


def _utf8_or_slow(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _Slow from None


def _check_text(value: str, where: str) -> None:
    # A lone surrogate ('\ud800') is a valid Python str but has no UTF-8 form, so neither JSON nor
    # MessagePack can write it. isascii() is O(1) in CPython, so the common case costs nothing.
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{where}: {value[exc.start:exc.end]!r} at index {exc.start} cannot be "
                "serialized (a lone surrogate has no UTF-8 form)"
            ) from None


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
        _check_text(value, where)


def _freeze_mapping(value: object, where: str) -> FrozenDict:
    if type(value) is not dict and not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a mapping, got {type(value).__name__}")
    if not value:
        return _EMPTY
    if type(value) is dict or type(value) is FrozenDict:
        try:
            return _quick(value, 0)  # type: ignore[return-value]
        except _Slow:
            pass
    frozen: FrozenDict = _freeze(value, where, ())
    return frozen


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
    arguments: Mapping[str, Any] = _EMPTY

    def __post_init__(self) -> None:
        self._check_id_and_name()
        if self.arguments is not _EMPTY:
            _set(self, "arguments", _freeze_mapping(self.arguments, "ToolCall.arguments"))

    def _check_id_and_name(self) -> None:
        if not isinstance(self.id, str) or not isinstance(self.name, str):
            raise TypeError(
                f"ToolCall.id and ToolCall.name must be str, got {type(self.id).__name__} "
                f"and {type(self.name).__name__}"
            )
        _check_text(self.id, "ToolCall.id")
        _check_text(self.name, "ToolCall.name")


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
    metadata: Mapping[str, Any] = _EMPTY
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
        if metadata is not _EMPTY:
            _set(self, "metadata", _freeze_mapping(metadata, "Message.metadata"))
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
        _check_text(self.content, "Message.content")

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
