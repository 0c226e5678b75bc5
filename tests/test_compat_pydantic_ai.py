"""The inbox behind a real pydantic-ai Agent: steer a framework's run, durably, from anywhere.

Offline, with pydantic-ai's own FunctionModel: each test scripts the replies and keeps every
request the model was shown. Mid-run sends are made by a tool (or the model function) while it
runs, which is "a person typed while the agent was working" and needs no sleeps.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    INTERRUPTED_TOOL_RETURN_CONTENT,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nous_inbox import Message, QueueClaimed, replay
from nous_inbox.adapters.pydantic_ai import (
    AgentRunner,
    from_model_response,
    to_model_messages,
)
from nous_inbox.events import (
    ModelReplied,
    StepEnded,
    StepStarted,
    ToolCalled,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.happenings import cancelled_result, interrupted_result
from nous_inbox.message import ToolCall
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner.port import LocalSession
from nous_inbox.store import open_store
from tests.helpers import events_so_far

ROOT = Path(__file__).resolve().parent.parent
WAIT = 30  # seconds; a generous bound for a wait that should end at once, never a sync sleep

Seen = list[tuple[str, str]]


def shown(messages: list[ModelMessage]) -> Seen:
    """What a request showed the model, as (kind, text) pairs: written here, not by the adapter."""
    out: Seen = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                out.append(("user", str(part.content)))
            elif isinstance(part, ToolReturnPart):
                out.append(("tool", part.model_response_str()))
            elif isinstance(part, TextPart):
                out.append(("text", part.content))
            elif isinstance(part, ToolCallPart):
                out.append(("call", part.tool_name))
    return out


def transcript_shown(transcript: list[Message]) -> Seen:
    """The same pairs read from our replayed transcript."""
    out: Seen = []
    for m in transcript:
        if m.role == "assistant":
            if m.content:
                out.append(("text", m.content))
            out.extend(("call", c.name) for c in m.tool_calls)
        else:
            out.append((m.role, m.content))
    return out


class Script:
    """A FunctionModel script: ``"tool"`` calls ``work``, any other string is the answer.

    ``during`` runs inside request ``i`` (after its claim, before its reply), as a person typing
    while the model thinks."""

    def __init__(self, *replies: str,
                 during: dict[int, Callable[[], Awaitable[None]]] | None = None) -> None:
        self.replies = list(replies)
        self.during = during or {}
        self.requests: list[Seen] = []

    async def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        index = len(self.requests)
        self.requests.append(shown(messages))
        if index in self.during:
            await self.during[index]()
        reply = self.replies[index] if index < len(self.replies) else "done"
        if reply == "tool":
            return ModelResponse(parts=[ToolCallPart("work", {"n": index}, f"c{index}")])
        return ModelResponse(parts=[TextPart(reply)])


def make_agent(script: Script, during_tool: Callable[[int], Awaitable[None]] | None = None) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(FunctionModel(script))

    @agent.tool_plain
    async def work(n: int) -> str:
        """Do a piece of work."""
        if during_tool is not None:
            await during_tool(n)
        return f"result {n}"

    return agent


async def run_owner(script: Script, body: Callable[[AsyncOwner], Awaitable[None]],
                    during_tool: Callable[[AsyncOwner, int], Awaitable[None]] | None = None,
                    url: str = "memory:") -> AsyncOwner:
    holder: dict[str, AsyncOwner] = {}

    async def tool_hook(n: int) -> None:
        if during_tool is not None:
            await during_tool(holder["owner"], n)

    store = open_store(url)
    owner = AsyncOwner(store, "s", AgentRunner(make_agent(script, tool_hook)))
    holder["owner"] = owner
    async with owner:
        await body(owner)
        assert await owner.wait_idle(WAIT)
        assert owner.session == replay(await events_so_far(owner))
        holder["session"] = owner.session  # type: ignore[assignment]
    return owner


def turns(events: list[Any]) -> int:
    return sum(isinstance(e, TurnStarted) for e in events)


# -- the claim points ------------------------------------------------------------------------------


def test_a_steer_sent_during_a_tool_call_is_absent_from_that_request_and_joins_the_next() -> None:
    script = Script("tool", "done")

    async def during(owner: AsyncOwner, n: int) -> None:
        await owner.steer("also check b.py")

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("fix a.py").stored()

    asyncio.run(run_owner(script, body, during))
    assert ("user", "also check b.py") not in script.requests[0]
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "also check b.py")]


def test_an_injection_alone_at_a_final_answer_does_not_extend_the_run() -> None:
    holder: dict[str, AsyncOwner] = {}

    async def inject() -> None:
        await holder["owner"].inject("fyi: tests are slow")

    script = Script("answer", during={0: inject})

    async def body(owner: AsyncOwner) -> None:
        holder["owner"] = owner
        await owner.prompt("go").stored()
        assert await owner.wait_idle(WAIT)
        assert [m.content for m, _ in owner.inbox.entries("next_step")] == ["fyi: tests are slow"]

    asyncio.run(run_owner(script, body))
    assert len(script.requests) == 1


def test_a_steer_at_a_final_answer_extends_the_run_by_one_request() -> None:
    holder: dict[str, AsyncOwner] = {}

    async def steer() -> None:
        await holder["owner"].steer("stop and summarize")

    script = Script("answer", "summary", during={0: steer})
    events: list[Any] = []

    async def body(owner: AsyncOwner) -> None:
        holder["owner"] = owner
        await owner.prompt("go").stored()
        assert await owner.wait_idle(WAIT)
        events.extend(await events_so_far(owner))

    asyncio.run(run_owner(script, body))
    assert len(script.requests) == 2
    assert script.requests[1][-2:] == [("text", "answer"), ("user", "stop and summarize")]
    assert turns(events) == 1  # the same run, one request longer


def test_a_followup_sent_mid_run_waits_for_the_next_run() -> None:
    script = Script("tool", "first done", "second done")
    events: list[Any] = []

    async def during(owner: AsyncOwner, n: int) -> None:
        await owner.followup("and then deploy").stored()

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("build").stored()
        assert await owner.wait_idle(WAIT)
        events.extend(await events_so_far(owner))

    asyncio.run(run_owner(script, body, during))
    assert all(("user", "and then deploy") not in r for r in script.requests[:2])
    assert script.requests[2][-2:] == [("text", "first done"), ("user", "and then deploy")]
    assert turns(events) == 2


def test_cancel_ends_the_run_at_its_next_boundary_and_wakes_nothing() -> None:
    script = Script("tool", "tool", "done")

    async def during(owner: AsyncOwner, n: int) -> None:
        await owner.steer("queued while cancelling")
        assert owner.cancel()

    events: list[Any] = []

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("go").stored()
        assert await owner.wait_idle(WAIT)
        events.extend(await events_so_far(owner))
        assert owner.inbox.wants_wake()  # the steer waits for the next real wake

    asyncio.run(run_owner(script, body, during))
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert [e.reason for e in ended] == ["cancelled"]
    assert len(script.requests) == 1


# -- the record -----------------------------------------------------------------------------------


def test_the_replayed_transcript_is_what_the_model_was_shown() -> None:
    script = Script("tool", "tool", "done")

    async def during(owner: AsyncOwner, n: int) -> None:
        await owner.inject(f"note {n}")

    session: dict[str, Any] = {}

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("go").stored()
        assert await owner.wait_idle(WAIT)
        session["transcript"] = list(replay(await events_so_far(owner)).transcript)

    asyncio.run(run_owner(script, body, during))
    seen_last = script.requests[-1]
    assert transcript_shown(session["transcript"])[: len(seen_last)] == seen_last
    assert transcript_shown(session["transcript"])[len(seen_last):] == [("text", "done")]


def test_a_new_turn_continues_from_the_recorded_transcript() -> None:
    script = Script("one", "two")

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("first").stored()
        assert await owner.wait_idle(WAIT)
        await owner.prompt("second").stored()

    asyncio.run(run_owner(script, body))
    assert script.requests[1] == [("user", "first"), ("text", "one"), ("user", "second")]


def test_one_runner_taking_turns_of_two_sessions_shows_each_its_own_transcript() -> None:
    script = Script("tool", "a1", "b1", "a2", "tool", "b2", "b3")
    runner = AgentRunner(make_agent(script), offload=False)
    a, b = LocalSession(), LocalSession()
    turns: list[tuple[int, Seen]] = []

    async def turn(local: LocalSession, text: str) -> None:
        local.followup(text)
        async for _ in runner.arun_turn(local):
            pass

    for local, text in ((a, "a 1"), (b, "b 1"), (a, "a 2"), (b, "b 2"), (b, "b 3")):
        asyncio.run(turn(local, text))
        turns.append((len(script.requests) - 1, transcript_shown(list(local.session.transcript))))
    # Each turn's last request showed its own session's transcript, all but the final reply.
    assert [script.requests[last] for last, _ in turns] == [seen[:-1] for _, seen in turns]
    assert script.requests[-1] == [
        ("user", "b 1"), ("text", "b1"), ("user", "b 2"), ("call", "work"), ("tool", "result 4"),
        ("text", "b2"), ("user", "b 3"),
    ]


def test_one_runner_shows_a_session_its_own_call_arguments_where_another_s_compare_equal() -> None:
    # Python has True == 1, so two sessions whose model called the same tool with these arguments
    # hold transcripts that compare equal; each must still be shown the call it made.
    replies = iter([True, "done", 1, "done", "a 2", "b 2"])  # a flag is a call of work
    calls: list[str] = []

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.extend(p.args_as_json_str() for m in messages for p in m.parts
                     if isinstance(p, ToolCallPart))
        answer = next(replies)
        if isinstance(answer, str):
            return ModelResponse(parts=[TextPart(answer)])
        return ModelResponse(parts=[ToolCallPart("work", {"flag": answer}, "c1")])

    agent: Agent[None, str] = Agent(FunctionModel(reply))

    @agent.tool_plain
    def work(flag: int | bool) -> str:
        """Do a piece of work."""
        return "ok"

    runner = AgentRunner(agent, offload=False)
    a, b = LocalSession(), LocalSession()

    async def turn(local: LocalSession) -> None:
        local.followup("go")
        async for _ in runner.arun_turn(local):
            pass

    for local in (a, b, a):
        asyncio.run(turn(local))
    calls.clear()
    asyncio.run(turn(b))
    assert calls == ['{"flag":1}']


def test_a_failing_model_ends_the_turn_as_an_error_recorded_and_re_raises() -> None:
    def broken(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("model down")

    local = LocalSession()
    local.followup("go")

    async def turn() -> None:
        async for _ in AgentRunner(Agent(FunctionModel(broken))).arun_turn(local):
            pass

    with pytest.raises(RuntimeError, match="model down"):
        asyncio.run(turn())
    ended = [e for e in local.events if isinstance(e, TurnEnded)]
    assert [(e.reason, e.error) for e in ended] == [("error", "RuntimeError: model down")]
    assert local.session == replay(local.events)


class FailsOnce:
    """A host's own port (not a journal) over ``local`` whose store refuses one write: the
    turn's first ``StepStarted``, recorded as the turn opens, after its start and its claim."""

    def __init__(self, local: LocalSession) -> None:
        self.local, self.failed = local, False

    @property
    def session(self) -> Any:
        return self.local.session

    def claim(self, target: str, *, wake_only: bool = False) -> Any:
        return self.local.claim(target, wake_only=wake_only)

    def record(self, events: Any) -> Any:
        if any(isinstance(event, StepStarted) for event in events) and not self.failed:
            self.failed = True
            raise OSError("disk full")
        return self.local.record(events)


