"""Routing for hosts with one inbox value per agent (the aimu adapter's): addresses, the send
clock, which followups a run is owed, and the loop's claims carried out on one address."""

from __future__ import annotations

import pytest

from nous_inbox.adapters.aimu_routing import (
    ORDER_KEY,
    SendClock,
    addresses,
    check_agent,
    claim_for_run,
    order_of,
    split_owed,
    stamped,
    stream_name,
)
from nous_inbox.commands import CLAIMS, round_claims
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message


@pytest.mark.parametrize("agent", ["", "*"])
def test_the_empty_and_star_names_are_reserved_for_the_shared_address(agent: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        check_agent(agent, "steer")


def test_an_agent_that_is_not_a_str_is_a_type_error_naming_the_place() -> None:
    with pytest.raises(TypeError, match="steer: agent must be a str or None, got int"):
        check_agent(3, "steer")


def test_a_run_reads_its_own_address_then_the_shared_one() -> None:
    assert addresses("a") == ("a", None)
    assert addresses(None) == (None,)
    assert stream_name("p:", "a") == "p:a" and stream_name("p:", None) == "p:*"


def test_the_send_clock_never_goes_back_even_past_positions_from_the_future() -> None:
    clock = SendClock()
    first = clock.next()
    assert clock.next() > first
    clock.saw([stamped(Message.user("x"), first + 10**15)])
    assert clock.next() == first + 10**15 + 1


def test_a_message_without_a_position_sorts_first() -> None:
    assert order_of(Message.user("no position")) == -1
    assert stamped(Message.user("x"), 7).metadata[ORDER_KEY] == 7


def test_owed_followups_are_counted_as_a_multiset() -> None:
    same = (Message.user("again"), True)
    owed, late = split_owed([same, same, same], [same, same])
    assert (len(owed), len(late)) == (2, 1)


def test_a_first_drain_claims_the_owed_followups_and_every_step_message() -> None:
    box = Inbox().followup("owed").steer("now")
    at_start = box.entries("next_turn")
    box = box.followup("late")
    box, events, (turn, step) = claim_for_run(box, round_claims(first=True), at_start)
    assert ([m.content for m in turn], [m.content for m in step]) == (["owed"], ["now"])
    assert [m.content for m, _ in box.entries("next_turn")] == ["late"]
    assert [(e.count, e.rest) for e in events] == [(1, 1), (1, 0)]


def test_after_the_first_drain_a_run_is_owed_no_followup() -> None:
    box = Inbox().followup("for the next run").inject("fyi")
    box, _, taken = claim_for_run(box, round_claims(first=False), None)
    assert [[m.content for m in messages] for messages in taken] == [["fyi"]]
    assert box.count("next_turn") == 1 and box.count("next_step") == 0


def test_a_first_drain_with_nothing_owed_claims_no_followup() -> None:
    box = Inbox().followup("sent after the run opened")
    box, events, (turn, step) = claim_for_run(box, round_claims(first=True), ())
    assert (turn, step, events) == ([], [], [])
    assert box.count("next_turn") == 1


def test_a_claim_is_carried_out_as_the_loop_asks() -> None:
    box = Inbox().inject("fyi")  # a wake-only claim (where a run would stop) leaves it
    box, events, taken = claim_for_run(box, [CLAIMS["stop"]], None)
    assert taken == [[]] and events == [] and box.count("next_step") == 1
