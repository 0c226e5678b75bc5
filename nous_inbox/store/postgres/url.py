"""Where a PostgreSQL store connects: every URL libpq takes, with the store's own options taken out.

The store reads a few parameters of its own from the URL's query (:data:`OURS`); everything else
is libpq's and reaches it as written: an empty host (``postgresql:///agents``), a unix socket as
a ``host=`` parameter or percent-encoded in the host part (``postgresql://%2Frun%2Fpg/agents``),
``service=``, several hosts, and the ``PG*`` environment variables for whatever the URL leaves
out. Only the store's own parameters are cut out of the query, each as it was written, and psycopg
parses what is left (``conninfo_to_dict``), so a URL is never rebuilt by hand and no form libpq
takes is lost on the way.

>>> target = split_url("postgresql:///agents?host=/run/pg&lease=2&user=x")
>>> target.ours, sorted(target.params.items())
({'lease': '2'}, [('dbname', 'agents'), ('host', '/run/pg'), ('user', 'x')])
>>> split_url("postgresql://me:secret@db/agents?sslpassword=key").shown
'postgresql://me:***@db/agents?sslpassword=***'
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Final, NamedTuple

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["OURS", "SECRETS", "Target", "default_reconnect", "first_line", "gives_connect_timeout",
           "reconnect_seconds", "seconds", "split_url"]

#: The query parameters the store reads; libpq never sees them.
OURS: Final = ("schema", "lease", "poll", "pooler", "reconnect")
#: The parameters libpq reads as secrets: never shown in ``url``, errors or ``repr``.
SECRETS: Final = frozenset({"password", "sslpassword"})
#: The longest default ``reconnect`` (see :func:`default_reconnect`).
DEFAULT_RECONNECT: Final = 10.0
_USER: Final = re.compile(r"[^@/]*@")


class Target(NamedTuple):
    """A store URL taken apart: libpq's parameters, the store's own, and the URL to show."""

    params: dict[str, str]
    ours: dict[str, str]
    shown: str


def split_url(url: str) -> Target:
    """Take ``url`` apart; a URL libpq would refuse is a ``ValueError`` naming it (masked)."""
    scheme, sep, after = url.partition("://")
    if not sep:
        scheme, after = "", url
    # As libpq reads it: the user part ends at the first "@" before any "/", so a "?", "#" or
    # "&" before that "@" belongs to the password, not to the query.
    user = _USER.match(after) if sep else None
    userinfo = user.group() if user else ""
    name, colon, password = userinfo[:-1].partition(":")
    secrets = [password] if colon else []
    base, mark, query = after[len(userinfo):].partition("?")
    ours: dict[str, str] = {}
    kept: list[str] = []
    shown_query: list[str] = []
    for piece in query.split("&") if query else []:
        raw_key, _, raw_value = piece.partition("=")
        key = urllib.parse.unquote(raw_key)
        if key in OURS:
            ours[key] = urllib.parse.unquote(raw_value)
        else:
            kept.append(piece)
        if key in SECRETS:
            secrets.append(raw_value)
        shown_query.append(f"{raw_key}=***" if key in SECRETS else piece)
    head = scheme + sep + (f"{name}:***@" if colon else userinfo) + base
    shown = head + (mark + "&".join(shown_query) if mark else "")
    libpq_url = scheme + sep + userinfo + base + ("?" + "&".join(kept) if kept else "")
    try:
        params = conninfo_to_dict(libpq_url)
    except psycopg.Error as exc:
        said = first_line(exc)  # libpq may quote the token it could not read: a password, say
        for secret in secrets:
            for form in {secret, urllib.parse.unquote(secret)} - {""}:
                said = said.replace(form, "***")
        raise ValueError(f"{shown}: not a URL libpq takes: {said}") from None
    return Target({k: str(v) for k, v in params.items() if v is not None}, ours, shown)


def gives_connect_timeout(params: dict[str, str]) -> bool:
    """Whether the user said how long libpq waits for a connection (URL or ``PGCONNECT_TIMEOUT``)."""
    return "connect_timeout" in params or bool(os.environ.get("PGCONNECT_TIMEOUT"))


def default_reconnect(lease: float) -> float:
    """``reconnect`` when none is given: shorter than the lease (4/5 of it, at most 10 s), so a
    call that cannot get its connection back stops retrying rather than retrying into a takeover.
    A bound on the retries, checked between attempts: an attempt under way runs to its
    ``connect_timeout``."""
    return min(DEFAULT_RECONNECT, 0.8 * lease)


def reconnect_seconds(value: str | float | None, default: float, url: str) -> float:
    """``reconnect`` from the keyword or the URL: seconds, or zero (any spelling) for one try."""
    try:
        if value is not None and type(value) is not bool and float(value) == 0:
            return 0.0
    except ValueError:
        pass  # seconds() names it
    return seconds("reconnect", value, default, url)


def seconds(name: str, value: str | float | None, default: float, url: str) -> float:
    """A positive, finite number of seconds, or ``default`` for ``None``; else ``ValueError``."""
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{url}: {name} must be a positive number of seconds, got {value!r}")
    return number


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (a server's may go on with details and hints)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
