"""Agent messages are inbox items, not turns: wake classes, debounce, the bounded wait, notices.

The clock is a list the test moves forward (``clock.now``), so no test sleeps. Agents run by a
real :class:`~nous_inbox.owner.Owner`; a mid-run send is made by a tool while it runs, which is
"another agent wrote while this one was working" and needs no sleeps either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from nous_inbox.events import (
    Event,
    MailAgent,
    MailNoticed,
    MailReceived,
    MailSent,
    MessageSent,
    StepStarted,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.mailbox import DEBOUNCE, NOTICE, Mailbox, MailboxState, compose, plan
from nous_inbox.message import Message, ToolCall
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.session import Session
from nous_inbox.store import Store, open_store
from nous_inbox.store.journal import claim_event
from nous_inbox.verbs import Target

WAIT = 30  # seconds: a bound for a wait that should end at once, never a synchronisation sleep


class Clock:
    """A clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Model:
    """Calls ``work`` for the first ``tool_steps`` steps of each turn, then answers."""

    def __init__(self, tool_steps: int = 0) -> None:
        self.tool_steps = tool_steps
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
        return Message.assistant("ok")


def notices(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if m.metadata.get("provenance") == NOTICE]


def make(
    model: Model, during_tool: Callable[[], None] | None = None, store: Store | None = None,
    **options: Any,
) -> tuple[Mailbox, Owner, Clock]:
    clock = Clock()
    box = Mailbox(store, clock=clock, **options)

    def work() -> str:
        if during_tool is not None:
            during_tool()
        return "worked"

    owner = Owner(store or open_store("memory:"), "dev", Runner(model, [work]), watch=False)
    box.attach("dev", owner)
    return box, owner, clock


# -- wake classes (pure) -------------------------------------------------------------------------


def test_an_fyi_never_wakes_an_idle_agent() -> None:
    box = Mailbox(clock=Clock())
    qa = box.agent("qa")
    qa.send("dev", "fyi", kind="fyi")
    assert box.state.oldest_fresh("dev", waking=True) is None


def test_a_blocker_may_wake() -> None:
    box = Mailbox()
    qa, stranger = box.agent("qa"), box.agent("stranger")
    qa.send("dev", "fyi", kind="fyi")
    stranger.send("dev", "which branch?", kind="question")
    woken = box.state.oldest_fresh("dev", waking=True)
    assert woken is not None and woken.event.kind == "blocker"


def test_before_its_first_turn_any_action_is_first_work_after_it_only_the_parents() -> None:
    box = Mailbox()
    dev, lead, stranger = box.agent("dev", parent="lead"), box.agent("lead"), box.agent("x")
    stranger.send("dev", "build it")
    dev.receive()
    stranger.send("dev", "also this")
    lead.send("dev", "and this")
    waking = [m.event.body for m in box.state.fresh("dev") if m.wakes]
    assert waking == ["and this"]
    assert box.state.box("dev").parent == "lead"  # declared, not who sent the first work


def test_an_action_from_a_stranger_after_the_first_work_does_not_wake() -> None:
    box = Mailbox()
    dev = box.agent("dev")
    box.agent("lead").send("dev", "build it")
    dev.receive()
    box.agent("stranger").send("dev", "do my thing")
    assert box.state.oldest_fresh("dev", waking=True) is None


@pytest.mark.parametrize("kind", ["report", "result"])
def test_a_report_or_result_wakes_the_agent_that_gave_out_the_work(kind: str) -> None:
    box = Mailbox()
    lead, worker = box.agent("lead"), box.agent("worker")
    worker.send("lead", "hello")
    lead.receive()  # the lead has worked: no message is its first work any more
    lead.send("worker", "index the logs")
    worker.send("lead", "indexed", kind=kind)
    box.agent("someone").send("lead", f"unrelated {kind}", kind=kind)
    assert [m.event.body for m in box.state.fresh("lead") if m.wakes] == ["indexed"]


@pytest.mark.parametrize("kind", ["report", "result"])
def test_a_report_that_did_not_wake_wakes_once_its_sender_was_given_work(kind: str) -> None:
    box = Mailbox()
    lead, worker = box.agent("lead"), box.agent("worker")
    worker.send("lead", "hello")
    lead.receive()  # the lead has worked
    worker.send("lead", "unasked", kind=kind)
    lead.send("worker", "index the logs")
    worker.send("lead", "indexed", kind=kind)
    assert [m.event.body for m in box.state.fresh("lead") if m.wakes] == ["indexed"]


