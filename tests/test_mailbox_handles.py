"""Agents act through handles: identity held, not declared; answers a sender waits for; any
message fetched by id by those allowed to see it; declared parents; the classes of a reply and of
a result; a retraction after a read is news; first work means no turn yet.

Every test runs on an in-memory store and on SQLite (``kind``); the clock is moved by hand, and a
waited answer is given by another thread the test starts, never after a sleep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_inbox.events import MailAgent, MailSent
from nous_inbox.mailbox import AgentHandle, Mailbox, MailboxState
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store

WAIT = 30  # seconds: a bound for a wait that should end at once, never a synchronisation sleep


@pytest.fixture(params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    """In memory and on SQLite (this module's stores)."""
    return str(request.param)


@pytest.fixture
def box(store: Store) -> Iterator[Mailbox]:
    with Mailbox(store) as mailbox:
        yield mailbox


def answer_in_a_thread(box: Mailbox, agent: AgentHandle, text: str) -> None:
    """When ``agent`` gets mail, another thread answers it with ``text``."""

    def answer(message: MailSent) -> None:
        threading.Thread(target=agent.reply, args=(message.thread or message.sender, text),
                         daemon=True).start()

    box.subscribe(agent.name, answer)


# -- identity: a handle acts as its agent, on its own mail only --------------------------------------


def test_a_handle_sends_as_its_agent_and_reads_only_its_own_mail(box: Mailbox) -> None:
    lead, dev, qa = box.agent("lead"), box.agent("dev"), box.agent("qa")
    lead.send("dev", "build it")
    qa.send("lead", "green")
    assert [(t.thread, t.senders) for t in dev.threads()] == [("lead", ("lead",))]
    assert [m.body for m in dev.read("lead")] == ["build it"]
    with pytest.raises(LookupError):
        dev.read("qa")  # the lead's thread from qa is not dev's to read
    assert [m.sender for m in lead.receive()] == ["qa"]
    assert dev.receive() == [] and box.pending("lead") == 0


def test_a_handle_is_given_out_once() -> None:
    box = Mailbox()
    box.agent("dev")
    with pytest.raises(ValueError, match="'dev': its handle was already given out"):
        box.agent("dev")


def test_a_handle_withdraws_only_what_its_agent_sent(box: Mailbox) -> None:
    sent = box.agent("lead").send("dev", "build it")
    with pytest.raises(PermissionError, match=r"withdraw by 'qa': message '[^']+' is not yours"):
        box.agent("qa").withdraw(sent.id)
    assert box.status(sent.id) == "queued"


@pytest.mark.parametrize("name, parent, error", [
    ("", None, TypeError), ("dev", "", TypeError), ("dev", "dev", ValueError),
    ("dev", 3, TypeError)])
def test_bad_agent_names_and_parents_are_refused(name: str, parent: Any,
                                                 error: type[Exception]) -> None:
    box = Mailbox()
    with pytest.raises(error, match=r"agent|name"):
        box.agent(name, parent=parent)
    assert box.state.snapshot()["boxes"] == {}


# -- a message by id, to those allowed to see it ----------------------------------------------------


def test_a_message_is_fetched_by_id_by_its_sender_and_recipient_only(box: Mailbox) -> None:
    lead, dev, qa = (box.agent(n) for n in ("lead", "dev", "qa"))
    asked = lead.send("dev", "which branch?", thread="t1", kind="question")
    assert {h.message(asked.id).body for h in (lead, dev)} == {"which branch?"}
    assert dev.message(asked.id).thread == "t1" and dev.message(asked.id).recipient == "dev"
    # A thread's key is the sender's word: writing under it gives no right to what others wrote.
    qa.send("dev", "main, I think", thread="t1")
    with pytest.raises(PermissionError, match=r"message of 'qa': message '[^']+' is not yours"):
        qa.message(asked.id)
    with pytest.raises(LookupError, match="no such message"):
        lead.message("nope")


def test_a_handle_cannot_be_made_renamed_or_see_past_itself(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    lead.send("dev", "the key is 42")
    with pytest.raises(ValueError, match=r"'dev': its handle was already given out"):
        AgentHandle(box, "dev")  # a handle is given out once, by whichever door
    with pytest.raises(AttributeError):
        lead.name = "dev"  # type: ignore[misc]
    assert not [name for name in dir(lead)
                if not name.startswith("_") and isinstance(getattr(lead, name), Mailbox)]
    assert lead.threads() == [] and dev.pending() == 1


# -- waited answers ---------------------------------------------------------------------------------


def test_ask_returns_the_reply_once_the_recipient_answers(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    answer_in_a_thread(box, dev, "main")
    reply = lead.ask("dev", "which branch?", timeout=WAIT)
    assert (reply.sender, reply.body, reply.kind) == ("dev", "main", "reply")
    (question,) = dev.read(reply.thread)  # a thread of its own, named by the question's id
    assert (question.id, question.state) == (reply.thread, "answered")
    assert [t.unread for t in lead.threads()] == [0]  # the asker has read its answer


def test_ask_async_awaits_the_reply_while_the_loop_runs_on(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    answer_in_a_thread(box, dev, "main")

    async def host() -> tuple[str, Any]:
        ticks = 0

        async def other_work() -> None:
            nonlocal ticks
            ticks += 1

        reply, _ = await asyncio.gather(lead.ask_async("dev", "which?", timeout=WAIT),
                                        other_work())
        return reply.body, ticks

    assert asyncio.run(host()) == ("main", 1)


def test_an_ask_that_times_out_leaves_its_question_to_be_answered_later(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    with pytest.raises(TimeoutError, match=r"no answer within 0 seconds \(message (\S+) waits"):
        lead.ask("dev", "which branch?", timeout=0)
    (thread,) = dev.threads()
    (question,) = dev.read(thread.thread)
    reply = dev.reply(thread.thread, "main")
    assert lead.message(question.id).state == "answered"
    assert lead.message(reply.id).body == "main"


def test_an_ask_gets_its_own_reply_not_a_late_one_to_an_earlier_question(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    with pytest.raises(TimeoutError):
        lead.ask("dev", "which branch?", timeout=0)
    (first,) = [t.thread for t in dev.threads()]

    def answer(message: MailSent) -> None:  # the late answer to the first question, then its own
        def both() -> None:
            dev.reply(first, "main")
            dev.reply(message.thread or message.sender, "v2")

        threading.Thread(target=both, daemon=True).start()

    box.subscribe("dev", answer)
    assert lead.ask("dev", "and the tag?", timeout=WAIT).body == "v2"
    assert [t.unread for t in dev.threads()] == [1, 1]  # two questions, two threads


def test_an_ask_of_a_question_withdrawn_meanwhile_ends_with_a_lookup_error(box: Mailbox) -> None:
    lead = box.agent("lead")

    def withdraw(message: MailSent) -> None:
        lead.withdraw(message.id)

    box.subscribe("dev", withdraw)
    with pytest.raises(LookupError, match="was withdrawn unanswered"):
        lead.ask("dev", "which?", timeout=WAIT)


@pytest.mark.parametrize(("let_go", "outcome"), [("receive", "received"),
                                                 ("withdraw", "withdrawn")])
def test_an_ask_waiting_hears_at_once_that_its_question_was_let_go(let_go: str,
                                                                   outcome: str) -> None:
    box = Mailbox()  # no store: nothing to poll, only what the mailbox folds can wake the asker
    lead, dev = box.agent("lead"), box.agent("dev")

    async def host() -> str:
        ask = asyncio.ensure_future(lead.ask_async("dev", "which?", timeout=WAIT))
        await asyncio.sleep(0)  # (a turn of the loop, not a wait: the ask sends, then waits)
        if let_go == "receive":
            dev.receive()
        else:
            lead.withdraw(dev.threads()[0].thread)  # (named by the question's id)
        for _ in range(100):  # turns of the loop, enough for a wake to arrive; no clock involved
            if ask.done():
                break
            await asyncio.sleep(0)
        if not ask.done():
            ask.cancel()  # it did not hear: do not wait out its timeout
            return "still waiting"
        with pytest.raises(LookupError, match=f"was {outcome} unanswered"):
            await ask
        return "heard"

    assert asyncio.run(host()) == "heard"


@pytest.mark.parametrize("timeout", [-1, "1", float("nan")])
def test_a_bad_timeout_is_refused_before_anything_is_sent(box: Mailbox, timeout: Any) -> None:
    with pytest.raises(ValueError, match="timeout must be a number of seconds"):
        box.agent("lead").ask("dev", "which?", timeout=timeout)
    assert box.pending("dev") == 0


def test_an_ask_in_an_empty_thread_name_is_refused_before_anything_is_sent(box: Mailbox) -> None:
    with pytest.raises(TypeError, match="thread must be a non-empty str"):
        box.agent("lead").ask("dev", "which?", thread="", timeout=0)
    assert box.pending("dev") == 0


def test_an_answer_written_by_another_process_reaches_the_asker(tmp_path: Any) -> None:
    url = f"sqlite:{tmp_path / 'mail.sqlite'}"
    with Mailbox(url) as here, Mailbox(url) as there:
        lead, dev = here.agent("lead"), there.agent("dev")
        arrived = threading.Event()
        asked: list[str] = []
        here.subscribe("dev", lambda message: (asked.append(message.thread), arrived.set()))

        def answer() -> None:
            assert arrived.wait(WAIT)
            dev.reply(asked[0], "main")

        threading.Thread(target=answer, daemon=True).start()
        assert lead.ask("dev", "which branch?", timeout=WAIT).body == "main"


# -- classes: a reply's, a result's; parents declared -------------------------------------------------


def test_a_counter_question_is_a_blocker_that_wakes_and_still_answers(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    asked = lead.send("dev", "ship it?")
    lead.receive()  # the lead has worked: only a waking class wakes it now
    dev.reply("lead", "which build?", kind="blocker")
    assert dev.message(asked.id).state == "answered"
    woken = box.state.oldest_fresh("lead", waking=True)
    assert woken is not None and woken.event.kind == "blocker"


def test_a_plain_reply_still_wakes_nobody(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    lead.send("dev", "ship it?")
    dev.reply("lead", "yes")
    assert box.state.oldest_fresh("lead", waking=True) is None


def test_a_result_wakes_the_declared_parent_even_before_it_gave_out_work(box: Mailbox) -> None:
    lead = box.agent("lead")
    box.agent("first").send("lead", "first work")
    lead.receive()  # it has worked
    worker = box.agent("worker", parent="lead")
    worker.send("lead", "done: 3 files", kind="result")
    box.agent("stranger").send("lead", "done too", kind="result")
    assert [m.event.body for m in box.state.fresh("lead") if m.wakes] == ["done: 3 files"]


def test_an_action_from_the_declared_parent_wakes_after_the_first_work(box: Mailbox) -> None:
    dev = box.agent("dev", parent="lead")
    box.agent("stranger").send("dev", "first work")
    dev.receive()
    box.agent("stranger2").send("dev", "more")
    box.agent("lead").send("dev", "from the parent")
    assert [m.event.body for m in box.state.fresh("dev") if m.wakes] == ["from the parent"]


def test_a_declared_parent_survives_a_restart(store: Store) -> None:
    with Mailbox(store) as box:
        box.agent("dev", parent="lead")
    with Mailbox(store) as again:
        assert again.state.box("dev").parent == "lead"
        again.agent("dev", parent="lead")  # the same again: nothing new to record
    assert [type(e) for e in store.read("mailbox")] == [MailAgent]


def test_a_retraction_after_the_read_shows_in_the_thread_as_new(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    sent = lead.send("dev", "use v1")
    dev.read("lead")
    assert lead.withdraw(sent.id) == "retracted"
    ((thread, unread, new),) = [(t.thread, t.unread, t.new) for t in dev.threads()]
    assert (thread, unread, new) == ("lead", 1, 1)
    assert [m.id for m in box.state.fresh("dev")] == [sent.id]  # the next notice carries it
    assert [(m.body, m.state) for m in dev.read("lead")] == [("use v1", "retracted")]
    assert [(t.unread, t.new) for t in dev.threads()] == [(0, 0)]


# -- first work: no turn yet -------------------------------------------------------------------------


def test_an_agent_that_ran_a_persons_turn_is_not_woken_by_a_strangers_action(
        store: Store) -> None:
    box = Mailbox(store)
    owner = Owner(open_store("memory:"), "dev",
                  Runner(lambda transcript, tools: Message.assistant("ok")), watch=False)
    box.attach("dev", owner)
    owner.prompt("hello")
    assert owner.wait_idle(WAIT) and owner.session.turn == 1
    box.agent("stranger").send("dev", "do my thing")
    assert box.state.oldest_fresh("dev", waking=True) is None
    owner.close()
    again = MailboxState()
    for event in store.read("mailbox"):
        again.apply(event)
    assert again == box.state  # what decided it is in the log
    box.close()


def test_an_agent_with_no_turn_yet_is_woken_by_its_first_work(store: Store) -> None:
    box = Mailbox(store)
    owner = Owner(open_store("memory:"), "dev",
                  Runner(lambda transcript, tools: Message.assistant("ok")), watch=False,
                  start=False)
    box.attach("dev", owner)
    box.agent("stranger").send("dev", "do my thing")
    assert box.state.oldest_fresh("dev", waking=True) is not None
    owner.close()
    box.close()


# -- replay: a mailbox folded from its log equals the live one, handles included ---------------------

_names = st.sampled_from(["dev", "lead", "qa"])
_script = st.tuples(
    st.fixed_dictionaries({n: st.none() | _names for n in ("dev", "lead", "qa")}),
    st.lists(st.tuples(
        st.sampled_from(["action", "blocker", "fyi", "result", "receive", "read", "reply",
                         "counter", "withdraw", "ask"]), _names, _names), max_size=30))


@settings(max_examples=50, deadline=None)
@given(_script)
def test_replay_equals_live_through_handles(script: tuple[dict[str, str | None],
                                                         list[tuple[str, str, str]]]) -> None:
    parents, ops = script
    store = open_store("memory:")
    box = Mailbox(store, max_queue=4, overflow="drop_oldest", retain=3)
    handles = {n: box.agent(n, parent=p if p != n else None) for n, p in parents.items()}
    sent: list[tuple[str, str]] = []
    for op, a, b in ops:
        me = handles[a]
        if op in ("action", "blocker", "fyi", "result"):
            sent.append((me.send(b, op, kind=op).id, a))
        elif op == "receive":
            me.receive(limit=2)
        elif op == "read" and me.threads():
            me.read(me.threads()[0].thread)
        elif op in ("reply", "counter"):
            others = [t for t in me.threads() if set(t.senders) - {a}]
            if others:
                me.reply(others[0].thread, "ok", kind="reply" if op == "reply" else "blocker")
        elif op == "withdraw" and sent:
            id, sender = sent.pop()
            handles[sender].withdraw(id)
        elif op == "ask":
            with pytest.raises(TimeoutError):
                me.ask(b, "?", timeout=0)
    again = Mailbox(store, max_queue=4, overflow="drop_oldest", retain=3)
    assert again.state == box.state
