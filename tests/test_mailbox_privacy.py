"""Who an agent is, and what it may learn of others' mail: a name is its value whatever type
carries it, so no ``str`` subclass passes for a handled agent; a refusal says only that the
message is not the caller's, never who wrote it to whom; a handle never leaves its mailbox; an
ask that times out hands back its question's id.

Every test that needs a store runs in memory and on SQLite (``kind``).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nous_inbox.adapters.praisonai import InProcessMailbox
from nous_inbox.mailbox import AgentHandle, AskTimeoutError, Mailbox
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store


@pytest.fixture(params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    """In memory and on SQLite (this module's stores)."""
    return str(request.param)


@pytest.fixture
def box(store: Store) -> Iterator[Mailbox]:
    with Mailbox(store) as mailbox:
        yield mailbox


class Name(str):
    """A name carried by a ``str`` subclass (as an ``enum.StrEnum`` member is)."""


class Posing(str):
    """A name whose value is ``"x"`` but which compares and hashes as any name it meets."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("dev")


class Impostor:
    """Not a name at all, though it compares and hashes as ``"dev"``."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("dev")


#: Every door to acting as an agent: both give out its handle, once.
DOORS: dict[str, Callable[[Mailbox, Any], AgentHandle]] = {
    "box.agent": lambda box, name: box.agent(name),
    "AgentHandle": lambda box, name: AgentHandle(box, name),
}


# -- a name is its value -----------------------------------------------------------------------------


@pytest.mark.parametrize("door", DOORS)
def test_a_str_subclass_does_not_pass_for_a_handled_agent(box: Mailbox, door: str) -> None:
    lead = box.agent("lead")
    lead.send("dev", "the key is 42")
    dev = box.agent("dev")
    sent = dev.send("lead", "mine")
    with pytest.raises(ValueError, match="'dev': its handle was already given out"):
        DOORS[door](box, Name("dev"))
    assert box.pending("dev") == 1 and [t.unread for t in dev.threads()] == [1]
    assert box.status(sent.id) == "queued" and box.pending("lead") == 1


@pytest.mark.parametrize("door", DOORS)
def test_a_name_that_poses_as_another_acts_only_as_its_own_value(box: Mailbox,
                                                                 door: str) -> None:
    lead = box.agent("lead")
    lead.send("dev", "the key is 42")
    dev = box.agent("dev")
    sent = dev.send("lead", "mine")
    x = DOORS[door](box, Posing("x"))
    assert type(x.name) is str and x.name == "x"
    seen = [x.receive(), x.threads(), x.send("lead", "from x")]
    for verb in (lambda: x.read("lead"), lambda: x.reply("lead", "forged"),
                 lambda: x.withdraw(sent.id)):
        with pytest.raises((LookupError, PermissionError)):
            verb()  # "x" has no such thread, sent nothing: refused as "x", all it is
    assert "the key is 42" not in repr(seen)
    assert box.pending("dev") == 1 and [t.unread for t in dev.threads()] == [1]
    assert box.status(sent.id) == "queued"
    assert {m.sender for m in lead.receive()} == {"dev", "x"}


@pytest.mark.parametrize("door", DOORS)
def test_a_name_that_is_no_str_is_refused(box: Mailbox, door: str) -> None:
    box.agent("lead").send("dev", "the key is 42")
    sent = box.agent("dev").send("lead", "mine")
    with pytest.raises(TypeError, match="must be a non-empty str"):
        DOORS[door](box, Impostor())
    assert box.pending("dev") == 1 and box.status(sent.id) == "queued"


def test_the_praisonai_drop_in_refuses_a_str_subclass_of_a_handled_agent() -> None:
    box = InProcessMailbox()
    box.send("writer", "need a title", sender="researcher")
    writer = box.mailbox.agent("writer")
    with pytest.raises(PermissionError, match="'writer' acts only through its handle"):
        box.receive(Name("writer"))
    with pytest.raises(PermissionError, match="'writer' acts only through its handle"):
        box.send("researcher", "forged", sender=Name("writer"))
    assert writer.pending() == 1 and box.pending("researcher") == 0


def test_a_str_subclass_names_the_agent_of_its_value_and_is_stored_as_a_plain_str(
        box: Mailbox) -> None:
    lead = box.agent(Name("lead"))
    assert type(lead.name) is str and lead.name == "lead"
    with pytest.raises(ValueError, match="its handle was already given out"):
        box.agent("lead")
    dev = box.agent("dev", parent=Name("lead"))
    lead.send(Name("dev"), "build it", thread=Name("t1"), correlation_id=Name("c1"))
    (message,) = dev.receive()
    assert [type(v) for v in (message.sender, message.recipient, message.thread,
                              message.correlation_id)] == [str, str, str, str]
    assert type(box.state.box("dev").parent) is str
    box.subscribe(Name("qa"), lambda message: None)
    assert box.pending(Name("dev")) == 0 and box.dropped(Name("dev")) == 0
    assert lead.send("qa", "done", kind=Name("result")).state == "queued"


def test_an_agent_attached_by_a_str_subclass_is_the_agent_of_its_value(box: Mailbox) -> None:
    owner = Owner(open_store("memory:"), "dev",
                  Runner(lambda transcript, tools: Message.assistant("ok")), watch=False,
                  start=False)
    box.attach(Name("dev"), owner)
    with pytest.raises(ValueError, match="'dev' is already attached"):
        box.attach("dev", owner)
    assert box.detach(Name("dev")) and not box.detach("dev")
    owner.close()


def test_a_name_that_poses_as_another_counts_only_its_own_mail(box: Mailbox) -> None:
    box.agent("lead").send("dev", "the key is 42")
    assert (box.pending(Posing("x")), box.dropped(Posing("x"))) == (0, 0)
    with pytest.raises(TypeError, match="must be a non-empty str"):
        box.dropped(Impostor())  # type: ignore[arg-type]


# -- a refusal says only that the message is not the caller's ----------------------------------------


def _names_none_of(error: BaseException, *names: str) -> None:
    """``error`` names none of ``names``, in its text or its attributes."""
    text = str(error)
    assert not [name for name in names if repr(name) in text], text
    assert not [v for v in vars(error).values() if v in names]


def test_a_message_that_is_not_yours_is_refused_without_its_correspondents(box: Mailbox) -> None:
    lead, qa = box.agent("lead"), box.agent("qa")
    sent = lead.send("dev", "the key is 42")
    with pytest.raises(PermissionError, match="is not yours") as refused:
        qa.message(sent.id)
    _names_none_of(refused.value, "lead", "dev")


def test_a_message_let_go_is_refused_to_others_and_its_outcome_told_to_its_own(
        box: Mailbox) -> None:
    lead, dev, qa = box.agent("lead"), box.agent("dev"), box.agent("qa")
    sent = lead.send("dev", "the key is 42")
    dev.receive()
    with pytest.raises(PermissionError, match="is not yours") as refused:
        qa.message(sent.id)
    _names_none_of(refused.value, "lead", "dev")
    for own in (lead, dev):
        with pytest.raises(LookupError, match=r"no longer kept \(received\)"):
            own.message(sent.id)


def test_each_message_one_receive_lets_go_keeps_its_own_parties_and_answer(
        box: Mailbox) -> None:
    lead, qa, dev = box.agent("lead"), box.agent("qa"), box.agent("dev")
    lead.send("dev", "ship it?", id="l-1")
    qa.send("dev", "tests are green", id="q-1")
    lead.send("dev", "and tag it", id="l-2")
    answer = dev.reply("lead", "yes, both")  # answers lead's two, still queued
    assert [m.id for m in dev.receive()] == ["l-1", "q-1", "l-2"]  # one receive lets all go
    assert lead.send("dev", "ship it?", id="l-1").answer == answer.id
    assert qa.send("dev", "tests are green", id="q-1").answer is None
    assert lead.send("dev", "and tag it", id="l-2").answer == answer.id
    for own, other, id in ((lead, qa, "l-1"), (qa, lead, "q-1"), (lead, qa, "l-2")):
        with pytest.raises(LookupError, match=r"no longer kept \(received\)"):
            own.message(id)
        with pytest.raises(PermissionError, match="is not yours"):
            other.message(id)
    assert [box.status(id) for id in ("l-1", "q-1", "l-2")] == ["received"] * 3


@pytest.mark.parametrize("let_go", [False, True])
def test_a_withdraw_of_another_agents_message_is_refused_without_its_sender(
        box: Mailbox, let_go: bool) -> None:
    lead, dev, qa = box.agent("lead"), box.agent("dev"), box.agent("qa")
    sent = lead.send("dev", "the key is 42")
    if let_go:
        dev.receive()
    for other in (qa, dev):
        with pytest.raises(PermissionError, match="is not yours") as refused:
            other.withdraw(sent.id)
        _names_none_of(refused.value, "lead", *{"dev", "qa"} - {other.name})
    assert box.status(sent.id) == ("received" if let_go else "queued")


@pytest.mark.parametrize("let_go", [False, True])
def test_a_send_under_another_agents_id_is_refused_without_its_correspondents(
        box: Mailbox, let_go: bool) -> None:
    lead, dev, qa = box.agent("lead"), box.agent("dev"), box.agent("qa")
    sent = lead.send("dev", "the key is 42", id="m-1")
    if let_go:
        dev.receive()
    with pytest.raises(ValueError, match="id 'm-1' names another message") as refused:
        qa.send("dev", "the key is 42", id="m-1")
    _names_none_of(refused.value, "lead")
    assert lead.send("dev", "the key is 42", id="m-1").duplicate  # its own resend still is
    assert box.status(sent.id) == ("received" if let_go else "queued")


def test_the_model_tools_refuse_another_agents_thread_naming_nobody(box: Mailbox) -> None:
    from nous_inbox.mailbox import mailbox_tools

    box.agent("lead").send("qa", "secret for qa")
    read, reply, _ = mailbox_tools(box.agent("dev"))
    for call in (lambda: read("lead"), lambda: reply("lead", "forged")):
        with pytest.raises(LookupError, match="no such thread") as refused:
            call()
        assert "qa" not in str(refused.value)


# -- a handle never leaves its mailbox ---------------------------------------------------------------


@pytest.mark.parametrize("how", [pickle.dumps, copy.deepcopy, copy.copy])
def test_a_handle_cannot_be_pickled_or_copied(how: Callable[[Any], object]) -> None:
    box = Mailbox()
    dev = box.agent("dev")
    held = [dev, [dev]] if how is not copy.copy else [dev]  # (a list's shallow copy holds dev)
    for value in held:
        with pytest.raises(TypeError, match=r"handle of 'dev' cannot leave its mailbox"):
            how(value)
    assert isinstance(dev, AgentHandle) and dev.send("lead", "still mine").state == "queued"


# -- an ask that times out hands back its question ---------------------------------------------------


def test_an_ask_that_times_out_carries_its_questions_id_to_withdraw_it(box: Mailbox) -> None:
    lead, dev = box.agent("lead"), box.agent("dev")
    with pytest.raises(TimeoutError) as timed_out:
        lead.ask("dev", "which branch?", timeout=0)
    assert isinstance(timed_out.value, AskTimeoutError)
    question = timed_out.value.id
    assert question in str(timed_out.value)
    assert lead.withdraw(question) == "withdrawn"
    assert dev.threads() == []
