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
run. ``file:`` (fsynced JSON Lines) is shown too.

Then the floors of the group commit on ``sqlite:`` with 8 senders, each owner (8 threads on an
``Owner``; 8 asyncio tasks on an ``AsyncOwner``, a web host's request handlers) against two
sides measured in the same repeat, right before it:

* the ceiling: 8 threads through the group commit alone (``nous_inbox.owner.group_commit``), its
  commit a raw transaction of the batch's rows, with no owner and no store: what the threads'
  own wake-ups leave on this machine. Floor: each owner at least 0.8 of it.
* a hand-written leader/follower group commit over the same raw transactions: the sender that
  finds no commit under way commits everything queued, the others wait on one shared condition.
  What a user writes first. Floor: each owner at least 1.5x it.

Each ratio is the median over the repeats of that repeat's own ratio, with the lowest and
highest beside it. The raw limit (one thread inserting 8 rows a transaction with the store's
pragmas, WAL and ``synchronous = FULL``, on the same disk) is shown for scale: the owners' share
of it is not a floor, as a machine's thread wake-ups set the ceiling well below it.

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

__all__ = [
    "CEILING_FLOOR", "HAND_WRITTEN_FLOOR", "GroupRow", "GroupRun", "Repeat", "Row", "hand_written",
    "main", "measure", "measure_group", "render", "render_group", "run",
]


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


#: The numbers of concurrent senders measured.
SENDERS = (1, 8, 32)

#: Each owner's floors with 8 senders on ``sqlite:``: a share of the ceiling measured in the same
#: repeat, and a multiple of the hand-written group commit's rate.
CEILING_FLOOR = 0.8
HAND_WRITTEN_FLOOR = 1.5

Side = Literal["threads", "asyncio"]
"""An owner's 8-sender side (see :meth:`GroupRun.against`)."""


class _LeaderFollower:
    """A hand-written group commit: a sender queues its row and, when nobody is committing,
    commits everything queued in one raw transaction; the others wait on one condition, all
    woken after each commit. No gathering, no hand-over: what one writes first."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self._done = threading.Condition()
        self._queued = 0  # rows queued and not yet taken by a commit
        self._tickets = 0  # rows ever queued: a sender's ticket is its position
        self._written = 0  # rows committed: a ticket below it is durable
        self._leading = False

    def send(self) -> None:
        with self._done:
            ticket = self._tickets
            self._tickets += 1
            self._queued += 1
            while self._written <= ticket and self._leading:
                self._done.wait()
            if self._written > ticket:
                return
            self._leading = True
            first, rows, self._queued = self._written, self._queued, 0
        try:
            raw_transaction(self._db, first, rows)
        finally:
            with self._done:
                self._written += rows
                self._leading = False
                self._done.notify_all()


def hand_written(path: Path, total: int) -> float:
    """``RAW_ROWS`` threads sending ``total`` rows through :class:`_LeaderFollower`, each row
    committed once (checked): sends per second."""
    db = raw_db(path)
    group = _LeaderFollower(db)
    per_sender = total // RAW_ROWS

    def sender() -> None:
        for _ in range(per_sender):
            group.send()

    try:
        elapsed = all_at_once([sender] * RAW_ROWS)
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == per_sender * RAW_ROWS
        return per_sender * RAW_ROWS / elapsed
    finally:
        db.close()


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
class Repeat:
    """One repeat's 8-sender ``sqlite:`` rates, sends per second, measured back to back."""

    raw: float  # one thread, RAW_ROWS rows a raw transaction: the disk's limit, for scale
    ceiling: float  # 8 threads through the group commit alone, a raw commit
    hand_written: float  # 8 threads through a hand-written leader/follower group commit
    threads: float  # 8 threads on an ``Owner``
    asyncio: float  # 8 asyncio tasks on an ``AsyncOwner``


@dataclass(frozen=True)
class GroupRun:
    """What :func:`measure_group` found: a row per store kind and sender count, and one
    :class:`Repeat` of the 8-sender ``sqlite:`` sides per repeat."""

    rows: list[GroupRow]
    repeats: list[Repeat]

    def against(self, side: Side, baseline: str) -> tuple[float, float, float]:
        """``side``'s rate over ``baseline``'s (``"ceiling"``, ``"hand_written"`` or ``"raw"``)
        in each repeat: the median, lowest and highest."""
        ratios = [getattr(r, side) / getattr(r, baseline) for r in self.repeats]
        return statistics.median(ratios), min(ratios), max(ratios)


def measure_group(quick: bool = False) -> GroupRun:
    """1, 8 and 32 senders on each durable store kind, interleaved; the best repeat is kept, and
    the speed-up over 1 sender is the median of each repeat's own ratio (its runs back to back,
    so a disk that slows down between repeats moves both sides alike). Each repeat also measures
    the 8-sender ``sqlite:`` sides of the floors back to back (:class:`Repeat`): a disk's fsync
    time drifts by a third between minutes, so a side set against a baseline measured at another
    moment would say more about the drift than about the code."""
    total = 80 if quick else 800
    repeats = 1 if quick else 5
    best: dict[tuple[str, int], tuple[float, float]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    found: list[Repeat] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            raw = raw_limit(Path(tmp) / f"raw{r}.sqlite", total)
            ceiling = _batcher_alone(Path(tmp) / f"alone{r}.sqlite", total)
            hand = hand_written(Path(tmp) / f"hand{r}.sqlite", total)
            url = f"sqlite:{Path(tmp) / f'group-async{r}.sqlite'}"
            on_asyncio = _group_async(url, RAW_ROWS, total // RAW_ROWS)
            on_threads = 0.0
            for kind, suffix in (("sqlite:", "sqlite"), ("file:", "jsonl")):
                one = 0.0
                for senders in SENDERS:
                    url = f"{kind}{Path(tmp) / f'group{r}-{senders}.{suffix}'}"
                    got = _group(url, senders, total // senders)
                    if (kind, senders) == ("sqlite:", RAW_ROWS):
                        on_threads = got[0]
                    best[kind, senders] = max(got, best.get((kind, senders), (0.0, 0.0)))
                    one = one or got[0]
                    ratios.setdefault((kind, senders), []).append(got[0] / one)
            found.append(Repeat(raw, ceiling, hand, on_threads, on_asyncio))
    rows = [GroupRow(kind, senders, rate, per, statistics.median(ratios[kind, senders]))
            for (kind, senders), (rate, per) in best.items()]
    return GroupRun(rows, found)


def render_group(run: GroupRun, quick: bool = False) -> str:
    """Markdown: each store kind's 8- and 32-sender throughput against its 1-sender one, then
    each owner's 8-sender ``sqlite:`` rate against the ceiling and the hand-written group
    commit measured beside it (the floors), and against the raw limit for scale."""
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
    if run.repeats:
        def span(side: Side, baseline: str) -> str:
            median, low, high = run.against(side, baseline)
            return f"{median:.2f}x ({low:.2f}x to {high:.2f}x)"

        def verdict(side: Side, baseline: str, floor: float) -> str:
            return "met" if run.against(side, baseline)[0] >= floor else "NOT met"

        rates = sorted(getattr(r, f) for r in run.repeats
                       for f in ("raw", "ceiling", "hand_written"))
        lines += [
            "",
            f"{RAW_ROWS} senders on `sqlite:`, each repeat's sides back to back (median of the "
            f"repeats' own ratios, lowest to highest; {len(run.repeats)} repeats):",
            "",
            "| side | against the ceiling (floor: at least "
            f"{CEILING_FLOOR}) | against the hand-written group commit (floor: at least "
            f"{HAND_WRITTEN_FLOOR}x) | against the raw limit (for scale) |",
            "|---|---:|---:|---:|",
        ]
        for label, side in (("8 threads on `Owner`", "threads"),
                            ("8 asyncio tasks on `AsyncOwner`", "asyncio")):
            lines.append(
                f"| {label} | {span(side, 'ceiling')}: {verdict(side, 'ceiling', CEILING_FLOOR)} "
                f"| {span(side, 'hand_written')}: "
                f"{verdict(side, 'hand_written', HAND_WRITTEN_FLOOR)} | {span(side, 'raw')} |")
        ceiling = statistics.median(r.ceiling / r.raw for r in run.repeats)
        hand = statistics.median(r.hand_written / r.raw for r in run.repeats)
        lines += [
            "",
            f"The ceiling (8 threads through the group commit alone, a raw commit) reached "
            f"{ceiling:.2f}x the raw limit, the hand-written group commit {hand:.2f}x; the "
            f"three ran at {rates[0]:,.0f} to {rates[-1]:,.0f} rows/s.",
        ]
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
