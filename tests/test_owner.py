"""The owner: the actor a host embeds. Nous's AgentServer cases, wake rules, durability, processes.

Every mid-run send here is made *by a tool while it runs*, which is exactly "a person typed while
the agent was working" and needs no sleeps: the tool returns only after the send is recorded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nous_inbox import Message, MessageSent, QueueClaimed, ToolCall, replay
from nous_inbox.errors import LeaseLostError
from nous_inbox.events import ModelRequested, StepEnded, StepStarted, TurnEnded, TurnStarted
from nous_inbox.owner import GroupCommitState, Owner
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from tests.helpers import wait_until
from tests.owner_faces import FACES, build

ROOT = Path(__file__).resolve().parent.parent
WAIT = 30  # seconds; a generous bound for a wait that should end at once, never a sync sleep
STRESS = max(1, int(os.environ.get("NOUS_INBOX_STRESS", "1")))


class ScriptedModel:
    """Calls ``work`` ``tool_steps`` times, then answers; records every transcript it was shown."""

    def __init__(self, tool_steps: int = 0) -> None:
        self.tool_steps = tool_steps
        self.requests: list[list[Message]] = []

    def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        self.requests.append(list(transcript))
        done = sum(1 for m in transcript if m.role == "tool")
        turn_tools = self._tools_this_turn(transcript)
        if turn_tools < self.tool_steps:
            return Message.assistant(tool_calls=[ToolCall(f"c{done}", "work", {"n": done})])
        return Message.assistant(f"done: {transcript[-1].content}")

    def _tools_this_turn(self, transcript: Sequence[Message]) -> int:
        count = 0
        for message in reversed(transcript):
            if message.role == "assistant" and not message.tool_calls:
                break  # the previous turn's final answer
            count += message.role == "tool"
        return count

    def contents(self, request: int) -> list[str]:
        return [m.content for m in self.requests[request]]


# Every test that builds its owner through make_owner runs against both faces of the owner, the
# threaded Owner and the AsyncOwner (through tests/owner_faces.py): one suite, one set of rules.
_FACE = {"name": "Owner"}


@pytest.fixture(autouse=True)
def owner_face(request: pytest.FixtureRequest) -> Iterator[str]:
    _FACE["name"] = getattr(request, "param", "Owner")
    yield _FACE["name"]
    _FACE["name"] = "Owner"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    names = metafunc.function.__code__.co_names
    if "make_owner" in names or "build" in names:
        metafunc.parametrize("owner_face", FACES, indirect=True)


def make_owner(
    model: ScriptedModel,
    during_tool: Callable[[Owner, int], None] | None = None,
    store_url: str = "memory:",
    stream: str = "s",
    **kwargs: Any,
) -> Owner:
    holder: dict[str, Owner] = {}

    def work(n: int) -> str:
        if during_tool is not None:
            during_tool(holder["owner"], n)
        return f"result {n}"

    owner: Owner = build(_FACE["name"], open_store(store_url), stream, Runner(model, [work]),
                         start=False, **kwargs)
    holder["owner"] = owner
    return owner


@pytest.fixture(params=["sqlite", "postgres"])
def durable_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A durable store nothing has used: the embedded SQLite default, then PostgreSQL."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:{tmp_path / 'inbox.sqlite'}"


def kinds(owner: Owner) -> list[str]:
    return [type(e).__name__ for e in owner.events()]


# -- Nous's AgentServer cases -------------------------------------------------------------------


def test_inject_does_not_wake_an_idle_agent() -> None:
    model = ScriptedModel()
    with make_owner(model) as owner:
        owner.inject("fyi: the deploy is frozen")
        assert owner.wait_idle(WAIT)
        assert model.requests == []
        assert kinds(owner) == ["MessageSent"]
        assert owner.inbox.count("next_step") == 1


def test_a_steer_wakes_it_and_an_earlier_injection_rides_along_in_one_request() -> None:
    model = ScriptedModel()
    with make_owner(model) as owner:
        owner.inject("fyi: the deploy is frozen")
        owner.steer("summarize")
        assert owner.wait_idle(WAIT)
    assert len(model.requests) == 1
    assert model.contents(0) == ["fyi: the deploy is frozen", "summarize"]


def test_a_followup_wakes_an_idle_agent_and_reaches_its_first_request() -> None:
    model = ScriptedModel()
    with make_owner(model) as owner:
        owner.followup("what changed?")
        assert owner.wait_idle(WAIT)
        assert model.contents(0) == ["what changed?"]
        assert owner.transcript[-1].content == "done: what changed?"


def test_a_two_step_run_records_turn_and_step_bookkeeping() -> None:
    model = ScriptedModel(tool_steps=1)
    with make_owner(model) as owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        events = owner.events()
    assert [type(e).__name__ for e in events] == [
        "MessageSent", "TurnStarted", "QueueClaimed",
        "StepStarted", "ModelRequested", "ModelReplied", "ToolCalled", "ToolReturned", "StepEnded",
        "StepStarted", "ModelRequested", "ModelReplied", "StepEnded",
        "TurnEnded",
    ]  # fmt: skip
    steps = [(e.turn, e.step) for e in events if isinstance(e, StepStarted)]
    assert steps == [(1, 1), (1, 2)]
    assert steps == [(e.turn, e.step) for e in events if isinstance(e, StepEnded)]
    (end,) = [e for e in events if isinstance(e, TurnEnded)]
    assert (end.turn, end.steps, end.reason) == (1, 2, "final")


def test_a_steer_sent_mid_run_is_claimed_by_the_next_step_not_the_current_one() -> None:
    model = ScriptedModel(tool_steps=2)

    def during(owner: Owner, n: int) -> None:
        if n == 0:
            owner.steer("use the EU region")

    with make_owner(model, during) as owner:
        owner.prompt("survey the logs")
        assert owner.wait_idle(WAIT)
    # request 0 was already in flight; request 1 sees the steer right after the tool's result
    assert "use the EU region" not in model.contents(0)
    assert model.contents(1)[-2:] == ["result 0", "use the EU region"]


def test_a_followup_sent_mid_run_waits_for_a_new_turn_which_the_runs_end_starts() -> None:
    model = ScriptedModel(tool_steps=1)

    def during(owner: Owner, n: int) -> None:
        if n == 0:
            owner.followup("then open a ticket")

    with make_owner(model, during) as owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        events = owner.events()
    first_turn = [r for r in model.requests if "then open a ticket" not in [m.content for m in r]]
    assert len(first_turn) == 2  # both requests of turn 1 went out without the followup
    assert model.contents(2)[-1] == "then open a ticket"
    assert [e.turn for e in events if isinstance(e, TurnStarted)] == [1, 2]


def test_an_inject_sent_mid_run_is_claimed_by_the_next_step_without_extending_the_run() -> None:
    model = ScriptedModel(tool_steps=1)

    def during(owner: Owner, n: int) -> None:
        owner.inject("fyi: disk is at 91%")

    with make_owner(model, during) as owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        events = owner.events()
    assert len(model.requests) == 2  # one tool step and the answer: no extra step for the inject
    assert model.contents(1)[-1] == "fyi: disk is at 91%"
    assert [e.turn for e in events if isinstance(e, TurnStarted)] == [1]


def test_a_steer_that_lands_after_the_last_claim_still_gets_its_run() -> None:
    model = ScriptedModel()
    seen_final = threading.Event()

    def on_event(event: Any) -> None:
        # Steer from inside the recording of the final reply: after the turn's last claim.
        if isinstance(event, TurnEnded) and event.turn == 1 and not seen_final.is_set():
            seen_final.set()
            holder["owner"].steer("one more thing")

    holder: dict[str, Owner] = {}
    owner = make_owner(model, listen=on_event)
    holder["owner"] = owner
    with owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        assert [e.turn for e in owner.events() if isinstance(e, TurnStarted)] == [1, 2]
        assert model.contents(1)[-1] == "one more thing"
        assert not owner.inbox.has_pending()


def test_a_prompt_that_lands_as_a_cancelled_turn_ends_still_gets_its_turn() -> None:
    model = ScriptedModel(tool_steps=1)
    holder: dict[str, Owner] = {}
    handles: list[Any] = []

    def during(owner: Owner, n: int) -> None:
        owner.cancel()

    def on_event(event: Any) -> None:
        # Prompt from inside the recording of the cancelled turn's end: the run is stopping,
        # its last decision not made yet.
        if isinstance(event, TurnEnded) and event.reason == "cancelled":
            handles.append(holder["owner"].prompt("and now this"))

    owner = make_owner(model, during, listen=on_event)
    holder["owner"] = owner
    with owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        (handle,) = handles
        result = handle.result(timeout=WAIT)
        assert (result.turn, result.text) == (2, "done: and now this")
        assert [e.reason for e in owner.events() if isinstance(e, TurnEnded)] == [
            "cancelled", "final"]


def test_a_prompt_that_lands_as_a_failed_turn_ends_still_gets_its_turn() -> None:
    def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        if transcript[-1].content == "fail":
            raise RuntimeError("the model is down")
        return Message.assistant(f"done: {transcript[-1].content}")

    holder: dict[str, Owner] = {}
    handles: list[Any] = []

    def on_event(event: Any) -> None:
        if isinstance(event, TurnEnded) and event.reason == "error":
            handles.append(holder["owner"].prompt("and now this"))

    owner = build(_FACE["name"], open_store("memory:"), "s", Runner(model), start=False,
                  listen=on_event)
    holder["owner"] = owner
    with owner:
        owner.prompt("fail")
        with pytest.raises(RuntimeError, match="the model is down"):
            owner.wait_idle(WAIT)  # (idle once the prompt's turn, too, has ended)
        assert owner.wait_idle(WAIT)
        (handle,) = handles
        assert handle.result(timeout=WAIT).text == "done: and now this"
        assert [e.reason for e in owner.events() if isinstance(e, TurnEnded)] == ["error", "final"]


# -- ruling 4: a blank message is never worth a model round --------------------------------------


@pytest.mark.parametrize("target", ["next_step", "next_turn"])
def test_a_blank_waking_message_sent_to_an_idle_owner_starts_no_run(target: str) -> None:
    model = ScriptedModel()
    with make_owner(model) as owner:
        owner.send("   \n", target, True)
        assert owner.wait_idle(WAIT)
        assert model.requests == []  # the model is never asked with ['   \n']
        assert kinds(owner) == ["MessageSent"]
        assert owner.inbox.count() == 1  # still queued: nothing is lost


@pytest.mark.parametrize("verb", ["followup", "prompt"])
def test_a_blank_prompt_or_followup_is_refused_as_no_turn_would_ever_answer_it(verb: str) -> None:
    with make_owner(ScriptedModel()) as owner:
        with pytest.raises(ValueError, match=f"{verb}: the message is blank"):
            getattr(owner, verb)(" \t\n")
        assert owner.events() == []  # nothing was sent
        owner.steer(" ")  # a blank steer is taken: it rides along with the next request
        assert owner.inbox.count() == 1


def test_a_blank_message_is_claimed_with_the_next_request_something_else_causes() -> None:
    model = ScriptedModel()
    with make_owner(model) as owner:
        owner.steer(" ")
        owner.steer("summarize")
        assert owner.wait_idle(WAIT)
        assert model.contents(0) == [" ", "summarize"]
        assert not owner.inbox.has_pending()
        assert replay(owner.events()) == owner.session


def test_a_blank_steer_that_lands_after_the_last_claim_opens_no_new_turn() -> None:
    model = ScriptedModel()
    holder: dict[str, Owner] = {}

    def on_event(event: Any) -> None:
        if isinstance(event, TurnEnded) and event.turn == 1:
            holder["owner"].steer("\t ")

    owner = make_owner(model, listen=on_event)
    holder["owner"] = owner
    with owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        assert [e.turn for e in owner.events() if isinstance(e, TurnStarted)] == [1]
        assert len(model.requests) == 1
        assert owner.inbox.count("next_step") == 1  # waits for the next request, not lost
        assert replay(owner.events()) == owner.session


def test_cancelling_a_run_wakes_nothing_and_queued_messages_stay() -> None:
    model = ScriptedModel(tool_steps=3)

    def during(owner: Owner, n: int) -> None:
        owner.steer("please also check prod")
        owner.cancel()

    with make_owner(model, during) as owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        ends = [e for e in owner.events() if isinstance(e, TurnEnded)]
        assert [e.reason for e in ends] == ["cancelled"]
        assert [m.content for m, _ in owner.inbox.entries("next_step")] == ["please also check prod"]
        assert owner.inbox.wants_wake()  # the steer still owes a run...
        owner.inject("context for later")  # ...but a non-waking send is no reason to start one
        assert owner.wait_idle(WAIT)
        assert len([e for e in owner.events() if isinstance(e, TurnStarted)]) == 1
        owner.steer("now go on")  # a real wake starts the next run, and it takes everything queued
        assert owner.wait_idle(WAIT)
        assert model.contents(-1)[-3:] == ["please also check prod", "context for later", "now go on"]


# -- the actor: threads, one run at a time, failures ----------------------------------------------


def test_sends_from_many_threads_are_each_delivered_once_and_runs_never_overlap() -> None:
    model = ScriptedModel(tool_steps=1)
    open_turns: list[int] = []
    overlaps: list[int] = []

    def on_event(event: Any) -> None:
        if isinstance(event, TurnStarted):
            if open_turns:
                overlaps.append(event.turn)
            open_turns.append(event.turn)
        elif isinstance(event, TurnEnded):
            open_turns.remove(event.turn)

    with make_owner(model, listen=on_event) as owner:
        barrier = threading.Barrier(4)

        def sender(k: int) -> None:
            barrier.wait()
            for i in range(25):
                owner.steer(f"t{k}-{i}")

        threads = [threading.Thread(target=sender, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert owner.wait_idle(WAIT)
        delivered = [m.content for m in owner.transcript if m.role == "user"]
        assert sorted(delivered) == sorted(f"t{k}-{i}" for k in range(4) for i in range(25))
        for k in range(4):  # each sender's messages keep their order
            mine = [c for c in delivered if c.startswith(f"t{k}-")]
            assert mine == [f"t{k}-{i}" for i in range(25)]
        assert not owner.inbox.has_pending()
        assert overlaps == []
        assert owner.session == replay(owner.events())


def test_bad_input_is_refused_and_nothing_is_written() -> None:
    with make_owner(ScriptedModel()) as owner:
        for call in (
            lambda: owner.send("hi", "later", True),
            lambda: owner.send("hi", "next_step", 1),
            lambda: owner.send(42, "next_step", True),
            lambda: owner.steer(Message.user("x", metadata={"f": print})),
        ):
            with pytest.raises((TypeError, ValueError)):
                call()
        assert owner.events() == []
        assert owner.session.version == 0


def test_a_failing_model_ends_the_turn_as_an_error_and_wait_idle_reports_it(owner_face: str) -> None:
    def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        raise RuntimeError("the model is down")

    with build(owner_face, open_store("memory:"), "s", Runner(model), start=False) as owner:
        owner.steer("go")
        with pytest.raises(RuntimeError, match="the model is down"):
            owner.wait_idle(WAIT)
        (end,) = [e for e in owner.events() if isinstance(e, TurnEnded)]
        assert end.reason == "error"
        assert owner.wait_idle(WAIT)  # reported once
        assert owner.session == replay(owner.events())


def test_live_state_equals_the_replayed_log() -> None:
    model = ScriptedModel(tool_steps=2)

    def during(owner: Owner, n: int) -> None:
        owner.inject(f"note {n}")
        if n == 1:
            owner.followup("and then?")

    with make_owner(model, during) as owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        assert owner.session == replay(owner.events())


# -- durability: resume, crash, other processes ---------------------------------------------------


def test_an_owner_opened_on_an_existing_store_resumes_with_the_same_inbox_and_transcript(
    durable_url: str,
) -> None:
    url = durable_url
    with make_owner(ScriptedModel(), store_url=url) as first:
        first.prompt("go")
        assert first.wait_idle(WAIT)
        first.inject("for later")
        before = first.session
    with make_owner(ScriptedModel(), store_url=url) as second:
        assert second.session == before
        assert second.inbox.count("next_step") == 1


def test_a_turn_cut_off_by_a_crash_is_closed_as_an_error_on_resume(durable_url: str) -> None:
    url = durable_url
    store = open_store(url)
    store.append("s", [MessageSent(target="next_step", wakeup=True, message=Message.user("go")),
                       TurnStarted(turn=1), QueueClaimed(target="next_turn", count=0)][:2])
    store.close()
    model = ScriptedModel()
    with make_owner(model, store_url=url) as owner:
        ends = [e for e in owner.events() if isinstance(e, TurnEnded)]
        assert [(e.turn, e.reason) for e in ends] == [(1, "error")]
        assert not owner.session.running
        owner.steer("again")  # the queued steer was never claimed; a new run takes both
        assert owner.wait_idle(WAIT)
        assert model.contents(0) == ["go", "again"]


def test_a_steer_from_another_process_reaches_the_run_at_its_next_step(durable_url: str) -> None:
    url = durable_url
    model = ScriptedModel(tool_steps=2)

    def during(owner: Owner, n: int) -> None:
        if n == 0:  # another terminal: the CLI, in its own process
            subprocess.run(
                [sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s", "from the CLI"],
                check=True, capture_output=True, cwd=ROOT,
            )

    with make_owner(model, during, store_url=url) as owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        assert model.contents(1)[-2:] == ["result 0", "from the CLI"]
        assert owner.session == replay(owner.events())


def test_an_idle_owner_wakes_for_a_steer_another_process_appended(durable_url: str) -> None:
    url = durable_url
    model = ScriptedModel()
    answered = threading.Event()

    def on_event(event: Any) -> None:
        if isinstance(event, TurnEnded):
            answered.set()

    with make_owner(model, store_url=url, listen=on_event, poll_interval=0.01) as owner:
        subprocess.run(
            [sys.executable, "-m", "nous_inbox", "steer", "--create", "--store", url, "s",
             "wake up"],  # the owner waits on a session with no events yet
            check=True, capture_output=True, cwd=ROOT,
        )
        assert answered.wait(WAIT)
        assert owner.wait_idle(WAIT)
        assert model.contents(0) == ["wake up"]


CHILD = r"""
import sys
import threading
from nous_inbox.events import ModelRequested
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from tests.owner_faces import build

