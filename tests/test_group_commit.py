"""Group commit: concurrent sends to one owner share one transaction, and each send still returns
only once its own transaction committed.

The batches here are made deterministically: the store holds the first append (the first
leader's commit) until the other senders are queued behind it, so what the next leader takes is
known. Timing is measured in ``bench/``, never here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from nous_inbox import Message, MessageSent, StoreError, replay
from nous_inbox.events import Warned
from nous_inbox.owner import GroupCommitState, Owner
from nous_inbox.owner.group_commit import GroupCommit, Ticket, settle
from nous_inbox.owner.store_worker import StoreWorker
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store
from nous_inbox.store.journal import Journal, sent_event
from tests.helpers import wait_until

WAIT = 30.0  # seconds: a bound for a wait that should end at once, never a sync sleep


def _model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    return Message.assistant("ok")


class _HeldStore:
    """A store whose first append waits for ``release``: the first leader, held mid-commit.

    Records the size of every append (one append is one transaction); ``refuse`` names message
    contents its append raises ``fail`` for (once the batch holding them is seen), as a store
    refuses a batch. It says its calls block, as a durable store does, so an owner sends
    through its group commit.
    """

    blocking = True

    def __init__(self, inner: Store, fail: Callable[[], BaseException] | None = None,
                 refuse: frozenset[str] = frozenset()) -> None:
        self.inner = inner
        self.sizes: list[int] = []
        self.leaders: list[str] = []  # the thread that made each append
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = fail
        self.refuse = refuse

    def append(self, stream: str, events: Sequence[Any], expected_version: int | None = None
               ) -> Any:
        self.sizes.append(len(events))
        self.leaders.append(threading.current_thread().name)
        if len(self.sizes) == 1:
            self.entered.set()
            assert self.release.wait(WAIT)
        if self.fail is not None and len(events) > 1:
            raise self.fail()
        if any(isinstance(e, MessageSent) and e.message.content in self.refuse for e in events):
            raise ValueError("refused by the store; nothing was written")
        return self.inner.append(stream, events, expected_version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _contents(owner: Owner) -> list[str]:
    """The messages sent to ``owner``'s session, in log order."""
    return [e.message.content for e in owner.events() if isinstance(e, MessageSent)]


def _queued(owner: Owner) -> int:
    """How many sends wait in the owner's group commit: a batch has formed behind the held
    commit once they all do."""
    state = owner.group_commit
    assert state is not None  # a store that blocks
    return state.queued


class _Senders:
    """One thread per message, each sending it once; outcomes by message."""

    def __init__(self, owner: Owner, texts: Sequence[str]) -> None:
        self.results: dict[str, MessageSent | BaseException] = {}
        self.threads = [threading.Thread(target=self._send, args=(owner, t), daemon=True)
                        for t in texts]

    def _send(self, owner: Owner, text: str) -> None:
        try:
            self.results[text] = owner.inject(text)
        except BaseException as exc:  # recorded, asserted by the test
            self.results[text] = exc

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(WAIT)
            assert not thread.is_alive()


def _held(fail: Callable[[], BaseException] | None = None, refuse: frozenset[str] = frozenset(),
          ) -> tuple[_HeldStore, Owner]:
    store = _HeldStore(open_store("memory:"), fail, refuse)
    owner = Owner(store, "s", Runner(_model), watch=False)
    return store, owner


def _hold_then_queue(store: _HeldStore, owner: Owner, texts: Sequence[str]) -> _Senders:
    """The first send leads and is held in its commit; the others queue behind it."""
    first = _Senders(owner, ["first"])
    first.start()
    assert store.entered.wait(WAIT)
    others = _Senders(owner, texts)
    others.start()
    wait_until(lambda: _queued(owner) == len(texts), what="the other senders queued", timeout=WAIT)
    return _merge(first, others)


def _merge(a: _Senders, b: _Senders) -> _Senders:
    """Both groups as one (to join and to read the results of)."""
    a.results.update(b.results)
    b.results = a.results
    a.threads += b.threads
    return a


def test_sends_queued_while_a_transaction_commits_are_committed_together_in_the_next() -> None:
    store, owner = _held()
    with owner:
        senders = _hold_then_queue(store, owner, [f"m{i}" for i in range(7)])
        store.release.set()
        senders.join()
        assert store.sizes == [1, 7]  # the first alone (it came alone), then one for the rest
        logged = _contents(owner)
        assert sorted(logged) == sorted(["first", *(f"m{i}" for i in range(7))])
        assert owner.session == replay(owner.events())


