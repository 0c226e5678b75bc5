"""The PostgreSQL store behind a real PgBouncer in transaction pooling.

A client of a transaction pooler has a server connection only while a transaction runs, and the
next transaction may get another one: session settings, prepared statements and LISTEN do not
stay with it. With ``pooler=transaction`` the store keeps no state in a session (its bounds are
set per transaction, its leases are rows) and its subscribers are woken by the poll. Here a slice
of the store's own tests runs again through such a PgBouncer with ``pooler=transaction``
(appends, leases, takeover, a stale owner fenced, a killed host taken over, a stuck row, a run
steered by the command line from another process); no server connection of the pool is left
with a setting, a LISTEN or a prepared statement of the store's; and without
``pooler=transaction`` the store refuses to open, saying why and what to set. See
``tests/pgbouncer_server.py`` for the PgBouncer.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nous_inbox.errors import StoreError
from nous_inbox.events import Warned
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from tests import pgbouncer_server, postgres_server

postgres_server.require_psycopg()  # skipped without psycopg, failed in CI; then imported:

import psycopg  # noqa: E402

from nous_inbox.store.postgres import PostgresStore  # noqa: E402
from tests.test_store_postgres import (  # noqa: E402, F401  (run again through PgBouncer)
    pg,
    test_a_lease_is_refused_while_it_lasts_and_taken_over_once_it_expired,
    test_a_lost_lease_is_not_a_concurrency_error_so_a_journal_never_retries_it,
    test_a_stale_owner_is_fenced_and_writes_nothing,
    test_an_append_is_one_transaction_even_for_many_events,
    test_an_event_too_large_in_a_shared_batch_fails_only_its_sender,
    test_an_idle_owner_learns_of_a_takeover_from_its_lease_renewal,
    test_appending_needs_no_lease_and_is_not_fenced_by_anothers,
    test_behind_a_transaction_pooler_a_stuck_row_does_not_stop_the_renewal_of_other_leases,
    test_the_poll_backstop_nudges_without_any_notification,
)
from tests.test_store_postgres_processes import (  # noqa: E402, F401
    ENV,
    ROOT,
    model,
    test_a_killed_host_is_taken_over_after_its_lease_and_loses_no_message,
    test_a_stale_owner_cannot_run_the_session_beside_its_successor,
    test_an_owner_on_postgres_resumes_where_the_last_one_stopped,
    test_run_on_postgres_is_steered_by_the_cli_from_another_process,
    test_two_processes_racing_for_a_session_one_wins,
    work,
)

WAIT = 30  # seconds; a bound for a wait that should end at once, never a sync sleep


@pytest.fixture(scope="module")
def bouncer(postgres: postgres_server.Server) -> Iterator[pgbouncer_server.Bouncer]:
    with pgbouncer_server.bouncer(postgres, "transaction") as running:
        yield running


@pytest.fixture
def bare_url(postgres: postgres_server.Server,
             bouncer: pgbouncer_server.Bouncer) -> Iterator[str]:
    """A URL through the transaction-pooling PgBouncer, with a schema of its own and no
    ``pooler=``."""
    url, schema = bouncer.fresh_url(postgres)
    yield url
    postgres.drop(schema)


@pytest.fixture
def postgres_url(bare_url: str) -> str:
    """What the store's own tests take as their URL: through the transaction pooler, said."""
    return f"{bare_url}&pooler=transaction"


# -- without pooler=transaction: refused at open ----------------------------------------------------


@pytest.mark.parametrize("said", ["", "&pooler=session"])
def test_a_transaction_pooler_not_declared_is_refused_at_open_saying_what_to_set(bare_url, said):
    with pytest.raises(StoreError) as refused:
        PostgresStore(bare_url + said)
    message = str(refused.value)
    assert message.startswith(f"{bare_url}{said}: the server is reached through a pooler in "
                              f"transaction mode")
    assert "did not hear a NOTIFY" in message  # why
    assert "add pooler=transaction to the URL" in message  # what to set


def test_the_command_line_says_the_same_and_fails(bare_url):
    done = subprocess.run(
        [sys.executable, "-m", "nous_inbox", "steer", "--create", "--store", bare_url, "s", "hi"],
        capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
    assert done.returncode != 0
    assert "add pooler=transaction to the URL" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_refused_store_creates_nothing(postgres, bare_url):
    with pytest.raises(StoreError):
        PostgresStore(bare_url)
    schema = bare_url.rpartition("schema=")[2]
    with psycopg.connect(postgres.url) as db:
        assert db.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone() == (None,)


# -- with pooler=transaction: it works, keeping nothing in a session --------------------------------


def test_owners_wake_by_the_poll_for_a_steer_from_another_process(postgres_url):
    url = f"{postgres_url}&poll=0.2"  # no LISTEN here: the poll is what wakes an idle owner
    answered = threading.Event()
    with open_store(url) as store, Owner(
        store, "s", Runner(model, [work]),
        listen=lambda e: answered.set() if type(e).__name__ == "TurnEnded" else None,
    ) as owner:
        assert store.listening  # connected: its leases renewed, its subscribers polled
        steer = subprocess.run(
            [sys.executable, "-m", "nous_inbox", "steer", "--create", "--store", url, "s",
             "wake up"], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=120)
        assert steer.returncode == 0, steer.stderr
        assert answered.wait(WAIT)
        assert owner.wait_idle(WAIT)
        assert [m.content for m in owner.transcript][:1] == ["wake up"]


def session_state(db: psycopg.Connection[Any]) -> tuple[Any, ...]:
    """What a server connection carries beyond a transaction: settings, LISTENs, statements."""
    row = db.execute(
        "SELECT current_setting('idle_in_transaction_session_timeout'), "
        "current_setting('lock_timeout'), current_setting('tcp_keepalives_idle'), "
        "(SELECT count(*) FROM pg_listening_channels()), "
        "(SELECT count(*) FROM pg_prepared_statements)").fetchone()
    assert row is not None
    return tuple(row)


def test_no_server_connection_is_left_with_the_stores_session_state(postgres):
    # A pool of two server connections, both used by the store (its main and background
    # connections at once), then both looked at together: each one a transaction holds.
    with pgbouncer_server.bouncer(postgres, "transaction", pool_size=2) as small:
        url, schema = small.fresh_url(postgres)
        try:
            with psycopg.connect(small.url, autocommit=True) as db:
                clean = session_state(db)
            with PostgresStore(f"{url}&pooler=transaction", lease=0.6, poll=0.05) as store:
                polled = threading.Semaphore(0)
                store.subscribe("s", polled.release)
                store.own("s")
                for i in range(20):  # beside the renewals and polls of the background thread
                    store.append("s", [Warned(text=str(i))])
                    store.read("s")
                assert all(polled.acquire(timeout=WAIT) for _ in range(3))
            looks = [psycopg.connect(small.url, autocommit=True) for _ in range(2)]
            try:
                for db in looks:
                    db.execute("BEGIN")  # holds its server connection until the end
                backends = {db.execute("SELECT pg_backend_pid()").fetchone() for db in looks}
                assert len(backends) == 2
                assert [session_state(db) for db in looks] == [clean, clean]
            finally:
                for db in looks:
                    db.close()
        finally:
            postgres.drop(schema)


def test_the_backend_pid_is_none_as_no_server_process_is_the_stores(postgres_url):
    with PostgresStore(postgres_url) as store:
        store.append("s", [Warned(text="a")])
        assert store.backend_pid is None
