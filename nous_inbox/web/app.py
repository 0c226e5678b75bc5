"""The web face: an ASGI app over a :class:`~nous_inbox.web.host.SessionHost`.

Endpoints (every ``/api`` call needs ``Authorization: Bearer TOKEN``)::

    GET  /api/sessions                         {"sessions": [{"id", "hosted"}...]}
    GET  /api/sessions/{id}?offset=&limit=     counts, running, turn, step, a transcript page
    POST /api/sessions/{id}/messages           {"mode": "steer"|"inject"|"followup"|"prompt",
                                               "text": "..."} -> 202 {"seq", "mode"} once stored
    GET  /api/sessions/{id}/messages/{seq}     where the send at seq went: {"sent", "target",
                                               "state": "queued"|"claimed"|"withdrawn", "turn",
                                               "step", "by"} (a nous_inbox.receipts.Receipt)
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
    GET  /healthz, /readyz, /metrics           liveness, readiness, Prometheus text: no token
                                               (:mod:`nous_inbox.web.probes`)

Mount it in a Starlette or FastAPI app (``app.mount("/agents", create_app(host, token=...))``)
or let ``nous-inbox serve`` run it. Safe by default: the token is compared in constant time;
bodies must be JSON objects (``Content-Type: application/json``) of at most ``max_body`` bytes,
decoded into a ``msgspec.Struct`` per endpoint, so every field's type is checked in one place and
a wrong type, a missing field or an unknown one is refused naming the field; each query
parameter must be one the endpoint takes, once, as a whole number; a session id and a text are
checked as the command line checks them. Anything refused gets a 4xx that says why before
anything is written. No CORS header is sent unless ``cors_origins`` names the origins; the page
sets a content security policy that allows only its own script and style, and writes every text
with ``textContent``.

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

import asyncio
import hmac
import html
import importlib.resources
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from nous_inbox.events import Event
from nous_inbox.frozen import thaw_json
from nous_inbox.receipts import Receipt
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.safe_json import event_json, json_safe
from nous_inbox.store.base import check_stream
from nous_inbox.verbs import VERBS, Verb, VerbName
from nous_inbox.web.host import SessionHost, checked_text
from nous_inbox.web.probes import probe_routes

__all__ = ["MAX_BODY", "create_app"]

#: The largest request body the API reads, in bytes, unless ``create_app`` is told otherwise.
MAX_BODY: Final = 64 * 1024
#: The most transcript messages one ``GET /api/sessions/{id}`` returns.
MAX_PAGE: Final = 500

_STATIC: Final = importlib.resources.files("nous_inbox.web") / "static"
_PAGE_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
logger: Final = logging.getLogger("nous_inbox.web")


def _verb_button(verb: Verb) -> str:
    wakes = "wakes it" if verb.wakeup else "wakes nothing"
    return (f'<button type="button" data-mode="{verb.name}" data-target="{verb.target}" '
            f'data-wakeup="{str(verb.wakeup).lower()}" '
            f'title="{html.escape(verb.meaning, quote=True)}; {wakes}">{verb.name}</button>')


# The page's send buttons, one a verb of the table: the page reads a stored send's verb from them.
_VERB_BUTTONS: Final = "\n        ".join(_verb_button(verb) for verb in VERBS.values())


class _AnySession(PathConvertor):
    """A session id as given, newlines too: it is refused with its reason, not as no route."""

    regex = r"[\s\S]+"


register_url_convertor("nous_session", _AnySession())

Endpoint = Callable[[Request], Awaitable[Response]]


class _Refused(Exception):
    """A request the API refuses: its status and the reason, sent as ``{"error": reason}``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class _Json(JSONResponse):
    """A JSON answer in the form the command line prints JSON
    (:func:`~nous_inbox.safe_json.json_safe`): a transcript or a session id quoted in it carries
    DEL, C1 and bidi controls as escapes."""

    def render(self, content: Any) -> bytes:
        return json_safe(json.dumps(content, ensure_ascii=False, allow_nan=False,
                                    separators=(",", ":"))).encode()


