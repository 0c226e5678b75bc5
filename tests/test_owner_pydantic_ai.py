"""Owners running a pydantic-ai agent: the owner's rules hold whatever the runner, here the
``AgentRunner``, whose turn runs on a thread (or task) of its own and claims inside a commit
of its own. Real pydantic-ai with a ``FunctionModel``: no network."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nous_inbox.adapters.pydantic_ai import AgentRunner
from nous_inbox.events import TurnEnded
from nous_inbox.owner import AsyncOwner, Owner, TurnCancelled, TurnFailed
from nous_inbox.store import Store, open_store

WAIT = 10.0


def ends(store: Store) -> list[tuple[int, str]]:
    return [(e.turn, e.reason) for e in store.read("s") if isinstance(e, TurnEnded)]


class Held:
    """A ``FunctionModel`` function: its first request waits until released (or fails, with
    ``fail``); later ones answer at once, naming the last thing said."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.asked = threading.Event()
        self.release = threading.Event()

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not self.asked.is_set():
            self.asked.set()
            if self.fail:
                raise RuntimeError("the model is down")
            assert self.release.wait(WAIT)
        said = messages[-1].parts[-1]
        return ModelResponse(parts=[TextPart(f"heard: {getattr(said, 'content', '')}")])


@pytest.mark.parametrize("fail", [False, True], ids=["cancelled", "failed"])
def test_the_prompt_sent_after_a_turn_was_cancelled_or_failed_is_answered(fail: bool) -> None:
    # The turn runs on a thread of its own and records its end before the owner's worker hears
    # of it: the second prompt lands while the worker is still stopping, and must not wait.
    store, model = open_store("memory:"), Held(fail)
    with Owner(store, "s", AgentRunner(Agent(FunctionModel(model)))) as owner:
        first = owner.prompt("one")
        assert model.asked.wait(WAIT)
        if not fail:
            assert owner.cancel()
            model.release.set()
        with pytest.raises(TurnCancelled if not fail else TurnFailed):
            first.result(timeout=WAIT)
        second = owner.prompt("two")
        assert second.result(timeout=WAIT).text == "heard: two"
        assert ends(store) == [(1, "error" if fail else "cancelled"), (2, "final")]


def _whose_agent() -> Agent[str, str]:
    """An agent that asks its tool whose request this is (the run's ``deps``), then says so."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"for {last.content}")])
        return ModelResponse(parts=[ToolCallPart("whose", {})])

    agent: Agent[str, str] = Agent(FunctionModel(model), deps_type=str)

    @agent.tool
    def whose(ctx: RunContext[str]) -> str:
        return ctx.deps

    return agent


def _prompt_as_the_first_turn_opens(owner: Any, handles: list[Any]) -> None:
    """Have ``owner`` get a second prompt, with deps of its own, just before its first turn
    claims: the two are queued together."""

    def at(boundary: Any) -> None:
        if boundary.kind == "turn_opening" and boundary.turn == 1:
            handles.append(owner.prompt("and mine", deps="grace"))

    owner.on_boundary(at)


def test_tools_see_the_deps_of_the_prompt_their_turn_answers() -> None:
    handles: list[Any] = []
    with Owner(open_store("memory:"), "s", AgentRunner(_whose_agent())) as owner:
        _prompt_as_the_first_turn_opens(owner, handles)
        first = owner.prompt("mine", deps="ada")
        assert first.result(timeout=WAIT).text == "for ada"
        assert [h.result(timeout=WAIT).text for h in handles] == ["for grace"]


def test_an_async_owners_tools_see_the_deps_of_the_prompt_their_turn_answers() -> None:
    async def main() -> list[str]:
        handles: list[Any] = []
        async with AsyncOwner(open_store("memory:"), "s", AgentRunner(_whose_agent())) as owner:
            _prompt_as_the_first_turn_opens(owner, handles)
            first = await owner.prompt("mine", deps="ada")
            return [first.text, *[(await h).text for h in handles]]

    assert asyncio.run(main()) == ["for ada", "for grace"]
