"""A withdrawn prompt leaves nothing behind, on every owner and whoever withdraws it.

A prompt opens its turn as ``"prompt"`` and may carry run options for that turn. Taken back while
queued (``owner.withdraw(seq)``, or a ``MessageWithdrawn`` another process recorded with
``request_withdraw``: the command line, a web host for a session held elsewhere), it opens no
turn: the next turn something else wakes opens as ``"wake"``, and its options reach no turn.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nous_inbox.events import MessageWithdrawn, QueueClaimed, TurnStarted
from nous_inbox.message import Message, ToolCall
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.port import RunOptions
from nous_inbox.owner.receipts import request_withdraw
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store
from nous_inbox.verbs import Target
from tests.owner_faces import FACES, build

WAIT = 30  # seconds: a bound for a wait that should end at once, never a sleep


class HeldRunner:
    """The built-in runner whose first turn is held in a tool until ``go`` is set (so what is
    sent meanwhile stays queued), taking run options as a pydantic-ai ``AgentRunner`` does:
    ``seen`` is the options each turn that claimed ``next_turn`` got."""

    def __init__(self) -> None:
        self.started, self.go = threading.Event(), threading.Event()
        self.inner = Runner(self.model, [self.work])
        self.seen: list[dict[str, Any]] = []

    def work(self) -> str:
        """Work on something."""
        self.started.set()
        assert self.go.wait(WAIT)
        return "worked"

    @staticmethod
    def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        if not any(m.role == "tool" for m in transcript):
            return Message.assistant(tool_calls=[ToolCall("c1", "work", {})])
        return Message.assistant(f"heard: {transcript[-1].content}")

    @staticmethod
    def check_run_options(options: dict[str, Any]) -> None:
        """Takes any."""

    def run_turn(self, port: Any, **how: Any) -> Iterator[Any]:
        for event in self.inner.run_turn(port, **how):
            self._note(port, event)
            yield event

    async def arun_turn(self, port: Any, **how: Any) -> Any:
        async for event in self.inner.arun_turn(port, **how):
            self._note(port, event)
            yield event

    def _note(self, port: Any, event: Any) -> None:
        if type(event) is QueueClaimed and event.target == Target.NEXT_TURN:
            self.seen.append(port.turn_options)


def reasons(store: Store) -> list[str]:
    return [e.reason for e in store.read("s") if isinstance(e, TurnStarted)]


def withdraw_here(owner: Any, url: str, seq: int) -> None:
    assert owner.withdraw(seq).state == "withdrawn"


def withdraw_elsewhere(owner: Any, url: str, seq: int) -> None:
    with open_store(url) as elsewhere:  # another process's store handle
        assert request_withdraw(elsewhere, "s", seq).state == "withdrawn"
    assert owner.delivered(seq, timeout=WAIT).state == "withdrawn"  # folded in by the owner


WITHDRAWS = {"the owner's withdraw": withdraw_here, "another process's": withdraw_elsewhere}


@pytest.fixture(params=FACES)
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=list(WITHDRAWS))
def withdraw(request: pytest.FixtureRequest) -> Any:
    return WITHDRAWS[request.param]


@pytest.mark.parametrize("wake", ["steer", "followup"])
def test_a_withdrawn_prompt_leaves_the_next_turn_something_else_wakes_a_wake(
    face: str, withdraw: Any, wake: str, tmp_path: Path,
) -> None:
    url, runner = f"sqlite:{tmp_path / 'db.sqlite'}", HeldRunner()
    store = open_store(url)
    with build(face, store, "s", runner, poll_interval=0.01) as owner:
        owner.steer("start")
        assert runner.started.wait(WAIT)  # turn 1 is held: the prompt stays queued
        prompt = owner.prompt("and then summarize")
        withdraw(owner, url, prompt.seq)
        runner.go.set()
        assert owner.wait_idle(WAIT)  # nothing left worth a turn: the run stopped
        getattr(owner, wake)("one more thing")
        assert owner.wait_idle(WAIT)
    assert reasons(store) == ["wake", "wake"]


def test_a_withdrawn_prompts_run_options_reach_no_later_turn(
    face: str, withdraw: Any, tmp_path: Path,
) -> None:
    url, runner = f"sqlite:{tmp_path / 'db.sqlite'}", HeldRunner()
    store = open_store(url)
    with build(face, store, "s", runner, poll_interval=0.01) as owner:
        owner.steer("start")
        assert runner.started.wait(WAIT)
        withdrawn = owner.prompt("with these", deps="withdrawn")
        withdraw(owner, url, withdrawn.seq)
        later = owner.prompt("without any")
        runner.go.set()
        assert later.result(timeout=WAIT).turn == 2
    assert runner.seen == [{}]  # turn 2's claim of the later prompt, with no options
    assert reasons(store) == ["wake", "prompt"]
    assert any(isinstance(e, MessageWithdrawn) for e in store.read("s"))


def test_the_options_of_a_withdrawn_send_are_forgotten_whoever_withdrew_it() -> None:
    options = RunOptions()
    options.keep(2, {"deps": "a"})
    options.keep(3, {"deps": "b"})
    options.fold([MessageWithdrawn(seq=4, sent=2, target=Target.NEXT_TURN)])
    assert len(options) == 1
    assert options.limit(Target.NEXT_TURN, [3]) == 1 and options.of_turn([3]) == {"deps": "b"}
    assert len(options) == 0


@pytest.mark.parametrize("options", [{}, {"deps": "withdrawn"}], ids=["queued", "with options"])
def test_an_async_prompt_withdrawn_while_its_run_is_busy_opens_no_prompt_turn(
    options: dict[str, Any], tmp_path: Path,
) -> None:
    # The AsyncOwner's own face, its sends committed on its store worker: queued for a group
    # commit, or (with run options) committed on their own.
    runner = HeldRunner()
    store = open_store(f"sqlite:{tmp_path / 'db.sqlite'}")

    async def main() -> None:
        async with AsyncOwner(store, "s", runner) as owner:
            await owner.steer("start")
            assert await asyncio.to_thread(runner.started.wait, WAIT)
            prompt = owner.prompt("and then summarize", **options)
            await owner.withdraw((await prompt.stored()).seq)
            runner.go.set()
            assert await owner.wait_idle(WAIT)
            await owner.steer("one more thing")
            assert await owner.wait_idle(WAIT)

    asyncio.run(main())
    assert reasons(store) == ["wake", "wake"]
    assert runner.seen == []


def test_a_result_already_waiting_hears_its_prompt_withdrawn(
    face: str, withdraw: Any, tmp_path: Path,
) -> None:
    # The run is held in a tool, so no turn can claim the prompt: only the withdraw can answer
    # the waiter, and it must, at once (not when some later turn ends).
    url, runner = f"sqlite:{tmp_path / 'db.sqlite'}", HeldRunner()
    with build(face, open_store(url), "s", runner, poll_interval=0.01) as owner:
        owner.steer("start")
        assert runner.started.wait(WAIT)
        prompt = owner.prompt("and then summarize")
        waiting, heard = threading.Event(), []

        def wait_for_it() -> None:
            waiting.set()
            try:
                prompt.result(timeout=WAIT)
            except Exception as exc:
                heard.append(exc)

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        assert waiting.wait(WAIT)
        withdraw(owner, url, prompt.seq)
        waiter.join(WAIT)
        runner.go.set()
        assert not waiter.is_alive()
        assert [type(e).__name__ for e in heard] == ["TurnError"]
        assert "withdrawn" in str(heard[0])
