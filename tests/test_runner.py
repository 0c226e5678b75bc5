"""The runner, driven by scripted models against an in-memory session.

Every semantic test runs three ways: the sync driver (``run_turn``), the asyncio driver with sync
callables run in worker threads (``arun_turn``, the default ``offload=True``), and the asyncio
driver with native async model and tools. A person steering mid-run is simulated by a tool (or a
model reply) that sends into the session while it runs: deterministic, no sleeps.

After every run: the events the runner yielded equal the events it recorded (the log minus the
sends others made), and ``replay(log) == session`` (live == replayed).

``test_sends_from_another_thread_are_never_lost_or_doubled`` is a stress test; its size grows
with ``NOUS_INBOX_STRESS`` (default: small).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import msgspec
import pytest

from nous_inbox.codec import MAX_RECORD_SIZE
from nous_inbox.commands import ToolSpec
from nous_inbox.events import (
    Event,
    MessageSent,
    ModelRequested,
    QueueClaimed,
    ToolCalled,
    TurnEnded,
    Warned,
)
from nous_inbox.loop import CONTINUATION
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner import LocalSession, Runner, SessionPort, Tool, tool
from nous_inbox.runner.port import JournalPort, check_port
from nous_inbox.session import Session, replay
from nous_inbox.store import open_store
from nous_inbox.store.file import FileStore
from nous_inbox.store.journal import Journal, sent_event
from nous_inbox.store.sqlite import SqliteStore
from nous_inbox.verbs import Target
from tests.owner_faces import FACES
from tests.owner_faces import build as build_owner

WAIT = 30  # seconds; a bound for a wait that should end at once
STRESS = int(os.environ.get("NOUS_INBOX_STRESS", "0") or 0)
MODES = ["sync", "thread", "native"]
FINAL = Message.assistant("done")
DEGENERATE = Message.assistant("")

Reply = Message | Callable[[], Message]


class Script:
    """A scripted model: answers from a list and remembers every transcript it was shown.

    A callable entry runs while the model "thinks" (a person acting meanwhile) and gives the reply.
    """

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.seen: list[list[Message]] = []
        self.tools_seen: list[tuple[ToolSpec, ...]] = []

    def __call__(self, transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        self.seen.append(list(transcript))
        self.tools_seen.append(tuple(tools))
        assert self.replies, "the model was asked more often than scripted"
        reply = self.replies.pop(0)
        return reply() if callable(reply) else reply

    def contents(self, request: int) -> list[str]:
        return [m.content for m in self.seen[request]]


def calls(*names: str) -> Message:
    """An assistant reply calling these tools (no arguments), ids c1, c2, ..."""
    return Message.assistant(
        tool_calls=[ToolCall(f"c{i}", name) for i, name in enumerate(names, 1)]
    )


def then(action: Callable[[], object], reply: Message) -> Callable[[], Message]:
    """A model reply given after ``action`` happens while the model is thinking."""

    def act() -> Message:
        action()
        return reply

    return act


def _async_tool(item: Tool | Callable[..., Any]) -> Tool:
    sync = item if isinstance(item, Tool) else Tool(item)

    async def call(**kwargs: Any) -> Any:
        return sync.fn(**kwargs)

    return Tool(call, name=sync.name, description=sync.spec.description,
                parameters=dict(sync.spec.parameters))


def build(mode: str, model: Script, tools: Sequence[Any] = (), **options: Any) -> Runner:
    if mode != "native":
        return Runner(model, tools, **options)

    async def amodel(transcript: Sequence[Message], specs: Sequence[ToolSpec]) -> Message:
        return model(transcript, specs)

    return Runner(amodel, [_async_tool(t) for t in tools], **options)


def drive(mode: str, runner: Runner, port: SessionPort, **options: Any) -> list[Event]:
    if mode == "sync":
        return list(runner.run_turn(port, **options))

    async def collect() -> list[Event]:
        return [event async for event in runner.arun_turn(port, **options)]

    return asyncio.run(collect())


def run(
    mode: str, local: LocalSession, model: Script, tools: Sequence[Any] = (), **options: Any
) -> list[Event]:
    """One turn, with the log checks every run must pass."""
    start = len(local.events)
    run_options = {k: options.pop(k) for k in ("reason", "cancel") if k in options}
    yielded = drive(mode, build(mode, model, tools, **options), local, **run_options)
    recorded = [e for e in local.events[start:] if not isinstance(e, MessageSent)]
    assert yielded == recorded
    assert replay(local.events) == local.session
    assert not local.session.running
    return yielded


def kinds(events: Sequence[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


def ended(events: Sequence[Event]) -> TurnEnded:
    last = events[-1]
    assert isinstance(last, TurnEnded)
    return last


# -- Nous's AgentServer cases ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_two_step_run_records_turn_and_step_bookkeeping(mode: str) -> None:
    local = LocalSession()
    local.followup("what is in a.log?")
    model = Script(calls("read"), Message.assistant("42 lines"))
    events = run(mode, local, model, [tool(name="read")(lambda: "42 lines")])
    assert kinds(events) == [
        "TurnStarted", "QueueClaimed",
        "StepStarted", "ModelRequested", "ModelReplied", "ToolCalled", "ToolReturned", "StepEnded",
        "StepStarted", "ModelRequested", "ModelReplied", "StepEnded",
        "TurnEnded",
    ]
    assert ended(events) == TurnEnded(turn=1, steps=2, reason="final", seq=14, at=events[-1].at)
    assert [m.role for m in local.session.transcript] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("mode", MODES)
def test_a_followup_wakes_an_idle_agent_and_reaches_its_first_request(mode: str) -> None:
    local = LocalSession()
    local.followup("summarize the logs")
    assert local.session.inbox.wants_wake()
    model = Script(FINAL)
    run(mode, local, model)
    assert model.contents(0) == ["summarize the logs"]


def test_an_injection_does_not_wake_an_idle_agent_but_a_steer_does() -> None:
    local = LocalSession()
    local.inject("recall: the deploy is frozen")
    assert not local.session.inbox.wants_wake()
    local.steer("stop and summarize")
    assert local.session.inbox.wants_wake()


@pytest.mark.parametrize("mode", MODES)
def test_an_earlier_injection_rides_along_before_a_steer_in_one_request(mode: str) -> None:
    local = LocalSession()
    local.inject("recall: the deploy is frozen")
    local.steer("stop and summarize")
    model = Script(FINAL)
    events = run(mode, local, model)
    assert model.contents(0) == ["recall: the deploy is frozen", "stop and summarize"]
    claims = [e for e in events if isinstance(e, QueueClaimed)]
    assert [(c.target, c.count) for c in claims] == [(Target.NEXT_STEP, 2)]


@pytest.mark.parametrize("mode", MODES)
def test_a_steer_sent_mid_run_is_claimed_by_the_next_step_not_the_current_one(mode: str) -> None:
    local = LocalSession()
    local.followup("read a.log")

    def read() -> str:
        local.steer("check the staging log instead")  # a person, while the tool runs
        return "42 lines"

    model = Script(calls("read"), Message.assistant("ok, staging"))
    events = run(mode, local, model, [read])
    assert "check the staging log instead" not in model.contents(0)
    # it lands right after that tool's result, in the next request
    assert model.contents(1)[-2:] == ["42 lines", "check the staging log instead"]
    after_tools = kinds(events)[kinds(events).index("ToolReturned"):]
    assert after_tools[:4] == ["ToolReturned", "StepEnded", "QueueClaimed", "StepStarted"]


@pytest.mark.parametrize("mode", MODES)
def test_a_followup_sent_mid_run_waits_for_the_new_turn_the_run_end_starts(mode: str) -> None:
    local = LocalSession()
    local.followup("read a.log")

    def read() -> str:
        local.followup("then tidy up")
        return "42 lines"

    model = Script(calls("read"), FINAL, Message.assistant("tidied"))
    events = run(mode, local, model, [read])
    assert all("then tidy up" not in model.contents(i) for i in range(2))
    assert ended(events).reason == "final"
    assert local.session.inbox.count("next_turn") == 1
    assert local.session.inbox.wants_wake()  # the owner's end-of-run check starts a turn
    events = run(mode, local, model)
    assert model.contents(2)[-1] == "then tidy up"
    assert ended(events).turn == 2


@pytest.mark.parametrize("mode", MODES)
def test_an_inject_sent_mid_run_is_claimed_by_the_next_step_without_extending_it(
    mode: str,
) -> None:
    local = LocalSession()
    local.followup("read a.log")

    def read() -> str:
        local.inject("fyi: a.log rotated at noon")
        return "42 lines"

    model = Script(calls("read"), FINAL)
    events = run(mode, local, model, [read])
    assert model.contents(1)[-1] == "fyi: a.log rotated at noon"
    assert ended(events).steps == 2  # the request it rode along with was happening anyway


# -- aimu's round-boundary cases ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_steer_pending_at_the_final_answer_extends_the_run_by_one_step(mode: str) -> None:
    local = LocalSession()
    local.followup("summarize")
    model = Script(then(lambda: local.steer("also list the errors"), FINAL),
                   Message.assistant("summary + errors"))
    events = run(mode, local, model)
    assert model.contents(1)[-2:] == ["done", "also list the errors"]
    assert ended(events).steps == 2 and ended(events).reason == "final"


@pytest.mark.parametrize("mode", MODES)
def test_an_injection_pending_at_the_final_answer_waits_for_a_later_request(mode: str) -> None:
    local = LocalSession()
    local.followup("summarize")
    model = Script(then(lambda: local.inject("fyi"), FINAL))
    events = run(mode, local, model)
    assert ended(events).steps == 1
    assert local.session.inbox.count("next_step") == 1  # not claimed, not lost
    assert not local.session.inbox.wants_wake()


@pytest.mark.parametrize("mode", MODES)
def test_after_a_degenerate_reply_a_pending_message_replaces_the_nudge(mode: str) -> None:
    local = LocalSession()
    local.followup("go")
    model = Script(then(lambda: local.inject("use the new endpoint"), DEGENERATE), FINAL)
    events = run(mode, local, model)
    assert model.seen[1][-1] == Message.user("use the new endpoint")  # plain: no provenance
    assert "Nudged" not in kinds(events)


@pytest.mark.parametrize("mode", MODES)
def test_after_a_degenerate_reply_with_nothing_pending_the_loop_nudges(mode: str) -> None:
    local = LocalSession()
    local.followup("go")
    model = Script(DEGENERATE, FINAL)
    events = run(mode, local, model)
    assert model.seen[1][-1] == CONTINUATION
    assert model.seen[1][-1].metadata["provenance"] == "continuation"
    assert "Nudged" in kinds(events)
    assert local.session.transcript[-2] == CONTINUATION


@pytest.mark.parametrize("mode", MODES)
def test_whitespace_only_content_is_not_worth_a_round(mode: str) -> None:
    local = LocalSession()
    local.followup("go")
    model = Script(then(lambda: local.steer("  \n "), FINAL), FINAL)
    events = run(mode, local, model)
    assert ended(events).steps == 1  # a blank steer does not extend the run...
    assert local.session.inbox.count("next_step") == 1  # ...it stays queued, never lost...
    assert not local.session.inbox.worth_waking()  # ...and wakes no turn of its own
    local.followup("next")
    run(mode, local, model)  # it rides along with the next request something else causes
    assert model.contents(1)[-2:] == ["next", "  \n "]
    assert not local.session.inbox.has_pending()


class CountingReads(LocalSession):
    """A port that counts how often the runner reads its session."""

    reads = 0

    @property
    def session(self) -> Session:
        self.reads += 1
        return super().session


@pytest.mark.parametrize("mode", MODES)
def test_the_runner_reads_the_session_once_as_the_turn_opens_and_decides_nothing_from_it(
    mode: str,
) -> None:
    port = CountingReads()
    port.followup("go")
    model = Script(then(lambda: port.steer("also this"), FINAL), calls("work"), FINAL)
    before = port.reads
    events = run(mode, port, model, [tool(name="work")(lambda: "ok")])
    assert port.reads - before == 3  # run() reads it twice itself, the runner once
    assert ended(events).steps == 3  # the steer at the final answer extended the run
    assert model.contents(1)[-1] == "also this"


@pytest.mark.parametrize("mode", MODES)
def test_several_messages_claimed_at_one_boundary_keep_their_order(mode: str) -> None:
    local = LocalSession()
    local.followup("go")

    def work() -> str:
        for i in range(4):
            (local.steer if i % 2 else local.inject)(f"m{i}")
        return "ok"

    model = Script(calls("work"), FINAL)
    run(mode, local, model, [work])
    assert model.contents(1)[-4:] == ["m0", "m1", "m2", "m3"]


@pytest.mark.parametrize("mode", MODES)
def test_the_budget_counts_from_the_last_delivery_capped_with_one_warning(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    local = LocalSession()
    local.followup("go")

    def work() -> str:
        local.steer("keep going")  # a source that speaks at every boundary
        return "ok"

    model = Script(*[calls("work")] * 10)
    with caplog.at_level(logging.WARNING, logger="nous_inbox.runner"):
        events = run(mode, local, model, [work], max_steps=2)
    assert ended(events).reason == "budget" and ended(events).steps == 4
    warnings = [e for e in events if isinstance(e, Warned)]
    assert len(warnings) == 1
    assert "extended this run's step budget 2 times" in warnings[0].text
    assert "refusing further extensions" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_a_run_nobody_messages_ends_at_the_budget(mode: str) -> None:
    local = LocalSession()
    local.followup("go")
    model = Script(*[calls("work")] * 3)
    events = run(mode, local, model, [tool(name="work")(lambda: "ok")], max_steps=3)
    assert (ended(events).reason, ended(events).steps) == ("budget", 3)
    assert "Warned" not in kinds(events)


@pytest.mark.parametrize("mode", MODES)
def test_a_structured_run_claims_nothing(mode: str) -> None:
    local = LocalSession()
    local.followup("later")
    local.steer("now")
    model = Script(Message.assistant('{"answer": 42}'))
    events = run(mode, local, model, [tool(name="work")(lambda: "ok")], structured=True)
    assert "QueueClaimed" not in kinds(events)
    assert model.seen == [[]] and model.tools_seen == [()]
    assert local.session.inbox.count() == 2
    assert ended(events).steps == 1


# -- ruling 7: misbehaving sources and ports ------------------------------------------------------


class Raising(LocalSession):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def claim(
        self, target: Target | str, *, wake_only: bool = False
    ) -> tuple[Sequence[Message], QueueClaimed | None]:
        self.asked += 1
        raise OSError("disk on fire")


class Shaped(LocalSession):
    def __init__(self, answer: object) -> None:
        super().__init__()
        self.answer = answer

    def claim(self, target: Target | str, *, wake_only: bool = False) -> Any:
        return self.answer


@pytest.mark.parametrize("mode", MODES)
def test_a_source_that_raises_is_logged_and_the_run_goes_on_without_it(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = Raising()
    port.followup("go")
    model = Script(calls("work"), FINAL)
    with caplog.at_level(logging.WARNING, logger="nous_inbox.runner"):
        events = run(mode, port, model, [tool(name="work")(lambda: "ok")])
    assert ended(events).reason == "final" and ended(events).steps == 2
    warned = [e for e in events if isinstance(e, Warned)]
    assert len(warned) == 1 and "raised OSError: disk on fire" in warned[0].text
    assert "disk on fire" in caplog.text
    assert port.asked == 1  # not asked again for the rest of the run
    assert port.session.inbox.count() == 1  # the followup is still queued, not lost


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("stop", "returned the str 'stop'"),
        ((["stop"], None), "messages[0] of type str"),
        (("stop", None), "messages of type str"),
        (([Message.user("hi")], None), "no QueueClaimed"),
        (None, "returned NoneType"),
    ],
)
def test_a_source_that_answers_in_the_wrong_shape_is_logged_and_ignored(
    answer: object, problem: str
) -> None:
    port = Shaped(answer)
    model = Script(FINAL)
    events = run("sync", port, model)
    warned = [e for e in events if isinstance(e, Warned)]
    assert len(warned) == 1 and problem in warned[0].text
    assert model.seen == [[]]
    assert ended(events).reason == "final"


class NoClaim:
    session = Session()

    def record(self, events: Sequence[Event]) -> Sequence[Event]:
        return events


class ZeroArgClaim(NoClaim):
    def claim(self) -> Any:
        return (), None


class TargetOnlyClaim(NoClaim):
    """A port written before claims learned ``wake_only``: refused, with the fix."""

    def claim(self, target: Target) -> Any:
        return (), None


class SessionMethod(ZeroArgClaim):
    def session(self) -> Session:  # type: ignore[override]
        return Session()


class RecordTwoArgs:
    session = Session()

    def claim(self, target: Target, *, wake_only: bool = False) -> Any:
        return (), None

    def record(self, event: Event, where: str) -> Event:
        return event


@pytest.mark.parametrize(
    ("port", "words"),
    [
        (NoClaim(), ["NoClaim has no 'claim'", "SessionPort"]),
        (ZeroArgClaim(), ["ZeroArgClaim.claim()", "one positional argument",
                          "`def claim(self, target, *, wake_only=False)`"]),
        (TargetOnlyClaim(), ["TargetOnlyClaim.claim(target", "wake_only as a keyword",
                             "`def claim(self, target, *, wake_only=False)`"]),
        (SessionMethod(), ["SessionMethod.session is a method", "@property"]),
        (RecordTwoArgs(), ["RecordTwoArgs.record(event", "where", "`def record(self, events)`"]),
    ],
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_port_the_runner_cannot_call_is_refused_before_the_run_starts(
    port: object, words: list[str], mode: str
) -> None:
    runner = Runner(Script(FINAL))
    start = runner.run_turn if mode == "sync" else runner.arun_turn
    with pytest.raises(TypeError) as caught:
        start(port)  # type: ignore[arg-type]  # refused on the call, not on first iteration
    for word in words:
        assert word in str(caught.value)


def test_check_port_accepts_the_local_session_and_lets_an_unreadable_signature_through() -> None:
    check_port(LocalSession())

    class Unreadable:
        __signature__ = "no evidence of a wrong signature"

        def __call__(self, *args: Any) -> Any:
            return (), None

    class Opaque(LocalSession):
        def __init__(self) -> None:
            super().__init__()
            self.claim = Unreadable()  # type: ignore[method-assign,assignment]

    check_port(Opaque())


# -- ruling 9: cancelling -------------------------------------------------------------------------


def test_cancelling_during_tools_ends_the_turn_and_claims_nothing_more() -> None:
    local = LocalSession()
    local.followup("go")
    cancel = threading.Event()

    def first() -> str:
        local.steer("a steer that arrives as the person cancels")
        cancel.set()
        return "ran"

    model = Script(calls("first", "second"))
    events = run("sync", local, model, [first, tool(name="second")(lambda: "never")],
                 cancel=cancel)
    assert ended(events).reason == "cancelled"
    claims = [e for e in events if isinstance(e, QueueClaimed)]
    assert len(claims) == 1  # only the turn-open one, before the cancel
    answers = [m.content for m in local.session.transcript if m.role == "tool"]
    assert answers == ["ran", "cancelled: the turn ended before this tool ran"]
    assert local.session.inbox.count("next_step") == 1  # queued messages stay


def test_cancelling_during_a_request_discards_its_reply() -> None:
    local = LocalSession()
    local.followup("go")
    cancel = threading.Event()
    model = Script(then(cancel.set, FINAL))
    events = run("sync", local, model, cancel=cancel)
    assert kinds(events)[-3:] == ["ModelRequested", "StepEnded", "TurnEnded"]
    assert ended(events).reason == "cancelled"


@pytest.mark.parametrize("mode", MODES)
def test_a_turn_cancelled_before_it_starts_claims_nothing(mode: str) -> None:
    local = LocalSession()
    local.followup("go")
    cancel: Any = threading.Event() if mode == "sync" else None
    if mode != "sync":
        async def preset() -> asyncio.Event:
            event = asyncio.Event()
            event.set()
            return event
        cancel = asyncio.run(preset())
    events = run(mode, local, Script(), cancel=cancel) if mode != "sync" else None
    if mode == "sync":
        cancel.set()
        events = run(mode, local, Script(), cancel=cancel)
    assert events is not None
    assert kinds(events) == ["TurnStarted", "TurnEnded"]
    assert ended(events).reason == "cancelled"
    assert local.session.inbox.count() == 1


def test_async_cancel_abandons_a_model_request_in_flight() -> None:
    local = LocalSession()
    local.followup("go")

    async def main() -> list[Event]:
        cancel = asyncio.Event()

        async def model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
            cancel.set()
            await asyncio.Event().wait()  # never answers: only the cancel ends this request
            raise AssertionError("unreachable")

        return [e async for e in Runner(model).arun_turn(local, cancel=cancel)]

    events = asyncio.run(main())
    assert kinds(events)[-3:] == ["ModelRequested", "StepEnded", "TurnEnded"]
    assert ended(events).reason == "cancelled"
    assert replay(local.events) == local.session


def test_async_cancel_set_by_a_tool_answers_the_rest_as_cancelled() -> None:
    local = LocalSession()
    local.followup("go")

    async def main() -> list[Event]:
        cancel = asyncio.Event()

        async def first() -> str:
            cancel.set()
            return "ran"

        async def second() -> str:
            raise AssertionError("must not run")

        model = Script(calls("first", "second"))
        return [e async for e in Runner(model, [first, second]).arun_turn(local, cancel=cancel)]

    events = asyncio.run(main())
    assert ended(events).reason == "cancelled"
    assert [m.content for m in local.session.transcript if m.role == "tool"] == [
        "ran", "cancelled: the turn ended before this tool ran"]


def test_cancelling_the_task_that_runs_a_turn_records_it_as_cancelled() -> None:
    local = LocalSession()
    local.followup("go")

    async def main() -> None:
        asked = asyncio.Event()

        async def model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
            asked.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def consume() -> list[Event]:
            return [e async for e in Runner(model).arun_turn(local)]

        task = asyncio.create_task(consume())
        await asked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    last = local.events[-1]
    assert isinstance(last, TurnEnded) and last.reason == "cancelled"
    assert not local.session.running and replay(local.events) == local.session


def test_closing_the_stream_early_records_the_turn_as_cancelled() -> None:
    local = LocalSession()
    local.followup("go")
    stream = Runner(Script(FINAL)).run_turn(local)
    assert type(next(stream)).__name__ == "TurnStarted"
    stream.close()  # type: ignore[attr-defined]
    last = local.events[-1]
    assert isinstance(last, TurnEnded) and last.reason == "cancelled"
    assert not local.session.running and replay(local.events) == local.session


class Blocking:
    """A sync tool that runs until released: ``started`` is set once it runs."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> str:
        self.started.set()
        self.release.wait(WAIT)
        return "late"


