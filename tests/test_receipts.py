"""Receipts and withdraw in the core: a send is followed to where it went, and taken back while
it waits.

A message is identified by the seq of the ``MessageSent`` that queued it (what a send's
acknowledgement carries). ``Inbox.withdraw`` takes an entry back; ``Session.withdraw`` decides
whether a withdraw is recorded (a ``MessageWithdrawn``); replay agrees; and
``nous_inbox.receipts`` answers, from the log, whether the message is still queued, which turn and
step claimed it, or that it was withdrawn.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_inbox.errors import ReplayError
from nous_inbox.events import (
    Event,
    MessageSent,
    MessageWithdrawn,
    QueueClaimed,
    StepEnded,
    StepStarted,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message
from nous_inbox.receipts import Deliveries, Receipt, receipt
from nous_inbox.session import Session, replay
from nous_inbox.verbs import Target

TURN, STEP = Target.NEXT_TURN, Target.NEXT_STEP


def _numbered(*events: Event) -> list[Event]:
    import msgspec

    return [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events, 1)]


def _sent(target: Target, text: str, wakeup: bool = True) -> MessageSent:
    return MessageSent(target=target, wakeup=wakeup, message=Message.user(text))


# -- the value --------------------------------------------------------------------------------------


def test_a_withdrawn_entry_leaves_its_queue_and_the_rest_keep_their_order() -> None:
    inbox = (Inbox().send("a", STEP, False, 1).send("b", STEP, True, 2)
             .send("c", STEP, False, 3).send("later", TURN, True, 4))
    where, after = inbox.withdraw(2)
    assert where is STEP
    assert [m.content for m, _ in after.entries(STEP)] == ["a", "c"]
    assert after.seqs(STEP) == [1, 3] and after.seqs(TURN) == [4]
    assert inbox.seqs(STEP) == [1, 2, 3]  # the value withdrawn from is unchanged


def test_withdrawing_the_only_steer_leaves_nothing_that_wakes() -> None:
    inbox = Inbox().send("fyi", STEP, False, 1).send("go", STEP, True, 2)
    _, after = inbox.withdraw(2)
    assert not after.wants_wake() and not after.worth_waking()
    assert after == Inbox().send("fyi", STEP, False, 1)


def test_withdrawing_a_seq_no_entry_holds_returns_the_same_inbox() -> None:
    inbox = Inbox().send("a", TURN, True, 1)
    assert inbox.withdraw(7) == (None, inbox)
    assert inbox.withdraw(7)[1] is inbox


@pytest.mark.parametrize(("seq", "error", "says"), [
    (0, ValueError, "seq must be an int >= 1, got 0"),
    (True, TypeError, "seq must be an int, got bool"),
    ("3", TypeError, "seq must be an int, got str"),
])
def test_a_withdraw_by_a_bad_seq_is_refused_naming_it(seq: Any, error: type, says: str) -> None:
    with pytest.raises(error, match=says):
        Inbox().send("a", TURN, True, 1).withdraw(seq)


def test_a_send_numbered_by_a_bad_seq_is_refused() -> None:
    with pytest.raises(ValueError, match="seq must be an int >= 0, got -1"):
        Inbox().send("a", TURN, True, -1)


def test_a_numbered_inbox_round_trips_with_its_seqs() -> None:
    inbox = Inbox().send("a", STEP, True, 5).inject("b")
    assert Inbox.from_json(inbox.to_json()) == inbox
    assert Inbox.from_msgpack(inbox.to_msgpack()).seqs(STEP) == [5, 0]


# -- the session and its log ------------------------------------------------------------------------


def test_a_withdraw_is_recorded_only_for_a_message_still_queued() -> None:
    session = replay(_numbered(_sent(TURN, "a"), _sent(STEP, "b")))
    event = session.withdraw(1, at=3.0)
    assert event == MessageWithdrawn(sent=1, target=TURN, seq=3, at=3.0)
    after = session.apply(event)
    assert after.inbox.holds(1) is None and after.inbox.holds(2) is STEP
    assert after.withdraw(1) is None  # gone already
    assert session.withdraw(9) is None  # no such send


def test_replay_of_a_withdraw_equals_the_live_fold_even_from_a_snapshot() -> None:
    log = _numbered(_sent(STEP, "a"), _sent(STEP, "b"), _sent(TURN, "c"),
                    MessageWithdrawn(sent=2, target=STEP), MessageWithdrawn(sent=1, target=STEP),
                    QueueClaimed(target=TURN, count=1))
    live = Session()
    for event in log:
        live = live.apply(event)
    assert replay(log) == live
    assert replay(log[3:], start=replay(log[:3])) == live  # a withdraw of what the start held
    assert list(live.transcript) == [Message.user("c")] and not live.inbox.has_pending()


def test_a_withdraw_of_a_message_not_queued_there_is_a_replay_error() -> None:
    log = _numbered(_sent(STEP, "a"), MessageWithdrawn(sent=1, target=TURN))
    says = "seq 2: withdraw of the message sent at seq 1 from next_turn, but no such message"
    with pytest.raises(ReplayError, match=says):
        replay(log)
    with pytest.raises(ReplayError, match=says):
        Session().apply(log[0]).apply(log[1])


# -- receipts ---------------------------------------------------------------------------------------

_RUN = _numbered(
    _sent(TURN, "tidy the logs"),                    # 1
    TurnStarted(turn=1),                             # 2
    QueueClaimed(target=TURN, count=1),              # 3: turn 1 opens with it: step 1 reads it
    StepStarted(turn=1, step=1),                     # 4
    _sent(STEP, "only a.log"),                       # 5
    _sent(STEP, "never mind", wakeup=False),         # 6
    StepEnded(turn=1, step=1),                       # 7
    MessageWithdrawn(sent=6, target=STEP),           # 8
    QueueClaimed(target=STEP, count=1),              # 9: after step 1: step 2 reads it
    StepStarted(turn=1, step=2),                     # 10
    TurnEnded(turn=1, steps=2, reason="final"),      # 11
    _sent(TURN, "and then?"),                        # 12
)


@pytest.mark.parametrize(("sent", "expected"), [
    (1, Receipt(sent=1, target=TURN, state="claimed", turn=1, step=1, by=3)),
    (5, Receipt(sent=5, target=STEP, state="claimed", turn=1, step=2, by=9)),
    (6, Receipt(sent=6, target=STEP, state="withdrawn", by=8)),
    (12, Receipt(sent=12, target=TURN, state="queued")),
])
def test_a_receipt_says_which_turn_and_step_claimed_a_send_or_that_it_waits(
    sent: int, expected: Receipt,
) -> None:
    assert receipt(_RUN, sent) == expected


def test_a_receipt_reads_as_a_sentence() -> None:
    assert [str(receipt(_RUN, seq)) for seq in (5, 6, 12)] == [
        "the message sent at seq 5 was claimed by turn 1 for step 2 (event #9)",
        "the message sent at seq 6 was withdrawn (event #8)",
        "the message sent at seq 12 is still queued on next_turn",
    ]


def test_a_claim_outside_any_turn_names_turn_0() -> None:
    log = _numbered(_sent(TURN, "a"), QueueClaimed(target=TURN, count=1))
    assert str(receipt(log, 1)) == "the message sent at seq 1 was claimed outside any turn (event #2)"


def test_a_receipt_of_something_not_a_send_is_refused_saying_what_it_is() -> None:
    with pytest.raises(ValueError, match="seq 2 is a TurnStarted, not a send"):
        receipt(_RUN, 2)
    with pytest.raises(LookupError, match=r"no event at seq 40 \(the log ends at seq 12\)"):
        receipt(_RUN, 40)


def test_deliveries_started_from_a_session_follow_what_it_still_held() -> None:
    deliveries = Deliveries(replay(_RUN[:6]))
    assert deliveries.knows(5) and deliveries.knows(6) and not deliveries.knows(1)
    settled = deliveries.fold(_RUN[6:])
    assert settled == [receipt(_RUN, 6), receipt(_RUN, 5)]
    assert deliveries.queued(12) == receipt(_RUN, 12)


# -- a property: any log of sends, claims and withdraws -----------------------------------------

_steps = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from([TURN, STEP]), st.booleans()),
    st.tuples(st.just("claim"), st.sampled_from([TURN, STEP]), st.integers(0, 3)),
    st.tuples(st.just("withdraw"), st.integers(1, 12)),
    st.tuples(st.just("turn")),
    st.tuples(st.just("step")),
    st.tuples(st.just("end")),
), max_size=14)


@settings(max_examples=300, deadline=None)
@given(steps=_steps)
def test_any_log_replays_as_it_folds_and_every_send_has_one_receipt(steps: list[Any]) -> None:
    session, log = Session(), []
    sent: dict[int, Target] = {}
    where_went: dict[int, Receipt] = {}  # the model: filled as each claim and withdraw is made
    turn = step = 0
    running = False
    for kind, *args in steps:
        seq = session.version + 1
        event: Event | None = None
        if kind == "send":
            event = MessageSent(target=args[0], wakeup=args[1], message=Message.user("m"), seq=seq)
            sent[seq] = args[0]
        elif kind == "claim":
            taken, event, _ = session.claim(args[0], limit=args[1] or None)
            for sent_seq in [s for s in session.inbox.seqs(args[0])][:len(taken)]:
                where_went[sent_seq] = Receipt(
                    sent=sent_seq, target=args[0], state="claimed", by=seq,
                    **({"turn": turn, "step": step + 1} if running else {}))
        elif kind == "withdraw":
            event = session.withdraw(args[0])
            if event is not None:
                where_went[args[0]] = Receipt(sent=args[0], target=sent[args[0]],
                                              state="withdrawn", by=seq)
        elif kind == "turn":
            turn, step, running = turn + 1, 0, True
            event = TurnStarted(turn=turn, seq=seq)
        elif kind == "step" and running:
            step += 1
            event = StepStarted(turn=turn, step=step, seq=seq)
        elif kind == "end" and running:
            running = False
            event = TurnEnded(turn=turn, steps=step, reason="final", seq=seq)
        if event is not None:
            session = session.apply(event)
            log.append(event)
    assert replay(log) == session
    for seq, target in sent.items():
        expected = where_went.get(seq, Receipt(sent=seq, target=target, state="queued"))
        assert receipt(log, seq) == expected
