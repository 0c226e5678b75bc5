"""The PraisonAI drop-in behaves as ``praisonaiagents.messaging`` documents, tested side by side
against the real package (offline: no model is called), plus what it adds: counted drops and a
durable store.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nous_inbox.adapters.praisonai import AgentMessage, InProcessMailbox
from nous_inbox.events import MailDropped
from nous_inbox.mailbox import AgentHandle, Mailbox
from nous_inbox.store import open_store

messaging = pytest.importorskip("praisonaiagents.messaging")
Real = messaging.InProcessMailbox
RealMessage = messaging.AgentMessage


def _counted() -> Callable[[], str]:
    """Ids m1, m2, ...: two mailboxes given these make up the same ids."""
    count = itertools.count(1)
    return lambda: f"m{next(count)}"


def both() -> list[Any]:
    return [Real(), InProcessMailbox()]


def test_it_satisfies_praisonais_mailbox_protocol() -> None:
    assert isinstance(InProcessMailbox(), messaging.AgentMailboxProtocol)


def test_the_constructor_and_methods_have_praisonais_signatures() -> None:
    for name in ("send", "receive", "subscribe", "pending"):
        ours = inspect.signature(getattr(InProcessMailbox, name))
        theirs = inspect.signature(getattr(Real, name))
        assert list(ours.parameters) == list(theirs.parameters), name
        for param in theirs.parameters.values():
            assert ours.parameters[param.name].kind == param.kind
            assert ours.parameters[param.name].default == param.default
    ours = inspect.signature(InProcessMailbox)
    assert ours.parameters["max_inbox"].kind is inspect.Parameter.KEYWORD_ONLY
    assert ours.parameters["max_inbox"].default == 1000


@pytest.mark.parametrize("bad", [0, -1])
def test_a_bound_that_is_not_positive_is_a_value_error_as_in_praisonai(bad: int) -> None:
    with pytest.raises(ValueError, match="max_inbox must be greater than zero"):
        Real(max_inbox=bad)
    with pytest.raises(ValueError, match="max_inbox must be greater than zero"):
        InProcessMailbox(max_inbox=bad)


def test_simple_send_and_receive_match() -> None:
    results = []
    for box in both():
        box.send("writer", "Draft ready for review", sender="researcher")
        results.append([(m.sender, m.recipient, m.body) for m in box.receive("writer")])
    assert results[0] == results[1] == [("researcher", "writer", "Draft ready for review")]


def test_receive_drains_oldest_first_up_to_the_limit_as_in_praisonai() -> None:
    results = []
    for box in both():
        for i in range(7):
            box.send("w", f"m{i}", sender="r")
        results.append(([m.body for m in box.receive("w", limit=3)], box.pending("w"),
                        [m.body for m in box.receive("w", limit=0)],
                        [m.body for m in box.receive("w", limit=-1)],
                        [m.body for m in box.receive("w")], box.receive("nobody")))
    assert results[0] == results[1]


def test_fan_out_matches() -> None:
    for box in both():
        for agent_id in ("writer", "editor", "reviewer"):
            box.send(agent_id, "Draft v2 is ready", sender="researcher")
        assert box.pending("editor") == 1


def test_request_response_with_correlation_id_matches() -> None:
    for box in both():
        cid = str(uuid.uuid4())
        box.send("writer", "What's the headline?", sender="researcher", correlation_id=cid)
        for req in box.receive("writer"):
            box.send(req.sender, "RAG in Practice", sender="writer",
                     correlation_id=req.correlation_id)
        reply = next(m for m in box.receive("researcher") if m.correlation_id == cid)
        assert reply.body == "RAG in Practice"


def test_overflow_drops_the_oldest_without_an_exception_as_in_praisonai() -> None:
    results = []
    for box in (Real(max_inbox=100), InProcessMailbox(max_inbox=100)):
        ids = [box.send("slow-worker", f"job-{i}", sender="dispatcher") for i in range(150)]
        assert all(isinstance(i, str) for i in ids)
        results.append((box.pending("slow-worker"),
                        [m.body for m in box.receive("slow-worker", limit=1)]))
    assert results[0] == results[1] == (100, ["job-50"])


def test_each_drop_is_recorded_and_counted_here() -> None:
    store = open_store("memory:")
    box = InProcessMailbox(max_inbox=2, store=store)
    for i in range(5):
        box.send("w", i, sender="r")
    assert box.dropped("w") == 3
    assert sum(isinstance(e, MailDropped) for e in store.read("praisonai")) == 3


def _broken(msg: Any) -> None:
    raise RuntimeError("boom")


@pytest.mark.parametrize("box", both(), ids=["praisonai", "drop-in"])
def test_subscribers_see_each_message_and_a_raising_one_does_not_stop_the_others(
    box: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[str, Any]] = []
    box.subscribe("writer", _broken)
    box.subscribe("writer", lambda msg: seen.append((msg.sender, msg.body)))
    with caplog.at_level(logging.ERROR):
        box.send("writer", "Findings attached", sender="researcher")
    assert seen == [("researcher", "Findings attached")]
    assert box.pending("writer") == 1


@pytest.mark.parametrize("box", both(), ids=["praisonai", "drop-in"])
def test_a_subscriber_may_send_from_its_callback(box: Any) -> None:
    box.subscribe("writer", lambda m: box.send(m.sender, "ack", sender="writer"))
    box.send("writer", "hi", sender="researcher")
    assert [m.body for m in box.receive("researcher")] == ["ack"]


def test_send_returns_the_id_of_the_message_received() -> None:
    for box in both():
        sent = box.send("w", {"k": [1, 2]}, sender="r", correlation_id="c")
        (msg,) = box.receive("w")
        assert msg.id == sent and msg.correlation_id == "c" and msg.body == {"k": [1, 2]}
        assert isinstance(msg.ts, float)


def test_agent_message_has_praisonais_fields_defaults_and_dict_round_trip() -> None:
    ours = AgentMessage("r", "w", {"x": 1})
    theirs = RealMessage("r", "w", {"x": 1})
    assert set(ours.to_dict()) == set(theirs.to_dict())
    assert uuid.UUID(ours.id).version == 4 and isinstance(ours.ts, float)
    assert ours.correlation_id is None
    data = theirs.to_dict()
    assert AgentMessage.from_dict(data).to_dict() == data
    assert RealMessage.from_dict(AgentMessage.from_dict(data).to_dict()) == theirs


def test_from_dict_fills_a_missing_id_and_time_as_praisonai_does() -> None:
    msg = AgentMessage.from_dict({"sender": "r", "recipient": "w"})
    assert msg.body is None and uuid.UUID(msg.id) and msg.ts > 0


def test_a_body_that_is_not_json_is_refused_here_and_nothing_is_queued() -> None:
    box = InProcessMailbox()
    with pytest.raises(TypeError, match="body"):
        box.send("w", object(), sender="r")
    assert box.pending("w") == 0


def test_with_a_store_the_queues_survive_a_restart(tmp_path: Any) -> None:
    url = f"sqlite:{tmp_path / 'mail.sqlite'}"
    with InProcessMailbox(store=url) as box:
        box.send("writer", "kept across a restart", sender="researcher")
        box.send("editor", "and this", sender="researcher")
        box.receive("editor")
    with InProcessMailbox(store=url) as box:
        assert box.pending("editor") == 0
        assert [m.body for m in box.receive("writer")] == ["kept across a restart"]


def test_the_library_mailbox_underneath_has_threads_and_replies() -> None:
    box = InProcessMailbox()
    box.send("writer", "need a title", sender="researcher")
    writer = box.mailbox.agent("writer")
    (thread,) = writer.threads()
    assert thread.thread == "researcher"
    writer.reply("researcher", "RAG in Practice")
    assert [m.body for m in box.receive("researcher")] == ["RAG in Practice"]


def test_once_an_agent_has_a_handle_the_drop_in_cannot_act_as_it() -> None:
    box = InProcessMailbox()
    box.send("writer", "need a title", sender="researcher")
    writer = box.mailbox.agent("writer")
    with pytest.raises(PermissionError, match="'writer' acts only through its handle"):
        box.receive("writer")
    with pytest.raises(PermissionError, match="'writer' acts only through its handle"):
        box.send("researcher", "forged", sender="writer")
    assert writer.pending() == 1 and box.pending("researcher") == 0
    box.send("editor", "the others still act by name", sender="researcher")
    assert [m.body for m in box.receive("editor")] == ["the others still act by name"]


def test_an_agent_the_drop_in_acted_as_gets_no_second_handle() -> None:
    box = InProcessMailbox()
    box.send("writer", "need a title", sender="researcher")
    with pytest.raises(ValueError, match="'researcher': its handle was already given out"):
        box.mailbox.agent("researcher")
    assert [m.sender for m in box.receive("writer")] == ["researcher"]


@pytest.mark.parametrize("bound", [True, 1.5, "10"])
def test_a_max_inbox_that_is_not_an_int_is_refused_by_name(bound: Any) -> None:
    with pytest.raises(TypeError, match="max_inbox must be an int"):
        InProcessMailbox(max_inbox=bound)


def test_a_subclass_that_overrides_send_keeps_its_own_send() -> None:
    sent = []

    class Counting(InProcessMailbox):
        def send(self, recipient: str, body: Any, *, sender: str,
                 correlation_id: str | None = None) -> str:
            sent.append(body)
            return super().send(recipient, body, sender=sender, correlation_id=correlation_id)

    box = Counting()
    box.send("writer", "counted", sender="researcher")
    assert sent == ["counted"] and [m.body for m in box.receive("writer")] == ["counted"]


def test_a_subscriber_added_after_plain_sends_hears_every_later_one() -> None:
    box = InProcessMailbox()
    box.send("writer", "before", sender="researcher")
    heard: list[Any] = []
    box.subscribe("writer", lambda msg: heard.append(msg.body))
    box.send("writer", "after", sender="researcher")
    box.send("writer", {"also": "after"}, sender="researcher")
    assert heard == ["after", {"also": "after"}]


_sends = st.lists(st.tuples(
    st.sampled_from(["send", "send", "send", "receive", "subscribe"]),
    st.sampled_from(["w", "x"]),
    st.sampled_from(["text", "ünïcode", {"task": "review", "priority": 2}, [1, 2.5, None]]),
), max_size=40)


@settings(max_examples=60, deadline=None)
@given(_sends)
@example([("send", "w", "text")] * 5)  # past the bound
@example([("subscribe", "w", "text"), ("send", "w", {"task": "review"})])
def test_the_drop_ins_send_folds_exactly_what_the_mailboxs_send_folds(
    ops: list[tuple[str, str, Any]]
) -> None:
    # The drop-in acts through the agents' handles: it must leave the state a handle's sends
    # and receives leave, at the bound and with a subscriber included.
    drop_in = InProcessMailbox(max_inbox=3, clock=lambda: 5.0, ids=_counted())
    whole = Mailbox(max_queue=3, overflow="drop_oldest", clock=lambda: 5.0, ids=_counted())
    handles: dict[str, AgentHandle] = {}

    def handle(name: str) -> AgentHandle:
        return handles[name] if name in handles else handles.setdefault(name, whole.agent(name))

    for op, agent, body in ops:
        if op == "send":
            sent = drop_in.send(agent, body, sender="r")
            assert handle("r").send(agent, body).id == sent
        elif op == "receive":
            got = drop_in.receive(agent, limit=2)
            assert [m.body for m in got] == [e.body for e in handle(agent).receive(limit=2)]
        else:
            drop_in.subscribe(agent, lambda message: None)
            whole.subscribe(agent, lambda message: None)
        assert drop_in.mailbox.state == whole.state
