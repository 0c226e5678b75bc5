"""The store worker's thread: jobs run one at a time in the order they came, the thread lives only
while there is work, and an idle AsyncOwner over a blocking store so holds none, yet a send to it
still commits and wakes it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nous_inbox.async_owner import AsyncOwner
from nous_inbox.message import Message
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from nous_inbox.store_worker import LingeringThread

WAIT = 20.0  # seconds: a bound for what should happen soon, never a sleep to synchronise


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {what}")
        time.sleep(0.01)


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
    eventually(lambda: not alive("lingering test worker"), "the idle thread went")
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
                await asyncio.to_thread(eventually, lambda: not alive("nous-inbox io s"),
                                        "the idle owner's worker let its thread go")
                sent = await owner.steer("wake up")
                assert store.version("s") >= sent.seq  # committed
                assert await owner.wait_idle(WAIT)
                assert [m.content for m in owner.transcript] == ["wake up", "heard: wake up"]

        asyncio.run(main())
