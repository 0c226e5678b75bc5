"""The web face's probes: ``/healthz`` and ``/readyz`` without the token, and ``/metrics``
scraped from a real app and parsed with prometheus_client's parser, each family moving as sends,
claims, turns and event streams happen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from nous_inbox.events import StepStarted, ToolCalled, TurnStarted  # noqa: E402
from nous_inbox.message import Message, ToolCall  # noqa: E402
from nous_inbox.runner import Runner  # noqa: E402
from nous_inbox.store import Store, open_store  # noqa: E402
from nous_inbox.web import SessionHost, create_app  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.test_web_serve import AUTH as SERVE_AUTH  # noqa: E402
from tests.test_web_serve import start_serve  # noqa: E402

TOKEN = "test-token-1234"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT = 20.0  # seconds: a bound for what should happen at once, never a sleep to synchronise

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Gate:
    """An agent whose model call waits until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()

    def agent(self, session: str) -> Runner:
        async def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
            self.entered.set()
            await self.open.wait()
            return Message.assistant(f"heard {transcript[-1].content}")

        return Runner(model)


class Served:
    def __init__(self, store: Store, host: SessionHost, app: Any, client: Any) -> None:
        self.store, self.host, self.app, self.client = store, host, app, client

    async def scrape(self) -> Samples:
        response = await self.client.get("/metrics")  # no token: a scraper has none
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(response.text)
                for s in family.samples}

    async def send(self, session: str, mode: str, text: str) -> None:
        sent = await self.client.post(f"/api/sessions/{session}/messages",
                                      json={"mode": mode, "text": text}, headers=AUTH)
        assert sent.status_code == 202, sent.text


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
async def served(tmp_path: Path, gate: Gate) -> AsyncIterator[Served]:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        async with SessionHost(store, gate.agent, scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://test") as client:
                yield Served(store, host, app, client)


async def test_each_family_moves_as_sends_claims_and_turns_happen(served: Served, gate: Gate) -> None:
    before = await served.scrape()
    assert value(before, "nous_inbox_sessions_held") == 0
    await served.send("s1", "inject", "have this")
    await served.send("s1", "prompt", "start")
    await asyncio.wait_for(gate.entered.wait(), WAIT)
    await served.send("s1", "steer", "and this")  # queued while the model thinks
    running = await served.scrape()
    assert value(running, "nous_inbox_sessions_held") == 1
    assert value(running, "nous_inbox_sessions_running") == 1
    assert value(running, "nous_inbox_sends_total", mode="inject") == 1
    assert value(running, "nous_inbox_sends_total", mode="followup") == 1  # a prompt, as stored
    assert value(running, "nous_inbox_sends_total", mode="steer") == 1
    assert value(running, "nous_inbox_claims_total", queue="next_turn") == 1
    assert value(running, "nous_inbox_store_append_seconds_count") >= 3
    gate.open.set()
    owner = served.host.hosted("s1")
    assert owner is not None and await owner.wait_idle(WAIT)
    done = await served.scrape()
    assert value(done, "nous_inbox_sessions_running") == 0
    # The first step claimed the injection; the steer extended the run by a step that claimed it.
    assert value(done, "nous_inbox_claimed_messages_total", queue="next_step") == 2
    assert value(done, "nous_inbox_send_to_claim_seconds_count", queue="next_step") == 2
    assert value(done, "nous_inbox_send_to_claim_seconds_count", queue="next_turn") == 1
    assert value(done, "nous_inbox_step_seconds_count") == 2
    assert value(done, "nous_inbox_turn_seconds_count", reason="final") == 1
    assert value(done, "nous_inbox_takeovers_total") == 0
    assert value(done, "nous_inbox_leases_lost_total") == 0


async def test_a_session_taken_with_a_turn_left_open_counts_a_takeover(served: Served,
                                                                      gate: Gate) -> None:
    call = ToolCall("c1", "read", {})
    served.store.append("left", [TurnStarted(turn=1), StepStarted(turn=1, step=1),
                                 ToolCalled(turn=1, step=1, call=call)])
    gate.open.set()
    await served.send("left", "inject", "who is there")  # the send takes the session here
    assert value(await served.scrape(), "nous_inbox_takeovers_total") == 1


async def test_an_open_event_stream_counts_as_a_reader_until_it_ends(served: Served) -> None:
    app, host = served.app, served.host
    first, leave = asyncio.Event(), asyncio.Event()

    async def receive() -> dict[str, Any]:
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if b"events of this session follow" in message.get("body", b""):
            first.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
             "scheme": "http", "path": "/api/sessions/s1/events", "raw_path": b"/api/sessions/s1/events",
             "root_path": "", "query_string": b"", "server": ("test", 80), "client": ("test", 1),
             "headers": [(b"authorization", AUTH["Authorization"].encode())]}
    streaming = asyncio.ensure_future(app(scope, receive, send))
    await asyncio.wait_for(first.wait(), WAIT)
    assert value(await served.scrape(), "nous_inbox_sse_readers") == 1
    leave.set()
    host.stopping.set()
    await asyncio.wait_for(streaming, WAIT)
    assert value(await served.scrape(), "nous_inbox_sse_readers") == 0


