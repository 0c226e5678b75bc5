"""Handing a session over (a rolling restart's drain): the run stops at its next boundary, the
release is recorded, and the next holder ends the turn as released and carries it on at once; a
run that reaches no boundary in time is closed as a takeover closes it."""

from __future__ import annotations

import asyncio
from typing import Any

from nous_inbox.events import Event, MessageSent, SessionReleased, TurnEnded, TurnStarted
from nous_inbox.message import Message, ToolCall
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store
from nous_inbox.web.host import SessionHost

WAIT = 30.0


class Work:
    """A model that calls one tool, then answers with what it read; the tool waits for
    ``done`` (never set: a tool that outlives any drain)."""

    def __init__(self) -> None:
        self.in_tool = asyncio.Event()
        self.done = asyncio.Event()

    async def slow(self) -> str:
        self.in_tool.set()
        await self.done.wait()
        return "42"

    def model(self, transcript: list[Message], tools: object) -> Message:
        if transcript[-1].role == "user":
            return Message.assistant("", tool_calls=[ToolCall("c1", "slow", {})])
        return Message.assistant(f"read {transcript[-1].content}")

    def runner(self, session: str = "s") -> Runner:
        return Runner(self.model, tools=[self.slow])


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ + (f":{e.reason}" if isinstance(e, (TurnStarted, TurnEnded)) else "")
            for e in events]


async def handed_over_mid_tool(store: Store, timeout: float, finish: bool) -> Work:
    work = Work()
    owner = AsyncOwner(store, "s", work.runner())
    await owner.__aenter__()
    await owner.steer("count the lines")
    await asyncio.wait_for(work.in_tool.wait(), WAIT)
    closing = asyncio.ensure_future(owner.aclose(timeout, hand_over=True))
    if finish:
        work.done.set()  # the tool answers after the handover was asked
    await asyncio.wait_for(closing, WAIT)
    return work


def test_a_run_handed_over_stops_at_its_next_boundary_and_the_next_holder_carries_it_on() -> None:
    async def main() -> tuple[list[Event], list[str]]:
        store = open_store("memory:")
        work = await handed_over_mid_tool(store, WAIT, finish=True)
        let_go = list(store.read("s"))
        async with AsyncOwner(store, "s", work.runner()) as next_holder:
            assert await next_holder.wait_idle(WAIT)
            return let_go, [m.content for m in next_holder.transcript]

    let_go, transcript = asyncio.run(main())
    assert kinds(let_go)[-3:] == ["ToolReturned", "StepEnded", "SessionReleased"]
    assert let_go[-1] == SessionReleased(turn=1, seq=let_go[-1].seq, at=let_go[-1].at)
    assert transcript == ["count the lines", "", "42", "read 42"]


def test_the_next_holder_records_the_turn_released_and_a_resumed_one() -> None:
    async def main() -> list[Event]:
        store = open_store("memory:")
        work = await handed_over_mid_tool(store, WAIT, finish=True)
        async with AsyncOwner(store, "s", work.runner()) as next_holder:
            assert await next_holder.wait_idle(WAIT)
        return list(store.read("s"))

    events = asyncio.run(main())
    assert kinds(events)[9:] == ["SessionReleased", "TurnEnded:released", "TurnStarted:resumed",
                                 "StepStarted", "ModelRequested", "ModelReplied", "StepEnded",
                                 "TurnEnded:final"]


def test_a_run_that_reaches_no_boundary_in_time_is_closed_as_a_takeover_closes_it() -> None:
    async def main() -> list[Event]:
        store = open_store("memory:")
        work = await handed_over_mid_tool(store, 0.05, finish=False)
        async with AsyncOwner(store, "s", work.runner()) as next_holder:
            assert await next_holder.wait_idle(WAIT)
        return list(store.read("s"))

    events = asyncio.run(main())
    assert kinds(events)[6:] == ["ToolCalled", "SessionReleased", "ToolReturned", "TurnEnded:error"]
    assert events[6 + 1] == SessionReleased(seq=events[7].seq, at=events[7].at)  # no turn carried
    assert "interrupted" in (events[-1].error or "")  # type: ignore[union-attr]


def test_a_draining_host_takes_no_session_and_a_send_to_one_lands_in_the_log() -> None:
    async def main() -> tuple[list[Event], bool]:
        store = open_store("memory:")
        work = Work()
        async with SessionHost(store, work.runner, scan_interval=None) as host:
            await host.send("s", "steer", "count the lines")
            await asyncio.wait_for(work.in_tool.wait(), WAIT)
            draining = asyncio.ensure_future(host.drain(WAIT))
            work.done.set()
            await asyncio.wait_for(draining, WAIT)
            sent = await host.send("s", "steer", "and the rest")
            return list(store.read("s", sent.seq - 1)), host.hosted("s") is None and host.draining

    (steer,), let_go = asyncio.run(main())
    assert isinstance(steer, MessageSent) and steer.message.content == "and the rest"
    assert let_go


