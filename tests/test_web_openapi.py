"""The HTTP API's OpenAPI document: served at /openapi.json, derived from the one route table,
naming every route the app serves; every refusal in one shape; a path parameter is one segment
of the path as sent, so each request reaches one route."""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402

from nous_inbox.message import Message, blank_text  # noqa: E402
from nous_inbox.runner import Runner  # noqa: E402
from nous_inbox.store import open_store  # noqa: E402
from nous_inbox.web import SessionHost, create_app  # noqa: E402
from nous_inbox.web.openapi import document  # noqa: E402
from nous_inbox.web.routes import ROUTES  # noqa: E402
from nous_inbox.web.schema import BLANK_RANGES, NOT_BLANK  # noqa: E402

TOKEN = "test-token-1234"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def quick_agent(session: str) -> Runner:
    return Runner(lambda transcript, tools: Message.assistant("heard"))


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Any]:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        async with SessionHost(store, quick_agent, scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://test") as client:
                client.app = app
                yield client


async def test_the_document_is_served_without_the_token_and_is_the_tables(client: Any) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == document(ROUTES)
    assert response.json()["openapi"] == "3.1.0"


async def test_every_route_the_app_serves_is_in_the_document(client: Any) -> None:
    paths = document(ROUTES)["paths"]
    for route in client.app.routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        assert path in paths, path
        documented = {method.upper() for method in paths[path]}
        assert route.methods - {"HEAD"} == documented, path


def test_each_operation_is_named_once_and_says_who_may_call_it() -> None:
    operations = [op for ops in document(ROUTES)["paths"].values() for op in ops.values()]
    ids = [op["operationId"] for op in operations]
    assert len(ids) == len(set(ids))
    for op in operations:
        needs_token = op["security"] == [{"bearer": []}]
        assert needs_token == ("401" in op["responses"]), op["operationId"]
    api = [op for path, ops in document(ROUTES)["paths"].items() if path.startswith("/api")
           for op in ops.values()]
    assert all(op["security"] == [{"bearer": []}] for op in api)


def test_every_refusal_is_documented_as_the_one_error_shape() -> None:
    doc = document(ROUTES)
    assert doc["components"]["schemas"]["ApiError"]["required"] == ["error"]
    for ops in doc["paths"].values():
        for op in ops.values():
            for status, answer in op["responses"].items():
                if status.startswith("4"):
                    assert answer["content"] == {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ApiError"}}}, op["operationId"]


def test_the_schemas_are_the_types_that_decode_and_encode() -> None:
    schemas = document(ROUTES)["components"]["schemas"]
    send = schemas["SendRequest"]
    assert send["properties"]["mode"] == {"enum": ["followup", "inject", "prompt", "steer"]}
    assert send["required"] == ["mode", "text"]
    assert schemas["SessionState"]["properties"]["transcript"]["items"] == {
        "$ref": "#/components/schemas/Message"}
    assert {"MessageSent", "QueueClaimed", "TextDelta", "StreamItem"} <= set(schemas)
    for name, schema in schemas.items():
        assert ">>>" not in schema.get("description", ""), name  # no Python examples


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/nowhere", 404),
    ("POST", "/api/sessions", 405),
    ("GET", "/api/sessions/s1/messages", 405),
    ("GET", "/api/sessions/s1/messages/1/withdraw", 405),
    ("GET", "/api/sessions/s1/cancel", 405),
])
async def test_a_path_or_method_the_api_does_not_serve_is_refused_in_the_one_shape(
    client: Any, method: str, path: str, status: int,
) -> None:
    response = await client.request(method, path, headers=AUTH)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert set(response.json()) == {"error"}


async def test_a_session_id_holding_a_slash_is_one_segment_sent_as_percent_2f(client: Any) -> None:
    sent = await client.post("/api/sessions/team%2Fbuild/messages", headers=AUTH,
                             json={"mode": "inject", "text": "fyi"})
    assert sent.status_code == 202
    shown = await client.get("/api/sessions/team%2Fbuild", headers=AUTH)
    assert shown.json()["id"] == "team/build"
    receipt = await client.get(f"/api/sessions/team%2Fbuild/messages/{sent.json()['seq']}",
                               headers=AUTH)
    assert receipt.json()["state"] == "queued"
    listed = await client.get("/api/sessions", headers=AUTH)
    assert [s["id"] for s in listed.json()["sessions"]] == ["team/build"]


@pytest.mark.parametrize("seq", ["0", "-1", "1.5", "x", "1" * 19])
async def test_a_seq_that_is_not_a_whole_number_from_1_is_refused_naming_it(
    client: Any, seq: str,
) -> None:
    for method, suffix in (("GET", ""), ("POST", "/withdraw")):
        response = await client.request(method, f"/api/sessions/s1/messages/{seq}{suffix}",
                                        headers=AUTH)
        assert response.status_code == 400, response.text
        assert response.json()["error"].startswith("seq must be a whole number >= 1")


async def test_mounted_the_document_names_its_mount_point_and_the_routes_answer_there(
    tmp_path: Path,
) -> None:
    with open_store("memory:") as store:
        async with SessionHost(store, quick_agent, scan_interval=None) as host:
            outer = Starlette(routes=[Mount("/agents", create_app(host, token=TOKEN))])
            async with httpx.AsyncClient(transport=httpx.ASGITransport(outer),
                                         base_url="http://test") as client:
                doc = (await client.get("/agents/openapi.json")).json()
                assert doc["servers"] == [{"url": "/agents"}]
                sent = await client.post("/agents/api/sessions/a%2Fb/messages", headers=AUTH,
                                         json={"mode": "inject", "text": "hi"})
                assert sent.status_code == 202, sent.text
                wrong = await client.get("/agents/api/sessions/a%2Fb/messages", headers=AUTH)
                assert wrong.status_code == 405


def test_the_documented_blank_characters_are_the_inbox_s_blank_rule() -> None:
    blank = {first for first, _ in BLANK_RANGES}
    ranges = {c for first, last in BLANK_RANGES for c in range(first, last + 1)}
    found = {c for c in range(sys.maxunicode + 1) if blank_text(chr(c))}
    assert ranges == found, f"Unicode {unicodedata.unidata_version}: update BLANK_RANGES"
    assert blank <= found
    for text, worth in ((" \u200b\t", False), ("", False), (" hi ", True), ("\u00e9", True)):
        assert (re.search(NOT_BLANK, text) is not None) == worth == (not blank_text(text))
