"""The web API, driven through httpx's ASGI transport: every endpoint, and every bad request
refused with a clear 4xx before anything is written."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from nous_inbox.__main__ import main  # noqa: E402
from nous_inbox.codec import encode_event  # noqa: E402
from nous_inbox.events import (  # noqa: E402
    MessageSent,
    QueueClaimed,
    ToolCalled,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.message import Message, ToolCall  # noqa: E402
from nous_inbox.runner import Runner  # noqa: E402
from nous_inbox.safe_json import event_json  # noqa: E402
from nous_inbox.store import Store, open_store  # noqa: E402
from nous_inbox.web import SessionHost, create_app  # noqa: E402
from nous_inbox.web.routes import ROUTES  # noqa: E402
from tests.helpers import async_wait_until  # noqa: E402

TOKEN = "test-token-1234"
WAIT = 20.0  # seconds: a bound for what should happen at once, never a sleep to synchronise
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def quick_agent(session: str) -> Runner:
    return Runner(lambda transcript, tools: Message.assistant(f"heard {transcript[-1].content}"))


class Api:
    """A host on a fresh SQLite store, its app, and a client that shows the token."""

    def __init__(self, url: str, store: Store, host: SessionHost, app: Any, client: Any) -> None:
        self.url = url
        self.store = store
        self.app = app
        self.host = host
        self.client = client

    async def post(self, session: str, body: Any, **kwargs: Any) -> Any:
        return await self.client.post(f"/api/sessions/{session}/messages", json=body,
                                      headers=AUTH, **kwargs)

    def written(self) -> list[str]:
        return self.store.streams()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    with open_store(url) as store:
        async with SessionHost(store, quick_agent, scan_interval=None) as host:
            app = create_app(host, token=TOKEN, max_body=1024)
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield Api(url, store, host, app, client)


pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_each_mode_is_stored_as_its_send_and_answered_202_with_its_seq(api: Api) -> None:
    for mode in ("inject", "steer", "followup", "prompt"):
        response = await api.post("s1", {"mode": mode, "text": f"a {mode}"})
        assert response.status_code == 202
        assert response.json()["mode"] == mode
    owner = api.host.hosted("s1")
    assert owner is not None
    await owner.wait_idle()
    sends = {e.message.content: (str(e.target), e.wakeup, e.seq)
             for e in api.store.read("s1") if isinstance(e, MessageSent)}
    assert sends["a inject"][:2] == ("next_step", False)
    assert sends["a steer"][:2] == ("next_step", True)
    assert sends["a followup"][:2] == ("next_turn", True)
    assert sends["a prompt"][:2] == ("next_turn", True)
    assert any(isinstance(e, TurnStarted) and e.reason == "prompt" for e in api.store.read("s1"))


async def test_the_acknowledged_seq_is_the_stored_event(api: Api) -> None:
    response = await api.post("s1", {"mode": "inject", "text": "context"})
    (stored,) = api.store.read("s1", response.json()["seq"] - 1)
    assert isinstance(stored, MessageSent) and stored.message.content == "context"


async def test_a_session_lists_and_shows_its_counts_and_transcript_page(api: Api) -> None:
    assert (await api.client.get("/api/sessions", headers=AUTH)).json() == {
        "sessions": [], "total": 0, "offset": 0}
    for text in ("one", "two", "three"):
        await api.post("s1", {"mode": "inject", "text": text})
    await api.post("s1", {"mode": "followup", "text": "later"})
    owner = api.host.hosted("s1")
    assert owner is not None
    await owner.wait_idle()
    listed = (await api.client.get("/api/sessions", headers=AUTH)).json()
    assert [(s["id"], s["hosted"]) for s in listed["sessions"]] == [("s1", True)]
    shown = (await api.client.get("/api/sessions/s1?offset=1&limit=2", headers=AUTH)).json()
    assert shown["transcript_length"] == len(owner.transcript)
    assert [m["content"] for m in shown["transcript"]] == [m.content for m in owner.transcript[1:3]]
    assert shown["inbox"] == {"next_turn": 0, "next_step": 0, "wants_wake": False}
    assert (shown["running"], shown["turn"], shown["hosted"]) == (False, 1, True)
    assert shown["version"] == api.store.version("s1")


async def test_a_session_not_held_here_is_read_from_the_store(api: Api) -> None:
    api.store.append("elsewhere", [MessageSent(target="next_turn", wakeup=False,
                                               message=Message.user("queued"))])
    shown = (await api.client.get("/api/sessions/elsewhere", headers=AUTH)).json()
    assert (shown["hosted"], shown["inbox"]["next_turn"]) == (False, 1)


async def test_an_unknown_session_is_404(api: Api) -> None:
    response = await api.client.get("/api/sessions/nobody", headers=AUTH)
    assert response.status_code == 404 and "no session 'nobody'" in response.json()["error"]


async def test_cancel_ends_a_run_held_here(tmp_path: Path) -> None:
    started = asyncio.Event()

    async def model(transcript: Any, tools: Any) -> str:
        started.set()
        await asyncio.Event().wait()  # a model request that never answers by itself
        return "never"

    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        async with SessionHost(store, lambda s: Runner(model), scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://test") as client:
                idle = await client.post("/api/sessions/s1/cancel", headers=AUTH)
                assert idle.json() == {"cancelled": False}
                await client.post("/api/sessions/s1/messages", headers=AUTH,
                                  json={"mode": "prompt", "text": "work"})
                await asyncio.wait_for(started.wait(), 10)
                response = await client.post("/api/sessions/s1/cancel", headers=AUTH)
                assert (response.status_code, response.json()) == (200, {"cancelled": True})
                owner = host.hosted("s1")
                assert owner is not None and await owner.wait_idle(10)
            ends = [e for e in store.read("s1") if isinstance(e, TurnEnded)]
            assert [e.reason for e in ends] == ["cancelled"]


async def test_a_failure_of_the_server_is_a_500_not_a_refusal_of_the_request(tmp_path: Path) -> None:
    def misconfigured(session: str) -> Runner:
        raise ValueError("the agent has no model configured")

    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        async with SessionHost(store, misconfigured, scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app, raise_app_exceptions=False),
                                         base_url="http://test") as client:
                response = await client.post("/api/sessions/s1/messages", headers=AUTH,
                                             json={"mode": "steer", "text": "go"})
        assert response.status_code == 500 and "no model configured" not in response.text
        assert store.streams() == []


# -- refusals: a clear 4xx, and nothing written ---------------------------------------------------

BAD_BODIES: list[tuple[str, dict[str, Any], int, str]] = [
    ("unknown mode", {"json": {"mode": "shout", "text": "x"}}, 400,
     "mode: Invalid enum value 'shout'; send {\"mode\": \"steer\" | \"inject\""),
    ("no mode", {"json": {"text": "x"}}, 400, "missing required field `mode`"),
    ("no text", {"json": {"mode": "steer"}}, 400, "missing required field `text`"),
    ("text not a string", {"json": {"mode": "steer", "text": 5}}, 400,
     "text: Expected `str`, got `int`"),
    ("empty text", {"json": {"mode": "steer", "text": " \n "}}, 400, "text is empty"),
    ("an extra field", {"json": {"mode": "steer", "text": "x", "role": "system"}}, 400,
     "unknown field `role`"),
    ("a list", {"json": ["steer", "x"]}, 400, "the body: Expected `object`, got `array`"),
    ("malformed JSON", {"content": b'{"mode": "steer", "text": ', "headers": {
        "Content-Type": "application/json"}}, 400, "not JSON"),
    ("a lone surrogate", {"content": b'{"mode": "steer", "text": "\\ud800"}', "headers": {
        "Content-Type": "application/json"}}, 400, "not JSON"),
    ("a form", {"data": {"mode": "steer", "text": "x"}}, 415, "must be JSON"),
    ("a huge body", {"json": {"mode": "steer", "text": "x" * 5000}}, 413, "at most 1024"),
]


@pytest.mark.parametrize(("case", "request_kwargs", "status", "says"), BAD_BODIES,
                         ids=[case[0] for case in BAD_BODIES])
async def test_a_bad_body_is_refused_and_nothing_is_written(
    api: Api, case: str, request_kwargs: dict[str, Any], status: int, says: str,
) -> None:
    headers = {**AUTH, **request_kwargs.pop("headers", {})}
    response = await api.client.post("/api/sessions/s1/messages", headers=headers, **request_kwargs)
    assert response.status_code == status, response.text
    assert says in response.json()["error"]
    assert api.written() == [] and api.host.held == []


# Every endpoint of the API, by method and path, with the query parameters it takes.
ENDPOINTS = [
    ("GET", "/api/sessions", ("offset", "limit")),
    ("GET", "/api/sessions/s1/view/1", ("offset", "limit")),
    ("GET", "/api/sessions/s1", ("offset", "limit")),
    ("POST", "/api/sessions/s1/messages", ()),
    ("POST", "/api/sessions/s1/cancel", ()),
    ("GET", "/api/sessions/s1/events", ("after", "deltas")),
    ("GET", "/api/sessions/s1/messages/1", ()),
    ("POST", "/api/sessions/s1/messages/1/withdraw", ()),
]
POSTS = [(path, {"mode": "steer", "text": "x"} if path.endswith("messages") else {})
         for method, path, _ in ENDPOINTS if method == "POST"]
WRONG_TYPES: dict[str, Any] = {"a list": ["steer"], "an object": {"steer": "x"}, "a number": 5,
                               "null": None, "a boolean": True}


async def test_the_walks_below_cover_every_endpoint_of_the_api(api: Api) -> None:
    served = {(e.method, e.path.replace("{session}", "s1").replace("{seq}", "1"),
               tuple(param.name for param in e.query))
              for e in ROUTES if e.path.startswith("/api")}
    assert served == set(ENDPOINTS)


@pytest.mark.parametrize("wrong", [*WRONG_TYPES, "missing"])
@pytest.mark.parametrize("field", ["mode", "text"])
async def test_a_field_of_a_send_of_the_wrong_type_or_missing_is_refused_naming_it(
    api: Api, field: str, wrong: str,
) -> None:
    body: dict[str, Any] = {"mode": "steer", "text": "x"}
    if wrong == "missing":
        del body[field]
    else:
        body[field] = WRONG_TYPES[wrong]
    response = await api.post("s1", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (f"{field}: Expected `str`" in error if wrong != "missing"
            else f"missing required field `{field}`" in error)
    assert api.written() == [] and api.host.held == []


@pytest.mark.parametrize("wrong", [*WRONG_TYPES, "a string"])
@pytest.mark.parametrize(("path", "good"), POSTS, ids=[path for path, _ in POSTS])
async def test_a_body_that_is_not_an_object_is_refused_on_every_post(
    api: Api, path: str, good: dict[str, Any], wrong: str,
) -> None:
    body = "steer" if wrong == "a string" else WRONG_TYPES[wrong]
    if wrong == "an object":
        body = {**good, "extra": body}  # an object, with a field no endpoint takes
    response = await api.client.post(path, content=json.dumps(body).encode(),
                                     headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert ("unknown field `extra`" in error if wrong == "an object"
            else "the body: Expected `object`" in error)
    assert api.written() == [] and api.host.held == []


async def test_a_cancel_takes_no_body_or_an_empty_object(api: Api) -> None:
    for kwargs in ({}, {"json": {}}):
        response = await api.client.post("/api/sessions/s1/cancel", headers=AUTH, **kwargs)
        assert (response.status_code, response.json()) == (200, {"cancelled": False})


QUERY_CASES = [(method, path, param, value) for method, path, params in ENDPOINTS
               for param in params
               for value in ("x", "", "-1", "null", "[1]", "{}", "1.5", "true")]


@pytest.mark.parametrize(("method", "path", "param", "value"), QUERY_CASES)
async def test_a_query_parameter_that_is_not_a_whole_number_is_refused_naming_it(
    api: Api, method: str, path: str, param: str, value: str,
) -> None:
    response = await api.client.request(method, path, params={param: value}, headers=AUTH)
    assert response.status_code == 400, response.text
    assert f"{param} must be a whole number >= 0, got {value!r}" in response.json()["error"]


@pytest.mark.parametrize(("method", "path", "takes"), ENDPOINTS)
async def test_every_endpoint_refuses_a_query_parameter_it_does_not_take_or_one_given_twice(
    api: Api, method: str, path: str, takes: tuple[str, ...],
) -> None:
    body = {"mode": "steer", "text": "x"} if path.endswith("messages") else None
    # Bounded: an event stream that took the request would never end by itself.
    response = await asyncio.wait_for(api.client.request(
        method, path, params={"extra": "1"}, headers=AUTH, json=body), WAIT)
    assert response.status_code == 400, response.text
    assert "unknown query parameter 'extra'" in response.json()["error"]
    for param in takes:
        response = await asyncio.wait_for(api.client.request(
            method, path, params=[(param, "1"), (param, "2")], headers=AUTH), WAIT)
        assert response.status_code == 400, response.text
        assert f"query parameter {param} is given more than once" in response.json()["error"]
    assert api.written() == [] and api.host.held == []


async def test_a_body_that_streams_past_the_limit_is_refused(api: Api) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"mode": "steer", "text": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'"}'

    response = await api.client.post("/api/sessions/s1/messages", content=chunks(),
                                     headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 413 and api.written() == []


async def test_a_content_length_that_is_not_a_number_is_refused(api: Api) -> None:
    body = b'{"mode": "steer", "text": "x"}'
    headers: dict[str, str | bytes] = {**AUTH, "Content-Type": "application/json",
                                       "Content-Length": "\u00b2".encode("latin-1")}
    answer: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        answer.append(message)

    await api.app(get_scope("/api/sessions/s1/messages", headers, "POST"), receive, send)
    assert answer[0]["status"] == 400 and b"Content-Length" in answer[1]["body"]
    assert api.written() == []


@pytest.mark.parametrize(("session", "says"), [
    ("a%01b", "control character"),
    ("a%0Ab", "control character"),
    ("x" * 300, "characters long"),
])
async def test_a_bad_session_id_is_refused_on_every_endpoint(api: Api, session: str, says: str) -> None:
    for method, path in (("POST", "messages"), ("POST", "cancel"), ("GET", "events"), ("GET", "")):
        url = f"/api/sessions/{session}/{path}".rstrip("/")
        response = await api.client.request(method, url, headers=AUTH,
                                            json={"mode": "steer", "text": "x"})
        assert response.status_code == 400, (method, url)
        assert says in response.json()["error"] and "session id" in response.json()["error"]
    assert api.written() == []


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong-token-0000"},
                                     {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}],
                         ids=["missing", "wrong", "no scheme", "basic"])
async def test_every_api_call_needs_the_token(api: Api, headers: dict[str, str]) -> None:
    for method, url in (("GET", "/api/sessions"), ("GET", "/api/sessions/s1"),
                        ("POST", "/api/sessions/s1/messages"), ("POST", "/api/sessions/s1/cancel"),
                        ("GET", "/api/sessions/s1/events")):
        response = await api.client.request(method, url, headers=headers,
                                            json={"mode": "prompt", "text": "x"})
        assert response.status_code == 401, (method, url)
        assert response.headers["www-authenticate"] == "Bearer"
    assert api.written() == [] and api.host.held == []


@pytest.mark.parametrize("query", ["after=-1", "after=x", "after=1e3", "offset=-2",
                                   "after=%C2%B2", "limit=%C2%B9"])  # digits int() cannot read
async def test_a_bad_position_is_refused(api: Api, query: str) -> None:
    path = "events" if query.startswith("after") else ""
    response = await api.client.get(f"/api/sessions/s1/{path}?{query}".replace("/?", "?"),
                                    headers=AUTH)
    assert response.status_code == 400 and "whole number" in response.json()["error"]


@pytest.mark.parametrize("last_id", [b"abc", b"-1", "\u00b2".encode("latin-1")])
async def test_a_bad_last_event_id_is_refused(api: Api, last_id: bytes) -> None:
    response = await api.client.get("/api/sessions/s1/events",
                                    headers={**AUTH, "Last-Event-ID": last_id})
    assert response.status_code == 400 and "Last-Event-ID" in response.json()["error"]


def test_the_token_must_be_a_real_secret() -> None:
    host = SessionHost(open_store("memory:"), quick_agent)
    for token in ("", "short", "has space in it", "tab\there-it-is"):
        with pytest.raises(ValueError, match="token must be at least 8 printable"):
            create_app(host, token=token)


# -- the event stream --------------------------------------------------------------------------


def parse_sse(body: str) -> list[tuple[int, dict[str, Any]]]:
    """(id, data) of each event in an SSE body; comments are skipped."""
    events = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            events.append((int(fields["id"]), json.loads(fields["data"])))
    return events


def get_scope(url: str, headers: dict[str, str | bytes], method: str = "GET") -> dict[str, Any]:
    """The ASGI scope of a request for ``url`` with ``headers``, as a server hands it to the app
    (a header given as bytes goes as it is, however a server would have judged it)."""
    path, _, query = url.partition("?")
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": query.encode(), "server": ("test", 80), "client": ("test", 1),
            "headers": [(k.lower().encode(), v if isinstance(v, bytes) else v.encode())
                        for k, v in headers.items()]}


async def stream_until_stopped(api: Api, url: str, headers: dict[str, str],
                               until: Callable[[str], bool]) -> tuple[int, dict[str, str], str]:
    """Drive the app's event stream as a server would, and stop the host once ``until(body so
    far)`` holds: (status, headers, the whole body). (httpx's ASGI transport hands a body over
    only once it has ended, so the stream is read here at the ASGI level.)"""
    app = api.app
    scope = get_scope(url, headers)
    started: dict[str, Any] = {}
    body = bytearray()
    disconnect = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
        else:
            body.extend(message.get("body", b""))
            if until(body.decode()):
                api.host.stopping.set()

    await asyncio.wait_for(app(scope, receive, send), 20)
    head = {k.decode(): v.decode() for k, v in started["headers"]}
    return started["status"], head, body.decode()


async def test_the_event_stream_is_the_log_from_a_position_and_ends_when_the_host_stops(api: Api) -> None:
    for text in ("one", "two", "three"):
        await api.post("s1", {"mode": "inject", "text": text})
    status, headers, body = await stream_until_stopped(
        api, "/api/sessions/s1/events?after=1", AUTH, lambda body: "id: 3" in body)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    stored = list(api.store.read("s1", 1))
    assert parse_sse(body) == [(e.seq, json.loads(event_json(e))) for e in stored]


#: What a terminal or a page would obey rather than show: ESC, CSI in its one-byte C1 form, DEL,
#: a bidi override and isolate, and the line separator JavaScript chokes on.
HOSTILE = "\x1b[2J\x9b31m\x7f\u202eevil\u2066\u2028end"


async def test_each_event_of_the_stream_is_the_line_log_json_prints(api: Api) -> None:
    call = ToolCall("c1", "read\u202e", {"path": HOSTILE})
    api.store.append("s1", [
        MessageSent(target="next_step", wakeup=False, message=Message.user(HOSTILE)),
        ToolCalled(turn=1, step=1, call=call),
        Warned(text=HOSTILE),
    ])
    _, _, body = await stream_until_stopped(api, "/api/sessions/s1/events", AUTH,
                                            lambda body: "id: 3" in body)
    sent = [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]
    out = io.StringIO()
    assert main(["log", "--store", api.url, "s1", "--json"], out=out) == 0
    assert sent == out.getvalue().splitlines()  # the same bytes, escapes and all
    assert not any(c in line for line in sent for c in "\x1b\x9b\x7f\u202e\u2066\u2028")
    assert [json.loads(line) for line in sent] == [
        json.loads(encode_event(e)) for e in api.store.read("s1")]  # and the same events


async def test_json_answers_escape_what_log_json_escapes(api: Api) -> None:
    name = "b\u202eeta"
    api.store.append(name, [
        MessageSent(target="next_turn", wakeup=True, message=Message.user(HOSTILE)),
        TurnStarted(turn=1), QueueClaimed(target="next_turn", count=1),
    ])
    for path in ("/api/sessions", f"/api/sessions/{name}"):
        response = await api.client.get(path, headers=AUTH)
        assert response.status_code == 200
        assert not any(c in response.text for c in "\x1b\x9b\x7f\u202e\u2066\u2028"), path
    shown = (await api.client.get(f"/api/sessions/{name}", headers=AUTH)).json()
    assert (shown["id"], shown["transcript"][0]["content"]) == (name, HOSTILE)  # the same text
    listed = (await api.client.get("/api/sessions", headers=AUTH)).json()
    assert [(s["id"], s["hosted"]) for s in listed["sessions"]] == [(name, False)]


def a_backlog(store: Store, session: str, count: int) -> None:
    """``count`` injections in ``session``'s log: more than an event stream buffers."""
    store.append(session, [MessageSent(target="next_step", wakeup=False,
                                       message=Message.user(f"note {i}")) for i in range(count)])


