"""The aimu adapter, as a specification: ``AimuInbox`` alone, then inside real aimu ``Agent`` runs.

The first part needs nothing but this library. The second runs real ``aimu`` agents (the optional
``aimu`` test extra) offline: a scripted model client answers from a list, records every request it
was sent, and can act while a request is "in flight" (a person typing while the model composes its
answer). Tools act the same way while they run. Without aimu installed that part is skipped.

``test_concurrent_hosts_and_runs_lose_and_double_nothing`` is marked ``slow``; its size scales with
the environment variable ``NOUS_INBOX_STRESS`` (an integer multiplier, default 1), and so does the
number of examples of the property test ``test_runs_in_several_processes_get_exactly_what_they_are_owed``.

"Another process" is played by a second ``AimuInbox`` on the same store (each with its own SQLite
connection), and once by a real ``python`` subprocess.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import SimpleNamespace
from typing import Any
from unittest import mock

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_inbox.adapters import aimu as aimu_module
from nous_inbox.adapters.aimu import AimuInbox, stream_name
from nous_inbox.adapters.aimu_routing import ORDER_KEY
from nous_inbox.errors import ConcurrencyError
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message, enc_hook
from nous_inbox.session import replay
from nous_inbox.store import open_store
from nous_inbox.verbs import Target
from tests.aimu_kit import Reply, aimu_kit, call, said

_STRESS = max(1, int(os.environ.get("NOUS_INBOX_STRESS", "1")))


class FakeStore:
    """The store protocol in a few lines, with events round-tripped through JSON like a real log.

    ``fail`` makes the next appends raise, like a full disk.
    """

    _decoder = msgspec.json.Decoder(Event)

    def __init__(self) -> None:
        self.logs: dict[str, list[Event]] = {}
        self.fail = False

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None
    ) -> list[Event]:
        if self.fail:
            raise OSError("disk full")
        log = self.logs.setdefault(stream, [])
        if expected_version is not None and expected_version != len(log):
            raise ConcurrencyError(f"{stream}: at {len(log)}, expected {expected_version}")
        written = [
            self._decoder.decode(
                msgspec.json.encode(msgspec.structs.replace(e, seq=len(log) + i), enc_hook=enc_hook)
            )
            for i, e in enumerate(events, 1)
        ]
        log.extend(written)
        return written

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        return iter(self.logs.get(stream, [])[after:])

    def version(self, stream: str) -> int:
        return len(self.logs.get(stream, []))

    def streams(self) -> list[str]:
        return sorted(self.logs)


def kinds(store: FakeStore, stream: str) -> list[tuple[str, str, int | bool]]:
    out: list[tuple[str, str, int | bool]] = []
    for e in store.logs[stream]:
        if isinstance(e, MessageSent):
            out.append(("sent", e.target.value, e.wakeup))
        elif isinstance(e, QueueClaimed):
            out.append(("claimed", e.target.value, e.count))
    return out


# == the adapter on its own ==========================================================================


def test_a_drain_hands_out_each_message_once_oldest_first() -> None:
    box = AimuInbox()
    drain = box.reader("a")
    assert drain() == []
    box.steer("one", agent="a")
    box.inject("two", agent="a")
    box.steer("three", agent="a")
    assert drain() == ["one", "two", "three"]
    assert drain() == []
    assert box.pending("a") == 0


def test_a_drain_returns_a_list_of_str() -> None:
    box = AimuInbox()
    box.steer("go")
    result = box.reader("a")()
    assert type(result) is list and all(type(t) is str for t in result)


@pytest.mark.parametrize("blank", ["   \n", "\u200b", " \ufeff\u2060 "])
def test_a_blank_steer_or_followup_owes_no_run(blank: str) -> None:
    box = AimuInbox()
    box.steer(blank, agent="a")
    box.followup(blank)  # shared: what agent "a" could receive too
    assert box.pending("a") == 2 and not box.wants_wake("a")
    box.steer("now look at the tests", agent="a")
    assert box.wants_wake("a")


def test_steer_and_followup_ask_for_a_run_inject_does_not() -> None:
    box = AimuInbox()
    box.inject("fyi", agent="a")
    assert box.inbox("a").count("next_step") == 1 and not box.wants_wake("a")
    box.steer("go", agent="a")
    assert box.wants_wake("a")
    box.reader("a")()
    assert not box.wants_wake("a")
    box.followup("later", agent="a")
    assert box.inbox("a").count("next_turn") == 1 and box.wants_wake("a")


def test_a_message_for_one_agent_reaches_only_runs_of_that_agent() -> None:
    box = AimuInbox()
    a, b, anonymous = box.reader("a"), box.reader("b"), box.reader(None)
    box.steer("for b", agent="b")
    assert a() == [] and anonymous() == []
    assert b() == ["for b"]


def test_a_shared_message_goes_to_the_first_run_that_asks() -> None:
    box = AimuInbox()
    a, b = box.reader("a"), box.reader("b")
    box.inject("anyone")
    assert b() == ["anyone"]
    assert a() == []
    box.steer("again")
    assert box.reader(None)() == ["again"]


def test_own_and_shared_messages_merge_in_send_order() -> None:
    box = AimuInbox()
    drain = box.reader("a")
    box.inject("1 shared")
    box.steer("2 own", agent="a")
    box.steer("3 shared")
    box.inject("4 own", agent="a")
    assert drain() == ["1 shared", "2 own", "3 shared", "4 own"]


def test_a_followup_waits_for_the_agents_next_run() -> None:
    box = AimuInbox()
    running = box.reader("a")
    box.followup("after this", agent="a")
    box.steer("now", agent="a")
    assert running() == ["now"]
    assert running() == []
    assert box.pending("a", "next_turn") == 1
    assert box.reader("a")() == ["after this"]


def test_a_new_runs_first_drain_gives_followups_before_step_messages() -> None:
    box = AimuInbox()
    box.inject("step, sent first", agent="a")
    box.followup("turn, own", agent="a")
    box.followup("turn, shared")
    drain = box.reader("a")
    box.steer("step, sent after the start", agent="a")
    assert drain() == ["turn, own", "turn, shared", "step, sent first", "step, sent after the start"]


def test_only_the_first_drain_of_a_run_takes_followups() -> None:
    box = AimuInbox()
    drain = box.reader("a")
    assert drain() == []
    box.followup("later", agent="a")
    assert drain() == []
    assert box.reader("a")() == ["later"]


def test_a_followup_sent_between_a_runs_start_and_its_first_drain_is_kept_for_the_next_run() -> None:
    box = AimuInbox()
    box.followup("before", agent="a")
    drain = box.reader("a")
    box.inject("during, no wake", agent="a")  # unrelated step message, for contrast
    box.followup("during", agent="a")
    assert drain() == ["before", "during, no wake"]
    entries = box.inbox("a").entries("next_turn")
    assert [(m.content, wakeup) for m, wakeup in entries] == [("during", True)]
    assert box.reader("a")() == ["during"]


def test_followups_stay_queued_until_a_run_actually_drains() -> None:
    box = AimuInbox()
    box.followup("answer me", agent="a")
    box.reader("a")  # a run that opened its reader and then died before any round boundary
    assert box.pending("a") == 1
    assert box.reader("a")() == ["answer me"]


def test_two_runs_of_one_agent_each_get_the_followups_sent_before_they_started() -> None:
    box = AimuInbox()
    first = box.reader("a")
    box.followup("for the second run", agent="a")
    second = box.reader("a")
    assert first() == []  # sent after the first run started: not its own
    assert second() == ["for the second run"]


def test_a_message_delivers_its_content_and_keeps_its_metadata() -> None:
    box = AimuInbox()
    box.steer(Message.user("check staging", metadata={"from": "leo"}), agent="a")
    queued = box.inbox("a").entries("next_step")[0][0]
    assert queued.metadata["from"] == "leo" and isinstance(queued.metadata[ORDER_KEY], int)
    assert box.reader("a")() == ["check staging"]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda b: b.steer(42), TypeError, "AimuInbox.steer: text must be a str or a user Message, got int"),
        (lambda b: b.inject(Message.assistant("hi")), ValueError, "got a 'assistant' message"),
        (lambda b: b.followup("x", agent=7), TypeError, "AimuInbox.followup: agent must be a str or None, got int"),
        (lambda b: b.steer("x", agent=""), ValueError, "agent '' is reserved"),
        (lambda b: b.steer("x", agent="*"), ValueError, "agent '*' is reserved"),
        (lambda b: b.reader(b"a"), TypeError, "AimuInbox.reader: agent must be a str or None, got bytes"),
        (lambda b: b.steer("\ud800"), ValueError, "lone surrogate"),
    ],
)
def test_bad_input_is_refused_naming_the_place_and_changes_nothing(
    call: Callable[[AimuInbox], object], error: type[Exception], words: str
) -> None:
    box = AimuInbox()
    box.steer("kept", agent="a")
    before = box.inbox("a")
    with pytest.raises(error, match=re.escape(words)):
        call(box)
    assert box.inbox("a") == before and box.pending() == 0


def test_pending_counts_what_a_run_of_that_agent_could_receive() -> None:
    box = AimuInbox()
    box.steer("own", agent="a")
    box.followup("own later", agent="a")
    box.inject("shared")
    box.steer("other", agent="b")
    assert (box.pending("a"), box.pending("b"), box.pending(None)) == (3, 2, 1)
    assert box.pending("a", Target.NEXT_TURN) == 1
    assert repr(box) == "AimuInbox(pending={'a': 2, None: 1, 'b': 1})"
    assert box.inbox("never written") == Inbox()


def test_hosts_on_other_threads_and_a_draining_run_lose_and_double_nothing() -> None:
    _hammer(senders=4, per_sender=150)


@pytest.mark.slow
def test_concurrent_hosts_and_runs_lose_and_double_nothing() -> None:
    _hammer(senders=8, per_sender=1000 * _STRESS)


def _hammer(senders: int, per_sender: int) -> None:
    """Threads send to agents "a", "b" and the shared address while a run of each agent drains."""
    box = AimuInbox()
    start = threading.Barrier(senders + 2)
    stop = threading.Event()
    received: dict[str, list[str]] = {"a": [], "b": []}

    def send(i: int) -> None:
        start.wait()
        for n in range(per_sender):
            agent = ("a", "b", None)[n % 3]
            (box.steer, box.inject, box.followup)[n % 3 if agent else 0](f"{i}:{n}", agent)

    def run(agent: str) -> None:
        drain = box.reader(agent)
        start.wait()
        while not stop.is_set():
            received[agent].extend(drain())
        received[agent].extend(drain())

    runs = [threading.Thread(target=run, args=(name,)) for name in received]
    hosts = [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for t in runs + hosts:
        t.start()
    for t in hosts:
        t.join()
    stop.set()
    for t in runs:
        t.join()
    # Followups to "b" wait for b's next run.
    received["b"].extend(box.reader("b")())
    delivered = received["a"] + received["b"]
    assert sorted(delivered) == sorted(f"{i}:{n}" for i in range(senders) for n in range(per_sender))
    for agent, texts in received.items():
        for i in range(senders):
            mine = [int(t.split(":")[1]) for t in texts if t.startswith(f"{i}:")]
            assert mine == sorted(mine), f"run {agent} got sender {i}'s messages out of order"
    assert box.pending("a") == box.pending("b") == 0


# -- with a store ---------------------------------------------------------------------------------


def test_every_send_and_claim_is_logged_on_the_addressed_stream() -> None:
    store = FakeStore()
    box = AimuInbox(store)
    box.steer("go", agent="a")
    box.inject("fyi")
    box.followup("later", agent="a")
    assert box.reader("b")() == ["fyi"]
    assert store.streams() == [stream_name(None), stream_name("a")] == ["aimu:*", "aimu:a"]
    assert kinds(store, "aimu:a") == [("sent", "next_step", True), ("sent", "next_turn", True)]
    assert kinds(store, "aimu:*") == [("sent", "next_step", False), ("claimed", "next_step", 1)]
    assert box.reader("a")() == ["later", "go"]
    assert kinds(store, "aimu:a")[2:] == [("claimed", "next_turn", 1), ("claimed", "next_step", 1)]
    assert box.reader("a")() == [] and len(store.logs["aimu:a"]) == 4  # an empty claim logs nothing


def test_the_log_replays_to_the_live_value() -> None:
    store = FakeStore()
    box = AimuInbox(store)
    box.followup("f1", agent="a")
    drain = box.reader("a")
    box.followup("f2, after the start", agent="a")  # left queued by the first drain's claim
    box.steer("s1", agent="a")
    box.inject("shared")
    assert drain() == ["f1", "s1", "shared"]
    box.inject("left over", agent="a")
    for name in ("a", None):
        stream = stream_name(name)
        session = replay(store.read(stream), stream=stream)
        assert session.inbox == box.inbox(name)
        contents = [m.content for m in session.transcript]
        assert len(contents) == len(set(contents))  # each message entered the transcript once
    claims = [e for e in store.read("aimu:a") if isinstance(e, QueueClaimed)]
    assert [(e.target, e.count, e.rest) for e in claims] == [("next_turn", 1, 1), ("next_step", 1, 0)]
    assert kinds(store, "aimu:a")[3:] == [
        ("claimed", "next_turn", 1),
        ("claimed", "next_step", 1),
        ("sent", "next_step", False),
    ]


def test_a_restarted_inbox_still_holds_everything_queued() -> None:
    store = FakeStore()
    first = AimuInbox(store)
    first.steer("claimed before the restart", agent="a")
    assert first.reader("a")() == ["claimed before the restart"]
    first.followup("answer later", agent="a")
    first.inject("shared context")
    first.steer("redirect", agent="a")
    store.logs["other:stream"] = []  # not ours: ignored

    second = AimuInbox(store)
    assert second.inbox("a") == first.inbox("a") and second.inbox(None) == first.inbox(None)
    assert second.wants_wake("a")
    second.steer("after the restart", agent="a")  # sorts after everything replayed
    assert second.reader("a")() == ["answer later", "shared context", "redirect", "after the restart"]
    assert AimuInbox(store).pending("a") == 0


def test_a_message_appended_by_another_process_reaches_the_run_at_its_next_drain() -> None:
    store = FakeStore()
    running = AimuInbox(store)
    drain = running.reader("a")
    other = AimuInbox(store)  # e.g. a command-line tool run from another terminal
    other.steer("from elsewhere", agent="a")
    assert drain() == ["from elsewhere"]
    assert other.reader("a")() == []


def test_a_send_that_races_another_writer_catches_up_and_retries() -> None:
    store = FakeStore()
    here, there = AimuInbox(store), AimuInbox(store)
    there.steer("theirs", agent="a")
    here.steer("mine", agent="a")  # expected version 0 is stale: read theirs, then append
    assert [e.seq for e in store.logs["aimu:a"]] == [1, 2]
    assert here.reader("a")() == ["theirs", "mine"]


def test_a_failing_store_refuses_the_send_and_changes_nothing() -> None:
    store = FakeStore()
    box = AimuInbox(store)
    box.steer("kept", agent="a")
    store.fail = True
    with pytest.raises(OSError, match="disk full"):
        box.steer("lost?", agent="a")
    with pytest.raises(OSError, match="disk full"):
        box.reader("a")()
    assert [m.content for m, _ in box.inbox("a").entries("next_step")] == ["kept"]
    store.fail = False
    assert box.reader("a")() == ["kept"]


def test_a_locked_store_is_reported_not_retried() -> None:
    class LockedStore(FakeStore):
        def append(
            self, stream: str, events: Sequence[Event], expected_version: int | None = None
        ) -> list[Event]:
            raise ConcurrencyError("store locked by another writer for 5 s; nothing was written")

    box = AimuInbox(LockedStore())
    with pytest.raises(ConcurrencyError, match="store locked"):
        box.steer("x", agent="a")
    assert box.pending("a") == 0


@pytest.mark.parametrize("scheme", ["sqlite", "file"])
def test_a_real_store_keeps_messages_across_a_restart_and_between_processes(
    scheme: str, tmp_path: Any
) -> None:
    open_store = pytest.importorskip("nous_inbox.store").open_store
    url = f"{scheme}:{tmp_path / 'inbox.log'}"
    with open_store(url) as store:
        box = AimuInbox(store)
        box.followup("answer later", agent="a")
        box.steer("redirect", agent="a")
        box.inject("shared")
        assert box.reader("b")() == ["shared"]
        queued = box.inbox("a")
    with open_store(url) as store, open_store(url) as elsewhere:
        reopened = AimuInbox(store)
        assert reopened.inbox("a") == queued and reopened.pending(None) == 0
        drain = reopened.reader("a")
        AimuInbox(elsewhere).steer("from another writer", agent="a")
        assert drain() == ["answer later", "redirect", "from another writer"]
        assert AimuInbox(elsewhere).pending("a") == 0


# -- several processes on one store --------------------------------------------------------------
# Two AimuInbox instances, each with its own connection to one SQLite file, stand for two
# processes: they share nothing but the store. "there" is opened first, so whatever "here" does
# later is news to it, as it would be to a long-lived process elsewhere.


@pytest.fixture
def two_processes(tmp_path: Any) -> Iterator[tuple[AimuInbox, AimuInbox, str]]:
    url = f"sqlite:{tmp_path / 'inbox.db'}"
    with open_store(url) as here, open_store(url) as there:
        yield AimuInbox(here), AimuInbox(there), url


def assert_each_replays_its_log(url: str, *boxes: AimuInbox) -> None:
    with open_store(url) as store:
        for name in ("a", "b", None):
            stream = stream_name(name)
            replayed = replay(store.read(stream), stream=stream).inbox
            assert all(box.inbox(name) == replayed for box in boxes), stream


def test_a_followup_sent_from_another_process_before_a_run_opens_is_that_runs(
    two_processes: tuple[AimuInbox, AimuInbox, str],
) -> None:
    here, there, url = two_processes
    for n in range(3):  # the other process has sent more: its send positions ran ahead of ours
        there.steer(f"for b {n}", agent="b")
    there.followup("answer this next", agent="a")
    there.followup("or this, anyone")
    drain = here.reader("a")
    here.steer("now", agent="a")
    assert drain() == ["answer this next", "or this, anyone", "now"]
    assert there.pending("a") == 0 and not there.wants_wake("a")
    assert_each_replays_its_log(url, here, there)


def test_a_followup_sent_from_another_process_after_a_run_opens_waits_for_the_next_run(
    two_processes: tuple[AimuInbox, AimuInbox, str],
) -> None:
    here, there, url = two_processes
    for n in range(3):  # this process's send positions ran ahead of the other's
        here.inject(f"warm-up {n}", agent="a")
    here.followup("owed to the run", agent="a")
    drain = here.reader("a")
    there.followup("after you finish", agent="a")
    there.followup("after you finish, anyone")
    assert drain() == ["owed to the run", "warm-up 0", "warm-up 1", "warm-up 2"]
    assert drain() == []
    assert [m.content for m, _ in here.inbox("a").entries("next_turn")] == ["after you finish"]
    assert here.wants_wake("a") and there.wants_wake("a")
    assert here.reader("a")() == ["after you finish", "after you finish, anyone"]
    assert_each_replays_its_log(url, here, there)


def test_a_first_drain_with_nothing_late_claims_the_queue_as_it_is() -> None:
    store = FakeStore()
    here, there = AimuInbox(store), AimuInbox(store)
    there.followup("one", agent="a")
    there.followup("two", agent="a")
    drain = here.reader("a")
    there.steer("step", agent="a")  # moves the stream, not the turn queue
    assert drain() == ["one", "two", "step"]
    assert kinds(store, "aimu:a")[3:] == [("claimed", "next_turn", 2), ("claimed", "next_step", 1)]


def test_equal_followups_from_a_writer_that_stamps_nothing_are_told_apart_by_count() -> None:
    store = FakeStore()
    box = AimuInbox(store)

    def foreign_followup() -> None:  # another kind of writer: no send position in the message
        sent = MessageSent(target=Target.NEXT_TURN, wakeup=True, message=Message.user("ok"))
        store.append("aimu:a", [sent], expected_version=store.version("aimu:a"))

    foreign_followup()
    drain = box.reader("a")
    foreign_followup()  # equal to the first one, but sent after the run opened
    assert drain() == ["ok"]
    assert box.pending("a", "next_turn") == 1
    assert box.reader("a")() == ["ok"]


def test_runs_in_two_processes_each_get_only_followups_queued_when_they_opened(
    two_processes: tuple[AimuInbox, AimuInbox, str],
) -> None:
    here, there, url = two_processes
    here.followup("f1", agent="a")
    first = here.reader("a")
    second = there.reader("a")  # also owed f1: whichever run drains first takes it
    there.followup("f2", agent="a")  # after both opened: neither run's
    assert second() == ["f1"]
    assert first() == []
    assert there.reader("a")() == ["f2"]
    assert_each_replays_its_log(url, here, there)


def test_messages_from_two_processes_merge_in_the_order_they_were_sent(
    two_processes: tuple[AimuInbox, AimuInbox, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aimu_module, "time", _TickingClock(start=10**18))
    here, there, _ = two_processes
    for n in range(5):
        here.inject(f"for b {n}", agent="b")  # "there" never reads b's stream
    drain = here.reader("a")
    here.steer("1: own, from here", agent="a")
    there.inject("2: shared, from there")
    here.inject("3: shared, from here")
    there.steer("4: own, from there", agent="a")
    assert drain() == ["1: own, from here", "2: shared, from there", "3: shared, from here",
                       "4: own, from there"]


def test_send_positions_keep_increasing_when_the_clock_goes_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _TickingClock(start=10**18, step=-10**9)
    monkeypatch.setattr(aimu_module, "time", clock)
    box = AimuInbox()
    drain = box.reader("a")
    for n in range(6):
        box.steer(str(n), agent=("a", None)[n % 2])
    assert drain() == [str(n) for n in range(6)]


def test_a_real_second_process_sends_before_and_after_a_run_opens(tmp_path: Any) -> None:
    url = f"sqlite:{tmp_path / 'inbox.db'}"

    def send_from_another_process(text: str) -> None:
        script = (
            "import sys\n"
            "from nous_inbox.adapters.aimu import AimuInbox\n"
            "from nous_inbox.store import open_store\n"
            "with open_store(sys.argv[1]) as store:\n"
            "    AimuInbox(store).followup(sys.argv[2], agent='a')\n"
        )
        subprocess.run([sys.executable, "-c", script, url, text], check=True, timeout=60)

    with open_store(url) as store:
        here = AimuInbox(store)
        here.steer("sent here first", agent="b")
        send_from_another_process("before the run")
        drain = here.reader("a")
        send_from_another_process("after the run opened")
        assert drain() == ["before the run"]
        assert here.wants_wake("a")
        assert here.reader("a")() == ["after the run opened"]
        assert_each_replays_its_log(url, here)


def test_the_hosts_questions_count_what_other_processes_sent_and_claimed(
    two_processes: tuple[AimuInbox, AimuInbox, str],
) -> None:
    here, there, _ = two_processes
    there.followup("later", agent="a")
    there.inject("fyi")
    assert here.wants_wake("a") and here.pending("a") == 2 and here.inbox(None).count() == 1
    assert there.reader("a")() == ["later", "fyi"]
    assert not here.wants_wake("a") and here.pending("a") == 0 and here.inbox(None) == Inbox()


def test_a_run_opens_its_reader_even_when_the_store_cannot_be_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unreachable(FakeStore):
        down = False

        def version(self, stream: str) -> int:
            if self.down:
                raise OSError("store unreachable")
            return super().version(stream)

    store = Unreachable()
    box = AimuInbox(store)
    box.followup("queued here", agent="a")
    store.down = True
    with caplog.at_level(logging.WARNING):
        drain = box.reader("a")
    assert "could not read the store as a run opened" in caplog.text
    with pytest.raises(OSError, match="store unreachable"):  # a host's question is not guessed
        box.pending("a")
    store.down = False
    assert drain() == ["queued here"]


class _TickingClock:
    """Stands in for the ``time`` module inside the adapter: ``time_ns`` moves by ``step``."""

    def __init__(self, start: int, step: int = 1000) -> None:
        self._next = start
        self._step = step
        self.time = time.time

    def time_ns(self) -> int:
        now = self._next
        self._next += self._step
        return now


# One host's view of a shared store, as a sequence of operations on two "processes" (instances
# on one FakeStore). The model is the truth: which messages are queued, and when each run opened.
# Followups are weighted up: the interesting cases are followups racing runs that open and drain.
_SEND = st.tuples(
    st.just("send"), st.integers(0, 1), st.sampled_from(["followup", "followup", "steer", "inject"]),
    st.sampled_from(["a", "b", None]),
)
_OPEN = st.tuples(st.just("open"), st.integers(0, 1), st.sampled_from(["a", "b"]))
_DRAIN = st.tuples(st.just("drain"), st.integers(0, 7))


@settings(max_examples=100 * _STRESS, deadline=None)
@given(st.lists(st.one_of(_SEND, _OPEN, _SEND, _DRAIN), min_size=8, max_size=40))
def test_runs_in_several_processes_get_exactly_what_they_are_owed(ops: list[tuple[Any, ...]]) -> None:
    store = FakeStore()
    with mock.patch.object(aimu_module, "time", _TickingClock(start=10**18)):
        boxes = [AimuInbox(store), AimuInbox(store)]
        # Truth: queued messages (text -> (agent, target)), and each open run's state.
        queued: dict[str, tuple[str | None, str]] = {}
        runs: list[tuple[str, Callable[[], list[str]], set[str], list[bool]]] = []
        delivered: list[str] = []
        for n, op in enumerate(ops):
            if op[0] == "send":
                _, proc, verb, agent = op
                text = f"{n}"
                getattr(boxes[proc], verb)(text, agent=agent)
                queued[text] = (agent, "next_turn" if verb == "followup" else "next_step")
            elif op[0] == "open":
                _, proc, agent = op
                owed = {t for t, (to, target) in queued.items()
                        if target == "next_turn" and to in (agent, None)}
                runs.append((agent, boxes[proc].reader(agent), owed, [True]))
            elif runs:
                agent, drain, owed, first = runs[op[1] % len(runs)]
                mine = sorted((t for t, (to, _) in queued.items() if to in (agent, None)), key=int)
                turn = [t for t in mine if t in owed and queued[t][1] == "next_turn"] if first[0] else []
                step = [t for t in mine if queued[t][1] == "next_step"]
                assert drain() == turn + step
                first[0] = False
                for t in turn + step:
                    del queued[t]
                delivered += turn + step
        for box in boxes:  # whatever is left goes to the next runs, after the host is told
            for agent in ("a", "b"):
                assert box.wants_wake(agent) == any(
                    to in (agent, None) and ops[int(t)][2] != "inject" for t, (to, _) in queued.items()
                )
        for agent in ("a", "b"):
            delivered += boxes[1].reader(agent)()
        assert sorted(delivered, key=int) == [f"{n}" for n, op in enumerate(ops) if op[0] == "send"]
        for name in ("a", "b", None):
            stream = stream_name(name)
            replayed = replay(store.read(stream), stream=stream).inbox
            assert boxes[0].inbox(name) == boxes[1].inbox(name) == replayed


# == inside real aimu agents =========================================================================

@pytest.fixture
def kit() -> SimpleNamespace:
    return aimu_kit()


def make_tool(kit: SimpleNamespace, during: Callable[[], object] = lambda: None) -> Any:
    @kit.tool
    def read_log(path: str) -> str:
        """Read a log file.

        Args:
            path: which log
        """
        during()
        return f"3 errors in {path}"

    return read_log


def test_the_adapter_is_an_aimu_inbox_and_passes_the_run_start_check(kit: SimpleNamespace) -> None:
    class ZeroArgReader:
        def reader(self) -> Callable[[], list[str]]:
            return list

    opened: list[str | None] = []

    class Spy(AimuInbox):
        def reader(self, agent: str | None = None) -> Callable[[], list[str]]:
            opened.append(agent)
            return super().reader(agent)

    assert isinstance(AimuInbox(), kit.Protocol)
    with pytest.raises(TypeError, match="cannot be called the way an agent's loop calls it"):
        kit.Agent(kit.Client(["hi"]), name="a", inbox=ZeroArgReader()).run("task")
    assert kit.Agent(kit.Client(["hi"]), name="a", inbox=Spy()).run("task") == "hi"
    assert opened == ["a"]  # once per run, with the run's name, positionally


def test_a_steer_sent_during_a_tool_lands_right_after_its_result(kit: SimpleNamespace) -> None:
    host = AimuInbox()
    tool = make_tool(kit, lambda: host.steer("check the staging log instead", agent="worker"))
    client = kit.Client([call("read_log", path="prod.log"), "staging looks fine"])
    agent = kit.Agent(client, name="worker", tools=[tool], inbox=host)
    assert agent.run("summarize the logs") == "staging looks fine"
    assert said(client.requests[1]) == [
        ("user", "summarize the logs"),
        ("assistant", ""),
        ("tool", "3 errors in prod.log"),
        ("user", "check the staging log instead"),
    ]
    delivered = client.requests[1][-1]
    assert "provenance" not in delivered  # the user's words, not the loop's
    assert host.pending("worker") == 0


def test_a_steer_from_another_thread_reaches_the_run_at_its_next_boundary(kit: SimpleNamespace) -> None:
    host = AimuInbox()
    tool_running, steered = threading.Event(), threading.Event()

    def person() -> None:
        tool_running.wait(10)
        host.steer("stop, wrong file", agent="worker")
        steered.set()

    def slow_tool_body() -> None:
        tool_running.set()
        assert steered.wait(10)

    tool = make_tool(kit, slow_tool_body)
    client = kit.Client([call("read_log", path="prod.log"), "ok, stopping"])
    other = threading.Thread(target=person)
    other.start()
    kit.Agent(client, name="worker", tools=[tool], inbox=host).run("find the bug")
    other.join()
    assert said(client.requests[1])[-1] == ("user", "stop, wrong file")


def test_a_message_pending_at_the_final_answer_extends_the_run_by_one_round(kit: SimpleNamespace) -> None:
    host = AimuInbox()

    def composing() -> str:
        host.steer("also mention the warnings", agent="worker")
        return "3 errors"

    client = kit.Client([composing, "3 errors and 2 warnings"])
    agent = kit.Agent(client, name="worker", inbox=host)
    assert agent.run("count the problems") == "3 errors and 2 warnings"
    assert said(client.requests[1])[-2:] == [("assistant", "3 errors"), ("user", "also mention the warnings")]

    quiet = kit.Client(["done", "never asked"])
    assert kit.Agent(quiet, name="worker", inbox=host).run("again") == "done"
    assert len(quiet.requests) == 1  # nothing pending: the run ends exactly as without an inbox


def test_a_message_after_the_runs_last_drain_waits_and_the_host_is_told(
    kit: SimpleNamespace,
) -> None:
    host = AimuInbox()

    def composing() -> str:
        host.steer("one more thing", agent="worker")
        return "answer"

    # With a budget of one round, aimu ends on the answer without draining again.
    client = kit.Client([composing, "first", "second, with the thing"])
    agent = kit.Agent(client, name="worker", inbox=host, max_iterations=1)
    assert agent.run("task") == "answer"
    assert len(client.requests) == 1
    assert host.wants_wake("worker")  # kept, and a run is owed
    agent.max_iterations = 10
    assert agent.run("next") == "second, with the thing"
    assert said(client.requests[2])[-1] == ("user", "one more thing")


def test_an_inject_also_extends_the_run_since_aimu_cannot_tell_the_boundary(kit: SimpleNamespace) -> None:
    host = AimuInbox()

    def composing() -> str:
        host.inject("fyi: deploys are frozen", agent="worker")
        return "ship it"

    client = kit.Client([composing, "hold the deploy"])
    assert kit.Agent(client, name="worker", inbox=host).run("decide") == "hold the deploy"


@pytest.mark.parametrize("blank", ["   \n", "\u200b", " \ufeff\u2060 "])
def test_blank_content_is_not_worth_a_round(kit: SimpleNamespace, blank: str) -> None:
    # aimu strips whitespace itself, but not invisible characters: the drain must not hand it a
    # message that is blank by the library's one rule (ruling 4), or aimu extends the run for it.
    host = AimuInbox()

    def composing() -> str:
        host.steer(blank, agent="worker")
        return "done"

    client = kit.Client([composing, "never asked"])
    assert kit.Agent(client, name="worker", inbox=host).run("task") == "done"
    assert len(client.requests) == 1


@pytest.mark.parametrize("blank", ["   \n", "\u200b"])
def test_blank_content_does_not_replace_the_nudge(kit: SimpleNamespace, blank: str) -> None:
    host = AimuInbox()

    def empty_reply() -> str:
        host.steer(blank, agent="worker")
        return ""

    client = kit.Client([empty_reply, "resumed"])
    kit.Agent(client, name="worker", inbox=host).run("find it")
    assert [m.get("provenance") for m in client.messages if m["role"] == "user"] == [
        None, "continuation"]


def test_a_blank_message_rides_along_with_the_next_message_worth_a_round() -> None:
    box = AimuInbox()
    drain = box.reader("a")
    box.steer("\u200b", agent="a")
    assert drain() == [] and box.pending("a") == 1  # kept: nothing is lost
    box.steer("now look at the tests")
    assert drain() == ["\u200b", "now look at the tests"] and box.pending("a") == 0


def test_a_pending_message_replaces_the_continuation_nudge(kit: SimpleNamespace) -> None:
    host = AimuInbox()

    def empty_reply() -> str:
        host.steer("are you stuck? try the staging log", agent="worker")
        return ""

    client = kit.Client([empty_reply, "found it in staging"])
    assert kit.Agent(client, name="worker", inbox=host).run("find it") == "found it in staging"
    assert said(client.requests[1])[-1] == ("user", "are you stuck? try the staging log")
    assert [m.get("provenance") for m in client.messages if m["role"] == "user"] == [None, None]

    plain = kit.Client(["", "resumed"])
    kit.Agent(plain, name="worker", inbox=host).run("find it")
    # Without a message the loop nudges, and tags its own words as its own.
    assert [m.get("provenance") for m in plain.messages if m["role"] == "user"] == [None, "continuation"]


def test_messages_claimed_at_one_boundary_arrive_together_in_send_order(kit: SimpleNamespace) -> None:
    host = AimuInbox()

    def three_people() -> None:
        host.inject("1: shared context")
        host.steer("2: for the worker", agent="worker")
        host.steer("3: for someone else", agent="reviewer")
        host.inject("4: more for the worker", agent="worker")

    tool = make_tool(kit, three_people)
    client = kit.Client([call("read_log", path="a.log"), "done"])
    kit.Agent(client, name="worker", tools=[tool], inbox=host).run("task")
    assert said(client.requests[1])[-1] == (
        "user",
        "1: shared context\n\n2: for the worker\n\n4: more for the worker",
    )
    assert host.pending("reviewer") == 1


def test_routing_follows_the_agent_name(kit: SimpleNamespace) -> None:
    host = AimuInbox()
    tool = make_tool(kit, lambda: host.steer("reviewer: check the tests", agent="reviewer"))
    worker = kit.Client([call("read_log", path="a.log"), "worker done"])
    kit.Agent(worker, name="worker", tools=[tool], inbox=host).run("work")
    assert all("reviewer: check the tests" not in text for _, text in said(worker.requests[-1]))

    reviewer = kit.Client(["looks good", "tests checked too"])
    assert kit.Agent(reviewer, name="reviewer", inbox=host).run("review") == "tests checked too"
    assert said(reviewer.requests[1])[-1] == ("user", "reviewer: check the tests")


def test_a_followup_waits_for_the_next_run(kit: SimpleNamespace) -> None:
    host = AimuInbox()
    tool = make_tool(kit, lambda: host.followup("then write it up", agent="worker"))
    client = kit.Client([call("read_log", path="a.log"), "3 errors", "next task done", "written up"])
    agent = kit.Agent(client, name="worker", tools=[tool], inbox=host)
    assert agent.run("count errors") == "3 errors"
    assert len(client.requests) == 2
    assert all("then write it up" not in text for _, text in said(client.requests[1]))
    assert host.wants_wake("worker")  # the host owes the agent a run

    assert agent.run("next task") == "written up"
    # aimu drains first after the run's first reply, so the followup arrives at that boundary.
    assert said(client.requests[2])[-1] == ("user", "next task")
    assert said(client.requests[3])[-1] == ("user", "then write it up")
    assert not host.wants_wake("worker")


def test_a_followup_survives_a_run_that_fails_before_its_first_boundary(kit: SimpleNamespace) -> None:
    host = AimuInbox()
    host.followup("answer this next", agent="worker")
    client = kit.Client([ConnectionError("model unreachable"), "ok", "answered"])
    agent = kit.Agent(client, name="worker", inbox=host)
    with pytest.raises(ConnectionError):
        agent.run("task")
    assert host.pending("worker") == 1
    assert agent.run("task, retried") == "answered"
    assert said(client.requests[2])[-1] == ("user", "answer this next")


def test_the_round_budget_counts_from_the_last_delivered_message(
    kit: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    reads: list[Reply] = [call("read_log", path=f"{n}.log") for n in range(3)]

    # Unmessaged, max_iterations=2 allows two rounds, then a forced, tool-less wrap-up.
    alone = kit.Client([*reads[:2], "wrapped up early"])
    assert kit.Agent(alone, name="w", tools=[make_tool(kit)], max_iterations=2).run("t") == (
        "wrapped up early"
    )
    assert [m.get("provenance") for m in alone.messages if m["role"] == "user"] == [None, "final_answer"]

    # Each delivered message starts the count again: three tool rounds and a real answer.
    host = AimuInbox()
    people = iter(["look closer", "one more file"])

    def person_in_the_first_two_rounds() -> None:
        for text in itertools.islice(people, 1):
            host.steer(text, agent="w")

    tool = make_tool(kit, person_in_the_first_two_rounds)
    messaged = kit.Client([*reads, "all three read"])
    agent = kit.Agent(messaged, name="w", tools=[tool], inbox=host, max_iterations=2)
    with caplog.at_level(logging.WARNING):
        assert agent.run("read them all") == "all three read"
    assert len(messaged.requests) == 4
    assert "refusing further extensions" not in caplog.text  # each drain hands out only new messages


def test_a_streamed_run_announces_the_delivered_message(kit: SimpleNamespace) -> None:
    host = AimuInbox()
    tool = make_tool(kit, lambda: host.steer("use the staging log", agent="worker"))
    client = kit.Client([call("read_log", path="prod.log"), "staging it is"])
    agent = kit.Agent(client, name="worker", tools=[tool], inbox=host)
    chunks = list(agent.run("task", stream=True))
    assert [c.content for c in chunks if c.is_inbox()] == [{"text": "use the staging log"}]


def test_a_structured_output_run_opens_no_reader_and_claims_nothing(kit: SimpleNamespace) -> None:
    import dataclasses

    @dataclasses.dataclass
    class Verdict:
        ok: bool

    host = AimuInbox()
    host.steer("are you sure?", agent="critic")
    client = kit.Client(['{"ok": true}'])
    assert kit.Agent(client, name="critic", inbox=host).run("judge", schema=Verdict) == Verdict(True)
    assert host.pending("critic") == 1


def test_a_drain_whose_store_fails_is_logged_and_the_run_goes_on(
    kit: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    store = FakeStore()
    host = AimuInbox(store)

    def steer_then_lose_the_disk() -> None:
        host.steer("do not lose me", agent="worker")
        store.fail = True

    tool = make_tool(kit, steer_then_lose_the_disk)
    client = kit.Client([call("read_log", path="a.log"), "done anyway"])
    with caplog.at_level(logging.WARNING):
        assert kit.Agent(client, name="worker", tools=[tool], inbox=host).run("t") == "done anyway"
    assert "Inbox misbehaved" in caplog.text
    assert host.pending("worker") == 1  # still queued, and in the log
    store.fail = False
    assert AimuInbox(store).reader("worker")() == ["do not lose me"]


def test_a_durable_inbox_delivers_into_a_run_after_a_restart(kit: SimpleNamespace) -> None:
    store = FakeStore()
    AimuInbox(store).steer("sent before the host restarted", agent="worker")
    client = kit.Client(["first answer", "answer with the message"])
    after_restart = AimuInbox(store)
    agent = kit.Agent(client, name="worker", inbox=after_restart)
    assert agent.run("task") == "answer with the message"
    assert said(client.requests[1])[-1] == ("user", "sent before the host restarted")
    assert AimuInbox(store).pending("worker") == 0


def test_an_async_agent_reads_the_same_inbox(kit: SimpleNamespace) -> None:
    host = AimuInbox()
    tool = make_tool(kit, lambda: host.steer("redirected", agent="worker"))
    client = kit.AsyncClient([call("read_log", path="a.log"), "done"])
    agent = kit.AsyncAgent(client, name="worker", tools=[tool], inbox=host)
    assert asyncio.run(agent.run("task")) == "done"
    assert said(client.requests[1])[-1] == ("user", "redirected")


@pytest.mark.parametrize("store", ["sqlite:inbox.db", object(), 42])
def test_something_that_is_not_a_store_is_refused_at_once_naming_what_it_lacks(store: object) -> None:
    with pytest.raises(TypeError, match=r"AimuInbox: store must be a nous_inbox store .* has no append"):
        AimuInbox(store)  # type: ignore[arg-type]