class ThreadWork:
    """The same work for the threaded ``Owner``: a sync tool that waits for ``done``."""

    def __init__(self) -> None:
        import threading

        self.in_tool = threading.Event()
        self.done = threading.Event()

    def slow(self) -> str:
        self.in_tool.set()
        self.done.wait(WAIT)
        return "42"

    def runner(self) -> Runner:
        return Runner(Work().model, tools=[self.slow])


def test_the_threaded_owner_hands_over_at_its_next_boundary_too() -> None:
    import threading

    from nous_inbox.owner import Owner

    store = open_store("memory:")
    work = ThreadWork()
    owner = Owner(store, "s", work.runner())
    owner.steer("count the lines")
    assert work.in_tool.wait(WAIT)
    closing = threading.Thread(target=owner.close, args=(WAIT,), kwargs={"hand_over": True})
    closing.start()
    work.done.set()  # the tool answers after the handover was asked
    closing.join(WAIT)
    assert not closing.is_alive()
    assert kinds(list(store.read("s")))[-3:] == ["ToolReturned", "StepEnded", "SessionReleased"]
    with Owner(store, "s", work.runner()) as next_holder:
        assert next_holder.wait_idle(WAIT)
        transcript = [m.content for m in next_holder.transcript]
    assert transcript == ["count the lines", "", "42", "read 42"]
    assert "TurnEnded:released" in kinds(list(store.read("s")))


def test_the_threaded_owner_cuts_off_a_run_that_reaches_no_boundary_in_time() -> None:
    from nous_inbox.owner import Owner

    store = open_store("memory:")
    work = ThreadWork()
    owner = Owner(store, "s", work.runner())
    owner.steer("count the lines")
    assert work.in_tool.wait(WAIT)
    owner.close(0.05, hand_over=True)  # the tool outlives the drain: its run is cut off
    work.done.set()
    assert owner.wait_idle(WAIT)  # the run ends, recording nothing; its lease goes back
    with Owner(store, "s", work.runner()) as next_holder:
        assert next_holder.wait_idle(WAIT)
    events = kinds(list(store.read("s")))
    assert events[6:8] == ["ToolCalled", "SessionReleased"] and events[-1] == "TurnEnded:error"


def test_a_framework_adapter_hands_over_without_failing_its_turn() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    async def main() -> list[Event]:
        in_tool, done = asyncio.Event(), asyncio.Event()

        def model(messages: list[Any], info: Any) -> ModelResponse:
            last = messages[-1].parts[-1]
            if isinstance(last, ToolReturnPart):
                return ModelResponse(parts=[TextPart(f"read {last.content}")])
            return ModelResponse(parts=[ToolCallPart("slow", {}, tool_call_id="c1")])

        agent = Agent(FunctionModel(model))

        @agent.tool_plain
        async def slow() -> str:
            in_tool.set()
            await done.wait()
            return "42"

        store = open_store("memory:")
        owner = AsyncOwner(store, "s", AgentRunner(agent))
        await owner.__aenter__()
        await owner.steer("count the lines")
        await asyncio.wait_for(in_tool.wait(), WAIT)
        closing = asyncio.ensure_future(owner.aclose(WAIT, hand_over=True))
        done.set()
        await asyncio.wait_for(closing, WAIT)
        async with AsyncOwner(store, "s", AgentRunner(agent)) as next_holder:
            assert await next_holder.wait_idle(WAIT)
        return list(store.read("s"))

    events = kinds(asyncio.run(main()))
    assert "TurnEnded:error" not in events
    assert events.count("SessionReleased") == 1
    assert events[-1] == "TurnEnded:final" and "TurnStarted:resumed" in events


def test_a_send_after_the_release_does_not_undo_it() -> None:
    # A draining host sends new messages straight to the log: the next holder still carries
    # the released turn on, rather than closing it as a dead holder's.
    async def with_a_send_between() -> list[Event]:
        store = open_store("memory:")
        work = await handed_over_mid_tool(store, WAIT, finish=True)
        from nous_inbox.store.journal import send_to
        from nous_inbox.verbs import Target
        send_to(store, "s", Message.user("fyi"), Target.NEXT_STEP, False)
        async with AsyncOwner(store, "s", work.runner()) as next_holder:
            assert await next_holder.wait_idle(WAIT)
        return list(store.read("s"))

    events = kinds(asyncio.run(with_a_send_between()))
    assert events[9:12] == ["SessionReleased", "MessageSent", "TurnEnded:released"]
    assert "TurnStarted:resumed" in events and "TurnEnded:error" not in events