def test_an_action_that_did_not_wake_wakes_once_its_sender_is_declared_the_parent() -> None:
    state = MailboxState()
    state.apply(MailSent(id="1", sender="x", recipient="dev", body="first work"))
    state.apply(MailReceived(recipient="dev", ids=("1",)))  # dev has worked
    state.apply(MailSent(id="2", sender="lead", recipient="dev", body="before"))
    state.apply(MailAgent(agent="dev", parent="lead"))
    state.apply(MailSent(id="3", sender="lead", recipient="dev", body="after"))
    assert [m.event.body for m in state.fresh("dev") if m.wakes] == ["after"]


@pytest.mark.parametrize("kind", ["action", "result"])
def test_a_result_is_first_work_as_an_action_is(kind: str) -> None:
    clock = Clock()
    box = Mailbox(clock=clock)
    box.agent("lead").send("worker", "the logs are yours to index", kind=kind)
    assert [m.event.body for m in box.state.fresh("worker") if m.wakes] == [
        "the logs are yours to index"]
    assert plan(box.state, "worker", clock.now + DEBOUNCE, running=False,
                prompt_waiting=False)[0] == "followup"


@pytest.mark.parametrize("kind", ["action", "result"])
def test_a_result_from_the_parent_wakes_as_an_action_does(kind: str) -> None:
    box = Mailbox()
    lead, worker = box.agent("lead"), box.agent("worker", parent="lead")
    lead.send("worker", "first")
    worker.receive()  # it has worked
    box.agent("stranger").send("worker", "from a stranger", kind=kind)
    lead.send("worker", "from the parent", kind=kind)
    assert [m.event.body for m in box.state.fresh("worker") if m.wakes] == ["from the parent"]


def test_a_result_gives_out_no_work_so_results_never_wake_each_other_back() -> None:
    box = Mailbox()
    lead, worker = box.agent("lead"), box.agent("worker")
    for handle in (lead, worker):
        box.agent(f"first for {handle.name}").send(handle.name, "first")
        handle.receive()  # both have worked
    worker.send("lead", "done", kind="result")
    lead.send("worker", "thanks", kind="result")
    assert [m for m in box.state.fresh("worker") if m.wakes] == []
    assert [m for m in box.state.fresh("lead") if m.wakes] == []


# -- when a notice goes (pure) -------------------------------------------------------------------


def test_a_waking_burst_waits_the_debounce_then_is_one_notice() -> None:
    clock = Clock()
    box = Mailbox(clock=clock)
    lead, qa = box.agent("lead"), box.agent("qa")
    lead.send("dev", "q1", kind="blocker")
    clock.now += 1.5
    qa.send("dev", "q2", kind="blocker")
    assert plan(box.state, "dev", clock.now, running=False, prompt_waiting=False) == (
        None, 1002.0)
    assert plan(box.state, "dev", 1002.0, running=False, prompt_waiting=False)[0] == "followup"


def test_the_debounce_and_the_bounded_wait_are_configurable() -> None:
    box = Mailbox(clock=Clock())
    qa = box.agent("qa")
    qa.send("dev", "fyi", kind="fyi")
    qa.send("dev", "q", kind="blocker")
    assert plan(box.state, "dev", 1000.0, running=False, prompt_waiting=False, debounce=5.0,
                max_wait=3.0) == (None, 1003.0)


def test_messages_that_cannot_wake_wait_at_most_the_bounded_time() -> None:
    box = Mailbox(clock=Clock())
    qa = box.agent("qa")
    qa.send("dev", "fyi", kind="fyi")
    assert plan(box.state, "dev", 1599.0, running=False, prompt_waiting=False) == (None, 1600.0)
    assert plan(box.state, "dev", 1600.0, running=False, prompt_waiting=False)[0] == "followup"


def test_in_a_running_turn_a_notice_waits_for_the_next_boundary() -> None:
    box = Mailbox(clock=Clock())
    qa = box.agent("qa")
    qa.send("dev", "fyi", kind="fyi")
    assert plan(box.state, "dev", 1000.0, running=True, prompt_waiting=False) == (None, None)
    assert plan(box.state, "dev", 1000.0, boundary="turn_opening", running=True,
                prompt_waiting=False)[0] == "join"


