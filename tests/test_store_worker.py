"""The store worker's thread: jobs run one at a time in the order they came, the thread lives only
while there is work, and an idle AsyncOwner over a blocking store so holds none, yet a send to it
still commits and wakes it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_inbox.events import Event
from nous_inbox.message import Message
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.store_worker import LingeringThread
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from tests.helpers import WAIT, async_wait_until, wait_until

_T = TypeVar("_T")

def alive(name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == name]


class Recorder:
    """Jobs that note their order, their thread, and whether another job ran beside them."""

    def __init__(self) -> None:
        self.done: list[int] = []
        self.threads: set[threading.Thread] = set()
        self.running = 0
        self.overlapped = False

    def job(self, n: int) -> int:
        self.running += 1
        self.overlapped = self.overlapped or self.running > 1
        self.threads.add(threading.current_thread())
        self.done.append(n)
        self.running -= 1
        return n


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=8))
def test_jobs_run_in_the_order_they_came_never_side_by_side_even_as_threads_come_and_go(
        sizes: list[int]) -> None:
    # A linger of 0: the thread goes whenever it finds the queue empty, and the next job starts
    # another, so every burst exercises the hand-over between threads.
    worker, recorder, n = LingeringThread("test worker", linger=0), Recorder(), 0
    futures = []
    for size in sizes:
        burst = [worker.submit(recorder.job, n + i) for i in range(size)]
        n += size
        if burst:
            burst[-1].result(WAIT)  # the queue runs dry here, and the thread may go
        futures += burst
    worker.shutdown()
    assert [future.result() for future in futures] == list(range(n))
    assert recorder.done == list(range(n))
    assert not recorder.overlapped


def test_the_thread_goes_once_idle_for_its_linger_and_the_next_job_starts_another() -> None:
    worker = LingeringThread("lingering test worker", linger=0.05)
    first = worker.submit(threading.current_thread).result(WAIT)
    wait_until(lambda: not alive("lingering test worker"), what="the idle thread went")
    assert not first.is_alive()
    second = worker.submit(threading.current_thread).result(WAIT)
    assert second is not first and second.name == "lingering test worker"
    worker.shutdown()
    assert not second.is_alive()  # shutdown waits for the thread, which goes at once


def test_jobs_queued_before_shutdown_still_run_and_none_is_taken_after() -> None:
    worker, recorder = LingeringThread("test worker"), Recorder()
    gate = threading.Event()
    held = worker.submit(gate.wait, WAIT)
    queued = [worker.submit(recorder.job, i) for i in range(5)]
    worker.shutdown(wait=False)
    with pytest.raises(RuntimeError, match="cannot take a job after shutdown"):
        worker.submit(recorder.job, 99)
    gate.set()
    assert held.result(WAIT) is True
    assert [future.result(WAIT) for future in queued] == [0, 1, 2, 3, 4]


def test_a_failing_job_fails_its_own_future_and_the_next_job_runs() -> None:
    worker = LingeringThread("test worker")
    failing = worker.submit(int, "not a number")
    after = worker.submit(int, "7")
    with pytest.raises(ValueError, match="invalid literal"):
        failing.result(WAIT)
    assert after.result(WAIT) == 7
    worker.shutdown()


def test_shutdown_can_cancel_the_jobs_not_started() -> None:
    worker = LingeringThread("test worker")
    started, gate = threading.Event(), threading.Event()
    held = worker.submit(lambda: started.set() or gate.wait(WAIT))
    dropped = worker.submit(int, "1")
    assert started.wait(WAIT)
    worker.shutdown(wait=False, cancel_futures=True)
    gate.set()
    assert held.result(WAIT) is True
    assert dropped.cancelled()


def echo(transcript: list[Message], tools: object) -> Message:
    return Message.assistant(f"heard: {transcript[-1].content}")


def test_an_idle_async_owner_over_a_blocking_store_holds_no_thread_and_a_send_still_wakes_it(
        tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'inbox.sqlite'}") as store:

        async def main() -> None:
            async with AsyncOwner(store, "s", Runner(echo)) as owner:
                # (its worker's thread is named for the session: the store worker's docs say so)
                await async_wait_until(lambda: not alive("nous-inbox io s"),
                                       what="the idle owner's worker let its thread go")
                sent = await owner.steer("wake up")
                assert store.version("s") >= sent.seq  # committed
                assert await owner.wait_idle(WAIT)
                assert [m.content for m in owner.transcript] == ["wake up", "heard: wake up"]

        asyncio.run(main())


def _stored_now(send: Coroutine[Any, Any, _T]) -> _T:
    """The result of a send made off the loop: stored already, so the coroutine returns at once."""
    try:
        send.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("a send off the loop should be stored before it returns")


@pytest.mark.parametrize("rounds", [40])
def test_sends_from_another_thread_during_batched_sends_are_each_told_once_in_log_order(
        tmp_path: Path, rounds: int) -> None:
    """Listeners and ``events()`` readers hear every event, once and in log order, while a
    stream of sends on the loop shares group commits, another thread sends (committing on its
    own thread) and the runs those steers wake record on the worker; each loop sender resumes
    only once its own event was told; and nothing is left untold once the sending stops."""
    with open_store(f"sqlite:{tmp_path / 'inbox.sqlite'}") as store:

        async def main() -> None:
            async with AsyncOwner(store, "s", Runner(echo)) as owner:
                heard: list[int] = []
                caught_up = asyncio.Event()
                target = 0

                def listener(event: Event) -> None:
                    heard.append(event.seq)
                    if event.seq >= target:
                        caught_up.set()

                owner.listen(listener)
                first = owner.session.version
                reader = owner.events(after=first)

                async def loop_send(r: int, k: int) -> None:
                    sent = await owner.inject(f"loop {r}.{k}")
                    assert sent.seq in heard, "a sender resumed before its event was told"

                def thread_sends(r: int) -> None:
                    for k in range(3):
                        _stored_now(owner.steer(f"thread {r}.{k}") if k == 2
                                    else owner.inject(f"thread {r}.{k}"))

                for r in range(rounds):
                    await asyncio.gather(asyncio.to_thread(thread_sends, r),
                                         *(loop_send(r, k) for k in range(6)))
                    assert await owner.wait_idle(WAIT)
                    # Nothing more is sent until everything stored so far was told: a batch left
                    # untold would stay so, with no later send to carry it.
                    target = store.version("s")
                    if not heard or heard[-1] < target:
                        caught_up.clear()
                        await asyncio.wait_for(caught_up.wait(), WAIT)
                assert heard == list(range(first + 1, target + 1)), "told out of order, or twice"
                read = [(await asyncio.wait_for(anext(reader), WAIT)).seq for _ in heard]
                assert read == heard
                await reader.aclose()

        asyncio.run(main())
