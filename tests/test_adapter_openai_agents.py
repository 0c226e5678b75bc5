"""The OpenAI Agents SDK adapter with the real SDK and its own scripted model (no network): what
each model call shows, what the log keeps, and the owners, the command line and ``serve`` around
it. The rulings themselves run through it in ``tests/test_rulings.py``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, RunContextWrapper, RunHooks, SQLiteSession, function_tool
from agents.testing import ModelCall
from agents.usage import Usage
from pydantic import BaseModel

from nous_inbox import Message, replay
from nous_inbox.adapters.openai_agents import AgentRunner
from nous_inbox.adapters.openai_agents.transcript import to_input_items
from nous_inbox.events import ModelReplied, ModelRequested, TurnEnded
from nous_inbox.owner import AsyncOwner, Owner, TurnCancelled
from nous_inbox.runner.deltas import TextDelta
from nous_inbox.runner.port import LocalSession
from nous_inbox.store import open_store
from tests.openai_agents_kit import Seen, reply_with, scripted_agent, tool

WAIT = 20.0


def pairs_of_transcript(transcript: Any) -> Seen:
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
    """A model that makes ``tools`` tool calls, then answers with the last thing said; it keeps
    what each call showed. ``during[n]`` runs inside tool call ``n``."""

    def __init__(self, tools: int, during: dict[int, Any] | None = None) -> None:
        self.tools = tools
        self.during = during or {}
        self.shown: list[Seen] = []

    def reply(self, seen: Seen, call: ModelCall) -> list[Any]:
        self.shown.append(seen)
        n = len(self.shown) - 1
        if n < self.tools:
            return reply_with("tool", n)
        return reply_with(f"heard: {seen[-1][1]}", n)

    def agent(self, **kwargs: Any) -> Agent[Any]:
        async def work(n: int) -> str:
            """Do a piece of work."""
            if n in self.during:
                self.during[n]()
            return f"result {n}"

        return scripted_agent(self.reply, tools=[tool(work)], **kwargs)


def run_local(runner: AgentRunner, local: LocalSession) -> list[Any]:
    async def go() -> list[Any]:
        return [event async for event in runner.arun_turn(local)]

    return asyncio.run(go())


def test_a_delivered_message_is_shown_again_at_its_place_on_every_later_call() -> None:
    # The SDK rebuilds each call's input from the run's input and what the run generated, and
    # keeps nothing the filter added: the steer delivered at the second call must be placed
    # again, after the first tool's result, on the third and fourth.
    local = LocalSession()
    script = Script(3, during={0: lambda: local.steer("check b.py too")})
    local.followup("fix a.py")
    run_local(AgentRunner(script.agent(), offload=False, tracing_disabled=True), local)
    steer_at = [("user", "fix a.py"), ("call", "work"), ("tool", "result 0"),
                ("user", "check b.py too")]
    assert script.shown[1] == steer_at
    assert script.shown[2][:4] == steer_at and script.shown[3][:4] == steer_at
    assert script.shown[3].count(("user", "check b.py too")) == 1


def test_the_replayed_transcript_is_what_the_model_saw() -> None:
    local = LocalSession()
    script = Script(2, during={0: lambda: local.inject("fyi: ci is slow"),
                               1: lambda: local.steer("then summarize")})
    local.followup("go")
    run_local(AgentRunner(script.agent(), offload=False, tracing_disabled=True), local)
    transcript = replay(local.events).transcript
    assert pairs_of_transcript(transcript) == [*script.shown[-1], ("text", "heard: then summarize")]


class Count(BaseModel):
    n: int


def test_a_prompts_result_has_the_typed_output_usage_and_its_own_context(tmp_path: Path) -> None:
    # The run's context (the SDK's context=) is given per prompt; final_output comes back typed,
    # live and after a restart, and the usage is the SDK's.
    seen_context: list[Any] = []

    @function_tool
    def asker(ctx: RunContextWrapper[dict[str, str]]) -> str:
        """Who is asking."""
        seen_context.append(ctx.context)
        return ctx.context["who"]

    def reply(seen: Seen, call: ModelCall) -> list[Any]:
        if seen[-1][0] == "user":
            return reply_with("tool", 0, tool="asker")
        return reply_with('{"n": 3}', 1)

    agent = scripted_agent(reply, tools=[asker], output_type=Count)
    store = open_store(f"sqlite:{tmp_path / 'log.db'}")

    async def main() -> tuple[Any, Any]:
        async with AsyncOwner(store, "s", AgentRunner(agent, tracing_disabled=True)) as owner:
            result = await owner.prompt("how many?", context={"who": "ada"})
        async with AsyncOwner(store, "s", AgentRunner(agent, tracing_disabled=True)) as again:
            logged = await again.turn_result(result.turn)
        return result, logged

    result, logged = asyncio.run(main())
    assert result.output == Count(n=3) and logged.output == Count(n=3)
    assert result.usage["requests"] == 2
    assert seen_context == [{"who": "ada"}]
    store.close()


def test_usage_sums_every_run_of_a_turn() -> None:
    local = LocalSession()
    script = Script(0)
    script.during = {}
    agent = script.agent()
    agent.model.set_default_usage(Usage(requests=1, input_tokens=10, output_tokens=2,  # type: ignore[union-attr]
                                        total_tokens=12))
    local.followup("go")
    events = run_local(AgentRunner(agent, offload=False, tracing_disabled=True), local)
    assert events[-1].usage == {"requests": 1, "input_tokens": 10, "output_tokens": 2,
                                "total_tokens": 12}


def test_a_steer_from_the_command_line_reaches_the_running_agent_at_its_next_call(
        tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'agent.db'}"

    def steer_from_another_terminal() -> None:
        subprocess.run([sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s",
                        "skip the slow tests"], check=True, timeout=60)

    script = Script(1, during={0: steer_from_another_terminal})

    async def main() -> list[Message]:
        async with AsyncOwner(open_store(url), "s", AgentRunner(script.agent(),
                                                                tracing_disabled=True)) as owner:
            await owner.prompt("make the tests pass")
            return list(owner.transcript)

    transcript = asyncio.run(main())
    assert script.shown[1][-2:] == [("tool", "result 0"), ("user", "skip the slow tests")]
    assert transcript[-1].content == "heard: skip the slow tests"
    with open_store(url, read_only=True) as store:
        assert list(replay(store.read("s")).transcript) == transcript


def test_a_threaded_owner_runs_it_and_a_cancel_stops_it_before_its_next_call() -> None:
    store = open_store("memory:")
    working = threading.Event()
    release = threading.Event()

    def hold() -> None:
        working.set()
        assert release.wait(WAIT)

    script = Script(3, during={0: hold})
    with Owner(store, "s", AgentRunner(script.agent(), tracing_disabled=True)) as owner:
        first = owner.prompt("go")
        assert working.wait(WAIT)
        assert owner.cancel()
        release.set()
        with pytest.raises(TurnCancelled):
            first.result(timeout=WAIT)
        assert len(script.shown) == 1  # no call after the cancel
        assert owner.transcript[-1].content == "result 0"  # the tool that ran is kept
        second = owner.prompt("again")
        assert second.result(timeout=WAIT).text.startswith("heard: ")
    ends = [(e.turn, e.reason) for e in store.read("s") if isinstance(e, TurnEnded)]
    assert ends[0] == (1, "cancelled")


@pytest.mark.parametrize(("options", "says"), [
    ({"session": object()}, "session must be an agents Session"),
    ({"hooks": object()}, "hooks must be an agents.RunHooks"),
    ({"conversation_id": "conv_1"}, "AgentRunner sets conversation_id itself"),
    ({"run_config": RunConfig(call_model_input_filter=lambda data: data.model_data)},
     "run_config.call_model_input_filter is the adapter's own"),
    ({"run_config": {"tracing_disabled": True}}, "run_config must be an agents.RunConfig"),
])
def test_run_options_it_sets_itself_are_refused_naming_them(options: dict[str, Any],
                                                            says: str) -> None:
    agent = Script(0).agent()
    with pytest.raises(TypeError, match=says.replace("(", r"\(")):
        AgentRunner(agent, **options)

    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", AgentRunner(agent)) as owner:
            with pytest.raises(TypeError, match=says.replace("(", r"\(")):
                await owner.prompt("go", **options)
            assert list(owner.transcript) == [] and owner.inbox.count() == 0  # nothing written

    asyncio.run(main())


def test_a_tool_or_assistant_message_is_refused_at_the_send() -> None:
    async def main() -> None:
        agent = Script(0).agent()
        async with AsyncOwner(open_store("memory:"), "s", AgentRunner(agent)) as owner:
            for message in (Message.tool("42", "c1"), Message.assistant("hi")):
                with pytest.raises(ValueError, match=f"cannot deliver a '{message.role}'"):
                    await owner.steer(message)
            assert owner.inbox.count() == 0

    asyncio.run(main())


def test_the_models_text_reaches_a_deltas_reader_before_the_reply_and_is_never_logged() -> None:
    async def main() -> None:
        store = open_store("memory:")
        agent = Script(0).agent()
        async with AsyncOwner(store, "s", AgentRunner(agent, tracing_disabled=True)) as owner:
            await owner.inject("a note")  # an injection never wakes: the reader's first event
            reader = owner.events(deltas=True)
            seen: list[Any] = [await anext(reader)]  # listening from here on
            prompt = await owner.prompt("hello")
            async for item in reader:
                seen.append(item)
                if type(item) is TurnEnded:
                    break
            reply = prompt.text
        deltas = [item for item in seen if type(item) is TextDelta]
        assert "".join(d.text for d in deltas) == reply and reply.startswith("heard: ")
        kinds = [type(item) for item in seen]
        assert kinds.index(ModelRequested) < kinds.index(TextDelta)
        assert max(i for i, k in enumerate(kinds) if k is TextDelta) < kinds.index(ModelReplied)
        assert [item for item in seen if type(item) is not TextDelta] == list(store.read("s"))

    asyncio.run(main())


def test_a_threaded_owners_follow_reader_gets_the_models_text_before_the_reply() -> None:
    store = open_store("memory:")
    owner = Owner(store, "s", AgentRunner(Script(0).agent(), tracing_disabled=True))
    try:
        owner.inject("a note")  # an injection never wakes: the reader's first event
        reader = owner.follow(deltas=True, timeout=WAIT)
        seen: list[Any] = [next(reader)]  # listening from here on
        reply = owner.prompt("hello").result(timeout=WAIT).text
        for item in reader:
            seen.append(item)
            if type(item) is TurnEnded:
                break
    finally:
        owner.close()
    kinds = [type(item) for item in seen]
    assert "".join(item.text for item in seen if type(item) is TextDelta) == reply
    assert max(i for i, k in enumerate(kinds) if k is TextDelta) < kinds.index(ModelReplied)
    assert [item for item in seen if type(item) is not TextDelta] == list(store.read("s"))


def test_an_sdk_session_holds_every_delivered_message_in_place_after_each_turn() -> None:
    # The SDK would build its Session from what its runs generated, without the steer the
    # inbox delivered mid-run; the adapter mirrors the log's transcript into it instead.
    memory = SQLiteSession("s")
    runner = AgentRunner(Script(0).agent(), tracing_disabled=True)

    async def main() -> None:
        script = Script(1)
        async with AsyncOwner(open_store("memory:"), "s", AgentRunner(
                script.agent(), tracing_disabled=True, session=memory)) as owner:
            script.during[0] = lambda: owner.steer("check b.py too")
            await owner.prompt("fix a.py")
            held = await memory.get_items()
            assert held == to_input_items(owner.transcript)
            steer_at = [item.get("content") or item.get("type") for item in held]
            assert steer_at == ["fix a.py", "function_call", "function_call_output",
                                "check b.py too", "heard: check b.py too"]
            await owner.prompt("and c.py", session=memory)  # a prompt's own: the same mirror
            assert await memory.get_items() == to_input_items(owner.transcript)
            await memory.add_items([{"role": "user", "content": "written by hand"}])
            await owner.prompt("last")  # a session that strayed from the log is put back
            assert await memory.get_items() == to_input_items(owner.transcript)

    asyncio.run(main())
    assert runner.run_kwargs.get("session") is None


def test_the_users_run_hooks_hear_the_run_beside_the_adapters() -> None:
    heard: list[str] = []

    class Mine(RunHooks[Any]):
        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            heard.append("reply")

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            heard.append(f"tool: {result}")

    local = LocalSession()
    local.followup("go")
    run_local(AgentRunner(Script(1).agent(), offload=False, tracing_disabled=True,
                          hooks=Mine()), local)
    assert heard == ["reply", "tool: result 0", "reply"]
    assert [m.role for m in local.session.transcript] == ["user", "assistant", "tool", "assistant"]


def test_a_handoff_is_recorded_as_the_call_and_result_the_model_saw() -> None:
    specialist = scripted_agent(lambda seen, call: reply_with("the specialist answers", 0))
    specialist.name = "specialist"

    def triage(seen: Seen, call: ModelCall) -> list[Any]:
        return reply_with("tool", 0, tool="transfer_to_specialist")

    agent = scripted_agent(triage, handoffs=[specialist])
    local = LocalSession()
    local.followup("help")
    run_local(AgentRunner(agent, offload=False, tracing_disabled=True), local)
    assert [m.role for m in local.session.transcript] == ["user", "assistant", "tool", "assistant"]
    assert local.session.transcript[-1].content == "the specialist answers"


def test_serve_hosts_it(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    from tests.helpers import wait_until
    from tests.test_web_serve import start_serve

    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    server = start_serve(url, "--agent", "tests.openai_agents_kit:served_agent")
    try:
        with server.client() as client:
            sent = client.post("/api/sessions/s1/messages",
                               json={"mode": "prompt", "text": "survey the logs"})
            assert sent.status_code == 202

            def answered() -> list[str]:
                events = store_events(url)
                if not any(isinstance(e, TurnEnded) for e in events):
                    return []
                return [m.content for m in replay(events).transcript]

            said = wait_until(answered, what="the hosted agent answered")
        assert said == ["survey the logs", "", "3 errors", "heard: 3 errors"]
        assert server.stop() == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def store_events(url: str) -> list[Any]:
    with open_store(url, read_only=True) as store:
        return list(store.read("s1"))


def test_a_run_stopped_inside_a_tool_answers_that_call_as_interrupted() -> None:
    # An owner closing past its timeout, or serve stopping, cancels the turn's task: the SDK's
    # run stops at once, and the tool it cut off is answered as interrupted (it started; what it
    # did is unknown), so the next turn shows the model a well-formed transcript.
    local = LocalSession()
    local.followup("deploy")

    async def main() -> None:
        started = asyncio.Event()

        @function_tool
        async def deploy() -> str:
            """Deploy, for a long time."""
            started.set()
            await asyncio.Event().wait()
            return "never"

        def reply(seen: Seen, call: ModelCall) -> list[Any]:
            return reply_with("tool", 0, tool="deploy")

        runner = AgentRunner(scripted_agent(reply, tools=[deploy]), offload=False,
                             tracing_disabled=True)

        async def turn() -> None:
            async for _ in runner.arun_turn(local):
                pass

        task = asyncio.ensure_future(turn())
        await asyncio.wait_for(started.wait(), WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    last = local.session.transcript[-1]
    assert last.role == "tool" and last.content.startswith("interrupted: the turn was cancelled")
    ends = [e.reason for e in local.events if isinstance(e, TurnEnded)]
    assert ends == ["cancelled"] and replay(local.events) == local.session
