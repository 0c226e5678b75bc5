"""Every URL libpq takes opens the PostgreSQL store the same way, its password never shown.

The store cuts its own parameters out of the query and hands the rest to libpq as written: what
it passes on is what psycopg itself makes of the URL without them. Those checks need no server;
the last ones open a real store through a unix socket, a percent-encoded socket path, the
``PG*`` environment variables and a service file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import postgres_server

postgres_server.require_psycopg()  # skipped without psycopg, failed in CI; then imported:

from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from nous_inbox.events import Warned  # noqa: E402
from nous_inbox.store import open_store  # noqa: E402
from nous_inbox.store.postgres import PostgresStore  # noqa: E402
from nous_inbox.store.postgres.url import gives_connect_timeout, split_url  # noqa: E402

FORMS = [
    "postgresql:///agents",
    "postgresql:///postgres?host=/some/dir&user=x",
    "postgresql://%2Fsome%2Fdir/agents",
    "postgresql://%2Fsome%2Fdir:5433/agents?user=x",
    "postgresql://?service=agents",
    "postgresql://",
    "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
    "postgresql://u:p%2Bq+r@db.example/agents?sslmode=require&application_name=a+b",
    "postgresql://[::1]:5432/agents",
]


@pytest.mark.parametrize("url", FORMS)
def test_libpq_gets_what_psycopg_makes_of_the_url(url):
    assert split_url(url).params == conninfo_to_dict(url)


@pytest.mark.parametrize("url", FORMS)
def test_the_stores_own_parameters_are_cut_out_wherever_they_stand(url):
    sep = "&" if "?" in url else "?"
    ours = f"{url}{sep}schema=agents&lease=2.5&poll=1&pooler=session&reconnect=0"
    target = split_url(ours)
    assert target.params == conninfo_to_dict(url)
    assert target.ours == {"schema": "agents", "lease": "2.5", "poll": "1", "pooler": "session",
                           "reconnect": "0"}
    first = split_url(url.replace("postgresql:///agents", "postgresql:///agents?lease=3&user=me"))
    if url == "postgresql:///agents":
        assert first.params == {"dbname": "agents", "user": "me"} and first.ours == {"lease": "3"}


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://me:s3cret@db/agents", "postgresql://me:***@db/agents"),
    ("postgresql://me:s3%40cret@/agents?host=/run/pg", "postgresql://me:***@/agents?host=/run/pg"),
    ("postgresql:///agents?password=s3cret&user=me", "postgresql:///agents?password=***&user=me"),
    ("postgresql://db/agents?sslpassword=s3cret", "postgresql://db/agents?sslpassword=***"),
    ("postgresql://me@db/agents?lease=2", "postgresql://me@db/agents?lease=2"),
    # libpq ends the user part at the first "@" before any "/": "?", "#" and "&" are the password's.
    ("postgresql://me:s3?cret@db/agents", "postgresql://me:***@db/agents"),
    ("postgresql://me:s3&c=r#t@db/agents?lease=2", "postgresql://me:***@db/agents?lease=2"),
])
def test_a_password_is_never_shown(url, shown):
    assert split_url(url).shown == shown


def test_a_url_libpq_refuses_is_an_error_naming_it_without_its_password():
    with pytest.raises(ValueError, match=r"postgresql://me:\*\*\*@db/x\?nonsense=1: not a URL "
                                         r"libpq takes") as caught:
        split_url("postgresql://me:s3cret@db/x?nonsense=1")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("url", ["postgresql://me:s3%zzcret@db/x",
                                 "postgresql://me@db/x?password=s3%zzcret",
                                 "postgresql://me:s3?%zzcret@db/x"])
def test_libpqs_own_refusal_never_echoes_the_password(url):
    # libpq names the token it could not decode: here, the password itself.
    with pytest.raises(ValueError, match="not a URL libpq takes") as caught:
        split_url(url)
    assert "s3" not in str(caught.value) and "cret" not in str(caught.value)


def test_the_users_connect_timeout_is_libpqs_to_read(monkeypatch):
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert not gives_connect_timeout(split_url("postgresql:///agents").params)
    assert gives_connect_timeout(split_url("postgresql:///agents?connect_timeout=9").params)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "9")
    assert gives_connect_timeout(split_url("postgresql:///agents").params)


# -- against a real server ------------------------------------------------------------------------


def _socket(postgres: postgres_server.Server) -> tuple[Path, int]:
    if postgres.cluster is None:
        pytest.skip("the server NOUS_INBOX_TEST_POSTGRES names has no socket of ours")
    return postgres.cluster.socket_dir, postgres.cluster.port


def _opens(url: str, stream: str = "s") -> None:
    with open_store(url) as store:
        assert isinstance(store, PostgresStore)
        store.append(stream, [Warned(text="a")])
        assert [e.text for e in store.read(stream)] == ["a"]


def test_a_unix_socket_given_as_a_host_parameter_opens_the_store(postgres, postgres_url):
    directory, port = _socket(postgres)
    schema = split_url(postgres_url).ours["schema"]
    _opens(f"postgresql:///postgres?host={directory}&port={port}&user=nous&schema={schema}")


def test_a_percent_encoded_socket_path_opens_the_store(postgres, postgres_url):
    directory, port = _socket(postgres)
    schema = split_url(postgres_url).ours["schema"]
    encoded = str(directory).replace("/", "%2F")
    _opens(f"postgresql://nous@{encoded}:{port}/postgres?schema={schema}")


def test_an_empty_url_takes_the_rest_from_the_pg_environment(postgres, postgres_url, monkeypatch):
    directory, port = _socket(postgres)
    schema = split_url(postgres_url).ours["schema"]
    for name, value in (("PGHOST", str(directory)), ("PGPORT", str(port)), ("PGUSER", "nous"),
                        ("PGDATABASE", "postgres")):
        monkeypatch.setenv(name, value)
    _opens(f"postgresql://?schema={schema}")
    _opens(f"postgresql:///postgres?schema={schema}", "t")


def test_a_service_opens_the_store(postgres, postgres_url, monkeypatch, tmp_path):
    directory, port = _socket(postgres)
    schema = split_url(postgres_url).ours["schema"]
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[agents]\nhost={directory}\nport={port}\nuser=nous\ndbname=postgres\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    _opens(f"postgresql://?service=agents&schema={schema}")