async def test_a_stream_ends_when_the_host_stops_even_with_a_backlog_still_to_send(api: Api) -> None:
    a_backlog(api.store, "long", 300)
    _, _, body = await stream_until_stopped(api, "/api/sessions/long/events", AUTH,
                                            lambda body: "id: 1\n" in body)
    assert [seq for seq, _ in parse_sse(body)] == [1]


async def test_a_client_that_stops_reading_and_leaves_leaves_no_task_behind(api: Api) -> None:
    a_backlog(api.store, "long", 300)
    before = asyncio.all_tasks()
    first_event, leave = asyncio.Event(), asyncio.Event()

    async def receive() -> dict[str, Any]:
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if b"id: 1\n" in message.get("body", b""):
            first_event.set()
            await asyncio.Event().wait()  # the client reads nothing more

    served = asyncio.ensure_future(api.app(get_scope("/api/sessions/long/events", AUTH), receive, send))
    await asyncio.wait_for(first_event.wait(), 20)
    leave.set()
    await asyncio.wait_for(served, 20)
    await async_wait_until(
        lambda: not {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()},
        what="every task the stream began has ended")


async def test_an_idle_stream_sends_keep_alive_comments(api: Api) -> None:
    api.app = create_app(api.host, token=TOKEN, keepalive=0.01)  # the same host, a short keep-alive
    _, _, body = await stream_until_stopped(api, "/api/sessions/quiet/events", AUTH,
                                            lambda body: ": keep-alive" in body)
    assert ": keep-alive\n\n" in body and parse_sse(body) == []


