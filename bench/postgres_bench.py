"""PostgreSQL against SQLite, side by side: appends, owner round trips, concurrent senders, steers.

The baseline is the store a user would otherwise pick: ``sqlite:`` (the embedded default, WAL,
``synchronous=FULL``) on a local file. The PostgreSQL side is a real server: the one
``NOUS_INBOX_TEST_POSTGRES`` names, or a private cluster started for the run from the binaries
on the machine (``tests/postgres_server.py``; ``fsync=on``, loopback TCP). Every row is durable
on both sides: nothing is acknowledged before its transaction committed.

Measured, each side in the same run, interleaved, best of the repeats:

* single appends: one event per ``append`` (with an expected version, as the owner appends);
* batched appends: ten events per ``append``, per event;
* owner send-to-claim: ``Owner.inject`` then the run's claim, one thread (``bench.owner_bench``);
* concurrent senders: 1, 8 and 32 threads injecting 800 messages in all into one owner; sends
  per second (best repeat), and the speed-up over one sender (the owner's group commit lets
  concurrent sends share one transaction): the median over repeats of each repeat's ratio, its
  1, 8 and 32 sender runs made back to back, so a disk that slows between repeats does not skew
  it;
* cross-process steer latency, p50 and p99: another process steers an idle agent; the time from
  the steer's acknowledgement (its append returned) to the agent's run claiming it at its next
  step. ``sqlite:`` is polled (the owner's 50 ms watcher); ``postgresql:`` is woken by NOTIFY,
  and, for comparison, by its polling backstop alone (``pooler=transaction`` turns LISTEN off;
  ``poll`` 0.5 s here, 2 s by default).

Ratios are PostgreSQL's time over SQLite's (above 1: PostgreSQL is slower). A local SQLite file
has no network round trip; what PostgreSQL buys is many machines on one log, not speed.
Run ``python -m bench.postgres_bench`` (``--quick``: small and fast).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench._common import all_at_once, postgres_url
from bench.owner_bench import _NoRun, _owner
from nous_inbox.events import Event, QueueClaimed, Warned
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.store import open_store
from nous_inbox.verbs import Target

__all__ = ["Figures", "measure", "render", "run", "main"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Figures:
    """One store's figures (seconds per operation, sends per second)."""

    single: float = float("inf")
    batched: float = float("inf")  # per event
    round_trip: float = float("inf")
    senders: dict[int, float] | None = None
    speedups: dict[int, list[float]] | None = None  # k senders over 1, measured back to back
    steer: tuple[float, float] = (float("inf"), float("inf"))  # p50, p99
    steer_backstop: tuple[float, float] = (float("inf"), float("inf"))
    poll: float = 0.5  # the backstop's interval in the backstop row


def _appends(url: str, n: int, batch: int) -> float:
    stream = f"append-{uuid.uuid4().hex[:8]}"
    events = [Warned(text=f"w{i}") for i in range(batch)]
    with open_store(url) as store:
        store.append(stream, events)  # connection and schema warm
        version = store.version(stream)
        begin = time.perf_counter()
        for _ in range(n):
            version = store.append(stream, events, expected_version=version)[-1].seq
        return (time.perf_counter() - begin) / (n * batch)


def _senders(url: str, threads: int, total: int) -> float:
    per_thread = total // threads
    with open_store(url) as store:
        owner = Owner(store, f"senders-{uuid.uuid4().hex[:8]}", _NoRun(), watch=False,
                      start=False)
        try:
            owner.inject("warm")

            def send() -> None:
                for i in range(per_thread):
                    owner.inject(f"m{i}")

            return threads * per_thread / all_at_once([send] * threads)
        finally:
            owner.close()


STEERER = r"""
import sys, time
from nous_inbox.events import MessageSent
from nous_inbox.message import Message
from nous_inbox.store import open_store

store = open_store(sys.argv[1])
store.version(sys.argv[2])  # connected before the first command
print("ready", flush=True)
for line in sys.stdin:
    sent = time.time()
    store.append(sys.argv[2], [MessageSent(target="next_step", wakeup=True,
                                           message=Message.user(line.strip()))])
    print(time.time(), flush=True)  # acknowledged
"""


def _answer(transcript: object, tools: object) -> Message:
    return Message.assistant("ok")