def model(transcript, tools):
    if transcript[-1].role == "user":
        return Message.assistant(tool_calls=[ToolCall("c", "work", {})])
    return Message.assistant("ok")

def work():
    return "done"

requested = threading.Event()  # a run has recorded a model request

def heard(event):
    if isinstance(event, ModelRequested):
        requested.set()

owner = build(sys.argv[2], open_store(sys.argv[1]), "s", Runner(model, [work]), watch=False,
              listen=heard)
for i in range(100000):
    owner.steer(f"m{i}")
    # acknowledged: the send is durable; "run": a run is under way
    print(f"m{i}", "run" if requested.is_set() else "", flush=True)
"""


@pytest.mark.parametrize("scheme", ["sqlite", "file"])
@pytest.mark.parametrize("kill_after", [1, 40, 150])  # acknowledged sends before the SIGKILL
def test_a_killed_owner_loses_no_message_and_doubles_none(
    tmp_path: Path, scheme: str, kill_after: int, owner_face: str
) -> None:
    url = f"{scheme}:{tmp_path / 'log'}"
    assert build  # the child builds its owner of this face
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, owner_face], stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert child.stdout is not None
    acknowledged: list[str] = []
    under_way = kill_after == 1  # past the first send, the kill waits for a run under way
    for line in child.stdout:
        sent, *run = line.split()
        acknowledged.append(sent)
        under_way = under_way or bool(run)
        if len(acknowledged) >= kill_after and under_way:
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    acknowledged.extend(word for line in child.stdout for word in line.split()[:1])  # (dying)

    store = open_store(url)
    session = replay(store.read("s"), stream="s")
    queued = [m.content for m, _ in session.inbox.entries("next_step")]
    delivered = [m.content for m in session.transcript if m.role == "user"]
    everywhere = queued + delivered
    assert len(everywhere) == len(set(everywhere)), "a message was doubled"
    assert set(acknowledged) <= set(everywhere), "an acknowledged message was lost"
    if kill_after > 1:
        assert any(isinstance(e, ModelRequested) for e in store.read("s"))  # runs were under way
    store.close()


# -- races and failures the review found ----------------------------------------------------------


def test_a_steer_another_writer_appended_wakes_an_owner_that_noticed_it_while_injecting(
    owner_face: str,
) -> None:
    store = open_store("memory:")
    model = ScriptedModel()
    with build(owner_face, store, "s", Runner(model), watch=False, start=False) as owner:
        store.append("s", [MessageSent(target="next_step", wakeup=True,
                                       message=Message.user("from elsewhere"))])
        owner.inject("fyi")  # conflicts, catches up with the steer, and must answer its wake
        assert owner.wait_idle(WAIT)
        assert model.contents(0) == ["from elsewhere", "fyi"]


def test_the_same_words_steered_again_after_the_last_claim_still_get_their_run() -> None:
    model = ScriptedModel()
    holder: dict[str, Owner] = {}

    def on_event(event: Any) -> None:
        if isinstance(event, TurnEnded) and event.turn == 1:
            holder["owner"].steer("go")

    owner = make_owner(model, listen=on_event)
    holder["owner"] = owner
    with owner:
        owner.steer("go")
        assert owner.wait_idle(WAIT)
        assert [e.turn for e in owner.events() if isinstance(e, TurnStarted)] == [1, 2]
        assert not owner.inbox.has_pending()


def test_cancel_right_after_a_waking_send_is_honoured_before_the_turn_starts() -> None:
    model = ScriptedModel()
    holder: dict[str, Owner] = {}
    cancelled: list[bool] = []

    def on_event(event: Any) -> None:
        # A listener's sends commit at once, and the run its steer wakes starts its turn only
        # once the listener returned: the cancel lands between the two.
        if isinstance(event, MessageSent) and event.message.content == "hold":
            holder["owner"].steer("go")
            cancelled.append(holder["owner"].cancel())

    # Threaded only: an AsyncOwner tells its listeners after the fold, so there the steer's
    # run starts after the listener returns (test_async_owner.py has that owner's case).
    owner = Owner(open_store("memory:"), "s", Runner(model), start=False, listen=on_event)
    holder["owner"] = owner
    with owner:
        owner.inject("hold")
        assert owner.wait_idle(WAIT)
        assert cancelled == [True]  # a run was going
        assert model.requests == []
        assert [m.content for m, _ in owner.inbox.entries("next_step")] == ["hold", "go"]


class _LockedStore:
    """A store whose every append times out on a lock: a refusal with nothing new to read."""

    def __init__(self) -> None:
        self.inner = open_store("memory:")
        self.appends = 0

    def append(self, stream: str, events: Any, expected_version: Any = None) -> Any:
        from nous_inbox.store import StoreLockedError

        self.appends += 1
        raise StoreLockedError("the log's lock was still held after 10 s")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_lock_timeout_is_reported_not_retried_forever(owner_face: str) -> None:
    from nous_inbox import ConcurrencyError

    store = _LockedStore()
    with build(owner_face, store, "s", Runner(ScriptedModel()), watch=False, start=False) as owner:  # type: ignore[arg-type]
        with pytest.raises(ConcurrencyError, match="lock"):
            owner.steer("go")
        assert store.appends == 1
        assert owner.session.version == 0


class _FailingStore:
    """A store that fails once, on the append of the model's reply, then recovers."""

    def __init__(self) -> None:
        self.inner = open_store("memory:")
        self.failed = False

    def append(self, stream: str, events: Any, expected_version: Any = None) -> Any:
        if not self.failed and any(type(e).__name__ == "ModelReplied" for e in events):
            self.failed = True
            raise OSError("disk full")
        return self.inner.append(stream, events, expected_version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_run_the_store_failed_under_still_gets_its_turn_ended(owner_face: str) -> None:
    store = _FailingStore()
    with build(owner_face, store, "s", Runner(ScriptedModel()), watch=False, start=False) as owner:  # type: ignore[arg-type]
        owner.steer("go")
        with pytest.raises(OSError, match="disk full"):
            owner.wait_idle(WAIT)
        assert not owner.session.running
        (end,) = [e for e in owner.events() if isinstance(e, TurnEnded)]
        assert end.reason == "error" and "disk full" in (end.error or "")
        assert owner.session == replay(owner.events())


class _SteeredAtTheEnd(_FailingStore):
    """:class:`_FailingStore`, where another process steers just before the owner records the
    failed turn's end: the owner's append meets the steer, reads it, and appends again."""

    steered = False

    def append(self, stream: str, events: Any, expected_version: Any = None) -> Any:
        if self.failed and not self.steered and any(type(e) is TurnEnded for e in events):
            self.steered = True
            self.inner.append(stream, [MessageSent(target="next_step", wakeup=True,
                                                   message=Message.user("from elsewhere"))])
        return super().append(stream, events, expected_version)


def test_a_send_read_while_a_failed_run_records_its_end_gets_a_run_that_counts_as_running(
    owner_face: str,
) -> None:
    asked, release = threading.Event(), threading.Event()

    def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        if transcript[-1].content == "from elsewhere":
            asked.set()
            assert release.wait(WAIT)
        return Message.assistant(f"done: {transcript[-1].content}")

    store = _SteeredAtTheEnd()
    with build(owner_face, store, "s", Runner(model), watch=False, start=False) as owner:  # type: ignore[arg-type]
        owner.steer("go")
        assert asked.wait(WAIT)  # the steer's run started while the failed one recorded its end
        assert owner.running  # ... and it is the owner's run: waits wait for it
        release.set()
        with pytest.raises(OSError, match="disk full"):
            owner.wait_idle(WAIT)
        assert owner.wait_idle(WAIT)
        assert [e.reason for e in owner.events() if isinstance(e, TurnEnded)] == ["error", "final"]


def test_a_prompt_opens_a_turn_recorded_as_a_prompt() -> None:
    with make_owner(ScriptedModel()) as owner:
        owner.prompt("hello")
        assert owner.wait_idle(WAIT)
        owner.steer("and this")
        assert owner.wait_idle(WAIT)
        reasons = [e.reason for e in owner.events() if isinstance(e, TurnStarted)]
        assert reasons == ["prompt", "wake"]


def test_a_prompt_the_store_refused_does_not_make_the_next_turn_a_prompt() -> None:
    with make_owner(ScriptedModel()) as owner:
        limit = open_store("memory:").max_record_size  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="limit"):
            owner.prompt("x" * (limit + 1))
        with pytest.raises(TypeError):
            owner.prompt(7)  # type: ignore[arg-type]
        owner.steer("go")
        assert owner.wait_idle(WAIT)
        assert [e.reason for e in owner.events() if isinstance(e, TurnStarted)] == ["wake"]


