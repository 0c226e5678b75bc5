"""Two ``nous-inbox serve`` processes on one PostgreSQL: they share the sessions (each held by one,
by lease), and when the one running a session is SIGKILLed mid-run the other takes it over once
the lease has expired and carries on, with every acknowledged message queued xor in the
transcript."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from nous_inbox.events import TurnEnded, TurnStarted
from nous_inbox.session import replay
from nous_inbox.store import open_store
from tests import postgres_server
from tests.helpers import wait_until
from tests.test_web_serve import WAIT, Served, start_serve

postgres_server.require_psycopg()

LEASE = 2.0  # seconds: the store's lease, so a dead host's sessions wait this long at most


@pytest.fixture
def two_hosts(postgres_url: str) -> Iterator[tuple[str, Served, Served]]:
    url = f"{postgres_url}&lease={LEASE:g}"
    pace = {"NOUS_INBOX_SCRIPTED_STEPS": "40", "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0.1"}
    options = ("--agent", "nous_inbox.web.scripted:agent", "--scan-interval", "0.1")
    hosts = [start_serve(url, *options, env=pace) for _ in range(2)]
    try:
        yield url, hosts[0], hosts[1]
    finally:
        for host in hosts:
            if host.process.poll() is None:
                host.process.kill()
            host.process.wait()


def holder(hosts: list[Served], session: str) -> Served | None:
    """The host that says it holds ``session`` now."""
    for host in hosts:
        with host.client() as client:
            shown = client.get(f"/api/sessions/{session}")
            if shown.status_code == 200 and shown.json()["hosted"]:
                return host
    return None


def test_a_killed_host_is_taken_over_by_the_other_within_the_lease_and_loses_nothing(
        two_hosts: tuple[str, Served, Served]) -> None:
    url, first, second = two_hosts
    with first.client() as client:
        assert client.post("/api/sessions/s/messages",
                           json={"mode": "prompt", "text": "survey the logs"}).status_code == 202
    running = wait_until(lambda: holder([first, second], "s"), what="one host runs the session")
    survivor = second if running is first else first

    acknowledged: list[str] = []
    stop = threading.Event()

    def person() -> None:
        """Steers through both hosts, noting each send a host acknowledged (202: stored)."""
        i = 0
        while not stop.is_set():
            for host in (first, second):
                try:
                    with host.client() as client:
                        answer = client.post("/api/sessions/s/messages",
                                             json={"mode": "steer", "text": f"m{i}"})
                except Exception:  # the killed host: refused, never acknowledged
                    continue
                finally:
                    i += 1
                if answer.status_code == 202:
                    acknowledged.append(f"m{i - 1}")
            stop.wait(0.05)

    with open_store(url) as store:
        talking = threading.Thread(target=person)
        talking.start()
        try:
            wait_until(lambda: store.version("s") > 40 and len(acknowledged) > 4,
                what="the run is well on")
            running.process.kill()  # SIGKILL, mid-run
            running.process.wait()
            before = store.version("s")

            def carried_on() -> bool:
                later = list(store.read("s", before))
                return any(isinstance(e, TurnStarted) for e in later)

            wait_until(carried_on,
                what="the other host took the session over and ran it", timeout=LEASE + 2)
            assert holder([survivor], "s") is survivor
            wait_until(lambda: len(acknowledged) > 10, what="more sends, through the survivor")
        finally:
            stop.set()
            talking.join(WAIT)

        def finished() -> bool:
            session = replay(store.read("s"))
            return not session.running and not session.inbox.worth_waking()

        wait_until(finished, what="the survivor answered everything")
        events = list(store.read("s"))
    session = replay(events)
    interrupted = [e for e in events if isinstance(e, TurnEnded) and e.reason == "error"]
    assert len(interrupted) == 1 and "interrupted" in interrupted[0].error
    queued = [m.content for m, _ in session.inbox.entries("next_step")]
    delivered = [m.content for m in session.transcript if m.role == "user"]
    counts = Counter(queued + delivered)
    assert all(n == 1 for n in counts.values()), "a message was doubled"
    assert set(acknowledged) <= set(counts), "an acknowledged message was lost"
    assert survivor.stop() == 0
