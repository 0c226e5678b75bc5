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
Run with ``python -m bench.runner_bench`` (``--quick`` for a rough pass that only shows it works).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
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

__all__ = ["Row", "main", "measure", "render", "run"]

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


def make_amodel(steps: int) -> Callable[..., Any]:
    sync = make_model(steps)

    async def model(transcript: Sequence[Message], tools: Sequence[ToolSpec]) -> Message:
        return sync(transcript, tools)

    return model


# -- the baselines --------------------------------------------------------------------------------


def hand_written(
    steps: int, drain: Callable[[], list[Message]] | None = None, latency: float = 0.0
) -> list[Message]:
    """The loop a user writes: model, tools, append, until the model stops calling tools."""
    model = make_model(steps, latency)
    tools = {"add": add}
    specs = [Tool(add).spec]
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


async def ahand_written(steps: int) -> list[Message]:
    """The async loop a user writes, awaiting an async model and tool."""
    model = make_amodel(steps)
    tools = {"add": aadd}
    specs = [Tool(add).spec]
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

    Measured beside ``LocalSession`` (a journal over a ``memory:`` store, which validates and
    proves every event it appends) to tell the runner's own cost from its port's.
    """

    def __init__(self) -> None:
        self.session = Session()
        self.events: list[Event] = []
        self.record(MessageSent(target=Target.NEXT_TURN, wakeup=True, message=Message.user(PROMPT)))

    def claim(
        self, target: Target, *, wake_only: bool = False
    ) -> tuple[Sequence[Message], QueueClaimed | None]:
        claimed, _ = self.session.inbox.claim(target, wake_only=wake_only)
        if not claimed:
            return (), None
        event = self.record(QueueClaimed(target=target, count=len(claimed)))
        return tuple(claimed), event  # type: ignore[return-value]

    def record(self, event: Event) -> Event:
        stamped = msgspec.structs.replace(event, seq=self.session.version + 1, at=time.time())
        self.session = self.session.apply(stamped)
        self.events.append(stamped)
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


def time_async_hand_written(steps: int) -> float:
    async def turn() -> float:
        start = time.perf_counter()
        await ahand_written(steps)
        return time.perf_counter() - start

    return asyncio.run(turn())


def time_async_runner(steps: int, *, native: bool, offload: bool = True) -> float:
    if native:
        runner = Runner(make_amodel(steps), [aadd], max_steps=steps + 1)
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
    if not quick:
        # The same comparison with a model that takes 1 ms (a fast local model; hosted ones
        # take 100 ms and more): how much of a real run the runner's own cost is.
        steps, latency = 50, 0.001
        runner_s = baseline_s = float("inf")
        for _ in range(7):
            baseline_s = min(baseline_s, time_hand_written(steps, latency=latency) / steps)
            runner_s = min(runner_s, time_runner(steps, latency) / steps)
        rows.append(
            Row(
                "Runner.run_turn, 1 ms model",
                "hand-written loop, 1 ms model",
                steps,
                runner_s,
                baseline_s,
            )
        )
    return rows


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
    """Measure and return the markdown report (what ``main`` prints)."""
    return render(measure(quick), quick)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.runner_bench [--quick]``: print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few repeats: a smoke run")
    args = parser.parse_args(argv)
    print(run(args.quick))


if __name__ == "__main__":
    main()
