"""A pool of ``nous-inbox serve`` processes on one PostgreSQL: the sessions spread over them, a
SIGTERMed process hands its sessions over at their runs' next boundaries (a rolling restart: the
others take them at once, told by PostgreSQL, and carry the turns on), a SIGKILLed one's are all
taken once its leases expire; every acknowledged message is queued xor in the transcript."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from nous_inbox.events import MessageSent, SessionReleased, TurnEnded, TurnStarted
from nous_inbox.message import Message
from nous_inbox.session import replay
from nous_inbox.store import open_store
from nous_inbox.store.journal import send_to
from tests import postgres_server
from tests.helpers import wait_until
from tests.test_web_serve import WAIT, Served, start_serve

postgres_server.require_psycopg()

pytestmark = pytest.mark.slow

LEASE = 5.0  # seconds: long enough that a handover that waited for it would miss its deadline
SESSIONS = [f"s{i}" for i in range(9)]


@pytest.fixture
def pool(postgres_url: str) -> Iterator[tuple[str, list[Served]]]:
    url = f"{postgres_url}&lease={LEASE:g}"
    pace = {"NOUS_INBOX_SCRIPTED_STEPS": "60", "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0.1"}
    options = ("--agent", "nous_inbox.web.scripted:agent", "--scan-interval", "0.2",
               "--max-sessions", "9", "--drain-timeout", "5")
    hosts = [start_serve(url, *options, env=pace) for _ in range(3)]
    try:
        yield url, hosts
    finally:
        for host in hosts:
            if host.process.poll() is None:
                host.process.kill()
            host.process.wait()


def held_by(host: Served) -> set[str]:
    """The sessions ``host`` says it holds now (none once it is gone)."""
    try:
        with host.client() as client:
            return {s for s in SESSIONS if client.get(f"/api/sessions/{s}").json()["hosted"]}
    except Exception:  # stopped, or stopping
        return set()


def test_a_pool_spreads_the_sessions_hands_them_over_on_sigterm_and_takes_a_killed_ones(
        pool: tuple[str, list[Served]]) -> None:
    url, hosts = pool
    acknowledged: list[str] = []
    stop = threading.Event()

    def person() -> None:
        """Steers every session through every host in turn, noting each send a host
        acknowledged (202: stored)."""
        i = 0
        while not stop.is_set():
            session, host = SESSIONS[i % len(SESSIONS)], hosts[i % len(hosts)]
            i += 1
            try:
                with host.client() as client:
                    answer = client.post(f"/api/sessions/{session}/messages",
                                         json={"mode": "steer", "text": f"m{i}"})
            except Exception:  # a host stopped or killed: refused, never acknowledged
                continue
            if answer.status_code == 202:
                acknowledged.append(f"m{i}")
            stop.wait(0.02)

    with open_store(url) as store:
        # Sessions woken by sends no host received (as the command line's): the hosts' scans
        # find them all at once, and the pool's fair rule spreads them.
        for session in SESSIONS:
            send_to(store, session, Message.user(f"survey {session}"), "next_turn", True)
        spread = wait_until(lambda: (lambda held: held if sum(map(len, held)) == len(SESSIONS)
                                     else None)([held_by(host) for host in hosts]),
                            what="every session held by one host")
        assert sum(1 for held in spread if held) >= 2, spread
        print("sessions per process:", [len(held) for held in spread])
        talking = threading.Thread(target=person)
        talking.start()
        try:
            wait_until(lambda: len(acknowledged) > 5, what="steers under way")
            drained, killed, survivor = hosts
            handed = held_by(drained)
            marks = {s: store.version(s) for s in SESSIONS}
            began = time.monotonic()
            drained.process.terminate()  # SIGTERM: a rolling restart's

            def all_handed_over() -> bool:
                return handed <= held_by(killed) | held_by(survivor)

            wait_until(all_handed_over, timeout=LEASE,
                       what=f"the drained sessions {handed} held by the others")
            print(f"SIGTERM: {len(handed)} sessions held elsewhere after "
                  f"{time.monotonic() - began:.2f} s")
            assert drained.process.wait(WAIT) == 0
            lost = held_by(killed)
            began = time.monotonic()
            killed.process.kill()  # SIGKILL, mid-run
            killed.process.wait()
            wait_until(lambda: lost <= held_by(survivor),
                       what="the killed host's sessions held by the survivor", timeout=LEASE + 2)
            print(f"SIGKILL: {len(lost)} sessions held elsewhere after "
                  f"{time.monotonic() - began:.2f} s")
            n_before = len(acknowledged)
            wait_until(lambda: len(acknowledged) > n_before + 5, what="more steers, through the survivor")
        finally:
            stop.set()
            talking.join(WAIT)

        for session in SESSIONS:
            events = list(store.read(session))
            state = replay(events)
            queued = [m.content for m, _ in state.inbox.entries("next_step")]
            queued += [m.content for m, _ in state.inbox.entries("next_turn")]
            delivered = [m.content for m in state.transcript if m.role == "user"]
            counts = Counter(queued + delivered)
            assert all(n == 1 for n in counts.values()), f"{session}: a message was doubled"
            sent = {e.message.content for e in events if isinstance(e, MessageSent)}
            assert sent == set(counts), f"{session}: a stored message was lost"
            if session in handed:
                later = events[marks[session]:]
                released = [e for e in later if isinstance(e, SessionReleased)]
                assert released, f"{session}: its release was not recorded"
                if released[0].turn:  # let go at a boundary: ended as such, carried on at once
                    ends = [e.reason for e in later if isinstance(e, TurnEnded)]
                    opens = [e.reason for e in later if isinstance(e, TurnStarted)]
                    assert "released" in ends and "resumed" in opens, (session, ends, opens)
    assert set(acknowledged) <= {e for s in SESSIONS for e in _sent(url, s)}
    assert survivor.stop() == 0


def _sent(url: str, session: str) -> set[str]:
    with open_store(url) as store:
        return {e.message.content for e in store.read(session) if isinstance(e, MessageSent)}
