"""Traces: a turn, its steps, its model requests and tool calls as OpenTelemetry spans, read with
the SDK's in-memory exporter; a steer sent over HTTP linked from the step that claims it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from nous_inbox.commands import ToolSpec
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner import LocalSession, Runner, Tool
from nous_inbox.runner.tracing import TRACEPARENT, carried

WAIT = 20.0  # seconds: a bound for what should happen at once, never a sleep to synchronise
_EXPORTER = InMemorySpanExporter()


def _provider() -> None:
    """One SDK provider for the process (the global can be set once): ours, or the one a test
    before us set, with our exporter added."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))


_provider()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def tree(finished: Sequence[ReadableSpan], name: str = "nous_inbox.turn") -> list[Any]:
    """Each span named ``name`` as ``(name, [children...])``, its children in start order."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in finished:
        children.setdefault(span.parent.span_id if span.parent else None, []).append(span)

    def shape(span: ReadableSpan) -> Any:
        below = sorted(children.get(span.context.span_id, []), key=lambda s: s.start_time or 0)
        return (span.name, [shape(child) for child in below]) if below else span.name

    return [shape(s) for s in finished if s.name == name]


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
    if transcript[-1].role == "tool":
        return Message.assistant("the sum is " + transcript[-1].content)
    return Message.assistant(tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 3})])


STEP_WITH_A_TOOL = ("nous_inbox.step", ["nous_inbox.model_request", "nous_inbox.tool_call"])
LAST_STEP = ("nous_inbox.step", ["nous_inbox.model_request"])


def test_a_runner_turn_is_a_turn_span_with_a_step_span_each_and_its_calls_inside(
        spans: InMemorySpanExporter) -> None:
    local = LocalSession()
    local.followup("what is 2 + 3?")
    list(Runner(model, [add]).run_turn(local))
    finished = spans.get_finished_spans()
    assert tree(finished) == [("nous_inbox.turn", [STEP_WITH_A_TOOL, LAST_STEP])]
    turn = next(s for s in finished if s.name == "nous_inbox.turn")
    assert dict(turn.attributes or {}) == {
        "nous_inbox.session.id": "local", "nous_inbox.turn": 1, "nous_inbox.turn.reason": "wake",
        "nous_inbox.turn.steps": 2, "nous_inbox.turn.end_reason": "final"}
    steps = [s for s in finished if s.name == "nous_inbox.step"]
    assert [(s.attributes or {}).get("nous_inbox.step") for s in steps] == [1, 2]
    claim = steps[0].events[0]
    assert claim.name == "nous_inbox.claim"
    assert dict(claim.attributes or {}) == {
        "nous_inbox.queue": "next_turn", "nous_inbox.claim.count": 1, "nous_inbox.claim.seq": 3,
        "nous_inbox.claim.rest": 0}
    tool = next(s for s in finished if s.name == "nous_inbox.tool_call")
    assert (tool.attributes or {})["gen_ai.tool.name"] == "add"


def test_the_asyncio_driver_makes_the_same_spans_and_its_calls_run_inside_them(
        spans: InMemorySpanExporter) -> None:
    seen: list[str] = []

    async def amodel(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        seen.append(trace.get_current_span().name)  # type: ignore[attr-defined]
        return model(transcript, tools)

    def sync_add(a: int, b: int) -> int:  # run in a worker thread: the span goes with it
        """Add two numbers."""
        seen.append(trace.get_current_span().name)  # type: ignore[attr-defined]
        return a + b

    async def turn() -> None:
        local = LocalSession()
        local.followup("what is 2 + 3?")
        async for _ in Runner(amodel, [Tool(sync_add, name="add")]).arun_turn(local):
            pass

    asyncio.run(turn())
    assert tree(spans.get_finished_spans()) == [("nous_inbox.turn", [STEP_WITH_A_TOOL, LAST_STEP])]
    assert seen == ["nous_inbox.model_request", "nous_inbox.tool_call", "nous_inbox.model_request"]


def test_a_steer_carrying_its_senders_span_is_linked_from_the_step_that_claims_it(
        spans: InMemorySpanExporter) -> None:
    local = LocalSession()
    sender = trace.get_tracer("test").start_span("the sender")

    def add_and_hear(a: int, b: int) -> int:
        """Add two numbers (and, the first time, hear a steer)."""
        if sender.is_recording():
            with trace.use_span(sender, end_on_exit=True):
                local.steer(carried("use hex"))
        return a + b

    local.followup("what is 2 + 3?")
    list(Runner(model, [Tool(add_and_hear, name="add")]).run_turn(local))
    steps = [s for s in spans.get_finished_spans() if s.name == "nous_inbox.step"]
    assert [len(s.links) for s in steps] == [0, 1, 0]
    assert steps[1].links[0].context.span_id == sender.get_span_context().span_id
    assert [e.attributes["nous_inbox.queue"] for e in steps[1].events  # type: ignore[index]
            ] == ["next_step"]


def test_a_turn_abandoned_by_its_reader_still_ends_its_spans(spans: InMemorySpanExporter) -> None:
    local = LocalSession()
    local.followup("what is 2 + 3?")
    events = Runner(model, [add]).run_turn(local)
    next(events)
    events.close()
    turn = next(s for s in spans.get_finished_spans() if s.name == "nous_inbox.turn")
    assert (turn.attributes or {})["nous_inbox.turn.end_reason"] == "cancelled"


def test_carried_keeps_the_first_senders_context_and_leaves_a_message_alone_outside_a_span(
        spans: InMemorySpanExporter) -> None:
    assert carried("hi") == "hi"
    with trace.get_tracer("test").start_as_current_span("first") as first:
        once = carried(Message.user("hi", metadata={"from": "leo"}))
    assert isinstance(once, Message) and once.metadata["from"] == "leo"
    assert once.metadata[TRACEPARENT].split("-")[2] == f"{first.get_span_context().span_id:016x}"
    with trace.get_tracer("test").start_as_current_span("second"):
        assert carried(once) is once


def test_importing_the_runner_or_the_owners_does_not_import_opentelemetry() -> None:
    code = ("import sys, nous_inbox, nous_inbox.runner, nous_inbox.owner; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent.parent)
    assert json.loads(out.stdout.replace("'", '"')) == []


# -- the web face ---------------------------------------------------------------------------------


def test_a_steer_posted_with_a_traceparent_is_linked_from_the_step_that_claims_it(
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    from nous_inbox.store import open_store
    from nous_inbox.web import SessionHost, create_app

    token = "test-token-1234"
    auth = {"Authorization": f"Bearer {token}"}
    working, release = threading.Event(), threading.Event()

    def work() -> str:
        """Wait for the test to release it."""
        working.set()
        assert release.wait(WAIT)
        return "done"

    def agent_model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        if transcript[-1].content == "work":
            return Message.assistant(tool_calls=[ToolCall("w1", "work", {})])
        return Message.assistant("heard " + transcript[-1].content)

    incoming_trace, incoming_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

    async def scenario() -> None:
        with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
            async with SessionHost(store, lambda s: Runner(agent_model, [work]),
                                   scan_interval=None) as host:
                app = create_app(host, token=token)
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                             base_url="http://test") as client:
                    await client.post("/api/sessions/s1/messages", headers=auth,
                                      json={"mode": "prompt", "text": "work"})
                    assert await asyncio.to_thread(working.wait, WAIT)
                    sent = await client.post(
                        "/api/sessions/s1/messages", json={"mode": "steer", "text": "use hex"},
                        headers={**auth, "traceparent": f"00-{incoming_trace}-{incoming_span}-01"})
                    assert sent.status_code == 202
                    release.set()
                    owner = host.hosted("s1")
                    assert owner is not None and await owner.wait_idle(WAIT)

    asyncio.run(scenario())
    finished = spans.get_finished_spans()
    post = next(s for s in finished if s.kind == trace.SpanKind.SERVER
                and s.parent is not None and s.parent.span_id == int(incoming_span, 16))
    assert post.context.trace_id == int(incoming_trace, 16)
    assert post.name == "POST /api/sessions/{session}/messages"
    steps = [s for s in finished if s.name == "nous_inbox.step"]
    linked = [s for s in steps if any(link.context.span_id == post.context.span_id
                                      for link in s.links)]
    assert [(s.attributes or {})["nous_inbox.step"] for s in linked] == [2]
    assert (linked[0].attributes or {})["nous_inbox.session.id"] == "s1"


# -- the pydantic-ai adapter ----------------------------------------------------------------------


def test_pydantic_ais_own_model_request_and_tool_spans_nest_under_the_step(
        spans: InMemorySpanExporter) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    def reply(messages: list[Any], info: Any) -> ModelResponse:
        if isinstance(messages[-1].parts[-1], ToolReturnPart):
            return ModelResponse(parts=[TextPart("the sum is 3")])
        return ModelResponse(parts=[ToolCallPart("add", {"a": 1, "b": 2})])

    agent = Agent(FunctionModel(reply))
    agent.instrument = True
    agent.tool_plain(add)
    local = LocalSession()
    local.followup("what is 1 + 2?")

    async def turn() -> None:
        async for _ in AgentRunner(agent).arun_turn(local):
            pass

    asyncio.run(turn())
    assert tree(spans.get_finished_spans()) == [("nous_inbox.turn", [
        ("nous_inbox.step", ["chat function:reply:", "execute_tool add"]),
        ("nous_inbox.step", ["chat function:reply:"]),
    ])]


def test_the_docs_example_prints_what_the_docs_say() -> None:
    page = (Path(__file__).parent.parent / "docs" / "tracing.md").read_text("utf-8")
    example = page.split("```python\n", 1)[1].split("```", 1)[0]
    printed = page.split("It prints the spans as they end:\n\n```text\n", 1)[1].split("```", 1)[0]
    out = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent.parent)
    assert [line.rstrip() for line in out.stdout.splitlines()] == printed.splitlines()