def test_no_send_returns_before_the_transaction_holding_it_committed() -> None:
    store, owner = _held()
    with owner:
        senders = _hold_then_queue(store, owner, [f"m{i}" for i in range(7)])
        # The leader is held inside its commit: nobody, leader or follower, has an answer yet.
        assert senders.results == {}
        assert owner.events() == []
        store.release.set()
        senders.join()
        for text, result in senders.results.items():
            assert isinstance(result, MessageSent), text
            assert owner.events(result.seq - 1)[0] == result  # stored where it was acknowledged


def test_a_refused_event_in_a_shared_batch_fails_only_its_sender_and_the_others_are_stored() -> None:
    store, owner = _held(refuse=frozenset({"bad"}))
    with owner:
        texts = ["a", "b", "bad", "c"]
        senders = _hold_then_queue(store, owner, texts)
        store.release.set()
        senders.join()
        assert store.sizes[:2] == [1, 4]  # the shared batch was tried, refused as a whole
        assert isinstance(senders.results["bad"], ValueError)
        good = ["first", "a", "b", "c"]
        assert all(isinstance(senders.results[t], MessageSent) for t in good)
        logged = _contents(owner)
        assert sorted(logged) == sorted(good)  # each once, the refused one nowhere
        assert owner.session == replay(owner.events())
        assert owner.inject("after").seq == 5  # the group commit goes on


def test_a_batch_that_fails_in_the_store_fails_each_of_its_senders_and_sends_go_on() -> None:
    store, owner = _held(fail=lambda: StoreError("the server went away"))
    with owner:
        senders = _hold_then_queue(store, owner, ["a", "b", "c"])
        store.release.set()
        senders.join()
        assert isinstance(senders.results["first"], MessageSent)
        assert all(isinstance(senders.results[t], StoreError) for t in "abc")
        assert _contents(owner) == ["first"]
        assert owner.inject("after").seq == 2
        assert owner.session == replay(owner.events())


def test_a_listener_that_raises_on_a_stored_batch_neither_fails_its_senders_nor_doubles_it(
) -> None:
    # A listener's bug comes after the batch is stored: it is logged, and appending the batch
    # again one event at a time would store every event twice.
    def listener(event: Any) -> None:
        if isinstance(event, MessageSent) and event.message.content != "first":
            raise ValueError("a listener's own bug")

    store = _HeldStore(open_store("memory:"))
    with Owner(store, "s", Runner(_model), watch=False, listen=listener) as owner:
        senders = _hold_then_queue(store, owner, ["a", "b", "c"])
        store.release.set()
        senders.join()
        assert store.sizes == [1, 3]  # the shared batch once, nothing appended again
        assert sorted(_contents(owner)) == ["a", "b", "c", "first"]
        assert all(isinstance(r, MessageSent) for r in senders.results.values())


def test_each_sender_of_a_failed_batch_gets_an_error_of_its_own_caused_by_the_shared_one() -> None:
    # One instance raised in every sender's thread would gather every thread's frames in its
    # traceback; each sender gets a copy of the same type and message, caused by the original.
    store, owner = _held(fail=lambda: StoreError("the server went away"))
    with owner:
        senders = _hold_then_queue(store, owner, ["a", "b", "c"])
        store.release.set()
        senders.join()
        errors = [senders.results[t] for t in "abc"]
        assert all(type(e) is StoreError and str(e) == "the server went away" for e in errors)
        assert len({id(e) for e in errors}) == 3
        causes = {id(e.__cause__) for e in errors}
        assert len(causes) == 1 and isinstance(errors[0].__cause__, StoreError)


def test_a_leader_interrupted_mid_commit_tells_its_senders_their_outcome_is_unknown() -> None:
    # An interrupt (Ctrl-C in the thread leading) is that thread's own: the senders of its
    # batch hear that their sends may or may not be stored, not the interrupt itself.
    from nous_inbox.errors import OutcomeUnknownError

    store, owner = _held(fail=KeyboardInterrupt)
    with owner:
        senders = _hold_then_queue(store, owner, ["a", "b", "c"])
        store.release.set()
        senders.join()
        outcomes = [senders.results[t] for t in "abc"]
        interrupted = [o for o in outcomes if isinstance(o, KeyboardInterrupt)]
        unknown = [o for o in outcomes if isinstance(o, OutcomeUnknownError)]
        assert len(interrupted) == 1 and len(unknown) == 2  # the leader, and its two senders
        # Each its own copy of the batch's one error, which the interrupt caused.
        assert all(o.__cause__.__cause__ is interrupted[0] for o in unknown)
        assert owner.inject("after").seq == 2  # the group commit goes on


