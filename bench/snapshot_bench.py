"""Long sessions: opening with and without a snapshot, and send latency as the history grows.

One ``sqlite:`` store (the default) holds a session of ``H`` events, a run's usual mix: per round a
steer (``MessageSent``), its claim, a step start, a model reply and a tool result, so about three
messages in every five events reach the transcript. Each measurement runs in a fresh Python
process, so its peak memory (``VmHWM``) is its own.

Open (the first table): the baseline is what an owner did before snapshots and still does
without one, ``replay(store.read(stream))`` from the first event; against it,
``load_session(store, stream)`` from a snapshot taken ``T`` events before the end (``T`` = 1 000),
decoding the snapshot and replaying the tail. Columns: open time, peak RSS of the process after the
open, and the memory the open added (RSS after minus before). Ratios are baseline / snapshot
(higher is better). The time to save that snapshot (encode + one SQLite write) is shown too,
with what it costs per event spread over the interval an owner saves at (``snapshot_every`` or a
tenth of the session, whichever is more).

Sends (the second table): an ``Owner`` on that store, opened on a short session (100 events) and on
the long one, then ``M`` injections (durable sends, no run; after 50 untimed), each timed; p50, p99 and the longest,
plus the time of one full collection (``gc.collect()``) with the history loaded: that is the
pause a send pays when it happens to trigger one, rarely within a short run (CPython starts a full
pass only once the heap grew by a quarter), so it is timed on its own. The long session
is run twice: with ``freeze_gc=True`` (``gc.freeze()`` after the open) and with the default,
which leaves the collector alone. Ratios are long / short (1.0 is flat).

Crossing a save point (the third table): the sends above are too few to reach the owner's next
snapshot, but one send per interval does: the owner saves the whole session inside that send,
under its lock. So an owner is opened on the long session and sends until it has saved (about
a tenth of the session, ``snapshot_every`` at least, after the open's snapshot): p50, p99 and
the longest over all of them, and the send that carried the save.

``python -m bench.snapshot_bench`` runs at ``H`` = 200 000 (``--quick``: 20 000); ``--events
1000000`` for a million-event session (about 4 minutes, 1 GB of RAM).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nous_inbox import Message, Target
from nous_inbox.events import (
    Event,
    MessageSent,
    ModelReplied,
    QueueClaimed,
    StepStarted,
    ToolReturned,
)
from nous_inbox.session import replay
from nous_inbox.store import open_store
from nous_inbox.store.snapshot import SNAPSHOT_EVERY, SNAPSHOT_SHARE, load_session, save_snapshot

__all__ = ["fill", "main", "run"]

STREAM = "long"
SHORT = "short"
TAIL = 1_000
_WARM = 50


def _round(i: int) -> list[Event]:
    return [
        MessageSent(target=Target.NEXT_STEP, wakeup=True,
                    message=Message.user(f"steer {i}: look at the cdn log next")),
        QueueClaimed(target=Target.NEXT_STEP, count=1),
        StepStarted(turn=1, step=i + 1),
        ModelReplied(turn=1, step=i + 1, message=Message.assistant(
            f"reading cdn.log part {i}", metadata={"model": "m", "tokens": i % 997})),
        ToolReturned(turn=1, step=i + 1, message=Message.tool(
            f"part {i}: 502 burst from one edge (fra2) at 09:13", f"c{i}", name="read_log")),
    ]


def fill(url: str, stream: str, events: int) -> None:
    """Append about ``events`` events of the usual mix to ``stream`` (in batches)."""
    with open_store(url) as store:
        batch: list[Event] = []
        i = 0
        while store.version(stream) + len(batch) < events:
            batch.extend(_round(i))
            i += 1
            if len(batch) >= 5_000:
                store.append(stream, batch)
                batch = []
        if batch:
            store.append(stream, batch)


def _peak() -> int:
    """This process's peak resident set size, in bytes (``VmHWM``: unlike ``ru_maxrss``, it does
    not carry the parent's peak over a fork)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss() -> int:
    """Resident set size now, in bytes (Linux: /proc; else the peak)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child_open(url: str, how: str) -> dict[str, Any]:
    with open_store(url, read_only=True) as store:
        before = _rss()
        started = time.perf_counter()
        if how == "full":
            session = replay(store.read(STREAM), stream=STREAM)
            replayed = session.version
        else:
            opened = load_session(store, STREAM)
            session, replayed = opened.session, opened.replayed
        seconds = time.perf_counter() - started
        return {"seconds": seconds, "added": _rss() - before, "replayed": replayed,
                "peak": _peak(),
                "version": session.version}


class _NoRun:
    def run_turn(self, port: Any, **kwargs: Any) -> Any:
        raise AssertionError("no run should start in this benchmark")


def _child_sends(url: str, stream: str, sends: int, freeze: bool) -> dict[str, Any]:
    from nous_inbox.owner import Owner

    with open_store(url) as store:
        owner = Owner(store, stream, _NoRun(), watch=False, start=False, freeze_gc=freeze)
        try:
            for i in range(_WARM):  # the first sends of a process pay for its first writes
                owner.inject(f"warm {i}")
            times = []
            for i in range(sends):
                started = time.perf_counter()
                owner.inject(f"fyi {i}")
                times.append(time.perf_counter() - started)
            started = time.perf_counter()
            gc.collect()
            full = time.perf_counter() - started
        finally:
            owner.close()
    times.sort()
    return {"p50": statistics.median(times), "p99": times[int(len(times) * 0.99)],
            "max": times[-1], "gc": full}


def _child_crossing(url: str, stream: str, every: int) -> dict[str, Any]:
    from nous_inbox.owner import Owner

    with open_store(url) as opened:
        store: Any = opened
        saved: list[int] = []
        save = store.save_snapshot

        def saving(stream: str, seq: int, data: bytes) -> bool:
            saved.append(seq)  # instrumented only to tell which send carried the save
            kept: bool = save(stream, seq, data)
            return kept

        store.save_snapshot = saving
        owner = Owner(store, stream, _NoRun(), watch=False, start=False, snapshot_every=every)
        try:
            for i in range(_WARM):
                owner.inject(f"warm {i}")
            times: list[float] = []
            crossing = -1.0
            while crossing < 0 or len(times) < 200:
                before = len(saved)
                started = time.perf_counter()
                owner.inject(f"fyi {len(times)}")
                took = time.perf_counter() - started
                times.append(took)
                if len(saved) > before and crossing < 0:
                    crossing = took
        finally:
            owner.close()
    times.sort()
    return {"p50": statistics.median(times), "p99": times[int(len(times) * 0.99)],
            "max": times[-1], "crossing": crossing, "sends": len(times)}


def _spawn(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.snapshot_bench", "--child", *args],
        check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    return result


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB"


def _ms(s: float) -> str:
    return f"{s * 1000:.2f} ms" if s < 0.1 else f"{s * 1000:.0f} ms"


def measure(events: int, sends: int, every: int = SNAPSHOT_EVERY) -> dict[str, Any]:
    """Build the store, run every child, and return the raw figures."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:{Path(tmp) / 'inbox.sqlite'}"
        fill(url, STREAM, events)
        fill(url, SHORT, 100)
        with open_store(url) as store:
            version = store.version(STREAM)
            # the snapshot TAIL events before the end: what an owner saving every N leaves
            head = replay((e for e in store.read(STREAM) if e.seq <= version - TAIL), stream=STREAM)
            started = time.perf_counter()
            save_snapshot(store, STREAM, head)
            save = time.perf_counter() - started
            del head
        with sqlite3.connect(url.removeprefix("sqlite:")) as db:  # no child pays for the fill
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        full = _spawn("open", url, "full")
        snap = _spawn("open", url, "snapshot")
        short = _spawn("sends", url, SHORT, str(sends), "1")
        long_frozen = _spawn("sends", url, STREAM, str(sends), "1")
        long_plain = _spawn("sends", url, STREAM, str(sends), "0")
        crossing = _spawn("crossing", url, STREAM, str(every))
    return {"events": version, "save": save, "full": full, "snapshot": snap, "short": short,
            "long": long_frozen, "long_plain": long_plain, "sends": sends, "crossing": crossing}