@pytest.mark.parametrize("driven", ["async", "thread"])
def test_a_turn_whose_opening_fails_is_ended_as_an_error_recorded_and_re_raises(
    driven: str,
) -> None:
    local = LocalSession()
    local.followup("go")
    runner = AgentRunner(make_agent(Script("ok")), offload=False)

    async def turn() -> list[Any]:
        return [e async for e in runner.arun_turn(FailsOnce(local))]

    with pytest.raises(OSError, match="disk full"):
        if driven == "async":
            asyncio.run(turn())
        else:
            list(runner.run_turn(FailsOnce(local)))
    ended = local.events[-1]
    assert isinstance(ended, TurnEnded)
    assert (ended.reason, ended.error) == ("error", "OSError: disk full")
    assert not local.session.running and local.session == replay(local.events)


def test_the_threaded_owner_drives_a_pydantic_ai_agent_too() -> None:
    script = Script("tool", "done")

    def during(n: int) -> Awaitable[None]:
        async def send() -> None:
            owner.steer("from a thread")
        return send()

    owner = Owner(open_store("memory:"), "s", AgentRunner(make_agent(script, during)), start=False)
    with owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        assert owner.session == replay(owner.events())
    assert script.requests[1][-1] == ("user", "from a thread")


def test_messages_cross_between_the_two_spellings() -> None:
    reply = ModelResponse(parts=[TextPart("ok"), ToolCallPart("ls", {"d": "."}, "c1")])
    message = from_model_response(reply)
    assert message.content == "ok" and message.tool_calls[0].name == "ls"
    (back,) = to_model_messages([message])
    assert isinstance(back, ModelResponse) and shown([back]) == [("text", "ok"), ("call", "ls")]
    (request,) = to_model_messages([Message.user("a"), Message.system("b")])
    assert isinstance(request, ModelRequest) and len(request.parts) == 2


