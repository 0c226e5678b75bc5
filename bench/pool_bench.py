"""A pool of ``nous-inbox serve`` processes on one PostgreSQL: the spread, takeovers, steers.

What an operator running several ``serve`` processes over thousands of sessions sees, measured
with real processes: three ``python -m nous_inbox serve`` on one private PostgreSQL cluster
(``tests/postgres_server.py``, ``fsync=on``; or the server ``NOUS_INBOX_TEST_POSTGRES`` names),
the store's lease ``LEASE`` seconds, its other settings and ``serve``'s defaults (a scan every
second, a drain timeout of 10 s) as a user would leave them. The store holds ``sessions``
sessions, each with one message that wakes nothing; once the processes are up, ``active`` of them
are given a prompt in the log (as the command line sends one, through no process), which the
processes' scans find. Their agent is :func:`agent` (``--agent bench.pool_bench:agent``): a model
that answers in ``STEP`` seconds with a call of a tool that returns at once, for up to
``STEPS`` steps a turn, so the active sessions keep working throughout the run.

Who holds a session is read from the store's lease rows (``nous_inbox_streams``: the holder's
pid, the lease's expiry), every 20 ms, from outside the processes: a session is held by a
process when its row names that process's pid and its lease has not expired.

* **Sessions per process**: once every active session is held, how many each process holds
  (min / max), and how long the pool took to hold them all from the prompts' append.
* **Steer to model request**: a steer ``POST``ed to a process that does *not* hold the session
  (so it is appended to the log and its holder's owner, told by PostgreSQL's NOTIFY, claims it at
  its run's next step); the time from the request's start until the holder's model is called with
  the steer in its transcript (the agent stamps the moment it first sees a marker text, on the
  machine's monotonic clock, into a file the benchmark reads), p50 / p99.
* **SIGTERM one** (a rolling restart): the time until every session it held is held by another
  process (it drains: each session handed over at its run's next boundary, its lease given back,
  the others told at once); the target is well under the lease.
* **SIGKILL one**, after a fresh process replaced the drained one: the time until every session
  it held is held by another; nothing tells the others, so its leases must expire (``LEASE``
  seconds after their last renewal) and the others' scans find them: the bound is lease + 2 s.

``python -m bench --only pool_bench`` (the full size takes minutes: seeding ten thousand sessions
and the takeovers under load); ``--quick``: small and fast, shows the code works.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import postgres_url
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner import Runner
from nous_inbox.runner.tools import Tool

__all__ = ["Figures", "Size", "agent", "main", "run"]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0000"
#: The text every benchmarked steer starts with: the agent stamps when its model first sees one.
MARK = "pool-steer-"
#: Where the agent writes its stamps, and the pace of its steps (environment of each ``serve``).
STAMPS_VARIABLE = "NOUS_INBOX_POOL_STAMPS"
STEP_VARIABLE = "NOUS_INBOX_POOL_STEP_SECONDS"
STEP = 0.005  # seconds a model request takes: a few ms, so an active session steps constantly
STEPS = 1000  # model requests a turn may make: enough that a turn outlasts the run
WAIT = 600.0  # seconds: a bound on what should happen, never a pause to let it
SPREAD_WAIT = 180.0  # seconds the pool is given to hold every active session


# -- the agent, in each serve process ---------------------------------------------------------------


class _Worker:
    """The model of :func:`agent`: each request takes ``STEP`` seconds and calls ``work``; a
    steer carrying :data:`MARK` is stamped (its text and the monotonic clock) the first time a
    request's transcript holds it, so the benchmark sees when the model saw it."""

    def __init__(self, stamps: str | None, step: float) -> None:
        self._stamps = stamps
        self._step = step
        self._seen: set[str] = set()

    async def __call__(self, transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        now = time.monotonic()
        if self._stamps is not None:
            for message in reversed(transcript):  # those delivered since the last reply
                if message.role == "assistant":
                    break
                text = message.content
                if message.role == "user" and text.startswith(MARK) and text not in self._seen:
                    self._seen.add(text)
                    # One short line in append mode: written whole, whichever process writes.
                    with open(self._stamps, "a") as out:
                        out.write(f"{text} {now!r}\n")
        await asyncio.sleep(self._step)
        return Message.assistant("", tool_calls=[ToolCall(f"w{len(transcript)}", "work", {})])


def _work() -> str:
    """Do one piece of the work (at once)."""
    return "ok"


def agent(session: str) -> Runner:
    """The benchmark's agent for ``serve --agent bench.pool_bench:agent``: it works step after
    step (``$NOUS_INBOX_POOL_STEP_SECONDS`` each) and stamps the steers it sees into the file
    ``$NOUS_INBOX_POOL_STAMPS`` names."""
    worker = _Worker(os.environ.get(STAMPS_VARIABLE),
                     float(os.environ.get(STEP_VARIABLE, str(STEP))))
    return Runner(worker, [Tool(_work, name="work")], max_steps=STEPS)


# -- the pool, from outside -------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    """How big a run is."""

    sessions: int
    active: int
    max_sessions: int  # per process: any two must hold every active session
    steers: int
    lease: float
    step: float = STEP  # seconds each model request of an active session takes


FULL = Size(sessions=10_000, active=1_000, max_sessions=600, steers=30, lease=5.0, step=10.0)
QUICK = Size(sessions=60, active=12, max_sessions=10, steers=5, lease=2.0)


@dataclass
class Figures:
    """What a run measured (seconds unless said)."""

    size: Size
    seeded: float = 0.0  # seconds to append the sessions
    held_all: float = 0.0  # from the prompts' append until every active session was held
    held: int = 0  # active sessions held then (all of them, unless the bound ran out)
    per_process: list[int] = field(default_factory=list)
    steers: list[float] = field(default_factory=list)
    drained: int = 0  # sessions the SIGTERMed process held
    drain: float = 0.0
    drain_exit: float = 0.0  # until the SIGTERMed process ended
    drain_takers: list[int] = field(default_factory=list)
    killed: int = 0
    kill: float = 0.0
    kill_takers: list[int] = field(default_factory=list)
    kill_moved: int = 0  # of them held elsewhere then (all, unless the bound ran out)
    load: tuple[float, float] = (0.0, 0.0)  # the machine's 1-minute load at start and end


class _Serve:
    """One ``nous-inbox serve`` process of the pool, its stderr in a file (a pipe nobody reads
    could fill and stall it)."""

    def __init__(self, url: str, directory: Path, index: int, size: Size, stamps: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), STAMPS_VARIABLE: str(stamps),
               STEP_VARIABLE: str(size.step)}
        self.errors = directory / f"serve-{index}.stderr"
        with open(self.errors, "w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "nous_inbox", "serve", "--store", url, "--port", "0",
                 "--token", TOKEN, "--agent", "bench.pool_bench:agent",
                 "--max-sessions", str(size.max_sessions)],
                stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT, env=env)
        self.address = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    def started(self) -> _Serve:
        """Wait until it says its address."""
        line: list[str] = []
        stdout = self.process.stdout
        assert stdout is not None
        reader = threading.Thread(target=lambda: line.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(120)
        if not line or "http://" not in line[0]:
            self.process.kill()
            raise RuntimeError(f"serve printed no address: {line!r} "
                               f"{self.errors.read_text()[-2000:]}")
        self.address = line[0].split()[2].split("#")[0].rstrip("/")
        return self

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


class _Leases:
    """The store's lease rows, read from outside the pool: who holds what now."""

    def __init__(self, url: str) -> None:
        import psycopg
        from psycopg.conninfo import make_conninfo

        from nous_inbox.store.postgres.url import split_url

        target = split_url(url)
        self._db = psycopg.connect(make_conninfo("", **target.params), autocommit=True)
        schema = target.ours.get("schema", "public")
        self._query = (f'SELECT stream, pid FROM "{schema}".nous_inbox_streams '
                       f"WHERE holder IS NOT NULL AND expires > clock_timestamp()")

    def held(self) -> dict[str, int]:
        """Each session held now, and the pid of the process holding it."""
        return {stream: pid for stream, pid in self._db.execute(self._query).fetchall()}

    def until(self, done: Callable[[dict[str, int]], bool], what: str,
              bound: float | None = None, progress: str = "") -> dict[str, int]:
        """Read the rows every 20 ms until ``done`` says yes: at most ``WAIT`` seconds (a
        ``TimeoutError``), or with a ``bound``, at most that long (the rows as they stand then).
        With ``progress``, say on stderr every 10 s how many sessions are held."""
        began = time.monotonic()
        said = began
        while True:
            held = self.held()
            if done(held):
                return held
            now = time.monotonic()
            if bound is not None and now - began > bound:
                print(f"(not within {bound:g} s: {what})", file=sys.stderr, flush=True)
                return held
            if now - began > WAIT:
                raise TimeoutError(f"not within {WAIT:g} s: {what}")
            if progress and now - said > 10:
                print(f"({now - began:.0f} s: {len(held)} {progress})", file=sys.stderr, flush=True)
                said = now
            time.sleep(0.02)  # sampling the rows, with a bound

    def close(self) -> None:
        self._db.close()


class _Stamps:
    """The agents' stamps file, read as it grows: when a model first saw each marked text."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()
        self._offset = 0
        self._seen: dict[str, float] = {}

    def wait(self, text: str) -> float:
        deadline = time.monotonic() + 120
        while text not in self._seen:
            with open(self.path, "rb") as stamps:
                stamps.seek(self._offset)
                chunk = stamps.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]  # a line half written is read next time
            self._offset += len(complete)
            for line in complete.decode().splitlines():
                seen, _, at = line.rpartition(" ")
                self._seen.setdefault(seen, float(at))
            if text in self._seen:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no model saw {text!r} within 120 s")
            time.sleep(0.002)  # sampling a file the agents append to, with a bound
        return self._seen[text]


def _names(size: Size) -> tuple[list[str], list[str]]:
    """Every session, and the active ones among them (spread through the names)."""
    names = [f"s{i:06d}" for i in range(size.sessions)]
    every = size.sessions // size.active
    return names, names[::every][:size.active]


def _seed(url: str, names: list[str]) -> None:
    """One message that wakes nothing in each session, by eight writers at once."""
    from nous_inbox.store import open_store
    from nous_inbox.store.journal import send_to

    def write(part: list[str]) -> None:
        with open_store(url) as store:
            for name in part:
                send_to(store, name, Message.user("kept for later"), "next_step", False)

    with ThreadPoolExecutor(8) as writers:
        list(writers.map(write, [names[i::8] for i in range(8)]))


def _wake(url: str, names: list[str]) -> None:
    from nous_inbox.store import open_store
    from nous_inbox.store.journal import send_to

    with open_store(url) as store:
        for name in names:
            send_to(store, name, Message.user("work on it"), "next_turn", True)


def _per_process(held: dict[str, int], among: Sequence[str], pool: Sequence[_Serve]) -> list[int]:
    counts = Counter(held[name] for name in among if name in held)
    return [counts.get(serve.pid, 0) for serve in pool]


def _moved(sessions: set[str], gone: int, alive: set[int]) -> Callable[[dict[str, int]], bool]:
    """Whether every one of ``sessions`` is held by a process of ``alive``."""
    def done(held: dict[str, int]) -> bool:
        return all(held.get(name) in alive for name in sessions)
    return done


def _steers(pool: list[_Serve], leases: _Leases, stamps: _Stamps, active: list[str],
            count: int) -> list[float]:
    """Steers POSTed to a process that does not hold the session, to the model's request."""
    import httpx

    clients = {serve.pid: httpx.Client(base_url=serve.address, timeout=60,
                                       headers={"Authorization": f"Bearer {TOKEN}"})
               for serve in pool}
    latencies = []
    try:
        chooser = random.Random(0)
        for i in range(count + 3):  # the first few warm the connections
            held = leases.held()
            session = chooser.choice([name for name in active if name in held])
            others = [pid for pid in clients if pid != held[session]]
            text = f"{MARK}{i}"
            client = clients[chooser.choice(others)]
            began = time.monotonic()
            answer = client.post(f"/api/sessions/{session}/messages",
                                 json={"mode": "steer", "text": text})
            if answer.status_code != 202:
                raise RuntimeError(f"steer to {session}: {answer.status_code} {answer.text}")
            seen = stamps.wait(text)
            if i >= 3:
                latencies.append(seen - began)
    finally:
        for client in clients.values():
            client.close()
    return latencies


def measure(url: str, size: Size, directory: Path) -> Figures:
    """Run the pool and take every figure of the module docstring."""
    figures = Figures(size, load=(os.getloadavg()[0], 0.0))
    names, active = _names(size)
    began = time.monotonic()
    _seed(url, names)
    figures.seeded = time.monotonic() - began
    stamps = _Stamps(directory / "stamps")
    leases = _Leases(url)
    pool: list[_Serve] = []
    try:
        pool = [_Serve(url, directory, i, size, stamps.path) for i in range(3)]
        for serve in pool:
            serve.started()
        began = time.monotonic()
        _wake(url, active)
        held = leases.until(lambda held: all(name in held for name in active),
                            f"all {len(active)} active sessions held", bound=SPREAD_WAIT,
                            progress="active sessions held")
        figures.held_all = time.monotonic() - began
        figures.held = sum(name in held for name in active)
        figures.per_process = _per_process(held, active, pool)
        figures.steers = _steers(pool, leases, stamps, active, size.steers)

        drained, killed, kept = pool
        handed = {name for name, pid in leases.held().items() if pid == drained.pid}
        figures.drained = len(handed)
        began = time.monotonic()
        drained.process.send_signal(signal.SIGTERM)
        held = leases.until(_moved(handed, drained.pid, {killed.pid, kept.pid}),
                            "the SIGTERMed process's sessions held by the others")
        figures.drain = time.monotonic() - began
        figures.drain_takers = _per_process(held, sorted(handed), [killed, kept])
        drained.process.wait(WAIT)
        figures.drain_exit = time.monotonic() - began

        fresh = _Serve(url, directory, 3, size, stamps.path)  # the restart's new version
        pool.append(fresh)
        fresh.started()
        lost = {name for name, pid in leases.held().items() if pid == killed.pid}
        figures.killed = len(lost)
        began = time.monotonic()
        killed.process.kill()
        held = leases.until(_moved(lost, killed.pid, {kept.pid, fresh.pid}),
                            "the SIGKILLed process's sessions held by the others",
                            bound=SPREAD_WAIT, progress="sessions held")
        figures.kill = time.monotonic() - began
        figures.kill_takers = _per_process(held, sorted(lost), [kept, fresh])
        figures.kill_moved = sum(figures.kill_takers)
        killed.process.wait()
    finally:
        for serve in pool:
            serve.stop()
        leases.close()
    figures.load = (figures.load[0], os.getloadavg()[0])
    return figures


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1,
                                                   round(0.99 * (len(ordered) - 1)))]


