"""The mailbox against PraisonAI's own ``InProcessMailbox``, and how its costs grow.

Sides, in one process, the same calls:

* baseline: ``praisonaiagents.messaging.InProcessMailbox`` (a ``deque`` per recipient under an
  ``RLock``; each message a dataclass with a ``uuid4`` id);
* ``compat.praisonai.InProcessMailbox``, the drop-in, in memory and on ``sqlite:`` (durable: every
  send and every receive is a committed transaction);
* ``mailbox.Mailbox``, the library's own API underneath (no store).

Throughput: a sender sends a burst of 100 messages to one recipient, which then drains them with
``receive`` (limit 50), repeated; messages per second, the best of the repeats, each side
interleaved with the others. The content is a short str, and again a small dict
(``SMALL_DICT``): the drop-in checks and freezes a dict at send and gives the receiver a copy it
may change, where PraisonAI passes the sender's object along. Ratios are the median over repeats
of each side's rate divided by the baseline's rate measured just before it.

Memory: bytes allocated per queued message (``tracemalloc``) with 10,000 messages waiting.
Retained after drain: bytes still allocated after N messages were sent and all received, for
N = 10,000, 100,000 and 300,000: flat is the target (the mailbox keeps the outcome of a message it
let go for ``remember`` more messages sent, 10,000 by default, and nothing more of what it let go).

Growth: the time of one send when 1, 100 and 10,000 recipients already hold messages, and the
time of a send plus composing its notice (and marking it heard) when the agent has 1, 100 and
1,000 threads (all read but the one new message): flat is the target.

Durable: acknowledged sends per second through agents' handles on ``sqlite:`` with 1 and 8
sender threads, against the raw batched limit (one thread inserting the same rows with
``sqlite3`` under the store's pragmas, ``RAW_ROWS`` per transaction: what 8 senders share at
best, as the owner benchmark measures it) and raw unbatched (one transaction per row). Run
``python -m bench.mailbox_bench`` (``--quick``: small and fast; ``--floors``: only the drop-in's
floors, median and spread of alternating samples).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import RAW_ROWS, all_at_once, raw_limit
from nous_inbox.adapters.praisonai import InProcessMailbox
from nous_inbox.events import MailNoticed
from nous_inbox.mailbox import AgentHandle, Mailbox, compose

__all__ = ["durable", "floors", "growth", "memory", "render", "retained", "run", "throughput",
           "main"]

BURST = 100
SMALL_DICT = {"task": "review", "file": "auth.py", "priority": 2}
BASELINE = "PraisonAI InProcessMailbox (baseline)"
BASELINE_DICT = "PraisonAI InProcessMailbox (baseline), dict content"
BASELINE_SQLITE = "PraisonAI (baseline, sqlite-sized run)"
DROP_IN = "drop-in InProcessMailbox, in memory"
DROP_IN_DICT = "drop-in InProcessMailbox, in memory, dict content"
FLOOR_STR = 2.5
"""The drop-in's send and receive at least this many times PraisonAI's, with str content."""
FLOOR_DICT = 1.0
"""... and with a small dict as content (checked and frozen at send, copied at receive)."""


def _praisonai() -> Any:
    from praisonaiagents.messaging import InProcessMailbox as Baseline

    return Baseline


class _AsAgents:
    """The library mailbox in PraisonAI's call shape: each sender and receiver acts through its
    own handle."""

    def __init__(self, box: Mailbox) -> None:
        self.box = box
        self.handles: dict[str, AgentHandle] = {}

    def _as(self, name: str) -> AgentHandle:
        handle = self.handles.get(name)
        return handle if handle is not None else self.handles.setdefault(name,
                                                                         self.box.agent(name))

    def send(self, recipient: str, body: Any, *, sender: str, **options: Any) -> Any:
        return self._as(sender).send(recipient, body, **options)

    def receive(self, agent: str, *, limit: int = 50) -> Any:
        return self._as(agent).receive(limit=limit)


def _rate(box: Any, n: int, body: Any = "findings",
          clock: Callable[[], float] = time.perf_counter) -> float:
    send, receive = box.send, box.receive
    begin = clock()
    for _ in range(n // BURST):
        for _ in range(BURST):
            send("writer", body, sender="researcher")
        while receive("writer", limit=50):
            pass
    return n / (clock() - begin)


def throughput(quick: bool = False) -> dict[str, tuple[float, float]]:
    """Per side: (best messages per second, median ratio to the baseline run just before it).

    Each repeat runs the baseline and then every side at its size, so each ratio compares runs
    made seconds apart; the median of those ratios holds up on a shared, noisy machine better
    than a ratio of two bests.
    """
    n = 5_000 if quick else 100_000
    n_sqlite = 300 if quick else 3_000
    repeats = 1 if quick else 7
    baseline = _praisonai()
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            sides: dict[str, tuple[Callable[[], float], str]] = {
                BASELINE: (lambda: _rate(baseline(), n), BASELINE),
                DROP_IN: (lambda: _rate(InProcessMailbox(), n), BASELINE),
                "Mailbox (library API), in memory": (lambda: _rate(_AsAgents(Mailbox()), n),
                                                     BASELINE),
                BASELINE_DICT: (lambda: _rate(baseline(), n, SMALL_DICT), BASELINE_DICT),
                DROP_IN_DICT: (lambda: _rate(InProcessMailbox(), n, SMALL_DICT), BASELINE_DICT),
                BASELINE_SQLITE: (lambda: _rate(baseline(), n_sqlite), BASELINE_SQLITE),
                "drop-in InProcessMailbox, sqlite: (durable)": (lambda r=r: _rate(
                    InProcessMailbox(store=f"sqlite:{Path(tmp) / f'b{r}.sqlite'}"), n_sqlite),
                    BASELINE_SQLITE),
            }
            for side, (fn, against) in sides.items():
                gc.collect()
                rate = fn()
                rates.setdefault(side, []).append(rate)
                ratios.setdefault(side, []).append(rate / rates[against][-1])
    return {side: (max(rates[side]), statistics.median(ratios[side])) for side in rates}


def floors(samples: int = 15, n: int = 20_000) -> dict[str, tuple[float, float, float]]:
    """Only the drop-in's two floors, quickly: per content (``"str"``, ``"dict"``), the median,
    lowest and highest of ``samples`` ratios, each the drop-in's rate over PraisonAI's measured
    just before it (the sides alternate, so a change of load hits both). Both sides run on this
    one thread and never wait, so each is timed by the thread's CPU time: what other processes
    on a shared machine take of it does not count."""
    baseline = _praisonai()
    found: dict[str, tuple[float, float, float]] = {}
    for content, body in (("str", "findings"), ("dict", SMALL_DICT)):
        ratios = []
        for _ in range(samples):
            gc.collect()
            theirs = _rate(baseline(), n, body, time.thread_time)
            gc.collect()
            ratios.append(_rate(InProcessMailbox(), n, body, time.thread_time) / theirs)
        found[content] = (statistics.median(ratios), min(ratios), max(ratios))
    return found


def _bytes_per_message(make: Callable[[], Any], n: int) -> float:
    gc.collect()
    tracemalloc.start()
    box = make()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        box.send("writer", f"finding number {i}", sender="researcher")
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / n


def memory(quick: bool = False) -> dict[str, float]:
    """Bytes per queued message, per side."""
    n = 2_000 if quick else 10_000
    return {
        "PraisonAI InProcessMailbox (baseline)": _bytes_per_message(
            lambda: _praisonai()(max_inbox=n), n),
        "drop-in InProcessMailbox, in memory": _bytes_per_message(
            lambda: InProcessMailbox(max_inbox=n), n),
    }


def _retained_bytes(make: Callable[[], Any], n: int) -> int:
    gc.collect()
    tracemalloc.start()
    box = make()
    before = tracemalloc.get_traced_memory()[0]
    send, receive = box.send, box.receive
    for _ in range(n // BURST):
        for _ in range(BURST):
            send("writer", "findings", sender="researcher")
        while receive("writer", limit=50):
            pass
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def retained(quick: bool = False) -> list[tuple[str, int, int]]:
    """(side, messages sent and received, bytes still allocated after): flat is the target."""
    sizes = (2_000, 20_000) if quick else (10_000, 100_000, 300_000)
    sides: dict[str, Callable[[], Any]] = {
        "PraisonAI InProcessMailbox (baseline)": lambda: _praisonai()(),
        "drop-in InProcessMailbox, in memory": InProcessMailbox,
        "Mailbox(remember=1_000), in memory": lambda: _AsAgents(Mailbox(remember=1_000)),
    }
    return [(side, n, _retained_bytes(make, n)) for side, make in sides.items() for n in sizes]


def _per_call(fn: Callable[[], Any], calls: int) -> float:
    best = float("inf")
    for _ in range(7):
        begin = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - begin) / calls)
    return best


def growth(quick: bool = False) -> list[tuple[str, int, float]]:
    """(what, size, seconds per call): a send with many recipients, a notice with many threads."""
    rows = []
    for recipients in (1, 100, 1_000 if quick else 10_000):
        lead = Mailbox(max_queue=1_000_000).agent("lead")
        for i in range(recipients):
            lead.send(f"agent-{i}", "waiting")
        rows.append(("send", recipients, _per_call(
            lambda lead=lead: lead.send("agent-0", "one more"), 2_000)))
    for threads in (1, 100, 1_000 if quick else 10_000):
        box = _AsAgents(Mailbox(retain=100_000, max_queue=1_000_000))
        for i in range(threads):
            box.send("dev", "old", sender=f"peer-{i}")
        dev = box._as("dev")
        dev.receive(limit=threads)  # nothing old is new
        for i in range(threads):
            box.send("dev", "kept", sender=f"peer-{i}", kind="fyi")
        for thread in dev.threads():
            dev.read(thread.thread)

        def notice(box: _AsAgents = box) -> None:
            box.send("dev", "the one new message", sender="peer-0", kind="fyi")
            state = box.box.state
            _, ids = compose(state, "dev", "n")
            state.apply(MailNoticed(recipient="dev", notice="n", ids=ids))  # it was claimed

        rows.append(("send + notice", threads, _per_call(notice, 200)))
    return rows


#: The numbers of concurrent sender threads measured on a durable store.
SENDERS = (1, 8)
LIMIT = f"raw sqlite3, {RAW_ROWS} rows per transaction (the limit)"


def _durable_sends(url: str, senders: int, per_sender: int) -> float:
    """Acknowledged sends per second: ``senders`` threads, each its own agent, each send
    committed before the next."""
    with Mailbox(url, max_queue=1_000_000) as box:
        handles = [box.agent(f"peer-{s}") for s in range(senders)]

        def sender(handle: AgentHandle) -> Callable[[], None]:
            def send_all() -> None:
                for i in range(per_sender):
                    handle.send("dev", f"finding number {i}")
            return send_all

        elapsed = all_at_once([sender(handle) for handle in handles])
        assert box.pending("dev") == senders * per_sender
    return senders * per_sender / elapsed


#: A mail-sized row for the raw limit: what a mailbox send's record weighs.
_MAIL_ROW = b'{"type":"mail_sent","id":"x","sender":"peer-0","recipient":"dev","body":"finding"}'


def durable(quick: bool = False) -> list[tuple[str, float]]:
    """(side, sends or rows per second) on ``sqlite:``: the mailbox with 1 and 8 senders, and
    raw inserts batched and unbatched; the best of the repeats."""
    total = 80 if quick else 800
    repeats = 1 if quick else 3
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            sides: dict[str, Callable[[], float]] = {
                f"Mailbox, {s} sender{'s' if s > 1 else ''}": (
                    lambda s=s, r=r: _durable_sends(
                        f"sqlite:{Path(tmp) / f'd{r}-{s}.sqlite'}", s, total // s))
                for s in SENDERS}
            sides[LIMIT] = (lambda r=r: raw_limit(Path(tmp) / f"raw{r}-batched.sqlite",
                                                  total * 2, RAW_ROWS, _MAIL_ROW))
            sides["raw sqlite3, 1 row per transaction"] = (
                lambda r=r: raw_limit(Path(tmp) / f"raw{r}-single.sqlite", total, 1, _MAIL_ROW))
            for side, fn in sides.items():
                best[side] = max(best.get(side, 0.0), fn())
    return list(best.items())


def render(quick: bool = False) -> str:
    """Every table, measured now."""
    rates = throughput(quick)
    lines = ["| side | best messages/s (send+receive) | vs PraisonAI (median of paired runs) |",
             "|---|---:|---:|"]
    for side, (rate, ratio) in rates.items():
        said = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:,.2f}x slower"
        lines.append(f"| {side} | {rate:,.0f} | {said} |")
    lines.append("")
    for side, floor, content in ((DROP_IN, FLOOR_STR, "str content"),
                                 (DROP_IN_DICT, FLOOR_DICT, "a small dict as content")):
        ratio = rates[side][1]
        lines.append(f"drop-in vs PraisonAI with {content}: {ratio:.2f}x (floor {floor}x: "
                     f"{'met' if ratio >= floor else 'NOT met'})")
    mem = memory(quick)
    base_mem = mem["PraisonAI InProcessMailbox (baseline)"]
    lines += ["", "| side | bytes per queued message | vs PraisonAI |", "|---|---:|---:|"]
    for side, size in mem.items():
        lines.append(f"| {side} | {size:,.0f} | {size / base_mem:.2f}x |")
    lines += ["", "| side | messages sent, all received | bytes retained | per message |",
              "|---|---:|---:|---:|"]
    for side, n, size in retained(quick):
        lines.append(f"| {side} | {n:,} | {size:,} | {size / n:,.1f} |")
    rows = growth(quick)
    lines += ["", "| operation | recipients or threads | µs per call | vs smallest |",
              "|---|---:|---:|---:|"]
    first: dict[str, float] = {}
    for what, size, seconds in rows:
        first.setdefault(what, seconds)
        lines.append(f"| {what} | {size:,} | {seconds * 1e6:.2f} | "
                     f"{seconds / first[what]:.2f}x |")
    lines += ["", "| sqlite: (durable) | acknowledged sends/s | vs the raw batched limit |",
              "|---|---:|---:|"]
    rows_durable = durable(quick)
    limit = dict(rows_durable)[LIMIT]
    for side, rate in rows_durable:
        lines.append(f"| {side} | {rate:,.0f} | {rate / limit:.3f}x |")
    if quick:
        lines += ["", "(quick run: small sizes, one repeat; shows the code works, not the figures)"]
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    """Measure and render."""
    return render(quick)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--floors", action="store_true",
                        help="only the drop-in's floors against PraisonAI: median (lowest-highest)")
    args = parser.parse_args(argv)
    if args.floors:
        for content, (median, low, high) in floors().items():
            floor = FLOOR_STR if content == "str" else FLOOR_DICT
            print(f"drop-in vs PraisonAI, {content} content: {median:.2f}x ({low:.2f}-{high:.2f}; "
                  f"floor {floor}x: {'met' if median >= floor else 'NOT met'})")
        return
    print(run(args.quick))


if __name__ == "__main__":
    main()
