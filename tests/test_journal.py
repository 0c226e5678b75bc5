"""The journal: a session kept in step with its stream, recomputing a change that lost a race."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from nous_inbox import (
    ConcurrencyError,
    Message,
    MessageSent,
    QueueClaimed,
    ReplayError,
    Session,
    replay,
)
from nous_inbox.events import Event
from nous_inbox.store import StoreLockedError, open_store
from nous_inbox.store.journal import ATTEMPTS, Journal, sent_event
from nous_inbox.verbs import Target


def sent(text: str, wakeup: bool = True) -> MessageSent:
    return MessageSent(target="next_step", wakeup=wakeup, message=Message.user(text))


def claim_all(session: Session) -> tuple[list[Any], int]:
    claimed, _ = session.inbox.claim("next_step")
    return ([QueueClaimed(target="next_step", count=len(claimed))] if claimed else []), len(claimed)


def test_it_starts_from_the_replayed_stream_and_folds_what_it_commits() -> None:
    store = open_store("memory:")
    store.append("s", [sent("a"), sent("b", False)])
    journal = Journal(store, "s")
    assert journal.session == replay(store.read("s"))
    stored, taken = journal.commit(claim_all)
    assert taken == 2 and [e.seq for e in stored] == [3]
    assert journal.session == replay(store.read("s"))


def test_a_change_computed_from_stale_state_is_computed_again_after_catching_up() -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")
    journal.commit(lambda s: ([sent("mine")], None))
    store.append("s", [sent("theirs")])  # another writer, unseen by the journal
    _, taken = journal.commit(claim_all)
    assert taken == 2  # the claim counted the other writer's message too, so replay agrees
    assert journal.session == replay(store.read("s"))


def test_a_change_with_no_events_writes_nothing_and_returns_its_result() -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")
    assert journal.commit(lambda s: ([], "nothing to do")) == ([], "nothing to do")
    assert store.version("s") == 0


def test_other_writers_events_reach_on_events_in_log_order() -> None:
    store = open_store("memory:")
    seen: list[int] = []
    journal = Journal(store, "s", on_events=lambda events: seen.extend(e.seq for e in events))
    journal.commit(lambda s: ([sent("a")], None))
    store.append("s", [sent("b"), sent("c")])
    assert [e.seq for e in journal.catch_up()] == [2, 3]
    assert journal.catch_up() == []  # nothing new: nothing read
    assert seen == [1, 2, 3]


class _Refusing:
    """A store whose appends are refused: with news (a racing writer) or without (a lock)."""

    def __init__(self, news: bool) -> None:
        self.inner = open_store("memory:")
        self.news = news
        self.appends = 0

    def append(self, stream: str, events: Sequence[Any], expected_version: Any = None) -> Any:
        self.appends += 1
        if self.news:
            self.inner.append(stream, [sent(f"race {self.appends}")])
            raise ConcurrencyError("another writer appended first")
        raise StoreLockedError("the log's lock was still held after 10 s")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_WRITES = {  # every way a journal writes, each held to the same retry rules
    "commit": lambda journal: journal.commit(lambda s: ([sent("x")], None)),
    "append": lambda journal: journal.append([sent("x")]),
    "send": lambda journal: journal.send("x", "next_step", True),
    "claim": lambda journal: journal.claim("next_step"),
}


@pytest.mark.parametrize("write", _WRITES)
def test_a_write_that_lost_a_race_is_made_again_after_the_other_writers_events(write: str) -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")
    journal.append([sent("mine")])
    store.append("s", [sent("theirs")])  # another writer, unseen by the journal
    _WRITES[write](journal)
    assert store.version("s") == 3 and journal.writes == 2
    assert journal.session == replay(store.read("s"))


@pytest.mark.parametrize("write", _WRITES)
def test_a_refusal_with_nothing_new_to_read_is_raised_at_once(write: str) -> None:
    store = _Refusing(news=False)
    store.inner.append("s", [sent("queued")])
    journal = Journal(store, "s")  # type: ignore[arg-type]
    with pytest.raises(StoreLockedError):
        _WRITES[write](journal)
    assert store.appends == 1 and journal.session.version == 1


@pytest.mark.parametrize("write", _WRITES)
def test_a_stream_that_never_stands_still_is_given_up_on_with_a_clear_error(write: str) -> None:
    store = _Refusing(news=True)
    store.inner.append("s", [sent("queued")])
    journal = Journal(store, "s")  # type: ignore[arg-type]
    with pytest.raises(ConcurrencyError, match=f"gave up after {ATTEMPTS} attempts"):
        _WRITES[write](journal)
    assert store.appends == ATTEMPTS
    assert journal.session == replay(store.inner.read("s"))  # it kept up with what it read


class _Busy:
    """A store another writer appends to (a followup on ``next_turn``) just before every poll of
    its version: a stream that never stands still, though nothing touches ``next_step``."""

    def __init__(self) -> None:
        self.inner = open_store("memory:")
        self.polls = 0

    def version(self, stream: str) -> int:
        self.polls += 1
        self.inner.append(stream, [MessageSent(target="next_turn", wakeup=True,
                                               message=Message.user(f"later {self.polls}"))])
        return self.inner.version(stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_NOTHING = {  # writes that find nothing to write
    "claim": lambda journal: journal.claim("next_step"),
    "commit": lambda journal: journal.commit(lambda s: ([], None)),
}


@pytest.mark.parametrize("write", _NOTHING)
def test_a_write_of_nothing_reads_other_writers_once_then_answers_nothing(write: str) -> None:
    # Nothing to write cannot lose a race: it reads what others wrote once (a steer sent from
    # elsewhere would join a claim) and answers nothing, however busy the stream.
    store = _Busy()
    journal = Journal(store, "s")  # type: ignore[arg-type]
    assert _NOTHING[write](journal) == ([], None)
    assert store.polls == 1 and journal.session.version == 1 and journal.writes == 0
    assert journal.session == replay(store.inner.read("s"))


def test_without_a_store_changes_are_numbered_and_folded_but_kept_nowhere() -> None:
    journal = Journal(None, "local")
    stored, _ = journal.commit(lambda s: ([sent("a"), sent("b")], None))
    assert [e.seq for e in stored] == [1, 2]
    assert journal.catch_up() == []
    assert journal.session.inbox.count() == 2


def test_a_journal_without_a_transcript_keeps_only_the_queues() -> None:
    store = open_store("memory:")
    store.append("s", [sent("a"), QueueClaimed(target="next_step", count=1), sent("b")])
    journal = Journal(store, "s", transcript=False)
    assert list(journal.session.transcript) == [] and journal.session.inbox.count() == 1
    journal.commit(claim_all)
    assert list(journal.session.transcript) == []
    assert journal.session.inbox == replay(store.read("s")).inbox


def test_an_event_that_does_not_fold_is_refused_before_anything_is_written() -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")
    with pytest.raises(ReplayError):
        journal.commit(lambda s: ([QueueClaimed(target="next_step", count=3)], None))
    assert store.version("s") == 0 and journal.session.version == 0


def test_every_claim_goes_through_one_path_and_records_what_stayed_behind() -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")
    for text in ("a", "b", "c"):
        journal.commit(lambda s, t=text: ([MessageSent(target="next_turn", wakeup=True,
                                                       message=Message.user(t))], None))
    messages, event = journal.claim("next_turn", limit=2)
    assert [m.content for m in messages] == ["a", "b"]
    assert event is not None and (event.count, event.rest) == (2, 1)
    assert journal.claim("next_step") == ([], None)
    assert replay(store.read("s")) == journal.session


def test_a_wake_only_claim_takes_nothing_unless_a_waking_message_worth_a_round_is_queued() -> None:
    journal = Journal(open_store("memory:"), "s")
    journal.commit(lambda s: ([MessageSent(target="next_step", wakeup=False,
                                           message=Message.user("fyi"))], None))
    journal.commit(lambda s: ([MessageSent(target="next_step", wakeup=True,
                                           message=Message.user("  "))], None))
    assert journal.claim("next_step", wake_only=True) == ([], None)
    journal.commit(lambda s: ([MessageSent(target="next_step", wakeup=True,
                                           message=Message.user("stop"))], None))
    messages, _ = journal.claim("next_step", wake_only=True)
    assert [m.content for m in messages] == ["fyi", "  ", "stop"]


def test_a_claim_made_on_a_stale_session_takes_what_other_writers_sent_too() -> None:
    # The claim is computed on the session as it stands and appended at its version: another
    # writer's send since makes the store refuse it, and the claim is made again, theirs in it.
    store = open_store("memory:")
    journal = Journal(store, "s")
    journal.append([sent("mine")])
    store.append("s", [sent("theirs")])
    messages, event = journal.claim("next_step")
    assert [m.content for m in messages] == ["mine", "theirs"]
    assert event is not None and (event.count, event.seq) == (2, 3)
    assert journal.session == replay(store.read("s"))


def test_a_claim_with_nothing_queued_here_reads_other_writers_before_it_says_nothing() -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")
    store.append("s", [sent("theirs")])
    messages, event = journal.claim("next_step", wake_only=True)
    assert [m.content for m in messages] == ["theirs"] and event is not None
    assert journal.claim("next_step") == ([], None)
    assert journal.session == replay(store.read("s"))


def test_a_claim_that_takes_nothing_reads_no_clock_and_a_claim_is_timed_once() -> None:
    # A run claims at every step boundary and most find nothing: such a claim records nothing,
    # so it has nothing to time. A claim that takes something is timed when it is appended.
    times = iter([10.0, 20.0])
    journal = Journal(open_store("memory:"), "s", clock=lambda: next(times))
    assert journal.claim("next_step") == ([], None)
    journal.append([sent("a")])
    assert journal.claim("next_turn") == ([], None)
    _, event = journal.claim("next_step")
    assert event is not None and event.at == 20.0


def test_a_claim_is_told_to_on_events_once_and_as_stored() -> None:
    store = open_store("memory:")
    told: list[Event] = []
    journal = Journal(store, "s", on_events=told.extend)
    journal.append([sent("a")])
    _, event = journal.claim("next_step")
    assert told == list(store.read("s")) and told[-1] == event


def test_a_send_is_built_once_numbered_checked_first_and_retried_after_another_writer() -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")
    first = journal.send("fyi", "next_step", False)  # plain spellings become a message, a Target
    assert (first.seq, first.target, first.message) == (1, Target.NEXT_STEP, Message.user("fyi"))
    store.append("s", [sent("theirs")])
    second = journal.send(Message.user("go"), Target.NEXT_TURN, True)
    assert second.seq == 3 and journal.session == replay(store.read("s"))
    for bad, error in (((42, "next_step", True), TypeError), (("x", "later", True), ValueError),
                       (("x", "next_step", 1), TypeError)):
        with pytest.raises(error):
            journal.send(*bad)  # type: ignore[arg-type]
    assert store.version("s") == 3


@pytest.mark.parametrize("bad", [(42, "later", 1), (42, "next_step", 1), ("x", "later", 1),
                                 ("x", "later", True), ("x", "next_step", None)])
def test_every_way_to_send_checks_the_parts_in_one_order_so_one_error_wins(bad: tuple) -> None:
    # message, then target, then wakeup: a send with several bad parts raises the same error
    # whether the inbox, a journal, its sent_event or the port's takes it.
    from nous_inbox.inbox import Inbox

    def error(send: Any) -> str:
        with pytest.raises((TypeError, ValueError)) as caught:
            send(*bad)
        return f"{type(caught.value).__name__}: {caught.value}"

    journal = Journal(open_store("memory:"), "s")
    assert error(journal.send) == error(sent_event) == error(Inbox().send)
    assert journal.session.version == 0


def test_an_error_from_on_events_after_a_stored_write_is_never_taken_for_a_lost_race() -> None:
    # The write is stored when on_events runs: a ConcurrencyError it raises (say, from a write
    # of its own elsewhere) comes with the append made, and must not make the change again,
    # even when another writer appended meanwhile and there is news to read.
    store = open_store("memory:")
    calls: list[int] = []

    def told(events: Sequence[Event]) -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            store.append("s", [sent("theirs")])
            raise StoreLockedError("the host's own write timed out")

    journal = Journal(store, "s", on_events=told)
    with pytest.raises(StoreLockedError):
        journal.send("mine", "next_step", True)
    contents = [e.message.content for e in store.read("s") if isinstance(e, MessageSent)]
    assert contents == ["mine", "theirs"] and journal.writes == 1  # "mine" stored once


def test_a_claim_returns_its_event_as_the_store_kept_it() -> None:
    # A clock that says 0 leaves the time to the store, which times the event itself: what the
    # claim returns is what the log holds, as for every other write.
    store = open_store("memory:")
    journal = Journal(store, "s", clock=lambda: 0.0)
    journal.send("go", "next_step", True)
    _, event = journal.claim("next_step")
    assert event == list(store.read("s"))[-1] and event is not None and event.at > 0