def test_bad_arguments_are_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match=r"pydantic_ai\.Agent"):
        AgentRunner(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="message_history"):
        AgentRunner(Agent(FunctionModel(Script()))), AgentRunner(
            Agent(FunctionModel(Script())), message_history=[]
        )


# -- other processes ------------------------------------------------------------------------------


def test_a_steer_from_another_terminal_reaches_a_running_agent(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    script = Script("tool", "done")

    async def during(owner: AsyncOwner, n: int) -> None:
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s", "from the CLI"],
            check=True, capture_output=True, cwd=ROOT,
        )

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("go").stored()

    asyncio.run(run_owner(script, body, during, url=url))
    assert script.requests[1][-2:] == [("tool", "result 0"), ("user", "from the CLI")]


CHILD = r"""
import asyncio, json, sys
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.adapters.pydantic_ai import AgentRunner
from nous_inbox.store import open_store
sys.path.insert(0, sys.argv[2])
from test_compat_pydantic_ai import shown

holder = {}
count = [0]

async def model(messages, info):
    count[0] += 1
    print(json.dumps(shown(messages)), flush=True)
    if count[0] == 3 and sys.argv[3] == "model":
        await asyncio.Event().wait()  # the model hangs; the parent kills us here
    return ModelResponse(parts=[ToolCallPart("work", {"n": count[0]}, f"c{count[0]}")])

agent = Agent(FunctionModel(model))

@agent.tool_plain
async def work(n: int) -> str:
    for i in range(3):
        await holder["owner"].steer(f"steer {n}.{i}")
        print(json.dumps(f"steer {n}.{i}"), flush=True)  # acknowledged: durable
    if n == 3:
        print(json.dumps(None), flush=True)
        await asyncio.Event().wait()  # the tool hangs; the parent kills us here
    return f"result {n}"

async def main():
    async with AsyncOwner(open_store(sys.argv[1]), "s", AgentRunner(agent)) as owner:
        holder["owner"] = owner
        await owner.prompt("go").stored()
        await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("hangs", ["model", "tool"])
def test_killed_mid_run_nothing_is_lost_or_doubled_and_replay_is_what_the_model_saw(
    tmp_path: Path, hangs: str,
) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(ROOT / "tests"), hangs], stdout=subprocess.PIPE,
        text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    requests: list[Seen] = []
    acknowledged: list[str] = []
    for line in child.stdout:
        value = json.loads(line)
        if value is None:
            break  # the third tool hangs
        if isinstance(value, str):
            acknowledged.append(value)
        else:
            requests.append([(kind, text) for kind, text in value])
            if len(requests) == 3 and hangs == "model":
                break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()

    store = open_store(url)
    events = list(store.read("s"))
    session = replay(events, stream="s")
    assert session.running  # cut off mid-run
    # Cut off in a tool, the reply that asked for it is logged with its call unanswered.
    cut = requests[-1] + ([("call", "work")] if hangs == "tool" else [])
    assert transcript_shown(list(session.transcript)) == cut
    queued = [m.content for m, _ in session.inbox.entries("next_step")]
    delivered = [m.content for m in session.transcript if m.role == "user"]
    assert len(queued + delivered) == len(set(queued + delivered)), "a message was doubled"
    assert set(acknowledged) <= set(queued + delivered), "an acknowledged message was lost"

    # Reopened, the session resumes from the log: the cut-off turn is closed, and the next run
    # continues from exactly the transcript the model was shown.
    script = Script("resumed")

    async def reopen() -> None:
        async with AsyncOwner(store, "s", AgentRunner(make_agent(script))) as owner:
            await owner.steer("carry on")
            assert await owner.wait_idle(WAIT)
            ended = [e for e in await events_so_far(owner) if isinstance(e, TurnEnded)]
            assert ended[0].reason == "error"

    asyncio.run(reopen())
    assert script.requests[0][: len(cut)] == cut
    if hangs == "tool":  # the resumed log answers the call it never saw answered, as shown
        assert script.requests[0][len(cut)] == ("tool", interrupted_result(ToolCall("c3", "work")).content)
    assert script.requests[0][-1] == ("user", "carry on")
    assert_each_request_is_in_the_log(list(store.read("s")), script.requests)
    store.close()


def test_claims_are_recorded_as_the_transcript_entries_they_become() -> None:
    local = LocalSession()
    local.followup("a")
    local.inject("b")

    async def turn() -> list[Any]:
        runner = AgentRunner(Agent(FunctionModel(Script("ok"))), offload=False)
        return [e async for e in runner.arun_turn(local)]

    events = asyncio.run(turn())
    claims = [(e.target, e.count) for e in events if isinstance(e, QueueClaimed)]
    assert claims == [("next_turn", 1), ("next_step", 1)]
    assert [m.content for m in local.session.transcript] == ["a", "b", "ok"]


class CountingStore:
    """A store that counts its appends (transactions), passing everything through."""

    def __init__(self) -> None:
        self._inner = open_store("memory:")
        self.appends = 0

    def append(self, *args: Any, **kwargs: Any) -> Any:
        self.appends += 1
        return self._inner.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_model_request_is_recorded_in_two_appends_the_boundary_and_the_reply() -> None:
    store = CountingStore()
    script = Script("tool", "tool", "done")

    async def main() -> int:
        async with AsyncOwner(store, "s", AgentRunner(make_agent(script))) as owner:  # type: ignore[arg-type]
            await owner.prompt("go").stored()
            before = store.appends  # the prompt's own
            assert await owner.wait_idle(WAIT)
            assert owner.session == replay(list(store.read("s")))
            return store.appends - before

    # Per request its boundary (the first: the turn's opening) and its reply, then the boundary
    # at the final answer, which ends the turn.
    assert asyncio.run(main()) == 2 * len(script.requests) + 1


def test_each_model_request_says_how_many_messages_it_showed() -> None:
    script = Script("tool", "tool", "done")
    events: list[Any] = []

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("go").stored()
        assert await owner.wait_idle(WAIT)
        events.extend(await events_so_far(owner))

    asyncio.run(run_owner(script, body))
    for i, event in enumerate(events):
        if type(event).__name__ == "ModelRequested":
            assert event.count == len(replay(events[:i]).transcript)
    assert [type(e).__name__ for e in events].count("ModelRequested") == len(script.requests)


# -- what the model saw is what the log holds, whatever ends a run ---------------------------------


def assert_each_request_is_in_the_log(events: list[Any], requests: list[Seen]) -> None:
    """Every request the model was shown (the last ``len(requests)`` the log holds) is, message
    for message, the replayed transcript as its ``ModelRequested`` says: nothing shown that the
    log lacks, nothing added the model never saw."""
    asked = [i for i, e in enumerate(events) if type(e).__name__ == "ModelRequested"]
    assert len(asked) >= len(requests)
    for i, seen in zip(asked[len(asked) - len(requests):], requests, strict=True):
        transcript = list(replay(events[: i + 1]).transcript)
        assert transcript_shown(transcript[: events[i].count]) == seen


def test_a_tool_that_finished_before_a_cancel_keeps_its_result_and_the_next_turn_sees_it() -> None:
    script = Script("tool", "done", "after")
    log: list[Any] = []

    async def during(owner: AsyncOwner, n: int) -> None:
        assert owner.cancel()  # while the tool runs: it finishes, the run ends at the next node

    async def body(owner: AsyncOwner) -> None:
        await owner.prompt("go").stored()
        assert await owner.wait_idle(WAIT)
        assert transcript_shown(list(owner.transcript)) == [
            ("user", "go"), ("call", "work"), ("tool", "result 0")]
        await owner.prompt("next").stored()
        assert await owner.wait_idle(WAIT)
        log.extend(await events_so_far(owner))

    asyncio.run(run_owner(script, body, during))
    assert script.requests[-1] == [
        ("user", "go"), ("call", "work"), ("tool", "result 0"), ("user", "next")]
    assert_each_request_is_in_the_log(log, script.requests)


def test_calls_a_cancel_leaves_unrun_are_answered_as_cancelled_as_the_built_in_runner_does() -> None:
    holder: dict[str, AsyncOwner] = {}

    async def cancel() -> None:
        assert holder["owner"].cancel()  # while the model thinks: its calls will not run

    script = Script("tool", "after", during={0: cancel})
    log: list[Any] = []

    async def body(owner: AsyncOwner) -> None:
        holder["owner"] = owner
        await owner.prompt("go").stored()
        assert await owner.wait_idle(WAIT)
        await owner.prompt("next").stored()
        assert await owner.wait_idle(WAIT)
        log.extend(await events_so_far(owner))

    asyncio.run(run_owner(script, body))
    cancelled = cancelled_result(ToolCall("c0", "work"))
    assert script.requests[-1] == [
        ("user", "go"), ("call", "work"), ("tool", cancelled.content), ("user", "next")]
    assert_each_request_is_in_the_log(log, script.requests)


def counting_agent(rounds: int) -> Agent[None, str]:
    """An agent that calls ``count`` ``rounds`` times, then answers with how many it counted."""

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done < rounds:
            return ModelResponse(parts=[ToolCallPart("count", {}, f"c{done}")])
        return ModelResponse(parts=[TextPart(f"counted {done}")])

    agent: Agent[None, str] = Agent(FunctionModel(reply))

    @agent.tool_plain
    def count() -> str:
        """Count one."""
        return "one more"

    return agent


def test_an_agent_runs_as_many_requests_as_the_bare_agent_would() -> None:
    # Ten tool calls and the answer: eleven requests, past the inbox's budget of ten, well within
    # pydantic-ai's own request limit. The budget counts only the requests the inbox adds.
    agent = counting_agent(10)
    bare = agent.run_sync("count")
    local = LocalSession()
    local.followup("count")

    async def turn() -> list[Any]:
        return [e async for e in AgentRunner(agent).arun_turn(local)]

    events = asyncio.run(turn())
    last = events[-1]
    assert isinstance(last, TurnEnded) and last.reason == "final"
    assert last.usage is not None and last.usage["requests"] == bare.usage.requests == 11
    assert local.session.transcript[-1] == Message.assistant(bare.output)


def test_pydantic_ais_own_request_limit_bounds_the_agents_requests() -> None:
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.usage import UsageLimits

    limits = UsageLimits(request_limit=3)
    with pytest.raises(UsageLimitExceeded):
        counting_agent(10).run_sync("count", usage_limits=limits)  # as the bare agent ends
    local = LocalSession()
    local.followup("count")

    async def turn() -> None:
        async for _ in AgentRunner(counting_agent(10), usage_limits=limits).arun_turn(local):
            pass

    with pytest.raises(UsageLimitExceeded):
        asyncio.run(turn())
    ended = local.events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "error"
    assert ended.usage is not None and ended.usage["requests"] == 3
    # The third request's tool result is recorded: every call is answered in the log.
    assert local.session.transcript[-1].role == "tool"
    assert local.session == replay(local.events)


def test_a_tool_cut_off_by_cancelling_the_run_is_recorded_as_interrupted() -> None:
    # A host that cancels the run's task (an owner closing past its timeout, a stopped server)
    # while a sync tool runs: the tool started, so it was interrupted, not "never ran".
    import threading

    started, release = threading.Event(), threading.Event()
    agent: Agent[None, str] = Agent(FunctionModel(Script("tool")))

    @agent.tool_plain
    def work(n: int) -> str:
        """Do a piece of work."""
        started.set()
        release.wait(WAIT)
        return "late"

    local = LocalSession()
    local.followup("go")

    async def main() -> None:
        async def consume() -> None:
            async for _ in AgentRunner(agent, offload=False).arun_turn(local):
                pass

        task = asyncio.create_task(consume())
        await asyncio.to_thread(started.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()

    asyncio.run(main())
    answer = local.session.transcript[-1]
    assert (answer.content, answer.metadata) == (
        interrupted_result(ToolCall("c0", "work"), "the turn was cancelled").content,
        {"error": "interrupted"})
    ended = local.events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "cancelled"
    assert local.session == replay(local.events)


class Answer(BaseModel):
    value: int


def structured(requests: list[Seen], *, during: dict[int, Callable[[], Awaitable[None]]]
               | None = None) -> Callable[[list[ModelMessage], AgentInfo], Awaitable[ModelResponse]]:
    """A model that answers through pydantic-ai's output tool (``output_type``), as most do."""

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        index = len(requests)
        requests.append(shown(messages))
        if during and index in during:
            await during[index]()
        call = ToolCallPart(info.output_tools[0].name, {"value": index}, f"out{index}")
        return ModelResponse(parts=[call])

    return model


