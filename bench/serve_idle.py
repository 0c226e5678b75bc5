"""An idle ``nous-inbox serve`` over a store holding many sessions, read from outside it.

What an operator sees in ``top``: one ``serve`` process (the scripted agent of ``nous-inbox
demo``, the default ``--scan-interval`` of 1 s) over a store holding ``N`` sessions, each with
one message that wakes nothing (an injection, ruling 9), so none is worth hosting. Its CPU is
read from ``/proc/<pid>/stat`` over a quiet interval, as CPU seconds per wall second (100% is one
core), with its resident memory (``VmRSS``) and threads. ``N`` is 1,000 and 10,000 (100,000 with
``--large``), on ``sqlite:`` and on PostgreSQL (a private cluster, ``tests/postgres_server.py``).

When the measured interval begins: the store also holds one session that wants a wake, named to
sort after every other, so the host reaches it last in its first look through the store; once
``serve`` says it hosts that session and its turn has ended, the first look is over and what is
measured is the process at rest. Memory per *stored* session is the RSS slope between the two
smallest ``N`` (what ``serve`` keeps of each session it does not hold); memory and threads per
*held* idle session are ``bench/web_serve.py``'s, in ``web_bench``'s table.

``--code DIR`` runs ``serve`` from another checkout (``--code /path/to/main`` gives the figures
before a change), on stores seeded by this one.

``python -m bench --only serve_idle`` (``--quick``: 500 sessions, ``sqlite:`` only, 2 s);
``python -m bench.serve_idle --large`` adds 100,000.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import web_serve
from bench.web_serve import TOKEN, resident
from nous_inbox.events import MessageSent
from nous_inbox.message import Message
from nous_inbox.store import open_store
from nous_inbox.verbs import Target

ROOT = Path(__file__).resolve().parent.parent
WAIT = 900.0  # seconds: a bound on what should end (a first look at 100,000), never a pause
SENTINEL = "zzzz-sentinel"


@dataclass(frozen=True)
class Idle:
    """One ``serve`` at rest over ``sessions`` stored sessions."""

    store: str
    sessions: int
    cpu: float  # CPU seconds per wall second over the quiet interval
    resident: int  # bytes
    threads: int
    first_look: float  # seconds from the address printed to the sentinel's turn ended
    load: float  # the machine's 1-minute load average after the interval


def _inject(index: int) -> list[Any]:
    return [MessageSent(target=Target.NEXT_STEP, wakeup=False,
                        message=Message.user(f"fyi {index}"))]


def seed(url: str, start: int, stop: int, writers: int = 1) -> None:
    """Give the store sessions ``idle-<start>`` .. ``idle-<stop - 1>``, one injection each."""
    def write(part: range) -> None:
        with open_store(url) as store:
            for i in part:
                store.append(f"idle-{i:06d}", _inject(i))

    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(write, [range(start + k, stop, writers) for k in range(writers)]))


def _sentinel(url: str, run: int) -> str:
    name = f"{SENTINEL}-{run:03d}"
    with open_store(url) as store:
        store.append(name, [MessageSent(target=Target.NEXT_TURN, wakeup=True,
                                        message=Message.user("survey the logs"))])
    return name


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, sessions: int, settle: float, code: Path, run: int) -> Idle:
    """Start ``serve`` from ``code`` on ``url`` (seeded with ``sessions`` idle sessions), wait for
    its first look to end, and read it over ``settle`` quiet seconds."""
    import httpx

    sentinel = _sentinel(url, run)
    with tempfile.TemporaryDirectory() as tmp, web_serve.serving(Path(tmp), store=url, code=code, steps=1,
                                                      idle_timeout=None) as (process, address), \
            httpx.Client(base_url=address, headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=120) as client:
        started = time.perf_counter()
        deadline = time.monotonic() + WAIT

        def done() -> bool:
            state = client.get(f"/api/sessions/{sentinel}", params={"limit": 0}).json()
            return bool(state["hosted"] and state["turn"] >= 1 and not state["running"])

        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"serve never took {sentinel} within {WAIT:g} s")
            time.sleep(0.2)  # waiting for a condition, with a bound
        first_look = time.perf_counter() - started
        cpu, wall = _cpu(process.pid), time.perf_counter()
        time.sleep(settle)  # the measured interval: the process at rest
        busy = (_cpu(process.pid) - cpu) / (time.perf_counter() - wall)
        memory = resident(process.pid)
        threads = len(os.listdir(f"/proc/{process.pid}/task"))
    return Idle(url.split(":", 1)[0], sessions, busy, memory, threads, first_look,
                os.getloadavg()[0])


@contextlib.contextmanager
def _stores(kinds: tuple[str, ...]) -> Iterator[dict[str, str]]:
    """A fresh URL of each kind: ``sqlite:`` on disk, PostgreSQL on a private cluster."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        urls = {}
        if "sqlite" in kinds:
            urls["sqlite"] = f"sqlite:{tmp / 'idle.sqlite'}"
        if "postgres" in kinds:
            sys.path.insert(0, str(ROOT))
            from tests.postgres_server import Unavailable, server

            try:
                running = stack.enter_context(server())
                urls["postgres"] = running.fresh_url()[0]
            except Unavailable as exc:
                print(f"(no PostgreSQL server: {exc})", file=sys.stderr)
        yield urls


