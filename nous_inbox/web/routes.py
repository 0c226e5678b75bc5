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

from bisect import bisect_left, bisect_right
from collections.abc import Awaitable
from typing import Final

from starlette.responses import Response

from nous_inbox.codec import MAX_STREAM_NAME
from nous_inbox.events import Event, ModelRequested
from nous_inbox.inbox import Inbox
from nous_inbox.receipts import Receipt
from nous_inbox.session import Session
from nous_inbox.store import Store
from nous_inbox.web.checks import Refused, whole
from nous_inbox.web.endpoint import Call, Endpoint, Param, TextParam, session_prefix
from nous_inbox.web.host import checked_text
from nous_inbox.web.openapi import STREAM_ITEM, document_response
from nous_inbox.web.page import page, page_css, page_js
from nous_inbox.web.probes import Liveness, Readiness, healthz, metrics, readyz
from nous_inbox.web.schema import (
    CancelAnswer,
    CancelRequest,
    InboxCounts,
    ModelView,
    QueuedEntry,
    Queues,
    SendAccepted,
    SendRequest,
    SessionBrief,
    SessionList,
    SessionState,
    SessionSummary,
    WithdrawRequest,
)
from nous_inbox.web.stream import EventStream, sse

__all__ = ["MAX_LIST", "MAX_PAGE", "MAX_QUEUED", "ROUTES"]

#: The most transcript messages one ``GET /api/sessions/{id}`` (or a model's view) returns.
MAX_PAGE: Final = 500

#: The most sessions one ``GET /api/sessions`` returns.
MAX_LIST: Final = 500

#: The most queued messages ``GET /api/sessions/{id}`` shows of each queue (the first ones).
MAX_QUEUED: Final = 100


async def list_sessions(call: Call) -> SessionList:
    """A page of the store's sessions whose id starts with ``prefix``, each with its state as
    this server knows it without reading its log.

    A held session's state is its owner's; another's is what the server's last scan read, or
    nothing. Only the names are read from the store, so a page costs the same whether the store
    holds ten sessions or ten thousand."""
    names = await call.host.sessions()
    prefix = call.texts["prefix"]
    first = bisect_left(names, prefix)
    # Sorted names cut to the prefix's length stay sorted: the matches are one run from first.
    end = bisect_right(names, prefix, lo=first, key=lambda name: name[:len(prefix)])
    offset, limit = call.query["offset"], min(call.query["limit"], MAX_LIST)
    page = names[first + min(offset, end - first):first + min(offset + limit, end - first)]
    return SessionList([_summary(call, name) for name in page], end - first, offset)


def _summary(call: Call, name: str) -> SessionSummary:
    known = call.host.known(name)
    return SessionSummary(name, call.host.hosted(name) is not None,
                          None if known is None else _brief(known))


def _brief(session: Session) -> SessionBrief:
    return SessionBrief(session.version, session.running, session.turn, session.step,
                        _counts(session.inbox))


def _counts(inbox: Inbox) -> InboxCounts:
    return InboxCounts(inbox.count("next_turn"), inbox.count("next_step"), inbox.wants_wake())


def _queued(inbox: Inbox, target: str) -> list[QueuedEntry]:
    entries = inbox.entries(target)[:MAX_QUEUED]
    seqs = inbox.seqs(target)[:MAX_QUEUED]
    return [QueuedEntry(seq, message, wakeup)
            for seq, (message, wakeup) in zip(seqs, entries, strict=True)]


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
        inbox=_counts(inbox),
        queued=Queues(_queued(inbox, "next_turn"), _queued(inbox, "next_step")),
        transcript_length=len(session.transcript), offset=offset,
        transcript=list(session.transcript[offset:offset + limit]),
    )


async def model_view(call: Call) -> ModelView:
    """What the model was shown at a request: the first ``count`` messages of the transcript,
    ``count`` being what the ``model_requested`` event at ``seq`` recorded (the transcript only
    grows, so they are the messages it was asked with); a page of them from ``offset``."""
    name, seq = call.session, call.path["seq"]
    event = await call.host.call(_event_at, call.host.store, name, seq)
    if event is None:
        raise Refused(404, f"session {name!r} has no event at seq {seq}")
    if not isinstance(event, ModelRequested):
        # 404 as for no event, as a receipt of no send is: the path names no model request.
        kind = type(event).__struct_config__.tag
        raise Refused(404, f"the event at seq {seq} is {kind}, not model_requested: only a "
                           "model request has a view")
    session = await call.host.session(name)
    if session is None:  # deleted since: its event was read a moment ago
        raise Refused(404, f"no session {name!r} in this store")
    shown = min(event.count, len(session.transcript))
    offset, limit = min(call.query["offset"], shown), min(call.query["limit"], MAX_PAGE)
    return ModelView(seq, event.turn, event.step, event.count, offset,
                     list(session.transcript[offset:min(offset + limit, shown)]))


def _event_at(store: Store, session: str, seq: int) -> Event | None:
    for event in store.read(session, seq - 1):
        return event if event.seq == seq else None
    return None


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
    Endpoint("GET", "/api/sessions", list_sessions, "List the sessions", answer=SessionList,
             query=(Param("offset", 0, "The first session (of those matching) to return."),
                    Param("limit", 100, f"How many sessions (at most {MAX_LIST}).")),
             texts=(TextParam("prefix", "Only the sessions whose id starts with this.",
                              session_prefix, {
                                  "type": "string", "maxLength": MAX_STREAM_NAME, "default": "",
                                  "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"}),)),
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
    Endpoint("GET", "/api/sessions/{session}/view/{seq}", model_view,
             "The model's view at a request", answer=ModelView,
             refuses=((404, "the session has no model request at seq: no event there, or "
                            "another kind"),),
             query=(Param("offset", 0, "The first message of the view to return."),
                    Param("limit", 100, f"How many messages (at most {MAX_PAGE})."))),
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
