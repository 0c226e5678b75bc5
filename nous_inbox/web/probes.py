"""What an operator's tools ask a web host, without its token: is it alive, is it ready, what is it
doing.

    GET /healthz    200 {"live": true}: the process answers (no I/O, nothing else asked)
    GET /readyz     200 {"ready": true}, or 503 {"error": "not ready: ..."} saying why: the host
                    is not stopping or draining, its store answers within ``READY_WITHIN``
                    seconds, and a store that renews leases from a loop of its own (PostgreSQL)
                    has it running while the host holds sessions
    GET /metrics    Prometheus text of the host's :class:`~nous_inbox.observe.Metrics`

They carry no session id and no text (the metrics' labels are queues, modes and turn-end reasons),
so they are served to anyone who can reach the port, as a probe or a scraper expects; the API
behind them still needs the token. They are routes of the one table
(:data:`~nous_inbox.web.routes.ROUTES`), so the API's document describes them too.

>>> import asyncio
>>> from nous_inbox.runner import Runner
>>> from nous_inbox.store import open_store
>>> from nous_inbox.web.host import SessionHost
>>> async def main():
...     async with SessionHost(open_store("memory:"), lambda s: Runner(lambda t, tools: "ok")) as host:
...         return await readiness(host)
>>> asyncio.run(main())
[]
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import msgspec
from starlette.responses import Response

from nous_inbox.observe.metrics import CONTENT_TYPE
from nous_inbox.web.checks import Refused
from nous_inbox.web.endpoint import Call
from nous_inbox.web.host import SessionHost

__all__ = ["READY_WITHIN", "Liveness", "Readiness", "healthz", "metrics", "readiness", "readyz"]

logger: Final = logging.getLogger("nous_inbox.web")

#: How long ``/readyz`` waits for the store to answer, in seconds, before it says it did not.
READY_WITHIN: Final = 2.0
# A name no session needs to have: the store is asked its version, the cheapest question it takes.
_PROBE_STREAM: Final = "nous-inbox readiness probe"


async def readiness(host: SessionHost, within: float = READY_WITHIN) -> list[str]:
    """Why ``host`` is not ready for more work, each reason a sentence; none when it is."""
    if host.stopping.is_set():
        return ["the host is stopping"]
    reasons = ["the host is draining its sessions"] if host.draining else []
    try:
        await asyncio.wait_for(host.call(host.store.version, _PROBE_STREAM), within)
    except TimeoutError:
        reasons.append(f"the store did not answer within {within:g} s")
    except Exception as exc:
        # The failure's own words may name the database's host, user or path: they go to the
        # server's log, and the unauthenticated answer says only what kind of failure it was.
        logger.warning("readiness: the store did not answer", exc_info=True)
        reasons.append(f"the store did not answer ({type(exc).__name__}; see the server's log)")
    else:
        # A store that renews its leases from a loop of its own says whether that loop is up;
        # it starts with the first lease, so before any it has nothing to renew.
        listening = getattr(host.store, "listening", None)
        if listening is False and host.held:
            reasons.append("the store's lease renewal is not running (its connection is down)")
    return reasons


class Liveness(msgspec.Struct, frozen=True):
    """The process answers."""

    live: bool


class Readiness(msgspec.Struct, frozen=True):
    """The host takes work: not stopping or draining, its store answering."""

    ready: bool


async def healthz(call: Call) -> Liveness:
    """Whether the process lives (no I/O)."""
    return Liveness(True)


async def readyz(call: Call) -> Readiness:
    """Whether the host takes work; a 503 saying why not."""
    reasons = await readiness(call.host)
    if reasons:
        raise Refused(503, "not ready: " + "; ".join(reasons))
    return Readiness(True)


async def metrics(call: Call) -> Response:
    """The host's metrics as Prometheus text."""
    return Response(call.host.metrics.exposition(), media_type=CONTENT_TYPE,
                    headers={"Cache-Control": "no-store"})
