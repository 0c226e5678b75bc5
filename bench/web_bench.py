"""The web face: what hosting sessions behind HTTP costs, beside the in-process calls it wraps.

Three tables, each measured side by side in one run, with a real Uvicorn on 127.0.0.1 serving a
:class:`~nous_inbox.web.SessionHost` on an ``sqlite:`` store, in a thread of its own (its event
loop is the server's); the client is this thread, over one kept-alive connection.

**Idle sessions.** What a held idle session costs, three ways, each per session the slope between
``N/2`` and ``N`` sessions held, so what a process pays once (imports, Uvicorn, thread pools) is
not spread over its sessions. In-process (the first two rows) the host takes the sessions and
holds them idle; once the owners' store workers have let their threads go (an idle owner keeps
none, and the loop's shared watch looks for all of them at once) and after a collection, the
process's resident memory and threads are read. The first row's sessions hold one message each;
the second's have had two finished turns of the scripted agent of ``nous-inbox demo`` (a prompt
whose turn reads three logs with a tool, then a followup), so what a session's history holds is
counted. The third row is what a user sees: a real ``nous-inbox serve`` process given that same
work over HTTP and read from outside (``/proc``), nothing collected for the measurement
(``bench/web_serve.py``). Beside each, the whole process's CPU while it holds its sessions idle,
in percent of one core.

**Steer to model request.** A session held idle among the ``N`` is steered; the time from the send
until the model is called with the steer in its transcript (the model notes the moment it sees
it), p50 and p99. Each sample steers a session of its own side's share of the held ones, idle
since it was taken (its worker starts a thread again), the sides taking turns. Sides:
``AsyncOwner.steer`` called on the server's loop (the in-process baseline); the host's ``send``
(the owner's verb, plus the host's checks); ``POST /api/sessions/{id}/messages`` through Uvicorn
(what the HTTP face adds: the request, its checks, the JSON).

**Fan-out.** ``K`` subscribers follow one session's event stream; each send's event is timed from
the send until the last subscriber has read it, p50 and p99. Sides: ``AsyncOwner.events()``
readers in-process, one SSE client, ``K`` SSE clients.

``python -m bench --only web_bench`` (``--quick``: small and fast).
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from bench import web_serve
from nous_inbox.message import Message
from nous_inbox.runner import Runner
from nous_inbox.runner.scripted import ScriptedAgent
from nous_inbox.store import open_store

__all__ = ["main", "run"]

_T = TypeVar("_T")
TOKEN = "bench-token-0000"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class _Stamps:
    """The moment the model first saw each text: the agent of every benched session."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.arrived = threading.Condition()

    def agent(self, session: str) -> Runner:
        async def model(transcript: Any, tools: Any) -> Message:
            now = time.perf_counter()
            with self.arrived:
                self.seen.setdefault(transcript[-1].content, now)
                self.arrived.notify_all()
            return Message.assistant("ok")

        return Runner(model)

    def wait(self, text: str) -> float:
        with self.arrived:
            if not self.arrived.wait_for(lambda: text in self.seen, 30):
                raise TimeoutError(f"the model never saw {text!r}")
            return self.seen[text]


class _Server:
    """A SessionHost and Uvicorn on 127.0.0.1, on an event loop in a thread of their own."""

    def __init__(self, url: str, agent: Callable[[str], Runner], sessions: int) -> None:
        self._url = url
        self._agent = agent
        self._sessions = sessions
        self._ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.host: Any = None
        self.address = ""
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
        """Run ``coroutine`` on the server's loop and wait for it."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(600)  # 1,000 takes at full size

    async def _main(self) -> None:
        import uvicorn

        from nous_inbox.web import SessionHost, create_app

        with open_store(self._url) as store:
            async with SessionHost(store, self._agent, max_sessions=self._sessions + 10,
                                   idle_timeout=3600, scan_interval=None) as host:
                self.host, self.loop = host, asyncio.get_running_loop()
                config = uvicorn.Config(create_app(host, token=TOKEN), host="127.0.0.1", port=0,
                                        lifespan="off", log_level="warning")
                self._server = uvicorn.Server(config)
                serving = asyncio.ensure_future(self._server.serve())
                while not self._server.started:
                    await asyncio.sleep(0.01)
                port = self._server.servers[0].sockets[0].getsockname()[1]
                self.address = f"http://127.0.0.1:{port}"
                self._ready.set()
                await serving


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _idle_names(n: int) -> list[str]:
    return [f"idle-{i}" for i in range(n)]


def _turns_agent(session: str) -> Runner:
    """The scripted agent ``serve`` runs in the third row, with the same task, in-process."""
    scripted = ScriptedAgent(steps=web_serve.STEPS, step_seconds=0)
    return Runner(scripted, scripted.tools, max_steps=50)


def _given_turns(server: _Server, names: list[str]) -> None:
    """Give each session the two turns ``serve``'s sessions get (see ``bench/web_serve.py``)."""
    host = server.host

    async def work() -> None:
        for turn, (mode, text) in enumerate((("prompt", web_serve.PROMPT),
                                             ("followup", web_serve.FOLLOWUP)), 1):
            for name in names:
                await host.send(name, mode, text)
            deadline = time.monotonic() + web_serve.WAIT
            for name in names:
                while not _ended(host.hosted(name).session, turn):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name}'s turn {turn} never ended")
                    await asyncio.sleep(0.01)  # waiting for a condition, with a bound

    server.call(work())


