"""How owners watch their store. Idle owners share one watch: an idle AsyncOwner makes no look of
its own and holds no thread, the loop's watch looks for all of them at once on one thread, and a
send another writer makes to any of them still wakes it. Both owners' watchers take one step and
subscribe one way: a store that cannot hint is polled."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nous_inbox.errors import LeaseLostError
from nous_inbox.events import MessageSent, TurnEnded
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.idle_watch import IDLE_LOOK, Member, watch_idle, watch_step
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store
from nous_inbox.verbs import Target
from tests.helpers import WAIT, async_wait_until


def echo(transcript: list[Message], tools: object) -> Message:
    return Message.assistant(f"heard: {transcript[-1].content}")


def steer_from_elsewhere(store: Store, stream: str, text: str) -> None:
    """Another writer's steer (a second store on the same log, as another process has)."""
    store.append(stream, [MessageSent(target=Target.NEXT_STEP, wakeup=True,
                                      message=Message.user(text))])


class Looks:
    """A member's looks: how many, on which threads; it says "moved" once told to."""

    def __init__(self) -> None:
        self.count = 0
        self.threads: set[threading.Thread] = set()
        self.moved = False
        self.woken = 0

    def look(self) -> bool:
        self.count += 1
        self.threads.add(threading.current_thread())
        return self.moved

    def wake(self) -> None:
        self.woken += 1


def test_every_idle_member_is_looked_at_off_the_loop_and_woken_when_its_look_says_so(
        tmp_path: Path) -> None:
    store = open_store(f"sqlite:{tmp_path / 'inbox.sqlite'}")  # a store whose calls block

    async def main() -> None:
        looks = [Looks() for _ in range(20)]
        members = [watch_idle(store, one.look, one.wake) for one in looks]
        await async_wait_until(lambda: all(one.count >= 2 for one in looks), what="every member looked at twice")
        threads = set().union(*(one.threads for one in looks))
        assert threading.current_thread() not in threads
        assert {thread.name for thread in threads} == {"nous-inbox idle watch"}
        assert not any(one.woken for one in looks)
        looks[3].moved = True
        await async_wait_until(lambda: looks[3].woken > 0, what="the member whose look said moved was woken")
        assert [one.woken > 0 for one in looks].count(True) == 1
        for member in members:
            member.leave()

    asyncio.run(main())
    store.close()


def test_a_member_that_waits_for_hints_is_looked_at_only_once_hinted() -> None:
    async def main() -> None:
        store = open_store("memory:")
        polled, hinted = Looks(), Looks()
        hinted.moved = True
        members = [watch_idle(store, polled.look, polled.wake),
                   watch_idle(store, hinted.look, hinted.wake, every=None)]
        await async_wait_until(lambda: polled.count >= 3, what="the polled member looked at three times")
        assert hinted.count == 0
        members[1].hint()
        await async_wait_until(lambda: hinted.woken == 1, what="the hinted member looked at, and woken")
        assert hinted.count == 1
        assert hinted.threads == {threading.current_thread()}  # memory: looked at on the loop
        for member in members:
            member.leave()

    asyncio.run(main())


def test_a_member_asking_for_fewer_looks_is_looked_at_on_fewer_of_the_watchs_rounds() -> None:
    async def main() -> None:
        store = open_store("memory:")
        often, seldom, done = Looks(), Looks(), asyncio.Event()
        members: list[Member] = []

        def fourth() -> bool:  # both leave in the round of the fourth look (no more rounds)
            often.look()
            return often.count == 4

        def leave_all() -> None:
            for member in members:
                member.leave()
            done.set()

        members += [watch_idle(store, fourth, leave_all),
                    watch_idle(store, seldom.look, seldom.wake, every=2 * IDLE_LOOK)]
        await asyncio.wait_for(done.wait(), WAIT)
        assert seldom.count == 2

    asyncio.run(main())


def test_a_look_that_fails_wakes_its_member_to_look_itself() -> None:
    async def main() -> None:
        store = open_store("memory:")
        woken = asyncio.Event()

        def failing() -> bool:
            raise OSError("the store went away")

        member = watch_idle(store, failing, woken.set)
        await asyncio.wait_for(woken.wait(), WAIT)
        member.leave()

    asyncio.run(main())


def test_bad_periods_are_refused() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="every must be a positive number of seconds"):
            watch_idle(open_store("memory:"), bool, print, every=0)

    asyncio.run(main())


