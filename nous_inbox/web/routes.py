"""The web face's route table: every route it serves, declared once (:data:`ROUTES`).

The app serves exactly these routes and checks each request against its declaration; the OpenAPI
document at ``/openapi.json`` is derived from the same table. Adding a route is adding one
:class:`~nous_inbox.web.endpoint.Endpoint` to the table (and its handler): it is then served,
checked and documented, and the test that walks the document covers it.

A path parameter is one segment of the path as sent (a ``/`` in a session id is sent as
``%2F``), so no two routes can match one request and the table's order does not matter.

>>> [(e.method, e.path) for e in ROUTES if e.path.endswith("/cancel")]
[('POST', '/api/sessions/{session}/cancel')]
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Final

from starlette.responses import Response

from nous_inbox.receipts import Receipt
from nous_inbox.web.checks import Refused, whole
from nous_inbox.web.endpoint import Call, Endpoint, Param
from nous_inbox.web.host import checked_text
from nous_inbox.web.openapi import STREAM_ITEM, document_response
from nous_inbox.web.page import page, page_css, page_js
from nous_inbox.web.probes import Liveness, Readiness, healthz, metrics, readyz
from nous_inbox.web.schema import (
    CancelAnswer,
    CancelRequest,
    InboxCounts,
    SendAccepted,
    SendRequest,
    SessionList,
    SessionState,
    SessionSummary,
    WithdrawRequest,
)
from nous_inbox.web.stream import EventStream, sse

__all__ = ["MAX_PAGE", "ROUTES"]

#: The most transcript messages one ``GET /api/sessions/{id}`` returns.
MAX_PAGE: Final = 500


async def list_sessions(call: Call) -> SessionList:
    """Every session of the store, and whether this server holds it."""
    names = await call.host.sessions()
    held = set(call.host.held)
    return SessionList([SessionSummary(n, n in held) for n in names])


async def show_session(call: Call) -> SessionState:
    """A session's counts, run and a page of its transcript."""
    name = call.session
    offset, limit = call.query["offset"], min(call.query["limit"], MAX_PAGE)
    session = await call.host.session(name)
    if session is None:
        raise Refused(404, f"no session {name!r} in this store")
    inbox = session.inbox
    return SessionState(
        id=name, version=session.version, hosted=call.host.hosted(name) is not None,
        running=session.running, turn=session.turn, step=session.step,
        inbox=InboxCounts(inbox.count("next_turn"), inbox.count("next_step"), inbox.wants_wake()),
        transcript_length=len(session.transcript), offset=offset,
        transcript=list(session.transcript[offset:offset + limit]),
    )


async def send_message(call: Call) -> SendAccepted:
    """Send a message with a verb; answered once it is stored."""
    body = call.body_as(SendRequest)
    try:
        checked_text(body.text)  # checked here, so a failure past it is the server's
    except (TypeError, ValueError) as exc:
        raise Refused(400, str(exc)) from None
    sent = await call.host.send(call.session, body.mode, body.text)
    return SendAccepted(sent.seq, body.mode)


async def get_receipt(call: Call) -> Receipt:
    """Where the send at ``seq`` went: queued, claimed (by which turn, for which step) or
    withdrawn."""
    return await _answered(call.host.receipt(call.session, call.path["seq"]))


async def withdraw_message(call: Call) -> Receipt:
    """Take the message back if no claim took it yet; answers its receipt."""
    return await _answered(call.host.withdraw(call.session, call.path["seq"]))


async def cancel_run(call: Call) -> CancelAnswer:
    """Cancel the session's run, here or wherever it is held."""
    return CancelAnswer(await call.host.cancel(call.session))


async def stream_events(call: Call) -> Response:
    """The session's events as Server-Sent Events, from a position, live."""
    after = call.query["after"]
    last_id = call.request.headers.get("last-event-id")
    if last_id is not None:
        after = whole(last_id, "Last-Event-ID must be an event seq")
    return EventStream(sse(call.host, call.session, after, call.keepalive,
                           deltas=call.query["deltas"] == 1))


async def _answered(asked: Awaitable[Receipt]) -> Receipt:
    """A receipt, or the 404 saying why the path names no send: no event at its seq, or an
    event of another kind."""
    try:
        return await asked
    except (LookupError, ValueError) as exc:
        raise Refused(404, str(exc)) from None


async def openapi(call: Call) -> Response:
    """This document: the HTTP API as OpenAPI 3.1."""
    return document_response(ROUTES, call.request.scope.get("root_path", ""))


_NO_SEND: Final = ((404, "the session has no send at seq: no event there, or another kind"),)

#: Every route of the web face, in the order they are matched (see the module's docstring).
ROUTES: Final[tuple[Endpoint, ...]] = (
    Endpoint("GET", "/api/sessions", list_sessions, "List the sessions", answer=SessionList),
    Endpoint("POST", "/api/sessions/{session}/messages", send_message, "Send a message",
             answer=SendAccepted, status=202, body=SendRequest),
    Endpoint("GET", "/api/sessions/{session}/messages/{seq}", get_receipt,
             "Where a send went", answer=Receipt, refuses=_NO_SEND),
    Endpoint("POST", "/api/sessions/{session}/messages/{seq}/withdraw", withdraw_message,
             "Withdraw a queued message", answer=Receipt, body=WithdrawRequest,
             body_optional=True, refuses=_NO_SEND),
    Endpoint("POST", "/api/sessions/{session}/cancel", cancel_run, "Cancel the run",
             answer=CancelAnswer, body=CancelRequest, body_optional=True),
    Endpoint("GET", "/api/sessions/{session}/events", stream_events, "Follow the events",
             answer=STREAM_ITEM, media_type="text/event-stream",
             headers=(Param("Last-Event-ID", 0, "Resume after this seq (wins over after)."),),
             query=(
                 Param("after", 0, "Send the events after this seq (Last-Event-ID wins)."),
                 Param("deltas", 0, "1: also the model's text as it streams.", maximum=1))),
    Endpoint("GET", "/api/sessions/{session}", show_session, "Show a session",
             answer=SessionState, refuses=((404, "the store has no such session"),), query=(
                 Param("offset", 0, "The first transcript message to return."),
                 Param("limit", 100, f"How many transcript messages (at most {MAX_PAGE})."))),
    Endpoint("GET", "/openapi.json", openapi, "This document", auth=False, tag="meta"),
    Endpoint("GET", "/healthz", healthz, "Whether the process lives", answer=Liveness,
             auth=False, tag="operations"),
    Endpoint("GET", "/readyz", readyz, "Whether the host takes work", answer=Readiness,
             auth=False, tag="operations",
             refuses=((503, "not ready: stopping or draining, or its store does not answer"),)),
    Endpoint("GET", "/metrics", metrics, "Prometheus metrics", auth=False, tag="operations",
             media_type="text/plain"),
    Endpoint("GET", "/", page, "The page: the sessions", media_type="text/html", auth=False,
             tag="page"),
    Endpoint("GET", "/sessions/{session}", page, "The page: a session", media_type="text/html",
             auth=False, tag="page", name="session_page"),
    Endpoint("GET", "/static/page.js", page_js, "The page's script",
             media_type="text/javascript", auth=False, tag="page"),
    Endpoint("GET", "/static/page.css", page_css, "The page's style", media_type="text/css",
             auth=False, tag="page"),
)
