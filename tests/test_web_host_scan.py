"""SessionHost.scan on every store: a look costs what moved since the last one, yet still finds
each session that wants a wake: one another store instance sent to, one appended to while the
host held nothing, and one whose holder died. Driven by calling ``host.scan()``."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from nous_inbox.events import MessageSent
from nous_inbox.message import Message
from nous_inbox.store import Moved, Store, open_store
from nous_inbox.verbs import Target
from nous_inbox.web.host import SessionHost
from tests.helpers import PACE, WAIT
from tests.test_web_host import answered, echo, steer_from_elsewhere

HOLDER = """
import sys
from nous_inbox.store import open_store
store = open_store(sys.argv[1])
lease = store.own(sys.argv[2])
print("held", flush=True)
sys.stdin.read()
"""


def inject_from_elsewhere(store: Store, session: str) -> None:
    """A message that wakes nothing (ruling 9): the session stays idle."""
    store.append(session, [MessageSent(target=Target.NEXT_STEP, wakeup=False,
                                       message=Message.user("fyi"))])


def hosting(store: Store, check: Callable[[SessionHost], Awaitable[None]]) -> None:
    async def main() -> None:
        async with SessionHost(store, echo, scan_interval=None) as host:
            await check(host)

    asyncio.run(main())


async def scan_until(host: SessionHost, predicate: Callable[[], object], *, what: str) -> None:
    """Look again (``host.scan()``) until ``predicate`` holds, up to a deadline that only bounds
    a hang: a lease another holder left is tried again only after a pause."""
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT:g} s: {what}")
        await host.scan()
        await asyncio.sleep(PACE)


async def taken(host: SessionHost, held: list[str]) -> None:
    """Wait until ``host`` holds ``held``: a scan takes what wants a wake in the background,
    after the pool's fair delay (a deadline only bounds a hang)."""
    deadline = time.monotonic() + WAIT
    while host.held != held:
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT:g} s: {held} taken (holds {host.held})")
        await asyncio.sleep(PACE)


@contextmanager
def other_instance(url: str, store: Store) -> Iterator[Store]:
    """Another store instance on the same store (``memory:`` has only the one)."""
    if url == "memory:":
        yield store
        return
    with open_store(url) as other:
        yield other


def test_the_scan_takes_a_session_another_store_instance_sent_to(url: str, store: Store) -> None:
    inject_from_elsewhere(store, "quiet")

    async def check(host: SessionHost) -> None:
        await host.scan()  # the first look: nothing wants a wake
        assert host.held == []
        with other_instance(url, store) as other:
            steer_from_elsewhere(other, "waiting", "go")
        await host.scan()
        await taken(host, ["waiting"])
        await scan_until(host, lambda: answered(store, "waiting"), what="the session ran")

    hosting(store, check)


def test_the_scan_takes_a_session_appended_to_while_it_held_nothing(store: Store) -> None:
    async def check(host: SessionHost) -> None:
        await host.scan()
        inject_from_elsewhere(store, "s")
        await host.scan()
        assert host.held == []
        steer_from_elsewhere(store, "s", "go")  # the host's own store, not through the host
        await host.scan()
        await taken(host, ["s"])

    hosting(store, check)


def test_the_scan_takes_a_session_whose_holder_died(url: str, store: Store) -> None:
    if url == "memory:":  # no other process: the holder is another owner that lets go
        holder: Any = store.own("s")
        die = holder.release
    else:
        if url.startswith("postgresql"):
            url += "&lease=1"  # a dead holder's lease lapses after this long
        process = subprocess.Popen([sys.executable, "-c", HOLDER, url, "s"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None and process.stdout.readline() == "held\n"

        def die() -> None:
            process.kill()
            process.wait()

    try:
        async def check(host: SessionHost) -> None:
            await host.scan()
            steer_from_elsewhere(store, "s", "go")  # sent while its holder lived
            await host.scan()
            assert host.held == []  # held elsewhere
            die()
            await scan_until(host, lambda: host.held == ["s"], what="the dead holder's session taken")
            await scan_until(host, lambda: answered(store, "s"), what="the session ran")

        hosting(store, check)
    finally:
        die()


class Counting:
    """A store that counts the calls made to it, by name."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()
        self.touched: set[str] = set()  # the streams named in the calls

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if not callable(found):
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if args and isinstance(args[0], str):
                self.touched.add(args[0])
            return found(*args, **kwargs)

        return counted


def test_an_idle_look_reads_no_session_and_lists_no_stream(store: Store) -> None:
    for i in range(50):
        inject_from_elsewhere(store, f"idle-{i}")
    counting = Counting(store)

    async def check(host: SessionHost) -> None:
        await host.scan()  # the first look is a full one
        assert host.held == []
        counting.calls.clear()
        counting.touched.clear()
        for _ in range(3):
            await host.scan()
        assert counting.calls == Counter({"moved": 3})
        steer_from_elsewhere(store, "idle-7", "go")
        await host.scan()
        await taken(host, ["idle-7"])
        assert counting.touched == {"idle-7"}  # that session's log alone was read

    hosting(cast(Store, counting), check)


def test_moved_is_part_of_the_store_protocol(store: Store) -> None:
    assert isinstance(store.moved(), Moved)


def test_a_session_skipped_while_its_lease_is_retried_later_is_still_looked_at() -> None:
    # A send to a session another holder has is appended; the host tries its lease again only
    # after a pause, so the next look skips it. That look's cursor moves past the send all the
    # same: the session must stay on the host's list, or once its holder dies nobody serves it.
    store = open_store("memory:")
    elsewhere = store.own("s")

    async def check(host: SessionHost) -> None:
        await host.scan()
        await host.send("s", "steer", "go")  # held elsewhere: appended to the log
        await host.scan()  # skipped: its lease is tried again later
        elsewhere.release()  # the other holder dies
        await scan_until(host, lambda: host.held == ["s"], what="the session taken")

    hosting(store, check)
