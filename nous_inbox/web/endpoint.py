"""One route of the web face, declared once: what the app serves and what the OpenAPI document
says are both read from the same declaration.

An :class:`Endpoint` names its method and path, its handler, its request body's type, its query
parameters, its answer's type and media type, whether it needs the token, and any refusal its
handler adds to those the declaration implies. The app (:func:`~nous_inbox.web.app.create_app`)
checks a request against it before the handler runs; the document
(:func:`~nous_inbox.web.openapi.document`) describes it. A route cannot be served undocumented,
nor documented with a body the app does not decode.

>>> from nous_inbox.web.schema import ApiError
>>> async def hello(call: Call) -> ApiError:
...     return ApiError(error="hello")
>>> Endpoint("GET", "/api/sessions/{session}/hello", hello, "Say hello").starlette_path
'/api/sessions/{session:nous_segment}/hello'
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar
from urllib.parse import unquote

import msgspec
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from nous_inbox.codec import MAX_STREAM_NAME
from nous_inbox.store.base import check_stream
from nous_inbox.web.checks import MAX_WHOLE, Refused, whole
from nous_inbox.web.host import SessionHost

__all__ = [
    "PATH_PARAMS",
    "Call",
    "Endpoint",
    "Handler",
    "Param",
    "PathParam",
    "SegmentRoute",
    "TextParam",
    "session_prefix",
]


class _Segment(PathConvertor):
    """One segment of the path as sent, anything but a ``/`` (newlines too): a path parameter is
    refused with its reason by its check, not as no route."""

    regex = r"[^/]+"


register_url_convertor("nous_segment", _Segment())

_S = TypeVar("_S", bound=msgspec.Struct)


@dataclass(frozen=True)
class Call:
    """What a handler is given: the request, the host, the checked path parameters, the query's
    numbers (defaults filled in), the decoded body (``None`` for an endpoint that takes none) and
    the query's checked texts (``""`` when not given).
    """

    request: Request
    host: SessionHost
    path: Mapping[str, Any]
    query: Mapping[str, int]
    body: msgspec.Struct | None
    keepalive: float
    texts: Mapping[str, str] = field(default_factory=dict)

    @property
    def session(self) -> str:
        """The session id of the path, checked as the command line checks one."""
        name: str = self.path["session"]
        return name

    def body_as(self, kind: type[_S]) -> _S:
        """The decoded body, as the type the endpoint declared."""
        if not isinstance(self.body, kind):
            raise TypeError(f"the endpoint's body is {type(self.body).__name__}, not {kind.__name__}")
        return self.body


Handler = Callable[[Call], Awaitable["msgspec.Struct | Response"]]
"""An endpoint's work: a typed answer (encoded as JSON with the endpoint's status) or a response
of its own (a page, an event stream)."""


@dataclass(frozen=True)
class Param:
    """A query parameter: a whole number from 0 to ``maximum``, ``default`` when not given."""

    name: str
    default: int
    description: str
    maximum: int = MAX_WHOLE


@dataclass(frozen=True)
class TextParam:
    """A query parameter that is a text: ``check`` returns it or raises
    :class:`~nous_inbox.web.checks.Refused` saying why; ``""`` when not given; ``schema`` its
    JSON Schema for the document."""

    name: str
    description: str
    check: Callable[[str], str]
    schema: Mapping[str, Any] = field(compare=False)  # a dict: the table stays hashable


def session_prefix(raw: str) -> str:
    """A prefix of session ids, as a filter: empty (every session), or checked as a session id
    is, so a filter no id could match is refused rather than answered with nothing.

    >>> session_prefix("team-a/")
    'team-a/'
    """
    if not raw:
        return raw
    try:
        return check_stream(raw)
    except ValueError as exc:
        raise Refused(400, "prefix: " + str(exc).replace("stream name", "session id prefix", 1)) from None


@dataclass(frozen=True)
class PathParam:
    """A kind of path parameter: how Starlette matches it, how the app checks it (raising
    :class:`~nous_inbox.web.checks.Refused`), and its JSON Schema for the document."""

    convertor: str
    check: Callable[[Any], Any]
    schema: Mapping[str, Any]
    description: str


def _session(name: str) -> str:
    try:
        return check_stream(name)
    except ValueError as exc:
        raise Refused(400, str(exc).replace("stream name", "session id", 1)) from None


def _seq(raw: str) -> int:
    seq = whole(raw, "seq must be a whole number >= 1")
    if seq < 1:
        raise Refused(400, f"seq must be a whole number >= 1, got {seq}")
    return seq


#: Every path parameter an endpoint's path may name, by name: ``{session}`` and ``{seq}``.
PATH_PARAMS: Final[Mapping[str, PathParam]] = {
    "session": PathParam("nous_segment", _session, {
        "type": "string", "minLength": 1, "maxLength": MAX_STREAM_NAME,
        "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
    }, "The session's id: its stream's name in the store (no control characters; a / in it is "
       "sent as %2F)."),
    "seq": PathParam("nous_segment", _seq, {"type": "integer", "minimum": 1, "maximum": MAX_WHOLE},
                     "The seq of an event: a send's is the number its 202 answered with."),
}

_PLACEHOLDER: Final = re.compile(r"\{(\w+)\}")

Method = Literal["GET", "POST"]


@dataclass(frozen=True)
class Endpoint:
    """One route: ``method`` and ``path`` (OpenAPI's form, ``/api/sessions/{session}``), the
    ``handler``, a one-line ``summary``; ``answer`` is the success body's type (a Struct) and
    ``status`` its status, or ``media_type`` says what else it answers (then the handler returns
    its own response); ``body`` the request body's Struct (``body_optional``: none means
    ``{}``); ``query`` the whole numbers it takes; ``auth`` whether it needs the bearer token;
    ``refuses`` the statuses its handler adds, with when; ``tag`` groups it in the document;
    ``name`` is its operation's id when the handler serves more than one route; ``headers``
    the whole-number headers its handler reads; ``texts`` the query's texts it takes."""

    method: Method
    path: str
    handler: Handler
    summary: str
    answer: Any = None
    status: int = 200
    media_type: str = "application/json"
    body: type[msgspec.Struct] | None = None
    body_optional: bool = False
    query: tuple[Param, ...] = ()
    auth: bool = True
    refuses: tuple[tuple[int, str], ...] = ()
    tag: str = "sessions"
    name: str = ""
    headers: tuple[Param, ...] = ()
    texts: tuple[TextParam, ...] = ()
    path_params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names = tuple(_PLACEHOLDER.findall(self.path))
        unknown = [name for name in names if name not in PATH_PARAMS]
        if unknown:
            raise ValueError(f"Endpoint {self.path}: no path parameter kind {unknown[0]!r} "
                             f"(PATH_PARAMS has {', '.join(PATH_PARAMS)})")
        object.__setattr__(self, "path_params", names)

    def route(self, endpoint: Callable[[Request], Awaitable[Response]]) -> Route:
        """The Starlette route serving this endpoint with ``endpoint``."""
        return SegmentRoute(self.starlette_path, endpoint, methods=[self.method])

    @property
    def starlette_path(self) -> str:
        """The path as Starlette matches it: each parameter with its convertor."""
        return _PLACEHOLDER.sub(
            lambda m: f"{{{m[1]}:{PATH_PARAMS[m[1]].convertor}}}", self.path)

    @property
    def operation_id(self) -> str:
        """The name a generated client gives the call: ``name``, else the handler's."""
        return self.name or self.handler.__name__

    @property
    def refusals(self) -> dict[int, str]:
        """Every 4xx status this endpoint may answer, with when: those its declaration implies
        (the token, the query, the path, the body) and its own."""
        said = {400: "a query parameter it does not take, given twice or not a whole number"
                     + (", a text parameter its check refuses" if self.texts else "")
                     + (", a bad path parameter" if self.path_params else "")
                     + (", or a body of the wrong shape" if self.body else "")}
        if self.path_params:
            said[404] = "no such route: a path parameter left empty"
        if self.auth:
            said[401] = "no bearer token, or the wrong one"
        if self.body is not None:
            said[413] = "the body is larger than the server reads"
            said[415] = "the body is not JSON (Content-Type: application/json)"
        for status, when in self.refuses:
            said[status] = f"{said[status]}; or {when}" if status in said else when
        return dict(sorted(said.items()))