def test_a_structured_answer_over_two_turns_is_replayed_as_the_model_saw_it() -> None:
    requests: list[Seen] = []
    log: list[Any] = []

    async def main() -> None:
        agent = Agent(FunctionModel(structured(requests)), output_type=Answer)
        async with AsyncOwner(open_store("memory:"), "s", AgentRunner(agent)) as owner:
            await owner.prompt("first").stored()
            assert await owner.wait_idle(WAIT)
            await owner.prompt("second").stored()
            assert await owner.wait_idle(WAIT)
            log.extend(await events_so_far(owner))

    asyncio.run(main())
    assert len(requests) == 2
    assert not any("interrupted" in text for _, text in requests[1])
    assert_each_request_is_in_the_log(log, requests)


def test_a_steer_at_a_structured_answer_follows_the_output_tools_return() -> None:
    requests: list[Seen] = []
    log: list[Any] = []
    holder: dict[str, AsyncOwner] = {}

    async def steer() -> None:
        await holder["owner"].steer("one more thing")

    async def main() -> None:
        agent = Agent(FunctionModel(structured(requests, during={0: steer})), output_type=Answer)
        async with AsyncOwner(open_store("memory:"), "s", AgentRunner(agent)) as owner:
            holder["owner"] = owner
            await owner.prompt("first").stored()
            assert await owner.wait_idle(WAIT)
            log.extend(await events_so_far(owner))

    asyncio.run(main())
    assert len(requests) == 2 and requests[1][-1] == ("user", "one more thing")
    assert_each_request_is_in_the_log(log, requests)


