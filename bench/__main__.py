"""``python -m bench``: every benchmark, side by side with its baseline, as markdown tables.

``--quick`` runs each at a small size (seconds, not minutes) to show the code works; the figures
worth quoting come from a full run. Each table's module docstring says what is measured and how.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from importlib import import_module

SUITES = (
    ("Importing the core against the libraries it is made of", "bench.import_bench"),
    ("The inbox value against a deque + Lock inbox", "bench.inbox_bench"),
    ("Event log: replay, decoding and durable appends", "bench.log_bench"),
    ("Runner overhead per step against a hand-written loop", "bench.runner_bench"),
    ("Owner send-to-claim against a deque + Lock inbox", "bench.owner_bench"),
    ("AsyncOwner against an asyncio.Queue inbox; the pydantic-ai adapter against the bare agent",
     "bench.async_bench"),
    ("The LangGraph adapter against the bare graph; steer to model request",
     "bench.langgraph_bench"),
    ("The OpenAI Agents SDK adapter against the bare Runner.run; steer to model request",
     "bench.openai_agents_bench"),
    ("Mailbox against PraisonAI's InProcessMailbox", "bench.mailbox_bench"),
    ("PostgreSQL against SQLite: appends, owners, senders, cross-process steers",
     "bench.postgres_bench"),
    ("Long sessions: opening from a snapshot against a full replay; send latency as history grows",
     "bench.snapshot_bench"),
    ("The web face: idle sessions, steer to model request over HTTP, SSE fan-out", "bench.web_bench"),
    ("An idle serve over many stored sessions", "bench.serve_idle"),
    ("Text as it streams: a piece the model produced to a watcher's read", "bench.delta_bench"),
    ("The HTTP API while another session's agent burns the CPU", "bench.spin_bench"),
    ("The cost of metrics per send: an owner counted against one not counted",
     "bench.metrics_bench"),
    ("A pool of serve processes on one PostgreSQL: the spread, steers, SIGTERM and SIGKILL",
     "bench.pool_bench"),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: shows the code works")
    parser.add_argument("--only", metavar="NAME", help="run one suite, e.g. inbox_bench")
    args = parser.parse_args(argv)
    print(f"Python {platform.python_version()} on {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    for title, module in SUITES:
        if args.only and not module.endswith(args.only):
            continue
        print(f"\n## {title}\n", flush=True)
        started = time.perf_counter()
        print(import_module(module).run(args.quick))
        print(f"\n({module}: {time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
