"""The runner's cost per step against calling the same model and tools in a hand-written loop.

Every variant runs the same turn: a trivial model that asks for one tool call per step (``add``
with two numbers) until the last step, where it answers; a trivial tool; a transcript that starts
with one user message. With a model and tools this cheap, what is measured is the loop around
them, the worst case for the runner: a real model call takes milliseconds to minutes and hides it.

The baselines are what a user would otherwise write:

* **hand-written loop**: a list for the transcript, call the model, run the tool calls, append,
  repeat until no tool calls. No inbox, no events: the floor.
* **hand-written loop + inbox**: the same, plus the drain a user writes to read messages mid-run
  (a ``deque`` and a ``Lock``, drained before each model request), the aimu ``QueueInbox`` shape.

Against them, ``Runner.run_turn`` on a :class:`~nous_inbox.runner.LocalSession` does everything the
library promises: two claims at the turn's start and one per step boundary (atomic with their
record), six recorded events per step (numbered, timed, folded into the session), the budget, the
nudge and final-answer rules. The same turn over ``BarePort`` (a session folded in memory, no
store) tells the runner's own cost from the port's. The asyncio driver is measured against a hand-written async loop
awaiting the same async model and tool, and, with the same sync callables, inline
(``offload=False``) and in worker threads (the default).

Variants run alternately in one process; each figure is the minimum of the repeats, per step.

The floor (a second table) is the turn a user runs: a model that takes 1 ms (a fast local one;
hosted models take far longer), one tool call in every step, 20 steps a turn, ``Runner.run_turn``
over a ``LocalSession`` against the hand-written loop calling the same model and tool, and
``Runner.arun_turn`` against the hand-written asyncio loop awaiting the same async model and
tool. Turns of the two sides alternate in one process; each side's figure is the median of its
turns, and the ratio is the median of the ratios of each pair run back to back (floor: at most
1.05x). Run with ``python -m bench.runner_bench`` (``--quick`` for a rough pass that only shows
it works).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import msgspec

from nous_inbox import Message, ToolCall
from nous_inbox.commands import ToolSpec
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.runner import LocalSession, Runner, Tool
from nous_inbox.session import Session
from nous_inbox.verbs import Target

__all__ = [
    "FLOOR", "FloorRow", "Row", "async_runner", "main", "measure", "measure_floor", "render",
    "render_floor", "run",
]

CALL = Message.assistant(tool_calls=[ToolCall("c1", "add", {"a": 2, "b": 3})])
FINAL = Message.assistant("the sum is 5")
PROMPT = "add 2 and 3, many times"


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def aadd(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def make_model(
    steps: int, latency: float = 0.0
) -> Callable[[Sequence[Message], Sequence[ToolSpec]], Message]:
    """The trivial model: a tool call on each of the first ``steps - 1`` requests, then an answer
    (after ``latency`` seconds of pretending to think, when given)."""
    asked = 0

    def model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        nonlocal asked
        asked += 1
        if latency:
            time.sleep(latency)
        return CALL if asked < steps else FINAL

    return model


def make_amodel(steps: int, latency: float = 0.0) -> Callable[..., Any]:
    """:func:`make_model`, async: it awaits ``asyncio.sleep(latency)`` when given one."""
    sync = make_model(steps)

    async def model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        if latency:
            await asyncio.sleep(latency)
        return sync(transcript, tools)

    return model


SPECS = [Tool(add).spec]
"""What the hand-written loops tell the model about ``add``: worked out once, as the runner
works out its own when it is built, so neither side pays for it in a turn."""


# -- the baselines --------------------------------------------------------------------------------


def hand_written(
    steps: int, drain: Callable[[], list[Message]] | None = None, latency: float = 0.0
) -> list[Message]:
    """The loop a user writes: model, tools, append, until the model stops calling tools."""
    model = make_model(steps, latency)
    tools = {"add": add}
    specs = SPECS
    transcript = [Message.user(PROMPT)]
    while True:
        if drain is not None:
            transcript.extend(drain())
        reply = model(transcript, specs)
        transcript.append(reply)
        if not reply.tool_calls:
            return transcript
        for call in reply.tool_calls:
            value = tools[call.name](**call.arguments)
            transcript.append(Message.tool(str(value), call.id, name=call.name))


async def ahand_written(steps: int, latency: float = 0.0) -> list[Message]:
    """The async loop a user writes, awaiting an async model and tool."""
    model = make_amodel(steps, latency)
    tools = {"add": aadd}
    specs = SPECS
    transcript = [Message.user(PROMPT)]
    while True:
        reply = await model(transcript, specs)
        transcript.append(reply)
        if not reply.tool_calls:
            return transcript
        for call in reply.tool_calls:
            value = await tools[call.name](**call.arguments)
            transcript.append(Message.tool(str(value), call.id, name=call.name))


class QueueInbox:
    """aimu's hand-written inbox: a deque and a lock; the run drains it before each request."""

    def __init__(self) -> None:
        self._pending: deque[Message] = deque()
        self._lock = threading.Lock()

    def send(self, text: str) -> None:
        with self._lock:
            self._pending.append(Message.user(text))

    def drain(self) -> list[Message]:
        with self._lock:
            pending = list(self._pending)
            self._pending.clear()
            return pending