def test_at_a_step_boundary_a_notice_steers_only_when_something_in_it_may_wake() -> None:
    box = Mailbox(clock=Clock())
    qa = box.agent("qa")
    qa.send("dev", "fyi", kind="fyi")
    def at_step() -> str | None:
        return plan(box.state, "dev", 1000.0, boundary="step", running=True,
                    prompt_waiting=False)[0]

    assert at_step() == "inject"  # an FYI alone never extends a run
    qa.send("dev", "which branch?", kind="blocker")
    assert at_step() == "steer"


def test_with_a_prompt_waiting_a_notice_joins_that_prompts_turn() -> None:
    box = Mailbox(clock=Clock())
    qa = box.agent("qa")
    qa.send("dev", "fyi", kind="fyi")
    assert plan(box.state, "dev", 1000.0, boundary="step", running=True,
                prompt_waiting=True) == (None, None)
    assert plan(box.state, "dev", 1000.0, running=False, prompt_waiting=True)[0] == "followup"


def test_nothing_new_plans_nothing() -> None:
    assert plan(Mailbox().state, "dev", 0.0, running=True, prompt_waiting=True) == (None, None)


# -- what a notice says (pure) -------------------------------------------------------------------


def test_a_notice_has_one_line_per_thread_blockers_first_newest_next() -> None:
    box = Mailbox()
    qa, lead, ops, pm = box.agent("qa"), box.agent("lead"), box.agent("ops"), box.agent("pm")
    qa.send("dev", "old news", kind="fyi")
    qa.send("dev", "more news", kind="fyi")
    lead.send("dev", "which branch?", thread="release", kind="blocker")
    ops.send("dev", "deploy is frozen", kind="fyi")
    pm.send("dev", "me too", thread="release")
    message, ids = compose(box.state, "dev", "n1")
    head, *lines = message.content.split("\n")
    assert head.startswith("5 new messages")
    assert lines == [
        "- release [blocker]: 2 from lead, pm: me too",
        "- ops: 1 from ops: deploy is frozen",
        "- qa: 2 from qa: more news",
    ]
    assert len(ids) == 5


def test_a_notice_shows_the_newest_first_line_cut_to_120_characters() -> None:
    box = Mailbox()
    qa = box.agent("qa")
    qa.send("dev", "x" * 300 + "\nsecond line")
    message, _ = compose(box.state, "dev", "n1")
    line = message.content.split("\n")[1]
    preview = line.split(": ", 2)[2]
    assert len(preview) == 120 and "second" not in line


def test_a_notice_is_tagged_as_the_mailboxs_not_anyones_words() -> None:
    box = Mailbox()
    qa = box.agent("qa")
    qa.send("dev", "hi")
    message, ids = compose(box.state, "dev", "n1")
    assert message.metadata["provenance"] == NOTICE
    assert message.metadata["notice"] == "n1"
    assert message.metadata["ids"] == list(ids)
    assert message.name is None


# -- delivery through the owner ------------------------------------------------------------------


def test_an_idle_agent_is_woken_once_for_a_burst_after_the_debounce() -> None:
    model = Model()
    box, owner, clock = make(model)
    lead = box.agent("lead")
    for i in range(300):
        lead.send("dev", f"question {i}", kind="blocker")
    assert box.tick() == 1002.0
    assert owner.session.turn == 0
    clock.now = 1002.0
    box.tick()
    assert owner.wait_idle(WAIT)
    assert owner.session.turn == 1
    (notice,) = notices(owner.transcript)
    assert notice.content.startswith("300 new messages")
    assert [m.role for m in owner.transcript] == ["user", "assistant"]
    owner.close()


def test_an_fyi_is_brought_by_a_notice_after_the_bounded_wait() -> None:
    model = Model()
    box, owner, clock = make(model)
    qa = box.agent("qa")
    qa.send("dev", "fyi", kind="fyi")
    clock.now += 599
    box.tick()
    assert owner.wait_idle(WAIT) and owner.session.turn == 0
    clock.now += 1
    box.tick()
    assert owner.wait_idle(WAIT) and owner.session.turn == 1
    owner.close()