def test_a_steer_another_process_appended_during_the_final_request_extends_the_run(
    owner_face: str,
) -> None:
    store = open_store("memory:")

    class Model(ScriptedModel):
        def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
            if len(self.requests) == 0:  # another process steers while the answer is composed
                store.append("s", [MessageSent(target="next_step", wakeup=True,
                                               message=Message.user("one more thing"))])
            return super().__call__(transcript, tools)

    model = Model()
    with build(owner_face, store, "s", Runner(model), watch=False, start=False) as owner:
        owner.prompt("go")
        assert owner.wait_idle(WAIT)
        assert [e.turn for e in owner.events() if isinstance(e, TurnStarted)] == [1]
        assert model.contents(1)[-1] == "one more thing"


def test_a_session_has_one_owner_at_a_time_even_across_processes(durable_url: str) -> None:
    from nous_inbox import StreamOwnedError

    url = durable_url
    with make_owner(ScriptedModel(), store_url=url) as first:
        first.steer("go")
        assert first.wait_idle(WAIT)
        with pytest.raises(StreamOwnedError, match="another owner holds stream 's'"):
            make_owner(ScriptedModel(), store_url=url)
        other = subprocess.run(
            [sys.executable, "-m", "nous_inbox", "run", "--store", url, "s", "--steps", "1",
             "--step-seconds", "0"], capture_output=True, text=True, cwd=ROOT,
        )
        assert other.returncode == 1 and "another owner holds stream 's'" in other.stderr
        assert [e.turn for e in first.events() if isinstance(e, TurnStarted)] == [1]
    with make_owner(ScriptedModel(), store_url=url) as second:  # released on close
        assert second.session.turn == 1