def test_many_idle_owners_share_one_thread_and_each_still_hears_another_writer(
        tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    with open_store(url) as store, open_store(url) as elsewhere:

        async def main() -> None:
            before = threading.active_count()
            owners = [AsyncOwner(store, f"s{i}", Runner(echo)) for i in range(30)]
            for owner in owners:
                await owner.__aenter__()
            try:
                # Each owner's worker lets its thread go once idle; the shared watch keeps one.
                await async_wait_until(lambda: threading.active_count() <= before + 1,
                            what="thirty idle owners down to one thread between them")
                for i in (0, 13, 29):
                    steer_from_elsewhere(elsewhere, f"s{i}", f"wake {i}")
                for i in (0, 13, 29):
                    await async_wait_until(lambda i=i: len(owners[i].transcript) == 2,  # type: ignore[misc]
                                what=f"owner s{i} heard the steer and answered it")
                    assert owners[i].transcript[-1].content == f"heard: wake {i}"
                assert all(owner.transcript == [] for owner in owners[1:13])
            finally:
                for owner in owners:
                    await owner.aclose()

        asyncio.run(main())


def test_the_last_member_to_leave_lets_its_loop_and_store_go() -> None:
    # A loop closed right after its last idle owner left (run_until_complete, or a loop on a
    # thread of its own, stopped and closed: nobody cancels what is left on it) must not stay
    # alive, nor keep the store alive, through the watch the owner had joined.
    store = open_store("memory:")
    loop = asyncio.new_event_loop()

    async def join_and_leave(store: Store) -> None:
        watch_idle(store, lambda: False, lambda: None).leave()

    loop.run_until_complete(join_and_leave(store))
    loop.close()
    store_gone, loop_gone = weakref.ref(store), weakref.ref(loop)
    del store, loop
    gc.collect()
    assert store_gone() is None and loop_gone() is None


# -- the step both owners' watchers take ----------------------------------------------------------


class _NoHints:
    """A ``memory:`` store whose subscription fails (a notification channel that is down)."""

    def __init__(self) -> None:
        self.inner = open_store("memory:")
        self.asked = threading.Event()

    def subscribe(self, stream: str, callback: Callable[[], object]) -> Callable[[], None]:
        self.asked.set()
        raise OSError("the notification channel is down")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("face", ["Owner", "AsyncOwner"])
def test_an_owner_whose_store_cannot_hint_polls_and_still_hears_another_writer(
        face: str, caplog: pytest.LogCaptureFixture) -> None:
    store: Any = _NoHints()
    with caplog.at_level(logging.ERROR, logger="nous_inbox"):
        if face == "Owner":
            answered = threading.Event()

            def listen(event: Any) -> None:
                if isinstance(event, TurnEnded):
                    answered.set()

            with Owner(store, "s", Runner(echo), poll_interval=0.01, listen=listen) as owner:
                assert store.asked.wait(WAIT)
                steer_from_elsewhere(store.inner, "s", "wake up")
                assert answered.wait(WAIT), "the owner did not hear the steer"
                heard = [m.content for m in owner.transcript]
        else:
            async def main() -> list[str]:
                async with AsyncOwner(store, "s", Runner(echo), poll_interval=0.01) as owner:
                    await async_wait_until(store.asked.is_set, what="the owner asked for hints")
                    steer_from_elsewhere(store.inner, "s", "wake up")
                    await async_wait_until(lambda: len(owner.transcript) == 2, what="the owner heard the steer")
                    return [m.content for m in owner.transcript]

            heard = asyncio.run(main())
    assert heard == ["wake up", "heard: wake up"]
    assert "could not subscribe to session 's'; polling" in caplog.text


def test_a_watchers_step_catches_up_and_a_failing_one_is_logged_and_retried(
        caplog: pytest.LogCaptureFixture) -> None:
    caught: list[str] = []

    def failing() -> None:
        raise OSError("the store went away")

    assert watch_step("s", lost=lambda: None, lose=caught.append, catch_up=lambda: caught.append(
        "caught up"))
    with caplog.at_level(logging.ERROR, logger="nous_inbox"):
        assert watch_step("s", lost=lambda: None, lose=caught.append, catch_up=failing)
    assert caught == ["caught up"] and "watching session 's' failed; retrying" in caplog.text


def test_a_watchers_step_on_a_lease_taken_over_loses_it_and_stops() -> None:
    taken = LeaseLostError("taken over", stream="s", epoch=2)
    lost: list[LeaseLostError] = []
    assert not watch_step("s", lost=lambda: taken, lose=lost.append,
                          catch_up=lambda: pytest.fail("no catch-up once the lease is gone"))
    assert lost == [taken]
