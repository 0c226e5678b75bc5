"""The PostgreSQL store's own promises, against a real server (see ``tests/postgres_server.py``).

The store contract every store keeps runs in ``test_store.py`` and ``test_store_lease.py`` with the
``postgres`` kind. Here: what only this store does. Its URL parameters; the schema it creates and
versions; leases that expire on the database clock, fenced by an epoch so a stale owner writes
nothing; an append whose answer was lost is recognised by its batch id, neither lost nor doubled;
wake-up hints by LISTEN/NOTIFY; no prepared statements behind a transaction pooler.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nous_inbox import (
    ConcurrencyError,
    LeaseLostError,
    OutcomeUnknownError,
    StoreError,
    StreamOwnedError,
    replay,
)
from nous_inbox.events import SCHEMA_VERSION, Warned
from nous_inbox.owner import GroupCommitState
from nous_inbox.store import open_store
from nous_inbox.store.journal import Journal
from tests import postgres_server
from tests.helpers import wait_until

postgres_server.require_psycopg()  # skipped without psycopg, failed in CI; then imported:

import psycopg  # noqa: E402

from nous_inbox.store.postgres import PostgresLease, PostgresStore  # noqa: E402
from nous_inbox.store.postgres import store as postgres_store  # noqa: E402

WAIT = 30  # seconds; a bound for a wait that should end at once, never a sync sleep


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_url) as store:
        yield store


def sql(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run ``query`` on a connection of our own (as another host, or an operator, would)."""
    with PostgresStore(url, read_only=True) as store, store.connect() as db:
        cursor = db.execute(query.replace("SCHEMA", store.schema), params)
        return cursor.fetchall() if cursor.description else []


class OutOfReach(PostgresStore):
    """A store whose new connections are refused while ``refused()`` says so, as when its
    server is out of reach (the connections it has stay up); ``attempts`` counts the refusals."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.refused: Callable[[], bool] = lambda: False
        self.attempts = 0
        super().__init__(*args, **kwargs)

    def connect(self) -> psycopg.Connection[Any]:
        if self.refused():
            self.attempts += 1
            raise psycopg.OperationalError("connection refused: the server is out of reach")
        return super().connect()


def expire(url: str, stream: str, holder: PostgresStore) -> None:
    """Make ``stream``'s lease expire now, as if ``holder`` had stopped renewing long ago (its
    renewals are stopped first, as a paused or partitioned host's would be)."""
    assert holder._background is not None
    holder._background.stop()
    sql(url, "UPDATE \"SCHEMA\".nous_inbox_streams SET expires = now() - interval '1 second' "
             "WHERE stream = %s", stream)


# -- URLs and the schema ------------------------------------------------------------------------


def test_open_store_opens_postgresql_urls(postgres_url):
    with open_store(postgres_url) as store:
        assert isinstance(store, PostgresStore) and store.url == postgres_url
        store.append("s", [Warned(text="a")])
    with open_store(postgres_url.replace("postgresql://", "postgres://")) as again:
        assert [e.text for e in again.read("s")] == ["a"]


def test_the_url_never_shows_a_password(postgres_url):
    url = postgres_url.replace("nous@", "nous:secret@")
    with PostgresStore(url) as store:
        assert "secret" not in store.url and "secret" not in repr(store)
        assert store.url == postgres_url.replace("nous@", "nous:***@")


@pytest.mark.parametrize("secret", ["password", "sslpassword"])
def test_the_url_never_shows_a_password_given_as_a_query_parameter(postgres_url, secret):
    sep = "&" if "?" in postgres_url else "?"
    with PostgresStore(f"{postgres_url}{sep}{secret}=s3cret") as store:
        assert "s3cret" not in store.url and "s3cret" not in repr(store)
        assert store.url.endswith(f"{secret}=***")


@pytest.mark.parametrize(("query", "message"), [
    ("schema=bad-name", "schema must be a plain SQL name"),
    ("lease=0", "lease must be a positive number of seconds"),
    ("lease=soon", "lease must be a positive number of seconds"),
    ("poll=-1", "poll must be a positive number of seconds"),
    ("pooler=statement", "pooler must be 'transaction' or 'session'"),
    ("reconnect=-1", "reconnect must be a positive number of seconds"),
    ("reconnect=later", "reconnect must be a positive number of seconds"),
])
def test_bad_parameters_are_refused_naming_them(postgres, query, message):
    with pytest.raises(ValueError, match=message):
        open_store(f"{postgres.url}?{query}")


def test_parameters_reach_the_store_and_not_libpq(postgres_url):
    with open_store(f"{postgres_url}&lease=7.5&poll=0.5") as store:
        assert (store.lease, store.poll) == (7.5, 0.5)


def test_reconnect_is_a_parameter_and_zero_means_no_retry(postgres_url):
    with open_store(f"{postgres_url}&reconnect=2.5") as store:
        assert store.reconnect == 2.5
    for zero in ("0", "0.0", "0e0"):
        with open_store(f"{postgres_url}&reconnect={zero}") as store:
            assert store.reconnect == 0
    with PostgresStore(f"{postgres_url}&reconnect=2.5", reconnect=4) as store:
        assert store.reconnect == 4  # the keyword wins


def test_the_urls_own_connect_timeout_reaches_libpq_and_the_keyword_wins(postgres_url):
    with PostgresStore(f"{postgres_url}&connect_timeout=7") as store, store.connect() as db:
        assert "connect_timeout=7" in db.info.dsn
    with PostgresStore(f"{postgres_url}&connect_timeout=7", connect_timeout=3) as store, \
            store.connect() as db:
        assert "connect_timeout=3" in db.info.dsn
    with PostgresStore(postgres_url) as store, store.connect() as db:
        assert "connect_timeout=5" in db.info.dsn  # ours, when neither says


