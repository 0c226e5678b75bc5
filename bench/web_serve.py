"""Idle sessions held by a real ``nous-inbox serve`` process, measured from outside it.

What a user running ``serve`` sees in ``top`` or ``ps``: the process is started as they would
start it (``python -m nous_inbox serve``, the scripted agent of ``nous-inbox demo``, a ``sqlite:``
store, ``--idle-timeout`` long enough that the sessions stay held), every session is given its
work over HTTP (a prompt, whose turn reads a few logs with a tool, then a followup, a second
turn), and once they are idle the process is read from ``/proc``: its resident memory
(``VmRSS``), its threads (``/proc/<pid>/task``) and its CPU time. Nothing in the process is
collected or tidied for the measurement. Taken at two session counts, the per-session cost is
the slope between them, so what the process pays once (imports, Uvicorn, the thread pool) is not
spread over the sessions.

``bench/web_bench.py`` reports it beside the in-process figures (``python -m bench --only
web_bench``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nous_inbox.owner.store_worker import LINGER

__all__ = ["STEPS", "TOKEN", "Footprint", "measure", "resident", "serving", "settled_threads"]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token-0000"
#: Logs each session's first turn reads, one tool step each (the scripted agent's task).
STEPS = 3
PROMPT = "survey the logs"
FOLLOWUP = "which log was worst?"
WAIT = 300.0  # seconds: a bound on what should end, never a pause to let it


@dataclass(frozen=True)
class Footprint:
    """What ``serve`` held at each of two idle session counts, read from ``/proc``."""

    sessions: tuple[int, int]
    resident: tuple[int, int]  # bytes
    threads: tuple[int, int]
    cpu_idle: float  # of one core, over the settle interval at the larger count
    settle: float

    @property
    def per_session_kib(self) -> float:
        """Resident memory per idle session: the slope between the two counts."""
        return (self.resident[1] - self.resident[0]) / (self.sessions[1] - self.sessions[0]) / 1024

    @property
    def threads_per_session(self) -> float:
        """Threads per idle session: the slope between the two counts."""
        return (self.threads[1] - self.threads[0]) / (self.sessions[1] - self.sessions[0])


def resident(pid: int) -> int:
    """``VmRSS`` of ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _cpu(pid: int) -> float:
    """User and system CPU seconds ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def serving(directory: Path, max_sessions: int | None = None,
            agent: str = "nous_inbox.web.scripted:agent", *, store: str | None = None,
            code: Path = ROOT, steps: int = STEPS, idle_timeout: float | None = 86400,
            ) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``nous-inbox serve`` from the checkout ``code`` on ``store`` (a ``sqlite:`` file in
    ``directory`` by default) and a free loopback port, hosting ``agent`` (a ``--agent`` spec; a
    module of ``bench`` is importable; the scripted agent reads ``steps`` logs a task): the
    process and its address. ``max_sessions`` and ``idle_timeout`` are serve's options (``None``:
    its defaults). Its stderr goes to a file in ``directory`` (a pipe nobody reads could fill and
    stall it)."""
    env = {**os.environ, "PYTHONPATH": str(code), "NOUS_INBOX_SCRIPTED_STEPS": str(steps),
           "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0"}
    options = [] if max_sessions is None else ["--max-sessions", str(max_sessions)]
    if idle_timeout is not None:
        options += ["--idle-timeout", f"{idle_timeout:g}"]
    errors = directory / "serve.stderr"
    with open(errors, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "nous_inbox", "serve", "--store",
             store or f"sqlite:{directory / 'serve.sqlite'}", "--port", "0", "--token", TOKEN,
             "--agent", agent, *options],
            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=code, env=env,
        )
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(process.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(120)
        if not line or "http://" not in line[0]:
            raise RuntimeError(f"serve printed no address: {line!r} {errors.read_text()[-2000:]}")
        yield process, line[0].split()[2]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _until(done: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {WAIT:g} s: {what}")
        time.sleep(0.05)  # waiting for a condition, with a bound


def _work(client: Any, names: list[str]) -> None:
    """Give each session two finished turns: a prompt, then (once it has ended) a followup."""
    for turn, (mode, text) in enumerate((("prompt", PROMPT), ("followup", FOLLOWUP)), 1):
        for name in names:
            answer = client.post(f"/api/sessions/{name}/messages", json={"mode": mode, "text": text})
            if answer.status_code != 202:
                raise RuntimeError(f"{mode} to {name}: {answer.status_code} {answer.text}")
        for name in names:
            def ended(name: str = name, turn: int = turn) -> bool:
                state = client.get(f"/api/sessions/{name}", params={"limit": 0}).json()
                inbox = state["inbox"]
                return bool(state["turn"] >= turn and not state["running"]
                            and inbox["next_turn"] == 0 and inbox["next_step"] == 0)

            _until(ended, f"{name}'s turn {turn} ends")


def settled_threads(pid: int) -> int:
    """The thread count once it has held still for a few worker lingers: each idle owner's
    store worker lets its thread go ``LINGER`` seconds after its last job."""
    quiet = 2 * LINGER
    last, since = _threads(pid), time.monotonic()
    deadline = since + WAIT
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the threads of process {pid} never settled (last {last})")
        time.sleep(0.1)  # sampling a count, with a bound
        now = _threads(pid)
        if now != last:
            last, since = now, time.monotonic()
    return last


def measure(sessions: tuple[int, int], settle: float) -> Footprint:
    """Run ``serve``, hold ``sessions[0]`` then ``sessions[1]`` idle sessions with two turns
    behind each, and read the process from outside at each count (see the module docstring)."""
    import httpx

    small, large = sessions
    if not 0 < small < large:
        raise ValueError(f"sessions must be two counts, the first smaller, got {sessions}")
    memory: list[int] = []
    threads: list[int] = []
    with tempfile.TemporaryDirectory() as tmp, \
            serving(Path(tmp), large + 10) as (process, address), \
            httpx.Client(base_url=address, headers={"Authorization": f"Bearer {TOKEN}"},
                         timeout=60) as client:
        held = 0
        for count in sessions:
            _work(client, [f"idle-{i}" for i in range(held, count)])
            held = count
            threads.append(settled_threads(process.pid))
            memory.append(resident(process.pid))
        cpu, wall = _cpu(process.pid), time.perf_counter()
        time.sleep(settle)  # the measured interval: the process holds them idle
        busy = (_cpu(process.pid) - cpu) / (time.perf_counter() - wall)
    return Footprint((small, large), (memory[0], memory[1]), (threads[0], threads[1]),
                     busy, settle)