async def test_last_event_id_wins_over_after(api: Api) -> None:
    for text in ("one", "two", "three"):
        await api.post("s1", {"mode": "inject", "text": text})
    _, _, body = await stream_until_stopped(
        api, "/api/sessions/s1/events?after=0", {**AUTH, "Last-Event-ID": "2"},
        lambda body: "id: 3" in body)
    assert [seq for seq, _ in parse_sse(body)] == [3]


async def test_the_stream_of_a_session_held_elsewhere_follows_the_store(api: Api) -> None:
    api.store.append("other", [MessageSent(target="next_step", wakeup=False,
                                           message=Message.user("first"))])

    def append_after_the_first(body: str) -> bool:
        if "id: 1" in body and api.store.version("other") == 1:
            api.store.append("other", [MessageSent(target="next_step", wakeup=False,
                                                   message=Message.user("second"))])
        return "id: 2" in body

    _, _, body = await stream_until_stopped(api, "/api/sessions/other/events", AUTH,
                                            append_after_the_first)
    assert [data["message"]["content"] for _, data in parse_sse(body)] == ["first", "second"]
    assert api.host.held == []  # followed, not taken


async def test_no_cors_header_unless_configured(api: Api, tmp_path: Path) -> None:
    origin = {"Origin": "https://elsewhere.example"}
    response = await api.client.get("/api/sessions", headers={**AUTH, **origin})
    assert "access-control-allow-origin" not in response.headers
    app = create_app(api.host, token=TOKEN, cors_origins=["https://elsewhere.example"])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as c:
        allowed = await c.get("/api/sessions", headers={**AUTH, **origin})
    assert allowed.headers["access-control-allow-origin"] == "https://elsewhere.example"