def test_closing_releases_the_leases_and_stops_the_background_thread(postgres_url):
    store = PostgresStore(postgres_url)
    store.own("s")
    store.subscribe("s", lambda: None)
    wait_until(lambda: store.listening, what="the renewals began", timeout=WAIT)
    store.close()
    assert not store.listening
    # Joined: nothing renews or nudges after close.
    assert not [t for t in threading.enumerate() if t.name == f"nous-inbox {store.url}"]
    assert sql(postgres_url, 'SELECT holder FROM "SCHEMA".nous_inbox_streams') == [(None,)]
    with pytest.raises(ValueError, match="closed"):
        store.own("t")
    with pytest.raises(ValueError, match="closed"):
        store.subscribe("s", lambda: None)
    store.close()  # twice is fine


def test_a_server_that_does_not_answer_is_a_store_error_naming_the_url():
    url = "postgresql://nobody@127.0.0.1:1/none"
    with pytest.raises(StoreError, match=r"^postgresql://nobody@127.0.0.1:1/none: cannot connect"):
        open_store(url)


def test_read_only_opening_of_an_empty_schema_creates_nothing(postgres, postgres_url):
    with pytest.raises(StoreError, match=r"no store in schema .* nothing was created"):
        open_store(postgres_url, read_only=True)
    schema = postgres_url.rsplit("schema=", 1)[1]
    with psycopg.connect(postgres.url) as db:
        assert db.execute("SELECT count(*) FROM information_schema.tables "
                          "WHERE table_schema = %s", (schema,)).fetchone() == (0,)


def test_the_schema_records_its_format_and_versions(pg, postgres_url):
    rows = dict(sql(postgres_url, 'SELECT key, value FROM "SCHEMA".nous_inbox_meta'))
    assert rows == {"format": "nous-inbox", "version": str(SCHEMA_VERSION), "tables": "1"}


def test_a_newer_table_layout_is_refused(pg, postgres_url):
    sql(postgres_url, "UPDATE \"SCHEMA\".nous_inbox_meta SET value = '99' WHERE key = 'tables'")
    with pytest.raises(ValueError, match="tables 99, newer than this nous-inbox reads"):
        open_store(postgres_url)


def test_someone_elses_tables_are_refused(pg, postgres_url):
    sql(postgres_url, 'DROP TABLE "SCHEMA".nous_inbox_events')
    with pytest.raises(StoreError, match="is not a usable PostgreSQL store"):
        open_store(postgres_url)


def test_a_store_with_a_snapshot_opens_again(pg, postgres_url):
    pg.append("s", [Warned(text="a")])
    assert pg.save_snapshot("s", 1, b"state")
    with PostgresStore(postgres_url) as again:  # four tables now: still ours
        assert again.load_snapshot("s") == (1, b"state")


def test_the_snapshots_table_is_made_with_the_others(pg, postgres_url):
    tables = sql(postgres_url, "SELECT table_name FROM information_schema.tables "
                               "WHERE table_schema = 'SCHEMA' ORDER BY table_name")
    assert [name for (name,) in tables] == [
        "nous_inbox_events", "nous_inbox_meta", "nous_inbox_snapshots", "nous_inbox_streams"]


def test_a_store_made_before_the_snapshots_table_gets_it_on_open(pg, postgres_url):
    pg.append("s", [Warned(text="a")])
    sql(postgres_url, 'DROP TABLE "SCHEMA".nous_inbox_snapshots')  # as an older version made it
    with PostgresStore(postgres_url, read_only=True) as reader:  # read-only: nothing made
        assert reader.load_snapshot("s") is None
    assert not sql(postgres_url, "SELECT to_regclass('\"SCHEMA\".nous_inbox_snapshots')")[0][0]
    with PostgresStore(postgres_url) as again:
        assert again.save_snapshot("s", 1, b"state")
        assert again.load_snapshot("s") == (1, b"state")


def test_a_store_with_tables_of_a_later_version_beside_ours_opens(pg, postgres_url):
    sql(postgres_url, 'CREATE TABLE "SCHEMA".nous_inbox_later (x int)')
    with PostgresStore(postgres_url) as again:
        again.append("s", [Warned(text="a")])


