"""Cancel from anywhere: a cancel is a ``CancelRequested`` in the log, recorded while a turn is
open, honoured by the owner holding the session at its next boundary, waking nothing (ruling 9).

Every owner here runs a model that waits on an event the test controls (never a sleep): the turn
is open while the test cancels it from another thread, another process or the web face.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_inbox import (
    AsyncOwner,
    CancelRequested,
    Message,
    MessageSent,
    Owner,
    Runner,
    Session,
    Target,
    TurnEnded,
    TurnStarted,
    Warned,
    open_store,
    replay,
    request_cancel,
)
from nous_inbox.snapshot import TIP_EVENTS, decode_snapshot, encode_snapshot
from nous_inbox.store import Store

ROOT = Path(__file__).resolve().parent.parent
WAIT = 10.0


def kinds(store: Store, stream: str = "s") -> list[str]:
    return [type(e).__name__ for e in store.read(stream)]


def ends(store: Store, stream: str = "s") -> list[tuple[int, str]]:
    return [(e.turn, e.reason) for e in store.read(stream) if isinstance(e, TurnEnded)]


def requests(store: Store, stream: str = "s") -> list[int]:
    return [e.turn for e in store.read(stream) if isinstance(e, CancelRequested)]


class Held:
    """A threaded model that answers only once released; ``asked`` is set when it is called."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()

    def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        self.asked.set()
        assert self.release.wait(WAIT)
        return Message.assistant("done")


