"""The LangGraph adapter against the bare graph, and a steer's way to the model request.

Per model request: the same conversation (a tool call per step, then an answer) with a scripted
chat model that takes 1 ms a request, run once by a bare ``create_agent`` graph (``ainvoke``) and
once by ``GraphRunner`` over the same graph with ``InboxMiddleware``, in memory (``LocalSession``,
no checkpointer), interleaved (the machine is shared: each pair of runs meets the same load).
Reported: the best of each side (the floor's figure: the adapter at most 1.1x the bare graph),
the median and range of the pairs' ratios, the CPU time ratio (best of each, which load disturbs
less than wall time) and the load average. Then the time from a steer acknowledged
(``LocalSession.steer`` returned, inside a tool) to the model request that carries it, p50 and
p99.

    python -m bench --only langgraph_bench [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage

from nous_inbox.adapters.langgraph import GraphRunner, InboxMiddleware
from nous_inbox.runner.port import LocalSession
from tests.langgraph_kit import ScriptedChatModel, call

FLOOR = 1.1
LATENCY = 0.001


def _graph(steps: int, inbox: bool) -> Any:
    async def reply(messages: list[BaseMessage]) -> AIMessage:
        await asyncio.sleep(LATENCY)
        done = sum(1 for m in messages if m.type == "tool")
        return call("work", f"c{done}", n=done) if done < steps else AIMessage("done")

    def work(n: int) -> str:
        """Do a piece of work."""
        return f"result {n}"

    return create_agent(ScriptedChatModel(reply=reply), [work],
                        middleware=[InboxMiddleware()] if inbox else [])


async def _bare(steps: int) -> float:
    graph = _graph(steps, inbox=False)
    start = time.perf_counter()
    await graph.ainvoke({"messages": [("user", "go")]}, {"recursion_limit": 4 * steps + 10})
    return time.perf_counter() - start


async def _adapter(steps: int) -> float:
    runner = GraphRunner(_graph(steps, inbox=True), offload=False,
                         config={"recursion_limit": 4 * steps + 10})
    local = LocalSession()
    local.followup("go")
    start = time.perf_counter()
    async for _ in runner.arun_turn(local):
        pass
    return time.perf_counter() - start


async def _steers(steps: int) -> list[float]:
    seen: list[float] = []
    acked: dict[str, float] = {}
    local = LocalSession()

    async def reply(messages: list[BaseMessage]) -> AIMessage:
        text = str(messages[-1].text)
        if text in acked:
            seen.append(time.perf_counter() - acked.pop(text))
        await asyncio.sleep(LATENCY)
        done = sum(1 for m in messages if m.type == "tool")
        return call("work", f"c{done}", n=done) if done < steps else AIMessage("done")

    def work(n: int) -> str:
        """Do a piece of work."""
        text = f"steer {n}"
        local.steer(text)
        acked[text] = time.perf_counter()
        return f"result {n}"

    graph = create_agent(ScriptedChatModel(reply=reply), [work], middleware=[InboxMiddleware()])
    runner = GraphRunner(graph, offload=False, config={"recursion_limit": 4 * steps + 10})
    local.followup("go")
    async for _ in runner.arun_turn(local):
        pass
    return seen


def _timed(run: Callable[[], Awaitable[float]], requests: int) -> tuple[float, float]:
    """One run's wall time and CPU time per model request."""
    began = time.process_time()
    wall = asyncio.run(run())
    return wall / requests, (time.process_time() - began) / requests


def measure(quick: bool = False) -> dict[str, float]:
    steps, repeats = (5, 3) if quick else (30, 11)
    sides = {"bare": lambda: _bare(steps), "adapter": lambda: _adapter(steps)}
    for run in sides.values():  # first-run costs (imports, schemas) for both alike
        _timed(run, steps + 1)
    wall: dict[str, list[float]] = {"bare": [], "adapter": []}
    cpu: dict[str, list[float]] = {"bare": [], "adapter": []}
    for rep in range(repeats):
        for side in ("bare", "adapter") if rep % 2 == 0 else ("adapter", "bare"):
            w, c = _timed(sides[side], steps + 1)
            wall[side].append(w)
            cpu[side].append(c)
    pairs = sorted(a / b for a, b in zip(wall["adapter"], wall["bare"], strict=True))
    latencies = sorted(x for _ in range(repeats) for x in asyncio.run(_steers(steps)))
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    bare, adapter = min(wall["bare"]), min(wall["adapter"])
    return {"bare": bare, "adapter": adapter, "ratio": adapter / bare,
            "pairs_median": statistics.median(pairs), "pairs_low": pairs[0],
            "pairs_high": pairs[-1], "cpu_ratio": min(cpu["adapter"]) / min(cpu["bare"]),
            "load": os.getloadavg()[0], "repeats": repeats,
            "p50": statistics.median(latencies), "p99": p99}


def run(quick: bool = False) -> str:
    m = measure(quick)
    verdict = "met" if m["ratio"] <= FLOOR else "NOT met"
    return "\n".join([
        f"Per model request, {LATENCY * 1000:g} ms scripted model, in memory; best of "
        f"{m['repeats']:g} interleaved, load average {m['load']:.2f} on {os.cpu_count()} cores:",
        "",
        "| bare graph | GraphRunner | ratio | pairs: median (range) | CPU ratio | floor |",
        "|---:|---:|---:|---:|---:|---|",
        f"| {m['bare'] * 1e3:.3f} ms | {m['adapter'] * 1e3:.3f} ms | {m['ratio']:.2f}x "
        f"| {m['pairs_median']:.2f}x ({m['pairs_low']:.2f}-{m['pairs_high']:.2f}) "
        f"| {m['cpu_ratio']:.2f}x | at most {FLOOR}x: {verdict} |",
        "",
        "Steer acknowledged to the model request that carries it:",
        "",
        "| p50 | p99 |",
        "|---:|---:|",
        f"| {m['p50'] * 1e3:.3f} ms | {m['p99'] * 1e3:.3f} ms |",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