async def test_the_page_allows_only_its_own_script_and_style(api: Api) -> None:
    for path in ("/", "/sessions/s1", "/static/page.js", "/static/page.css"):
        response = await api.client.get(path)
        assert response.status_code == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert response.headers["x-content-type-options"] == "nosniff"


# -- receipts and withdraw ---------------------------------------------------------------------


async def test_a_send_is_followed_to_the_turn_and_step_that_claimed_it(api: Api) -> None:
    seq = (await api.post("s1", {"mode": "steer", "text": "go"})).json()["seq"]
    owner = api.host.hosted("s1")
    assert owner is not None
    await owner.wait_idle()
    answer = (await api.client.get(f"/api/sessions/s1/messages/{seq}", headers=AUTH)).json()
    assert (answer["sent"], answer["state"], answer["turn"], answer["step"]) == (seq, "claimed", 1, 1)
    withdrawn = await api.client.post(f"/api/sessions/s1/messages/{seq}/withdraw", headers=AUTH)
    assert (withdrawn.status_code, withdrawn.json()) == (200, answer)  # where it went


async def test_a_queued_send_is_withdrawn_and_says_so(api: Api) -> None:
    seq = (await api.post("s1", {"mode": "inject", "text": "fyi"})).json()["seq"]
    url = f"/api/sessions/s1/messages/{seq}"
    assert (await api.client.get(url, headers=AUTH)).json()["state"] == "queued"
    withdrawn = await api.client.post(url + "/withdraw", headers=AUTH, json={})
    assert withdrawn.status_code == 200 and withdrawn.json()["state"] == "withdrawn"
    assert (await api.client.get(url, headers=AUTH)).json() == withdrawn.json()
    shown = (await api.client.get("/api/sessions/s1", headers=AUTH)).json()
    assert shown["inbox"]["next_step"] == 0


async def test_a_send_to_a_session_held_elsewhere_is_withdrawn_through_the_log(api: Api) -> None:
    api.store.append("elsewhere", [MessageSent(target="next_turn", wakeup=True,
                                               message=Message.user("queued"))])
    url = "/api/sessions/elsewhere/messages/1"
    assert (await api.client.post(url + "/withdraw", headers=AUTH)).json()["state"] == "withdrawn"
    assert api.host.hosted("elsewhere") is None and api.store.version("elsewhere") == 2


async def test_a_receipt_of_no_send_is_404_saying_why(api: Api) -> None:
    missing = await api.client.get("/api/sessions/s1/messages/3", headers=AUTH)
    assert missing.status_code == 404 and "no event at seq 3" in missing.json()["error"]
    await api.post("s1", {"mode": "steer", "text": "go"})
    owner = api.host.hosted("s1")
    assert owner is not None
    await owner.wait_idle()
    not_a_send = await api.client.post("/api/sessions/s1/messages/2/withdraw", headers=AUTH)
    assert not_a_send.status_code == 404 and "not a send" in not_a_send.json()["error"]
