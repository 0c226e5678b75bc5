"""The HTTP API as an OpenAPI 3.1 document, derived from the route table.

Each :class:`~nous_inbox.web.endpoint.Endpoint` becomes one operation: its path and query
parameters, its request body's schema, its answer's schema, its refusals (each an
:class:`~nous_inbox.web.schema.ApiError`) and whether it needs the bearer token. The schemas are
the JSON Schema msgspec derives from the very Structs that decode the requests and encode the
answers, so the document cannot say one thing while the server does another. ``serve`` answers
it at ``/openapi.json``; hand it to a client generator.

>>> from nous_inbox.web.routes import ROUTES
>>> doc = document(ROUTES)
>>> doc["openapi"], sorted(doc["paths"]["/api/sessions/{session}/messages"])
('3.1.0', ['post'])
>>> doc["components"]["schemas"]["SendRequest"]["required"]
['mode', 'text']
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
from starlette.responses import Response

from nous_inbox.events import Event
from nous_inbox.message import enc_hook
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.web.endpoint import PATH_PARAMS, Endpoint, Param
from nous_inbox.web.schema import ApiError

__all__ = ["STREAM_ITEM", "document", "document_response"]

#: What one ``data:`` line of an event stream holds: an event of the log, or (``event: delta``)
#: the model's text as it streams.
STREAM_ITEM: Final = Event | TextDelta

_REF: Final = "#/components/schemas/{name}"
_NAMED: Final[dict[Any, str]] = {STREAM_ITEM: "StreamItem"}
_VERSION: Final = "0.1.0"


def document(routes: Sequence[Endpoint], root_path: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``, served under ``root_path`` (where the app is
    mounted)."""
    kinds = _types(routes)
    found = msgspec.json.schema_components(kinds, ref_template=_REF)
    # Plain JSON values: a default msgspec quotes may be a frozen mapping (a message's metadata).
    schemas, components = msgspec.json.decode(msgspec.json.encode(found, enc_hook=enc_hook))
    for kind, schema in zip(kinds, schemas, strict=True):
        if kind in _NAMED:  # a union has no name of its own: give it one, as a component
            components[_NAMED[kind]] = schema
    refs = {kind: _ref(kind, schema) for kind, schema in zip(kinds, schemas, strict=True)}
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in routes:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, refs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "nous_inbox web face",
            "version": _VERSION,
            "description": "Talk to AI agents while they work: send a message to a session "
                           "(it joins the run at its next step, or waits for a turn), follow "
                           "where it went, take it back, cancel a run, and follow a session's "
                           "events. Every refusal is a 4xx with one body: {\"error\": \"...\"}.",
        },
        "servers": [{"url": root_path.rstrip("/") or "/"}],
        "paths": paths,
        "components": {
            "schemas": {name: _tidy(schema) for name, schema in sorted(components.items())},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "The token serve printed or was given."}},
        },
    }


@functools.lru_cache(maxsize=8)
def _encoded(routes: tuple[Endpoint, ...], root_path: str) -> bytes:
    return json.dumps(document(routes, root_path), ensure_ascii=False, indent=1).encode()


def document_response(routes: Sequence[Endpoint], root_path: str) -> Response:
    """The document as an answer, built once per table and mount point."""
    return Response(_encoded(tuple(routes), root_path), media_type="application/json")


def _types(routes: Iterable[Endpoint]) -> list[Any]:
    """Every type the document names, each once, in the table's order."""
    found: dict[Any, None] = {ApiError: None}
    for endpoint in routes:
        for kind in (endpoint.body, endpoint.answer):
            if kind is not None:
                found[kind] = None
    return list(found)


def _ref(kind: Any, schema: dict[str, Any]) -> dict[str, Any]:
    return {"$ref": _REF.format(name=_NAMED[kind])} if kind in _NAMED else schema


def _tidy(schema: dict[str, Any]) -> dict[str, Any]:
    """A component as a client's reader wants it: its description the docstring's first
    paragraph, on one line, without the examples that test the Python class."""
    description = schema.get("description")
    if description is None:
        return schema
    first = description.split("\n\n", 1)[0].split(">>>", 1)[0]
    return {**schema, "description": " ".join(first.split())}


def _operation(endpoint: Endpoint, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    doc = (endpoint.handler.__doc__ or endpoint.summary).split("\n\n", 1)[0]
    operation: dict[str, Any] = {
        "operationId": endpoint.operation_id,
        "summary": endpoint.summary,
        "description": " ".join(doc.split()),
        "tags": [endpoint.tag],
        "security": [{"bearer": []}] if endpoint.auth else [],
    }
    parameters = [
        {"name": name, "in": "path", "required": True,
         "description": PATH_PARAMS[name].description, "schema": dict(PATH_PARAMS[name].schema)}
        for name in endpoint.path_params
    ]
    parameters += [_parameter(param, "query") for param in endpoint.query]
    parameters += [{"name": param.name, "in": "query", "required": False,
                    "description": param.description, "schema": dict(param.schema)}
                   for param in endpoint.texts]
    parameters += [_parameter(param, "header") for param in endpoint.headers]
    if parameters:
        operation["parameters"] = parameters
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": not endpoint.body_optional,
            "description": "no body, or {}" if endpoint.body_optional else "JSON",
            "content": {"application/json": {"schema": refs[endpoint.body]}},
        }
    error = {"application/json": {"schema": refs[ApiError]}}
    operation["responses"] = {
        str(endpoint.status): {"description": endpoint.summary,
                               "content": {endpoint.media_type: _content(endpoint, refs)}},
        **{str(status): {"description": when, "content": error}
           for status, when in endpoint.refusals.items()},
    }
    return operation


def _content(endpoint: Endpoint, refs: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    if endpoint.media_type == "application/json":
        return {"schema": refs[endpoint.answer] if endpoint.answer is not None
                else {"type": "object"}}
    content: dict[str, Any] = {"schema": {"type": "string"}}
    if endpoint.answer is not None:  # each item's schema: OpenAPI 3.1 has no word for it
        content["schema"]["description"] = (
            f"Server-Sent Events; each data: line is one {_NAMED.get(endpoint.answer, 'item')} "
            "as JSON")
        content["x-item-schema"] = refs[endpoint.answer]
    return content


def _parameter(param: Param, where: str) -> dict[str, Any]:
    return {"name": param.name, "in": where, "required": False, "description": param.description,
            "schema": {"type": "integer", "minimum": 0, "maximum": param.maximum,
                       "default": param.default}}