def test_the_last_sender_a_gathering_leader_waits_for_takes_the_batch_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The round of "first" (alone) and "a" (queued meanwhile) was two senders: "a", leading
    # next, gathers until one more has queued (as long as it likes here). When "first" comes
    # back with its next send, that sender commits the batch itself instead of waking "a".
    monkeypatch.setattr("nous_inbox.owner.group_commit.GATHER_SECONDS", WAIT)
    monkeypatch.setattr("nous_inbox.owner.group_commit.GATHER_MAX_SECONDS", WAIT)
    store, owner = _held()
    with owner:
        senders = _hold_then_queue(store, owner, ["a"])
        store.release.set()
        wait_until(lambda: "first" in senders.results, what="the first send returned", timeout=WAIT)
        again = _Senders(owner, ["second"])
        again.start()
        again.join()
        senders.join()
        assert store.sizes == [1, 2]
        assert store.leaders[1] == again.threads[0].name  # not the gatherer's thread
        assert all(isinstance(r, MessageSent) for r in [*senders.results.values(),
                                                        *again.results.values()])
        assert sorted(_contents(owner)) == ["a", "first", "second"]


def test_a_lone_sender_never_waits_for_company() -> None:
    store = _HeldStore(open_store("memory:"))
    store.release.set()
    with Owner(store, "s", Runner(_model), watch=False) as owner:
        for i in range(5):
            owner.inject(f"m{i}")
        assert store.sizes == [1] * 5
        assert owner.group_commit == GroupCommitState(queued=0, committing=False, senders=1)


@pytest.mark.parametrize("senders", [8, 32])
def test_concurrent_senders_on_every_store_share_transactions_and_lose_nothing(
    store: Store, senders: int,
) -> None:
    counting = _HeldStore(store)  # its first append is held until the others are queued
    with Owner(counting, "s", Runner(_model), watch=False) as owner:
        barrier = threading.Barrier(senders)

        def release_when_all_queued() -> None:
            assert counting.entered.wait(WAIT)
            wait_until(lambda: _queued(owner) == senders - 1, what="every other sender queued",
                       timeout=WAIT)
            counting.release.set()

        releaser = threading.Thread(target=release_when_all_queued, daemon=True)
        releaser.start()

        def send(k: int) -> None:
            barrier.wait()
            for i in range(4):
                owner.inject(f"t{k}-{i}")

        threads = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        logged = _contents(owner)
        assert sorted(logged) == sorted(f"t{k}-{i}" for k in range(senders) for i in range(4))
        assert sum(counting.sizes) == senders * 4
        assert max(counting.sizes) >= senders - 1  # those queued behind the first, together
        assert owner.session == replay(owner.events())


def test_a_refused_event_fails_only_its_sender_after_another_writer_appended_first() -> None:
    # The commit catches up with the other writer's event before the store refuses the batch:
    # the version moved, yet nothing of the batch was written, so its events are tried alone.
    from nous_inbox.codec import MAX_RECORD_SIZE
    from nous_inbox.errors import RecordTooLargeError

    store = open_store("memory:")
    mine, theirs = Journal(store, "s"), Journal(store, "s")
    theirs.append([sent_event("theirs", "next_step", False)])
    outcomes = settle(mine.append, [sent_event("good", "next_step", False),
                                    sent_event("x" * MAX_RECORD_SIZE, "next_step", False)])
    (good, no_error), (none, error) = outcomes
    assert no_error is None and isinstance(good, MessageSent) and good.seq == 2
    assert none is None and isinstance(error, RecordTooLargeError)
    assert [e.message.content for e in store.read("s") if isinstance(e, MessageSent)] == [
        "theirs", "good"]


def test_a_batch_whose_outcome_is_unknown_is_not_written_again_and_every_sender_hears_why() -> None:
    store = open_store("memory:")
    journal = Journal(store, "s")

    def commits_then_loses_the_answer(events: Sequence[Any]) -> Sequence[Any]:
        journal.append(events)  # what PostgreSQL does when the answer to a COMMIT is lost
        raise StoreError("lost the connection and could not get it back within 10s")

    outcomes = settle(commits_then_loses_the_answer,
                      [sent_event(text, "next_step", False) for text in "abc"])
    assert [stored for stored, _ in outcomes] == [None, None, None]  # nothing acknowledged
    errors = [error for _, error in outcomes]
    assert isinstance(errors[0], StoreError) and errors[0] is errors[1] is errors[2]
    assert [e.message.content for e in store.read("s")] == ["a", "b", "c"]  # once each


# -- the asyncio pump ---------------------------------------------------------------------------------


