"""The web face: an ASGI app over a :class:`~nous_inbox.web.host.SessionHost`.

Endpoints (every ``/api`` call needs ``Authorization: Bearer TOKEN``)::

    GET  /api/sessions                         {"sessions": [{"id", "hosted"}...]}
    GET  /api/sessions/{id}?offset=&limit=     counts, running, turn, step, a transcript page
    POST /api/sessions/{id}/messages           {"mode": "steer"|"inject"|"followup"|"prompt",
                                               "text": "..."} -> 202 {"seq", "mode"} once stored
    POST /api/sessions/{id}/cancel             {"cancelled": bool}: a run was going here, or a
                                               cancel was recorded for one held elsewhere
    GET  /api/sessions/{id}/events?after=N     Server-Sent Events: id = seq, data = the event as
                                               ``nous-inbox log --json`` prints it
    GET  /  and  /sessions/{id}                the list page and a session's page

Mount it in a Starlette or FastAPI app (``app.mount("/agents", create_app(host, token=...))``)
or let ``nous-inbox serve`` run it. Safe by default: the token is compared in constant time;
bodies must be JSON objects (``Content-Type: application/json``) of at most ``max_body`` bytes;
a session id and a text are checked as the command line checks them, and refused with a 4xx
that says why before anything is written; no CORS header is sent unless ``cors_origins`` names
the origins; the page sets a content security policy that allows only its own script and style,
and writes every text with ``textContent``.

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
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, Final

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
from nous_inbox.message import enc_hook
from nous_inbox.store.base import check_stream
from nous_inbox.web.host import MODES, SessionHost, checked_text

__all__ = ["MAX_BODY", "create_app", "event_data"]

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
_encoder: Final = msgspec.json.Encoder(enc_hook=enc_hook)



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


def event_data(event: Event) -> bytes:
    """The event as one line of JSON, the form ``nous-inbox log --json`` prints and the JSON Lines
    log stores.

    >>> from nous_inbox.events import MessageSent
    >>> from nous_inbox.message import Message
    >>> event_data(MessageSent(seq=1, target="next_step", wakeup=True, message=Message.user("go")))[:32]
    b'{"type":"message_sent","target":'
    """
    return _encoder.encode(event)


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

    def api(handler: Callable[[Request, str], Awaitable[Response]]) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            given = request.headers.get("authorization", "").encode("latin-1", "replace")
            if not hmac.compare_digest(given, expected):
                return JSONResponse({"error": "missing or wrong bearer token"}, 401,
                                    headers={"WWW-Authenticate": "Bearer"})
            try:
                name = request.path_params.get("session", "")
                if name:
                    try:
                        check_stream(name)
                    except ValueError as exc:
                        raise _Refused(400, str(exc).replace("stream name", "session id", 1)) from None
                return await handler(request, name)
            except _Refused as refused:
                return JSONResponse({"error": str(refused)}, refused.status)

        return endpoint

    async def list_sessions(request: Request, _: str) -> Response:
        names = await host.sessions()
        held = set(host.held)
        return JSONResponse({"sessions": [{"id": n, "hosted": n in held} for n in names]})

    async def show(request: Request, name: str) -> Response:
        offset = _int_param(request, "offset", 0)
        limit = min(_int_param(request, "limit", 100), MAX_PAGE)
        session = await host.session(name)
        if session is None:
            raise _Refused(404, f"no session {name!r} in this store")
        inbox = session.inbox
        page = session.transcript[offset:offset + limit]
        return JSONResponse({
            "id": name, "version": session.version, "hosted": host.hosted(name) is not None,
            "running": session.running, "turn": session.turn, "step": session.step,
            "inbox": {"next_turn": inbox.count("next_turn"), "next_step": inbox.count("next_step"),
                      "wants_wake": inbox.wants_wake()},
            "transcript_length": len(session.transcript), "offset": offset,
            "transcript": [thaw_json(m.to_dict()) for m in page],
        })

    async def post_message(request: Request, name: str) -> Response:
        body = await _json_body(request, max_body)
        unknown = set(body) - {"mode", "text"}
        if unknown:
            raise _Refused(400, f"unknown field(s) {', '.join(sorted(unknown))}: send mode and text")
        mode = body.get("mode")
        if mode not in MODES:
            raise _Refused(400, f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        try:
            checked_text(body.get("text"))  # checked here, so a failure past it is the server's
        except (TypeError, ValueError) as exc:
            raise _Refused(400, str(exc)) from None
        sent = await host.send(name, mode, body["text"])
        return JSONResponse({"seq": sent.seq, "mode": mode}, 202)

    async def cancel(request: Request, name: str) -> Response:
        await _json_body(request, max_body, optional=True)
        return JSONResponse({"cancelled": await host.cancel(name)})

    async def events(request: Request, name: str) -> Response:
        after = _int_param(request, "after", 0)
        last_id = request.headers.get("last-event-id")
        if last_id is not None:
            after = _whole(last_id, "Last-Event-ID must be an event seq")
        return _EventStream(_sse(host, name, after, keepalive))

    async def page(request: Request) -> Response:
        # Where the app is mounted, so the page's links and calls go to it.
        root = html.escape(request.scope.get("root_path", "").rstrip("/"), quote=True)
        text = (_STATIC / "page.html").read_text("utf-8").replace("{{root}}", root)
        return Response(text, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    def static(file: str, media_type: str) -> Endpoint:
        async def serve(request: Request) -> Response:
            return Response((_STATIC / file).read_bytes(), media_type=media_type, headers=_PAGE_HEADERS)

        return serve

    routes = [
        Route("/api/sessions", api(list_sessions)),
        Route("/api/sessions/{session:nous_session}/messages", api(post_message), methods=["POST"]),
        Route("/api/sessions/{session:nous_session}/cancel", api(cancel), methods=["POST"]),
        Route("/api/sessions/{session:nous_session}/events", api(events)),
        Route("/api/sessions/{session:nous_session}", api(show)),
        Route("/", page),
        Route("/sessions/{session:nous_session}", page),
        Route("/static/page.js", static("page.js", "text/javascript; charset=utf-8")),
        Route("/static/page.css", static("page.css", "text/css; charset=utf-8")),
    ]
    middleware = [Middleware(CORSMiddleware, allow_origins=list(cors_origins),
                             allow_methods=["GET", "POST"],
                             allow_headers=["Authorization", "Content-Type", "Last-Event-ID"])
                  ] if cors_origins else []
    app = Starlette(routes=routes, middleware=middleware)
    app.state.host = host
    return app


def _int_param(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    return default if raw is None else _whole(raw, f"{name} must be a whole number >= 0")


def _whole(raw: str, must: str) -> int:
    # ASCII digits only: ``str.isdigit`` also passes digits ``int`` cannot read, such as "²".
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise _Refused(400, f"{must}, got {raw[:40]!r}")
    return int(raw)


async def _json_body(request: Request, limit: int, *, optional: bool = False) -> dict[str, Any]:
    """The request's JSON object, read no further than ``limit`` bytes."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    declared = request.headers.get("content-length")
    if declared is not None and _whole(declared, "Content-Length must be a number of bytes") > limit:
        raise _Refused(413, f"the body is {declared} bytes; at most {limit} are read")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _Refused(413, f"the body is over {limit} bytes")
    if optional and not body:
        return {}
    if kind != "application/json":
        raise _Refused(415, f"the body must be JSON (Content-Type: application/json), got {kind or 'none'!r}")
    try:
        value = msgspec.json.decode(bytes(body))
    except msgspec.DecodeError as exc:
        raise _Refused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise _Refused(400, f"the body must be a JSON object, got {type(value).__name__}")
    return value


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


async def _sse(host: SessionHost, name: str, after: int, keepalive: float) -> AsyncGenerator[bytes, None]:
    """The event stream: each event as ``id: seq`` and ``data: json``; a comment after each
    ``keepalive`` idle seconds; ends when the host stops or the client leaves."""
    queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=256)

    async def pump() -> None:
        try:
            async for event in host.events(name, after):
                await queue.put(event)
        except Exception:
            logger.warning("the event stream of session %r failed", name, exc_info=True)
        await queue.put(None)  # the end; not reached once cancelled, when nobody would read it

    loop = asyncio.get_running_loop()
    feeding = loop.create_task(pump())
    stopping = loop.create_task(host.stopping.wait())
    getting: asyncio.Task[Event | None] | None = None
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
                yield b"id: %d\ndata: %s\n\n" % (event.seq, event_data(event))
            elif stopping not in done:
                yield b": keep-alive\n\n"
    finally:
        waiting = [task for task in (getting, stopping, feeding) if task is not None]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