def _seed_sqlite(url: str, start: int, stop: int) -> None:
    """Seed through the store on a memory file system (its fsyncs cost nothing there), then
    move the file back: the rows are the store's own, the seeding minutes shorter."""
    path = Path(url.split(":", 1)[1])
    shm = Path("/dev/shm")
    if not shm.is_dir():
        seed(url, start, stop)
        return
    fast = shm / f"nous-inbox-seed-{os.getpid()}.sqlite"
    if path.exists():
        shutil.copyfile(path, fast)
    try:
        seed(f"sqlite:{fast}", start, stop)
        shutil.copyfile(fast, path)
    finally:
        for extra in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{fast}{extra}")


def collect(sizes: tuple[int, ...], settle: float, kinds: tuple[str, ...],
            code: Path = ROOT) -> list[Idle]:
    """Each kind at each size, seeded as it grows."""
    found: list[Idle] = []
    with _stores(kinds) as urls:
        for kind, url in urls.items():
            have = 0
            for run, size in enumerate(sizes):
                if kind == "sqlite":
                    _seed_sqlite(url, have, size)
                else:
                    seed(url, have, size, writers=8)
                have = size
                found.append(measure(url, size, settle, code, run))
    return found


def render(rows: list[Idle], settle: float, code: Path = ROOT) -> str:
    lines = [
        f"Idle `nous-inbox serve` (default `--scan-interval` 1 s), {settle:g} s at rest after its "
        f"first look; code: `{code}`",
        "",
        "| store | sessions stored | CPU at rest (% of a core) | first look | RSS | threads "
        "| load |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(f"| `{row.store}:` | {row.sessions:,} | {row.cpu * 100:.1f}% | "
                     f"{row.first_look:.1f} s | {row.resident / 2**20:.0f} MiB | {row.threads} | "
                     f"{row.load:.1f} |")
    for store in sorted({row.store for row in rows}):
        mine = [row for row in rows if row.store == store]
        if len(mine) >= 2:
            a, b = mine[0], mine[1]
            slope = (b.resident - a.resident) / (b.sessions - a.sessions) / 1024
            lines.append(f"\n`{store}:`: {slope:.1f} KiB of RSS per stored (not held) session, "
                         f"{a.sessions:,} to {b.sessions:,}.")
    return "\n".join(lines)


def run(quick: bool = False, large: bool = False, code: Path = ROOT) -> str:
    """Measure and render (``python -m bench``'s entry)."""
    sizes: tuple[int, ...]
    kinds: tuple[str, ...]
    if quick:
        sizes, settle, kinds = (500,), 2.0, ("sqlite",)
    else:
        sizes = (1_000, 10_000, 100_000) if large else (1_000, 10_000)
        settle, kinds = 10.0, ("sqlite", "postgres")
    return render(collect(sizes, settle, kinds, code), settle, code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--large", action="store_true", help="100,000 sessions too")
    parser.add_argument("--code", type=Path, default=ROOT, help="run serve from this checkout")
    parser.add_argument("--sizes", type=lambda text: tuple(int(n) for n in text.split(",")),
                        default=None, help="session counts, e.g. 1000,10000")
    parser.add_argument("--kinds", default="sqlite,postgres")
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.sizes is None:
        print(run(args.quick, args.large, args.code))
    else:
        rows = collect(args.sizes, args.settle, tuple(args.kinds.split(",")), args.code)
        print(render(rows, args.settle, args.code))


if __name__ == "__main__":
    main()
