"""Tools: a callable the model may ask for, with the name, description and JSON Schema it is shown.

A tool is any plain callable, sync or async. :class:`Tool` (or the :func:`tool` decorator) reads
what the model needs from the callable itself: the name from ``__name__``, the description from
the docstring's first paragraph, and the parameter schema from the signature's annotations. Each
may be given instead.

>>> from typing import Literal
>>> def grep(pattern: str, paths: list[str] | None = None, mode: Literal["fast", "full"] = "fast"):
...     '''Search files for a pattern.
...
...     The model does not need this paragraph.'''
...     return []
>>> spec = Tool(grep).spec
>>> spec.name, spec.description
('grep', 'Search files for a pattern.')
>>> spec.parameters["properties"]["paths"]
{'anyOf': [{'type': 'array', 'items': {'type': 'string'}}, {'type': 'null'}]}
>>> spec.parameters["properties"]["mode"], spec.parameters["required"]
({'enum': ['fast', 'full']}, ['pattern'])

Design notes. The schema comes from msgspec (``msgspec.json.schema_components`` over the
parameters' annotations), so containers, ``Optional``, ``Literal``, enums and ``msgspec.Struct``
parameters come out as JSON Schema says (a Struct as a ``$ref`` into ``$defs``). The same
annotations convert the model's arguments on the way in (``msgspec.convert``): a Struct parameter
receives a Struct, not a dict, and an argument of the wrong type becomes a ``TypeError`` naming
the argument: the runner then refuses the arguments without calling the tool, and hands the
model an error result saying so. A parameter without an
annotation, or with one msgspec has no schema for, is shown as ``{}`` (anything) and passed as
the model gave it. ``Tool`` is an ``attrs`` class: it is a behaviour-bearing shell object, not a
wire value (those are frozen ``msgspec.Struct`` s); it compares by identity, like the function
it wraps.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import msgspec

from nous_inbox.commands import ToolSpec
from nous_inbox.frozen import thaw_json

__all__ = ["Tool", "tool"]

_ANY: Final = object()


def _callable(fn: Callable[..., Any]) -> Callable[..., Any]:
    if not callable(fn):
        raise TypeError(f"a tool must be callable, got {type(fn).__name__}")
    return fn


def _name(name: str | None, self: Any) -> str:
    if name is None:
        name = getattr(self.fn, "__name__", None)
        if not isinstance(name, str) or name == "<lambda>":
            raise TypeError(f"cannot name the tool {self.fn!r}: pass Tool(fn, name=...)")
    elif not isinstance(name, str) or not name:
        raise TypeError(f"a tool's name must be a non-empty str, got {name!r}")
    return name


def _description(description: str | None, self: Any) -> str:
    if description is None:
        return (inspect.getdoc(self.fn) or "").split("\n\n", 1)[0].strip()
    if not isinstance(description, str):
        raise TypeError(
            f"tool {self.name!r}: description must be a str, got {type(description).__name__}"
        )
    return description


def _signature(fn: Callable[..., Any], where: str) -> list[tuple[str, Any, bool]]:
    """``(name, annotation or _ANY, required)`` per keyword parameter of ``fn``."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations only cost the schema its types
        hints = {}
    found = []
    for param in signature.parameters.values():
        if param.kind is param.VAR_POSITIONAL or param.kind is param.VAR_KEYWORD:
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(
                f"{where}: parameter {param.name!r} is positional-only, but tools are called "
                "with keyword arguments"
            )
        hint = hints.get(param.name, _ANY)
        if hint is not _ANY and hint is not Any:
            try:
                msgspec.json.schema(hint)
            except (TypeError, ValueError):  # a type msgspec has no schema (or conversion) for
                hint = _ANY
        else:
            hint = _ANY
        found.append((param.name, hint, param.default is param.empty))
    return found


def parameters_schema(fn: Callable[..., Any], where: str = "tool") -> dict[str, Any]:
    """The JSON Schema of ``fn``'s keyword arguments, from its signature and annotations.

    ``where`` names the tool in the error a positional-only parameter raises (tools are called
    with keyword arguments).

    >>> import msgspec
    >>> class Point(msgspec.Struct):
    ...     x: int
    ...     y: int
    >>> def move(to: Point, note=None): ...
    >>> schema = parameters_schema(move)
    >>> schema["properties"], schema["required"]
    ({'to': {'$ref': '#/$defs/Point'}, 'note': {}}, ['to'])
    >>> schema["$defs"]["Point"]["required"]
    ['x', 'y']
    """
    params = _signature(fn, where)
    typed = [(name, hint) for name, hint, _ in params if hint is not _ANY]
    schemas, components = msgspec.json.schema_components(
        [hint for _, hint in typed], ref_template="#/$defs/{name}"
    )
    by_name = dict(zip([name for name, _ in typed], schemas, strict=True))
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {name: by_name.get(name, {}) for name, _, _ in params},
        "required": [name for name, _, required in params if required],
    }
    if components:
        schema["$defs"] = components
    return schema


