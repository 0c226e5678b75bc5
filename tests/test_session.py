"""The session fold, specified: what each event does to a session, and that replaying a live
run's log gives back exactly the session the run held.

``Session.apply`` is a table from event type to fold; the first tests read that table row by row.
The property test at the end drives the pure turn loop (``nous_inbox.loop``) the way a runner and
an owner would, with messages of every kind (blank ones included) arriving between and during
steps, records every event into a live session one ``apply`` at a time, and checks that
``replay(events)`` equals it, from the start and from any midpoint, and that the session's
transcript is the loop's own at the end of each turn.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_inbox import (
    Inbox,
    Message,
    MessageSent,
    QueueClaimed,
    ReplayError,
    Session,
    Target,
    ToolCall,
    replay,
)
from nous_inbox.commands import CallModel, Claim, EndTurn, RunTools
from nous_inbox.events import (
    EVENT_TYPES,
    CancelRequested,
    Event,
    MailAgent,
    MailAnswered,
    MailDropped,
    MailNoticed,
    MailRead,
    MailReceived,
    MailSent,
    MailWithdrawn,
    MessageWithdrawn,
    ModelReplied,
    ModelRequested,
    Nudged,
    SessionReleased,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.happenings import (
    Cancelled,
    ClaimAnswered,
    Happening,
    ModelAnswered,
    ToolsFinished,
    TurnOpened,
)
from nous_inbox.loop import advance, new_state

TURN, STEP = Target.NEXT_TURN, Target.NEXT_STEP
STRESS = max(1, int(os.environ.get("NOUS_INBOX_STRESS", "1") or 1))
CALL = ToolCall("c1", "read", {"path": "a.log"})


def numbered(*events: Event) -> list[Event]:
    return [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events, 1)]


def fold(*events: Event) -> Session:
    session = Session()
    for event in numbered(*events):
        session = session.apply(event)
    return session


# -- the table, row by row ------------------------------------------------------------------------


def test_a_sent_message_joins_its_queue_with_its_wake_flag() -> None:
    session = fold(MessageSent(target=STEP, wakeup=False, message=Message.user("fyi")))
    assert session.inbox == Inbox().send("fyi", STEP, False, seq=1)  # numbered by its send
    assert list(session.transcript) == [] and session.version == 1


def test_a_claim_moves_the_queue_into_the_transcript() -> None:
    session = fold(
        MessageSent(target=STEP, wakeup=True, message=Message.user("a")),
        MessageSent(target=TURN, wakeup=True, message=Message.user("b")),
        QueueClaimed(target=STEP, count=1),
    )
    assert [m.content for m in session.transcript] == ["a"]
    assert session.inbox == Inbox().send("b", TURN, True, seq=2)


@settings(max_examples=300, deadline=None)
@given(
    sends=st.lists(st.tuples(st.sampled_from([TURN, STEP]), st.booleans(),
                             st.sampled_from(["go", " ", "", "later"])), max_size=6),
    claimed_before=st.booleans(),
    target=st.sampled_from([TURN, STEP, "next_step", "next_turn"]),
    wake_only=st.booleans(),
    limit=st.none() | st.integers(0, 7),
)
def test_a_claim_made_on_a_session_is_the_fold_of_the_event_it_records(
    sends: list[tuple[Target, bool, str]], claimed_before: bool, target: Any, wake_only: bool,
    limit: int | None,
) -> None:
    # The journal folds its own claims with Session.claim, not apply: what it keeps must be
    # what replay makes of the event it records, and that event what the inbox decided.
    events: list[Event] = [MessageSent(target=t, wakeup=w, message=Message.user(text))
                           for t, w, text in sends]
    if claimed_before and sends:
        events.append(QueueClaimed(target=sends[0][0], count=sum(
            1 for t, _, _ in sends if t is sends[0][0])))
    session = fold(*events)
    taken, event, after = session.claim(target, at=2.5, wake_only=wake_only, limit=limit)
    expected, rest = session.inbox.claim(target, limit, wake_only=wake_only)
    assert list(taken) == list(expected)
    if not expected:
        assert event is None and after is session
        return
    assert event is not None and (event.seq, event.at) == (session.version + 1, 2.5)
    assert event.target is Target(target) and event.count == len(expected)
    assert after == session.apply(event) and after.inbox == rest
    assert replay([*numbered(*events), event]) == after


def test_a_claim_that_does_not_match_the_queue_is_a_replay_error() -> None:
    with pytest.raises(ReplayError, match="claim of next_step records 1 message"):
        fold(QueueClaimed(target=STEP, count=1))


@pytest.mark.parametrize("kind", [ModelReplied, ToolReturned, Nudged])
def test_a_reply_a_tool_result_and_a_nudge_join_the_transcript(kind: Any) -> None:
    message = Message.tool("42", "c1") if kind is ToolReturned else Message.assistant("hi")
    session = fold(kind(turn=1, step=1, message=message))
    assert list(session.transcript) == [message]


def test_turns_and_steps_move_the_run_bookkeeping() -> None:
    assert fold(TurnStarted(turn=3)).running
    assert (fold(TurnStarted(turn=3)).turn, fold(TurnStarted(turn=3)).step) == (3, 0)
    assert fold(TurnStarted(turn=3), StepStarted(turn=3, step=2)).step == 2
    ended = fold(TurnStarted(turn=3), TurnEnded(turn=3, steps=0, reason="final"))
    assert not ended.running and ended.turn == 3


@pytest.mark.parametrize(
    "event",
    [ModelRequested(turn=1, step=1, count=4), ToolCalled(turn=1, step=1, call=CALL),
     StepEnded(turn=1, step=1), Warned(text="careful")],
    ids=lambda e: type(e).__name__,
)
def test_a_request_a_tool_call_a_step_end_and_a_warning_change_only_the_version(
    event: Event,
) -> None:
    assert fold(event) == Session(version=1)


def test_every_event_type_of_the_vocabulary_folds_and_agrees_with_replay() -> None:
    samples: dict[type, Event] = {
        MessageSent: MessageSent(target=STEP, wakeup=True, message=Message.user("a")),
        MessageWithdrawn: MessageWithdrawn(sent=1, target=STEP),
        QueueClaimed: QueueClaimed(target=STEP, count=0),
        TurnStarted: TurnStarted(turn=1),
        StepStarted: StepStarted(turn=1, step=1),
        ModelRequested: ModelRequested(turn=1, step=1, count=1),
        ModelReplied: ModelReplied(turn=1, step=1, message=Message.assistant("x")),
        ToolCalled: ToolCalled(turn=1, step=1, call=CALL),
        ToolReturned: ToolReturned(turn=1, step=1, message=Message.tool("r", "c1")),
        StepEnded: StepEnded(turn=1, step=1),
        Nudged: Nudged(turn=1, step=1, message=Message.user("go on")),
        TurnEnded: TurnEnded(turn=1, steps=1, reason="final"),
        Warned: Warned(text="w"),
        CancelRequested: CancelRequested(turn=1),
        SessionReleased: SessionReleased(turn=1),
        # The mailbox's events live in a stream of their own; a session passes them by.
        MailSent: MailSent(id="m", sender="a", recipient="b", body="hi"),
        MailDropped: MailDropped(id="m", recipient="b"),
        MailReceived: MailReceived(recipient="b", ids=("m",)),
        MailNoticed: MailNoticed(recipient="b", notice="n", ids=("m",)),
        MailRead: MailRead(recipient="b", ids=("m",)),
        MailAnswered: MailAnswered(recipient="b", ids=("m",), by="r"),
        MailWithdrawn: MailWithdrawn(id="m", recipient="b"),
        MailAgent: MailAgent(agent="b", parent="a"),
    }
    assert set(samples) == set(EVENT_TYPES)
    events = numbered(*samples.values())
    assert fold(*samples.values()) == replay(events) == Session().apply_all(events)
    assert replay(events).version == len(EVENT_TYPES)


def test_a_batch_folds_as_its_events_one_at_a_time_errors_included() -> None:
    events = numbered(MessageSent(target=STEP, wakeup=True, message=Message.user("a")),
                      TurnStarted(turn=1), StepStarted(turn=1, step=1),
                      ModelRequested(turn=1, step=1, count=1), QueueClaimed(target=STEP, count=1),
                      ModelReplied(turn=1, step=1, message=Message.assistant("x")),
                      StepEnded(turn=1, step=1))
    for cut in range(len(events) + 1):  # every batch, inert events at its ends included
        head = Session().apply_all(events[:cut])
        assert head == fold(*events[:cut]) and head.apply_all(events[cut:]) == fold(*events)
    with pytest.raises(ReplayError, match="stream 's' seq 3: expected seq 2 after 1"):
        Session().apply_all([events[0], events[2]], "s")
    with pytest.raises(ReplayError, match="claim of next_step records 2"):
        Session().apply_all([*events[:4], QueueClaimed(seq=5, target=STEP, count=2)])


def test_an_event_out_of_sequence_is_a_replay_error_naming_the_stream() -> None:
    with pytest.raises(ReplayError, match="stream 's' seq 3: expected seq 2 after 1"):
        Session(version=1).apply(Warned(seq=3, text="late"), "s")


# -- replay(live events) == the live session, for runs driven through the loop --------------------

_texts = st.sampled_from(["check the staging log", "stop", "", " ", "\n\t", "later please"])
_sends = st.lists(
    st.tuples(st.sampled_from([TURN, STEP]), st.booleans(), _texts), max_size=3
)
_replies = st.sampled_from(["final", "blank", "tool", "tool", "cancel"])


class _Live:
    """A live session and its log, recorded one event at a time as an owner would."""

    def __init__(self) -> None:
        self.session = Session()
        self.events: list[Event] = []

    def record(self, *events: Event) -> None:
        for event in events:
            event = msgspec.structs.replace(event, seq=self.session.version + 1)
            self.session = self.session.apply(event)
            self.events.append(event)

    def send(self, sends: list[tuple[Target, bool, str]]) -> None:
        for target, wakeup, text in sends:
            self.record(MessageSent(target=target, wakeup=wakeup, message=Message.user(text)))

    def claim(self, command: Claim) -> ClaimAnswered:
        taken, _ = self.session.inbox.claim(command.target, wake_only=command.wake_only)
        if taken or not command.wake_only:
            self.record(QueueClaimed(target=command.target, count=len(taken)))
        return ClaimAnswered(command.target, list(taken))


def _reply(kind: str, step: int) -> Happening:
    if kind == "final":
        return ModelAnswered(Message.assistant(f"done at step {step}"))
    if kind == "blank":
        return ModelAnswered(Message.assistant("  "))
    if kind == "tool":
        call = ToolCall(f"c{step}", "read", {"path": "a.log"})
        return ModelAnswered(Message.assistant(tool_calls=[call]))
    return Cancelled()


def _run_turn(live: _Live, turn: int, data: st.DataObject, max_steps: int) -> None:
    state, command, events = advance(
        new_state(max_steps), TurnOpened(turn, "wake", live.session.transcript)
    )
    live.record(*events)
    while not isinstance(command, EndTurn):
        happening: Happening
        if isinstance(command, Claim):
            happening = live.claim(command)
        elif isinstance(command, CallModel):
            live.send(data.draw(_sends, label="sent while the model thinks"))
            happening = _reply(data.draw(_replies, label="reply"), state.step)
        else:
            assert isinstance(command, RunTools)
            live.send(data.draw(_sends, label="sent while a tool runs"))
            happening = ToolsFinished(
                [Message.tool("42 lines", call.id, name=call.name) for call in command.calls]
            )
        state, command, events = advance(state, happening)
        live.record(*events)
    assert list(state.transcript) == list(live.session.transcript)  # the loop's view is the log's


@settings(max_examples=60 * STRESS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_steps=st.integers(1, 3), split=st.integers(0, 200))
def test_replaying_a_live_runs_log_gives_the_live_session(
    data: st.DataObject, max_steps: int, split: int
) -> None:
    live = _Live()
    for turn in range(1, 4):
        live.send(data.draw(_sends, label="sent while idle"))
        if not live.session.inbox.worth_waking():  # the owner's wake check: nothing worth a turn
            continue
        _run_turn(live, turn, data, max_steps)
    assert replay(live.events) == live.session
    middle = replay(live.events[:split])
    assert replay(live.events[split:], start=middle) == live.session
    assert Session().apply_all(live.events[:split]).apply_all(live.events[split:]) == live.session


# -- the loop and the inbox together: ruling 4 at a would-be final answer ---------------------------


def _turn_with_a_send_while_the_model_thinks(text: str) -> tuple[_Live, list[str]]:
    """One turn: the model answers "done" while ``text`` is steered in; then, if the run went
    on, "ok". Returns the live session and the names of the commands the loop gave."""
    live = _Live()
    live.send([(TURN, True, "tidy the logs")])
    state, command, events = advance(new_state(3), TurnOpened(1, "wake", ()))
    live.record(*events)
    commands = []
    answers = iter([Message.assistant("done"), Message.assistant("ok")])
    while not isinstance(command, EndTurn):
        commands.append(type(command).__name__)
        happening: Happening
        if isinstance(command, Claim):
            happening = live.claim(command)
        else:
            live.send([(STEP, True, text)] if state.step == 1 else [])
            happening = ModelAnswered(next(answers))
        state, command, events = advance(state, happening)
        live.record(*events)
    return live, commands


def test_a_steer_pending_at_a_would_be_final_answer_extends_the_run() -> None:
    live, commands = _turn_with_a_send_while_the_model_thinks("and the README")
    assert commands.count("CallModel") == 2
    assert [m.content for m in live.session.transcript][-2:] == ["and the README", "ok"]
    assert not live.session.inbox.has_pending()


@pytest.mark.parametrize("blank", ["", "   ", "\n\t"])
def test_a_blank_steer_pending_at_a_would_be_final_answer_neither_extends_nor_is_lost(
    blank: str,
) -> None:
    live, commands = _turn_with_a_send_while_the_model_thinks(blank)
    assert commands.count("CallModel") == 1
    assert [m.content for m in live.session.transcript] == ["tidy the logs", "done"]
    assert [m.content for m, _ in live.session.inbox.entries(STEP)] == [blank]  # still queued
    assert not live.session.inbox.worth_waking()  # and the owner opens no turn for it
    assert replay(live.events) == live.session
