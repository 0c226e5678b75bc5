"""What an operator's tools ask a web host, without its token: is it alive, is it ready, what is it
doing.

    GET /healthz    200 {"live": true}: the process answers (no I/O, nothing else asked)
    GET /readyz     200 {"ready": true}, or 503 {"ready": false, "reasons": [...]}: the host is
                    not stopping or draining, its store answers within ``READY_WITHIN`` seconds,
                    and a store that renews leases from a loop of its own (PostgreSQL) has it
                    running while the host holds sessions
    GET /metrics    Prometheus text of the host's :class:`~nous_inbox.observe.Metrics`

They carry no session id and no text (the metrics' labels are queues, modes and turn-end reasons),
so they are served to anyone who can reach the port, as a probe or a scraper expects; the API
behind them still needs the token. :func:`probe_routes` gives them to :func:`create_app
<nous_inbox.web.app.create_app>`.

>>> import asyncio, httpx
>>> from starlette.applications import Starlette
>>> from nous_inbox.runner import Runner
>>> from nous_inbox.store import open_store
>>> from nous_inbox.web.host import SessionHost
>>> async def main():
...     async with SessionHost(open_store("memory:"), lambda s: Runner(lambda t, tools: "ok")) as host:
...         app = Starlette(routes=probe_routes(host))
...         async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
...                                      base_url="http://test") as client:
...             ready = await client.get("/readyz")
...             host.draining = True
...             draining = await client.get("/readyz")
...             return ready.json(), draining.status_code, draining.json()
>>> asyncio.run(main())
({'ready': True}, 503, {'ready': False, 'reasons': ['the host is draining its sessions']})
"""

from __future__ import annotations

import asyncio
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nous_inbox.observe.metrics import CONTENT_TYPE
from nous_inbox.web.host import SessionHost

__all__ = ["READY_WITHIN", "probe_routes", "readiness"]

#: How long ``/readyz`` waits for the store to answer, in seconds, before it says it did not.
READY_WITHIN: Final = 2.0
# A name no session needs to have: the store is asked its version, the cheapest question it takes.
_PROBE_STREAM: Final = "nous-inbox readiness probe"
_NO_CACHE: Final = {"Cache-Control": "no-store"}


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
        reasons.append(f"the store did not answer: {type(exc).__name__}: {exc}")
    else:
        # A store that renews its leases from a loop of its own says whether that loop is up;
        # it starts with the first lease, so before any it has nothing to renew.
        listening = getattr(host.store, "listening", None)
        if listening is False and host.held:
            reasons.append("the store's lease renewal is not running (its connection is down)")
    return reasons


def probe_routes(host: SessionHost) -> list[Route]:
    """``/healthz``, ``/readyz`` and ``/metrics`` for ``host``, none of them behind the token."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"live": True}, headers=_NO_CACHE)

    async def readyz(request: Request) -> Response:
        reasons = await readiness(host)
        if reasons:
            return JSONResponse({"ready": False, "reasons": reasons}, 503, headers=_NO_CACHE)
        return JSONResponse({"ready": True}, headers=_NO_CACHE)

    async def metrics(request: Request) -> Response:
        return Response(host.metrics.exposition(), media_type=CONTENT_TYPE, headers=_NO_CACHE)

    return [Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics)]