def test_messages_are_marked_noticed_only_once_the_notice_was_claimed() -> None:
    model = Model(tool_steps=1)
    holder: dict[str, Any] = {}
    seen: list[str | None] = []

    def during_tool() -> None:
        if seen:
            return
        box = holder["box"]
        qa = box.agent("qa")
        sent = qa.send("dev", "fyi", kind="fyi")
        holder["id"] = sent.id
        box.tick()  # the notice is queued in the session as a steer, not yet claimed
        seen.append(box.status(sent.id))

    box, owner, _ = make(model, during_tool)
    holder["box"] = box
    owner.prompt("go")
    assert owner.wait_idle(WAIT)
    assert seen == ["queued"]
    assert box.status(holder["id"]) == "noticed"
    owner.close()


def test_a_notice_refused_by_the_owner_leaves_the_messages_new(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = Model()
    box, owner, clock = make(model)
    lead = box.agent("lead")
    owner.close()  # a closed owner refuses sends
    sent = lead.send("dev", "q", kind="blocker")
    clock.now += 2
    box.tick()
    assert box.status(sent.id) == "queued"
    assert "the owner of 'dev' is closed: detached it" in caplog.text
    again = Owner(open_store("memory:"), "dev", Runner(model), watch=False)
    box.attach("dev", again)  # the closed owner's desk was let go of
    assert owner.closed and not again.closed
    again.close()


def test_a_recipient_failing_for_another_reason_stays_attached_and_is_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Refusing:
        session = Owner(open_store("memory:"), "dev", Runner(Model()), watch=False,
                        start=False).session
        running = False

        def send(self, message: Message, target: Target, wakeup: bool) -> None:
            raise OSError("disk full")

        def listen(self, callback: Callable[[Any], None]) -> None:
            pass

        def on_boundary(self, callback: Callable[[Any], object]) -> Callable[[], None]:
            return lambda: None

    box = Mailbox(clock=Clock(), debounce=0.0)
    lead = box.agent("lead")
    box.attach("dev", Refusing())
    sent = lead.send("dev", "q", kind="blocker")
    assert box.status(sent.id) == "queued"
    assert "delivering a notice to 'dev' failed" in caplog.text
    with pytest.raises(ValueError, match="already attached"):
        box.attach("dev", Refusing())


def test_a_detached_agent_hears_of_nothing_and_may_be_attached_again() -> None:
    model = Model()
    box, owner, clock = make(model)
    lead = box.agent("lead")
    assert box.detach("dev") and not box.detach("dev")
    lead.send("dev", "q", kind="blocker")
    clock.now += 2
    box.tick()
    assert owner.wait_idle(WAIT) and owner.session.turn == 0
    assert box.pending("dev") == 1  # the mail stays
    box.attach("dev", owner)
    box.tick()
    assert owner.wait_idle(WAIT) and owner.session.turn == 1
    owner.close()


def test_attach_listens_before_it_reads_the_session() -> None:
    calls: list[str] = []
    real = Owner(open_store("memory:"), "dev", Runner(Model()), watch=False, start=False)

    class Watched:
        running = False

        @property
        def session(self) -> Any:
            calls.append("session")
            return real.session

        def send(self, message: Message, target: Target, wakeup: bool) -> None:
            calls.append("send")

        def listen(self, callback: Callable[[Any], None]) -> None:
            calls.append("listen")

        def on_boundary(self, callback: Callable[[Any], object]) -> Callable[[], None]:
            calls.append("on_boundary")
            return lambda: None

    Mailbox(clock=Clock()).attach("dev", Watched())
    assert calls[:2] == ["listen", "on_boundary"]
    real.close()


def test_in_a_running_turn_the_notice_is_a_steer_read_at_the_next_step() -> None:
    model = Model(tool_steps=2)
    holder: dict[str, Any] = {}
    sent_during: list[str] = []

    def during_tool() -> None:
        if not sent_during:
            sent_during.append(holder["qa"].send("dev", "fyi mid-run", kind="fyi").id)
            holder["box"].tick()

    box, owner, _ = make(model, during_tool)
    holder.update(box=box, qa=box.agent("qa"))
    owner.prompt("work twice")
    assert owner.wait_idle(WAIT)
    assert owner.session.turn == 1  # the notice made no turn of its own
    second = model.requests[1]
    assert notices(second) and second[-1].metadata.get("provenance") == NOTICE
    assert box.status(sent_during[0]) == "noticed"
    owner.close()


def test_a_burst_during_a_tool_call_is_one_notice_at_the_next_step() -> None:
    model = Model(tool_steps=1)
    holder: dict[str, Any] = {}

    def during_tool() -> None:
        if "ids" not in holder:
            box, qa, lead = holder["box"], holder["qa"], holder["lead"]
            holder["ids"] = [who.send("dev", text, kind=kind).id for text, who, kind
                             in [("a", qa, "fyi"), ("b", lead, "blocker"), ("c", qa, "fyi")]]
            box.tick()  # a tick between boundaries changes nothing

    box, owner, _ = make(model, during_tool)
    holder.update(box=box, qa=box.agent("qa"), lead=box.agent("lead"))
    owner.prompt("go")
    assert owner.wait_idle(WAIT)
    assert owner.session.turn == 1 and len(model.requests) == 2  # no request for nothing
    (notice,) = notices(owner.transcript)
    assert notice in model.requests[1] and sorted(notice.metadata["ids"]) == sorted(holder["ids"])
    assert [box.status(i) for i in holder["ids"]] == ["noticed"] * 3
    owner.close()
    box.close()


def test_each_step_hears_what_came_during_the_tool_before_it() -> None:
    model = Model(tool_steps=2)
    holder: dict[str, Any] = {}

    def during_tool() -> None:
        if "a" not in holder:
            holder["a"] = holder["qa"].send("dev", "a", kind="fyi").id
        else:
            holder["b"] = holder["lead"].send("dev", "which branch?", kind="blocker").id

    box, owner, _ = make(model, during_tool)
    holder.update(qa=box.agent("qa"), lead=box.agent("lead"))
    owner.prompt("go")
    assert owner.wait_idle(WAIT)
    assert owner.session.turn == 1 and len(model.requests) == 3
    first, second = notices(owner.transcript)
    assert first.metadata["ids"] == [holder["a"]] and first in model.requests[1]
    assert second.metadata["ids"] == [holder["b"]] and second in model.requests[2]
    owner.close()
    box.close()


class _Probed(Owner):
    """An owner that records, when the mailbox looks at it and when it is sent a notice, whether
    another thread could get in (take the owner's lock) at that moment."""

    probes: list[tuple[str, bool]]

    def _probe(self, what: str) -> None:
        got: list[bool] = []

        def other() -> None:  # (the owner's private lock: what the guarantee is about)
            if self._lock.acquire(blocking=False):
                self._lock.release()
                got.append(True)
            else:
                got.append(False)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        self.probes.append((what, got[0]))

    @property
    def running(self) -> bool:
        if self.probes is not None:
            self._probe("look")
        return super().running

    def send(self, message: Any, target: Any, wakeup: bool) -> Any:
        self._probe("send")
        return super().send(message, target, wakeup)


def test_for_an_owner_the_look_and_the_send_are_one_step() -> None:
    # No run can end and no prompt arrive between the mailbox's look and its send: from the look
    # until the notice is sent, no other thread can take the owner's lock.
    box = Mailbox(clock=Clock(), debounce=0.0)
    lead = box.agent("lead")
    owner = _Probed(open_store("memory:"), "dev", Runner(Model()), watch=False, start=False)
    owner.probes = []
    box.attach("dev", owner)
    lead.send("dev", "which branch?", kind="blocker")
    assert owner.wait_idle(WAIT)
    probes, owner.probes = owner.probes, None  # type: ignore[assignment]
    assert [what for what, _ in probes][:2] == ["look", "send"]  # (then its run's boundaries)
    assert not any(could for _, could in probes)
    assert notices(owner.transcript)
    owner.close()


def _says(event: Event, text: str) -> bool:
    """Whether ``event`` sends a message saying ``text``."""
    return isinstance(event, MessageSent) and event.message.content == text


def test_a_listener_of_one_owner_mailing_another_busy_one_does_not_wait_for_it() -> None:
    # Two owners' threads each holding their own lock and mailing the other must not wait for
    # each other: the second lock is only tried, and the notice goes once it is free. A listener
    # runs holding its owner's lock, so each owner's lock is held here by a listener of it.
    box = Mailbox(clock=Clock(), debounce=0.0)
    a_agent = box.agent("a")
    a = Owner(open_store("memory:"), "a", Runner(Model()), watch=False, start=False)
    b = Owner(open_store("memory:"), "b", Runner(Model()), watch=False, start=False)
    box.attach("a", a)
    box.attach("b", b)
    holding, release, delivered = threading.Event(), threading.Event(), threading.Event()
    sent: list[str] = []

    def hold(event: Event) -> None:  # b's lock stays held until released
        if _says(event, "hold"):
            holding.set()
            release.wait(WAIT)

    def mail_b(event: Event) -> None:  # a's lock is held as this mails b
        if _says(event, "mail b"):
            sent.append(a_agent.send("b", "which branch?", kind="blocker").id)

    b.listen(hold)
    b.listen(lambda event: delivered.set() if isinstance(event, MessageSent)
             and notices([event.message]) else None)
    a.listen(mail_b)
    holder = threading.Thread(target=b.send, args=("hold", Target.NEXT_TURN, False))
    holder.start()
    assert holding.wait(WAIT)
    a.send("mail b", Target.NEXT_TURN, False)
    assert not delivered.is_set() and box.status(sent[0]) == "queued"
    release.set()
    holder.join()
    assert delivered.wait(WAIT)  # the delivery thread sent it once b's lock was free
    assert b.wait_idle(WAIT)
    assert box.status(sent[0]) == "noticed"
    a.close()
    b.close()
    box.close()


def test_a_notice_never_goes_ahead_of_a_waiting_prompt() -> None:
    model = Model(tool_steps=1)
    holder: dict[str, Any] = {}

    def during_tool() -> None:
        if "done" not in holder:
            holder["done"] = True
            holder["owner"].prompt("the person's next question")
            holder["qa"].send("dev", "fyi", kind="fyi")
            holder["box"].tick()

    box, owner, _ = make(model, during_tool)
    holder.update(box=box, owner=owner, qa=box.agent("qa"))
    owner.prompt("first")
    assert owner.wait_idle(WAIT)
    contents = [m.content for m in owner.transcript if m.role == "user"]
    assert contents[:2] == ["first", "the person's next question"]
    assert notices(owner.transcript)
    assert owner.session.turn == 2  # the notice rode in the prompt's turn
    first_turn = model.requests[1]
    assert not notices(first_turn)
    owner.close()


def test_a_withdraw_after_the_notice_retracts() -> None:
    model = Model()
    box, owner, clock = make(model)
    lead = box.agent("lead")
    sent = lead.send("dev", "q", kind="blocker")
    clock.now += 2
    box.tick()
    assert owner.wait_idle(WAIT)
    assert lead.withdraw(sent.id) == "retracted"
    owner.close()


def test_a_withdraw_before_the_next_boundary_unsends() -> None:
    model = Model(tool_steps=1)
    holder: dict[str, Any] = {}

    def during_tool() -> None:
        if "answer" not in holder:
            qa = holder["qa"]
            qa.send("dev", "wrong key, ignore", id="m1")
            holder["answer"] = qa.withdraw("m1")

    box, owner, _ = make(model, during_tool)
    qa = holder["qa"] = box.agent("qa")
    owner.prompt("go")
    assert owner.wait_idle(WAIT)
    assert holder["answer"] == "withdrawn" and notices(owner.transcript) == []
    assert qa.send("dev", "wrong key, ignore", id="m1").state == "withdrawn"
    owner.close()


def test_a_withdraw_while_its_notice_is_on_its_way_retracts() -> None:
    box = Mailbox(clock=Clock(), debounce=0.0)
    qa, dev = box.agent("qa"), box.agent("dev")
    recipient = _Ending(running=[False])
    box.attach("dev", recipient)
    qa.send("dev", "wrong key, ignore", id="m1", kind="blocker")
    assert recipient.sent == ["followup"]  # on its way: not claimed yet
    assert qa.withdraw("m1") == "retracted"
    assert [m.state for m in dev.read("qa")] == ["retracted"]
    recipient.owner.close()


def test_a_restarted_mailbox_knows_which_notices_went_in(tmp_path: Any) -> None:
    url = f"sqlite:{tmp_path / 'all.sqlite'}"
    store = open_store(url)
    model = Model()
    box, owner, clock = make(model, store=store)
    lead = box.agent("lead")
    sent = lead.send("dev", "q", kind="blocker")
    clock.now += 2
    box.tick()
    assert owner.wait_idle(WAIT)
    owner.close()
    again = Mailbox(store)
    assert again.state == box.state
    assert again.status(sent.id) == "noticed"
    assert any(isinstance(e, MailNoticed) for e in again.events())
    store.close()


def test_attaching_reconciles_a_notice_claimed_before_a_crash() -> None:
    store = open_store("memory:")
    model = Model()
    box, owner, clock = make(model, store=store)
    lead = box.agent("lead")
    sent = lead.send("dev", "q", kind="blocker")
    clock.now += 2
    box.tick()
    assert owner.wait_idle(WAIT)
    owner.close()
    # A mailbox that never saw the claim (its MailNoticed was lost): attaching reads the session.
    fresh = Mailbox()
    lead_agent = fresh.agent("lead")
    lead_agent.send("dev", "q", kind="blocker", id=sent.id)
    again = Owner(store, "dev", Runner(model), watch=False, start=False)
    fresh.attach("dev", again)
    assert fresh.status(sent.id) == "noticed"
    again.close()


def test_attaching_an_agent_twice_is_refused() -> None:
    box, owner, _ = make(Model())
    with pytest.raises(ValueError, match="already attached"):
        box.attach("dev", owner)
    owner.close()


def test_autotick_delivers_a_due_notice_without_anyone_calling_tick() -> None:
    woke = threading.Event()

    class Waking(Model):
        def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
            woke.set()
            return super().__call__(transcript, tools)

    box, owner, _ = make(Waking(), debounce=0.0, autotick=True)
    lead = box.agent("lead")
    lead.send("dev", "which branch?", kind="blocker")
    assert woke.wait(WAIT)
    assert owner.wait_idle(WAIT)
    assert notices(owner.transcript)
    box.close()
    owner.close()


def test_a_send_to_a_running_agent_is_noticed_at_its_next_step_without_a_tick() -> None:
    model = Model(tool_steps=1)
    holder: dict[str, Any] = {}

    def during_tool() -> None:
        if "id" not in holder:
            holder["id"] = holder["qa"].send("dev", "fyi", kind="fyi").id

    box, owner, _ = make(model, during_tool)
    holder.update(box=box, qa=box.agent("qa"))
    owner.prompt("go")
    assert owner.wait_idle(WAIT)
    assert notices(model.requests[1])
    assert box.status(holder["id"]) == "noticed"
    owner.close()


class _Ending:
    """A recipient that records the notices sent to it, and whose run is going or not at each
    look as ``running`` says (the last answer repeats)."""

    def __init__(self, running: list[bool]) -> None:
        self.owner = Owner(open_store("memory:"), "dev", Runner(Model()), watch=False,
                           start=False)
        self.answers = running
        self.sent: list[str] = []

    @property
    def session(self) -> Any:
        return self.owner.session

    @property
    def running(self) -> bool:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def send(self, message: Message, target: Target, wakeup: bool) -> None:
        self.sent.append({(Target.NEXT_STEP, True): "steer", (Target.NEXT_TURN, True): "followup"
                          }.get((Target(target), wakeup), "inject"))

    def listen(self, callback: Callable[[Any], None]) -> None:
        pass

    def on_boundary(self, callback: Callable[[Any], object]) -> Callable[[], None]:
        return lambda: None


def test_a_run_that_starts_between_the_plan_and_the_send_gets_no_second_turn() -> None:
    box = Mailbox(clock=Clock(), debounce=0.0)
    qa = box.agent("qa")
    recipient = _Ending(running=[False, True])  # idle when planned; running when looked again
    qa.send("dev", "which branch?", kind="blocker")
    box.attach("dev", recipient)
    assert recipient.sent == []  # its next boundary brings it
    recipient.owner.close()


class _Prompted(_Ending):
    """A recipient whose person sends a prompt between the mailbox's plan and its send."""

    @property
    def running(self) -> bool:
        if not self.owner.session.inbox.has_pending("next_turn"):
            self.owner.send("the person's question", "next_turn", False)
        return False


def test_a_prompt_that_came_before_the_send_gets_the_notice_behind_it() -> None:
    box = Mailbox(clock=Clock(), debounce=0.0)
    qa = box.agent("qa")
    recipient = _Prompted(running=[False])
    qa.send("dev", "which branch?", kind="blocker")
    box.attach("dev", recipient)
    assert recipient.sent == ["followup"]  # next turn: behind the prompt, in its turn
    recipient.owner.close()


# -- a notice is found whatever else its claim's append holds ------------------------------------


class OpensInOneAppend:
    """A runner that opens each turn as the framework adapters do (pydantic-ai's ``AgentRunner``):
    the turn's claim and the first step's claim in one append; then it ends the turn."""

    def run_turn(self, port: Any, *, reason: str = "wake",
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        def opening(session: Session) -> tuple[list[Event], int]:
            turn = session.turn + 1
            events: list[Event] = [TurnStarted(turn=turn, reason=reason)]
            inbox = session.inbox
            for target, then in ((Target.NEXT_TURN, StepStarted(turn=turn, step=1)),
                                 (Target.NEXT_STEP, None)):
                _, claim, inbox = claim_event(inbox, target)
                events += [e for e in (claim, then) if e is not None]
            return events, turn

        stored, turn = port.commit(opening)
        yield from stored
        yield from port.record([TurnEnded(turn=turn, steps=1, reason="final")])


def _two_queues_at_once(owner: Owner, box: Mailbox, clock: Clock) -> None:
    """A person's note waits in next_step, then a blocker's notice joins next_turn: the run it
    wakes claims both in one append; the notice is heard, and so is the next one."""
    lead = box.agent("lead")
    box.attach("dev", owner)
    owner.inject("a person's note")  # never wakes: it waits for the next step
    first = lead.send("dev", "which branch?", kind="blocker")
    assert owner.wait_idle(WAIT)
    assert box.status(first.id) == "noticed"
    second = lead.send("dev", "and the tag?", kind="blocker")
    clock.now += 2
    box.tick()
    assert owner.wait_idle(WAIT)
    assert box.status(second.id) == "noticed"
    carried = [list(n.metadata["ids"]) for n in notices(owner.session.transcript)]
    assert carried == [[first.id], [second.id]]


def test_a_notice_claimed_in_one_append_with_another_queue_counts_as_heard() -> None:
    clock = Clock()
    box = Mailbox(clock=clock, debounce=0.0)
    owner = Owner(open_store("memory:"), "dev", OpensInOneAppend(), watch=False, start=False)
    _two_queues_at_once(owner, box, clock)
    owner.close()


def test_an_agent_run_by_pydantic_ai_keeps_hearing_of_its_mail() -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    clock = Clock()
    box = Mailbox(clock=clock, debounce=0.0)
    agent = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("ok")])))
    owner = Owner(open_store("memory:"), "dev", AgentRunner(agent), watch=False, start=False)
    _two_queues_at_once(owner, box, clock)
    owner.close()