# -- the variants: each times one turn, setup excluded --------------------------------------------


def _session() -> LocalSession:
    local = LocalSession()
    local.followup(PROMPT)
    return local


class BarePort:
    """The least a port can be: a session folded in memory, no store, no lock, no proof.

    Measured beside ``LocalSession`` (a journal over an in-memory list, which numbers, times and
    folds every event it appends under a lock) to tell the runner's own cost from its port's.
    """

    def __init__(self) -> None:
        self.session = Session()
        self.events: list[Event] = []
        self.record([MessageSent(target=Target.NEXT_TURN, wakeup=True,
                                 message=Message.user(PROMPT))])

    def claim(
        self, target: Target, *, wake_only: bool = False
    ) -> tuple[Sequence[Message], QueueClaimed | None]:
        claimed, _ = self.session.inbox.claim(target, wake_only=wake_only)
        if not claimed:
            return (), None
        (event,) = self.record([QueueClaimed(target=target, count=len(claimed))])
        return tuple(claimed), event  # type: ignore[return-value]

    def record(self, events: Sequence[Event]) -> list[Event]:
        stamped = []
        now = time.time()
        for event in events:
            event = msgspec.structs.replace(event, seq=self.session.version + 1, at=now)
            self.session = self.session.apply(event)
            stamped.append(event)
        self.events += stamped
        return stamped


def time_hand_written(steps: int, inbox: QueueInbox | None = None, latency: float = 0.0) -> float:
    start = time.perf_counter()
    hand_written(steps, None if inbox is None else inbox.drain, latency)
    return time.perf_counter() - start


def time_runner(steps: int, latency: float = 0.0, *, bare: bool = False) -> float:
    runner = Runner(make_model(steps, latency), [add], max_steps=steps + 1)
    local: LocalSession | BarePort = BarePort() if bare else _session()
    start = time.perf_counter()
    deque(runner.run_turn(local), maxlen=0)
    return time.perf_counter() - start


def time_async_hand_written(steps: int, latency: float = 0.0) -> float:
    async def turn() -> float:
        start = time.perf_counter()
        await ahand_written(steps, latency)
        return time.perf_counter() - start

    return asyncio.run(turn())


def async_runner(steps: int, latency: float = 0.0) -> Runner:
    """The runner of the async model and tool, the tool by the name the model calls."""
    return Runner(make_amodel(steps, latency), [Tool(aadd, name="add")], max_steps=steps + 1)


def time_async_runner(
    steps: int, latency: float = 0.0, *, native: bool, offload: bool = True
) -> float:
    if native:
        runner = async_runner(steps, latency)
    else:
        runner = Runner(make_model(steps), [add], max_steps=steps + 1, offload=offload)
    local = _session()

    async def turn() -> float:
        start = time.perf_counter()
        async for _ in runner.arun_turn(local):
            pass
        return time.perf_counter() - start

    return asyncio.run(turn())


@dataclass(frozen=True)
class Row:
    """One comparison: seconds per step for the variant and for its baseline."""

    variant: str
    baseline_name: str
    steps: int
    variant_s: float
    baseline_s: float

    @property
    def ratio(self) -> float:
        return self.variant_s / self.baseline_s