def tool_answers(local: LocalSession) -> list[tuple[str, str | None]]:
    return [(m.content, m.metadata.get("error")) for m in local.session.transcript
            if m.role == "tool"]


CUT_OFF = ("interrupted: the turn was cancelled before this tool answered", "interrupted")
NEVER_RAN = ("cancelled: the turn ended before this tool ran", "cancelled")


@pytest.mark.parametrize("mode", ["thread", "native"])
def test_a_tool_a_cancel_cuts_off_is_recorded_as_interrupted_not_as_failed(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    local = LocalSession()
    local.followup("go")
    slow = Blocking()

    async def async_slow() -> str:
        slow.started.set()
        await asyncio.Event().wait()  # answers only if cancelled
        raise AssertionError("unreachable")

    async def main() -> list[Event]:
        cancel = asyncio.Event()

        async def cancel_once_it_runs() -> None:
            await asyncio.to_thread(slow.started.wait, WAIT)
            cancel.set()

        canceller = asyncio.create_task(cancel_once_it_runs())
        work = tool(name="slow")(slow if mode == "thread" else async_slow)
        runner = Runner(Script(calls("ran", "slow", "never")), [
            tool(name="ran")(lambda: "ran"), work, tool(name="never")(lambda: "never")])
        try:
            return [e async for e in runner.arun_turn(local, cancel=cancel)]
        finally:
            slow.release.set()  # the thread a sync tool runs on cannot be stopped
            await canceller

    with caplog.at_level(logging.WARNING, logger="nous_inbox"):
        events = asyncio.run(main())
    assert ended(events).reason == "cancelled"
    assert tool_answers(local) == [("ran", None), CUT_OFF, NEVER_RAN]
    assert not caplog.records  # nothing raised
    assert replay(local.events) == local.session


def test_a_tool_cut_off_by_cancelling_the_task_is_recorded_as_interrupted() -> None:
    local = LocalSession()
    local.followup("go")
    slow = Blocking()

    async def main() -> None:
        runner = Runner(Script(calls("ran", "slow", "never")), [
            tool(name="ran")(lambda: "ran"), tool(name="slow")(slow),
            tool(name="never")(lambda: "never")])

        async def consume() -> list[Event]:
            return [e async for e in runner.arun_turn(local)]

        task = asyncio.create_task(consume())
        await asyncio.to_thread(slow.started.wait, WAIT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        slow.release.set()

    asyncio.run(main())
    # The result of the tool that ran before it is kept; the one after it never ran.
    assert tool_answers(local) == [("ran", None), CUT_OFF, NEVER_RAN]
    last = local.events[-1]
    assert isinstance(last, TurnEnded) and last.reason == "cancelled"
    assert replay(local.events) == local.session


@pytest.mark.parametrize("face", FACES)
def test_an_owner_cancelled_while_a_sync_tool_runs_records_what_the_tool_did(
    face: str, caplog: pytest.LogCaptureFixture
) -> None:
    slow = Blocking()
    runner = Runner(Script(calls("slow"), FINAL), [tool(name="slow")(slow)])
    with caplog.at_level(logging.WARNING, logger="nous_inbox"), \
            build_owner(face, open_store("memory:"), "s", runner) as owner:
        try:
            owner.steer("go")
            assert slow.started.wait(WAIT)
            assert owner.cancel() is True
            if face == "Owner":
                slow.release.set()  # a thread's own sync call is let finish
            assert owner.wait_idle(WAIT)
        finally:
            slow.release.set()
        answers = [(m.content, m.metadata.get("error")) for m in owner.transcript
                   if m.role == "tool"]
        last = list(owner.events())[-1]
    # The threaded owner calls its tool inline and lets it finish; the asyncio one cuts it off.
    assert answers == ([("late", None)] if face == "Owner" else [CUT_OFF])
    assert isinstance(last, TurnEnded) and last.reason == "cancelled"
    assert not caplog.records


# -- events are recorded before the runner acts on them -------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_each_event_is_recorded_before_the_runner_acts_on_it(mode: str) -> None:
    local = LocalSession()
    local.followup("go")

    def request_recorded() -> Message:
        last = local.events[-1]
        assert isinstance(last, ModelRequested) and last.count == 1
        return calls("work")

    def work() -> str:
        last = local.events[-1]
        assert isinstance(last, ToolCalled) and last.call.name == "work"
        return "ok"

    run(mode, local, Script(request_recorded, FINAL), [work])


# -- tools and models -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tool_results_failures_and_unknown_tools_become_tool_messages(mode: str) -> None:
    local = LocalSession()
    local.followup("go")

    def stats(path: str) -> dict[str, Any]:
        return {"path": path, "lines": 42}

    def count() -> int:
        return 7

    def broken() -> str:
        raise ValueError("bad input")

    reply = Message.assistant(tool_calls=[
        ToolCall("c1", "stats", {"path": "a.log"}), ToolCall("c2", "count"),
        ToolCall("c3", "broken"), ToolCall("c4", "missing"), ToolCall("c5", "count", {"x": 1}),
    ])
    model = Script(reply, FINAL)
    events = run(mode, local, model, [stats, count, broken])
    results = [m for m in local.session.transcript if m.role == "tool"]
    assert results[0].content == '{"path": "a.log", "lines": 42}'
    assert results[1].content == "7" and results[1].name == "count"
    assert results[2].content == "error: ValueError: bad input"
    assert results[2].metadata["error"] == "ValueError"
    assert results[3].content.startswith("error: unknown tool 'missing'")
    assert results[4].metadata["error"] == "TypeError"  # bad arguments are the tool's failure
    assert ended(events).reason == "final"  # the run went on


@pytest.mark.parametrize("mode", MODES)
def test_a_model_that_raises_ends_the_turn_with_error_and_re_raises(mode: str) -> None:
    local = LocalSession()
    local.followup("go")

    def fail() -> Message:
        raise RuntimeError("rate limited")

    with pytest.raises(RuntimeError, match="rate limited"):
        run(mode, local, Script(fail))
    last = local.events[-1]
    assert isinstance(last, TurnEnded)
    assert (last.reason, last.error) == ("error", "RuntimeError: rate limited")
    assert replay(local.events) == local.session


def test_a_model_must_answer_with_an_assistant_message_or_a_str() -> None:
    local = LocalSession()
    local.followup("go")
    events = run("sync", local, Script(lambda: "plain text is fine"))  # type: ignore[arg-type,return-value]
    assert local.session.transcript[-1] == Message.assistant("plain text is fine")
    assert ended(events).reason == "final"
    with pytest.raises(TypeError, match="the model returned int"):
        run("sync", local, Script(lambda: 42))  # type: ignore[arg-type,return-value]
    assert ended(local.events).reason == "error"


def test_the_sync_driver_refuses_async_models_and_tools() -> None:
    async def amodel(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        return FINAL

    async def atool() -> str:
        return "ok"

    with pytest.raises(TypeError, match="the model is async: drive this runner with arun_turn"):
        Runner(amodel).run_turn(LocalSession())
    with pytest.raises(TypeError, match="a tool is async"):
        Runner(Script(), [atool]).run_turn(LocalSession())


def test_tools_are_named_described_and_checked() -> None:
    @tool
    def grep(pattern: str, limit: int = 10) -> list[str]:
        """Search the logs.

        Longer notes the model does not need.
        """
        return [pattern] * limit

    assert grep.name == "grep" and grep.spec.description == "Search the logs."
    assert grep.spec.parameters["required"] == ["pattern"]
    assert grep.spec.parameters["properties"]["limit"] == {"type": "integer"}
    assert grep("x", limit=2) == ["x", "x"]
    with pytest.raises(ValueError, match="two tools are named 'grep'"):
        Runner(Script(), [grep, grep])
    with pytest.raises(TypeError, match="cannot name the tool"):
        Tool(lambda: 1)
    with pytest.raises(TypeError, match="positional-only"):
        Tool(lambda x, /: x, name="pos")
    with pytest.raises(TypeError, match="model must be callable"):
        Runner("gpt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps"):
        Runner(Script(), max_steps=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "result", ["caf\udce9.txt", ["a.txt", "caf\udce9.txt"]], ids=["str", "list"]
)
def test_a_tool_result_with_a_lone_surrogate_becomes_an_error_result(
    mode: str, result: object
) -> None:
    # os.listdir returns a name that is not UTF-8 with lone surrogates: no log can hold it.
    local = LocalSession()
    local.followup("list the directory")
    model = Script(calls("listdir"), FINAL)
    events = run(mode, local, model, [tool(name="listdir")(lambda: result)])
    answer = model.seen[1][-1]
    assert answer.role == "tool" and answer.tool_call_id == "c1"
    assert answer.metadata["error"] == "unstorable_result"
    assert "lone surrogate" in answer.content and "\\udce9" in answer.content
    assert ended(events).reason == "final"


@pytest.mark.parametrize("mode", MODES)
def test_a_tool_result_over_the_record_limit_becomes_an_error_result(mode: str) -> None:
    local = LocalSession()
    local.followup("read the dump")
    model = Script(calls("dump"), FINAL)
    events = run(mode, local, model, [tool(name="dump")(lambda: "x" * MAX_RECORD_SIZE)])
    answer = model.seen[1][-1]
    assert answer.metadata["error"] == "result_too_large"
    assert f"above the limit of {MAX_RECORD_SIZE} bytes" in answer.content
    assert len(answer.content) < 1000
    assert ended(events).reason == "final"


def store_port(kind: str, path: Any, **options: Any) -> JournalPort:
    """A port over a store opened with its own options (``max_record_size`` here)."""
    store = (FileStore(path / "log.jsonl", **options) if kind == "file"
             else SqliteStore(path / "log.db", **options))
    return JournalPort(Journal(store, "s"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_tool_result_over_the_limit_of_the_store_recorded_into_becomes_an_error_result(
    mode: str, kind: str, tmp_path: Any
) -> None:
    # The store was opened with a limit of its own, far below the default: the result is
    # checked against that limit, so the model sees an error result and the turn goes on,
    # rather than the store refusing the record and the turn ending with an error.
    limit = 64 * 1024
    port = store_port(kind, tmp_path, max_record_size=limit)
    port.append(sent_event("read the dump", "next_turn", True))
    model = Script(calls("dump"), FINAL)
    runner = build(mode, model, [tool(name="dump")(lambda: "x" * 2 * limit)])
    events = drive(mode, runner, port)
    answer = model.seen[1][-1]
    assert answer.role == "tool" and answer.metadata["error"] == "result_too_large"
    assert f"above the limit of {limit} bytes" in answer.content
    assert ended(events).reason == "final"
    assert port.session.transcript[-1] == FINAL


def test_a_tool_result_under_a_larger_store_limit_is_recorded_whole(tmp_path: Any) -> None:
    # Above the default limit, under the store's own larger one: the store can hold it, so the
    # model gets the result itself, not an error.
    port = store_port("sqlite", tmp_path, max_record_size=2 * MAX_RECORD_SIZE)
    port.append(sent_event("read the dump", "next_turn", True))
    big = "x" * (MAX_RECORD_SIZE + 1)
    model = Script(calls("dump"), FINAL)
    events = drive("sync", build("sync", model, [tool(name="dump")(lambda: big)]), port)
    answer = model.seen[1][-1]
    assert answer.content == big and "error" not in answer.metadata
    assert ended(events).reason == "final"


UNSTORABLE = {
    "a lone surrogate": "no such file: caf\udce9.txt",
    "too long for a record": "x" * (64 * 1024),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("why", UNSTORABLE)
def test_a_tool_that_raises_what_the_log_cannot_hold_still_answers_with_an_error_result(
    mode: str, why: str, tmp_path: Any
) -> None:
    port = store_port("file", tmp_path, max_record_size=64 * 1024)
    port.append(sent_event("open it", "next_turn", True))

    def open_it() -> str:
        raise ValueError(UNSTORABLE[why])

    model = Script(calls("open_it"), FINAL)
    events = drive(mode, build(mode, model, [tool(name="open_it")(open_it)]), port)
    answer = model.seen[1][-1]
    assert answer.metadata["error"] == "ValueError"
    assert answer.content.startswith("error: ValueError: ")
    assert len(answer.content) < 8192
    if why == "a lone surrogate":
        assert answer.content.endswith("caf\\udce9.txt")  # escaped, so it can be stored
    assert ended(events).reason == "final"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_tool_error_too_long_for_a_small_store_limit_is_cut_to_fit_and_the_turn_goes_on(
    mode: str, kind: str, tmp_path: Any
) -> None:
    # A 4 KiB store: the tool's error message (5,000 characters) would make a record the
    # store refuses, ending the turn with a store error; it is cut short instead.
    port = store_port(kind, tmp_path, max_record_size=4096)
    port.append(sent_event("open it", "next_turn", True))

    def open_it() -> str:
        raise ValueError("y" * 5000)

    model = Script(calls("open_it"), FINAL)
    events = drive(mode, build(mode, model, [tool(name="open_it")(open_it)]), port)
    answer = model.seen[1][-1]
    assert answer.metadata["error"] == "ValueError"
    assert answer.content.startswith("error: ValueError: yyy")
    assert answer.content.endswith("(cut to fit the log's record limit)")
    assert ended(events).reason == "final"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("why", UNSTORABLE)
def test_a_model_that_raises_what_the_log_cannot_hold_still_ends_the_turn_recorded(
    mode: str, why: str, tmp_path: Any
) -> None:
    # The turn's end is recorded with the error described as the log can hold it, and the
    # consumer gets the model's own exception, whole: not a store error, not a turn left
    # running in the log forever.
    port = store_port("file", tmp_path, max_record_size=64 * 1024)
    port.append(sent_event("go", "next_turn", True))
    failure = RuntimeError(UNSTORABLE[why])

    def fail() -> Message:
        raise failure

    with pytest.raises(RuntimeError) as raised:
        drive(mode, build(mode, Script(fail)), port)
    assert raised.value is failure
    with FileStore(tmp_path / "log.jsonl", read_only=True) as store:
        logged = list(store.read("s"))
    assert not replay(logged).running
    last = logged[-1]
    assert isinstance(last, TurnEnded) and last.reason == "error"
    assert last.error is not None and last.error.startswith("RuntimeError: ")
    assert len(last.error) < 8192


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_a_tool_exception_that_cannot_be_printed_is_still_answered() -> None:
    local = LocalSession()
    local.followup("go")

    def broken() -> str:
        raise Unprintable()

    model = Script(calls("broken"), FINAL)
    events = run("sync", local, model, [tool(name="broken")(broken)])
    assert model.seen[1][-1].content == "error: Unprintable: (its message cannot be printed)"
    assert ended(events).reason == "final"


class RaisingUnstorably(JournalPort):
    def claim(self, target: Target | str, *, wake_only: bool = False) -> Any:
        raise OSError("disk on fire: caf\udce9")


def test_a_source_that_raises_what_the_log_cannot_hold_is_still_warned_about(
    tmp_path: Any
) -> None:
    port = RaisingUnstorably(Journal(FileStore(tmp_path / "log.jsonl"), "s"))
    port.append(sent_event("go", "next_turn", True))
    events = drive("sync", build("sync", Script(FINAL)), port)
    warned = [e for e in events if isinstance(e, Warned)]
    assert len(warned) == 1 and "disk on fire: caf\\udce9" in warned[0].text
    assert ended(events).reason == "final"


class NoLimitPort:
    """A port of a host's own that says nothing about a record limit."""

    def __init__(self, inner: LocalSession) -> None:
        self.inner = inner

    @property
    def session(self) -> Session:
        return self.inner.session

    def claim(self, target: Target, *, wake_only: bool = False) -> Any:
        return self.inner.claim(target, wake_only=wake_only)

    def record(self, events: Sequence[Event]) -> Sequence[Event]:
        return self.inner.record(events)


def test_a_port_that_names_no_record_limit_is_checked_against_the_default() -> None:
    local = LocalSession()
    local.followup("read the dump")
    model = Script(calls("dump"), FINAL)
    drive("sync", build("sync", model, [tool(name="dump")(lambda: "x" * MAX_RECORD_SIZE)]),
          NoLimitPort(local))
    answer = model.seen[1][-1]
    assert answer.metadata["error"] == "result_too_large"
    assert f"above the limit of {MAX_RECORD_SIZE} bytes" in answer.content


@pytest.mark.parametrize("mode", ["sync", "native"])
def test_a_port_that_says_it_has_no_record_limit_is_held_to_the_codec_default(mode: str) -> None:
    # None: a host's log with no limit of its own. The turn runs; a result above what every
    # reader of the log takes still becomes an error result the model sees.
    local = LocalSession()
    local.followup("read the dump")
    port = NoLimitPort(local)
    port.max_record_size = None  # type: ignore[attr-defined]
    model = Script(calls("dump"), FINAL)
    drive(mode, build(mode, model, [tool(name="dump")(lambda: "x" * MAX_RECORD_SIZE)]), port)
    answer = model.seen[1][-1]
    assert answer.metadata["error"] == "result_too_large"
    assert f"above the limit of {MAX_RECORD_SIZE} bytes" in answer.content


@pytest.mark.parametrize("limit", [0, -1, "16M", 1.5, True])
def test_a_port_with_a_record_limit_that_is_not_a_positive_int_is_refused(limit: object) -> None:
    port = NoLimitPort(LocalSession())
    port.max_record_size = limit  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="max_record_size must be an int >= 1"):
        Runner(Script()).run_turn(port)
    assert port.inner.events == ()


@pytest.mark.parametrize("mode", ["sync", "thread"])  # native wraps tools in **kwargs
def test_arguments_that_do_not_fit_the_annotations_become_an_error_result(mode: str) -> None:
    local = LocalSession()
    local.followup("add")

    def add(a: int, b: int) -> int:
        return a + b

    reply = Message.assistant(tool_calls=[ToolCall("c1", "add", {"a": "2", "b": 3})])
    model = Script(reply, FINAL)
    run(mode, local, model, [add])
    answer = model.seen[1][-1]
    assert answer.metadata["error"] == "arguments_refused"
    assert "argument 'a': Expected `int`, got `str`" in answer.content


class Point(msgspec.Struct):
    x: int
    y: int


@pytest.mark.parametrize("mode", ["sync", "thread"])
def test_a_struct_parameter_receives_a_struct(mode: str) -> None:
    local = LocalSession()
    local.followup("move")
    got: list[object] = []

    def move(to: Point) -> str:
        got.append(to)
        return "moved"

    reply = Message.assistant(tool_calls=[ToolCall("c1", "move", {"to": {"x": 1, "y": 2}})])
    run(mode, local, Script(reply, FINAL), [move])
    assert got == [Point(1, 2)]


def test_the_sync_driver_refuses_a_sync_callable_that_returns_an_awaitable() -> None:
    local = LocalSession()
    local.followup("go")

    async def later() -> Message:
        return FINAL

    with pytest.raises(TypeError, match="the model returned an awaitable; drive async"):
        run("sync", local, Script(later))  # type: ignore[arg-type]
    assert ended(local.events).reason == "error"


def test_an_interrupt_during_a_model_request_records_the_turn_as_cancelled() -> None:
    local = LocalSession()
    local.followup("go")

    def interrupted() -> Message:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        list(Runner(Script(interrupted)).run_turn(local))
    last = local.events[-1]
    assert isinstance(last, TurnEnded) and last.reason == "cancelled"
    assert replay(local.events) == local.session


def test_a_runner_is_frozen_and_its_tools_are_read_only() -> None:
    def read(path: str) -> str:
        return path

    runner = Runner(Script(), [read], max_steps=3)
    assert (runner.max_steps, runner.structured, runner.offload) == (3, False, True)
    assert list(runner.tools) == ["read"] and runner.tools["read"].fn is read
    assert "max_steps=3" in repr(runner) and "Tool(name='read')" in repr(runner)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        runner.max_steps = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        runner.tools["other"] = runner.tools["read"]  # type: ignore[index]
    with pytest.raises(TypeError, match="structured must be a bool"):
        Runner(Script(), structured="yes")  # type: ignore[arg-type]


def test_the_model_is_offered_the_runners_tools() -> None:
    local = LocalSession()
    local.followup("go")
    model = Script(FINAL)

    def read(path: str) -> str:
        """Read a file."""
        return path

    run("sync", local, model, [read])
    assert [s.name for s in model.tools_seen[0]] == ["read"]


# -- LocalSession ---------------------------------------------------------------------------------


def test_local_session_resumes_from_its_events() -> None:
    local = LocalSession()
    local.followup("go")
    run("sync", local, Script(FINAL))
    local.inject("fyi")
    again = LocalSession(local.events)
    assert again.session == local.session
    events = run("sync", again, Script(FINAL))
    assert ended(events).turn == 2


def test_local_session_refuses_what_does_not_fold_and_stays_unchanged() -> None:
    local = LocalSession()
    before = local.session
    with pytest.raises(ValueError, match="claim of next_step records 1"):
        local.record([QueueClaimed(target=Target.NEXT_STEP, count=1)])
    with pytest.raises(TypeError, match="record needs an event"):
        local.record(["hello"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="record takes a sequence of events, got one Warned"):
        local.record(Warned(text="one"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wakeup must be a bool"):
        local.send("hi", "next_step", 1)  # type: ignore[arg-type]
    assert local.session == before and local.events == ()
    assert local.claim("next_turn") == ((), None)


@pytest.mark.slow
def test_sends_from_another_thread_are_never_lost_or_doubled() -> None:
    size = 50 * (1 + STRESS)
    local = LocalSession()
    local.followup("work through the list")
    sent: list[str] = []

    def sender() -> None:
        for i in range(size):
            text = f"msg-{i}"
            (local.steer, local.inject, local.followup)[i % 3](text)
            sent.append(text)

    def work() -> str:
        return "ok"

    thread = threading.Thread(target=sender)
    thread.start()
    for _ in range(3):
        model = Script(*[calls("work")] * (size // 5), FINAL, FINAL, FINAL)
        model.replies = model.replies * 3
        list(Runner(model, [work], max_steps=size).run_turn(local))
    thread.join()
    delivered = [m.content for m in local.session.transcript if m.content.startswith("msg-")]
    queued = [m.content for t in ("next_turn", "next_step")
              for m, _ in local.session.inbox.entries(t)]
    assert sorted(delivered + queued) == sorted(sent)  # each exactly once
    assert replay(local.events) == local.session


class ThreadPoolPort(LocalSession):
    """A port whose ``call_io`` is any thread pool's (it promises nothing about order), and whose
    recording of a reply holds until ``gate`` opens: a stretch still running when a cancel comes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.gate = threading.Event()
        self.holding = asyncio.Event()
        self.ended_on: threading.Thread | None = None

    def call_io(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return self.loop.run_in_executor(None, fn, *args)

    def record(self, events: Sequence[Event]) -> list[Event]:
        if any(type(event).__name__ == "ModelReplied" for event in events):
            self.loop.call_soon_threadsafe(self.holding.set)
            self.gate.wait(WAIT)
        if any(isinstance(event, TurnEnded) for event in events):
            self.ended_on = threading.current_thread()
        return super().record(events)


def test_cancelling_a_turn_whose_stretch_runs_on_a_thread_pool_ends_it_cleanly() -> None:
    async def main() -> ThreadPoolPort:
        port = ThreadPoolPort(asyncio.get_running_loop())
        port.followup("go")

        async def consume() -> list[Event]:
            # The held stretch records the reply that asks for a tool: a boundary with no
            # claim, so the turn is still open when the stretch ends.
            runner = Runner(Script(calls("work"), FINAL), [tool(name="work")(lambda: "ok")],
                            offload=False)
            return [e async for e in runner.arun_turn(port)]

        task = asyncio.create_task(consume())
        await port.holding.wait()
        task.cancel()
        await asyncio.wait({task}, timeout=0.2)  # a close racing the running stretch would be here
        port.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return port

    port = asyncio.run(main())
    last = port.events[-1]
    assert isinstance(last, TurnEnded) and last.reason == "cancelled"
    assert not port.session.running and replay(list(port.events)) == port.session


def test_a_small_result_fits_a_small_store_limit(tmp_path: Any) -> None:
    # Its record is about 150 bytes: a store limit of 4096 holds it, with room for any stream
    # name; no fixed margin refuses it.
    port = store_port("sqlite", tmp_path, max_record_size=4096)
    port.append(sent_event("check", "next_turn", True))
    model = Script(calls("check"), FINAL)
    events = drive("sync", build("sync", model, [tool(name="check")(lambda: "ok")]), port)
    answer = model.seen[1][-1]
    assert answer.content == "ok" and "error" not in answer.metadata
    assert ended(events).reason == "final"


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_long_call_id_counts_toward_the_result_s_record(kind: str, tmp_path: Any) -> None:
    # The model names the call: an id this long with a modest result is above the limit the
    # store enforces, so the model gets an error result (which fits) and the turn goes on.
    limit = 16 * 1024
    port = store_port(kind, tmp_path, max_record_size=limit)
    port.append(sent_event("dump", "next_turn", True))
    call_id = "i" * 14_500
    model = Script(Message.assistant(tool_calls=[ToolCall(call_id, "dump")]), FINAL)
    events = drive("sync", build("sync", model, [tool(name="dump")(lambda: "x" * 2000)]), port)
    answer = model.seen[1][-1]
    assert answer.tool_call_id == call_id and answer.metadata["error"] == "result_too_large"
    assert ended(events).reason == "final"


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_the_largest_result_the_runner_lets_through_fits_the_longest_stream_name(
    kind: str, tmp_path: Any
) -> None:
    from nous_inbox.events import ToolReturned
    from nous_inbox.runner.results import tool_message

    limit = 8192
    call = ToolCall("c1", "dump")
    low, high = 0, limit  # the largest text the runner passes, found by bisection
    while low < high:
        middle = (low + high + 1) // 2
        if "error" in tool_message(call, "\x01" * middle, limit).metadata:
            high = middle - 1
        else:
            low = middle
    message = tool_message(call, "\x01" * low, limit)
    assert "error" not in message.metadata
    store = (FileStore(tmp_path / "log.jsonl", max_record_size=limit) if kind == "file"
             else SqliteStore(tmp_path / "log.db", max_record_size=limit))
    with store:
        store.append("\U0001d11e" * 256, [ToolReturned(turn=2**40, step=2**40, message=message)])


def test_a_second_cancel_while_the_stretch_finishes_still_ends_the_turn_through_call_io() -> None:
    async def main() -> ThreadPoolPort:
        port = ThreadPoolPort(asyncio.get_running_loop())
        port.followup("go")

        async def consume() -> list[Event]:
            runner = Runner(Script(calls("work"), FINAL), [tool(name="work")(lambda: "ok")],
                            offload=False)  # the held stretch leaves the turn open (see above)
            return [e async for e in runner.arun_turn(port)]

        task = asyncio.create_task(consume())
        await port.holding.wait()
        task.cancel()
        await asyncio.wait({task}, timeout=0.05)
        task.cancel()  # the host insists while the stretch still runs
        await asyncio.wait({task}, timeout=0.05)
        port.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return port

    port = asyncio.run(main())
    last = port.events[-1]
    assert isinstance(last, TurnEnded) and last.reason == "cancelled"
    # Recorded by the runner through call_io, not later by the generator's collection.
    assert port.ended_on is not threading.main_thread()
    assert not port.session.running and replay(list(port.events)) == port.session