# -- a notice names the very messages it carried ----------------------------------------------------


def test_an_id_sent_again_once_forgotten_gets_a_notice_of_its_own() -> None:
    clock = Clock()
    box = Mailbox(clock=clock, debounce=0.0, remember=0)
    lead, dev, r, w = box.agent("lead"), box.agent("dev"), box.agent("r"), box.agent("w")
    owner = Owner(open_store("memory:"), "dev", Runner(Model()), watch=False, start=False)
    box.attach("dev", owner)
    lead.send("dev", "daily check", kind="blocker", id="daily")
    assert owner.wait_idle(WAIT)
    dev.receive()
    for _ in range(9000):  # enough to compact: the first "daily" is forgotten
        r.send("w", "x")
        w.receive()
    assert box.status("daily") is None
    box.detach("dev")
    assert lead.send("dev", "daily check", kind="blocker", id="daily").state == "queued"
    box.attach("dev", owner)  # the transcript's notice carried the first "daily", not this one
    assert owner.wait_idle(WAIT)
    assert box.status("daily") == "noticed"
    assert [list(n.metadata["ids"]) for n in notices(owner.session.transcript)] == [["daily"]] * 2


def test_a_notice_names_each_message_with_its_order() -> None:
    box = Mailbox()
    qa, lead = box.agent("qa"), box.agent("lead")
    qa.send("dev", "a", kind="fyi", id="a")
    lead.send("dev", "b", id="b")
    message, ids = compose(box.state, "dev", "n1")
    assert ids == ("a", "b")
    assert list(message.metadata["orders"]) == [1, 2]


def test_a_notice_that_names_no_orders_is_reconciled_by_id_as_before() -> None:
    store = open_store("memory:")
    owner = Owner(store, "dev", Runner(Model()), watch=False, start=False)
    old = Message.user("1 new message", metadata={"provenance": NOTICE, "notice": "n-old",
                                                  "ids": ["q-1"]})
    owner.followup(old)  # written by a version whose notices named no orders
    assert owner.wait_idle(WAIT)
    box = Mailbox(clock=Clock())
    qa, lead = box.agent("qa"), box.agent("lead")
    qa.send("dev", "earlier", kind="fyi")
    lead.send("dev", "q", kind="blocker", id="q-1")  # another order than any
    box.attach("dev", owner)
    assert box.status("q-1") == "noticed"
    owner.close()