class SegmentRoute(Route):
    """A route matched against the path as it was sent, segment by segment, each parameter
    percent-decoded once matched: a session id is one segment, a ``/`` in it sent as ``%2F``.
    Matched against the decoded path, ``GET /api/sessions/s1/messages`` would read as the
    session ``s1/messages``, and no path could say which is meant."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        raw: bytes | None = scope.get("raw_path")
        if scope["type"] != "http" or not raw:
            return super().matches(scope)
        segments = raw.decode("latin-1").split("/")
        root = scope.get("root_path", "").rstrip("/")
        # Mounted (Starlette's Mount, a server's --root-path): the path still holds the mount
        # point, as get_route_path says; its segments are not the route's.
        mounted = root and scope["path"].startswith(root + "/")
        sent = "/".join(["", *segments[1 + root.count("/"):]]) if mounted else "/".join(segments)
        found = self.path_regex.match(sent)
        if found is None:
            return Match.NONE, {}
        params = {key: self.param_convertors[key].convert(unquote(value))
                  for key, value in found.groupdict().items()}
        child = {"endpoint": self.endpoint,
                 "path_params": {**scope.get("path_params", {}), **params}}
        if self.methods and scope["method"] not in self.methods:
            return Match.PARTIAL, child
        return Match.FULL, child