def test_sends_from_asyncio_tasks_are_safe_and_never_wait_for_a_run() -> None:
    import asyncio

    model = ScriptedModel(tool_steps=1)

    async def host(owner: Owner) -> None:
        async def person(k: int) -> None:
            for i in range(10):
                owner.steer(f"a{k}-{i}")  # returns once recorded; the run goes on elsewhere
                await asyncio.sleep(0)  # let the other tasks interleave (not a synchronisation)

        await asyncio.gather(*(person(k) for k in range(3)))
        assert await asyncio.to_thread(owner.wait_idle, WAIT)

    with make_owner(model) as owner:
        asyncio.run(host(owner))
        delivered = [m.content for m in owner.transcript if m.role == "user"]
        assert sorted(delivered) == sorted(f"a{k}-{i}" for k in range(3) for i in range(10))
        assert owner.session == replay(owner.events())


# -- group commit: concurrent sends share one transaction ------------------------------------------


def test_concurrent_senders_lose_nothing_double_nothing_and_none_returns_before_its_commit(
    store: Any, owner_face: str,
) -> None:
    senders, each = 8, 10 * STRESS
    early: list[int] = []
    with build(owner_face, store, "s", Runner(ScriptedModel()), watch=False) as owner:
        barrier = threading.Barrier(senders)

        def sender(k: int) -> None:
            barrier.wait()
            for i in range(each):
                stored = owner.inject(f"t{k}-{i}")
                # Acknowledged means committed: the store already holds it at that position.
                if store.version("s") < stored.seq:
                    early.append(stored.seq)

        threads = [threading.Thread(target=sender, args=(k,)) for k in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert early == []
        logged = [e.message.content for e in owner.events() if isinstance(e, MessageSent)]
        assert sorted(logged) == sorted(f"t{k}-{i}" for k in range(senders) for i in range(each))
        for k in range(senders):  # each sender's messages keep their order in the log
            assert [c for c in logged if c.startswith(f"t{k}-")] == [f"t{k}-{i}" for i in range(each)]
        assert [e.seq for e in owner.events()] == list(range(1, senders * each + 1))
        assert owner.session == replay(owner.events())


def _finishes(work: Callable[[], object]) -> bool:
    """Run ``work`` on a daemon thread; whether it ended within WAIT (a hang fails, not hangs)."""
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(WAIT)
    return not thread.is_alive()


def test_a_listener_that_sends_from_inside_a_commit_does_not_deadlock_its_owner(
    owner_face: str,
) -> None:
    def answer(event: Any) -> None:
        # Called inside the commit of "ping", on the thread leading the group commit.
        if isinstance(event, MessageSent) and event.message.content == "ping":
            owner.inject("pong")

    owner = build(owner_face, _Blocking(), "s", Runner(ScriptedModel()), watch=False,
                  listen=answer)
    assert _finishes(lambda: owner.inject("ping"))  # (not closed if it hangs: close would too)
    with owner:
        assert [e.message.content for e in owner.events()] == ["ping", "pong"]  # type: ignore[attr-defined]
        assert owner.session == replay(owner.events())


class _Blocking:
    """A ``memory:`` store that says its calls block, as a durable store does: the owner then
    sends through its group commit rather than inline."""

    blocking = True

    def __init__(self) -> None:
        self.inner = open_store("memory:")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_send_from_a_thread_holding_the_owner_lock_commits_at_once_beside_a_group_commit(
) -> None:
    # The run's worker holds the owner's lock inside ``record`` while its listeners run; a
    # listener's send must not queue behind a leader that is itself waiting for that lock.
    steered, listened = threading.Event(), threading.Event()
    leader = threading.Thread(target=lambda: owner.inject("from the leader"), daemon=True)

    def on_event(event: Any) -> None:
        if not isinstance(event, TurnStarted):
            return
        assert steered.wait(WAIT)  # on the run's worker, inside record; the steer's commit over
        leader.start()
        # The other thread has taken its batch and commits it: it waits for this thread's lock.
        wait_until(lambda: owner.group_commit == GroupCommitState(0, committing=True, senders=1),
                   what="the other thread leads a commit", timeout=WAIT)
        owner.inject("from a listener")
        listened.set()

    owner = Owner(_Blocking(), "s", Runner(ScriptedModel()), watch=False,  # type: ignore[arg-type]
                  listen=on_event)
    owner.steer("go")
    steered.set()
    assert listened.wait(WAIT)  # (not closed if it hangs: close would too)
    with owner:
        leader.join(WAIT)
        assert owner.wait_idle(WAIT)
        sent = [e.message.content for e in owner.events() if isinstance(e, MessageSent)]
        assert sent == ["go", "from a listener", "from the leader"]


# -- options: checked before anything happens -------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"poll_interval": 0}, ValueError, "poll_interval must be a positive number"),
        ({"poll_interval": -1.5}, ValueError, "poll_interval must be a positive number"),
        ({"poll_interval": "fast"}, TypeError, "poll_interval must be a number of seconds"),
        ({"watch": "yes"}, TypeError, "watch must be a bool, got str"),
        ({"start": 1}, TypeError, "start must be a bool, got int"),
        ({"listen": "print"}, TypeError, "listen must be callable or None, got str"),
        ({"runner": lambda transcript, tools: "ok"}, TypeError, "runner must have run_turn"),
        ({"stream": 7}, TypeError, "stream must be a str, got int"),
    ],
)
def test_a_bad_option_is_refused_before_the_stream_is_taken(
    options: dict[str, Any], error: type[Exception], words: str
) -> None:
    store = open_store("memory:")
    args = {"stream": "s", "runner": Runner(ScriptedModel()), **options}
    stream, runner = args.pop("stream"), args.pop("runner")
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        Owner(store, stream, runner, **args)
    with Owner(store, "s", Runner(ScriptedModel())) as owner:  # the lease was never taken
        assert owner.session.version == 0