def render(f: Figures, quick: bool = False) -> str:
    """The figures as a markdown table, with what was run and the machine's load."""
    size = f.size
    p50, p99 = _percentiles(f.steers)
    lines = [
        f"Three `nous-inbox serve` processes (`--max-sessions {size.max_sessions}`, the scan every "
        f"second) on one PostgreSQL (lease {size.lease:g} s); {size.sessions:,} sessions in the "
        f"store (appended in {f.seeded:.0f} s), {size.active:,} of them active (an agent whose "
        f"model answers in {size.step * 1e3:g} ms with a tool call, step after step). Who holds what: "
        f"the store's lease rows, read every 20 ms. The machine's load: {f.load[0]:.1f} at the "
        f"start, {f.load[1]:.1f} at the end.",
        "",
        "| measure | figure | against |",
        "|---|---:|---|",
        f"| sessions per process, once all {size.active:,} active are held (min / max) | "
        f"{min(f.per_process):,} / {max(f.per_process):,} "
        f"({', '.join(f'{n:,}' for n in f.per_process)}) | an even share: {size.active / 3:,.0f} |",
        f"| the prompts' append to every active session held | {f.held_all:.2f} s"
        f"{'' if f.held == size.active else f' ({f.held:,} held, the bound)'} | |",
        f"| steer POSTed to a process not holding the session, to the model request, p50 | "
        f"{p50 * 1e3:.1f} ms | {len(f.steers)} steers |",
        f"| the same, p99 | {p99 * 1e3:.1f} ms | |",
        f"| SIGTERM one: all its {f.drained:,} sessions held elsewhere | {f.drain:.2f} s "
        f"(taken {' / '.join(map(str, f.drain_takers))}; the process ended after "
        f"{f.drain_exit:.2f} s) | target under 1 s; lease expiry: {size.lease:g} s |",
        f"| SIGKILL one (after a fresh process replaced the first): all its {f.killed:,} "
        f"sessions held elsewhere | {f.kill:.2f} s"
        f"{'' if f.kill_moved == f.killed else f', {f.kill_moved:,} of them, the bound'} (taken "
        f"{' / '.join(map(str, f.kill_takers))}, the fresh process second) | lease + 2 s: "
        f"{size.lease + 2:g} s |",
    ]
    if quick:
        lines += ["", "(quick run: small sizes; shows the code works, not the figures)"]
    return "\n".join(lines)


def run(quick: bool = False, url: str | None = None, size: Size | None = None) -> str:
    """Measure and render; ``url`` names the PostgreSQL store (a schema nothing else uses), else
    a private cluster is started (or the server ``NOUS_INBOX_TEST_POSTGRES`` names is used)."""
    size = size or (QUICK if quick else FULL)
    try:
        import httpx  # noqa: F401
        import psycopg  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return ("(the web and postgres extras and httpx are not installed: "
                "pip install 'nous-inbox[web-test,postgres]')")
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(postgres_url())
            if url is None:
                return "(skipped: no PostgreSQL server; set NOUS_INBOX_TEST_POSTGRES)"
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        joiner = "&" if "?" in url else "?"
        # A connection waits longer than libpq's default here: three processes' first scans
        # (every session loaded) keep the server busy for a while.
        figures = measure(f"{url}{joiner}lease={size.lease:g}&connect_timeout=60", size,
                          Path(tmp))
    return render(figures, quick)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--step", type=float, default=None,
                        help=f"seconds a model request of an active session takes (default {STEP:g})")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    if args.step is not None:
        size = dataclasses.replace(size, step=args.step)
    print(run(args.quick, size=size))


if __name__ == "__main__":
    main()