def test_the_sends_queued_when_an_owner_gives_its_lease_back_are_stored_while_it_holds_it(
) -> None:
    # A batch commits while another send queues and the owner closes: the lease goes back
    # only once every send queued before the close is stored (else the last batch would be
    # written by an owner that no longer holds the stream).
    order: list[str] = []
    entered, release = threading.Event(), threading.Event()

    def commit(events: Sequence[Any]) -> Sequence[Any]:
        order.extend(event.text for event in events)
        if len(order) == 1:  # the first batch: held until the close is queued behind it
            entered.set()
            assert release.wait(WAIT)
        return list(events)

    class Lease:
        def release(self) -> None:
            order.append("lease given back")

    async def main() -> list[str]:
        worker = StoreWorker(asyncio.get_running_loop(), True, "s", commit=commit)
        await worker.hold(Lease)
        first = worker.send(Warned(text="a"))
        assert await asyncio.to_thread(entered.wait, WAIT)
        second = worker.send(Warned(text="b"))  # queued behind the batch under way
        closed = worker.soon(worker.give_back)  # the close, queued on the worker after it
        release.set()
        await closed
        stored = [(await first).text, (await second).text]
        worker.shutdown()
        return stored

    assert asyncio.run(main()) == ["a", "b"]
    assert order == ["a", "b", "lease given back"]


# -- the batcher, sans I/O -------------------------------------------------------------------------


def _tickets(*texts: str) -> list[Ticket[None]]:
    return [Ticket(Warned(text=text)) for text in texts]


def test_the_first_sender_leads_and_the_batch_is_everything_queued_until_it_takes() -> None:
    batcher: GroupCommit[None] = GroupCommit()
    a, b, c = _tickets("a", "b", "c")
    assert [batcher.queue(a), batcher.queue(b), batcher.queue(c)] == [True, False, False]
    assert batcher.take() == [a, b, c] and batcher.queued == 0


def test_a_finished_batch_hands_the_lead_to_the_first_sender_queued_meanwhile() -> None:
    batcher: GroupCommit[None] = GroupCommit()
    a, b, c = _tickets("a", "b", "c")
    batcher.queue(a)
    batch = batcher.take()
    batcher.queue(b)
    batcher.queue(c)
    assert batcher.finish(batch, [(a.event, None)], seconds=0.01) is b
    assert a.done and a.result() is a.event
    assert batcher.senders == 3  # its round: the one committed and the two queued meanwhile
    assert batcher.take() == [b, c]
    assert batcher.committing  # b leads until its batch is finished
    assert batcher.finish([b, c], [(b.event, None), (c.event, None)], seconds=0.01) is None
    assert not batcher.committing
    assert batcher.queue(Ticket(Warned(text="d")))  # idle again: the next sender leads


def test_a_leader_waits_for_the_senders_of_the_last_round_only_and_briefly() -> None:
    batcher: GroupCommit[None] = GroupCommit()
    a, b, c = _tickets("a", "b", "c")
    batcher.queue(a)
    assert batcher.gather() == 0.0  # a lone sender never waits for company
    batch = batcher.take()
    batcher.queue(b)
    batcher.finish(batch, [(a.event, None)], seconds=1.0)  # a slow commit; round of two
    assert 0 < batcher.gather() <= 0.005  # b waits, at most a bound, for one more
    assert batcher.queue(c)  # the last one it waits for: c takes the lead over at once
    assert batcher.leads(c) and not batcher.leads(b)  # b, its wait over, waits as a sender
    assert batcher.take() == [b, c]


def test_a_sender_that_gives_up_before_a_batch_took_it_is_taken_back_and_the_lead_passes_on(
) -> None:
    batcher: GroupCommit[None] = GroupCommit()
    a, b, c = _tickets("a", "b", "c")
    batcher.queue(a)
    batcher.queue(b)
    batcher.queue(c)
    assert batcher.withdraw(a) == (True, b)  # a led and left before taking: b leads
    assert batcher.withdraw(c) == (True, None)
    assert batcher.take() == [b]
    assert batcher.withdraw(b) == (False, None)  # taken: committed, or may be


def test_a_batch_settles_each_sender_with_its_own_outcome_and_a_copy_of_a_shared_error() -> None:
    batcher: GroupCommit[None] = GroupCommit()
    a, b, c = _tickets("a", "b", "c")
    for ticket in (a, b, c):
        batcher.queue(ticket)
    batch = batcher.take()
    shared = StoreError("the server went away")
    batcher.finish(batch, [(a.event, None), (None, shared), (None, shared)], seconds=0.0)
    assert a.result() is a.event
    with pytest.raises(StoreError) as first:
        b.result()
    with pytest.raises(StoreError) as second:
        c.result()
    assert first.value is not second.value and first.value.__cause__ is shared


def test_settle_tries_a_refused_batch_one_event_at_a_time_and_a_lone_refusal_once() -> None:
    calls: list[int] = []

    def commit(events: Sequence[Any]) -> Sequence[Any]:
        calls.append(len(events))
        if "bad" in events:
            raise ValueError("refused; nothing was written")
        return list(events)

    assert [error is None for _, error in settle(commit, ["a", "bad", "c"])] == [True, False, True]
    assert calls == [3, 1, 1, 1]
    calls.clear()
    assert isinstance(settle(commit, ["bad"])[0][1], ValueError) and calls == [1]
