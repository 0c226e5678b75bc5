"""SessionHost: one asyncio process holding owners for many sessions of a store: it takes a
session that wants a wake, lets an idle one go, holds no more than its cap, and leaves a session
another owner holds to that owner."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nous_inbox.errors import StreamOwnedError
from nous_inbox.events import MessageSent, TurnEnded, TurnStarted
from nous_inbox.message import Message
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner import Runner
from nous_inbox.session import replay
from nous_inbox.store import Store, open_store
from nous_inbox.verbs import Target
from nous_inbox.web.host import SessionHost
from tests.helpers import WAIT, async_wait_until


def echo(session: str) -> Runner:
    return Runner(lambda transcript, tools: Message.assistant(f"{session} heard {transcript[-1].content}"))


def answered(store: Store, session: str) -> bool:
    return any(isinstance(e, TurnEnded) for e in store.read(session))


def steer_from_elsewhere(store: Store, session: str, text: str) -> None:
    """A send another process makes (``nous-inbox steer``): straight into the log."""
    store.append(session, [MessageSent(target=Target.NEXT_STEP, wakeup=True,
                                       message=Message.user(text))])


def lease_is_free(store: Store, session: str) -> bool:
    try:
        store.own(session).release()
    except StreamOwnedError:
        return False
    return True


def run(main: Callable[[], Any]) -> Any:
    return asyncio.run(main())


def test_the_scan_takes_a_session_that_wants_a_wake_and_runs_it(tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        steer_from_elsewhere(store, "waiting", "go")
        store.append("quiet", [MessageSent(target=Target.NEXT_STEP, wakeup=False,
                                           message=Message.user("fyi"))])

        async def main() -> None:
            async with SessionHost(store, echo, scan_interval=0.01) as host:
                await async_wait_until(lambda: answered(store, "waiting"), what="the waiting session ran")
                assert host.held == ["waiting"]  # an injection alone wakes nothing (ruling 9)

        run(main)
        assert [m.content for m in replay(store.read("waiting")).transcript] == [
            "go", "waiting heard go"]


def test_one_host_runs_many_sessions_each_with_its_own_agent(tmp_path: Path) -> None:
    names = [f"s{i}" for i in range(20)]
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:

        async def main() -> None:
            async with SessionHost(store, echo, scan_interval=None) as host:
                sent = await asyncio.gather(*(host.send(n, "prompt", f"task {n}") for n in names))
                assert [event.seq for event in sent] == [1] * len(names)
                assert host.held == sorted(names)
                await async_wait_until(lambda: all(answered(store, n) for n in names), what="every session ran")

        run(main)
        for name in names:
            assert replay(store.read(name)).transcript[-1].content == f"{name} heard task {name}"


def test_an_idle_session_is_let_go_and_its_lease_given_back(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    with open_store(url) as store, open_store(url) as other:

        async def main() -> None:
            async with SessionHost(store, echo, idle_timeout=0.05, scan_interval=0.01) as host:
                await host.send("s1", "prompt", "hello")
                await async_wait_until(lambda: answered(store, "s1"), what="the prompt was answered")
                await async_wait_until(lambda: host.held == [], what="the idle session was let go")
                await async_wait_until(lambda: lease_is_free(other, "s1"), what="its lease was given back")
                shown = await host.session("s1")
                assert shown is not None and shown.transcript[-1].content == "s1 heard hello"
                steer_from_elsewhere(store, "s1", "again")
                await async_wait_until(lambda: host.held == ["s1"], what="a new wake took it back")
                await async_wait_until(lambda: replay(store.read("s1")).transcript[-1].content ==
                            "s1 heard again", what="the steer was answered")

        run(main)


def test_at_its_cap_a_host_queues_the_send_in_the_log_and_takes_it_when_a_slot_frees(
        tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:

        async def main() -> None:
            gate = asyncio.Event()

            def gated(session: str) -> Runner:
                async def model(transcript: Any, tools: Any) -> str:
                    await gate.wait()
                    return f"{session} done"
                return Runner(model)

            async with SessionHost(store, gated, max_sessions=2, idle_timeout=0.05,
                                   scan_interval=0.01) as host:
                for name in ("a", "b", "c"):
                    await host.send(name, "prompt", f"task {name}")
                assert host.held == ["a", "b"]  # both running, so c waits in the log
                assert [str(e.target) for e in store.read("c")] == ["next_turn"]
                gate.set()
                await async_wait_until(lambda: all(answered(store, n) for n in "abc"), what="all three ran")
                assert len(host.held) <= 2

        run(main)


def test_a_session_another_owner_holds_gets_the_send_through_the_log(tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:

        async def main() -> None:
            mine = AsyncOwner(store, "theirs", echo("theirs"), poll_interval=0.01)
            async with mine, SessionHost(store, echo, scan_interval=0.01) as host:
                sent = await host.send("theirs", "steer", "from the web")
                assert host.held == []
                await async_wait_until(lambda: answered(store, "theirs"), what="its owner answered it")
                assert mine.transcript[0].content == "from the web"
                assert sent.seq == 1

        run(main)


def test_held_idle_sessions_keep_no_thread_each_and_still_hear_another_process(
        tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    with open_store(url) as store, open_store(url) as elsewhere:

        async def main() -> None:
            before = threading.active_count()
            async with SessionHost(store, echo, scan_interval=None) as host:
                for i in range(20):
                    await host.send(f"s{i}", "inject", "for later")
                # the host's store thread, and the one watch its idle owners share
                await async_wait_until(lambda: threading.active_count() <= before + 2,
                            what="twenty held idle sessions down to two threads in all")
                assert len(host.held) == 20
                steer_from_elsewhere(elsewhere, "s7", "from the command line")
                await async_wait_until(lambda: answered(store, "s7"), what="the held idle session answered")
                owner = host.hosted("s7")
                assert owner is not None
                assert [m.content for m in owner.transcript] == [
                    "for later", "from the command line", "s7 heard from the command line"]

        run(main)


def test_bad_options_name_themselves() -> None:
    store = open_store("memory:")
    with pytest.raises(ValueError, match="max_sessions must be an int >= 1"):
        SessionHost(store, echo, max_sessions=0)
    with pytest.raises(ValueError, match="idle_timeout must be a positive number"):
        SessionHost(store, echo, idle_timeout=float("nan"))
    with pytest.raises(TypeError, match="agent must be a callable factory"):
        SessionHost(store, "echo")  # type: ignore[arg-type]


def test_a_bad_send_writes_nothing(tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:

        async def main() -> None:
            async with SessionHost(store, echo, scan_interval=None) as host:
                with pytest.raises(ValueError, match="mode must be one of"):
                    await host.send("s1", "yell", "x")
                with pytest.raises(ValueError, match="control character"):
                    await host.send("s\x07", "steer", "x")
                with pytest.raises(ValueError, match="text is empty"):
                    await host.send("s1", "steer", " \t\n")
                for mode in (["steer"], {"steer": 1}, 5, None):  # a list or dict would not hash
                    with pytest.raises(TypeError, match=r"mode must be a string .* got "):
                        await host.send("s1", mode, "x")  # type: ignore[arg-type]
                for after in ("1", -1, 1.0, None):
                    with pytest.raises(ValueError, match="after must be an int >= 0"):
                        await anext(host.events("s1", after))  # type: ignore[arg-type]
                assert host.held == []

        run(main)
        assert store.streams() == []


def test_a_session_that_cannot_be_opened_does_not_keep_the_scan_from_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def picky(session: str) -> Runner:
        if session == "a-broken":
            raise RuntimeError("no agent for this one")
        return echo(session)

    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        for name in ("a-broken", "b-fine"):  # the scan meets the broken one first
            steer_from_elsewhere(store, name, "go")

        async def main() -> None:
            async with SessionHost(store, picky, scan_interval=0.01) as host:
                await async_wait_until(lambda: answered(store, "b-fine"), what="the fine session ran")
                assert host.held == ["b-fine"]

        run(main)
    assert "'a-broken'" in caplog.text and "no agent for this one" in caplog.text


class GatedOpen:
    """A store whose owner lease is handed out only once ``go`` is set: an open held mid-way."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.asked = threading.Event()
        self.go = threading.Event()

    def own(self, stream: str) -> Any:
        self.asked.set()
        self.go.wait(WAIT)
        return self._store.own(stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_an_owner_whose_open_ends_after_the_host_closed_gives_its_lease_back(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    with open_store(url) as store, open_store(url) as other:
        gated = GatedOpen(store)

        async def main() -> None:
            host = SessionHost(gated, echo, scan_interval=None)  # type: ignore[arg-type]
            # Opened by hand so that it is closed once, the way ``serve`` closes it.
            await host.__aenter__()
            sending = asyncio.ensure_future(host.send("s1", "inject", "hi"))
            await async_wait_until(gated.asked.is_set, what="the send began opening the session")
            closing = asyncio.ensure_future(host.aclose())
            await async_wait_until(host.stopping.is_set, what="the host began closing")
            gated.go.set()
            await closing
            await asyncio.gather(sending, return_exceptions=True)  # stored or refused: either
            assert host.held == []
            await async_wait_until(lambda: lease_is_free(other, "s1"), what="the late owner gave its lease back")

        run(main)


def test_a_send_that_gives_up_while_its_session_opens_leaves_the_open_to_the_next(
        tmp_path: Path) -> None:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
        gated = GatedOpen(store)

        async def main() -> None:
            async with SessionHost(gated, echo, scan_interval=None) as host:  # type: ignore[arg-type]
                first = asyncio.ensure_future(host.send("s1", "inject", "one"))
                await async_wait_until(gated.asked.is_set, what="the first send began opening the session")
                second = asyncio.ensure_future(host.send("s1", "inject", "two"))
                first.cancel()  # its client went away
                gated.go.set()
                sent = await second
                assert sent.message.content == "two" and host.held == ["s1"]

        run(main)


def test_a_cancelled_session_is_not_woken_by_being_let_go_and_taken_back(tmp_path: Path) -> None:
    """Ruling 9: a steer left queued by a cancelled run waits for the next real send; the host
    letting the idle session go and its scan taking it back is not one."""
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:

        async def main() -> None:
            working, gate = asyncio.Event(), asyncio.Event()

            def slow(session: str) -> Runner:
                async def model(transcript: Any, tools: Any) -> str:
                    working.set()
                    await gate.wait()
                    return f"answered {transcript[-1].content}"
                return Runner(model)

            async with SessionHost(store, slow, idle_timeout=1e-6, scan_interval=None) as host:
                await host.send("s", "prompt", "work")
                await asyncio.wait_for(working.wait(), WAIT)
                await host.send("s", "steer", "sent before the cancel")
                assert await host.cancel("s")
                gate.set()
                owner = host.hosted("s")
                assert owner is not None and await owner.wait_idle(WAIT)
                for _ in range(3):  # enough scans to let an idle session go and take it back
                    await host.scan()
                    if (taken := host.hosted("s")) is not None:
                        assert await taken.wait_idle(WAIT)
                assert [e.reason for e in store.read("s") if isinstance(e, TurnStarted)] == ["prompt"]
                steer_from_elsewhere(store, "s", "a real send")
                await host.scan()
                await async_wait_until(lambda: replay(store.read("s")).transcript[-1].content == "answered a real send",
                            what="the next real send woke it")

        run(main)
