"""Owner send-to-claim throughput and latency, against a mutable deque + Lock inbox.

The path measured is the one every message takes: a host thread sends, and the run's thread claims
it at a step boundary. One producer thread sends ``N`` messages as fast as it can; one consumer
thread claims ``next_step`` in a loop, the way a run does at each boundary, until it has them all.
Each message carries its send time, so the consumer knows each one's latency (claim time minus
send time).

Sides, in one process, same pre-built messages:

* baseline: the hand-written inbox (two deques and a ``threading.Lock``; see ``bench.inbox_bench``);
* ``Owner`` on ``memory:``: sends are ``MessageSent`` events appended and folded, claims are the
  runner's port claims (one ``QueueClaimed`` event each), so this is the owner's own overhead;
* ``Owner`` on ``sqlite:`` (the embedded default): the same, durably on disk (WAL; every append is
  a committed transaction), so a crash loses nothing that was acknowledged.

Group commit (a second table): ``S`` threads send (``inject``) to one owner at once, each waiting
for its send to be acknowledged (durably committed) before the next, as a host's request handlers
do. Concurrent sends share one store transaction, so on a durable store the throughput with 8
and 32 senders is set against the throughput of 1 sender, on the same store kind, in the same
run. ``file:`` (fsynced JSON Lines) is shown too. Beside it, the physical limit: one thread
inserting 8 rows per transaction into SQLite on the same disk with the store's pragmas (WAL,
``synchronous = FULL``), with the 8-sender group commit on ``sqlite:`` as a ratio of it (floor:
0.5x): 8 threads on an ``Owner``, and 8 asyncio tasks on an ``AsyncOwner`` (a web host's request
handlers), each paired with the limit measured right before it. A third pair is the threads'
ceiling: 8 threads through the group commit alone, its commit a raw transaction, so what the
threads' own wake-ups cost shows apart from what an owner does.

Sends use ``inject`` (no wake) so no run starts: the consumer plays the run's claims itself.
Throughput is messages per second from first send to last claim, with the two threads contending.
Latency is measured uncontended, in one thread: one send, then one claim that returns it, repeated;
the median round trip is reported. (Under contention both sides' latencies are dominated by
CPython's 5 ms GIL switch interval, which says nothing about either inbox.) Ratios are how many
times slower than the baseline. Run ``python -m bench.owner_bench`` (``--quick``: small and fast).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench._common import RAW_ROWS, all_at_once, raw_db, raw_limit, raw_transaction
from bench.inbox_bench import MutableInbox
from nous_inbox import Message, Target
from nous_inbox.events import Event, Warned
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.group_commit import GroupCommit, commit_in_threads
from nous_inbox.store import open_store

__all__ = ["GroupRow", "GroupRun", "Row", "measure", "measure_group", "render", "render_group", "run", "main"]


class _NoRun:
    """A runner that is never needed: sends here never wake (they are injections)."""

    def run_turn(self, port: Any, **kwargs: Any) -> Any:
        raise AssertionError("no run should start in this benchmark")

    def arun_turn(self, port: Any, **kwargs: Any) -> Any:
        raise AssertionError("no run should start in this benchmark")


@dataclass(frozen=True)
class Row:
    side: str
    throughput: float  # messages per second, producer and consumer threads contending
    round_trip: float  # seconds: one send then the claim that returns it, uncontended


def _drive(
    n: int,
    send: Callable[[Message], object],
    claim: Callable[[], Sequence[Message]],
) -> Row:
    messages = [Message.user(f"m{i}") for i in range(n)]
    started = threading.Barrier(2)

    def producer() -> None:
        started.wait()
        for message in messages:
            send(message)

    thread = threading.Thread(target=producer)
    thread.start()
    started.wait()
    begin = time.perf_counter()
    received = 0
    while received < n:
        received += len(claim())
    elapsed = time.perf_counter() - begin
    thread.join()
    trips = []
    for message in messages[: min(n, 2_000)]:
        t0 = time.perf_counter()
        send(message)
        (got,) = claim()
        trips.append(time.perf_counter() - t0)
        assert got is message
    return Row("", n / elapsed, statistics.median(trips))


def _baseline(n: int) -> Row:
    box = MutableInbox()
    return _drive(
        n,
        lambda m: box.send(m, "next_step", False),
        lambda: box.claim("next_step"),
    )


def _owner(n: int, url: str) -> Row:
    store = open_store(url)
    owner = Owner(store, "bench", _NoRun(), watch=False, start=False)
    port = owner._port  # the runner's view: what a run's step boundary calls

    def claim() -> Sequence[Message]:
        messages, _ = port.claim(Target.NEXT_STEP)
        return messages

    try:
        return _drive(n, owner.inject, claim)
    finally:
        owner.close()
        store.close()


@dataclass(frozen=True)
class GroupRow:
    store: str  # the store kind: "sqlite:" or "file:"
    senders: int
    throughput: float  # acknowledged sends per second, all senders together
    per_transaction: float  # sends per store transaction (append call): the batching itself
    speedup: float = 1.0  # over 1 sender: the median over repeats, each pair back to back


class _Counting:
    """The store, counting its appends (each is one transaction); everything else passes through."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.appends = 0

    def append(self, *args: Any, **kwargs: Any) -> Any:
        self.appends += 1
        return self._store.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _group(url: str, senders: int, per_sender: int) -> tuple[float, float]:
    store = open_store(url)
    counting = _Counting(store)
    owner = Owner(counting, "bench", _NoRun(), watch=False, start=False)  # type: ignore[arg-type]
    messages = [[Message.user(f"s{s}m{i}") for i in range(per_sender)] for s in range(senders)]

    def sender(mine: list[Message]) -> Callable[[], None]:
        def send_all() -> None:
            for message in mine:
                owner.inject(message)
        return send_all

    try:
        elapsed = all_at_once([sender(mine) for mine in messages])
        assert owner.inbox.count() == senders * per_sender
        return senders * per_sender / elapsed, senders * per_sender / max(counting.appends, 1)
    finally:
        owner.close()
        store.close()