async def test_health_and_readiness_answer_without_the_token(served: Served) -> None:
    live = await served.client.get("/healthz")
    ready = await served.client.get("/readyz")
    assert (live.status_code, live.json()) == (200, {"live": True})
    assert (ready.status_code, ready.json()) == (200, {"ready": True})
    assert (await served.client.get("/api/sessions")).status_code == 401  # the API still asks


async def test_a_draining_host_is_not_ready(served: Served) -> None:
    await served.host.drain(WAIT)
    ready = await served.client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {"error": "not ready: the host is draining its sessions"}
    assert (await served.client.get("/healthz")).status_code == 200  # alive all the same


async def test_a_host_whose_store_cannot_answer_is_not_ready(served: Served) -> None:
    served.store.close()
    ready = await served.client.get("/readyz")
    assert ready.status_code == 503
    reason = ready.json()["error"]
    assert reason.startswith("not ready: the store did not answer (") and "server's log" in reason


async def test_two_hosts_in_one_process_keep_their_counts_apart(tmp_path: Path) -> None:
    def agent(session: str) -> Runner:
        return Runner(lambda transcript, tools: "ok")

    async with SessionHost(open_store("memory:"), agent, scan_interval=None) as one, \
            SessionHost(open_store("memory:"), agent, scan_interval=None) as two:
        await one.send("s1", "inject", "only here")
        texts = [host.metrics.exposition().decode() for host in (one, two)]
    assert 'nous_inbox_sends_total{mode="inject"} 1.0' in texts[0]
    assert 'nous_inbox_sends_total{mode="inject"} 0.0' in texts[1]


def test_a_live_serve_answers_its_probes_and_counts_a_steer(tmp_path: Path) -> None:
    server = start_serve(f"sqlite:{tmp_path / 'log.sqlite'}", "--agent",
                         "nous_inbox.web.scripted:agent", env={
                             "NOUS_INBOX_SCRIPTED_STEPS": "2",
                             "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0.01"})
    try:
        with httpx.Client(base_url=server.url, timeout=WAIT) as anonymous:
            assert anonymous.get("/healthz").status_code == 200
            assert anonymous.get("/readyz").json() == {"ready": True}
            sent = anonymous.post("/api/sessions/s1/messages", headers=SERVE_AUTH,
                                  json={"mode": "steer", "text": "go"})
            assert sent.status_code == 202

            def ended() -> bool:
                text = anonymous.get("/metrics").text
                samples = {(s.name, frozenset(s.labels.items())): s.value
                           for f in text_string_to_metric_families(text) for s in f.samples}
                return value(samples, "nous_inbox_turn_seconds_count", reason="final") == 1 \
                    and value(samples, "nous_inbox_sends_total", mode="steer") == 1

            wait_until(ended, what="the steer's turn counted at /metrics")
    finally:
        assert server.stop() == 0


class Unrenewed:
    """A store whose lease-renewing connection is down (PostgreSQL's ``listening`` is False
    while it reconnects); everything else is the inner store's."""

    listening = False

    def __init__(self, inner: Store) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_host_holding_sessions_whose_leases_are_not_renewed_is_not_ready() -> None:
    def agent(session: str) -> Runner:
        return Runner(lambda transcript, tools: "ok")

    store = Unrenewed(open_store("memory:"))
    async with SessionHost(store, agent, scan_interval=None) as host:  # type: ignore[arg-type]
        app = create_app(host, token=TOKEN)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                     base_url="http://test") as client:
            assert (await client.get("/readyz")).json() == {"ready": True}  # nothing to renew
            await host.send("s1", "inject", "now one is held")
            ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {
        "error": "not ready: the store's lease renewal is not running (its connection is down)"}
