"""The HTTP API while one session's agent burns the CPU, measured through a real ``serve``.

A sync model or tool runs in a worker thread of ``serve``'s process (``arun_turn`` hands it to
``asyncio.to_thread``), so the event loop that answers HTTP shares the interpreter with it. Three
rows, each a fresh ``python -m nous_inbox serve`` on a ``sqlite:`` store: no agent working (the
baseline); one session whose model and tool spin in Python bytecode, step after step (the
interpreter hands its lock to the loop every switch interval, 5 ms by default); one whose model
and tool spin inside one C call that never lets the lock go (``sum`` over a long ``range``,
about 0.1 s a call: a regex, a parser or a library that holds the lock looks like this). In each,
``inject`` is POSTed to another held session one request at a time over one kept-alive
connection, and each answer is timed from the client.

The limit beside the rows: a C call that holds the interpreter's lock stalls every thread of the
process for its length, the loop included; only another process escapes it (run such work in a
process pool from the tool, or give that agent a ``serve`` of its own).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import web_serve
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner import Runner
from nous_inbox.runner.tools import Tool

__all__ = ["agent", "measure", "run"]

#: Which spin the ``serve`` process's busy session does: ``python``, ``c`` or ``none``.
SPIN_VARIABLE = "NOUS_INBOX_BENCH_SPIN"
BUSY = "busy"
QUIET = ("quiet-1", "quiet-2")
SPIN_SECONDS = 0.1
_C_SPIN = 3_000_000  # a sum over this range holds the lock for tens of milliseconds here


def _spin(kind: str) -> None:
    if kind == "c":
        sum(range(_C_SPIN))
        return
    until = time.perf_counter() + SPIN_SECONDS
    while time.perf_counter() < until:
        pass


def agent(session: str) -> Runner:
    """``--agent bench.spin_bench:agent``: the busy session spins (as ``$NOUS_INBOX_BENCH_SPIN``
    says) in its model and its tool, step after step; any other answers at once."""
    kind = os.environ.get(SPIN_VARIABLE, "none")

    def work() -> str:
        """Burn the CPU a while."""
        _spin(kind)
        return "done"

    def model(transcript: Any, tools: Any) -> Message:
        if session != BUSY:
            return Message.assistant("ok")
        _spin(kind)
        return Message.assistant("", tool_calls=[ToolCall(f"w{len(transcript)}", "work", {})])

    return Runner(model, [Tool(work, name="work", description="Burn the CPU a while.")],
                  max_steps=1_000_000)


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(kind: str, posts: int) -> tuple[float, float, float]:
    """p50, p99 and the longest of ``posts`` POSTs while the busy session spins as ``kind``."""
    import httpx

    os.environ[SPIN_VARIABLE] = kind
    try:
        with tempfile.TemporaryDirectory() as tmp, \
                web_serve.serving(Path(tmp), 10, "bench.spin_bench:agent") as (_, address), \
                httpx.Client(base_url=address, timeout=120,
                             headers={"Authorization": f"Bearer {web_serve.TOKEN}"}) as client:
            for name in QUIET:  # held before the clock starts: an open is not what is measured
                client.post(f"/api/sessions/{name}/messages", json={"mode": "inject", "text": "hi"})
            if kind != "none":
                client.post(f"/api/sessions/{BUSY}/messages", json={"mode": "prompt", "text": "go"})
                deadline = time.monotonic() + 60
                while not client.get(f"/api/sessions/{BUSY}", params={"limit": 0}).json()["running"]:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the busy session never started running")
                    time.sleep(0.05)  # waiting for a condition, with a bound
            samples = []
            for i in range(posts):
                began = time.perf_counter()
                answer = client.post(f"/api/sessions/{QUIET[i % len(QUIET)]}/messages",
                                     json={"mode": "inject", "text": f"m{i}"})
                samples.append(time.perf_counter() - began)
                if answer.status_code != 202:
                    raise RuntimeError(f"POST answered {answer.status_code}: {answer.text}")
    finally:
        os.environ.pop(SPIN_VARIABLE, None)
    return _percentile(samples, 0.5), _percentile(samples, 0.99), max(samples)


def run(quick: bool) -> str:
    posts = 40 if quick else 300
    rows = ["| another session's agent | POST p50 | POST p99 | longest |", "|---|---:|---:|---:|"]
    for kind, label in (("none", "idle"), ("python", "spins in Python"),
                        ("c", "spins in one C call at a time")):
        p50, p99, longest = measure(kind, posts)
        rows.append(f"| {label} | {p50 * 1e3:.1f} ms | {p99 * 1e3:.1f} ms | {longest * 1e3:.0f} ms |")
    return "\n".join(rows) + (f"\n\n{posts} POSTs of `inject` one at a time to a held session; the "
                              "limit: a C call holding the interpreter's lock stalls the process for its length.")


if __name__ == "__main__":
    import sys

    print(run("--quick" in sys.argv))