@contextlib.contextmanager
def least_privileged(postgres_url: str, schema: str) -> Iterator[str]:
    """The URL of a role that may only read and write the store's tables (no CREATE)."""
    import urllib.parse

    role = f"app_{schema}"
    sql(postgres_url, f"CREATE ROLE {role} LOGIN")
    try:
        sql(postgres_url, f'GRANT USAGE ON schema "SCHEMA" TO {role}')
        sql(postgres_url, f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN schema "SCHEMA" TO {role}')
        parts = urllib.parse.urlsplit(postgres_url)
        host = parts.netloc.rsplit("@", 1)[-1]
        yield urllib.parse.urlunsplit(parts._replace(netloc=f"{role}@{host}"))
    finally:
        sql(postgres_url, f"DROP OWNED BY {role}")
        sql(postgres_url, f"DROP ROLE {role}")


def test_a_role_that_cannot_add_the_snapshots_table_opens_the_store_and_keeps_none(
    pg, postgres_url, caplog,
):
    pg.append("s", [Warned(text="a")])
    sql(postgres_url, 'DROP TABLE "SCHEMA".nous_inbox_snapshots')  # an older version's store
    with least_privileged(postgres_url, pg.schema) as url, PostgresStore(url) as app:
        assert "cannot add the snapshots table" in caplog.text
        assert not app.save_snapshot("s", 1, b"state")
        assert app.load_snapshot("s") is None
        app.append("s", [Warned(text="b")])


def test_a_role_without_create_on_the_schema_saves_snapshots(pg, postgres_url):
    pg.append("s", [Warned(text="a"), Warned(text="b")])
    with least_privileged(postgres_url, pg.schema) as url, PostgresStore(url) as app:
        app.own("s")
        app.append("s", [Warned(text="c")])
        assert app.save_snapshot("s", 2, b"state")
        assert app.load_snapshot("s") == (2, b"state")


def test_streams_sort_as_python_sorts_them(pg):
    names = ["b", "B", "a", "é", "z", "_"]
    for name in names:
        pg.append(name, [Warned(text=name)])
    assert pg.streams() == sorted(names)


def test_a_transaction_pooler_gets_no_prepared_statements(postgres_url):
    for pooler, prepared in (("transaction", False), ("session", True)):
        with PostgresStore(f"{postgres_url}&pooler={pooler}") as store:
            with store.connect() as db:  # how every connection of the store is made
                for i in range(10):
                    db.execute("SELECT %s::text", (f"{i}",))
                count = db.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
            assert (count is not None and count[0] > 0) is prepared


# -- appends --------------------------------------------------------------------------------------


def test_an_append_is_one_transaction_even_for_many_events(pg, postgres_url):
    events = [Warned(text=str(i)) for i in range(50)]
    pg.append("s", events)
    batches = sql(postgres_url, 'SELECT count(DISTINCT batch), count(*), '
                                'count(DISTINCT xmin::text) FROM "SCHEMA".nous_inbox_events')
    assert batches == [(1, 50, 1)]


def test_an_event_too_large_writes_nothing(postgres_url):
    with PostgresStore(postgres_url, max_record_size=100) as store:
        with pytest.raises(ValueError, match="above the limit of 100 bytes; nothing was written"):
            store.append("s", [Warned(text="small"), Warned(text="x" * 200)])
        assert store.version("s") == 0 and list(store.read("s")) == []


def lose_answers(store: PostgresStore, monkeypatch: pytest.MonkeyPatch, when: str,
                 then: Any = None) -> list[int]:
    """Make the next append's connection drop ``before`` or ``after`` its commit, once (and
    call ``then()`` as it drops).

    (Patches the cursor class the store sends its appends with: the one place where a message
    can be lost at a chosen point of the protocol without a proxy in between.)
    """
    dropped: list[int] = []

    class Lossy(psycopg.ClientCursor[Any]):
        def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
            committing = "COMMIT" in str(query)
            if when == "before" and "FOR UPDATE" in str(query) and not dropped:
                dropped.append(1)
                self.connection.close()  # the append never reaches the server
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            done = super().execute(query, *args, **kwargs)
            if when == "after" and committing and not dropped:
                dropped.append(1)
                self.connection.close()  # committed; the answer never reaches us
                if then is not None:
                    then()
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return done

    monkeypatch.setattr(postgres_store, "ClientCursor", Lossy)
    return dropped


@pytest.mark.parametrize("expected", [None, 1])
def test_an_append_whose_answer_was_lost_after_commit_is_neither_lost_nor_doubled(
    pg, monkeypatch, expected,
):
    pg.append("s", [Warned(text="first")])
    dropped = lose_answers(pg, monkeypatch, "after")
    stored = pg.append("s", [Warned(text="a"), Warned(text="b")], expected_version=expected)
    assert dropped == [1]
    assert [(e.seq, e.text) for e in stored] == [(2, "a"), (3, "b")]
    assert [e.text for e in pg.read("s")] == ["first", "a", "b"] and pg.version("s") == 3


def test_an_append_whose_connection_dropped_before_commit_is_made_once(pg, monkeypatch):
    dropped = lose_answers(pg, monkeypatch, "before")
    stored = pg.append("s", [Warned(text="a")], expected_version=0)
    assert dropped == [1] and [e.seq for e in stored] == [1]
    assert [e.text for e in pg.read("s")] == ["a"]


def test_a_terminated_backend_is_reconnected_and_the_append_made(pg, postgres_url):
    pg.append("s", [Warned(text="a")])
    pid = pg.backend_pid
    sql(postgres_url, "SELECT pg_terminate_backend(%s)", pid)
    pg.append("s", [Warned(text="b")])
    assert [e.text for e in pg.read("s")] == ["a", "b"]
    assert pg.backend_pid not in (pid, None)


def test_a_lost_connection_that_does_not_come_back_is_a_store_error(postgres_url):
    with OutOfReach(postgres_url, reconnect=0.01) as store:
        store.append("s", [Warned(text="a")])
        store.refused = lambda: True  # the server is gone for good
        sql(postgres_url, "SELECT pg_terminate_backend(%s)", store.backend_pid)
        with pytest.raises(StoreError, match=r"could not get it back within 0.01s"):
            store.append("s", [Warned(text="b")])


# -- leases and fencing ---------------------------------------------------------------------------


def test_a_lease_is_a_row_with_a_holder_an_epoch_and_an_expiry_on_the_server_clock(pg, postgres_url):
    lease = pg.own("s")
    assert isinstance(lease, PostgresLease) and lease.epoch == 1 and not lease.lost
    # The time left is read against clock_timestamp() (the clock as the row is read), not now()
    # (this statement's start): a renewal committed in between is then never "in the future".
    [(holder, epoch, left)] = sql(
        postgres_url, 'SELECT holder, epoch, extract(epoch FROM expires - clock_timestamp()) '
                      'FROM "SCHEMA".nous_inbox_streams WHERE stream = %s', "s")
    assert holder == lease.token and epoch == 1 and 0 < left <= pg.lease
    lease.release()
    assert sql(postgres_url, 'SELECT holder, expires FROM "SCHEMA".nous_inbox_streams') == [
        (None, None)]
    assert pg.own("s").epoch == 2  # every taking of the lease is a new epoch


def test_a_lease_is_refused_while_it_lasts_and_taken_over_once_it_expired(postgres_url):
    with PostgresStore(postgres_url) as first, PostgresStore(postgres_url) as second:
        old = first.own("s")
        with pytest.raises(StreamOwnedError, match="another owner holds stream 's'"):
            second.own("s")
        expire(postgres_url, "s", first)
        new = second.own("s")
        assert new.epoch == old.epoch + 1


def test_a_stale_owner_is_fenced_and_writes_nothing(postgres_url):
    with PostgresStore(postgres_url) as stale, PostgresStore(postgres_url) as fresh:
        stale.own("s")
        stale.append("s", [Warned(text="while it held the lease")])
        expire(postgres_url, "s", stale)
        fresh.own("s")
        fresh.append("s", [Warned(text="the new owner")])
        with pytest.raises(LeaseLostError, match=r"lease .* was taken over; nothing was written"):
            stale.append("s", [Warned(text="too late")], expected_version=2)
        with pytest.raises(LeaseLostError):  # and it stays fenced, asked or not
            stale.append("s", [Warned(text="still too late")])
        assert [e.text for e in fresh.read("s")] == ["while it held the lease", "the new owner"]


def test_a_lost_lease_is_not_a_concurrency_error_so_a_journal_never_retries_it(postgres_url):
    assert not issubclass(LeaseLostError, ConcurrencyError)
    with PostgresStore(postgres_url) as stale, PostgresStore(postgres_url) as fresh:
        stale.own("s")
        journal = Journal(stale, "s")
        expire(postgres_url, "s", stale)
        fresh.own("s")
        fresh.append("s", [Warned(text="the new owner")])
        with pytest.raises(LeaseLostError):
            journal.commit(lambda session: ([Warned(text="stale")], None))
        assert fresh.version("s") == 1


def test_a_held_lease_is_renewed_and_a_taken_one_is_noticed(postgres_url):
    with PostgresStore(postgres_url, lease=0.6) as first, PostgresStore(postgres_url) as other:
        lease = first.own("s")
        query = f'SELECT expires FROM "{other.schema}".nous_inbox_streams'
        with other.connect() as db:
            start = db.execute(query).fetchone()
            assert start is not None
            # Watch the row (on the server's clock) until the background thread moved it on.
            for _ in range(600):
                now = db.execute(query).fetchone()
                if now is not None and now[0] > start[0]:
                    break
                db.execute("SELECT pg_sleep(0.05)")
            assert now is not None and now[0] > start[0]
            db.execute(f"UPDATE \"{other.schema}\".nous_inbox_streams "
                       "SET holder = 'someone else', epoch = epoch + 1")
            for _ in range(600):
                if lease.lost:
                    break
                db.execute("SELECT pg_sleep(0.05)")
        assert lease.lost


# -- a stalled call never costs the other leases ------------------------------------------------------


def stuck_writer(store: PostgresStore, stream: str) -> psycopg.Connection[Any]:
    """A connection holding ``stream``'s row lock in an open transaction, as a writer cut off
    mid-append would, and that none of the store's own timeouts governs (another program's)."""
    db = store.connect()
    db.execute("SET idle_in_transaction_session_timeout = 0")
    db.execute("BEGIN")
    db.execute(f'SELECT 1 FROM "{store.schema}".nous_inbox_streams WHERE stream = %s FOR UPDATE',
               (stream,))
    return db


def expiry(url: str, stream: str) -> Any:
    return sql(url, 'SELECT expires FROM "SCHEMA".nous_inbox_streams WHERE stream = %s',
               stream)[0][0]


def waiting_on_a_lock(url: str, store: PostgresStore) -> bool:
    pid = store.backend_pid
    assert pid is not None
    rows = sql(url, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", pid)
    return rows == [("Lock",)]


def test_a_call_stalled_on_a_row_lock_does_not_stop_the_renewal_of_other_leases(postgres_url):
    # Host B's append waits on a row a stuck writer holds; its lease of "t" must stay renewed
    # all the while, or a third host could take a session B is running.
    with PostgresStore(postgres_url, lease=1) as b, PostgresStore(postgres_url, lease=1) as c:
        b.own("t")
        b.append("s", [Warned(text="a")])
        stuck = stuck_writer(b, "s")
        try:
            appender = threading.Thread(target=b.append, args=("s", [Warned(text="b")]))
            appender.start()
            wait_until(lambda: waiting_on_a_lock(postgres_url, b), what="the append waits on the row lock",
                       timeout=WAIT)
            before = expiry(postgres_url, "t")
            wait_until(lambda: expiry(postgres_url, "t") > before,  # renewed meanwhile
                       what="the lease of t renewed", timeout=WAIT)
            with pytest.raises(StreamOwnedError):
                c.own("t")
        finally:
            stuck.rollback()
            stuck.close()
        appender.join(WAIT)
        assert [e.text for e in b.read("s")] == ["a", "b"]


def test_taking_a_lease_from_a_stuck_writer_is_refused_as_owned_and_does_not_wait(postgres_url):
    with PostgresStore(postgres_url, lease=1) as a, PostgresStore(postgres_url, lease=1) as b:
        a.own("s")
        expire(postgres_url, "s", a)  # A is cut off, and its last append ...
        stuck = stuck_writer(a, "s")  # ... left the row locked
        try:
            outcome: list[Any] = []

            def take() -> None:
                try:
                    outcome.append(b.own("s"))
                except Exception as exc:
                    outcome.append(exc)

            taker = threading.Thread(target=take, daemon=True)
            taker.start()
            taker.join(WAIT)
            assert outcome and isinstance(outcome[0], StreamOwnedError), outcome
        finally:
            stuck.rollback()
            stuck.close()
        assert b.own("s").epoch == 2  # once the writer is gone


def test_a_transaction_left_open_by_a_host_cut_off_is_ended_by_the_server(postgres_url):
    # Our own connections tell the server to end a transaction left idle (a host cut off
    # between an append's two round trips): the stream's row is then free for a takeover.
    with PostgresStore(postgres_url, lease=1) as a, PostgresStore(postgres_url, lease=1) as b:
        a.own("s")
        expire(postgres_url, "s", a)
        orphan = a.connect()
        orphan.execute("BEGIN")
        orphan.execute(f'SELECT 1 FROM "{a.schema}".nous_inbox_streams WHERE stream = %s '
                       f"FOR UPDATE", ("s",))
        pid = orphan.info.backend_pid
        try:
            wait_until(lambda: not sql(postgres_url,
                                       "SELECT 1 FROM pg_stat_activity WHERE pid = %s", pid),
                       what="the orphaned connection is gone", timeout=WAIT)
            assert b.own("s").epoch == 2
        finally:
            orphan.close()


def test_the_stores_connections_keep_tcp_alive(postgres_url):
    with PostgresStore(postgres_url, lease=4) as store, store.connect() as db:
        assert "keepalives=1" in db.info.dsn and "keepalives_idle=4" in db.info.dsn
        assert db.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("2s",)
    sep = "&" if "?" in postgres_url else "?"
    with PostgresStore(f"{postgres_url}{sep}keepalives=0") as store, store.connect() as db:
        assert "keepalives=0" in db.info.dsn  # the URL's own, as libpq's parameters always are


def test_a_reconnect_loop_neither_holds_the_connection_nor_stops_the_renewals(postgres_url):
    with OutOfReach(postgres_url, lease=1, reconnect=60) as b, \
            PostgresStore(postgres_url, lease=1) as c:
        b.own("t")
        wait_until(lambda: b.listening, what="the renewals began", timeout=WAIT)
        appender = threading.Thread(target=b.append, args=("s", [Warned(text="a")]))
        b.refused = lambda: threading.current_thread() is appender  # out of its reach ...
        sql(postgres_url, "SELECT pg_terminate_backend(%s)", b.backend_pid)
        appender.start()
        # ... for the main connection only: renewals go on, and other threads get the
        # connection's lock between the append's reconnect attempts.
        before = expiry(postgres_url, "t")
        wait_until(lambda: expiry(postgres_url, "t") > before, what="the lease of t renewed",
                   timeout=WAIT)
        with pytest.raises(StreamOwnedError):
            c.own("t")
        assert b.attempts and appender.is_alive()  # retrying
        versions: list[int] = []
        other = threading.Thread(target=lambda: versions.append(b.version("s")), daemon=True)
        other.start()
        other.join(WAIT)
        assert versions == [0]  # made its call between two attempts (and the connection again)
        appender.join(WAIT)
        assert [e.text for e in b.read("s")] == ["a"]


def test_a_recovery_that_cannot_tell_in_time_whether_its_append_was_written_says_so(
    postgres_url, monkeypatch,
):
    # The answer to the COMMIT is lost; when the store comes back to look for its append, a
    # stuck writer holds the stream's row: it waits no longer than ``reconnect``, says the
    # outcome is not known, and a retry with the identity it gives writes the append once.
    with PostgresStore(postgres_url, reconnect=1) as store:
        store.append("s", [Warned(text="a")])
        held: list[psycopg.Connection[Any]] = []
        lose_answers(store, monkeypatch, "after", lambda: held.append(stuck_writer(store, "s")))
        with pytest.raises(OutcomeUnknownError, match="whether it was written is not known") as caught:
            store.append("s", [Warned(text="b")])
        for stuck in held:
            stuck.rollback()
            stuck.close()
        assert caught.value.stream == "s"
        again = store.append("s", [Warned(text="b")], identity=caught.value.identity)
        assert [e.seq for e in again] == [2]
        assert [e.text for e in store.read("s")] == ["a", "b"]


def test_an_append_that_never_sent_its_commit_is_a_definite_failure(postgres_url, monkeypatch):
    with PostgresStore(postgres_url, reconnect=0) as store:
        lose_answers(store, monkeypatch, "before")
        with pytest.raises(StoreError, match="nothing was done") as caught:
            store.append("s", [Warned(text="a")])
        assert not isinstance(caught.value, OutcomeUnknownError)
        assert store.version("s") == 0


def test_reconnect_is_shorter_than_the_lease_unless_given(postgres_url):
    with PostgresStore(postgres_url) as store:
        assert 0 < store.reconnect < store.lease
    with PostgresStore(postgres_url, lease=1) as store:
        assert 0 < store.reconnect < 1
    with PostgresStore(postgres_url, lease=60) as store:
        assert store.reconnect == 10
    with PostgresStore(postgres_url, lease=1, reconnect=30) as store:
        assert store.reconnect == 30  # the caller's choice


def test_appending_needs_no_lease_and_is_not_fenced_by_anothers(postgres_url):
    with PostgresStore(postgres_url) as owner, PostgresStore(postgres_url) as sender:
        owner.own("s")
        sender.append("s", [Warned(text="a steer from elsewhere")])
        owner.append("s", [Warned(text="the owner's own")], expected_version=1)
        assert owner.version("s") == 2


# -- wake-ups --------------------------------------------------------------------------------------


def test_a_subscriber_is_woken_by_an_append_from_another_store(postgres_url):
    with PostgresStore(postgres_url, poll=3600) as watcher, PostgresStore(postgres_url) as sender:
        woken = threading.Event()
        ready = threading.Event()

        def nudged() -> None:
            ready.set()
            if watcher.version("s") > 0:
                woken.set()

        unsubscribe = watcher.subscribe("s", nudged)
        assert ready.wait(WAIT)  # the listening connection is up (it nudges once on connect)
        sender.append("s", [Warned(text="wake")])
        assert woken.wait(WAIT)
        unsubscribe()


def test_a_subscriber_joining_a_listening_store_is_nudged_at_once(postgres_url):
    # A send made before the subscription notified nobody: the subscriber checks straight away
    # rather than at the next poll (an hour here).
    with PostgresStore(postgres_url, poll=3600) as watcher:
        ready = threading.Event()
        watcher.subscribe("a", ready.set)
        assert ready.wait(WAIT)  # listening now
        nudged: list[str] = []
        watcher.subscribe("b", lambda: nudged.append("b"))
        assert nudged == ["b"]  # before subscribe returned


def test_a_session_pooler_listens_and_prepares_as_a_direct_connection_does(postgres_url):
    with PostgresStore(f"{postgres_url}&pooler=session", poll=3600) as watcher, \
            PostgresStore(postgres_url) as sender:
        ready, woken = threading.Event(), threading.Event()
        watcher.subscribe("s", lambda: (ready.set(), watcher.version("s") and woken.set()))
        assert ready.wait(WAIT)
        sender.append("s", [Warned(text="wake")])
        assert woken.wait(WAIT)  # by NOTIFY: the poll is an hour away


def test_a_subscriber_of_another_stream_is_not_woken(postgres_url):
    with PostgresStore(postgres_url, poll=3600) as watcher, PostgresStore(postgres_url) as sender:
        calls: list[str] = []
        ready = threading.Event()
        b_woken = threading.Event()
        watcher.subscribe("a", lambda: calls.append("a"))
        watcher.subscribe("b", lambda: (calls.append("b"), ready.set(),
                                        watcher.version("b") and b_woken.set()))
        assert ready.wait(WAIT)
        before = calls.count("a")
        sender.append("b", [Warned(text="for b only")])
        assert b_woken.wait(WAIT)
        assert calls.count("a") == before


def test_a_notification_that_arrives_during_a_renewal_still_wakes_at_once(postgres_url):
    # The renewals share the listening connection: a notification read off the socket while
    # one is in flight is delivered then, not at the next poll (an hour away here).
    with PostgresStore(postgres_url, lease=0.6, poll=3600) as watcher, \
            PostgresStore(postgres_url) as sender:
        ready, woken = threading.Event(), threading.Event()
        watcher.own("x")  # so that it renews
        watcher.subscribe("s", lambda: (ready.set(), watcher.version("s") and woken.set()))
        assert ready.wait(WAIT)
        background = watcher._background
        assert background is not None
        real = background._renew
        sent: list[int] = []
        pause = threading.Event()  # never set

        def renew(db: psycopg.Connection[Any]) -> None:
            if not sent:
                sent.append(1)
                sender.append("s", [Warned(text="wake")])  # notifies during this renewal
                pause.wait(0.05)
                db.execute("SELECT 1")  # a round trip that reads the notification
            real(db)

        background._renew = renew  # type: ignore[method-assign]
        assert woken.wait(WAIT)


def test_the_poll_backstop_nudges_without_any_notification(postgres_url):
    with PostgresStore(f"{postgres_url}&pooler=transaction", poll=0.05) as watcher:
        nudges = threading.Semaphore(0)
        watcher.subscribe("s", nudges.release)
        assert all(nudges.acquire(timeout=WAIT) for _ in range(3))


# -- an owner whose lease was taken over stops for good ---------------------------------------------


def _model(transcript: Any, tools: Any) -> Any:
    from nous_inbox import Message, ToolCall

    if transcript[-1].role == "user":
        return Message.assistant(tool_calls=[ToolCall("c1", "work", {})])
    return Message.assistant("done")


def test_an_owner_whose_lease_was_taken_over_refuses_sends_and_wait_idle_says_why(postgres_url):
    from nous_inbox.owner import Owner
    from nous_inbox.runner import Runner

    with PostgresStore(postgres_url, lease=60) as here, PostgresStore(postgres_url) as there:
        stale = Owner(here, "s", Runner(_model, []), start=False)
        stale.inject("before")
        expire(postgres_url, "s", here)
        with Owner(there, "s", Runner(_model, []), start=False) as fresh:
            with pytest.raises(LeaseLostError, match="taken over"):
                stale.inject("too late")
            assert isinstance(stale.lost, LeaseLostError) and stale.lost.stream == "s"
            with pytest.raises(LeaseLostError):  # final: every later send, without asking
                stale.steer("still too late")
            with pytest.raises(LeaseLostError):
                stale.wait_idle(WAIT)
            with pytest.raises(LeaseLostError):  # every time, not once
                stale.wait_idle(WAIT)
            assert not stale.running
            stale.close()  # closing a lost owner releases nothing of the new owner's
            fresh.inject("the new owner's")
            assert [e.message.content for e in fresh.events()] == ["before", "the new owner's"]


def test_a_run_whose_lease_was_taken_over_stops_at_its_next_append_writing_nothing(postgres_url):
    from nous_inbox.owner import Owner
    from nous_inbox.runner import Runner

    in_tool, go_on = threading.Event(), threading.Event()

    def work() -> str:
        in_tool.set()
        assert go_on.wait(WAIT)
        return "worked"

    with PostgresStore(postgres_url, lease=60) as here, PostgresStore(postgres_url) as there:
        stale = Owner(here, "s", Runner(_model, [work]), start=False)
        stale.steer("go")
        assert in_tool.wait(WAIT)  # the run is inside its tool, its lease about to be taken
        expire(postgres_url, "s", here)
        with Owner(there, "s", Runner(_model, []), start=False) as fresh:
            before = here.version("s")
            go_on.set()  # the tool returns; the run's next append is refused
            with pytest.raises(LeaseLostError):
                stale.wait_idle(WAIT)
            assert stale.lost is not None and not stale.running
            assert here.version("s") == before  # the stale run wrote nothing, not even its end
            with pytest.raises(LeaseLostError):
                stale.steer("again")
            stale.close()
            last = fresh.events()[-1]  # the open turn was closed by the new owner, on opening
            assert type(last).__name__ == "TurnEnded" and last.reason == "error"
            assert fresh.session == replay(fresh.events())


def test_an_idle_owner_learns_of_a_takeover_from_its_lease_renewal(postgres_url):
    from nous_inbox.owner import Owner
    from nous_inbox.runner import Runner

    with PostgresStore(postgres_url, lease=0.6, poll=0.05) as here:
        owner = Owner(here, "s", Runner(_model, []), start=False)
        sql(postgres_url, "UPDATE \"SCHEMA\".nous_inbox_streams "
                          "SET holder = 'someone else', epoch = epoch + 1 WHERE stream = %s", "s")
        wait_until(lambda: owner.lost is not None, what="the idle owner heard of the takeover",
                   timeout=WAIT)
        assert isinstance(owner.lost, LeaseLostError)  # with no send to be refused
        with pytest.raises(LeaseLostError):
            owner.wait_idle(WAIT)
        owner.close()


def test_an_async_owner_whose_lease_was_taken_over_raises_it_from_send_and_wait_idle(
        postgres_url):
    import asyncio

    from nous_inbox.owner.async_owner import AsyncOwner
    from nous_inbox.runner import Runner

    async def model(transcript: Any, tools: Any) -> Any:
        return _model(transcript, tools)

    async def main() -> None:
        with PostgresStore(postgres_url, lease=60) as here, PostgresStore(postgres_url) as there:
            async with AsyncOwner(here, "s", Runner(model, []), start=False) as stale:
                await stale.inject("before")
                await asyncio.to_thread(expire, postgres_url, "s", here)
                fresh = there.own("s")
                with pytest.raises(LeaseLostError):
                    await stale.inject("too late")
                with pytest.raises(LeaseLostError):
                    await stale.steer("still too late")
                with pytest.raises(LeaseLostError):
                    await stale.wait_idle(WAIT)
            fresh.release()
            assert [e.message.content for e in there.read("s")] == ["before"]

    asyncio.run(main())


# -- group commit on PostgreSQL, under failure --------------------------------------------------------


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_shared_batch_whose_connection_dropped_is_written_once_for_every_sender(
    postgres_url, monkeypatch, when,
):
    # The first sender's append is held while seven more queue behind it; their shared batch's
    # connection drops before or after its COMMIT. The store reconnects and looks for the
    # batch: every sender is acknowledged, each message is in the log once.
    from collections import Counter

    from nous_inbox import MessageSent
    from nous_inbox.owner import Owner
    from nous_inbox.runner import Runner

    class Held:
        def __init__(self, inner: PostgresStore) -> None:
            self.inner, self.sizes = inner, list[int]()
            self.entered, self.release = threading.Event(), threading.Event()
            self.dropped: list[int] = []

        def append(self, stream: str, events: Any, expected_version: Any = None) -> Any:
            self.sizes.append(len(events))
            if len(self.sizes) == 1:
                self.entered.set()
                assert self.release.wait(WAIT)
            elif len(events) > 1 and not self.dropped:
                self.dropped = lose_answers(self.inner, monkeypatch, when)
            return self.inner.append(stream, events, expected_version)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    with PostgresStore(postgres_url) as store:
        held = Held(store)
        owner = Owner(held, "s", Runner(_model, []), start=False, watch=False)
        results: dict[str, Any] = {}

        def send(text: str) -> None:
            try:
                results[text] = owner.inject(text)
            except Exception as exc:
                results[text] = exc

        first = threading.Thread(target=send, args=("first",))
        first.start()
        assert held.entered.wait(WAIT)
        texts = [f"m{i}" for i in range(7)]
        threads = [threading.Thread(target=send, args=(t,)) for t in texts]
        for t in threads:
            t.start()
        wait_until(lambda: owner.group_commit == GroupCommitState(queued=7, committing=True, senders=1),
                   what="seven sends queued behind the held commit", timeout=WAIT)
        held.release.set()
        for t in [first, *threads]:
            t.join(WAIT)
        owner.close()
        assert held.sizes[:2] == [1, 7] and held.dropped == [1]
        assert all(isinstance(results[t], MessageSent) for t in ["first", *texts]), results
        logged = Counter(e.message.content for e in store.read("s") if isinstance(e, MessageSent))
        assert logged == Counter(["first", *texts])  # each once: none lost, none doubled
        assert [e.seq for e in store.read("s")] == list(range(1, 9))


def test_an_event_too_large_in_a_shared_batch_fails_only_its_sender(postgres_url):
    # The store refuses the whole shared batch before writing anything (a record above its
    # limit, through the retrying path): each event is then tried on its own.
    from nous_inbox import MessageSent
    from nous_inbox.owner import Owner
    from nous_inbox.runner import Runner

    class Held:
        def __init__(self, inner: PostgresStore) -> None:
            self.inner, self.sizes = inner, list[int]()
            self.entered, self.release = threading.Event(), threading.Event()

        def append(self, stream: str, events: Any, expected_version: Any = None) -> Any:
            self.sizes.append(len(events))
            if len(self.sizes) == 1:
                self.entered.set()
                assert self.release.wait(WAIT)
            return self.inner.append(stream, events, expected_version)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    with PostgresStore(postgres_url, max_record_size=4096) as store:
        held = Held(store)
        owner = Owner(held, "s", Runner(_model, []), start=False, watch=False)
        results: dict[str, Any] = {}

        def send(text: str) -> None:
            try:
                results[text[:5]] = owner.inject(text)
            except Exception as exc:
                results[text[:5]] = exc

        first = threading.Thread(target=send, args=("first",))
        first.start()
        assert held.entered.wait(WAIT)
        texts = ["a", "b", "big" + "x" * 8000, "c"]
        threads = [threading.Thread(target=send, args=(t,)) for t in texts]
        for t in threads:
            t.start()
        wait_until(lambda: owner.group_commit == GroupCommitState(queued=4, committing=True, senders=1),
                   what="four sends queued behind the held commit", timeout=WAIT)
        held.release.set()
        for t in [first, *threads]:
            t.join(WAIT)
        owner.close()
        assert held.sizes[:2] == [1, 4]  # the shared batch was tried, refused as a whole
        assert isinstance(results["bigxx"], ValueError) and "above the limit" in str(
            results["bigxx"])
        assert all(isinstance(results[t], MessageSent) for t in ["first", "a", "b", "c"])
        logged = sorted(e.message.content for e in store.read("s") if isinstance(e, MessageSent))
        assert logged == ["a", "b", "c", "first"]


def test_a_store_with_reconnect_zero_raises_at_once_when_its_connection_drops(postgres_url):
    with PostgresStore(postgres_url, reconnect=0) as store:
        store.append("s", [Warned(text="a")])
        sql(postgres_url, "SELECT pg_terminate_backend(%s)", store.backend_pid)
        connects: list[int] = []
        real = store.connect
        store.connect = lambda: (connects.append(1), real())[1]  # type: ignore[method-assign]
        with pytest.raises(StoreError, match=r"could not get it back within 0s"):
            store.append("s", [Warned(text="b")])
        assert connects == []  # not one attempt to reconnect
        store.append("s", [Warned(text="c")])  # the next call connects afresh
        assert connects == [1] and [e.text for e in store.read("s")] == ["a", "c"]


def test_behind_a_transaction_pooler_a_stuck_row_does_not_stop_the_renewal_of_other_leases(
    postgres_url,
):
    # No session lock_timeout there (it would stay on the pooled connection): each renewal
    # bounds its own wait, so the lease of "t" stays renewed while "s"'s row is stuck.
    with PostgresStore(f"{postgres_url}&pooler=transaction", lease=1) as b:
        b.own("s")
        b.own("t")
        stuck = stuck_writer(b, "s")
        try:
            before = expiry(postgres_url, "t")
            wait_until(lambda: expiry(postgres_url, "t") > before, what="the lease of t renewed",
                       timeout=WAIT)
            again = expiry(postgres_url, "t")
            wait_until(lambda: expiry(postgres_url, "t") > again,  # round after round
                       what="the lease of t renewed again", timeout=WAIT)
        finally:
            stuck.rollback()
            stuck.close()


@pytest.mark.parametrize("retry", ["by the caller", "by the store after a lost answer"])
def test_an_append_found_by_its_identity_is_read_with_the_streams_row_let_go(
    postgres_url, monkeypatch, retry,
):
    # Under the stream row's lock the look says only whether the append was made; its rows are
    # read once the row is let go, so a host paused while it receives a large batch holds no
    # lock (the server, busy sending, has no idle timer to cut it off). The moment the rows reach
    # the host is not visible from outside, so psycopg's fetchall is wrapped to try the lock then.
    with PostgresStore(postgres_url) as store:
        texts = [Warned(text=str(i)) for i in range(3)]
        if retry == "by the caller":
            first = store.append("s", texts, identity="batch-1")
        else:  # the answer to the commit is lost: the store looks for its own batch
            dropped = lose_answers(store, monkeypatch, "after")
        tried: list[str] = []
        fetchall = psycopg.Cursor.fetchall

        def trying_the_lock(self: psycopg.Cursor[Any]) -> Any:
            rows = fetchall(self)
            columns = [column.name for column in self.description or ()]
            if columns == ["seq", "body"] and rows and not tried:
                tried.append("trying")
                try:
                    sql(postgres_url, "SELECT 1 FROM \"SCHEMA\".nous_inbox_streams "
                                      "WHERE stream = %s FOR UPDATE NOWAIT", "s")
                    tried[-1] = "free"
                except psycopg.errors.LockNotAvailable:
                    tried[-1] = "held"
            return rows

        monkeypatch.setattr(psycopg.Cursor, "fetchall", trying_the_lock)
        if retry == "by the caller":
            assert store.append("s", texts, identity="batch-1") == first
        else:
            assert [e.seq for e in store.append("s", texts)] == [1, 2, 3] and dropped == [1]
        monkeypatch.undo()
        assert tried == ["free"]
        assert [e.text for e in store.read("s")] == ["0", "1", "2"]


def test_a_retry_whose_batch_is_deleted_before_its_rows_are_read_writes_nothing(
    postgres_url, monkeypatch,
):
    # The stream deleted by another store between the look (under the row's lock) and the read
    # of the rows (after it): the retry can neither answer with rows that are gone nor write
    # without the lock, so it refuses; retried again, the append is written anew, as after any
    # delete. (Another store's delete is made right as the look's transaction is rolled back.)
    with PostgresStore(postgres_url) as store, PostgresStore(postgres_url) as deleter:
        store.append("s", [Warned(text="old")], identity="send-1")
        execute = psycopg.Connection.execute
        deleted: list[bool] = []

        def deleting_after_the_rollback(self: psycopg.Connection[Any], query: Any,
                                        *args: Any, **kwargs: Any) -> Any:
            done = execute(self, query, *args, **kwargs)
            if query == "ROLLBACK" and not deleted:
                deleted.append(True)
                deleter.delete("s")
            return done

        monkeypatch.setattr(psycopg.Connection, "execute", deleting_after_the_rollback)
        with pytest.raises(StoreError, match="deleted before it could be read back") as caught:
            store.append("s", [Warned(text="old")], identity="send-1")
        monkeypatch.undo()
        assert deleted == [True] and not isinstance(caught.value, OutcomeUnknownError)
        assert store.version("s") == 0 and list(store.read("s")) == []
        again = store.append("s", [Warned(text="old")], identity="send-1")
        assert [(e.seq, e.text) for e in again] == [(1, "old")]
        assert [e.text for e in store.read("s")] == ["old"]