def _group_async(url: str, senders: int, per_sender: int) -> float:
    """``senders`` asyncio tasks sending to one :class:`AsyncOwner`, each awaiting its send:
    acknowledged sends per second (an asyncio host's request handlers, no thread each)."""
    async def main() -> float:
        store = open_store(url)
        try:
            async with AsyncOwner(store, "bench", _NoRun(), watch=False,  # type: ignore[arg-type]
                                  start=False) as owner:
                messages = [[Message.user(f"s{s}m{i}") for i in range(per_sender)]
                            for s in range(senders)]

                async def sender(mine: list[Message]) -> None:
                    for message in mine:
                        await owner.inject(message)

                begin = time.perf_counter()
                await asyncio.gather(*(sender(mine) for mine in messages))
                elapsed = time.perf_counter() - begin
                assert owner.inbox.count() == senders * per_sender
                return senders * per_sender / elapsed
        finally:
            store.close()

    return asyncio.run(main())


Side = Literal["threads", "asyncio", "alone"]
"""An 8-sender side of the group-commit pairs (see :meth:`GroupRun.raw_share`)."""

#: The numbers of concurrent senders measured.
SENDERS = (1, 8, 32)

def _batcher_alone(path: Path, total: int) -> float:
    """``RAW_ROWS`` threads sending through the group commit alone (:func:`commit_in_threads`),
    its commit a raw transaction of the batch's rows: no owner, no store, no proof or fold.
    Sends per second: the ceiling threads reach on this machine, whatever an owner does."""
    db = raw_db(path)
    batcher: GroupCommit[threading.Lock] = GroupCommit()
    queue_lock = threading.Lock()
    written = 0

    def commit(events: Sequence[Event]) -> Sequence[Event]:
        nonlocal written  # one commit at a time: the batcher's leader
        raw_transaction(db, written, len(events))
        written += len(events)
        return events

    per_sender = total // RAW_ROWS

    def sender() -> None:
        for _ in range(per_sender):
            commit_in_threads(batcher, queue_lock, Warned(text="x"), commit)

    try:
        elapsed = all_at_once([sender] * RAW_ROWS)
        assert written == per_sender * RAW_ROWS
        return written / elapsed
    finally:
        db.close()