class _Send(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /api/sessions/{id}/messages``."""

    mode: VerbName
    text: str


class _Cancel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /api/sessions/{id}/cancel``: none, or an empty object."""


class _Withdraw(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of ``POST /api/sessions/{id}/messages/{seq}/withdraw``: none, or ``{}``."""


_Body = TypeVar("_Body", _Send, _Cancel, _Withdraw)

# What each body looks like, for the error that refuses another. Decoding into its Struct checks
# every field's type (and refuses a field it does not know) in one place.
_SHAPES: Final[Mapping[type[msgspec.Struct], str]] = {
    _Send: '{"mode": ' + " | ".join(f'"{mode}"' for mode in VERBS) + ', "text": "..."}',
    _Cancel: "no body, or {}",
    _Withdraw: "no body, or {}",
}


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

    def api(handler: Callable[[Request, str, dict[str, int]], Awaitable[Response]],
            **query: int) -> Endpoint:
        """An endpoint that checks the token, the session id and the query (``query`` names
        the parameters it takes, each a whole number, and their defaults) before ``handler``."""

        async def endpoint(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, expected):
                return _Json({"error": "missing or wrong bearer token"}, 401,
                             headers={"WWW-Authenticate": "Bearer"})
            try:
                name = request.path_params.get("session", "")
                if name:
                    try:
                        check_stream(name)
                    except ValueError as exc:
                        raise _Refused(400, str(exc).replace("stream name", "session id", 1)) from None
                return await handler(request, name, _query(request, query))
            except _Refused as refused:
                return _Json({"error": str(refused)}, refused.status)

        return endpoint

    async def list_sessions(request: Request, _: str, __: dict[str, int]) -> Response:
        names = await host.sessions()
        held = set(host.held)
        return _Json({"sessions": [{"id": n, "hosted": n in held} for n in names]})

    async def show(request: Request, name: str, query: dict[str, int]) -> Response:
        offset, limit = query["offset"], min(query["limit"], MAX_PAGE)
        session = await host.session(name)
        if session is None:
            raise _Refused(404, f"no session {name!r} in this store")
        inbox = session.inbox
        page = session.transcript[offset:offset + limit]
        return _Json({
            "id": name, "version": session.version, "hosted": host.hosted(name) is not None,
            "running": session.running, "turn": session.turn, "step": session.step,
            "inbox": {"next_turn": inbox.count("next_turn"), "next_step": inbox.count("next_step"),
                      "wants_wake": inbox.wants_wake()},
            "transcript_length": len(session.transcript), "offset": offset,
            "transcript": [thaw_json(m.to_dict()) for m in page],
        })

    async def post_message(request: Request, name: str, _: dict[str, int]) -> Response:
        body = await _json_body(request, _Send, max_body)
        try:
            checked_text(body.text)  # checked here, so a failure past it is the server's
        except (TypeError, ValueError) as exc:
            raise _Refused(400, str(exc)) from None
        sent = await host.send(name, body.mode, body.text)
        return _Json({"seq": sent.seq, "mode": body.mode}, 202)

    async def receipt(request: Request, name: str, _: dict[str, int]) -> Response:
        return _receipt(await _answered(host.receipt(name, request.path_params["seq"])))

    async def withdraw(request: Request, name: str, _: dict[str, int]) -> Response:
        await _json_body(request, _Withdraw, max_body, optional=True)
        return _receipt(await _answered(host.withdraw(name, request.path_params["seq"])))

    async def cancel(request: Request, name: str, _: dict[str, int]) -> Response:
        await _json_body(request, _Cancel, max_body, optional=True)
        return _Json({"cancelled": await host.cancel(name)})

    async def events(request: Request, name: str, query: dict[str, int]) -> Response:
        after = query["after"]
        last_id = request.headers.get("last-event-id")
        if last_id is not None:
            after = _whole(last_id, "Last-Event-ID must be an event seq")
        if query["deltas"] not in (0, 1):
            raise _Refused(400, f"deltas must be 0 or 1, got {query['deltas']}")
        return _EventStream(_sse(host, name, after, keepalive, deltas=query["deltas"] == 1))

    async def page(request: Request) -> Response:
        # Where the app is mounted, so the page's links and calls go to it.
        root = html.escape(request.scope.get("root_path", "").rstrip("/"), quote=True)
        text = (_STATIC / "page.html").read_text("utf-8").replace("{{root}}", root).replace(
            "{{verbs}}", _VERB_BUTTONS)
        return Response(text, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    def static(file: str, media_type: str) -> Endpoint:
        async def serve(request: Request) -> Response:
            return Response((_STATIC / file).read_bytes(), media_type=media_type, headers=_PAGE_HEADERS)

        return serve

    routes = [
        Route("/api/sessions", api(list_sessions)),
        Route("/api/sessions/{session:nous_session}/messages", api(post_message), methods=["POST"]),
        Route("/api/sessions/{session:nous_session}/messages/{seq:int}", api(receipt)),
        Route("/api/sessions/{session:nous_session}/messages/{seq:int}/withdraw", api(withdraw),
              methods=["POST"]),
        Route("/api/sessions/{session:nous_session}/cancel", api(cancel), methods=["POST"]),
        Route("/api/sessions/{session:nous_session}/events", api(events, after=0, deltas=0)),
        Route("/api/sessions/{session:nous_session}", api(show, offset=0, limit=100)),
        Route("/", page),
        Route("/sessions/{session:nous_session}", page),
        Route("/static/page.js", static("page.js", "text/javascript; charset=utf-8")),
        Route("/static/page.css", static("page.css", "text/css; charset=utf-8")),
        *probe_routes(host),  # /healthz, /readyz, /metrics: no token
    ]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(cors_origins),
                             allow_methods=["GET", "POST"],
                             allow_headers=["Authorization", "Content-Type", "Last-Event-ID"])
                  ] if cors_origins else []
    app = Starlette(routes=routes, middleware=middleware)
    app.state.host = host
    return app


async def _answered(asked: Awaitable[Receipt]) -> Receipt:
    """A receipt, or the 4xx saying why there is none: no such event (404), not a send (400)."""
    try:
        return await asked
    except LookupError as exc:
        raise _Refused(404, str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise _Refused(400, str(exc)) from None


def _receipt(found: Receipt) -> Response:
    return _Json(found.to_dict())


def _query(request: Request, takes: Mapping[str, int]) -> dict[str, int]:
    """The query's whole numbers, by name: each parameter ``takes`` names at most once, none
    other (``takes`` gives the defaults)."""
    values = dict(takes)
    seen: set[str] = set()
    for key, raw in request.query_params.multi_items():
        if key not in takes:
            known = f"it takes {', '.join(takes)}" if takes else "it takes none"
            raise _Refused(400, f"unknown query parameter {key[:40]!r}: {known}")
        if key in seen:
            raise _Refused(400, f"query parameter {key} is given more than once")
        seen.add(key)
        values[key] = _whole(raw, f"{key} must be a whole number >= 0")
    return values


def _whole(raw: str, must: str) -> int:
    # ASCII digits only: ``str.isdigit`` also passes digits ``int`` cannot read, such as "²".
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise _Refused(400, f"{must}, got {raw[:40]!r}")
    return int(raw)


async def _json_body(request: Request, kind: type[_Body], limit: int, *,
                     optional: bool = False) -> _Body:
    """The request's body as ``kind``, read no further than ``limit`` bytes; refused with the
    field at fault (a wrong type, a value out of range, a field missing or unknown)."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    declared = request.headers.get("content-length")
    if declared is not None and _whole(declared, "Content-Length must be a number of bytes") > limit:
        raise _Refused(413, f"the body is {declared} bytes; at most {limit} are read")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _Refused(413, f"the body is over {limit} bytes")
    if optional and not body:
        body += b"{}"
    elif media_type != "application/json":
        raise _Refused(415, "the body must be JSON (Content-Type: application/json), got "
                            f"{media_type or 'none'!r}")
    try:
        return msgspec.json.decode(bytes(body), type=kind)
    except msgspec.ValidationError as exc:
        raise _Refused(400, f"{_field_error(str(exc))}; send {_SHAPES[kind]}") from None
    except msgspec.DecodeError as exc:
        raise _Refused(400, f"the body is not JSON: {exc}") from None


def _field_error(reason: str) -> str:
    """msgspec's reason, led by the field it is about: ``mode: Expected `str`, got `array```.

    >>> _field_error("Invalid enum value 'shout' - at `$.mode`")
    "mode: Invalid enum value 'shout'"
    >>> _field_error("Expected `object`, got `array`")
    'the body: Expected `object`, got `array`'
    """
    what, at, path = reason.rpartition(" - at `$")
    if at and path.startswith(".") and path.endswith("`"):
        return f"{_cut(path[1:-1])}: {what}"
    return _cut(reason, 200) if "field `" in reason else f"the body: {reason}"


def _cut(text: str, limit: int = 40) -> str:
    """A name the client sent, cut to ``limit`` characters: a body may hold 64 KiB of it."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


class _EventStream(StreamingResponse):
    """An event stream closed however its response ends: Starlette leaves an iterator it stopped
    reading (a client gone mid-send) to the garbage collector, and with it the tasks feeding it."""

    def __init__(self, events: AsyncGenerator[bytes, None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()


async def _sse(host: SessionHost, name: str, after: int, keepalive: float, *,
               deltas: bool = False) -> AsyncGenerator[bytes, None]:
    """The event stream: each event as ``id: seq`` and ``data: json``; with ``deltas``, each
    piece of the model's text as it streams as ``event: delta`` and ``data: json``, with no
    ``id`` (so ``Last-Event-ID`` stays the last event's seq); a comment after each
    ``keepalive`` idle seconds; ends when the host stops or the client leaves."""
    queue: asyncio.Queue[Event | TextDelta | None] = asyncio.Queue(maxsize=256)

    async def pump() -> None:
        try:
            async for event in host.events(name, after, deltas=deltas):
                await queue.put(event)
        except Exception:
            logger.warning("the event stream of session %r failed", name, exc_info=True)
        await queue.put(None)  # the end; not reached once cancelled, when nobody would read it

    loop = asyncio.get_running_loop()
    feeding = loop.create_task(pump())
    stopping = loop.create_task(host.stopping.wait())
    getting: asyncio.Task[Event | TextDelta | None] | None = None
    host.metrics.reader_opened()
    try:
        yield b": events of this session follow\n\n"
        while not host.stopping.is_set():  # checked after each event too: a backlog waits
            getting = getting or loop.create_task(queue.get())
            done, _ = await asyncio.wait((getting, stopping), timeout=keepalive,
                                        return_when=asyncio.FIRST_COMPLETED)
            if getting in done:
                event, getting = getting.result(), None
                if event is None:  # the host stopped, or reading the session failed
                    return
                if isinstance(event, TextDelta):
                    yield f"event: delta\ndata: {_delta_json(event)}\n\n".encode()
                else:
                    yield f"id: {event.seq}\ndata: {event_json(event)}\n\n".encode()
            elif stopping not in done:
                yield b": keep-alive\n\n"
    finally:
        host.metrics.reader_closed()
        waiting = [task for task in (getting, stopping, feeding) if task is not None]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


def _delta_json(delta: TextDelta) -> str:
    """A text delta as one JSON line, escaped as an event's line is (:func:`event_json`).

    >>> _delta_json(TextDelta(text="Hel\\u202elo", turn=1, step=2))
    '{"type":"text_delta","text":"Hel\\\\u202elo","turn":1,"step":2}'
    """
    return json_safe(msgspec.json.encode(delta).decode())