def test_a_send_the_store_refuses_raises_for_its_sender_and_later_sends_go_on(
    owner_face: str,
) -> None:
    store = _Blocking()  # a durable store's path: the refusal comes out of the group commit
    with build(owner_face, store, "s", Runner(ScriptedModel()), watch=False) as owner:
        limit = store.inner.max_record_size  # type: ignore[attr-defined]
        with pytest.raises(ValueError, match="limit"):
            owner.inject("x" * (limit + 1))
        assert owner.inject("ok").seq == 1  # the refusal left the group commit ready for more
        assert [e.message.content for e in owner.events()] == ["ok"]  # type: ignore[attr-defined]


class _Fenced:
    """A store that fences every append once ``fenced`` is set, as PostgreSQL does when another
    owner took the lease over (``LeaseLostError``, nothing written)."""

    def __init__(self) -> None:
        self._inner = open_store("memory:")
        self.fenced = False

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if self.fenced:
            raise LeaseLostError("lease of stream 's' was taken over; nothing was written",
                                 stream="s", epoch=1)
        return self._inner.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_an_owner_whose_lease_was_taken_over_says_it_is_closed() -> None:
    # As an AsyncOwner says: it refuses every send from then on, so a host (or a mailbox it is
    # attached to) can read ``closed`` and let it go.
    store = _Fenced()
    owner = Owner(store, "s", Runner(lambda transcript, tools: "ok"))  # type: ignore[arg-type]
    owner.inject("before")
    assert not owner.closed
    store.fenced = True
    with pytest.raises(LeaseLostError):
        owner.inject("after")
    assert owner.lost is not None and owner.closed
    owner.close()