def test_a_call_an_older_log_left_unanswered_is_recorded_as_the_model_is_shown_it() -> None:
    local = LocalSession()
    for event in (TurnStarted(turn=1, reason="wake"), StepStarted(turn=1, step=1),
                  ModelReplied(turn=1, step=1, message=Message.assistant(
                      tool_calls=[ToolCall("c9", "work")])),
                  ToolCalled(turn=1, step=1, call=ToolCall("c9", "work")),
                  StepEnded(turn=1, step=1), TurnEnded(turn=1, steps=1, reason="cancelled")):
        local.append(event)
    local.followup("go on")
    script = Script("ok")

    async def turn() -> None:
        async for _ in AgentRunner(make_agent(script), offload=False).arun_turn(local):
            pass

    asyncio.run(turn())
    assert script.requests[0][:2] == [("call", "work"), ("tool", INTERRUPTED_TOOL_RETURN_CONTENT)]
    assert_each_request_is_in_the_log(list(local.events), script.requests)


def test_a_thread_that_stops_reading_mid_request_ends_the_turn_at_once() -> None:
    import threading

    asked = threading.Event()

    async def stuck(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.set()
        await asyncio.Event().wait()  # a model request that would never end by itself
        raise AssertionError("unreachable")

    local = LocalSession()
    local.followup("go")
    stream = AgentRunner(Agent(FunctionModel(stuck)), offload=False).run_turn(local)
    assert type(next(stream)).__name__ == "TurnStarted"
    assert asked.wait(WAIT)
    closer = threading.Thread(target=stream.close, daemon=True)  # type: ignore[attr-defined]
    closer.start()
    closer.join(WAIT)
    assert not closer.is_alive(), "closing the stream waited for the model"
    ended = local.events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "cancelled"
    assert local.session == replay(local.events)


def test_a_turn_cancelled_while_it_opens_is_still_ended() -> None:
    import threading

    class SlowOpen(LocalSession):
        """A port whose calls run on a thread pool, and whose opening append waits at a gate."""

        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            super().__init__()
            self.loop, self.gate, self.opening = loop, threading.Event(), asyncio.Event()

        def call_io(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
            return self.loop.run_in_executor(None, fn, *args)

        def commit(self, change: Any) -> Any:
            if not self.gate.is_set():
                self.loop.call_soon_threadsafe(self.opening.set)
                self.gate.wait(WAIT)
            return super().commit(change)

    async def main() -> SlowOpen:
        port = SlowOpen(asyncio.get_running_loop())
        port.followup("go")

        async def consume() -> None:
            async for _ in AgentRunner(make_agent(Script("ok"))).arun_turn(port):
                pass

        task = asyncio.ensure_future(consume())
        await port.opening.wait()
        task.cancel()
        await asyncio.wait({task}, timeout=0.2)
        port.gate.set()  # the opening is recorded after the cancel ...
        with pytest.raises(asyncio.CancelledError):
            await task
        return port

    port = asyncio.run(main())
    ended = port.events[-1]  # ... and the turn it opened is ended
    assert isinstance(ended, TurnEnded) and ended.reason == "cancelled"
    assert not port.session.running


def test_a_consumer_that_stops_reading_at_the_turns_first_event_still_ends_it() -> None:
    local = LocalSession()
    local.followup("go")

    async def main() -> None:
        stream = AgentRunner(make_agent(Script("ok")), offload=False).arun_turn(local)
        first = await anext(stream)  # type: ignore[call-overload]
        assert isinstance(first, TurnStarted)
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    ended = local.events[-1]
    assert isinstance(ended, TurnEnded) and ended.reason == "cancelled"
    assert not local.session.running and local.session == replay(local.events)


# -- what pydantic-ai is given --------------------------------------------------------------------


def test_the_agents_system_prompt_and_instructions_reach_the_model_on_every_turn() -> None:
    seen: list[tuple[list[str], str | None]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(([p.part_kind for m in messages for p in m.parts], info.instructions))
        return ModelResponse(parts=[TextPart("ok")])

    agent = Agent(FunctionModel(model), system_prompt="Never delete anything.",
                  instructions="Be brief.")
    asyncio.run(agent.run("go"))
    bare = seen.pop()
    assert bare == (["system-prompt", "user-prompt"], "Be brief.")
    local = LocalSession()

    async def turn() -> None:
        async for _ in AgentRunner(agent, offload=False).arun_turn(local):
            pass

    for prompt in ("first", "second"):
        local.followup(prompt)
        asyncio.run(turn())
    assert seen == [bare, (["system-prompt", "user-prompt", "text", "user-prompt"], "Be brief.")]
    # Configuration, not conversation: the log holds the conversation the model saw after it.
    assert [m.content for m in local.session.transcript] == ["first", "ok", "second", "ok"]


@pytest.mark.parametrize("role", ["tool", "assistant"])
def test_a_message_pydantic_ai_cannot_be_given_as_sent_is_refused_naming_its_role(role: str) -> None:
    runner = AgentRunner(Agent(FunctionModel(Script())))
    message = Message.tool("42 lines", "c1") if role == "tool" else Message.assistant("done")
    with pytest.raises(ValueError, match=f"cannot deliver a '{role}' message"):
        runner.check_message(message)
    runner.check_message(Message.user("go"))  # what it can deliver passes
    runner.check_message(Message.system("be brief"))


@pytest.mark.parametrize("role", ["tool", "assistant"])
def test_an_owner_refuses_at_send_what_its_agent_runner_cannot_deliver(role: str) -> None:
    message = Message.tool("42 lines", "c1") if role == "tool" else Message.assistant("done")
    store = open_store("memory:")
    with (Owner(store, "s", AgentRunner(Agent(FunctionModel(Script())))) as owner,
          pytest.raises(ValueError, match=f"cannot deliver a '{role}' message")):
        owner.steer(message)
    assert list(store.read("s")) == []  # nothing recorded

    async def main() -> None:
        async with AsyncOwner(store, "a", AgentRunner(Agent(FunctionModel(Script())))) as owner:
            with pytest.raises(ValueError, match=f"cannot deliver a '{role}' message"):
                await owner.inject(message)  # (an AsyncOwner's send raises where awaited)
            assert owner.session.version == 0

    asyncio.run(main())


@pytest.mark.parametrize("face", ["Owner", "AsyncOwner"])
def test_boundary_subscribers_hear_an_agent_runners_boundaries_and_a_steer_joins_that_claim(
        face: str) -> None:
    script = Script("tool", "done")
    heard: list[tuple[str, int]] = []
    holder: dict[str, Any] = {}

    def at(boundary: Any) -> None:
        heard.append((boundary.kind, boundary.turn))
        if len(heard) == 2:  # the opening's step claim: a steer sent here is in it
            holder["owner"].steer("heads up")

    store = open_store("memory:")
    if face == "Owner":
        with Owner(store, "s", AgentRunner(make_agent(script))) as owner:
            holder["owner"] = owner
            owner.on_boundary(at)
            owner.prompt("go")
            assert owner.wait_idle(WAIT)
    else:
        async def main() -> None:
            async with AsyncOwner(store, "s", AgentRunner(make_agent(script))) as owner:
                holder["owner"] = owner
                owner.on_boundary(at)
                await owner.prompt("go").stored()
                assert await owner.wait_idle(WAIT)

        asyncio.run(main())
    assert heard == [("turn_opening", 1), ("step", 1), ("step", 1), ("stop", 1),
                     ("turn_ended", 1)]
    assert script.requests[0] == [("user", "go"), ("user", "heads up")]
    assert turns(list(store.read("s"))) == 1


# -- results and per-prompt options ----------------------------------------------------------------


def test_a_prompts_result_holds_the_typed_output_and_usage_also_after_a_restart() -> None:
    requests: list[Seen] = []
    store = open_store("memory:")

    def runner() -> AgentRunner:
        return AgentRunner(Agent(FunctionModel(structured(requests)), output_type=Answer))

    async def main() -> Any:
        async with AsyncOwner(store, "s", runner()) as owner:
            return await owner.prompt("how many?")

    result = asyncio.run(main())
    assert result.output == Answer(value=0)  # typed, not the output tool's arguments
    assert result.usage is not None and result.usage["requests"] == 1
    assert result.usage["input_tokens"] > 0  # FunctionModel estimates its tokens
    (ended,) = [e for e in store.read("s") if isinstance(e, TurnEnded)]
    assert ended.output == {"value": 0} and ended.usage == result.usage  # in the log

    with Owner(store, "s", runner()) as again:  # a new owner reads it back, typed again
        assert again.turn_result(1) == result


def test_a_text_answers_output_is_its_text_and_not_recorded_twice() -> None:
    store = open_store("memory:")
    with Owner(store, "s", AgentRunner(make_agent(Script("hello there")))) as owner:
        result = owner.prompt("hi").result(timeout=WAIT)
    assert result.output == result.text == "hello there"
    (ended,) = [e for e in store.read("s") if isinstance(e, TurnEnded)]
    assert ended.output is None


def test_deps_and_model_settings_given_with_a_prompt_reach_that_turns_run() -> None:
    seen: list[tuple[str | None, Any]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append((info.instructions, (info.model_settings or {}).get("temperature")))
        return ModelResponse(parts=[TextPart("ok")])

    agent: Agent[str, str] = Agent(FunctionModel(model), deps_type=str)

    @agent.instructions
    def who(ctx: RunContext[str]) -> str:
        return f"The user is {ctx.deps}."

    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s",
                              AgentRunner(agent, deps="nobody")) as owner:
            await owner.prompt("hi", deps="ada", model_settings={"temperature": 0.25})
            await owner.prompt("again", deps="grace")
            await owner.prompt("and?")  # the runner's own deps again

    asyncio.run(main())
    assert seen == [("The user is ada.", 0.25), ("The user is grace.", None),
                    ("The user is nobody.", None)]


def test_an_option_agent_runner_sets_itself_is_refused_at_send() -> None:
    store = open_store("memory:")
    with (Owner(store, "s", AgentRunner(make_agent(Script()))) as owner,
          pytest.raises(TypeError, match="sets message_history itself")):
        owner.prompt("hi", message_history=[])
    assert list(store.read("s")) == []