def _parameters(parameters: Mapping[str, Any] | None, self: Any) -> Mapping[str, Any]:
    if parameters is None:
        return parameters_schema(self.fn, f"tool {self.name!r}")
    return parameters


def _spec(self: Tool) -> ToolSpec:
    return ToolSpec(self.name, self.description, self.parameters)


def _hints(self: Tool) -> tuple[tuple[str, Any], ...]:
    sig = _signature(self.fn, f"tool {self.name!r}")
    return tuple((name, hint) for name, hint, _ in sig if hint is not _ANY)


def _is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )


@attrs.frozen(eq=False)
class Tool:
    """A callable the model may ask for, with the name and description the model is shown.

    ``Tool(fn)`` takes the name from ``fn.__name__``, the description from its docstring's first
    paragraph and the parameter schema from its annotations (see :func:`parameters_schema`);
    each may be given instead (``name=``, ``description=``, ``parameters=``). ``spec`` is what
    the model is offered; calling the tool calls ``fn``.

    >>> def add(a: int, b: int = 0) -> int:
    ...     '''Add two numbers.'''
    ...     return a + b
    >>> Tool(add).spec.to_dict()
    {'name': 'add', 'description': 'Add two numbers.', 'parameters': {'type': 'object', 'properties': {'a': {'type': 'integer'}, 'b': {'type': 'integer'}}, 'required': ['a']}}
    >>> Tool(add), Tool(add)(2, 3)
    (Tool(name='add'), 5)
    >>> Tool(print, name="")
    Traceback (most recent call last):
    ...
    TypeError: a tool's name must be a non-empty str, got ''
    """

    fn: Callable[..., Any] = attrs.field(converter=_callable, repr=False)
    name: str = attrs.field(
        default=None, kw_only=True, converter=attrs.Converter(_name, takes_self=True)  # type: ignore[misc]
    )
    description: str = attrs.field(
        default=None, kw_only=True, repr=False,
        converter=attrs.Converter(_description, takes_self=True),  # type: ignore[misc]
    )
    parameters: Mapping[str, Any] = attrs.field(
        default=None, kw_only=True, repr=False,
        converter=attrs.Converter(_parameters, takes_self=True),  # type: ignore[misc]
    )
    spec: ToolSpec = attrs.field(init=False, repr=False, default=attrs.Factory(_spec, takes_self=True))
    is_async: bool = attrs.field(
        init=False, repr=False, default=attrs.Factory(lambda self: _is_async(self.fn), takes_self=True)
    )
    _hints: tuple[tuple[str, Any], ...] = attrs.field(
        init=False, repr=False, default=attrs.Factory(_hints, takes_self=True)
    )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def arguments(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call ``fn`` with, from the model's (frozen JSON) ``given``:
        thawed, and converted to the annotated types (a ``TypeError`` naming the argument when
        one does not fit). Arguments the signature does not know are passed as given, so the call
        raises Python's own ``TypeError``.

        >>> def repeat(text: str, times: int = 1) -> str:
        ...     return text * times
        >>> Tool(repeat).arguments({"text": "ab", "times": 2})
        {'text': 'ab', 'times': 2}
        >>> Tool(repeat).arguments({"text": "ab", "times": "2"})
        Traceback (most recent call last):
        ...
        TypeError: tool 'repeat', argument 'times': Expected `int`, got `str`
        """
        kwargs: dict[str, Any] = thaw_json(given)
        for name, hint in self._hints:
            if name in kwargs:
                value = kwargs[name]
                if type(value) is hint:  # what a conversion would hand back, unchanged
                    continue
                try:
                    kwargs[name] = msgspec.convert(value, hint)
                except msgspec.ValidationError as exc:
                    raise TypeError(f"tool {self.name!r}, argument {name!r}: {exc}") from None
        return kwargs


@typing.overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@typing.overload
def tool(
    *, name: str | None = None, description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator making a :class:`Tool`: bare (``@tool``) or with overrides (``@tool(name=...)``).

    >>> @tool(name="now")
    ... def current_time() -> str:
    ...     return "12:00"
    >>> current_time.name, current_time()
    ('now', '12:00')
    """
    if fn is not None:
        return Tool(fn, name=name, description=description, parameters=parameters)
    return lambda f: Tool(f, name=name, description=description, parameters=parameters)
