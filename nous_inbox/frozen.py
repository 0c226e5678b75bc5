"""FrozenDict and FrozenList: JSON trees that compare equal to the dicts and lists they came from,
hash by content, and refuse every change.

A message's ``metadata`` and a tool call's ``arguments`` are JSON-able trees that must be hashable
(a message is a value) and must compare equal to what the caller passed (``m.metadata == {...}``).

>>> d = FrozenDict({"from": "leo", "tags": FrozenList(["a", "b"])})
>>> d == {"from": "leo", "tags": ["a", "b"]}, hash(d) == hash(FrozenDict(d))
(True, True)
>>> d["from"] = "someone else"
Traceback (most recent call last):
...
TypeError: FrozenDict is immutable: build a new one instead

Design note: these subclass ``dict`` and ``list`` rather than using ``pyrsistent.pmap``/``pvector``.
Every replayed message with metadata builds one, and ``pmap`` is pure Python, many times the
cost of a ``dict`` subclass built in C. Being real dicts and
lists, msgspec also encodes them natively, with no encode hook. Callers never mutate them in place
(that is refused), so they share structure safely; the queues themselves stay ``pvector``s, where
persistence matters. The hash is not cached: it is asked for only when a message is hashed, and a
cache would need an ``__init__`` in Python, which would cost every build.
"""

from __future__ import annotations

from typing import Any, NoReturn, SupportsIndex

__all__ = ["FrozenDict", "FrozenList"]


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