@dataclass(frozen=True)
class GroupRun:
    """What :func:`measure_group` found: a row per store kind and sender count, and for each
    8-sender side the pairs of (raw limit, its sends per second) measured back to back, one pair
    per repeat."""

    rows: list[GroupRow]
    thread_pairs: list[tuple[float, float]]  # 8 threads on an ``Owner`` on ``sqlite:``
    async_pairs: list[tuple[float, float]]  # 8 asyncio tasks on an ``AsyncOwner`` on ``sqlite:``
    alone_pairs: list[tuple[float, float]]  # 8 threads through the batcher alone, a raw commit

    def raw_share(self, side: Side = "threads") -> tuple[float, float, float]:
        """The 8-sender share of the raw limit: median, lowest and highest over the pairs, for
        ``side`` ``"threads"`` (on ``Owner``), ``"asyncio"`` (tasks on ``AsyncOwner``) or
        ``"alone"`` (threads through the group commit alone, a raw commit: their ceiling)."""
        pairs = {"threads": self.thread_pairs, "asyncio": self.async_pairs,
                 "alone": self.alone_pairs}[side]
        shares = [eight / raw for raw, eight in pairs]
        return statistics.median(shares), min(shares), max(shares)


def measure_group(quick: bool = False) -> GroupRun:
    """1, 8 and 32 senders on each durable store kind, interleaved; the best repeat is kept, and
    the speed-up over 1 sender is the median of each repeat's own ratio (its runs back to back,
    so a disk that slows down between repeats moves both sides alike). The raw limit is measured
    right before each repeat's 8-sender ``sqlite:`` run, for the same reason: a disk's fsync time
    drifts by a third between minutes, and a share of a limit taken at another moment says more
    about the drift than about the code. Each repeat also pairs the limit with 8 asyncio tasks
    on an ``AsyncOwner`` and with the threads' ceiling (:func:`_batcher_alone`)."""
    total = 80 if quick else 800
    repeats = 1 if quick else 5
    best: dict[tuple[str, int], tuple[float, float]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    thread_pairs: list[tuple[float, float]] = []
    async_pairs: list[tuple[float, float]] = []
    alone_pairs: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            raw = raw_limit(Path(tmp) / f"raw-alone{r}.sqlite", total)
            alone_pairs.append((raw, _batcher_alone(Path(tmp) / f"alone{r}.sqlite", total)))
            raw = raw_limit(Path(tmp) / f"raw-async{r}.sqlite", total)
            url = f"sqlite:{Path(tmp) / f'group-async{r}.sqlite'}"
            async_pairs.append((raw, _group_async(url, RAW_ROWS, total // RAW_ROWS)))
            for kind, suffix in (("sqlite:", "sqlite"), ("file:", "jsonl")):
                one = 0.0
                for senders in SENDERS:
                    raw = 0.0
                    if (kind, senders) == ("sqlite:", RAW_ROWS):
                        raw = raw_limit(Path(tmp) / f"raw{r}.sqlite", total)
                    url = f"{kind}{Path(tmp) / f'group{r}-{senders}.{suffix}'}"
                    got = _group(url, senders, total // senders)
                    if raw:
                        thread_pairs.append((raw, got[0]))
                    best[kind, senders] = max(got, best.get((kind, senders), (0.0, 0.0)))
                    one = one or got[0]
                    ratios.setdefault((kind, senders), []).append(got[0] / one)
    rows = [GroupRow(kind, senders, rate, per, statistics.median(ratios[kind, senders]))
            for (kind, senders), (rate, per) in best.items()]
    return GroupRun(rows, thread_pairs, async_pairs, alone_pairs)


def render_group(run: GroupRun, quick: bool = False) -> str:
    """A markdown table: each store kind's 8- and 32-sender throughput against its 1-sender one,
    then the 8-sender ``sqlite:`` throughput as a share of the raw limit measured beside it."""
    by = {(row.store, row.senders): row for row in run.rows}
    lines = [
        "| store (durable) | senders | acknowledged sends/s | against 1 sender | sends per transaction |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind in ("sqlite:", "file:"):
        for senders in SENDERS:
            row = by[kind, senders]
            lines.append(f"| {kind} | {senders} | {row.throughput:,.0f} | {row.speedup:.2f}x "
                         f"| {row.per_transaction:.1f} |")
    if run.thread_pairs:
        raws = sorted(raw for raw, _ in run.thread_pairs + run.async_pairs + run.alone_pairs)
        lines.append("")
        lines.append(f"Raw limit (one thread, {RAW_ROWS} rows per transaction, same disk and "
                     f"pragmas), measured right before each 8-sender run: {raws[0]:,.0f} to "
                     f"{raws[-1]:,.0f} rows/s over {len(raws)} runs. The share of it each 8-sender "
                     f"side reaches (median of the pairs, lowest to highest; floor: 0.5x):")
        lines.append("")
        for label, side in (("8 threads on `Owner`", "threads"),
                            ("8 asyncio tasks on `AsyncOwner`", "asyncio"),
                            ("8 threads through the group commit alone, a raw transaction as "
                             "its commit (no owner, no store: the threads' ceiling)", "alone")):
            median, low, high = run.raw_share(side)
            lines.append(f"- {label}: **{median:.2f}x** ({low:.2f}x to {high:.2f}x)")
    if quick:
        lines.append("")
        lines.append("(quick run: small sizes, one repeat; shows the code works, not the figures)")
    return "\n".join(lines)


def measure(quick: bool = False) -> list[Row]:
    """Each side once per repeat, interleaved; the best repeat of each is kept."""
    n_memory = 2_000 if quick else 20_000
    n_sqlite = 200 if quick else 2_000
    repeats = 1 if quick else 3
    best: dict[str, Row] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            sides: dict[str, Callable[[], Row]] = {
                "deque + Lock (baseline)": lambda: _baseline(n_memory),
                "Owner, memory:": lambda: _owner(n_memory, "memory:"),
                "deque + Lock (baseline, sqlite-sized run)": lambda: _baseline(n_sqlite),
                "Owner, sqlite: (durable)": lambda r=r: _owner(
                    n_sqlite, f"sqlite:{Path(tmp) / f'bench{r}.sqlite'}"
                ),
            }
            for side, fn in sides.items():
                row = fn()
                row = Row(side, row.throughput, row.round_trip)
                if side not in best or row.throughput > best[side].throughput:
                    best[side] = row
    return list(best.values())


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def render(rows: list[Row], quick: bool = False) -> str:
    """A markdown table: each owner side against the baseline measured at its size."""
    by_side = {row.side: row for row in rows}
    pairs = [
        ("Owner, memory:", "deque + Lock (baseline)"),
        ("Owner, sqlite: (durable)", "deque + Lock (baseline, sqlite-sized run)"),
    ]
    lines = [
        "| side | send->claim messages/s | slower | send+claim round trip | slower |",
        "|---|---:|---:|---:|---:|",
    ]
    for owner_side, base_side in pairs:
        base, owner = by_side[base_side], by_side[owner_side]
        lines.append(
            f"| {base_side} | {base.throughput:,.0f} | 1.00x | {_us(base.round_trip)} | 1.00x |"
        )
        lines.append(
            f"| {owner_side} | {owner.throughput:,.0f} | {base.throughput / owner.throughput:.1f}x "
            f"| {_us(owner.round_trip)} | {owner.round_trip / base.round_trip:.1f}x |"
        )
    if quick:
        lines.append("")
        lines.append("(quick run: small sizes, one repeat; shows the code works, not the figures)")
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    """Measure and render both tables."""
    return (
        render(measure(quick), quick)
        + "\n\nGroup commit: concurrent senders share one transaction\n\n"
        + render_group(measure_group(quick), quick)
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    args = parser.parse_args(argv)
    print(run(args.quick))


if __name__ == "__main__":
    main()
