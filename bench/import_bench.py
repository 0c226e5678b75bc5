"""What ``from nous_inbox import Inbox`` costs a fresh interpreter, against the libraries it is made of.

A program that only wants the value (an inbox, a message, a replay) pays for the import once, at
start: the modules the import loads and the time it takes. The baseline is what the core is built
on, ``import msgspec, pyrsistent, attrs``: the least an import of the core could cost.

Each sample is a fresh interpreter (``sys.executable``, with this process's ``sys.path``) that
counts ``sys.modules`` and reads ``time.perf_counter`` around the one import statement, so the
interpreter's own start is left out. The two sides alternate, which goes first alternating too;
the figures are the medians of the samples. Run it with ``python -m bench.import_bench``
(``--quick``: a few samples).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["OURS", "BASELINE", "Side", "main", "measure", "render", "run"]

OURS = "from nous_inbox import Inbox"
BASELINE = "import msgspec, pyrsistent, attrs"

_PROBE = """
import sys, time, json
before = set(sys.modules)
begin = time.perf_counter()
{statement}
elapsed = time.perf_counter() - begin
loaded = sorted(set(sys.modules) - before)
print(json.dumps({{"seconds": elapsed, "modules": loaded}}))
"""


@dataclass(frozen=True)
class Side:
    """One import statement's median time and what it loaded."""

    statement: str
    seconds: float
    modules: list[str]

    @property
    def ours(self) -> list[str]:
        """The modules of this package it loaded."""
        return [m for m in self.modules if m == "nous_inbox" or m.startswith("nous_inbox.")]


def _sample(statement: str) -> tuple[float, list[str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", _PROBE.format(statement=statement)],
                         capture_output=True, text=True, check=True, env=env).stdout
    found = json.loads(out.strip().splitlines()[-1])
    return float(found["seconds"]), list(found["modules"])


def measure(quick: bool = False) -> tuple[Side, Side]:
    """Both statements, alternating, each in fresh interpreters: (ours, baseline)."""
    samples = 3 if quick else 21
    times: dict[str, list[float]] = {OURS: [], BASELINE: []}
    loaded: dict[str, list[str]] = {}
    for i in range(samples + 1):
        for statement in ((OURS, BASELINE) if i % 2 else (BASELINE, OURS)):
            seconds, modules = _sample(statement)
            if i:  # the first round warms the disk cache and the bytecode caches
                times[statement].append(seconds)
            loaded[statement] = modules
    ours, baseline = (Side(s, statistics.median(times[s]), loaded[s]) for s in (OURS, BASELINE))
    return ours, baseline


def render(ours: Side, baseline: Side, quick: bool = False) -> str:
    """The markdown table: each statement's modules loaded and median time."""
    lines = [
        "| a fresh interpreter runs | modules loaded | of them nous_inbox's | time (median) | against the baseline |",
        "|---|---:|---:|---:|---:|",
    ]
    for side in (baseline, ours):
        lines.append(
            f"| `{side.statement}` | {len(side.modules)} | {len(side.ours)} "
            f"| {side.seconds * 1e3:.1f} ms | {side.seconds / baseline.seconds:.2f}x |"
        )
    extra = sorted(set(ours.modules) - set(baseline.modules) - set(ours.ours))
    lines += [
        "",
        f"Beyond its own modules and the baseline's, the core loads {len(extra)} of the standard "
        f"library's: {', '.join(extra) or 'none'}.",
    ]
    if quick:
        lines += ["", "(quick run: a few samples; shows the code works, not the figures)"]
    return "\n".join(lines)


def run(quick: bool = False) -> str:
    """Measure and return the markdown report (what ``main`` prints)."""
    return render(*measure(quick), quick=quick)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.import_bench [--quick]``: print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a few samples: a smoke run")
    args = parser.parse_args(argv)
    print(run(args.quick))


if __name__ == "__main__":
    main()
