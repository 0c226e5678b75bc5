"""Text as it streams: from the moment the model produces a piece of its reply to the moment a
watcher reads it, p50 and p99.

A real Uvicorn on 127.0.0.1 serves a :class:`~nous_inbox.web.SessionHost` on an ``sqlite:``
store, in a thread of its own; each session runs a pydantic-ai agent (``AgentRunner``) whose
``FunctionModel`` streams its reply one piece at a time. The model stamps each piece as it yields
it and waits until the watcher has read it before it yields the next, so every sample is one
piece on its own (no piece waits behind another, none is joined to another). Sides, each one turn
of ``pieces`` pieces:

- ``AsyncOwner.events(deltas=True)``, a reader on the server's loop: what the owner and the
  adapter cost (the model's stream, the outlet, the reader's buffer);
- the page's event stream: ``GET /api/sessions/{id}/events?deltas=1`` read over a real TCP
  connection (the page's ``fetch`` reads the same bytes), so what the SSE face adds is counted.

``python -m bench --only delta_bench`` (``--quick``: small and fast).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from nous_inbox.store import open_store

__all__ = ["main", "run"]

_T = TypeVar("_T")
TOKEN = "bench-token-0000"


class _Probe:
    """The moment each piece was produced and the moment the watcher read it."""

    def __init__(self) -> None:
        self.produced: dict[str, float] = {}
        self.read: dict[str, float] = {}
        self.seen = asyncio.Event()

    def reading(self, text: str) -> None:
        now = time.perf_counter()
        for piece in text.split():
            self.read.setdefault(piece, now)
        self.seen.set()

    def latencies(self) -> list[float]:
        return [self.read[p] - self.produced[p] for p in self.produced if p in self.read]


def _agent(probes: dict[str, _Probe], pieces: int) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    def agent(session: str) -> AgentRunner:
        async def writes(messages: Any, info: Any) -> AsyncIterator[str]:
            probe = probes[session]
            for i in range(pieces):
                piece = f"p{i}"
                probe.seen.clear()
                probe.produced[piece] = time.perf_counter()
                yield piece + " "
                await asyncio.wait_for(probe.seen.wait(), 30)  # read before the next is made

        return AgentRunner(Agent(FunctionModel(stream_function=writes)))

    return agent


class _Server:
    """A SessionHost and Uvicorn on 127.0.0.1, on an event loop in a thread of its own."""

    def __init__(self, url: str, agent: Any) -> None:
        self._url, self._agent = url, agent
        self._ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.host: Any = None
        self.port = 0
        self._server: Any = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> _Server:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._stop)
        self._thread.join(60)

    def _stop(self) -> None:
        self.host.stopping.set()
        self._server.should_exit = True

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(600)

    async def _main(self) -> None:
        import uvicorn

        from nous_inbox.web import SessionHost, create_app

        with open_store(self._url) as store:
            async with SessionHost(store, self._agent, scan_interval=None) as host:
                self.host, self.loop = host, asyncio.get_running_loop()
                config = uvicorn.Config(create_app(host, token=TOKEN), host="127.0.0.1", port=0,
                                        lifespan="off", log_level="warning")
                self._server = uvicorn.Server(config)
                serving = asyncio.ensure_future(self._server.serve())
                while not self._server.started:
                    await asyncio.sleep(0.01)
                self.port = self._server.servers[0].sockets[0].getsockname()[1]
                self._ready.set()
                await serving


async def _owner_side(host: Any, session: str, probe: _Probe) -> None:
    owner = await host.take(session)
    listening = asyncio.Event()

    async def watch() -> None:
        reader = owner.events(owner.session.version, deltas=True)
        listening.set()  # (it listens from its first step, before it reads the store)
        async for item in reader:
            if type(item).__name__ == "TextDelta":
                probe.reading(item.text)
            elif type(item).__name__ == "TurnEnded":
                return

    watching = asyncio.ensure_future(watch())
    await listening.wait()
    await asyncio.sleep(0)
    await host.send(session, "prompt", "write")
    await asyncio.wait_for(watching, 120)


async def _sse_side(host: Any, port: int, session: str, probe: _Probe) -> None:
    owner = await host.take(session)
    after = owner.session.version - 1  # the stream's first event says it reads the owner
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((f"GET /api/sessions/{session}/events?after={after}&deltas=1 HTTP/1.1\r\n"
                  f"Host: bench\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").encode())
    await writer.drain()
    try:
        delta = False
        while True:
            line = await asyncio.wait_for(reader.readline(), 120)
            if line.startswith(b"id: "):
                break  # the event before the prompt: the stream reads the owner now
        await host.send(session, "prompt", "write")
        while True:
            line = await asyncio.wait_for(reader.readline(), 120)
            if line.startswith(b"event: delta"):
                delta = True
            elif line.startswith(b"data: "):
                data = json.loads(line[6:])
                if delta:
                    probe.reading(data["text"])
                elif data["type"] == "turn_ended":
                    return
                delta = False
    finally:
        writer.close()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run(quick: bool = False) -> str:
    """The table, as markdown."""
    try:
        import pydantic_ai  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return "(pydantic-ai and the web extra are not installed: pip install 'nous-inbox[web,pydantic-ai]')"
    pieces = 50 if quick else 1000
    probes: dict[str, _Probe] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, \
            _Server(f"sqlite:{Path(tmp) / 'bench.sqlite'}", _agent(probes, pieces)) as server:
        for side, session in (("AsyncOwner.events(deltas=True), in-process", "owner"),
                              ("the page's event stream (SSE over HTTP, ?deltas=1)", "page")):
            async def measure(session: str = session) -> list[float]:
                probes[session] = _Probe()
                await server.host.send(session, "inject", "ready")  # held here from now on
                if session == "owner":
                    await _owner_side(server.host, session, probes[session])
                else:
                    await _sse_side(server.host, server.port, session, probes[session])
                return probes[session].latencies()

            latencies = server.call(measure())
            if len(latencies) != pieces:
                raise RuntimeError(f"{side}: {len(latencies)} of {pieces} pieces were read")
            rows.append((side, *_percentiles(latencies)))
    lines = [
        f"From a piece produced by the model to the watcher's read of it; one turn of {pieces} "
        "pieces each, a pydantic-ai agent on sqlite:.",
        "",
        "| watcher | p50 | p99 |",
        "|---|---:|---:|",
    ]
    lines += [f"| {side} | {p50 * 1e3:.2f} ms | {p99 * 1e3:.2f} ms |" for side, p50, p99 in rows]
    return "\n".join(lines)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
