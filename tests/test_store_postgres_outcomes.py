"""A PostgreSQL append is never reported failed when it was written, and a paused host is cut off.

Backends terminated every 20 ms under four writers, and a server stopped in immediate mode for
longer than their ``reconnect``: every error an append raises is either a definite failure
(nothing was written: the writer sends the batch again as new) or ``OutcomeUnknownError`` (the
writer retries with the identity the error gives). Afterwards every acknowledged batch is there
once and whole, and none is there twice: a "failed" append that had been written would show as
a doubled batch. A host paused (SIGSTOP) while its append holds the stream's row is cut off by
the server, taken over within its lease and 2 s, and, resumed, writes nothing. A delete whose
``COMMIT`` reached the server but whose answer was lost never says nothing was done.

Waits are bounded polls of the server or events between threads, never sleeps as
synchronisation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nous_inbox import OutcomeUnknownError, StoreError, StreamOwnedError
from nous_inbox.events import Warned
from tests import postgres_server
from tests.helpers import wait_until

postgres_server.require_psycopg()  # skipped without psycopg, failed in CI; then imported:

import psycopg  # noqa: E402

from nous_inbox.store.postgres import PostgresStore  # noqa: E402
from nous_inbox.store.postgres.url import split_url  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0  # seconds; a bound for what should happen soon, never a sync sleep
BATCHES = 20  # per writer


class Writers:
    """Four writer threads, each with its own store, appending batches of three events and
    retrying each the way its error says until it is acknowledged."""

    def __init__(self, url: str, **options: Any) -> None:
        self.stores = [PostgresStore(f"{url}&application_name=nous-writer", **options)
                       for _ in range(4)]
        self.acknowledged: list[str] = []
        self.errors: list[BaseException] = []
        self.progress = threading.Condition()
        self.failing = threading.Event()  # set: each writer's next error is noted below
        self.erred = [threading.Event() for _ in self.stores]
        self.deadline = time.monotonic() + WAIT
        self.threads = [threading.Thread(target=self._write, args=(n,), daemon=True)
                        for n in range(len(self.stores))]

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in self.threads:
            thread.join(WAIT)
        for store in self.stores:
            store.close()

    def acknowledged_by_each(self, count: int) -> bool:
        with self.progress:
            return self.progress.wait_for(
                lambda: all(sum(a.startswith(f"w{n}-") for a in self.acknowledged) >= count
                            for n in range(len(self.stores))), WAIT)

    def _write(self, n: int) -> None:
        store = self.stores[n]
        for i in range(BATCHES):
            events = [Warned(text=f"w{n}-{i}-{j}") for j in range(3)]
            identity = None
            while time.monotonic() < self.deadline:
                # (No identity of its own: a first try is what any caller writes.)
                again = {} if identity is None else {"identity": identity}
                try:
                    store.append("s", events, **again)
                except OutcomeUnknownError as exc:
                    identity = exc.identity  # as the error says: again, with its identity
                    self._failed(n, exc)
                except StoreError as exc:
                    identity = None  # nothing was written: sent again as a new append
                    self._failed(n, exc)
                else:
                    with self.progress:
                        self.acknowledged.append(f"w{n}-{i}")
                        self.progress.notify_all()
                    break

    def _failed(self, n: int, exc: BaseException) -> None:
        with self.progress:
            self.errors.append(exc)
        if self.failing.is_set():
            self.erred[n].set()

    def check(self, url: str) -> None:
        """Every acknowledged batch there once and whole, none twice; every error definite or
        an unknown outcome."""
        assert len(self.acknowledged) == 4 * BATCHES, "a writer ran out of time"
        with PostgresStore(url) as store:
            texts = [e.text for e in store.read("s")]  # type: ignore[attr-defined]
        assert len(texts) == len(set(texts)), "an append reported failed had been written"
        batches = Counter(text.rsplit("-", 1)[0] for text in texts)
        assert all(n == 3 for n in batches.values()), "a batch was written in part"
        assert set(batches) == set(self.acknowledged)
        for exc in self.errors:
            assert isinstance(exc, OutcomeUnknownError) or "nothing was" in str(exc), exc
            assert "pipeline" not in str(exc), exc


def test_backends_terminated_every_20ms_under_four_writers_lose_double_and_misreport_nothing(
    postgres_url: str,
) -> None:
    stop = threading.Event()
    terminated: list[Any] = []

    def terminate() -> None:
        with PostgresStore(postgres_url) as admin, admin.connect() as db:
            while not stop.is_set():
                terminated.extend(db.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'nous-writer'").fetchall())
                stop.wait(0.02)  # the pace of the disturbance, not a synchronisation

    killer = threading.Thread(target=terminate, daemon=True)
    with Writers(postgres_url, reconnect=2) as writers:
        killer.start()
        try:
            writers.acknowledged_by_each(BATCHES)
        finally:
            stop.set()
            killer.join(WAIT)
    assert terminated  # the writers' connections really were cut, again and again
    writers.check(postgres_url)


def test_a_server_stopped_for_longer_than_reconnect_loses_doubles_and_misreports_nothing(
    postgres: Any, postgres_url: str,
) -> None:
    if postgres.cluster is None:
        # A server named by NOUS_INBOX_TEST_POSTGRES may not be restarted: a private one.
        with postgres_server.for_tests(private=True) as own:
            url, _ = own.fresh_url()
            _outage_under_writers(own, url)
        return
    _outage_under_writers(postgres, postgres_url)


def _outage_under_writers(postgres: Any, url: str) -> None:
    with Writers(url, reconnect=0.3) as writers:
        assert writers.acknowledged_by_each(5)
        writers.failing.set()
        postgres.cluster.stop("immediate")
        try:
            # Down until every writer has given up once: the outage outlasted its reconnect.
            assert all(erred.wait(WAIT) for erred in writers.erred)
        finally:
            postgres.cluster.start()
    writers.check(url)


PAUSED = r"""
import sys
from nous_inbox.errors import LeaseLostError
from nous_inbox.events import Warned
from nous_inbox.store.postgres import PostgresStore

