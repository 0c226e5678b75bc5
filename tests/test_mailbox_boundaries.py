"""The seed's worked examples, end to end through a real ``Owner`` and a scripted model: mail that
arrives while an agent works is one notice at its next boundary; a turn that opens takes what
waits along; an idle agent wakes only for a waking class after the debounce; an FYI waits for the
next turn or the bounded wait. In memory and on SQLite, each checked against a mailbox folded from
its log. The clock is moved by hand; nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from nous_inbox.mailbox import NOTICE, AgentHandle, Mailbox, MailboxState
from nous_inbox.message import Message, ToolCall
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store

WAIT = 30  # seconds: a bound for a wait that should end at once, never a synchronisation sleep


@pytest.fixture(params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    """In memory and on SQLite (this module's stores)."""
    return str(request.param)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """A model that calls ``work`` for the first ``tool_steps`` steps of a turn, then answers;
    ``while_answering`` runs as it writes its final answer."""

    def __init__(self, tool_steps: int = 0,
                 while_answering: Callable[[], None] | None = None) -> None:
        self.tool_steps = tool_steps
        self.while_answering = while_answering
        self.requests: list[list[Message]] = []

    def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        self.requests.append(list(transcript))
        steps = 0
        for message in reversed(transcript):
            if message.role == "assistant" and not message.tool_calls:
                break
            steps += message.role == "tool"
        if steps < self.tool_steps:
            return Message.assistant(tool_calls=[ToolCall(f"c{len(transcript)}", "work", {})])
        if self.while_answering is not None:
            self.while_answering()
            self.while_answering = None
        return Message.assistant("ok")


class World:
    """A mailbox on ``store`` and agent ``dev`` run by a real owner with ``model``."""

    def __init__(self, store: Store, model: Scripted,
                 during_tool: Callable[[], None] | None = None) -> None:
        self.store, self.model, self.clock = store, model, Clock()
        self.box = Mailbox(store, clock=self.clock)
        self.lead, self.qa = self.box.agent("lead"), self.box.agent("qa")
        self.dev = self.box.agent("dev", parent="lead")

        def work() -> str:
            if during_tool is not None:
                during_tool()
            return "worked"

        self.owner = Owner(open_store("memory:"), "dev", Runner(model, [work]), watch=False)
        self.box.attach("dev", self.owner)

    def notices(self) -> list[Message]:
        return [m for m in self.owner.transcript if m.metadata.get("provenance") == NOTICE]

    def later(self, seconds: float) -> None:
        """Time passes, and the mailbox looks at what fell due (as ``autotick`` would)."""
        self.clock.now += seconds
        self.box.tick()

    def close(self) -> None:
        assert self.owner.wait_idle(WAIT)
        self.owner.close()
        folded = MailboxState()
        for event in self.store.read("mailbox"):
            folded.apply(event)
        assert folded == self.box.state  # replayable from the log
        self.box.close()


@pytest.fixture
def world_of(store: Store) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(model: Scripted, during_tool: Callable[[], None] | None = None) -> World:
        made.append(World(store, model, during_tool))
        return made[-1]

    yield make
    for world in made:
        world.close()


def send_burst(handle: AgentHandle, count: int, kind: str = "fyi") -> list[str]:
    return [handle.send("dev", f"finding {i}", kind=kind).id for i in range(count)]


def test_300_messages_during_a_tool_call_are_one_notice_at_the_next_step(
        world_of: Callable[..., World]) -> None:
    sent: list[str] = []
    model = Scripted(tool_steps=1)
    qa: list[AgentHandle] = []
    world = world_of(model, lambda: sent.extend(send_burst(qa[0], 300)) if not sent else None)
    qa.append(world.qa)
    world.owner.prompt("index the repository")
    assert world.owner.wait_idle(WAIT)
    assert world.owner.session.turn == 1 and len(model.requests) == 2  # no extra turn or request
    (notice,) = world.notices()
    assert notice in model.requests[1] and notice.content.startswith("300 new messages")
    assert {world.box.status(i) for i in sent} == {"noticed"}


def test_a_blocker_burst_wakes_an_idle_agent_once_after_the_debounce(
        world_of: Callable[..., World]) -> None:
    model = Scripted()
    world = world_of(model)
    world.lead.send("dev", "first work")
    world.later(2)
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 1
    sent = send_burst(world.qa, 3, kind="blocker")
    world.later(1)  # within the debounce: nothing yet
    assert world.owner.session.turn == 1
    world.later(1)
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 2
    assert sorted(world.notices()[-1].metadata["ids"]) == sorted(sent)


def test_an_fyi_waits_for_the_bounded_wait_in_an_idle_agent(
        world_of: Callable[..., World]) -> None:
    world = world_of(Scripted())
    (fyi,) = send_burst(world.qa, 1)
    world.later(599)
    assert world.owner.session.turn == 0 and world.box.status(fyi) == "queued"
    world.later(1)
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 1
    assert world.box.status(fyi) == "noticed"


def test_an_fyi_rides_in_the_next_turn_a_person_opens(world_of: Callable[..., World]) -> None:
    model = Scripted()
    world = world_of(model)
    (fyi,) = send_burst(world.qa, 1)
    world.later(10)
    world.owner.prompt("what is new?")
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 1
    assert world.box.status(fyi) == "noticed"
    assert model.requests[0][0].content == "what is new?"  # the prompt first
    world.later(600)  # the bounded wait passes: nothing left to bring
    assert world.owner.session.turn == 1


def test_a_persons_prompt_with_a_blocker_waiting_is_one_turn(
        world_of: Callable[..., World]) -> None:
    model = Scripted()
    world = world_of(model)
    (blocker,) = send_burst(world.lead, 1, kind="blocker")
    world.later(1)  # within its debounce
    world.owner.prompt("hello")
    assert world.owner.wait_idle(WAIT)
    world.later(5)  # the debounce is long past: nothing left to wake for
    assert world.owner.wait_idle(WAIT)
    assert world.owner.session.turn == 1 and len(model.requests) == 1
    assert world.box.status(blocker) == "noticed"


def test_a_blocker_that_comes_while_the_model_answers_extends_the_run_by_one_step(
        world_of: Callable[..., World]) -> None:
    sent: list[str] = []
    model = Scripted(while_answering=lambda: sent.extend(send_burst(world.lead, 1, "blocker")))
    world = world_of(model)
    world.owner.prompt("go")
    assert world.owner.wait_idle(WAIT)
    assert world.owner.session.turn == 1 and len(model.requests) == 2
    assert world.box.status(sent[0]) == "noticed"


def test_an_fyi_that_comes_while_the_model_answers_waits_for_the_next_turn(
        world_of: Callable[..., World]) -> None:
    sent: list[str] = []
    model = Scripted(while_answering=lambda: sent.extend(send_burst(world.qa, 1)))
    world = world_of(model)
    world.owner.prompt("go")
    assert world.owner.wait_idle(WAIT)
    assert world.owner.session.turn == 1 and len(model.requests) == 1  # no step for an FYI
    world.owner.prompt("and now?")
    assert world.owner.wait_idle(WAIT)
    assert world.box.status(sent[0]) == "noticed" and len(model.requests) == 2


def test_an_fyi_that_comes_while_the_model_answers_is_brought_by_the_bounded_wait(
        world_of: Callable[..., World]) -> None:
    sent: list[str] = []
    model = Scripted(while_answering=lambda: sent.extend(send_burst(world.qa, 1)))
    world = world_of(model)
    world.owner.prompt("go")
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 1
    world.later(600)  # nobody prompts: the bounded wait brings it, as a turn of its own
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 2
    assert world.box.status(sent[0]) == "noticed" and len(world.notices()) == 1


def test_a_blank_followup_waiting_is_no_prompt_for_an_fyi_to_join(
        world_of: Callable[..., World]) -> None:
    world = world_of(Scripted())
    world.owner.send(" \u200b", "next_turn", True)  # queued, never worth a turn of its own (ruling 4)
    (fyi,) = send_burst(world.qa, 1)
    world.later(1)
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 0  # no turn for an FYI
    assert world.box.status(fyi) == "queued"
    world.later(600)  # the bounded wait brings it, and the blank followup rides along
    assert world.owner.wait_idle(WAIT) and world.owner.session.turn == 1
    assert world.box.status(fyi) == "noticed"
