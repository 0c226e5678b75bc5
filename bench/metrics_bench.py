"""The cost of metrics per send: an owner counted by a :class:`~nous_inbox.observe.Metrics`
against the same owner counted by none.

One round, each side (the owner_bench shape): an owner sends ``N`` injections, then a steer wakes
a run whose step claims them all, so every send is counted, queued, claimed and timed from send to
claim, and every append is timed. The metrics side attaches the owner and times its store
(``Metrics.attach``, ``Metrics.observe_store``), as ``serve`` does for each session it holds.
Sides: ``Owner`` and ``AsyncOwner`` (a web host's), on ``memory:`` and on ``sqlite:``.

The figure is CPU time (``time.process_time``: every thread of the process), not wall time, so
other processes on the machine move it little. Each row is the median over interleaved pairs
(one round without, one with, in turn) of that pair's ratio, with the lowest and highest beside
it. Target: at most 1.05x. Run ``python -m bench.metrics_bench`` (``--quick``: small and fast).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nous_inbox.message import Message
from nous_inbox.observe import Metrics
from nous_inbox.owner import AsyncOwner, Owner
from nous_inbox.runner import Runner
from nous_inbox.store import open_store

TARGET = 1.05


def _echo(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    return Message.assistant("ok")


def _threaded(url: str, n: int, counted: bool) -> float:
    """CPU seconds per send of one round on a threaded ``Owner``."""
    with open_store(url) as store:
        metrics = Metrics() if counted else None
        if metrics is not None:
            metrics.observe_store(store)
        owner = Owner(store, "s", Runner(_echo))
        if metrics is not None:
            metrics.attach(owner)
        messages = [Message.user(f"m{i}") for i in range(n)]
        begin = time.process_time()
        for message in messages:
            owner.inject(message)
        owner.steer("go")
        assert owner.wait_idle(60)
        spent = time.process_time() - begin
        owner.close()
        if metrics is not None:
            text = metrics.exposition().decode()
            assert f'nous_inbox_claimed_messages_total{{queue="next_step"}} {n + 1}.0' in text
        return spent / (n + 1)


def _async(url: str, n: int, counted: bool) -> float:
    """CPU seconds per send of one round on an ``AsyncOwner``."""

    async def main() -> float:
        with open_store(url) as store:
            metrics = Metrics() if counted else None
            owner = AsyncOwner(store, "s", Runner(_echo))
            if metrics is not None:
                metrics.observe_store(store)
                metrics.attach(owner)
            messages = [Message.user(f"m{i}") for i in range(n)]
            async with owner:
                begin = time.process_time()
                for message in messages:
                    await owner.inject(message)
                await owner.steer("go")
                assert await owner.wait_idle(60)
                spent = time.process_time() - begin
            return spent / (n + 1)

    return asyncio.run(main())


def measure(quick: bool = False) -> list[tuple[str, list[float], float]]:
    """Each side's pair ratios and its cost per send without metrics (µs)."""
    pairs = 3 if quick else 9
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, drive, kind, n in (
            ("Owner, memory:", _threaded, "memory", 300 if quick else 3000),
            ("Owner, sqlite:", _threaded, "sqlite", 100 if quick else 600),
            ("AsyncOwner, memory:", _async, "memory", 300 if quick else 3000),
            ("AsyncOwner, sqlite:", _async, "sqlite", 100 if quick else 600),
        ):
            ratios, bare = [], []
            for i in range(pairs):
                url = ("memory:" if kind == "memory"
                       else f"sqlite:{Path(tmp) / f'{kind}-{label[0]}-{i}.sqlite'}")
                without = drive(url if kind == "memory" else url + ".a", n, False)
                with_ = drive(url if kind == "memory" else url + ".b", n, True)
                ratios.append(with_ / without)
                bare.append(without)
            rows.append((label, ratios, statistics.median(bare) * 1e6))
    return rows


def render(rows: list[tuple[str, list[float], float]], quick: bool = False) -> str:
    lines = ["| side | CPU per send, no metrics | with metrics (median of pairs) | range | "
             f"target: at most {TARGET:.2f}x |", "|---|---|---|---|---|"]
    for label, ratios, bare in rows:
        median = statistics.median(ratios)
        verdict = "met" if median <= TARGET else "NOT met"
        lines.append(f"| {label} | {bare:.1f} µs | {median:.3f}x | {min(ratios):.3f}x to "
                     f"{max(ratios):.3f}x | {verdict} |")
    load = os.getloadavg()[0]
    lines.append(f"\n(load average {load:.1f} on {os.cpu_count()} cores; "
                 f"{'quick: small rounds, figures not worth quoting' if quick else 'full run'})")
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    return render(measure(quick), quick)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small rounds: shows the code works")
    print(run(parser.parse_args(argv).quick))


if __name__ == "__main__":
    main()
