"""Metrics of owners outside ``serve``: attach an owner to a :class:`Metrics`, scrape its
registry, and each family moves as the owner's sends, claims, turns and steps happen."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import StepStarted, ToolCalled, TurnStarted, Warned
from nous_inbox.message import Message, ToolCall
from nous_inbox.observe import Metrics
from nous_inbox.owner import AsyncOwner, Owner
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store

WAIT = 20.0  # seconds: a bound for what should happen at once, never a sleep to synchronise


def scrape(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the Prometheus text, parsed back by prometheus_client's own parser."""
    text = metrics.exposition().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def echo(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    return Message.assistant(f"heard {transcript[-1].content}")


def test_a_threaded_owner_counts_its_sends_claims_turns_and_steps() -> None:
    metrics = Metrics()
    store = open_store("memory:")
    owner = Owner(store, "s1", Runner(echo))
    metrics.attach(owner)
    owner.inject("have this")
    owner.steer("go")
    assert owner.wait_idle(WAIT)
    owner.followup("then this")
    assert owner.wait_idle(WAIT)
    got = scrape(metrics)
    assert value(got, "nous_inbox_sends_total", mode="inject") == 1
    assert value(got, "nous_inbox_sends_total", mode="steer") == 1
    assert value(got, "nous_inbox_sends_total", mode="followup") == 1
    # turn 1 opens on the steer (claims next_turn: nothing there), its step claims next_step;
    # turn 2 opens on the followup.
    assert value(got, "nous_inbox_claimed_messages_total", queue="next_step") == 2
    assert value(got, "nous_inbox_claimed_messages_total", queue="next_turn") == 1
    assert value(got, "nous_inbox_claims_total", queue="next_step") >= 1
    assert value(got, "nous_inbox_send_to_claim_seconds_count", queue="next_step") == 2
    assert value(got, "nous_inbox_send_to_claim_seconds_count", queue="next_turn") == 1
    assert value(got, "nous_inbox_turn_seconds_count", reason="final") == 2
    assert value(got, "nous_inbox_step_seconds_count") == 2
    assert value(got, "nous_inbox_sessions_held") == 1
    assert value(got, "nous_inbox_sessions_running") == 0
    owner.close()
    assert value(scrape(metrics), "nous_inbox_sessions_held") == 0


def test_messages_queued_before_the_attach_are_claimed_but_not_timed() -> None:
    metrics = Metrics()
    owner = Owner(open_store("memory:"), "s1", Runner(echo))
    owner.inject("one")
    owner.inject("two")  # queued before anyone counted: their send times are not known here
    metrics.attach(owner)
    owner.steer("go")
    assert owner.wait_idle(WAIT)
    got = scrape(metrics)
    assert value(got, "nous_inbox_claimed_messages_total", queue="next_step") == 3
    assert value(got, "nous_inbox_send_to_claim_seconds_count", queue="next_step") == 1
    owner.close()


def test_a_withdrawn_message_is_never_timed_as_claimed() -> None:
    metrics = Metrics()
    owner = Owner(open_store("memory:"), "s1", Runner(echo))
    metrics.attach(owner)
    kept = owner.inject("kept")
    gone = owner.inject("gone")
    owner.withdraw(gone.seq)
    owner.steer("go")
    assert owner.wait_idle(WAIT) and kept.seq < gone.seq
    got = scrape(metrics)
    assert value(got, "nous_inbox_claimed_messages_total", queue="next_step") == 2
    assert value(got, "nous_inbox_send_to_claim_seconds_count", queue="next_step") == 2
    owner.close()


def test_a_run_going_counts_as_running_until_its_turn_ends() -> None:
    metrics = Metrics()
    entered, release = threading.Event(), threading.Event()

    def slow(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        entered.set()
        release.wait(WAIT)
        return Message.assistant("done")

    owner = Owner(open_store("memory:"), "s1", Runner(slow))
    metrics.attach(owner)
    owner.steer("go")
    assert entered.wait(WAIT)
    assert value(scrape(metrics), "nous_inbox_sessions_running") == 1
    release.set()
    assert owner.wait_idle(WAIT)
    assert value(scrape(metrics), "nous_inbox_sessions_running") == 0
    owner.close()


def a_turn_left_open(store: Store, session: str) -> None:
    """What a holder killed mid-turn leaves: a turn opened, a tool called, no end."""
    call = ToolCall("c1", "read", {})
    store.append(session, [TurnStarted(turn=1), StepStarted(turn=1, step=1),
                           ToolCalled(turn=1, step=1, call=call)])


def test_an_owner_that_closes_a_turn_its_last_holder_left_counts_a_takeover() -> None:
    metrics = Metrics()
    store = open_store("memory:")
    a_turn_left_open(store, "s1")
    store.append("quiet", [Warned(text="nothing open")])

    async def main() -> None:
        taking = AsyncOwner(store, "s1", Runner(echo))
        metrics.attach(taking)  # before it opens: its open closes the turn
        quiet = AsyncOwner(store, "quiet", Runner(echo))
        metrics.attach(quiet)
        async with taking, quiet:
            got = scrape(metrics)
            assert value(got, "nous_inbox_takeovers_total") == 1
            assert value(got, "nous_inbox_turn_seconds_count", reason="error") == 0  # start unseen

    asyncio.run(main())


class TakenOver:
    """A store whose lease another owner takes over at ``take()``: from then on every append is
    fenced (``LeaseLostError``, nothing written), as PostgreSQL's is."""

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.taken = False

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if self.taken:
            raise LeaseLostError("lease of stream 's' was taken over; nothing was written",
                                 stream="s", epoch=1)
        return self._inner.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_an_owner_whose_lease_is_taken_over_counts_once_as_a_lease_lost() -> None:
    metrics = Metrics()
    store = TakenOver(open_store("memory:"))

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:  # type: ignore[arg-type]
            detach = metrics.attach(owner)
            await owner.inject("before")
            store.taken = True
            with pytest.raises(LeaseLostError):
                await owner.steer("after")
            got = scrape(metrics)
            assert value(got, "nous_inbox_leases_lost_total") == 1
            assert value(got, "nous_inbox_sessions_held") == 0
            detach()  # already forgotten: not counted again
            assert value(scrape(metrics), "nous_inbox_leases_lost_total") == 1

    asyncio.run(main())


def test_a_stores_appends_are_timed_until_the_timing_stops() -> None:
    metrics = Metrics()
    store = open_store("memory:")
    stop = metrics.observe_store(store)
    store.append("s1", [Warned(text="a"), Warned(text="b")])
    store.append("s2", [Warned(text="c")])
    assert value(scrape(metrics), "nous_inbox_store_append_seconds_count") == 2
    stop()
    store.append("s1", [Warned(text="d")])
    assert value(scrape(metrics), "nous_inbox_store_append_seconds_count") == 2


def test_an_append_observer_hears_each_append_and_one_that_raises_fails_no_append() -> None:
    store = open_store("memory:")
    heard: list[tuple[str, int]] = []

    def broken(stream: str, events: int, seconds: float) -> None:
        raise RuntimeError("an observer's own fault")

    store.observe_appends(broken)
    store.observe_appends(lambda stream, events, seconds: heard.append((stream, events)))
    stored = store.append("s1", [Warned(text="a"), Warned(text="b")])
    assert [e.seq for e in stored] == [1, 2] and heard == [("s1", 2)]


def test_two_metrics_in_one_process_count_apart() -> None:
    first, second = Metrics(), Metrics()
    owner = Owner(open_store("memory:"), "s1", Runner(echo))
    first.attach(owner)
    owner.inject("one")
    assert value(scrape(first), "nous_inbox_sends_total", mode="inject") == 1
    assert value(scrape(second), "nous_inbox_sends_total", mode="inject") == 0
    owner.close()


def test_a_detached_owner_is_no_longer_counted() -> None:
    metrics = Metrics()
    owner = Owner(open_store("memory:"), "s1", Runner(echo))
    detach = metrics.attach(owner)
    owner.inject("counted")
    detach()
    owner.inject("not counted")
    got = scrape(metrics)
    assert value(got, "nous_inbox_sends_total", mode="inject") == 1
    assert value(got, "nous_inbox_sessions_held") == 0
    owner.close()