def measure(quick: bool = False) -> list[Row]:
    """Run every variant alternately and return one row per comparison."""
    sizes = (20,) if quick else (20, 200, 2000)
    rows: list[Row] = []
    for steps in sizes:
        # Longer turns are steadier and slower to run: fewer repeats (the transcript grows with
        # the turn, so these rows also show the cost per step does not grow with it).
        repeat = 2 if quick else max(7, 15 * 20 // steps)
        inbox = QueueInbox()
        plan: dict[str, Callable[[int], float]] = {
            "hand-written loop": time_hand_written,
            "hand-written loop + inbox": lambda s, box=inbox: time_hand_written(s, box),
            "Runner.run_turn": time_runner,
            "Runner.run_turn, bare port": lambda s: time_runner(s, bare=True),
            "async hand-written loop": time_async_hand_written,
            "Runner.arun_turn, async model and tool": (lambda s: time_async_runner(s, native=True)),
            "Runner.arun_turn, sync callables inline": (
                lambda s: time_async_runner(s, native=False, offload=False)
            ),
            "Runner.arun_turn, sync callables in threads": (
                lambda s: time_async_runner(s, native=False, offload=True)
            ),
        }
        for timed in plan.values():  # warm up
            timed(steps)
        best = dict.fromkeys(plan, float("inf"))
        for _ in range(repeat):
            for name, timed in plan.items():
                best[name] = min(best[name], timed(steps) / steps)
        pairs = [
            ("hand-written loop + inbox", "hand-written loop"),
            ("Runner.run_turn", "hand-written loop"),
            ("Runner.run_turn", "hand-written loop + inbox"),
            ("Runner.run_turn, bare port", "hand-written loop + inbox"),
            ("Runner.arun_turn, async model and tool", "async hand-written loop"),
            ("Runner.arun_turn, sync callables inline", "async hand-written loop"),
            ("Runner.arun_turn, sync callables in threads", "async hand-written loop"),
        ]
        rows += [Row(v, b, steps, best[v], best[b]) for v, b in pairs]
    return rows


#: The most the runner may take over the hand-written loop, per turn, with the 1 ms model.
FLOOR = 1.05


@dataclass(frozen=True)
class FloorRow:
    """The floor's comparison for one driver: the median seconds per step of each side over
    alternating turns, and the median of the paired ratios."""

    variant: str
    baseline_name: str
    steps: int
    variant_s: float
    baseline_s: float
    ratio: float
    pairs: int


def measure_floor(quick: bool = False, steps: int = 20, latency: float = 0.001) -> list[FloorRow]:
    """The turn a user runs (see the module docstring): each driver against its hand-written
    loop, a turn of each side in turn, ``pairs`` times after a warm-up pair."""
    pairs = 3 if quick else 41
    sides = (
        ("Runner.run_turn", "hand-written loop",
         lambda: time_runner(steps, latency), lambda: time_hand_written(steps, latency=latency)),
        ("Runner.arun_turn", "async hand-written loop",
         lambda: time_async_runner(steps, latency, native=True),
         lambda: time_async_hand_written(steps, latency)),
    )
    rows = []
    for variant, baseline_name, timed, baseline in sides:
        timed(), baseline()  # warm up
        ours: list[float] = []
        theirs: list[float] = []
        for i in range(pairs):
            # Which side goes first alternates, so neither always runs right after the other.
            if i % 2:
                ours.append(timed())
                theirs.append(baseline())
            else:
                theirs.append(baseline())
                ours.append(timed())
        ratio = statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
        rows.append(FloorRow(variant, baseline_name, steps, statistics.median(ours) / steps,
                             statistics.median(theirs) / steps, ratio, pairs))
    return rows


def render_floor(rows: list[FloorRow], latency: float = 0.001) -> str:
    """The floor's table: each driver against its hand-written loop, per step."""
    lines = [
        f"| driver, {latency * 1e3:g} ms model, one tool a step | baseline | steps per turn "
        f"| driver / baseline (median of pairs) | µs per step (driver / baseline) "
        f"| the runner's own µs per step | floor |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        verdict = "met" if r.ratio <= FLOOR else "NOT met"
        lines.append(
            f"| {r.variant} | {r.baseline_name} | {r.steps} | {r.ratio:.3f}x "
            f"| {_us(r.variant_s)} / {_us(r.baseline_s)} | {_us(r.variant_s - r.baseline_s)} "
            f"| at most {FLOOR:.2f}x: {verdict} |"
        )
    pairs = rows[0].pairs if rows else 0
    lines += ["", f"Medians of {pairs} turns of each side, alternating in one process."]
    return "\n".join(lines)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def render(rows: list[Row], quick: bool = False) -> str:
    """The markdown table: each variant against its baseline, per step."""
    lines = [
        "| variant | baseline | steps per turn | variant / baseline | µs per step (variant / baseline) |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r.variant} | {r.baseline_name} | {r.steps} | {r.ratio:.1f}x "
        f"| {_us(r.variant_s)} / {_us(r.baseline_s)} |"
        for r in rows
    ]
    versions = ", ".join(f"{name} {version(name)}" for name in ("msgspec", "pyrsistent"))
    mode = "quick pass (few repeats: rough)" if quick else "full run"
    lines += [
        "",
        f"Python {platform.python_version()}, {versions}; {mode}; trivial model and tool (the "
        "loop's cost alone); min of repeats, measured alternately.",
    ]
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    """Measure and return the markdown report (what ``main`` prints): the floor, then the
    trivial model's table (the loop's cost alone)."""
    return render_floor(measure_floor(quick)) + "\n\n" + render(measure(quick), quick)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.runner_bench [--quick]``: print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    args = parser.parse_args(argv)
    print(run(args.quick))


if __name__ == "__main__":
    main()
