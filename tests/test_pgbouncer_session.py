"""The PostgreSQL store behind a real PgBouncer in session pooling: everything works as direct.

A client of a session pooler keeps one server connection for as long as it is connected, so the
store needs nothing said (no ``pooler=``): its session settings, prepared statements and LISTEN
stay with it. Here a slice of the store's own tests runs again through such a PgBouncer (each
test's ``postgres_url`` names the PgBouncer): appends, leases and their takeover, a stale
owner fenced, a killed host taken over, a run steered by the command line from another process,
wake-ups by NOTIFY. See ``tests/pgbouncer_server.py`` for the PgBouncer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from nous_inbox.events import Warned
from tests import pgbouncer_server, postgres_server

postgres_server.require_psycopg()  # skipped without psycopg, failed in CI; then imported:

import psycopg  # noqa: E402

from nous_inbox.store.postgres import PostgresStore  # noqa: E402
from tests.test_store_postgres import (  # noqa: E402, F401  (run again through PgBouncer)
    pg,
    test_a_held_lease_is_renewed_and_a_taken_one_is_noticed,
    test_a_lease_is_refused_while_it_lasts_and_taken_over_once_it_expired,
    test_a_notification_that_arrives_during_a_renewal_still_wakes_at_once,
    test_a_stale_owner_is_fenced_and_writes_nothing,
    test_a_subscriber_is_woken_by_an_append_from_another_store,
    test_a_subscriber_of_another_stream_is_not_woken,
    test_an_append_is_one_transaction_even_for_many_events,
    test_an_event_too_large_in_a_shared_batch_fails_only_its_sender,
    test_an_idle_owner_learns_of_a_takeover_from_its_lease_renewal,
    test_appending_needs_no_lease_and_is_not_fenced_by_anothers,
    test_taking_a_lease_from_a_stuck_writer_is_refused_as_owned_and_does_not_wait,
)
from tests.test_store_postgres_processes import (  # noqa: E402, F401
    test_a_killed_host_is_taken_over_after_its_lease_and_loses_no_message,
    test_an_idle_owner_is_woken_by_the_notification_of_a_cli_steer,
    test_an_owner_on_postgres_resumes_where_the_last_one_stopped,
    test_run_on_postgres_is_steered_by_the_cli_from_another_process,
    test_two_processes_racing_for_a_session_one_wins,
)

WAIT = 30  # seconds; a bound for a wait that should end at once, never a sync sleep


@pytest.fixture(scope="module")
def bouncer(postgres: postgres_server.Server) -> Iterator[pgbouncer_server.Bouncer]:
    with pgbouncer_server.bouncer(postgres, "session") as running:
        yield running


@pytest.fixture
def postgres_url(postgres: postgres_server.Server,
                 bouncer: pgbouncer_server.Bouncer) -> Iterator[str]:
    """A URL through the session-pooling PgBouncer, naming a schema of its own (dropped after)."""
    url, schema = bouncer.fresh_url(postgres)
    yield url
    postgres.drop(schema)


def test_the_store_opens_behind_a_session_pooler_with_nothing_said(postgres_url):
    with PostgresStore(postgres_url) as store:
        assert store.pooler is None
        store.append("s", [Warned(text="through PgBouncer")])
        assert [e.text for e in store.read("s")] == ["through PgBouncer"]


def test_the_session_settings_stay_with_the_stores_connection(postgres_url):
    with PostgresStore(postgres_url, lease=4) as store, store.connect() as db:
        for _ in range(3):  # one transaction each: a session pooler keeps the server connection
            row = db.execute("SHOW idle_in_transaction_session_timeout").fetchone()
            assert row == ("2s",)


def test_a_subscriber_hears_notify_through_the_pooler_and_not_the_poll(postgres_url):
    with PostgresStore(postgres_url, poll=3600) as watcher, PostgresStore(postgres_url) as sender:
        ready, woken = threading.Event(), threading.Event()
        watcher.subscribe("s", lambda: (ready.set(), watcher.version("s") and woken.set()))
        assert ready.wait(WAIT)
        assert watcher.listening
        sender.append("s", [Warned(text="wake")])
        assert woken.wait(WAIT)  # the poll is an hour away


def test_the_backend_pid_is_the_servers_process_not_the_poolers_key(postgres, postgres_url):
    with PostgresStore(postgres_url) as store, psycopg.connect(postgres.url) as direct:
        pid = store.backend_pid
        assert pid is not None
        rows = direct.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                              (pid,)).fetchone()
        assert rows == (1,)
