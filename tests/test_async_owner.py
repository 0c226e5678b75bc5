"""AsyncOwner: the owner's asyncio face. What only the face adds is tested here; the wake rules
it shares with the threaded owner run against both, in ``test_owner.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from nous_inbox import Message, MessageSent, ToolCall, TurnEnded, TurnStarted, replay
from nous_inbox.async_owner import AsyncOwner
from nous_inbox.events import Event
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store

ROOT = Path(__file__).resolve().parent.parent
WAIT = 30  # seconds; a generous bound for a wait that should end at once, never a sync sleep


async def echo(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    return Message.assistant(f"heard: {transcript[-1].content}")


def test_a_steer_is_stored_then_answered_on_the_event_loop() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            sent = await owner.steer("hello")
            assert isinstance(sent, MessageSent) and sent.seq == 1
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["hello", "heard: hello"]
            assert owner.session == replay(list(owner._store.read(owner.stream)))

    asyncio.run(main())


def test_an_injection_wakes_nothing_and_a_followup_opens_a_turn() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            await owner.inject("fyi")
            assert await owner.wait_idle(WAIT)
            assert owner.session.turn == 0
            await owner.followup("go")
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["go", "fyi", "heard: fyi"]

    asyncio.run(main())


def test_events_from_a_position_are_the_stored_ones_then_the_live_ones() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            await owner.steer("one")
            assert await owner.wait_idle(WAIT)
            stored = owner.session.version
            reader = owner.events(after=2)
            seen: list[Event] = []
            async for event in reader:  # the stored tail first
                seen.append(event)
                if event.seq == stored:
                    break
            assert [e.seq for e in seen] == list(range(3, stored + 1))
            resumed = owner.events(after=stored)  # a client reconnecting with its last seq
            first = asyncio.ensure_future(anext(resumed))
            await owner.steer("two")
            event = await asyncio.wait_for(first, WAIT)
            assert event.seq == stored + 1 and isinstance(event, MessageSent)
            async for event in resumed:  # live, in order, until that run ends
                if isinstance(event, TurnEnded):
                    break
            await resumed.aclose()

    asyncio.run(main())


def test_events_end_when_the_owner_closes() -> None:
    async def main() -> list[int]:
        owner = AsyncOwner(open_store("memory:"), "s", Runner(echo))
        async with owner:
            await owner.inject("x")
            reader = owner.events()
            first = await anext(reader)
        return [first.seq] + [event.seq async for event in reader]

    assert asyncio.run(main()) == [1]


def test_bad_input_is_refused_before_anything_is_written() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            with pytest.raises(TypeError, match="wakeup must be a bool"):
                await owner.send("x", "next_step", "yes")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await owner.send("x", "somewhere", True)
            assert owner.session.version == 0

    asyncio.run(main())


def test_a_runner_without_arun_turn_is_refused() -> None:
    with pytest.raises(TypeError, match="arun_turn"):
        AsyncOwner(open_store("memory:"), "s", object())  # type: ignore[arg-type]


def test_using_it_unopened_says_how_to_open_it() -> None:
    owner = AsyncOwner(open_store("memory:"), "s", Runner(echo))
    with pytest.raises(RuntimeError, match="async with"):
        asyncio.run(owner.steer("x"))


class OffTheLoop:
    """A store that says its calls block, and notes the thread of every call, to prove none ran
    on the event loop."""

    blocking = True

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.threads.add(threading.get_ident())
            return attr(*args, **kwargs)

        return noted


def test_store_io_never_runs_on_the_event_loop() -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.compat.pydantic_ai import AgentRunner

    def model(messages: Any, info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("work", {}, "c1")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def work() -> str:
        """Work."""
        return "ok"

    store = OffTheLoop(open_store("memory:"))

    async def main() -> int:
        async with AsyncOwner(store, "s", AgentRunner(agent)) as owner:  # type: ignore[arg-type]
            await owner.prompt("go")
            assert await owner.wait_idle(WAIT)
            [e async for e in _until(owner.events(), owner.session.version)]
            assert owner.transcript[-1].content == "done"
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert store.threads and loop_thread not in store.threads


async def _until(reader: Any, seq: int) -> Any:
    async for event in reader:
        yield event
        if event.seq >= seq:
            return


def test_an_idle_async_owner_wakes_for_a_steer_another_process_appended(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"

    async def main() -> None:
        async with AsyncOwner(open_store(url), "s", Runner(echo), poll_interval=0.01) as owner:
            reader = owner.events()
            await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s", "wake up"],
                check=True, capture_output=True, cwd=ROOT,
            )
            async for event in reader:
                if isinstance(event, TurnEnded):
                    break
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["wake up", "heard: wake up"]

    asyncio.run(main())


def test_it_resumes_from_the_log_and_answers_what_was_left_waiting(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    store = open_store(url)
    store.append("s", [MessageSent(target="next_step", wakeup=True, message=Message.user("left"))])

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["left", "heard: left"]

    asyncio.run(main())
    store.close()


def test_a_slow_tool_leaves_the_loop_free_for_sends() -> None:
    release = asyncio.Event()

    async def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        if transcript[-1].role == "user" and transcript[-1].content == "go":
            return Message.assistant(tool_calls=[ToolCall("c1", "wait", {})])
        return Message.assistant(f"saw {transcript[-1].content}")

    async def wait() -> str:
        await release.wait()
        return "released"

    async def main() -> list[str]:
        async with AsyncOwner(open_store("memory:"), "s", Runner(model, [wait])) as owner:
            started = owner.events()
            await owner.prompt("go")
            async for event in started:
                if isinstance(event, TurnStarted):
                    break
            await owner.steer("meanwhile")  # answered while the tool still waits
            release.set()
            assert await owner.wait_idle(WAIT)
            return [m.content for m in owner.transcript]

    assert asyncio.run(main())[-2:] == ["meanwhile", "saw meanwhile"]


class Gated:
    """A store whose calls block (``blocking = True``) and whose appends can be held at a gate:
    ``hold()`` makes the next append wait, ``entered`` says one is waiting, ``release()`` lets
    it through."""

    blocking = True

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self._gate = threading.Event()
        self._gate.set()
        self.entered = threading.Event()

    def hold(self) -> None:
        self.entered.clear()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if not self._gate.is_set():
            self.entered.set()
            self._gate.wait()
        return self._inner.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_send_held_in_the_store_leaves_the_loop_running_other_tasks() -> None:
    store = Gated(open_store("memory:"))

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:  # type: ignore[arg-type]
            store.hold()
            sending = asyncio.ensure_future(owner.inject("held"))
            await asyncio.to_thread(store.entered.wait)  # the append is inside the store now
            other = asyncio.ensure_future(asyncio.sleep(0, result="ran"))
            assert await other == "ran"  # the loop runs other tasks meanwhile
            assert not sending.done() and owner.session.version == 0
            store.release()
            assert (await sending).seq == 1

    asyncio.run(main())


def test_a_runs_record_held_in_the_store_leaves_the_loop_running_other_tasks() -> None:
    store = Gated(open_store("memory:"))
    held: list[str] = []

    async def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        store.hold()  # the run's next record (its reply) waits at the gate
        return Message.assistant("answer")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(model)) as owner:  # type: ignore[arg-type]
            await owner.steer("go")
            await asyncio.to_thread(store.entered.wait)  # the run is recording, in the store
            held.append(await asyncio.ensure_future(asyncio.sleep(0, result="ran")))
            assert owner.running
            store.release()
            assert await owner.wait_idle(WAIT)
            assert owner.transcript[-1].content == "answer"

    asyncio.run(main())
    assert held == ["ran"]
