"""The web face's event stream with text deltas: a client that asks (``?deltas=1``) reads the
model's text as it streams, before the reply is logged, as ``event: delta`` blocks with no id (so
``Last-Event-ID`` counts events only); one that does not ask reads the events alone; one that
stops reading never slows the run. A real pydantic-ai agent with a streaming ``FunctionModel``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from nous_inbox.store import open_store  # noqa: E402
from nous_inbox.web import SessionHost, create_app  # noqa: E402
from tests.helpers import WAIT, async_wait_until  # noqa: E402
from tests.test_deltas import streaming_runner, words  # noqa: E402
from tests.test_web_api import AUTH, TOKEN, get_scope  # noqa: E402

pytestmark = pytest.mark.anyio




def sse_blocks(body: str) -> list[dict[str, str]]:
    """The fields of each block of an SSE body (comments skipped)."""
    blocks = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines()
                      if line and not line.startswith(":"))
        if fields:
            blocks.append(fields)
    return blocks


async def drive_sse(app: Any, url: str, until: Callable[[str], bool],
                    blocked: asyncio.Event | None = None) -> tuple[asyncio.Future[Any], bytearray]:
    """Serve ``url`` as a server would; ``until(body)`` ends the request (the client leaves).
    With ``blocked``, the client stops reading after the first chunk until it is set."""
    body = bytearray()
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] != "http.response.body":
            return
        body.extend(message.get("body", b""))
        if blocked is not None:
            await blocked.wait()
        if until(body.decode()):
            gone.set()  # the client leaves

    served = asyncio.ensure_future(app(get_scope(url, AUTH), receive, send))
    return served, body


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_an_sse_client_that_asks_gets_the_deltas_before_the_reply_with_no_id(
        tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        async with SessionHost(store, lambda s: streaming_runner(words("Hel", "lo ", "there")),
                               scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            transport = httpx.ASGITransport(app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await client.post("/api/sessions/s1/messages", headers=AUTH,
                                  json={"mode": "inject", "text": "fyi"})  # held here now
                served, body = await drive_sse(
                    app, "/api/sessions/s1/events?deltas=1", lambda b: '"turn_ended"' in b)
                await async_wait_until(lambda: b"id: 1" in body, what="the stream reads the owner")
                await client.post("/api/sessions/s1/messages", headers=AUTH,
                                  json={"mode": "prompt", "text": "hi"})
                await asyncio.wait_for(served, WAIT)
    blocks = sse_blocks(body.decode())
    deltas = [json.loads(b["data"]) for b in blocks if b.get("event") == "delta"]
    assert all("id" not in b for b in blocks if b.get("event") == "delta")
    assert "".join(d["text"] for d in deltas) == "Hello there"
    assert {d["type"] for d in deltas} == {"text_delta"}
    kinds = [b.get("event") or json.loads(b["data"])["type"] for b in blocks]
    assert max(i for i, k in enumerate(kinds) if k == "delta") < kinds.index("model_replied")
    ids = [int(b["id"]) for b in blocks if "id" in b]
    assert ids == list(range(1, len(ids) + 1))  # Last-Event-ID counts events only


async def test_an_sse_client_that_does_not_ask_gets_no_delta(tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        async with SessionHost(store, lambda s: streaming_runner(words("Hel", "lo")),
                               scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://t") as client:
                await client.post("/api/sessions/s1/messages", headers=AUTH,
                                  json={"mode": "inject", "text": "fyi"})
                served, body = await drive_sse(
                    app, "/api/sessions/s1/events", lambda b: '"turn_ended"' in b)
                await async_wait_until(lambda: b"id: 1" in body, what="the stream reads the owner")
                await client.post("/api/sessions/s1/messages", headers=AUTH,
                                  json={"mode": "prompt", "text": "hi"})
                await asyncio.wait_for(served, WAIT)
                refused = await client.get("/api/sessions/s1/events?deltas=2", headers=AUTH)
    assert "delta" not in body.decode()
    assert refused.status_code == 400 and "deltas must be 0 or 1" in refused.json()["error"]


async def test_an_sse_client_that_stops_reading_does_not_slow_the_run(tmp_path: Path) -> None:
    pieces = [f"w{i} " for i in range(2000)]
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        async with SessionHost(store, lambda s: streaming_runner(words(*pieces)),
                               scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://t") as client:
                await client.post("/api/sessions/s1/messages", headers=AUTH,
                                  json={"mode": "inject", "text": "fyi"})
                blocked = asyncio.Event()
                served, body = await drive_sse(app, "/api/sessions/s1/events?deltas=1",
                                               lambda b: '"turn_ended"' in b, blocked)
                await async_wait_until(lambda: body, what="the first chunk")  # then it stops reading
                owner = host.hosted("s1")
                assert owner is not None
                await asyncio.wait_for(owner.prompt("hi"), WAIT)  # the run ends meanwhile
                blocked.set()
                await asyncio.wait_for(served, WAIT)
    deltas = [json.loads(b["data"]) for b in sse_blocks(body.decode()) if b.get("event") == "delta"]
    assert "".join(d["text"] for d in deltas) == "".join(pieces)