class Stuck:
    """An async model whose request never answers by itself; ``interrupted`` is set when the
    request is cancelled (the in-flight call is interrupted, not left to finish)."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.interrupted = threading.Event()

    async def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        self.asked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.interrupted.set()
            raise
        raise AssertionError("unreachable")


def cancel_in_thread(owner: Any) -> bool:
    answer: list[bool] = []
    thread = threading.Thread(target=lambda: answer.append(owner.cancel()))
    thread.start()
    thread.join(WAIT)
    return answer[0]


def nous_inbox(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "nous_inbox", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=60)


# -- the threaded Owner ----------------------------------------------------------------------------


def test_an_owner_cancelled_from_another_thread_records_it_and_ends_the_turn() -> None:
    store, model = open_store("memory:"), Held()
    with Owner(store, "s", Runner(model)) as owner:
        owner.steer("work")
        assert model.asked.wait(WAIT)
        owner.followup("later")  # queued, waking: the cancel must not start a turn for it
        assert cancel_in_thread(owner) is True
        model.release.set()
        assert owner.wait_idle(WAIT)
        assert requests(store) == [1] and ends(store) == [(1, "cancelled")]
        assert kinds(store).index("CancelRequested") < kinds(store).index("TurnEnded")
        assert owner.inbox.count("next_turn") == 1 and not owner.running  # nothing woken
        assert replay(store.read("s")) == owner.session


def test_a_second_cancel_of_the_same_turn_records_nothing_more() -> None:
    store, model = open_store("memory:"), Held()
    with Owner(store, "s", Runner(model)) as owner:
        owner.steer("work")
        assert model.asked.wait(WAIT)
        assert owner.cancel() and owner.cancel()
        assert request_cancel(store, "s") is None  # asked already
        model.release.set()
        assert owner.wait_idle(WAIT)
        assert requests(store) == [1] and ends(store) == [(1, "cancelled")]


def test_a_cancel_when_nothing_runs_records_nothing_and_spares_the_next_turn() -> None:
    store = open_store("memory:")
    with Owner(store, "s", Runner(lambda transcript, tools: "done")) as owner:
        assert owner.cancel() is False and request_cancel(store, "s") is None
        owner.steer("go")
        assert owner.wait_idle(WAIT)
        assert requests(store) == [] and ends(store) == [(1, "final")]


def test_a_request_for_an_ended_turn_never_cancels_a_later_one() -> None:
    store, model = open_store("memory:"), Held()
    model.release.set()
    with Owner(store, "s", Runner(model)) as owner:
        owner.steer("one")
        assert owner.wait_idle(WAIT)
        store.append("s", [CancelRequested(turn=1)])  # late, by a writer that did not ask first
        owner.steer("two")
        assert owner.wait_idle(WAIT)
        assert ends(store) == [(1, "final"), (2, "final")]
        assert not owner.session.cancelling and replay(store.read("s")) == owner.session


def test_an_owner_in_another_process_is_cancelled_by_the_command(tmp_path: Path) -> None:
    url, model, folded = f"sqlite:{tmp_path / 'log.sqlite'}", Held(), threading.Event()

    def heard(event: object) -> None:
        if type(event) is CancelRequested:
            folded.set()

    with open_store(url) as store, Owner(store, "s", Runner(model), poll_interval=0.01,
                                         listen=heard) as owner:
        owner.steer("work")
        assert model.asked.wait(WAIT)
        done = nous_inbox("cancel", "--store", url, "s", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "cancel of turn 1 of 's' recorded" in done.stdout
        assert folded.wait(WAIT)  # the watcher read it, as it reads another process's steer
        model.release.set()  # a sync model cannot be interrupted: the boundary after it ends
        assert owner.wait_idle(WAIT)
        assert ends(store) == [(1, "cancelled")]
        again = nous_inbox("cancel", "--store", url, "s", cwd=tmp_path)
        assert (again.returncode, again.stdout) == (
            0, "nothing to cancel in 's': no turn is open; nothing recorded\n")
        assert replay(store.read("s")) == owner.session


# -- the AsyncOwner --------------------------------------------------------------------------------


@pytest.mark.parametrize("offload", [False, True], ids=["inline", "worker"])
def test_an_async_owner_cancelled_from_another_thread_interrupts_its_model(offload: bool) -> None:
    store, model = open_store("memory:"), Stuck()

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(model), offload=offload) as owner:
            await owner.steer("work")
            await asyncio.to_thread(model.asked.wait, WAIT)
            await owner.followup("later").stored()
            assert await asyncio.to_thread(owner.cancel) is True
            assert await owner.wait_idle(WAIT)
            assert model.interrupted.is_set()
            assert requests(store) == [1] and ends(store) == [(1, "cancelled")]
            assert owner.inbox.count("next_turn") == 1 and not owner.running  # nothing woken
            assert owner.cancel() is False and requests(store) == [1]
            assert replay(store.read("s")) == owner.session

    asyncio.run(main())


def test_an_async_owner_cancelled_on_its_loop_records_the_request_first() -> None:
    store, model = open_store("memory:"), Stuck()

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(model), offload=True) as owner:
            await owner.steer("work")
            await asyncio.to_thread(model.asked.wait, WAIT)
            assert owner.cancel() and owner.cancel()
            assert await owner.wait_idle(WAIT)
            assert requests(store) == [1] and ends(store) == [(1, "cancelled")]
            assert kinds(store).index("CancelRequested") < kinds(store).index("TurnEnded")

    asyncio.run(main())


def test_an_async_owner_cancelled_from_another_thread_while_idle_spares_the_next_run() -> None:
    store = open_store("memory:")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(lambda transcript, tools: "done"),
                              watch=False) as owner:
            # The loop does not turn between these two: the cancel's hand-off to the loop waits.
            assert cancel_in_thread(owner) is False  # nothing runs: nothing to cancel
            await owner.steer("go")  # starts a run before the hand-off reaches the loop
            assert await owner.wait_idle(WAIT)
            assert ends(store) == [(1, "final")]  # the steer is answered, not left queued

    asyncio.run(main())


def test_an_async_owner_in_another_process_has_its_model_request_interrupted(
    tmp_path: Path,
) -> None:
    url, model = f"sqlite:{tmp_path / 'log.sqlite'}", Stuck()

    async def main(store: Store) -> None:
        async with AsyncOwner(store, "s", Runner(model), poll_interval=0.01) as owner:
            await owner.steer("work")
            await asyncio.to_thread(model.asked.wait, WAIT)
            done = await asyncio.to_thread(nous_inbox, "cancel", "--store", url, "s",
                                           cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            assert await owner.wait_idle(WAIT)
            assert model.interrupted.is_set()
            assert requests(store) == [1] and ends(store) == [(1, "cancelled")]
            assert replay(store.read("s")) == owner.session

    with open_store(url) as store:
        asyncio.run(main(store))


# -- the command line and the web face -------------------------------------------------------------


def test_the_command_refuses_a_session_that_does_not_exist(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    with open_store(url) as store:
        store.append("there", [Warned(text="x")])
    done = nous_inbox("cancel", "--store", url, "nobody", cwd=tmp_path)
    assert done.returncode == 1 and "no session 'nobody'" in done.stderr
    idle = nous_inbox("cancel", "--store", url, "there", cwd=tmp_path)
    assert idle.returncode == 0 and "no turn is open; nothing recorded" in idle.stdout


def test_the_web_endpoint_cancels_a_run_another_process_holds(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    httpx = pytest.importorskip("httpx")
    from nous_inbox.web import SessionHost, create_app

    model, auth = Stuck(), {"Authorization": "Bearer test-token-1234"}

    async def main(store: Store) -> None:
        theirs = AsyncOwner(store, "s", Runner(model), poll_interval=0.01)
        agent = lambda session: Runner(lambda transcript, tools: "ok")  # noqa: E731
        async with theirs, SessionHost(store, agent, scan_interval=None) as host:
            app = create_app(host, token="test-token-1234")
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://test") as client:
                await theirs.steer("work")
                await asyncio.to_thread(model.asked.wait, WAIT)
                response = await client.post("/api/sessions/s/cancel", headers=auth)
                assert (response.status_code, response.json()) == (200, {"cancelled": True})
                assert host.held == []  # not held here: the log carried it
                assert await theirs.wait_idle(WAIT)
                assert model.interrupted.is_set() and ends(store) == [(1, "cancelled")]
                again = await client.post("/api/sessions/s/cancel", headers=auth)
                assert again.json() == {"cancelled": False}

    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        asyncio.run(main(store))


# -- the fold: replay agrees ------------------------------------------------------------------------

_steps = st.lists(st.one_of(
    st.just("open"), st.just("end"), st.just("send"),
    st.integers(min_value=0, max_value=4).map(lambda turn: ("request", turn)),
), max_size=30)


@given(_steps)
def test_a_request_reaches_only_the_open_turn_and_every_fold_agrees(steps: list[Any]) -> None:
    session, events, turn, running, asked = Session(), [], 0, False, False
    for step in steps:
        if step == "open":
            turn, running, asked = turn + 1, True, False
            event: Any = TurnStarted(turn=turn)
        elif step == "end":
            running, asked = False, False
            event = TurnEnded(turn=turn, steps=0, reason="cancelled")
        elif step == "send":
            event = MessageSent(target=Target.NEXT_STEP, wakeup=True, message=Message.user("go"))
        else:
            event = CancelRequested(turn=step[1])
            asked = asked or (running and step[1] == turn)
        event = msgspec.structs.replace(event, seq=session.version + 1)
        session = session.apply(event)
        events.append(event)
        assert session.cancelling == asked
        assert (session.cancel() is not None) == (running and not asked)
    assert replay(events) == session
    if events:
        tip = events[-TIP_EVENTS:]
        assert decode_snapshot(encode_snapshot("s", session, tip), "s", tip) == session
