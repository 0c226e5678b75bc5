"""The web face: an ASGI app over a :class:`~nous_inbox.web.host.SessionHost`.

Endpoints (every ``/api`` call needs ``Authorization: Bearer TOKEN``)::

    GET  /api/sessions?offset=&limit=&prefix=  a page of the sessions whose id starts with
                                               prefix: {"sessions": [{"id", "hosted", "state"}],
                                               "total", "offset"}, state as the host knows it
    GET  /api/sessions/{id}?offset=&limit=     counts, running, turn, step, the queued
                                               messages, a transcript page
    GET  /api/sessions/{id}/view/{seq}         what the model was shown at the model request
                                               recorded at seq: the transcript's first count
    POST /api/sessions/{id}/messages           {"mode": "steer"|"inject"|"followup"|"prompt",
                                               "text": "..."} -> 202 {"seq", "mode"} once stored
    GET  /api/sessions/{id}/messages/{seq}     where the send at seq went: {"sent", "target",
                                               "state": "queued"|"claimed"|"withdrawn", "turn",
                                               "step", "by"} (a nous_inbox.receipts.Receipt);
                                               404 when no send is at seq
    POST /api/sessions/{id}/messages/{seq}/withdraw   take it back if no claim took it yet:
                                               the receipt, "withdrawn", or where it went
    POST /api/sessions/{id}/cancel             {"cancelled": bool}: a run was going here, or a
                                               cancel was recorded for one held elsewhere
    GET  /api/sessions/{id}/events?after=N     Server-Sent Events: id = seq, data = the event as
                                               ``nous-inbox log --json`` prints it; with
                                               ``&deltas=1``, also the model's text as it
                                               streams: ``event: delta``, no id, data =
                                               {"type": "text_delta", "text", "turn", "step"}
    GET  /  and  /sessions/{id}                the list page and a session's page
    GET  /openapi.json                         this API as an OpenAPI 3.1 document (no token)
    GET  /healthz, /readyz, /metrics           liveness, readiness, Prometheus text: no token
                                               (:mod:`nous_inbox.web.probes`)

Every route is declared once, in :data:`nous_inbox.web.routes.ROUTES`: the app serves and checks
what the table declares, and the document (:mod:`nous_inbox.web.openapi`) is derived from it.
A path parameter is one segment of the path as sent: a ``/`` in a session id is sent as ``%2F``.
Every 4xx answers one shape, ``{"error": reason}``, an unknown path or method included.

Mount it in a Starlette or FastAPI app (``app.mount("/agents", create_app(host, token=...))``)
or let ``nous-inbox serve`` run it. Safe by default: the token is compared in constant time;
bodies must be JSON objects (``Content-Type: application/json``) of at most ``max_body`` bytes,
decoded into a ``msgspec.Struct`` per endpoint (:mod:`nous_inbox.web.schema`), so every field's
type is checked in one place and a wrong type, a missing field or an unknown one is refused
naming the field; each query parameter must be one the endpoint takes, once, as a whole number;
a session id and a text are checked as the command line checks them. Anything refused gets a
4xx that says why before anything is written. No CORS header is sent unless ``cors_origins``
names the origins; the page sets a content security policy that allows only its own script and
style, and writes every text with ``textContent``.

>>> import asyncio, httpx
>>> from nous_inbox.runner import Runner
>>> from nous_inbox.store import open_store
>>> from nous_inbox.web.host import SessionHost
>>> async def main():
...     async with SessionHost(open_store("memory:"), lambda s: Runner(lambda t, tools: "ok")) as host:
...         app = create_app(host, token="secret-token")
...         async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
...                                      base_url="http://test") as client:
...             sent = await client.post("/api/sessions/s1/messages", json={"mode": "inject", "text": "hi"},
...                                      headers={"Authorization": "Bearer secret-token"})
...             anonymous = await client.get("/api/sessions")
...             return sent.status_code, sent.json(), anonymous.status_code
>>> asyncio.run(main())
(202, {'seq': 1, 'mode': 'inject'}, 401)
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from nous_inbox.message import enc_hook
from nous_inbox.receipts import Receipt
from nous_inbox.runner.tracing import server_span
from nous_inbox.safe_json import json_safe
from nous_inbox.web.checks import Refused, cut, json_body, query_values
from nous_inbox.web.endpoint import PATH_PARAMS, Call, Endpoint
from nous_inbox.web.host import SessionHost
from nous_inbox.web.routes import ROUTES
from nous_inbox.web.schema import ApiError

__all__ = ["MAX_BODY", "create_app"]

#: The largest request body the API reads, in bytes, unless ``create_app`` is told otherwise.
MAX_BODY: Final = 64 * 1024

_ENCODER: Final = msgspec.json.Encoder(enc_hook=enc_hook)


def create_app(
    host: SessionHost,
    *,
    token: str,
    max_body: int = MAX_BODY,
    keepalive: float = 15.0,
    cors_origins: Sequence[str] = (),
) -> Starlette:
    """The ASGI app serving ``host``'s sessions to whoever shows ``token``.

    ``keepalive`` is how many idle seconds an event stream waits before it sends a comment line
    (proxies close a silent connection); ``cors_origins`` lists the other origins whose pages
    may call the API (none by default).
    """
    if not isinstance(token, str) or len(token) < 8 or not token.isprintable() or " " in token:
        raise ValueError("create_app: token must be at least 8 printable characters, no spaces")
    if type(max_body) is not int or max_body < 1:
        raise ValueError(f"create_app: max_body must be an int >= 1, got {max_body!r}")
    expected = f"Bearer {token}".encode()

    def serving(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        """The route's work as its declaration says: the token, the path, the query and the
        body checked, in that order, before the handler; its answer encoded."""
        defaults = {param.name: param.default for param in endpoint.query}
        maxima = {param.name: param.maximum for param in endpoint.query}
        texts = {param.name: param.check for param in endpoint.texts}

        # A span per API request that answers at once (an event stream outlives its request):
        # a send made in it carries it, and the step that claims the message links back to it.
        traced = endpoint.path.startswith("/api/") and endpoint.media_type != "text/event-stream"

        async def serve(request: Request) -> Response:
            if endpoint.auth:  # before any span: a caller without the token continues no trace
                given = request.headers.get("authorization", "").encode("latin-1", "replace")
                if not hmac.compare_digest(given, expected):
                    return _error(401, "missing or wrong bearer token",
                                  {"WWW-Authenticate": "Bearer"})
            if not traced:
                return await checked(request)
            with server_span(request.method, endpoint.path, request.headers) as span:
                response = await checked(request)
                if span is not None:
                    span.set_attribute("http.response.status_code", response.status_code)
                return response

        async def checked(request: Request) -> Response:
            try:
                path = {name: PATH_PARAMS[name].check(request.path_params[name])
                        for name in endpoint.path_params}
                query, said = query_values(request, defaults, maxima, texts)
                body = (None if endpoint.body is None else
                        await json_body(request, endpoint.body, max_body,
                                        optional=endpoint.body_optional))
                answer = await endpoint.handler(
                    Call(request, host, path, query, body, keepalive, said))
            except Refused as refused:
                return _error(refused.status, str(refused))
            if isinstance(answer, Response):
                return answer
            return _json(answer, endpoint.status)

        serve.__name__ = endpoint.operation_id
        return serve

    routes = [endpoint.route(serving(endpoint)) for endpoint in ROUTES]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(cors_origins),
                             allow_methods=["GET", "POST"],
                             allow_headers=["Authorization", "Content-Type", "Last-Event-ID"])
                  ] if cors_origins else []
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={HTTPException: _http_error})
    app.state.host = host
    return app


def _json(answer: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An answer in the form the command line prints JSON (:func:`json_safe`): a transcript or
    a session id quoted in it carries DEL, C1 and bidi controls as escapes."""
    # A receipt answers every field, its zeros too, as ``nous-inbox receipt --json`` prints it.
    content = answer.to_dict() if isinstance(answer, Receipt) else answer
    encoded = json_safe(_ENCODER.encode(content).decode())
    return Response(encoded, status, headers, media_type="application/json")


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> Response:
    return _json(ApiError(error=reason), status, headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, a method the path does not take) in the API's one
    shape of refusal."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        reason = f"no route {cut(request.url.path, 200)!r}"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        reason = f"{cut(request.method)} is not a method of this path; it takes {allowed}"
    else:
        reason = exc.detail
    return _error(exc.status_code, reason, dict(exc.headers or {}))
