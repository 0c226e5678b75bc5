"""The loop's rulings, run by every driver: the built-in ``Runner`` and the pydantic-ai adapter.

Each test is one ruling as a scripted turn over a ``LocalSession``: the model's replies are
scripted, a message is sent while the model thinks or a tool runs (a person typing while the
agent works, no sleeps), and the test reads what each request showed the model and how the turn
ended. Both drivers ask the loop (``nous_inbox.loop``) at every boundary, so both must pass the
same test. Where pydantic-ai's own loop makes a ruling impossible, a test at the end says why.
Under an owner, both must let its boundary subscribers speak before each claim.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

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
from nous_inbox.adapters.pydantic_ai import AgentRunner
from nous_inbox.commands import ToolSpec
from nous_inbox.events import Event, TurnEnded
from nous_inbox.loop import CONTINUATION
from nous_inbox.owner import AsyncOwner
from nous_inbox.runner import Runner
from nous_inbox.runner.port import LocalSession
from nous_inbox.store import open_store

DRIVERS = ["runner", "pydantic-ai"]
Seen = list[tuple[str, str]]
Action = Callable[[LocalSession], object]


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


class Turn:
    """One scripted turn: ``"tool"`` asks for the tool ``work``, any other string is the reply's
    text. ``thinking[i]`` runs while request ``i`` is made, ``working[i]`` while tool call ``i``
    runs; each is handed the session to send to."""

    def __init__(self, *replies: str, thinking: dict[int, Action] | None = None,
                 working: dict[int, Action] | None = None) -> None:
        self.replies = list(replies)
        self.thinking = thinking or {}
        self.working = working or {}
        self.requests: list[Seen] = []
        self.local = LocalSession()
        self.cancel = asyncio.Event()

    def _next(self, seen: Seen) -> str:
        index = len(self.requests)
        self.requests.append(seen)
        if index in self.thinking:
            self.thinking[index](self.local)
        return self.replies[index] if index < len(self.replies) else "done"

    async def work(self, n: int) -> str:
        """Do a piece of work."""
        if n in self.working:
            self.working[n](self.local)
        return f"result {n}"

    def driver(self, name: str, max_steps: int = 10) -> Any:
        """The driver ``name`` (``"runner"`` or ``"pydantic-ai"``) over this script."""

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

        if name == "runner":
            return Runner(runner_model, [self.work], max_steps=max_steps, offload=False)
        agent: Agent[None, str] = Agent(FunctionModel(pydantic_model))
        agent.tool_plain(self.work)
        return AgentRunner(agent, max_steps=max_steps, offload=False)

    def run(self, driver: str, max_steps: int = 10, port: object = None) -> list[Event]:
        async def go() -> list[Event]:
            on = self.local if port is None else port
            driven = self.driver(driver, max_steps)
            return [e async for e in driven.arun_turn(on, cancel=self.cancel)]

        events = asyncio.run(go())
        assert self.local.session == replay(self.local.events)  # the log is the session
        return events


def ended(events: Sequence[Event]) -> str:
    last = events[-1]
    assert isinstance(last, TurnEnded)
    return last.reason


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


def queued(turn: Turn) -> list[str]:
    return [m.content for m, _ in turn.local.session.inbox.entries("next_step")]


def steer(text: str) -> Action:
    return lambda local: local.steer(text)


def inject(text: str) -> Action:
    return lambda local: local.inject(text)


# -- ruling 1: claim points -----------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_turn_opens_with_next_turn_then_next_step_in_one_request(driver: str) -> None:
    turn = Turn("done")
    turn.local.inject("fyi: the deploy is frozen")
    turn.local.followup("tidy the logs")
    events = turn.run(driver)
    assert turn.requests == [[("user", "tidy the logs"), ("user", "fyi: the deploy is frozen")]]
    assert kinds(events)[:5] == ["TurnStarted", "QueueClaimed", "QueueClaimed", "StepStarted",
                                 "ModelRequested"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_steer_sent_during_a_tool_call_lands_after_that_tools_result(driver: str) -> None:
    turn = Turn("tool", "done", working={0: steer("check b.py too")})
    turn.local.followup("fix a.py")
    turn.run(driver)
    assert ("user", "check b.py too") not in turn.requests[0]
    assert turn.requests[1][-2:] == [("tool", "result 0"), ("user", "check b.py too")]


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_followup_sent_mid_run_waits_for_the_next_turn(driver: str) -> None:
    turn = Turn("tool", "done", working={0: lambda local: local.followup("then deploy")})
    turn.local.followup("build")
    assert ended(turn.run(driver)) == "final"
    assert all(("user", "then deploy") not in seen for seen in turn.requests)
    assert turn.local.session.inbox.count("next_turn") == 1


# -- ruling 2: the would-be final answer ----------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_steer_pending_at_a_final_answer_extends_the_run_by_one_request(driver: str) -> None:
    turn = Turn("answer", "summary", thinking={0: steer("stop and summarize")})
    turn.local.followup("go")
    assert ended(turn.run(driver)) == "final"
    assert len(turn.requests) == 2
    assert turn.requests[1][-2:] == [("text", "answer"), ("user", "stop and summarize")]


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_injection_alone_at_a_final_answer_waits_for_the_next_request(driver: str) -> None:
    turn = Turn("answer", thinking={0: inject("fyi: tests are slow")})
    turn.local.followup("go")
    assert ended(turn.run(driver)) == "final"
    assert len(turn.requests) == 1 and queued(turn) == ["fyi: tests are slow"]


# -- ruling 3: a degenerate reply -----------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_after_a_blank_reply_the_loop_nudges_with_its_own_tagged_words(driver: str) -> None:
    turn = Turn(" ", "back on track")
    turn.local.followup("go")
    events = turn.run(driver)
    assert turn.requests[1][-1] == ("user", CONTINUATION.content)
    assert "Nudged" in kinds(events) and ended(events) == "final"


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("send", [steer, inject])
def test_a_pending_message_replaces_the_nudge_after_a_blank_reply(
    driver: str, send: Callable[[str], Action],
) -> None:
    turn = Turn(" ", "found it", thinking={0: send("try the staging log")})
    turn.local.followup("find it")
    events = turn.run(driver)
    assert turn.requests[1][-1] == ("user", "try the staging log")
    assert ("user", CONTINUATION.content) not in turn.requests[1]
    assert "Nudged" not in kinds(events)


# -- ruling 4: blank and invisible-only messages --------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("blank", ["  \n", "\u200b", " \ufeff\u2060 "])
def test_a_blank_steer_never_extends_a_run(driver: str, blank: str) -> None:
    turn = Turn("answer", thinking={0: steer(blank)})
    turn.local.followup("go")
    assert ended(turn.run(driver)) == "final"
    assert len(turn.requests) == 1
    assert not turn.local.session.inbox.worth_waking()  # nor wakes a turn of its own


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_blank_steer_does_not_replace_the_nudge(driver: str) -> None:
    turn = Turn(" ", "back on track", thinking={0: steer("\u200b")})
    turn.local.followup("go")
    turn.run(driver)
    assert turn.requests[1][-2:] == [("user", "\u200b"), ("user", CONTINUATION.content)]


# -- ruling 5: the step budget --------------------------------------------------------------------
#
# The built-in runner is its own framework: its budget counts every request. pydantic-ai bounds
# its own requests (``usage_limits``), so under it the budget counts only the requests the inbox
# added: a run extended past its would-be final answer.


@pytest.mark.parametrize("driver", ["runner"])
@pytest.mark.parametrize("blank", ["  \n", "\u200b"])
def test_a_blank_steer_never_refills_the_budget(driver: str, blank: str) -> None:
    turn = Turn(*["tool"] * 10, working={0: steer(blank)})
    turn.local.followup("go")
    assert ended(turn.run(driver, max_steps=2)) == "budget"
    assert len(turn.requests) == 2  # a steer with words would have bought a third
    assert ("user", blank) in turn.requests[1]  # claimed all the same, with a request made anyway


@pytest.mark.parametrize("driver", ["runner"])
def test_a_run_never_messaged_ends_after_max_steps_requests(driver: str) -> None:
    turn = Turn(*["tool"] * 10)
    turn.local.followup("go")
    events = turn.run(driver, max_steps=2)
    assert ended(events) == "budget" and len(turn.requests) == 2
    assert "Warned" not in kinds(events)


@pytest.mark.parametrize("driver", ["runner"])
def test_the_budget_counts_from_the_last_delivered_message(driver: str) -> None:
    turn = Turn(*["tool"] * 10, working={1: steer("one more file")})
    turn.local.followup("go")
    assert ended(turn.run(driver, max_steps=3)) == "budget"
    assert len(turn.requests) == 5  # steps 3, 4 and 5 are the steer's own three


@pytest.mark.parametrize("driver", ["runner"])
def test_refills_are_capped_with_one_warning(driver: str) -> None:
    # A source that delivers at every boundary: every tool call sends a steer.
    turn = Turn(*["tool"] * 20, working={n: steer(f"more {n}") for n in range(20)})
    turn.local.followup("go")
    events = turn.run(driver, max_steps=2)
    assert ended(events) == "budget" and len(turn.requests) == 4
    assert kinds(events).count("Warned") == 1


def test_under_pydantic_ai_the_agents_own_requests_never_spend_the_budget() -> None:
    # Ten tool rounds and an answer, with a budget of two: pydantic-ai would finish this run
    # (its request limit is 50), so the adapter does, and no tool result is left unshown.
    turn = Turn(*["tool"] * 10, "all done")
    turn.local.followup("go")
    events = turn.run("pydantic-ai", max_steps=2)
    assert ended(events) == "final" and len(turn.requests) == 11
    assert turn.local.session.transcript[-1] == Message.assistant("all done")
    assert "Warned" not in kinds(events)


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_budget_bounds_how_far_steers_extend_a_run_with_refills_capped(driver: str) -> None:
    # A person who steers at every answer: each steer extends the run (ruling 2), until the
    # budget of two, refilled at most twice, is spent. Under the runner the first request spends
    # it too; under pydantic-ai only the requests the steers added do.
    turn = Turn(*[f"answer {n}" for n in range(10)],
                thinking={n: steer(f"and {n}") for n in range(10)})
    turn.local.followup("go")
    events = turn.run(driver, max_steps=2)
    assert ended(events) == "final"
    assert len(turn.requests) == {"runner": 4, "pydantic-ai": 5}[driver]
    assert kinds(events).count("Warned") == 1
    last = len(turn.requests) - 1
    assert queued(turn) == [f"and {last}"]  # for the owner's wake check: a turn of its own


@pytest.mark.parametrize("driver", DRIVERS)
def test_both_drivers_record_the_same_boundaries(driver: str) -> None:
    def record(name: str) -> list[str]:
        turn = Turn("tool", " ", "answer", "summary", working={0: inject("fyi")},
                    thinking={2: steer("summarize")})
        turn.local.followup("go")
        return kinds(turn.run(name))

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

    def record(self, event: Event) -> Event:
        return self.local.record(event)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("answer", [OSError("disk on fire"), "stop"])
def test_a_source_that_misbehaves_is_logged_and_the_run_goes_on_without_it(
    driver: str, answer: object, caplog: pytest.LogCaptureFixture,
) -> None:
    turn = Turn("tool", "done")
    turn.local.followup("go")
    turn.local.claim("next_turn")  # in the transcript: the turn has something to answer
    turn.local.steer("waits for a source that answers")
    source = Misbehaving(turn.local, answer)
    with caplog.at_level(logging.WARNING, logger="nous_inbox"):
        events = turn.run(driver, port=source)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("nous_inbox")]
    assert sum(line.startswith("message source failed: Misbehaving.claim") for line in said) == 1
    assert ended(events) == "final" and len(turn.requests) == 2
    assert kinds(events).count("Warned") == 1 and source.asked == 1  # not asked again
    assert queued(turn) == ["waits for a source that answers"]  # nothing lost


# -- under an owner: the boundary hook ------------------------------------------------------------


@pytest.mark.parametrize("driver", ["runner", "pydantic-ai"])
def test_an_owners_subscribers_hear_every_boundary_before_its_claim(driver: str) -> None:
    turn = Turn("tool", "done")

    async def go() -> list[str]:
        heard: list[str] = []
        async with AsyncOwner(open_store("memory:"), "s", turn.driver(driver), watch=False) as owner:
            owner.on_boundary(lambda boundary: heard.append(boundary.kind))
            await owner.followup("go")
            assert await owner.wait_idle(30.0)
        return heard

    # The turn opens; a step before each request; a stop where the run would stop.
    assert asyncio.run(go()) == ["turn_opening", "step", "step", "stop", "turn_ended"]


# -- ruling 9: cancelling -------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_cancel_ends_the_turn_and_wakes_nothing(driver: str) -> None:
    turn = Turn("tool", "tool", "done")

    def cancel_while_working(local: LocalSession) -> None:
        local.steer("queued while cancelling")
        turn.cancel.set()

    turn.working[0] = cancel_while_working
    turn.local.followup("go")
    events = turn.run(driver)
    assert ended(events) == "cancelled" and len(turn.requests) == 1
    assert queued(turn) == ["queued while cancelling"]  # waits for the next real wake
    assert turn.local.session.transcript[-1].content == "result 0"  # the tool that ran is kept


# -- where pydantic-ai's own loop decides ---------------------------------------------------------


def test_pydantic_ai_answers_an_empty_reply_itself_and_a_pending_message_joins_its_retry() -> None:
    # An empty reply (no parts, or empty text) is pydantic-ai's to answer: it asks again with its
    # own retry prompt, counted against its output retries, before any hook can replace it. So
    # ruling 3 holds as "a pending message joins the retry prompt", and the loop records that
    # prompt as the nudge (the model saw it; replay must too).
    turn = Turn("", "found it", thinking={0: steer("try the staging log")})
    turn.local.followup("find it")
    events = turn.run("pydantic-ai")
    assert "Please return text or call a tool" in turn.requests[1][-2][1]
    assert turn.requests[1][-1] == ("user", "try the staging log")
    assert ("user", CONTINUATION.content) not in turn.requests[1]
    assert kinds(events).count("Nudged") == 1 and ended(events) == "final"


def test_pydantic_ai_ends_a_run_of_empty_replies_at_its_own_retry_limit() -> None:
    # The built-in runner nudges an empty reply until the step budget ends the turn; pydantic-ai
    # raises once its output retries are spent, so the turn ends as an error first.
    turn = Turn("", "", "", "")
    turn.local.followup("go")
    with pytest.raises(Exception, match="retries"):
        turn.run("pydantic-ai")
    assert ended(turn.local.events) == "error"