store = PostgresStore(sys.argv[1])
print("owned", store.own("s").epoch, flush=True)
# Non-ASCII text is proved by decoding it: a wider gap between an append's two round trips.
text = "\u00e9" * 2000
try:
    for i in range(1000000):
        store.append("s", [Warned(text=f"{i}-{j}-{text}") for j in range(50)])
        print("acked", i, flush=True)
except LeaseLostError:
    print("fenced", flush=True)
"""


def _holding_the_row(db: psycopg.Connection[Any], schema: str) -> bool:
    """Whether the paused writer's backend holds the stream row's lock, waiting for its client."""
    row = db.execute(
        "SELECT a.state, a.wait_event FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
        "WHERE a.application_name = 'nous-paused' AND l.granted AND l.mode = 'RowShareLock' "
        "AND l.relation = to_regclass(%s)", (f'"{schema}".nous_inbox_streams',),
    ).fetchone()
    return row is not None and (row[0] == "idle in transaction"
                                or (row[0] == "active" and row[1] == "ClientRead"))


def test_a_host_paused_holding_its_streams_row_is_taken_over_and_resumed_writes_nothing(
    postgres_url: str,
) -> None:
    lease = 2.0
    url = f"{postgres_url}&lease={lease:g}"
    writer = subprocess.Popen(
        [sys.executable, "-c", PAUSED, f"{url}&application_name=nous-paused"], cwd=ROOT,
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert writer.stdout is not None
    lines: list[str] = []
    said = threading.Condition()

    def read() -> None:
        assert writer.stdout is not None
        for line in writer.stdout:
            with said:
                lines.append(line.strip())
                said.notify_all()

    threading.Thread(target=read, daemon=True).start()
    try:
        with said:
            assert said.wait_for(lambda: lines, WAIT) and lines[0] == "owned 1"
        with PostgresStore(url) as winner, winner.connect() as db:
            # Hunt for the moment the writer holds the row between its round trips: stop it,
            # and keep it stopped only if its backend still holds the row, waiting for it.
            stopped: list[float] = []

            def caught() -> bool:
                if not _holding_the_row(db, winner.schema):
                    return False
                os.kill(writer.pid, signal.SIGSTOP)
                stopped[:] = [time.monotonic()]
                if _holding_the_row(db, winner.schema):
                    return True
                os.kill(writer.pid, signal.SIGCONT)
                return False

            wait_until(caught, what="the writer caught holding its stream's row", timeout=WAIT,
                       pace=0)
            paused = stopped[0]
            taken: list[Any] = []

            def take() -> bool:
                try:
                    taken.append(winner.own("s"))
                except StreamOwnedError:
                    return False
                return True

            wait_until(take, what="the paused host's session taken within its lease + 2 s",
                       timeout=lease + 2 - (time.monotonic() - paused), pace=0.02)
            assert taken[0].epoch == 2
            winner.append("s", [Warned(text="from the new owner")])
            os.kill(writer.pid, signal.SIGCONT)
            with said:
                assert said.wait_for(lambda: lines[-1] == "fenced", WAIT), lines[-3:]
                acked = {line.split()[1] for line in lines if line.startswith("acked")}
            texts = [e.text for e in winner.read("s")]  # type: ignore[attr-defined]
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        writer.kill()
        writer.wait(WAIT)
    assert texts[-1] == "from the new owner"  # the resumed host wrote nothing after it
    batches = Counter(text.split("-", 1)[0] for text in texts[:-1])
    assert set(batches) == acked and all(n == 50 for n in batches.values())


class AnswerLost:
    """A TCP relay to the server that, once ``armed``, passes a client's ``COMMIT`` on and cuts
    that client off before the answer: the server commits, the client learns nothing."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = threading.Event()
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
                threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, to_server: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if to_server and b"COMMIT" in data and self.armed.is_set() and not self.cut.is_set():
                    self.cut.set()
                    source.shutdown(socket.SHUT_RDWR)  # first: no answer can reach the client
                    sink.sendall(data)  # and the server, still connected, commits
                    return
                sink.sendall(data)

    def close(self) -> None:
        self.listener.close()


def test_a_delete_whose_commit_answer_was_lost_never_says_nothing_was_done(
    postgres_url: str,
) -> None:
    params = split_url(postgres_url).params
    if not params.get("host", "").startswith("127.") or "port" not in params:
        pytest.skip("the relay needs the server on a loopback port")
    relay = AnswerLost(params["host"], int(params["port"]))
    url = postgres_url.replace(f"{params['host']}:{params['port']}", f"127.0.0.1:{relay.port}")
    try:
        with PostgresStore(url, reconnect=0) as store, PostgresStore(postgres_url) as other:
            store.append("s", [Warned(text="a")])
            with store.own("s"):
                relay.armed.set()
                with pytest.raises(StoreError) as caught:
                    store.delete("s")
                assert relay.cut.is_set()
                assert "nothing was done" not in str(caught.value), caught.value
                assert "not known" in str(caught.value), caught.value
                wait_until(lambda: other.version("s") == 0, what="the delete was done",
                           timeout=WAIT)
    finally:
        relay.close()
