"""The boundary hook: an owner tells its subscribers, in order and before the claim, that a turn
is opening, a step boundary is reached, the run would stop, a turn ended; what a subscriber sends
there is in the claim that follows. The threaded owner and the asyncio owner (inline and with its
store worker) keep one rule."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from nous_inbox import Message, QueueClaimed, Session, ToolCall, replay
from nous_inbox.boundary import Boundary
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner import Runner, tool
from nous_inbox.store import open_store

WAIT = 30.0  # seconds: a bound for a wait that should end at once, never a sync sleep
#: The threaded owner, inline and through its group commit (a store that blocks); the asyncio
#: owner, inline and with its store worker.
FACES = ("Owner", "Owner+group commit", "AsyncOwner", "AsyncOwner+worker")


class _Blocking:
    """A ``memory:`` store that says its calls block, as a durable store does."""

    blocking = True

    def __init__(self) -> None:
        self.inner = open_store("memory:")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@tool
def work() -> str:
    """A tool that does nothing worth saying."""
    return "worked"


def _model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    """One tool call, then an answer naming what it last read."""
    if not any(m.role == "tool" for m in transcript):
        return Message.assistant(tool_calls=[ToolCall("c1", "work", {})])
    return Message.assistant(f"done: {transcript[-1].content}")


Subscriber = Callable[[Any, Boundary], None]


def _run(face: str, subscriber: Subscriber, first: str = "go") -> tuple[list[Any], Any]:
    """Open an owner of ``face``, subscribe ``subscriber(owner, boundary)``, steer ``first``,
    wait for the run to end; the events stored, and the session the owner held."""
    store: Any = _Blocking() if face == "Owner+group commit" else open_store("memory:")
    if face.startswith("Owner"):
        with Owner(store, "s", Runner(_model, [work]), watch=False) as owner:
            owner.on_boundary(lambda boundary: subscriber(owner, boundary))
            owner.steer(first)
            assert owner.wait_idle(WAIT)
            return owner.events(), owner.session

    async def main() -> tuple[list[Any], Any]:
        async with AsyncOwner(store, "s", Runner(_model, [work]), watch=False,
                              offload=face.endswith("worker")) as owner:
            owner.on_boundary(lambda boundary: subscriber(owner, boundary))
            await owner.steer(first)
            assert await owner.wait_idle(WAIT)
            return list(store.read("s")), owner.session

    return asyncio.run(main())


def _claims(events: Sequence[Any]) -> list[tuple[str, list[str]]]:
    """Each claim in the log: its queue and the messages it took (its transcript entries)."""
    claims, session = [], Session()
    for event in events:
        before = len(session.transcript)
        session = session.apply(event, "s")
        if isinstance(event, QueueClaimed):
            claims.append((event.target, [m.content for m in session.transcript[before:]]))
    return claims


@pytest.mark.parametrize("face", FACES)
def test_subscribers_hear_each_boundary_of_a_turn_in_order(face: str) -> None:
    heard: list[tuple[str, int]] = []
    events, session = _run(face, lambda owner, b: heard.append((b.kind, b.turn)))
    # The turn opens; a step before each model request; a stop where the run would stop.
    assert heard == [("turn_opening", 1), ("step", 1), ("step", 1), ("stop", 1), ("turn_ended", 1)]
    assert session == replay(events)


@pytest.mark.parametrize("face", FACES)
def test_a_spent_budget_is_told_as_a_stop(face: str) -> None:
    heard: list[str] = []
    store: Any = _Blocking() if face == "Owner+group commit" else open_store("memory:")

    def tools_forever(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        return Message.assistant(tool_calls=[ToolCall(f"c{len(transcript)}", "work", {})])

    runner = Runner(tools_forever, [work], max_steps=1)
    if face.startswith("Owner"):
        with Owner(store, "s", runner, watch=False) as owner:
            owner.on_boundary(lambda b: heard.append(b.kind))
            owner.steer("go")
            assert owner.wait_idle(WAIT)
    else:
        async def main() -> None:
            async with AsyncOwner(store, "s", runner, watch=False,
                                  offload=face.endswith("worker")) as owner:
                owner.on_boundary(lambda b: heard.append(b.kind))
                await owner.steer("go")
                assert await owner.wait_idle(WAIT)

        asyncio.run(main())
    # The one request spent the budget: where the run stops only a waking message is claimed.
    assert heard == ["turn_opening", "step", "stop", "turn_ended"]


def test_a_single_shot_run_claims_nothing_and_tells_only_its_end() -> None:
    heard: list[str] = []
    runner = Runner(lambda transcript, tools: Message.assistant('{"ok": true}'), structured=True)
    with Owner(open_store("memory:"), "s", runner, watch=False) as owner:
        owner.on_boundary(lambda b: heard.append(b.kind))
        owner.steer("judge")
        assert owner.wait_idle(WAIT)
        assert owner.session.inbox.count("next_step") == 1  # nothing claimed (ruling 8)
    assert heard == ["turn_ended"]


@pytest.mark.parametrize("face", FACES)
def test_a_followup_sent_as_a_turn_opens_is_in_that_turns_first_claim(face: str) -> None:
    def at(owner: Any, boundary: Boundary) -> None:
        if boundary.kind == "turn_opening":
            owner.followup("from the mailbox")  # an AsyncOwner's verb: done when it returns

    events, session = _run(face, at, first="go")
    assert _claims(events)[0] == ("next_turn", ["from the mailbox"])
    assert session == replay(events)


@pytest.mark.parametrize("face", FACES)
def test_an_injection_sent_at_a_step_boundary_is_in_that_steps_claim(face: str) -> None:
    steps: list[int] = []

    def at(owner: Any, boundary: Boundary) -> None:
        if boundary.kind == "step":
            steps.append(boundary.turn)
            if len(steps) == 2:  # after the tool's result, before the second model request
                owner.inject("read before the next request")

    events, session = _run(face, at)
    claims = _claims(events)
    assert claims[1] == ("next_step", ["read before the next request"])
    assert session.transcript[-1].content == "done: read before the next request"
    assert session == replay(events)


@pytest.mark.parametrize("face", FACES)
def test_a_steer_sent_where_the_run_would_stop_extends_it_by_one_step(face: str) -> None:
    sent: list[str] = []

    def at(owner: Any, boundary: Boundary) -> None:
        if boundary.kind == "stop" and not sent:
            sent.append("x")
            owner.steer("one more thing")

    events, session = _run(face, at)
    assert ("next_step", ["one more thing"]) in _claims(events)
    assert session.transcript[-1].content == "done: one more thing"
    assert session == replay(events)


@pytest.mark.parametrize("face", FACES)
def test_a_raising_subscriber_is_logged_and_the_run_and_the_others_go_on(
    face: str, caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []

    def at(owner: Any, boundary: Boundary) -> None:
        heard.append(boundary.kind)
        raise RuntimeError("a floor's own bug")

    with caplog.at_level(logging.ERROR, logger="nous_inbox"):
        events, session = _run(face, at)
    assert heard[0] == "turn_opening" and heard[-1] == "turn_ended"
    assert session.transcript[-1].content == "done: worked"
    assert "a boundary subscriber of session 's' failed" in caplog.text
    assert session == replay(events)


def test_an_unsubscribed_callback_hears_nothing_more() -> None:
    heard: list[str] = []
    with Owner(open_store("memory:"), "s", Runner(_model, [work]), watch=False) as owner:
        stop = owner.on_boundary(lambda b: heard.append(b.kind))
        kept: list[str] = []
        owner.on_boundary(lambda b: kept.append(b.kind))
        owner.steer("first")
        assert owner.wait_idle(WAIT)
        stop()
        stop()  # a second call changes nothing
        owner.steer("second")
        assert owner.wait_idle(WAIT)
    assert heard.count("turn_ended") == 1 and kept.count("turn_ended") == 2


def test_a_subscriber_that_is_not_callable_is_refused() -> None:
    with Owner(open_store("memory:"), "s", Runner(_model, [work]), watch=False) as owner, \
            pytest.raises(TypeError, match="on_boundary needs a callable, got str"):
        owner.on_boundary("print")  # type: ignore[arg-type]


@pytest.mark.parametrize("face", FACES)
def test_a_followup_sent_as_a_turn_ends_opens_the_next_turn(face: str) -> None:
    sent: list[int] = []

    def at(owner: Any, boundary: Boundary) -> None:
        if boundary.kind == "turn_ended" and not sent:
            sent.append(boundary.turn)
            owner.followup("and then this")

    events, session = _run(face, at)
    assert session.turn == 2
    assert ("next_turn", ["and then this"]) in _claims(events)
    assert session == replay(events)


@pytest.mark.parametrize("face", ["Owner", "AsyncOwner"])
def test_an_agent_run_by_pydantic_ai_tells_its_boundaries_too(face: str) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    agent = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("ok")])))
    heard: list[tuple[str, int]] = []
    store = open_store("memory:")
    if face == "Owner":
        with Owner(store, "s", AgentRunner(agent), watch=False) as owner:
            owner.on_boundary(lambda b: heard.append((b.kind, b.turn)))
            owner.steer("go")
            assert owner.wait_idle(WAIT)
    else:
        async def main() -> None:
            async with AsyncOwner(store, "s", AgentRunner(agent), watch=False) as owner:
                owner.on_boundary(lambda b: heard.append((b.kind, b.turn)))
                await owner.steer("go")
                assert await owner.wait_idle(WAIT)

        asyncio.run(main())
    assert heard[0] == ("turn_opening", 1) and ("step", 1) in heard
    assert heard[-1] == ("turn_ended", 1)