def _steer_latency(url: str, samples: int, spread: float) -> tuple[float, float]:
    """p50 and p99 seconds from another process's steer being acknowledged to an idle agent's
    run claiming it at its next step.

    Each steer is sent after a random pause of up to ``spread`` seconds, so it falls anywhere in
    a polling owner's interval (sent right after the last one was seen, every steer would wait
    a whole interval).
    """
    stream = f"steer-{uuid.uuid4().hex[:8]}"
    claims: list[float] = []
    arrived = threading.Condition()

    def on_event(event: Event) -> None:
        if type(event) is QueueClaimed and event.target is Target.NEXT_STEP and event.count:
            with arrived:
                claims.append(time.time())
                arrived.notify_all()

    latencies = []
    with open_store(url) as store, \
            Owner(store, stream, Runner(_answer), listen=on_event, start=False) as owner:
        child = subprocess.Popen(
            [sys.executable, "-c", STEERER, url, stream], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )
        assert child.stdin is not None and child.stdout is not None
        try:
            assert child.stdout.readline() == "ready\n"
            for i in range(samples):
                time.sleep(random.uniform(0, spread))  # a pause in the benchmark, not a sync
                word = f"steer{i}"
                child.stdin.write(word + "\n")
                child.stdin.flush()
                acknowledged = float(child.stdout.readline())
                with arrived:
                    if not arrived.wait_for(lambda i=i: len(claims) > i, timeout=60):
                        raise RuntimeError(f"{url}: the agent never claimed {word!r}")
                latencies.append(claims[i] - acknowledged)
                if not owner.wait_idle(60):
                    raise RuntimeError(f"{url}: the agent's run never ended")
        finally:
            child.stdin.close()
            child.wait(30)
    return _percentile(latencies, 0.5), _percentile(latencies, 0.99)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def measure(quick: bool, pg_url: str, sqlite_url: str) -> dict[str, Figures]:
    """Each figure for both stores, interleaved; the best repeat of each is kept."""
    n = 30 if quick else 500
    sends = 32 if quick else 800  # in all, shared by the sending threads
    samples = 5 if quick else 200
    counts = (1, 8, 32)
    repeats = 1 if quick else 3
    figures = {"sqlite": Figures(senders={}, speedups={}),
               "postgres": Figures(senders={}, speedups={})}
    urls = {"sqlite": sqlite_url, "postgres": pg_url}
    for _ in range(repeats):
        for side, url in urls.items():
            f = figures[side]
            assert f.senders is not None
            f.single = min(f.single, _appends(url, n, 1))
            f.batched = min(f.batched, _appends(url, n // 5, 10))
            f.round_trip = min(f.round_trip, _owner(n, url).round_trip)
            assert f.speedups is not None
            rates = {k: _senders(url, k, sends) for k in counts}
            for k in counts:
                f.senders[k] = max(f.senders.get(k, 0.0), rates[k])
                # The speed-up of one repeat, its rates measured back to back: a machine whose
                # disk slows down between repeats moves both sides of this ratio alike.
                f.speedups.setdefault(k, []).append(rates[k] / rates[1])
    poll = 0.1 if quick else 0.5
    for side, url in urls.items():
        figures[side].steer = _steer_latency(url, samples, 0.1)
    backstop = f"{pg_url}{'&' if '?' in pg_url else '?'}pooler=transaction&poll={poll}"
    figures["postgres"].steer_backstop = _steer_latency(backstop, samples // 2 or 1, poll)
    figures["postgres"].poll = poll
    return figures


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 1 else f"{ratio:.1f}x"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def _speedup(f: Figures, k: int) -> str:
    """The median over repeats of k senders' rate over one sender's, each pair back to back."""
    ratios = (f.speedups or {}).get(k) or [1.0]
    return f"{statistics.median(ratios):.1f}x"


def render(figures: dict[str, Figures], quick: bool = False) -> str:
    """A markdown table: each figure for sqlite: and postgresql:, and their ratio."""
    sq, pg = figures["sqlite"], figures["postgres"]
    assert sq.senders is not None and pg.senders is not None
    lines = ["| measure | sqlite: | postgresql: | postgresql / sqlite |", "|---|---:|---:|---:|"]
    for name, a, b in (
        ("single append (1 event)", sq.single, pg.single),
        ("batched append, per event (10 a batch)", sq.batched, pg.batched),
        ("owner send -> claim round trip", sq.round_trip, pg.round_trip),
    ):
        lines.append(f"| {name} | {_ms(a)} | {_ms(b)} | {_x(b / a)} |")
    for k in sorted(sq.senders):
        a, b = sq.senders[k], pg.senders[k]
        lines.append(
            f"| {k} sender(s) into one owner, sends/s (x one sender) | {a:,.0f} "
            f"({_speedup(sq, k)}) | {b:,.0f} ({_speedup(pg, k)}) | {a / b:.1f}x slower |"
        )
    for q, name in ((0, "p50"), (1, "p99")):
        lines.append(
            f"| cross-process steer, acknowledged -> claimed at the next step, {name} (sqlite "
            f"polled; postgresql NOTIFY) | {_ms(sq.steer[q])} | {_ms(pg.steer[q])} "
            f"| {_x(pg.steer[q] / sq.steer[q])} |")
    for q, name in ((0, "p50"), (1, "p99")):
        lines.append(
            f"| the same, {name}, postgresql by its polling backstop alone (poll {pg.poll:g} s) "
            f"| | {_ms(pg.steer_backstop[q])} | NOTIFY is "
            f"{pg.steer_backstop[q] / pg.steer[q]:.0f}x faster than the backstop |")
    eight = statistics.median((pg.speedups or {}).get(8) or [0.0])
    lines.append(f"| group commit on postgresql: 8 senders over 1 (floor 5x) | | {eight:.1f}x | "
                 f"{'holds' if eight >= 5 else 'BELOW THE FLOOR'} |")
    if quick:
        lines.append("")
        lines.append("(quick run: small sizes, one repeat; shows the code works, not the figures)")
    return "\n".join(lines)


def run(quick: bool = False, url: str | None = None) -> str:
    """Measure and render; ``url`` names the PostgreSQL store, else a private cluster is started."""
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(postgres_url())
            if url is None:
                return "(skipped: no PostgreSQL server; set NOUS_INBOX_TEST_POSTGRES)"
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        return render(measure(quick, url, f"sqlite:{Path(tmp) / 'bench.sqlite'}"), quick)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    args = parser.parse_args(argv)
    print(run(args.quick))


if __name__ == "__main__":
    main()
