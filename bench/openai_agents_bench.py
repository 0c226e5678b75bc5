"""The OpenAI Agents SDK adapter against the bare ``Runner.run``, and a steer's way to the model.

Two tables, each measured side by side in one run.

**Adapter overhead per model request.** One ``Agent`` whose model (a plain ``Model`` subclass,
scripted) answers after 1 ms (``asyncio.sleep(0.001)``) and calls a trivial tool
``S - 1`` times before answering, so a run is ``S`` model requests. Sides, one conversation of
``R`` runs each: the agent run directly (``Runner.run``, the conversation carried on with
``result.to_input_list()`` and the next prompt, tracing off); the same agent through
:class:`~nous_inbox.adapters.openai_agents.AgentRunner` on an in-memory ``LocalSession`` (claims
and records inline). Reported: time per model request, and the ratio to the bare run (the
floor: at most 1.1x).

**Steer to model request.** An ``AsyncOwner`` on ``memory:`` runs the same agent on a long run;
another task steers, and the time from the steer acknowledged (``await owner.steer`` returned)
to the model request that carries it is taken inside the model, ``N`` times at random moments:
p50 and p99. A steer lands at the next model call, so this is about what is left of the 1 ms
request in flight and its tool.

``python -m bench --only openai_agents_bench`` (``--quick``: small and fast).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

from nous_inbox.owner import AsyncOwner
from nous_inbox.store import open_store

__all__ = ["run"]


def _agent(steps: int, delay: float, seen: Any = None) -> Any:
    """An agent whose model answers after ``delay`` seconds: a tool call until the run has made
    ``steps - 1`` of them, then its answer. A plain ``Model`` subclass, so the model's own cost
    (the SDK's ``ScriptedModel`` copies every call it records) does not blur the figures."""
    from agents import Agent, function_tool
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call
    from agents.usage import Usage

    class Scripted(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                               **kwargs: Any) -> ModelResponse:
            await asyncio.sleep(delay)
            if seen is not None:
                seen(input)
            done = 0  # tool results since the last answer: this run's steps so far
            for item in reversed(input):
                if not isinstance(item, dict) or item.get("role") == "assistant":
                    break
                done += item.get("type") == "function_call_output"
            output = ([function_call("work", {"n": done}, call_id=f"c{done}")]
                      if done < steps - 1 else [assistant_message("done")])
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the bench runs without streaming")

    @function_tool
    def work(n: int) -> str:
        """A trivial tool."""
        return f"result {n}"

    return Agent("bench", model=Scripted(), tools=[work])


def _adapter_table(quick: bool) -> str:
    from agents import RunConfig, Runner

    from nous_inbox.adapters.openai_agents import AgentRunner
    from nous_inbox.runner.port import LocalSession

    steps, runs, reps, delay = (3, 3, 1, 0.001) if quick else (5, 20, 5, 0.001)
    config = RunConfig(tracing_disabled=True)

    async def bare() -> float:
        agent = _agent(steps, delay)
        history: list[Any] = []
        begin = time.perf_counter()
        for i in range(runs):  # one conversation, as a session is
            result = await Runner.run(agent, [*history, {"role": "user", "content": f"go {i}"}],
                                      run_config=config)
            history = result.to_input_list()
        return (time.perf_counter() - begin) / (runs * steps)

    async def local() -> float:
        runner = AgentRunner(_agent(steps, delay), offload=False, tracing_disabled=True)
        session = LocalSession()
        begin = time.perf_counter()
        for i in range(runs):
            session.followup(f"go {i}")
            async for _ in runner.arun_turn(session):
                pass
        return (time.perf_counter() - begin) / (runs * steps)

    async def all_sides() -> list[tuple[str, float]]:
        await bare()  # warm the SDK's first-run costs for every side alike
        await local()
        best: dict[str, float] = {}
        for _ in range(reps):  # interleaved, best of each: the machine is shared
            for side, measure in (("Runner.run, bare", bare),
                                  ("AgentRunner, in-memory session", local)):
                t = await measure()
                best[side] = min(t, best.get(side, t))
        return list(best.items())

    rows = asyncio.run(all_sides())
    base = rows[0][1]
    lines = [
        f"Per model request: {runs} runs of {steps} requests in one conversation, the model "
        f"taking {delay * 1e3:.0f} ms; best of {reps} interleaved. Floor: at most 1.1x.",
        "",
        "| side | per model request | slower |",
        "|---|---:|---:|",
    ]
    lines += [f"| {side} | {t * 1e3:.2f} ms | {t / base:.2f}x |" for side, t in rows]
    return "\n".join(lines)


def _steer_table(quick: bool) -> str:
    from nous_inbox.adapters.openai_agents import AgentRunner

    count, steps, delay = (10, 8, 0.001) if quick else (200, 8, 0.001)
    rng = random.Random(7)
    waiting: dict[str, float] = {}
    latencies: list[float] = []

    async def main() -> None:
        reached = asyncio.Event()

        def seen(items: Any) -> None:
            now = time.perf_counter()
            for item in items:
                text = item.get("content") if isinstance(item, dict) else None
                if isinstance(text, str) and text in waiting:
                    latencies.append(now - waiting.pop(text))
                    reached.set()

        runner = AgentRunner(_agent(steps, delay, seen), offload=False, tracing_disabled=True)
        for i in range(count):  # a run of a few steps each time: the SDK's cost grows with one
            store = open_store("memory:")
            async with AsyncOwner(store, "s", runner, watch=False) as owner:
                reached.clear()
                await owner.followup("work on")
                await asyncio.sleep(rng.uniform(0, steps * delay * 4))  # somewhere in the run
                text = f"steer {i}"
                await owner.steer(text)
                waiting[text] = time.perf_counter()
                await owner.wait_idle()
            waiting.pop(text, None)  # it came after the run's last call: a turn of its own

    asyncio.run(main())
    ordered = sorted(latencies)
    if not ordered:
        return "(no steer reached a run in progress)"
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return "\n".join([
        f"Steer acknowledged to the model request that carries it: {len(ordered)} of {count} "
        f"steers, each at a random moment into a run of {steps} requests of 1 ms (the others "
        f"came after the run's last request), AsyncOwner on memory:.",
        "",
        "| p50 | p99 |",
        "|---:|---:|",
        f"| {p50 * 1e3:.2f} ms | {p99 * 1e3:.2f} ms |",
    ])


def run(quick: bool = False) -> str:
    try:
        import agents  # noqa: F401
    except ImportError:
        return "(the Agents SDK is not installed: pip install 'nous-inbox[openai-agents]')"
    return f"{_adapter_table(quick)}\n\n{_steer_table(quick)}"


if __name__ == "__main__":
    print(run())
