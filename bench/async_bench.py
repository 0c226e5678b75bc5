"""AsyncOwner against an ``asyncio.Queue`` inbox, and the pydantic-ai adapter against the bare agent.

Four tables, each measured side by side in one run.

**Send to claim.** The path every message takes under asyncio: a task sends, and the run claims
it at a step boundary. A producer task sends ``N`` messages; a consumer task claims ``next_step``
the way a run does at each boundary (draining what is there, yielding to the loop when nothing
is) until it has them all. Round trip: one send, then the claim that returns it, uncontended, the
median over many. Sides, same pre-built messages:

* baseline: an ``asyncio.Queue`` inbox (``put`` to send, drain with ``get_nowait`` to claim),
  what an asyncio host would write by hand (it keeps nothing through a crash);
* ``AsyncOwner`` on ``memory:``: each send an appended, folded ``MessageSent``, each claim the
  run's port claim (one ``QueueClaimed``); store calls inline (``memory:`` does not block);
* ``AsyncOwner`` on ``sqlite:``: the same, durably, with the store calls on the owner's worker
  thread, the claim through the port's ``call_io`` as a run makes it: the event loop never waits
  on the disk.

**Adapter overhead per model request.** One pydantic-ai ``Agent`` with a ``FunctionModel`` that
takes 1 ms (``asyncio.sleep(0.001)``) and calls a trivial tool ``S - 1`` times before answering,
so a run is ``S`` model requests. Sides: the agent run directly (``agent.run``); the same agent
through :class:`~nous_inbox.adapters.pydantic_ai.AgentRunner` on an in-memory ``LocalSession``
(claims and records inline); and through an ``AsyncOwner`` on ``sqlite:`` (every request's
claim and records durable, on the owner's worker thread). Reported: time per model request, and the ratio to
the bare agent.

**Steer to the request that carries it.** A steer sent at a random moment into a run of eight
1 ms requests, timed from its acknowledgement to the model request whose messages hold it:
p50 and p99 (the same measure as the LangGraph and OpenAI Agents SDK benches).

**Where a send's time goes.** CPU time per send through each layer alone on ``memory:``: the
store's append, the journal's ``send`` over it (what the owner calls), the owner's ``inject``
over that, beside an ``asyncio.Queue`` put and drain.

Ratios are how many times slower than the baseline. ``python -m bench --only async_bench``
(``--quick``: small and fast).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nous_inbox import Message, Target
from nous_inbox.events import MessageSent
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.store import open_store
from nous_inbox.store.journal import Journal

__all__ = ["main", "run"]


class _NoRun:
    """A runner that is never needed: sends here never wake (they are injections)."""

    def arun_turn(self, port: Any, **kwargs: Any) -> Any:
        raise AssertionError("no run should start in this benchmark")


@dataclass(frozen=True)
class _Row:
    side: str
    throughput: float  # messages per second, producer and consumer tasks interleaved
    round_trip: float  # seconds: one send then the claim that returns it


async def _drive(
    n: int,
    send: Callable[[Message], Awaitable[object]],
    claim: Callable[[], Awaitable[Sequence[Message]]],
    repeats: int,
) -> tuple[float, float]:
    messages = [Message.user(f"m{i}") for i in range(n)]

    async def producer() -> None:
        for message in messages:
            await send(message)

    begin = time.perf_counter()
    task = asyncio.ensure_future(producer())
    received = 0
    while received < n:
        got = len(await claim())
        received += got
        if not got:
            await asyncio.sleep(0)  # nothing there: let the producer run, as an idle run would
    await task
    throughput = n / (time.perf_counter() - begin)
    trips = []
    for i in range(repeats):
        one = Message.user(f"r{i}")
        t0 = time.perf_counter()
        await send(one)
        (got_one,) = await claim()
        trips.append(time.perf_counter() - t0)
        assert got_one is one or got_one == one
    return throughput, statistics.median(trips)


async def _queue_side(n: int, repeats: int) -> _Row:
    queue: asyncio.Queue[Message] = asyncio.Queue()

    async def claim() -> list[Message]:
        out = []
        while not queue.empty():
            out.append(queue.get_nowait())
        return out

    throughput, trip = await _drive(n, queue.put, claim, repeats)
    return _Row("asyncio.Queue", throughput, trip)


async def _owner_side(url: str, label: str, n: int, repeats: int) -> _Row:
    store = open_store(url)
    async with AsyncOwner(store, "bench", _NoRun(), watch=False) as owner:
        port = owner._port  # the runner's view: what a run's step boundary calls
        assert port is not None
        call_io = port.call_io  # how a runner reaches the store worker (None: inline)

        async def claim() -> Sequence[Message]:
            if call_io is not None:
                messages, _ = await call_io(port.claim, Target.NEXT_STEP)
            else:
                messages, _ = port.claim(Target.NEXT_STEP)
            return messages

        throughput, trip = await _drive(n, owner.inject, claim, repeats)
    store.close()
    return _Row(label, throughput, trip)


def _send_table(quick: bool) -> str:
    n, durable_n, repeats = (2_000, 200, 200) if quick else (20_000, 2_000, 2_000)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:{Path(tmp) / 'bench.sqlite'}"

        async def all_sides() -> list[_Row]:
            return [
                await _queue_side(n, repeats),
                await _owner_side("memory:", "AsyncOwner, memory:", n, repeats),
                await _owner_side(url, "AsyncOwner, sqlite: (durable)", durable_n, repeats // 4),
            ]

        rows = asyncio.run(all_sides())
    base = rows[0]
    lines = [
        f"Send to claim, {n} messages ({durable_n} durable); round trip median of {repeats}.",
        "",
        "| side | send->claim messages/s | slower | send+claim round trip | slower |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.side} | {row.throughput:,.0f} | {base.throughput / row.throughput:.1f}x "
            f"| {row.round_trip * 1e6:.1f} µs | {row.round_trip / base.round_trip:.1f}x |"
        )
    return "\n".join(lines)


# -- the pydantic-ai adapter ------------------------------------------------------------------------


def _agent(steps: int, delay: float,
           seen: Callable[[list[Any]], None] | None = None) -> Any:
    """The scripted agent: ``steps`` requests of ``delay`` seconds, a trivial tool between them;
    ``seen`` is shown each request's messages as it is made (the steer table's probe)."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen(messages)
        await asyncio.sleep(delay)
        done = 0  # tool results since the last answer: this run's steps so far
        for m in reversed(messages):
            if isinstance(m, ModelResponse) and any(isinstance(p, TextPart) for p in m.parts):
                break
            done += sum(1 for p in m.parts if getattr(p, "part_kind", "") == "tool-return")
        if done < steps - 1:
            return ModelResponse(parts=[ToolCallPart("work", {"n": done}, f"c{done}")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def work(n: int) -> str:
        """A trivial tool."""
        return f"result {n}"

    return agent


def _adapter_table(quick: bool) -> str:
    try:
        from nous_inbox.adapters.pydantic_ai import AgentRunner
        from nous_inbox.runner.port import LocalSession
    except ImportError:
        return "(pydantic-ai is not installed: pip install 'nous-inbox[pydantic-ai]')"
    steps, runs, reps, delay = (3, 3, 1, 0.001) if quick else (5, 20, 9, 0.001)

    async def bare() -> float:
        agent = _agent(steps, delay)
        history: list[Any] = []
        begin = time.perf_counter()
        for i in range(runs):  # one conversation, as a session is
            result = await agent.run(f"go {i}", message_history=history)
            history = result.all_messages()
        return (time.perf_counter() - begin) / (runs * steps)

    async def local() -> float:
        runner = AgentRunner(_agent(steps, delay), offload=False)
        session = LocalSession()
        begin = time.perf_counter()
        for i in range(runs):
            session.followup(f"go {i}")
            async for _ in runner.arun_turn(session):
                pass
        return (time.perf_counter() - begin) / (runs * steps)

    async def durable(url: str) -> float:
        runner = AgentRunner(_agent(steps, delay))
        store = open_store(url)
        async with AsyncOwner(store, "s", runner, watch=False) as owner:
            begin = time.perf_counter()
            for i in range(runs):
                await owner.followup(f"go {i}")
                await owner.wait_idle()
            elapsed = time.perf_counter() - begin
        store.close()
        return elapsed / (runs * steps)

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:{Path(tmp) / 'adapter.sqlite'}"

        async def all_sides() -> dict[str, list[float]]:
            await bare()  # warm pydantic-ai's first-run costs for every side alike
            times: dict[str, list[float]] = {}
            for rep in range(reps):  # interleaved: a change of load hits every side
                for side, measure in (
                    ("pydantic-ai Agent, bare", bare),
                    ("AgentRunner, in-memory session", local),
                    ("AsyncOwner + AgentRunner, sqlite: (durable)",
                     lambda rep=rep: durable(f"{url}{rep}")),
                ):
                    times.setdefault(side, []).append(await measure())
            return times

        times = asyncio.run(all_sides())
    base = times["pydantic-ai Agent, bare"]
    lines = [
        f"Per model request: {runs} runs of {steps} requests in one session, the model taking "
        f"{delay * 1e3:.0f} ms; {reps} rounds, the sides interleaved in each. The bare agent's own "
        "time moves by a fifth from round to round on an idle machine, so the ratio to judge is "
        "the median of each round's pair (its range beside it), not a ratio of bests.",
        "",
        "| side | best per model request | best / best | median of pairs (range) |",
        "|---|---:|---:|---:|",
    ]
    for side, ts in times.items():
        pairs = sorted(t / b for t, b in zip(ts, base, strict=True))
        lines.append(f"| {side} | {min(ts) * 1e3:.2f} ms | {min(ts) / min(base):.2f}x | "
                     f"{statistics.median(pairs):.2f}x ({pairs[0]:.2f}-{pairs[-1]:.2f}) |")
    pairs = [t / b for t, b in zip(times["AgentRunner, in-memory session"], base, strict=True)]
    held = "met" if statistics.median(pairs) <= 1.1 else "NOT met"
    lines += ["", f"The in-memory adapter against the bare agent, median of pairs: "
              f"{statistics.median(pairs):.2f}x (floor: at most 1.1x: {held})."]
    return "\n".join(lines)


def _layers_table(quick: bool) -> str:
    """CPU time per send through each layer alone, on ``memory:``: where a send's time goes.

    Each row adds a layer over the one before: the store's ``append`` of a built event; the
    journal's ``send``, the call the owner makes (the parts checked, the event built, numbered
    and timed, the fold, its bookkeeping around that append); the owner's ``inject`` (its face
    over the journal). Best of five, ``time.process_time`` (one thread).
    """
    n = 2_000 if quick else 20_000
    message = Message.user("hi")
    event = MessageSent(target=Target.NEXT_STEP, wakeup=False, message=message)

    def store_append(n: int) -> None:
        store = open_store("memory:")
        for _ in range(n):
            store.append("s", [event])

    def journal_send(n: int) -> None:
        journal = Journal(open_store("memory:"), "s")
        for _ in range(n):
            journal.send(message, Target.NEXT_STEP, False)

    def owner_inject(n: int) -> None:
        async def main() -> None:
            async with AsyncOwner(open_store("memory:"), "s", _NoRun(), start=False,
                                  watch=False) as owner:
                for _ in range(n):
                    await owner.inject(message)
        asyncio.run(main())

    def queue(n: int) -> None:
        async def main() -> None:
            inbox: asyncio.Queue[Message] = asyncio.Queue()
            for _ in range(n):
                inbox.put_nowait(message)
                while not inbox.empty():
                    inbox.get_nowait()
        asyncio.run(main())

    def per_call(fn: Callable[[int], None]) -> float:
        best = float("inf")
        for _ in range(5):
            began = time.process_time()
            fn(n)
            best = min(best, time.process_time() - began)
        return best / n

    rows = [("asyncio.Queue: put and a drain", per_call(queue)),
            ("store.append (memory:)", per_call(store_append)),
            ("journal.send (memory:)", per_call(journal_send)),
            ("AsyncOwner.inject (memory:)", per_call(owner_inject))]
    lines = [f"Where a send's time goes: CPU time per send, {n:,} sends, best of five.", "",
             "| layer, with those above it | per send |", "|---|---:|"]
    lines += [f"| {layer} | {t * 1e6:.2f} µs |" for layer, t in rows]
    return "\n".join(lines)


def _steer_table(quick: bool) -> str:
    """A steer acknowledged to the pydantic-ai model request that carries it, p50 and p99: each
    steer at a random moment into a run of eight 1 ms requests, ``AsyncOwner`` on ``memory:``."""
    import random

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    count, steps, delay = (10, 8, 0.001) if quick else (200, 8, 0.001)
    rng = random.Random(7)
    waiting: dict[str, float] = {}
    latencies: list[float] = []

    def seen(messages: list[Any]) -> None:
        now = time.perf_counter()
        for message in messages:
            for part in getattr(message, "parts", ()):
                text = getattr(part, "content", None)
                if part.part_kind == "user-prompt" and isinstance(text, str) and text in waiting:
                    latencies.append(now - waiting.pop(text))

    async def main() -> None:
        runner = AgentRunner(_agent(steps, delay, seen))
        for i in range(count):
            async with AsyncOwner(open_store("memory:"), "s", runner, watch=False) as owner:
                await owner.followup("work on")
                await asyncio.sleep(rng.uniform(0, steps * delay * 4))  # somewhere in the run
                text = f"steer {i}"
                await owner.steer(text)
                waiting[text] = time.perf_counter()
                await owner.wait_idle()
            waiting.pop(text, None)  # it came after the run's last request: a turn of its own

    asyncio.run(main())
    ordered = sorted(latencies)
    if not ordered:
        return "(no steer reached a run in progress)"
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return "\n".join([
        f"Steer acknowledged to the pydantic-ai model request that carries it: {len(ordered)} of "
        f"{count} steers, each at a random moment into a run of {steps} requests of 1 ms (the "
        f"others came after the run's last request), AsyncOwner on memory:.",
        "",
        "| p50 | p99 |",
        "|---:|---:|",
        f"| {statistics.median(ordered) * 1e3:.2f} ms | {p99 * 1e3:.2f} ms |",
    ])


def run(quick: bool = False) -> str:
    """The four tables, as markdown."""
    return "\n\n".join([_send_table(quick), _adapter_table(quick), _steer_table(quick),
                        _layers_table(quick)])


def main() -> None:
    """``python -m bench.async_bench [--quick]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
