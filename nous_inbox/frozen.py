"""JSON trees as values: :func:`freeze_json` makes one immutable and :func:`thaw_json` plain again;
:class:`FrozenDict` and :class:`FrozenList` are what it is made of.

A message's ``metadata`` and a tool call's ``arguments`` are JSON-able trees that must be hashable
(a message is a value), must compare equal to what the caller passed (``m.metadata == {...}``),
and must read back from every log: so a tree is checked as it is frozen, and anything a log could
not hold is refused with an error naming the path to it.

>>> d = FrozenDict({"from": "leo", "tags": FrozenList(["a", "b"])})
>>> d == {"from": "leo", "tags": ["a", "b"]}, hash(d) == hash(FrozenDict(d))
(True, True)
>>> d["from"] = "someone else"
Traceback (most recent call last):
...
TypeError: FrozenDict is immutable: build a new one instead

"Serializable" means by both log formats, JSON and MessagePack: so integers must fit in 64 bits,
floats must be finite, text must have a UTF-8 form (no lone surrogates), and containers may nest
at most ``MAX_DEPTH`` (64) deep, well inside what every decoder here reads back.

Design note: the containers subclass ``dict`` and ``list`` rather than using
``pyrsistent.pmap``/``pvector``. Every replayed message with metadata builds one, and ``pmap`` is
pure Python, many times the cost of a ``dict`` subclass built in C. Being real dicts and lists,
msgspec also encodes them natively, with no encode hook. Callers never mutate them in place (that
is refused), so they share structure safely; the queues themselves stay ``pvector``s, where
persistence matters. The hash is not cached: it is asked for only when a message is hashed, and a
cache would need an ``__init__`` in Python, which would cost every build. Freezing walks a tree of
plain dicts and lists (what decoding gives) without keeping a path, and only on doubt walks it
again, carefully, to name the place of an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, NoReturn, SupportsIndex

from pyrsistent import PVector

__all__ = [
    "EMPTY", "MAX_DEPTH", "FrozenDict", "FrozenList", "check_text", "freeze_json", "freeze_mapping",
    "thaw_json",
]


def _refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is immutable: build a new one instead")


class FrozenDict(dict[str, Any]):
    """A ``dict`` that cannot change and hashes by its items (values must be hashable)."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __repr__(self) -> str:
        return dict.__repr__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse


class FrozenList(list[Any]):
    """A ``list`` that cannot change and hashes like the tuple of its items."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))

    def __repr__(self) -> str:
        return list.__repr__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __setitem__(self, index: SupportsIndex | slice, value: Any) -> NoReturn:
        _refuse(self)

    __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = reverse = sort = clear = _refuse


EMPTY: Final = FrozenDict()
"""The one empty ``FrozenDict``: what an empty mapping freezes to, and the default ``metadata`` of
a message and ``arguments`` of a tool call, so "none given" is an identity check."""
_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1
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
        except _NeedsCarefulWalk:
            pass
    return _freeze(value, path, ())


def _where(root: str, trail: tuple[str | int, ...]) -> str:
    """The path to a value, built only when there is an error to report."""
    return root + "".join(f"[{step!r}]" for step in trail)


def _freeze(value: Any, root: str, trail: tuple[str | int, ...]) -> Any:
    kind = type(value)
    if kind is str:
        if not value.isascii():
            check_text(value, _where(root, trail))
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
        check_text(value, _where(root, trail))
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
                check_text(key, f"{_where(root, trail)} key")
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


_SCALARS: Final = (str, int, float, bool, type(None))
"""What a frozen tree holds as it is: thawing one is handing it back."""


def thaw_json(value: Any) -> Any:
    """Turn a frozen JSON tree back into plain dicts and lists (for printing or ``json.dumps``).

    >>> thaw_json(freeze_json({"a": [1, 2]}, "x"))
    {'a': [1, 2]}
    """
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is FrozenDict or kind is dict or isinstance(value, Mapping):
        return {key: item if type(item) in _SCALARS else thaw_json(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple, PVector)):
        return [thaw_json(item) for item in value]
    return value


class _NeedsCarefulWalk(Exception):
    """Raised by ``_quick`` at anything it does not settle itself: the careful walk takes over."""


def _quick(value: dict[Any, Any] | list[Any], depth: int) -> FrozenDict | FrozenList:
    """Freeze a tree of plain dicts, lists and scalars, the shape decoding and most callers give.

    The same checks as ``_freeze`` (64-bit ints, finite floats, UTF-8 text, str keys, depth), but
    with no path kept, so replaying a tool call builds no trail tuple per value. Anything unusual
    (another type, a value that fails a check) raises ``_NeedsCarefulWalk``, and the caller reruns
    ``_freeze`` from the top, which builds the same value or the error naming the place.
    """
    if type(value) is list or type(value) is FrozenList:
        return _quick_list(value, depth)
    return _quick_dict(value, depth)  # type: ignore[arg-type]  # a list returned above


def _quick_dict(value: dict[Any, Any], depth: int) -> FrozenDict:
    # Copied whole in C first, then only the nested containers are swapped for frozen ones:
    # no Python-level store per key. Replay runs this once per decoded tool call.
    if depth >= MAX_DEPTH:
        raise _NeedsCarefulWalk
    out = FrozenDict(value)
    for key, item in value.items():
        if type(key) is not str:
            raise _NeedsCarefulWalk
        if not key.isascii():
            _utf8_or_careful(key)
        kind = type(item)
        if kind is str:
            if not item.isascii():
                _utf8_or_careful(item)
        elif kind is int:
            if item < _COMPACT_MIN or item > _COMPACT:
                _int64_or_careful(item)
        elif kind is list or kind is FrozenList:
            _dict_set(out, key, _quick_list(item, depth + 1))
        elif kind is dict or kind is FrozenDict:
            _dict_set(out, key, _quick_dict(item, depth + 1))
        elif kind is float:
            if not _isfinite(item):
                raise _NeedsCarefulWalk
        elif item is not None and kind is not bool:
            raise _NeedsCarefulWalk
    return out


def _quick_list(value: list[Any], depth: int) -> FrozenList:
    if depth >= MAX_DEPTH:
        raise _NeedsCarefulWalk
    for item in value:  # a list of scalars (the common case) is checked, then copied in C
        kind = type(item)
        if kind is str:
            if not item.isascii():
                _utf8_or_careful(item)
        elif kind is int:
            if item < _COMPACT_MIN or item > _COMPACT:
                _int64_or_careful(item)
        elif kind is dict or kind is list or kind is FrozenDict or kind is FrozenList:
            break
        elif kind is float:
            if not _isfinite(item):
                raise _NeedsCarefulWalk
        elif item is not None and kind is not bool:
            raise _NeedsCarefulWalk
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
                _utf8_or_careful(item)
        elif kind is int:
            if item < _COMPACT_MIN or item > _COMPACT:
                _int64_or_careful(item)
        elif kind is float:
            if not _isfinite(item):
                raise _NeedsCarefulWalk
        elif item is not None and kind is not bool:
            raise _NeedsCarefulWalk
        append(item)
    return FrozenList(out)


_dict_set: Final = dict.__setitem__
_COMPACT_MIN: Final = -(2**30 - 1)
_COMPACT: Final = 2**30 - 1
"""Integers within these bounds fit one internal digit, which CPython 3.11 compares on its
specialised fast path; a hot check tests them first and the 64-bit bounds only beyond."""


def _int64_or_careful(value: int) -> None:
    if not _INT_MIN <= value <= _INT_MAX:
        raise _NeedsCarefulWalk


def _utf8_or_careful(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _NeedsCarefulWalk from None


def check_text(value: str, where: str) -> None:
    """Refuse text a log cannot hold, naming ``where``: a lone surrogate (``'\\ud800'``) is a
    valid Python ``str`` but has no UTF-8 form, so neither JSON nor MessagePack can write it.
    ``isascii()`` is O(1) in CPython, so the common case costs nothing.

    >>> check_text("caf\\u00e9", "x")
    >>> check_text("\\ud800", "Message.content")
    Traceback (most recent call last):
    ...
    ValueError: Message.content: '\\ud800' at index 0 cannot be serialized (a lone surrogate has no UTF-8 form)
    """
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{where}: {value[exc.start:exc.end]!r} at index {exc.start} cannot be "
                "serialized (a lone surrogate has no UTF-8 form)"
            ) from None


def freeze_mapping(value: object, where: str) -> FrozenDict:
    """A JSON object (a mapping at the top) frozen, as a message's ``metadata`` and a tool call's
    ``arguments`` are: :data:`EMPTY` for an empty one, else :func:`freeze_json`'s tree; anything
    but a mapping is a ``TypeError`` naming ``where``.

    >>> freeze_mapping({}, "x") is EMPTY, freeze_mapping({"k": [1]}, "x") == {"k": [1]}
    (True, True)
    """
    if type(value) is not dict and not isinstance(value, Mapping):
        raise TypeError(f"{where} must be a mapping, got {type(value).__name__}")
    if not value:
        return EMPTY
    if type(value) is dict or type(value) is FrozenDict:
        try:
            return _quick(value, 0)  # type: ignore[return-value]
        except _NeedsCarefulWalk:
            pass
    frozen: FrozenDict = _freeze(value, where, ())
    return frozen