def _ended(session: Any, turn: int) -> bool:
    inbox = session.inbox
    return bool(session.turn >= turn and not session.running
                and inbox.count("next_turn") == 0 and inbox.count("next_step") == 0)


def _slope(add: Callable[[list[str]], object], names: list[str]) -> tuple[float, float]:
    """Resident memory and threads per session of ``names`` in this process: ``add`` the first
    half, read, ``add`` the rest, read; the slope, so what is paid once is left out. Read once
    the workers' threads have gone and after a collection."""
    half = len(names) // 2
    points = []
    for chunk in (names[:half], names[half:]):
        add(chunk)
        threads = web_serve.settled_threads(os.getpid())
        gc.collect()
        points.append((web_serve.resident(os.getpid()), threads))
    added = len(names) - half
    return ((points[1][0] - points[0][0]) / added, (points[1][1] - points[0][1]) / added)


def _idle_table(server: _Server, n: int, settle: float) -> str:
    names = _idle_names(n)
    took = 0.0

    async def seed() -> None:
        for name in names:
            await server.host.call(server.host.store.append, name, [_inject(name)])

    async def take(chunk: list[str]) -> None:
        for name in chunk:
            await server.host.take(name)

    def take_all(chunk: list[str]) -> None:
        nonlocal took
        began = time.perf_counter()
        server.call(take(chunk))
        took += time.perf_counter() - began

    def idle_cpu() -> float:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(settle)  # the measured interval: the process holds them idle
        return (time.process_time() - cpu) / (time.perf_counter() - wall)

    server.call(seed())
    bare = (*_slope(take_all, names), idle_cpu())
    turns = (*_slope(lambda chunk: _given_turns(server, chunk),
                     [f"turns-{i}" for i in range(n)]), idle_cpu())
    served = web_serve.measure((n // 2, n), settle)
    rows = [
        ("SessionHost + AsyncOwner in-process, one message each", *bare, n),
        ("SessionHost + AsyncOwner in-process, two turns each", *turns, 2 * n),
        ("`nous-inbox serve` from outside, two turns each", served.per_session_kib * 1024,
         served.threads_per_session, served.cpu_idle, n),
    ]
    lines = [
        f"Idle sessions held by one host (sqlite:): {n} taken with one message each (in "
        f"{took:.2f} s), then {n} more after two turns of the scripted agent ({web_serve.STEPS} "
        f"tool steps, then a followup); and a `nous-inbox serve` process holding {n // 2} then {n} "
        f"sessions after those two turns ({served.resident[0] / 2**20:.1f} then "
        f"{served.resident[1] / 2**20:.1f} MiB resident, {served.threads[1]} threads). Per "
        f"session: the slope from {n // 2} to {n} sessions. CPU: over {settle:g} s idle, the "
        f"whole process, holding the sessions shown.",
        "",
        "| per idle session | resident memory | threads | process CPU while idle |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {side} | {memory / 1024:.1f} KiB | {thread:.3f} | {cpu * 100:.1f} % of a core, "
              f"{held} held |" for side, memory, thread, cpu, held in rows]
    lines += [
        "",
        "The in-process rows are read after a collection: the first is what the host, the owner "
        "and its session hold; the second adds a session's history (its transcript, its runner "
        "and agent). The serve row is what `ps` shows of the process, nothing collected and the "
        "memory the allocator keeps after the requests and turns counted with the rest.",
    ]
    return "\n".join(lines)


def _inject(text: str) -> Any:
    from nous_inbox.events import MessageSent
    from nous_inbox.verbs import Target

    return MessageSent(target=Target.NEXT_STEP, wakeup=False, message=Message.user(text))


def _steer_table(server: _Server, stamps: _Stamps, client: Any, repeats: int, idle: int) -> str:
    host = server.host

    async def owner_steer(session: str, text: str) -> float:
        owner = await host.take(session)
        started = time.perf_counter()
        await owner.steer(text)
        return started

    async def host_send(session: str, text: str) -> float:
        started = time.perf_counter()
        await host.send(session, "steer", text)
        return started

    def http_post(session: str, text: str) -> float:
        started = time.perf_counter()
        answer = client.post(f"/api/sessions/{session}/messages", json={"mode": "steer", "text": text})
        assert answer.status_code == 202, answer.text
        return started

    async def settled(session: str) -> None:
        owner = host.hosted(session)
        if owner is not None:
            await owner.wait_idle(30)

    sides: list[tuple[str, Callable[[str, str], float]]] = [
        ("AsyncOwner.steer, in-process", lambda s, t: server.call(owner_steer(s, t))),
        ("SessionHost.send", lambda s, t: server.call(host_send(s, t))),
        ("POST .../messages over HTTP", http_post),
    ]
    names = _idle_names(idle)
    samples: list[list[float]] = [[] for _ in sides]
    for i in range(repeats + 5):  # the first few warm up
        for k, (side, steer) in enumerate(sides):
            session = names[(i * len(sides) + k) % len(names)]  # idle since taken
            text = f"steer {i} of {side}"
            started = steer(session, text)
            seen = stamps.wait(text)
            server.call(settled(session))
            if i >= 5:
                samples[k].append(seen - started)
    rows = [(side, *_percentiles(taken)) for (side, _), taken in zip(sides, samples, strict=True)]
    base = rows[0]
    lines = [
        f"Steer to the model request that carries it, a session held idle among {idle} woken; "
        f"{repeats} sends each.",
        "",
        "| side | p50 | p99 | p50 added |",
        "|---|---:|---:|---:|",
    ]
    for side, p50, p99 in rows:
        lines.append(f"| {side} | {p50 * 1e3:.2f} ms | {p99 * 1e3:.2f} ms | "
                     f"{(p50 - base[1]) * 1e3:+.2f} ms |")
    return "\n".join(lines)


def _fanout_table(server: _Server, client: Any, subscribers: int, sends: int) -> str:
    host = server.host
    session = "fanout"
    client.post(f"/api/sessions/{session}/messages", json={"mode": "inject", "text": "start"})
    port = int(server.address.rsplit(":", 1)[1])

    async def sse_reader(got: list[dict[int, float]], ready: asyncio.Event, after: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write((f"GET /api/sessions/{session}/events?after={after} HTTP/1.1\r\n"
                      f"Host: bench\r\nAuthorization: Bearer {TOKEN}\r\n\r\n").encode())
        await writer.drain()
        seen: dict[int, float] = {}
        got.append(seen)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b": events"):
                    ready.set()
                elif line.startswith(b"id: "):
                    seen[int(line[4:])] = time.perf_counter()
        finally:
            writer.close()

    async def owner_reader(got: list[dict[int, float]], ready: asyncio.Event, after: int) -> None:
        owner = host.hosted(session)
        seen: dict[int, float] = {}
        got.append(seen)
        ready.set()
        async for event in owner.events(after):
            seen[event.seq] = time.perf_counter()

    async def measure(kind: str, count: int) -> list[float]:
        owner = await host.take(session)
        after = owner.session.version
        got: list[dict[int, float]] = []
        readies = [asyncio.Event() for _ in range(count)]
        make = sse_reader if kind == "sse" else owner_reader
        readers = [asyncio.ensure_future(make(got, ready, after)) for ready in readies]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
        latencies = []
        for i in range(sends):
            started = time.perf_counter()
            sent = await owner.inject(f"fan {i}")
            deadline = time.monotonic() + 30
            while not all(sent.seq in seen for seen in got):
                if time.monotonic() > deadline:
                    raise TimeoutError("a subscriber never got its event")
                await asyncio.sleep(0.0005)
            latencies.append(max(seen[sent.seq] for seen in got) - started)
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        return latencies

    rows = []
    for side, kind, count in ((f"AsyncOwner.events(), {subscribers} readers", "owner", subscribers),
                              ("SSE, 1 subscriber", "sse", 1),
                              (f"SSE, {subscribers} subscribers", "sse", subscribers)):
        rows.append((side, *_percentiles(server.call(measure(kind, count)))))
    lines = [
        f"Fan-out of one session: send to the last subscriber's read; {sends} sends.",
        "",
        "| side | p50 | p99 |",
        "|---|---:|---:|",
    ]
    lines += [f"| {side} | {p50 * 1e3:.2f} ms | {p99 * 1e3:.2f} ms |" for side, p50, p99 in rows]
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    """The three tables, as markdown."""
    try:
        import httpx
        import uvicorn  # noqa: F401
    except ImportError:
        return "(the web extra and httpx are not installed: pip install 'nous-inbox[web-test]')"
    idle, repeats, subscribers, sends, settle = ((50, 30, 20, 20, 1.0) if quick
                                                 else (1000, 300, 100, 200, 5.0))
    stamps = _Stamps()

    def agent(session: str) -> Runner:
        return _turns_agent(session) if session.startswith("turns-") else stamps.agent(session)

    with tempfile.TemporaryDirectory() as tmp, \
            _Server(f"sqlite:{Path(tmp) / 'bench.sqlite'}", agent, 2 * idle) as server, \
            httpx.Client(base_url=server.address, headers=AUTH, timeout=60) as client:
        tables = [_idle_table(server, idle, settle),
                  _steer_table(server, stamps, client, repeats, idle),
                  _fanout_table(server, client, subscribers, sends)]
    return "\n\n".join(tables)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
