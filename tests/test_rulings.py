"""The loop's rulings, run by every driver: the built-in ``Runner``, the pydantic-ai adapter, the
LangGraph adapter, the OpenAI Agents SDK adapter and the aimu adapter.

Each test is one ruling as a scripted turn: the model's replies are scripted, a message is sent
while the model thinks or a tool runs (a person typing while the agent works, no sleeps), and the
test reads what each request showed the model and how the turn ended. Every driver asks the loop
at every boundary (the runner and the pydantic-ai adapter feed it each happening; the aimu
adapter asks it what a drain claims, ``round_claims``, and whether that is worth a round,
``worth_a_round``), so each must pass the same test. A ruling that does not apply to a driver as
written names it, with why, in its ``drivers(...)`` (and where what the driver does instead is
tested). Where pydantic-ai's own loop decides first, a test at the end says so. Under an owner,
the drivers that run on one must let its boundary subscribers speak before each claim.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nous_inbox import Message, ToolCall, replay
from nous_inbox.adapters.aimu import AimuInbox, stream_name
from nous_inbox.adapters.openai_agents import AgentRunner as SdkRunner
from nous_inbox.adapters.pydantic_ai import AgentRunner
from nous_inbox.commands import ToolSpec
from nous_inbox.events import Event, TurnEnded
from nous_inbox.inbox import Inbox
from nous_inbox.loop import CONTINUATION
from nous_inbox.owner import AsyncOwner
from nous_inbox.runner import Runner
from nous_inbox.runner.port import LocalSession
from nous_inbox.store import open_store
from tests.aimu_kit import aimu_kit, call
from tests.openai_agents_kit import reply_with, scripted_agent, tool

DRIVERS = ("runner", "pydantic-ai", "langgraph", "openai-agents", "aimu")
AGENT = "worker"  # the aimu agent's name, and its address in the AimuInbox


def drivers(**not_for: str) -> list[str]:
    """The drivers a ruling's test runs through: every one but those ``not_for`` names (by
    name, ``pydantic_ai`` for ``"pydantic-ai"``), each with why the ruling as written does not
    apply to it."""
    names = {driver.replace("-", "_"): driver for driver in DRIVERS}
    assert set(not_for) <= set(names), f"no driver {sorted(set(not_for) - set(names))}"
    assert all(why.strip() for why in not_for.values()), "each driver left out says why"
    return [driver for name, driver in names.items() if name not in not_for]


# Why a ruling, as a test writes it, does not apply to a driver (and where its own way is tested).
AIMU_OPENS_WITH_ITS_TASK = (
    "aimu makes its first request with the run's task before it first drains, so what waits "
    "reaches the run at its first round boundary, after the first reply (test_compat_aimu)")
AIMU_CANNOT_NAME_ITS_BOUNDARIES = (
    "aimu does not say at which boundary it drains, so the loop's claims there are plain "
    "(round_claims): an injection pending at a would-be final answer extends the run as a steer "
    "does (test_compat_aimu)")
AIMU_DELIVERS_ONE_MESSAGE_A_ROUND = (
    "aimu makes a round of whatever a drain hands it, in place of its nudge, so a blank message "
    "is not claimed on its own (worth_a_round): it waits for one worth a round (test_compat_aimu)")
AIMU_HAS_ITS_OWN_BUDGET = (
    "aimu bounds a run with its own round budget (max_iterations), refilled by a delivery and "
    "capped as ruling 5 says, and ends a spent one with a wrap-up request of its own "
    "(test_compat_aimu)")
AIMU_RECORDS_ONLY_ITS_QUEUES = (
    "aimu keeps the run's transcript itself: its inbox records the sends and claims of each "
    "address, no turn or step of a run")
AIMU_GUARDS_ITS_DRAIN = (
    "aimu calls the drain itself, and logs one that fails or answers in the wrong shape and "
    "goes on without it (test_compat_aimu)")
AIMU_RUNS_ON_NO_OWNER = "an AimuInbox is no owner's port: there are no boundary subscribers"
AIMU_HAS_NO_CANCEL = "aimu offers no way to cancel a run in progress"
LANGGRAPH_BOUNDS_ITS_OWN_STEPS = (
    "a graph bounds its own steps (its recursion_limit): the budget counts only the requests "
    "the inbox adds (test_under_langgraph_the_graphs_own_requests_never_spend_the_budget)")
PYDANTIC_AI_BOUNDS_ITS_OWN_REQUESTS = (
    "pydantic-ai bounds its own requests (usage_limits): its budget counts only the requests "
    "the inbox adds (test_under_pydantic_ai_the_agents_own_requests_never_spend_the_budget)")
OPENAI_AGENTS_BOUNDS_ITS_OWN_CALLS = (
    "the Agents SDK bounds its own model calls (max_turns): its budget counts only the calls "
    "the inbox adds (test_under_the_agents_sdk_the_agents_own_calls_never_spend_the_budget)")

Seen = list[tuple[str, str]]


class Host(Protocol):
    """Where a person sends while the agent works: the session a runner drives, or the
    AimuInbox an aimu agent drains."""

    def steer(self, text: str) -> object: ...
    def inject(self, text: str) -> object: ...
    def followup(self, text: str) -> object: ...


Action = Callable[[Host], object]


def pairs_of_messages(transcript: Sequence[Message]) -> Seen:
    out: Seen = []
    for m in transcript:
        if m.role == "assistant":
            if m.content:
                out.append(("text", m.content))
            out.extend(("call", c.name) for c in m.tool_calls)
        else:
            out.append((m.role, m.content))
    return out


def pairs_of_requests(messages: list[ModelMessage]) -> Seen:
    out: Seen = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                out.append(("user", str(part.content)))
            elif isinstance(part, SystemPromptPart):
                out.append(("system", part.content))
            elif isinstance(part, ToolReturnPart):
                out.append(("tool", part.model_response_str()))
            elif isinstance(part, RetryPromptPart):
                out.append(("retry", part.model_response()))
            elif isinstance(part, TextPart):
                out.append(("text", part.content))
            elif isinstance(part, ToolCallPart):
                out.append(("call", part.tool_name))
    return out


def pairs_of_aimu_request(messages: list[dict[str, Any]]) -> Seen:
    out: Seen = []
    for message in messages:
        if message["role"] == "assistant":
            if message.get("content"):
                out.append(("text", message["content"]))
            out.extend(("call", c["function"]["name"]) for c in message.get("tool_calls") or ())
        else:
            out.append((message["role"], message.get("content") or ""))
    return out


class AimuHost:
    """A person's sends to an aimu agent, through an ``AimuInbox`` on a store. Before its run, a
    followup is the person's prompt, and so the run's task: an aimu run opens with its task, and
    the inbox's followup waits for the next run. Everything else is the inbox's."""

    def __init__(self) -> None:
        self.store = open_store("memory:")
        self.box = AimuInbox(self.store)
        self.task: list[str] = []
        self.running = False

    def steer(self, text: str) -> None:
        self.box.steer(text, agent=AGENT)

    def inject(self, text: str) -> None:
        self.box.inject(text, agent=AGENT)

    def followup(self, text: str) -> None:
        if self.running:
            self.box.followup(text, agent=AGENT)
        else:
            self.task.append(text)


class Turn:
    """One scripted turn of ``driver``: ``"tool"`` asks for the tool ``work``, any other string is
    the reply's text. ``thinking[i]`` runs while request ``i`` is made, ``working[i]`` while tool
    call ``i`` runs; each is handed the host to send to. After :meth:`run`: ``requests`` (what
    each request showed), ``ended`` (how the turn ended), ``nudges`` (how many of the driver's
    own nudges it made), and ``events`` (what the log drivers recorded)."""

    def __init__(self, driver: str, *replies: str, thinking: dict[int, Action] | None = None,
                 working: dict[int, Action] | None = None) -> None:
        self.name = driver
        self.replies = list(replies)
        self.thinking = thinking or {}
        self.working = working or {}
        self.requests: list[Seen] = []
        self.local = LocalSession()  # the session the runner and the pydantic-ai adapter drive
        self.aimu = AimuHost() if driver == "aimu" else None
        self.host: Host = self.aimu if self.aimu is not None else self.local
        self.cancel = asyncio.Event()
        self.events: list[Event] = []
        self.ended = ""
        self.nudges = 0

    @property
    def inbox(self) -> Inbox:
        """What waits for the agent now: the session's inbox, or the aimu agent's address."""
        return self.local.session.inbox if self.aimu is None else self.aimu.box.inbox(AGENT)

    def _next(self, seen: Seen) -> str:
        index = len(self.requests)
        self.requests.append(seen)
        if index in self.thinking:
            self.thinking[index](self.host)
        return self.replies[index] if index < len(self.replies) else "done"

    async def work(self, n: int) -> str:
        """Do a piece of work."""
        if n in self.working:
            self.working[n](self.host)
        return f"result {n}"

    def driver(self, max_steps: int = 10) -> Any:
        """The runner, the pydantic-ai adapter or the Agents SDK adapter over this script."""

        async def runner_model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
            reply = self._next(pairs_of_messages(transcript))
            n = len(self.requests) - 1
            if reply == "tool":
                return Message.assistant(tool_calls=[ToolCall(f"c{n}", "work", {"n": n})])
            return Message.assistant(reply)

        async def pydantic_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            reply = self._next(pairs_of_requests(messages))
            n = len(self.requests) - 1
            if reply == "tool":
                return ModelResponse(parts=[ToolCallPart("work", {"n": n}, f"c{n}")])
            return ModelResponse(parts=[TextPart(reply)])

        if self.name == "runner":
            return Runner(runner_model, [self.work], max_steps=max_steps, offload=False)
        if self.name == "langgraph":
            return self._langgraph(max_steps)
        if self.name == "openai-agents":
            def sdk_reply(seen: Seen, call: object) -> list[Any]:
                reply = self._next(seen)
                return reply_with(reply, len(self.requests) - 1)

            return SdkRunner(scripted_agent(sdk_reply, tools=[tool(self.work)]),
                             max_steps=max_steps, offload=False, tracing_disabled=True)
        assert self.name == "pydantic-ai", self.name
        agent: Agent[None, str] = Agent(FunctionModel(pydantic_model))
        agent.tool_plain(self.work)
        return AgentRunner(agent, max_steps=max_steps, offload=False)

    def _langgraph(self, max_steps: int) -> Any:
        pytest.importorskip("langgraph")
        pytest.importorskip("langchain")
        from langchain.agents import create_agent
        from langchain_core.messages import AIMessage

        from nous_inbox.adapters.langgraph import GraphRunner, InboxMiddleware
        from tests.langgraph_kit import ScriptedChatModel, shown
        from tests.langgraph_kit import call as lc_call

        def reply(messages: list[Any]) -> Any:
            text = self._next(shown(messages))
            n = len(self.requests) - 1
            return lc_call("work", f"c{n}", n=n) if text == "tool" else AIMessage(text)

        def work(n: int) -> str:
            """Do a piece of work."""
            if n in self.working:
                self.working[n](self.host)
            return f"result {n}"

        graph = create_agent(ScriptedChatModel(reply=reply), [work],
                             middleware=[InboxMiddleware()])
        return GraphRunner(graph, max_steps=max_steps, offload=False)

    def run(self, max_steps: int = 10, port: object = None) -> None:
        if self.aimu is not None:
            return self._run_aimu(self.aimu, max_steps)

        async def go() -> None:
            on = self.local if port is None else port
            async for event in self.driver(max_steps).arun_turn(on, cancel=self.cancel):
                self.events.append(event)

        try:
            asyncio.run(go())
        finally:
            recorded = self.local.events
            assert self.local.session == replay(recorded)  # the log is the session
            ends = [event.reason for event in recorded if isinstance(event, TurnEnded)]
            self.ended = ends[-1] if ends else ""
            self.nudges = kinds(self.events).count("Nudged")
        return None

    def _run_aimu(self, host: AimuHost, max_steps: int) -> None:
        kit = aimu_kit()

        def reply() -> Any:
            text = self._next(pairs_of_aimu_request(client.requests[-1]))
            return call("work", n=len(self.requests) - 1) if text == "tool" else text

        @kit.tool
        def work(n: int) -> str:
            """Do a piece of work.

            Args:
                n: which piece
            """
            if n in self.working:
                self.working[n](self.host)
            return f"result {n}"

        client = kit.Client([reply] * 64)
        finished: list[Any] = []
        # aimu nudges with its own prompt, tagged as the loop tags its own; it is given the
        # loop's words, so one test reads both.
        agent = kit.Agent(client, name=AGENT, tools=[work], inbox=host.box,
                          max_iterations=max_steps, continuation_prompt=CONTINUATION.content,
                          events=lambda event: finished.append(getattr(event, "ended_by", None)))
        host.running = True
        try:
            agent.run("\n\n".join(host.task))
        finally:
            self.ended = {"answered": "final", "wrap_up": "budget", "error": "error"}[finished[-1]]
            self.nudges = sum(1 for m in client.messages
                              if m["role"] == "user" and m.get("provenance") == "continuation")
            stream = stream_name(AGENT)  # the log is the queues
            assert replay(host.store.read(stream), stream=stream).inbox == host.box.inbox(AGENT)
        return None


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


def queued(turn: Turn) -> list[str]:
    return [m.content for m, _ in turn.inbox.entries("next_step")]


def steer(text: str) -> Action:
    return lambda host: host.steer(text)


def inject(text: str) -> Action:
    return lambda host: host.inject(text)


# -- ruling 1: claim points -----------------------------------------------------------------------


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_OPENS_WITH_ITS_TASK))
def test_a_turn_opens_with_next_turn_then_next_step_in_one_request(driver: str) -> None:
    turn = Turn(driver, "done")
    turn.host.inject("fyi: the deploy is frozen")
    turn.host.followup("tidy the logs")
    turn.run()
    assert turn.requests == [[("user", "tidy the logs"), ("user", "fyi: the deploy is frozen")]]
    assert kinds(turn.events)[:5] == ["TurnStarted", "QueueClaimed", "QueueClaimed",
                                      "StepStarted", "ModelRequested"]


@pytest.mark.parametrize("driver", drivers())
def test_a_steer_sent_during_a_tool_call_lands_after_that_tools_result(driver: str) -> None:
    turn = Turn(driver, "tool", "done", working={0: steer("check b.py too")})
    turn.host.followup("fix a.py")
    turn.run()
    assert ("user", "check b.py too") not in turn.requests[0]
    assert turn.requests[1][-2:] == [("tool", "result 0"), ("user", "check b.py too")]


@pytest.mark.parametrize("driver", drivers())
def test_a_followup_sent_mid_run_waits_for_the_next_turn(driver: str) -> None:
    turn = Turn(driver, "tool", "done", working={0: lambda host: host.followup("then deploy")})
    turn.host.followup("build")
    turn.run()
    assert turn.ended == "final"
    assert all(("user", "then deploy") not in seen for seen in turn.requests)
    assert turn.inbox.count("next_turn") == 1 and turn.inbox.worth_waking()  # a turn is owed


# -- ruling 2: the would-be final answer ----------------------------------------------------------


@pytest.mark.parametrize("driver", drivers())
def test_a_steer_pending_at_a_final_answer_extends_the_run_by_one_request(driver: str) -> None:
    turn = Turn(driver, "answer", "summary", thinking={0: steer("stop and summarize")})
    turn.host.followup("go")
    turn.run()
    assert turn.ended == "final" and len(turn.requests) == 2
    assert turn.requests[1][-2:] == [("text", "answer"), ("user", "stop and summarize")]


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_CANNOT_NAME_ITS_BOUNDARIES))
def test_an_injection_alone_at_a_final_answer_waits_for_the_next_request(driver: str) -> None:
    turn = Turn(driver, "answer", thinking={0: inject("fyi: tests are slow")})
    turn.host.followup("go")
    turn.run()
    assert turn.ended == "final"
    assert len(turn.requests) == 1 and queued(turn) == ["fyi: tests are slow"]


# -- ruling 3: a degenerate reply -----------------------------------------------------------------


@pytest.mark.parametrize("driver", drivers())
def test_after_a_blank_reply_the_loop_nudges_with_its_own_tagged_words(driver: str) -> None:
    turn = Turn(driver, " ", "back on track")
    turn.host.followup("go")
    turn.run()
    assert turn.requests[1][-1] == ("user", CONTINUATION.content)
    assert turn.nudges == 1 and turn.ended == "final"


@pytest.mark.parametrize("driver", drivers())
@pytest.mark.parametrize("send", [steer, inject])
def test_a_pending_message_replaces_the_nudge_after_a_blank_reply(
    driver: str, send: Callable[[str], Action],
) -> None:
    turn = Turn(driver, " ", "found it", thinking={0: send("try the staging log")})
    turn.host.followup("find it")
    turn.run()
    assert turn.requests[1][-1] == ("user", "try the staging log")
    assert ("user", CONTINUATION.content) not in turn.requests[1]
    assert turn.nudges == 0


# -- ruling 4: blank and invisible-only messages --------------------------------------------------


@pytest.mark.parametrize("driver", drivers())
@pytest.mark.parametrize("blank", ["  \n", "\u200b", " \ufeff\u2060 "])
def test_a_blank_steer_never_extends_a_run(driver: str, blank: str) -> None:
    turn = Turn(driver, "answer", thinking={0: steer(blank)})
    turn.host.followup("go")
    turn.run()
    assert turn.ended == "final" and len(turn.requests) == 1
    assert not turn.inbox.worth_waking()  # nor wakes a turn of its own


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_DELIVERS_ONE_MESSAGE_A_ROUND))
def test_a_blank_steer_does_not_replace_the_nudge(driver: str) -> None:
    turn = Turn(driver, " ", "back on track", thinking={0: steer("\u200b")})
    turn.host.followup("go")
    turn.run()
    assert turn.requests[1][-2:] == [("user", "\u200b"), ("user", CONTINUATION.content)]


@pytest.mark.parametrize("driver", drivers())
def test_a_blank_steer_rides_along_with_the_next_message_worth_a_round(driver: str) -> None:
    turn = Turn(driver, "tool", "tool", "done",
                working={0: steer("\u200b"), 1: steer("now the tests")})
    turn.host.followup("go")
    turn.run()
    assert any("now the tests" in text for role, text in turn.requests[2] if role == "user")
    assert turn.inbox.count() == 0  # the blank one claimed too, by then: nothing is lost


# -- ruling 5: the step budget --------------------------------------------------------------------
#
# The built-in runner is its own framework: its budget counts every request. pydantic-ai bounds
# its own requests (``usage_limits``), so under it the budget counts only the requests the inbox
# added: a run extended past its would-be final answer.


@pytest.mark.parametrize("driver", drivers(pydantic_ai=PYDANTIC_AI_BOUNDS_ITS_OWN_REQUESTS,
                                           langgraph=LANGGRAPH_BOUNDS_ITS_OWN_STEPS,
                                           openai_agents=OPENAI_AGENTS_BOUNDS_ITS_OWN_CALLS,
                                           aimu=AIMU_HAS_ITS_OWN_BUDGET))
@pytest.mark.parametrize("blank", ["  \n", "\u200b"])
def test_a_blank_steer_never_refills_the_budget(driver: str, blank: str) -> None:
    turn = Turn(driver, *["tool"] * 10, working={0: steer(blank)})
    turn.host.followup("go")
    turn.run(max_steps=2)
    assert turn.ended == "budget"
    assert len(turn.requests) == 2  # a steer with words would have bought a third
    assert ("user", blank) in turn.requests[1]  # claimed all the same, with a request made anyway


@pytest.mark.parametrize("driver", drivers(pydantic_ai=PYDANTIC_AI_BOUNDS_ITS_OWN_REQUESTS,
                                           langgraph=LANGGRAPH_BOUNDS_ITS_OWN_STEPS,
                                           openai_agents=OPENAI_AGENTS_BOUNDS_ITS_OWN_CALLS,
                                           aimu=AIMU_HAS_ITS_OWN_BUDGET))
def test_a_run_never_messaged_ends_after_max_steps_requests(driver: str) -> None:
    turn = Turn(driver, *["tool"] * 10)
    turn.host.followup("go")
    turn.run(max_steps=2)
    assert turn.ended == "budget" and len(turn.requests) == 2
    assert "Warned" not in kinds(turn.events)


@pytest.mark.parametrize("driver", drivers(pydantic_ai=PYDANTIC_AI_BOUNDS_ITS_OWN_REQUESTS,
                                           langgraph=LANGGRAPH_BOUNDS_ITS_OWN_STEPS,
                                           openai_agents=OPENAI_AGENTS_BOUNDS_ITS_OWN_CALLS,
                                           aimu=AIMU_HAS_ITS_OWN_BUDGET))
def test_the_budget_counts_from_the_last_delivered_message(driver: str) -> None:
    turn = Turn(driver, *["tool"] * 10, working={1: steer("one more file")})
    turn.host.followup("go")
    turn.run(max_steps=3)
    assert turn.ended == "budget"
    assert len(turn.requests) == 5  # steps 3, 4 and 5 are the steer's own three


@pytest.mark.parametrize("driver", drivers(pydantic_ai=PYDANTIC_AI_BOUNDS_ITS_OWN_REQUESTS,
                                           langgraph=LANGGRAPH_BOUNDS_ITS_OWN_STEPS,
                                           openai_agents=OPENAI_AGENTS_BOUNDS_ITS_OWN_CALLS,
                                           aimu=AIMU_HAS_ITS_OWN_BUDGET))
def test_refills_are_capped_with_one_warning(driver: str) -> None:
    # A source that delivers at every boundary: every tool call sends a steer.
    turn = Turn(driver, *["tool"] * 20, working={n: steer(f"more {n}") for n in range(20)})
    turn.host.followup("go")
    turn.run(max_steps=2)
    assert turn.ended == "budget" and len(turn.requests) == 4
    assert kinds(turn.events).count("Warned") == 1


def test_under_the_agents_sdk_the_agents_own_calls_never_spend_the_budget() -> None:
    # Eight tool rounds and an answer, with a budget of two: the SDK would finish this run (its
    # max_turns is 10), so the adapter does.
    turn = Turn("openai-agents", *["tool"] * 8, "all done")
    turn.host.followup("go")
    turn.run(max_steps=2)
    assert turn.ended == "final" and len(turn.requests) == 9
    assert turn.local.session.transcript[-1] == Message.assistant("all done")
    assert "Warned" not in kinds(turn.events)


def test_under_pydantic_ai_the_agents_own_requests_never_spend_the_budget() -> None:
    # Ten tool rounds and an answer, with a budget of two: pydantic-ai would finish this run
    # (its request limit is 50), so the adapter does, and no tool result is left unshown.
    turn = Turn("pydantic-ai", *["tool"] * 10, "all done")
    turn.host.followup("go")
    turn.run(max_steps=2)
    assert turn.ended == "final" and len(turn.requests) == 11
    assert turn.local.session.transcript[-1] == Message.assistant("all done")
    assert "Warned" not in kinds(turn.events)


def test_under_langgraph_the_graphs_own_requests_never_spend_the_budget() -> None:
    # The same under LangGraph, whose recursion_limit (25 steps by default) bounds the graph.
    turn = Turn("langgraph", *["tool"] * 10, "all done")
    turn.host.followup("go")
    turn.run(max_steps=2)
    assert turn.ended == "final" and len(turn.requests) == 11
    assert turn.local.session.transcript[-1] == Message.assistant("all done")
    assert "Warned" not in kinds(turn.events)


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_HAS_ITS_OWN_BUDGET))
def test_the_budget_bounds_how_far_steers_extend_a_run_with_refills_capped(driver: str) -> None:
    # A person who steers at every answer: each steer extends the run (ruling 2), until the
    # budget of two, refilled at most twice, is spent. Under the runner the first request spends
    # it too; under pydantic-ai only the requests the steers added do.
    turn = Turn(driver, *[f"answer {n}" for n in range(10)],
                thinking={n: steer(f"and {n}") for n in range(10)})
    turn.host.followup("go")
    turn.run(max_steps=2)
    assert turn.ended == "final"
    assert len(turn.requests) == {"runner": 4, "pydantic-ai": 5, "langgraph": 5,
                                  "openai-agents": 5}[driver]
    assert kinds(turn.events).count("Warned") == 1
    last = len(turn.requests) - 1
    assert queued(turn) == [f"and {last}"]  # for the owner's wake check: a turn of its own


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_RECORDS_ONLY_ITS_QUEUES))
def test_every_driver_records_the_same_boundaries(driver: str) -> None:
    def record(name: str) -> list[str]:
        turn = Turn(name, "tool", " ", "answer", "summary", working={0: inject("fyi")},
                    thinking={2: steer("summarize")})
        turn.host.followup("go")
        turn.run()
        return kinds(turn.events)

    assert record(driver) == record("runner")


# -- ruling 7: a source that misbehaves ----------------------------------------------------------


class Misbehaving:
    """A message source that is not a journal (a host's own port): its claim raises, or
    answers in a shape no claim has. It keeps the session and records as ``local`` does."""

    def __init__(self, local: LocalSession, answer: object) -> None:
        self.local = local
        self.answer = answer
        self.asked = 0

    @property
    def session(self) -> Any:
        return self.local.session

    def claim(self, target: str, *, wake_only: bool = False) -> Any:
        self.asked += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def record(self, events: Sequence[Event]) -> Sequence[Event]:
        return self.local.record(events)


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_GUARDS_ITS_DRAIN))
@pytest.mark.parametrize("answer", [OSError("disk on fire"), "stop"])
def test_a_source_that_misbehaves_is_logged_and_the_run_goes_on_without_it(
    driver: str, answer: object, caplog: pytest.LogCaptureFixture,
) -> None:
    turn = Turn(driver, "tool", "done")
    turn.local.followup("go")
    turn.local.claim("next_turn")  # in the transcript: the turn has something to answer
    turn.local.steer("waits for a source that answers")
    source = Misbehaving(turn.local, answer)
    with caplog.at_level(logging.WARNING, logger="nous_inbox"):
        turn.run(port=source)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("nous_inbox")]
    assert sum(line.startswith("message source failed: Misbehaving.claim") for line in said) == 1
    assert turn.ended == "final" and len(turn.requests) == 2
    assert kinds(turn.events).count("Warned") == 1 and source.asked == 1  # not asked again
    assert queued(turn) == ["waits for a source that answers"]  # nothing lost


# -- under an owner: the boundary hook ------------------------------------------------------------


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_RUNS_ON_NO_OWNER))
def test_an_owners_subscribers_hear_every_boundary_before_its_claim(driver: str) -> None:
    turn = Turn(driver, "tool", "done")

    async def go() -> list[str]:
        heard: list[str] = []
        async with AsyncOwner(open_store("memory:"), "s", turn.driver(), watch=False) as owner:
            owner.on_boundary(lambda boundary: heard.append(boundary.kind))
            await owner.followup("go")
            assert await owner.wait_idle(30.0)
        return heard

    # The turn opens; a step before each request; a stop where the run would stop.
    assert asyncio.run(go()) == ["turn_opening", "step", "step", "stop", "turn_ended"]


# -- ruling 9: cancelling -------------------------------------------------------------------------


@pytest.mark.parametrize("driver", drivers(aimu=AIMU_HAS_NO_CANCEL))
def test_a_cancel_ends_the_turn_and_wakes_nothing(driver: str) -> None:
    turn = Turn(driver, "tool", "tool", "done")

    def cancel_while_working(host: Host) -> None:
        host.steer("queued while cancelling")
        turn.cancel.set()

    turn.working[0] = cancel_while_working
    turn.host.followup("go")
    turn.run()
    assert turn.ended == "cancelled" and len(turn.requests) == 1
    assert queued(turn) == ["queued while cancelling"]  # waits for the next real wake
    assert turn.local.session.transcript[-1].content == "result 0"  # the tool that ran is kept


# -- where pydantic-ai's own loop decides ---------------------------------------------------------


def test_pydantic_ai_answers_an_empty_reply_itself_and_a_pending_message_joins_its_retry() -> None:
    # An empty reply (no parts, or empty text) is pydantic-ai's to answer: it asks again with its
    # own retry prompt, counted against its output retries, before any hook can replace it. So
    # ruling 3 holds as "a pending message joins the retry prompt", and the loop records that
    # prompt as the nudge (the model saw it; replay must too).
    turn = Turn("pydantic-ai", "", "found it", thinking={0: steer("try the staging log")})
    turn.host.followup("find it")
    turn.run()
    assert "Please return text or call a tool" in turn.requests[1][-2][1]
    assert turn.requests[1][-1] == ("user", "try the staging log")
    assert ("user", CONTINUATION.content) not in turn.requests[1]
    assert turn.nudges == 1 and turn.ended == "final"


def test_pydantic_ai_ends_a_run_of_empty_replies_at_its_own_retry_limit() -> None:
    # The built-in runner nudges an empty reply until the step budget ends the turn; pydantic-ai
    # raises once its output retries are spent, so the turn ends as an error first.
    turn = Turn("pydantic-ai", "", "", "", "")
    turn.host.followup("go")
    with pytest.raises(Exception, match="retries"):
        turn.run()
    assert turn.ended == "error"