def render(r: dict[str, Any]) -> str:
    """The two markdown tables."""
    full, snap = r["full"], r["snapshot"]
    interval = max(SNAPSHOT_EVERY, r["events"] // SNAPSHOT_SHARE)
    lines = [
        f"Opening a {r['events']:,}-event session on `sqlite:` (snapshot {TAIL:,} events before "
        f"the end; saving it took {_ms(r['save'])}, which an owner pays once per {interval:,} "
        f"events at this length: {r['save'] / interval * 1e6:.1f} µs per event)",
        "",
        "| open | events replayed | time | peak RSS | memory added |",
        "|---|---:|---:|---:|---:|",
        f"| full replay (baseline) | {full['replayed']:,} | {_ms(full['seconds'])} | "
        f"{_mb(full['peak'])} | {_mb(full['added'])} |",
        f"| from the snapshot | {snap['replayed']:,} | {_ms(snap['seconds'])} | "
        f"{_mb(snap['peak'])} | {_mb(snap['added'])} |",
        f"| ratio (baseline / snapshot) | | {full['seconds'] / snap['seconds']:.1f}x | "
        f"{full['peak'] / snap['peak']:.2f}x | {full['added'] / max(snap['added'], 1):.2f}x |",
        "",
        f"Send latency, {r['sends']:,} durable injections to an `Owner` on `sqlite:`",
        "",
        "| history | p50 | p99 | longest | one full `gc.collect()` |",
        "|---|---:|---:|---:|---:|",
    ]
    short = r["short"]
    for name, row in (("100 events", short),
                      (f"{r['events']:,} events, `freeze_gc=True`", r["long"]),
                      (f"{r['events']:,} events, `freeze_gc=False` (default)", r["long_plain"])):
        lines.append(f"| {name} | {_ms(row['p50'])} | {_ms(row['p99'])} | {_ms(row['max'])} | "
                     f"{_ms(row['gc'])} |")
    for name, row in (("long / short, frozen", r["long"]), ("long / short, no freeze", r["long_plain"])):
        lines.append(
            f"| {name} | {row['p50'] / short['p50']:.2f}x | {row['p99'] / short['p99']:.2f}x | "
            f"{row['max'] / short['max']:.2f}x | {row['gc'] / short['gc']:.2f}x |"
        )
    crossing = r["crossing"]
    lines += [
        "",
        f"Crossing a save point: sends to an `Owner` on the {r['events']:,}-event session until "
        f"it saved its next snapshot ({crossing['sends']:,} sends)",
        "",
        "| sends | p50 | p99 | longest | the send that saved |",
        "|---|---:|---:|---:|---:|",
        f"| {crossing['sends']:,} | {_ms(crossing['p50'])} | {_ms(crossing['p99'])} | "
        f"{_ms(crossing['max'])} | {_ms(crossing['crossing'])} |",
    ]
    return "\n".join(lines)


def run(quick: bool = False, events: int | None = None, sends: int | None = None,
        every: int = SNAPSHOT_EVERY) -> str:
    """Measure and render (``quick``: 20 000 events, 300 sends); ``every`` is the crossing
    owner's ``snapshot_every`` (a small one reaches a save point sooner on a short session)."""
    n = events if events is not None else (20_000 if quick else 200_000)
    m = sends if sends is not None else (300 if quick else 2_000)
    return render(measure(n, m, every))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="20 000 events, 300 sends")
    parser.add_argument("--events", type=int, help="the long session's length (e.g. 1000000)")
    parser.add_argument("--sends", type=int, help="how many sends are timed")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        what, *rest = args.child
        if what == "open":
            print(json.dumps(_child_open(rest[0], rest[1])))
        elif what == "crossing":
            print(json.dumps(_child_crossing(rest[0], rest[1], int(rest[2]))))
        else:
            print(json.dumps(_child_sends(rest[0], rest[1], int(rest[2]), rest[3] == "1")))
        return
    print(run(args.quick, args.events, args.sends))


if __name__ == "__main__":
    main()
