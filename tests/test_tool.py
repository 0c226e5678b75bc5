"""Tools: what the model is shown (name, description, a JSON Schema from the annotations) and how
its arguments reach the callable (converted to the annotated types)."""

from __future__ import annotations

import enum
from typing import Any, Literal, Optional

import attrs
import msgspec
import pytest

import nous_inbox
import nous_inbox.runner
from nous_inbox.message import ToolCall
from nous_inbox.runner.tools import Tool, parameters_schema, tool


class Point(msgspec.Struct):
    x: int
    y: int = 0


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def properties(fn: Any) -> dict[str, Any]:
    found: dict[str, Any] = dict(Tool(fn).spec.parameters["properties"])
    return found


def test_tool_and_the_decorator_are_the_runners() -> None:
    assert nous_inbox.runner.Tool is Tool and nous_inbox.runner.tool is tool


def test_scalars_map_to_their_json_types_and_defaults_make_a_parameter_optional() -> None:
    def f(s: str, i: int, x: float, b: bool = False) -> None: ...

    assert properties(f) == {
        "s": {"type": "string"}, "i": {"type": "integer"}, "x": {"type": "number"},
        "b": {"type": "boolean"},
    }
    assert Tool(f).spec.parameters["required"] == ["s", "i", "x"]


def test_a_list_of_str_is_an_array_of_strings() -> None:
    def f(paths: list[str]) -> None: ...

    assert properties(f)["paths"] == {"type": "array", "items": {"type": "string"}}


def test_optional_allows_null() -> None:
    def f(limit: Optional[int] = None, note: str | None = None) -> None: ...  # noqa: UP045

    assert properties(f)["limit"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert properties(f)["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}]}


def test_literal_and_enum_are_enums() -> None:
    def f(mode: Literal["fast", "full"], color: Color) -> None: ...

    assert properties(f)["mode"] == {"enum": ["fast", "full"]}
    assert properties(f)["color"] == {"$ref": "#/$defs/Color"}
    assert Tool(f).spec.parameters["$defs"]["Color"]["enum"] == ["blue", "red"]


def test_a_struct_parameter_is_a_reference_into_defs() -> None:
    def move(to: Point) -> None: ...

    schema = Tool(move).spec.parameters
    assert schema["properties"]["to"] == {"$ref": "#/$defs/Point"}
    point = schema["$defs"]["Point"]
    assert point["properties"]["x"] == {"type": "integer"} and point["required"] == ["x"]


def test_unannotated_any_and_unsupported_annotations_accept_anything() -> None:
    def f(a, b: Any, c: complex, d: int) -> None: ...  # type: ignore[no-untyped-def]

    assert properties(f) == {"a": {}, "b": {}, "c": {}, "d": {"type": "integer"}}
    assert "$defs" not in Tool(f).spec.parameters

    def g(a: int, d: Undefined) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    assert properties(g) == {"a": {}, "d": {}}  # annotations that do not resolve cost the types


def test_var_arguments_are_left_out_and_positional_only_is_refused() -> None:
    def f(a: int, *args: int, **kwargs: int) -> None: ...

    assert list(properties(f)) == ["a"]
    with pytest.raises(TypeError, match="tool 'pos': parameter 'x' is positional-only"):
        Tool(lambda x, /: x, name="pos")


def test_given_name_description_and_parameters_win() -> None:
    def f(a: int) -> None:
        """Ignored."""

    made = Tool(f, name="g", description="Mine.", parameters={"type": "object"})
    assert made.spec.to_dict() == {"name": "g", "description": "Mine.",
                                   "parameters": {"type": "object"}}


def test_bad_construction_is_refused_naming_the_problem() -> None:
    with pytest.raises(TypeError, match="a tool must be callable, got int"):
        Tool(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cannot name the tool"):
        Tool(lambda: 1)
    with pytest.raises(TypeError, match="a tool's name must be a non-empty str, got 3"):
        Tool(print, name=3)
    with pytest.raises(TypeError, match="tool 'print': description must be a str, got int"):
        Tool(print, description=3)
    with pytest.raises(TypeError, match=r"ToolSpec\.parameters must be a mapping"):
        Tool(print, parameters=[1])


def test_a_tool_is_frozen_compares_by_identity_and_shows_its_name() -> None:
    def f() -> None: ...

    made = Tool(f)
    assert repr(made) == "Tool(name='f')"
    assert made != Tool(f) and made == made and hash(made) == hash(made)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.name = "g"  # type: ignore[misc]


def test_arguments_are_converted_to_the_annotated_types() -> None:
    def move(to: Point, speed: float, tags: tuple[str, ...] = (), color: Color = Color.RED) -> None:
        ...

    call = ToolCall("c1", "move", {"to": {"x": 1}, "speed": 2, "tags": ["a"], "color": "blue"})
    assert Tool(move).arguments(call.arguments) == {
        "to": Point(1, 0), "speed": 2.0, "tags": ("a",), "color": Color.BLUE}


def test_an_argument_of_the_wrong_type_is_a_type_error_naming_it() -> None:
    def move(to: Point) -> None: ...

    with pytest.raises(TypeError, match=r"tool 'move', argument 'to': Expected `int`, got `str` - at `\$.x`"):
        Tool(move).arguments(ToolCall("c1", "move", {"to": {"x": "1"}}).arguments)


def test_unknown_and_unannotated_arguments_pass_through_as_plain_json() -> None:
    def f(a, **rest: Any) -> None: ...  # type: ignore[no-untyped-def]

    given = ToolCall("c1", "f", {"a": {"k": [1]}, "z": [2]}).arguments
    assert Tool(f).arguments(given) == {"a": {"k": [1]}, "z": [2]}


def test_parameters_schema_is_usable_on_its_own() -> None:
    def f(a: list[Point]) -> None: ...

    schema = parameters_schema(f)
    assert schema["properties"]["a"] == {"type": "array", "items": {"$ref": "#/$defs/Point"}}
