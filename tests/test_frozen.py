"""FrozenDict and FrozenList: equal to what they were built from, hashable, and unchangeable."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from nous_inbox.frozen import FrozenDict, FrozenList


def test_they_compare_equal_to_the_plain_containers_and_hash_by_content() -> None:
    d = FrozenDict({"a": 1, "b": FrozenList([1, 2])})
    assert d == {"a": 1, "b": [1, 2]}
    assert hash(d) == hash(FrozenDict({"b": FrozenList([1, 2]), "a": 1}))
    assert FrozenList([1, 2]) == [1, 2] and hash(FrozenList([1, 2])) == hash((1, 2))
    assert len({FrozenDict({"x": 1}), FrozenDict({"x": 1})}) == 1


DICT_CHANGES: list[Callable[[FrozenDict], Any]] = [
    lambda d: d.__setitem__("k", 2),
    lambda d: d.__delitem__("k"),
    lambda d: d.update(k=2),
    lambda d: d.pop("k"),
    lambda d: d.popitem(),
    lambda d: d.setdefault("z", 1),
    lambda d: d.clear(),
    lambda d: d.__ior__({"z": 1}),
]

LIST_CHANGES: list[Callable[[FrozenList], Any]] = [
    lambda v: v.__setitem__(0, 9),
    lambda v: v.__setitem__(slice(0, 1), [9]),
    lambda v: v.__delitem__(0),
    lambda v: v.append(9),
    lambda v: v.extend([9]),
    lambda v: v.insert(0, 9),
    lambda v: v.pop(),
    lambda v: v.remove(1),
    lambda v: v.reverse(),
    lambda v: v.sort(),
    lambda v: v.clear(),
    lambda v: v.__iadd__([9]),
    lambda v: v.__imul__(2),
]


@pytest.mark.parametrize("change", DICT_CHANGES)
def test_every_way_of_changing_a_frozen_dict_is_refused(change: Callable[[FrozenDict], Any]) -> None:
    d = FrozenDict({"k": 1})
    with pytest.raises(TypeError, match="FrozenDict is immutable"):
        change(d)
    assert d == {"k": 1}


@pytest.mark.parametrize("change", LIST_CHANGES)
def test_every_way_of_changing_a_frozen_list_is_refused(change: Callable[[FrozenList], Any]) -> None:
    v = FrozenList([1, 2])
    with pytest.raises(TypeError, match="FrozenList is immutable"):
        change(v)
    assert v == [1, 2]


def test_msgspec_writes_them_as_plain_json_and_copies_stay_frozen() -> None:
    tree = FrozenDict({"a": FrozenList([1, FrozenDict({"b": None})])})
    assert msgspec.json.encode(tree) == b'{"a":[1,{"b":null}]}'
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(tree)) == {"a": [1, {"b": None}]}
    for clone in (copy.copy(tree), copy.deepcopy(tree)):
        assert clone == tree and type(clone) is FrozenDict
    assert repr(tree) == "{'a': [1, {'b': None}]}"
