"""The two-terminal tutorial, run as written, and the demo's promises: its own session, its store."""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nous_inbox.__main__ import main
from nous_inbox.events import TurnStarted
from nous_inbox.runner.scripted import log_names
from nous_inbox.store import open_store

ROOT = Path(__file__).resolve().parent.parent
WAIT = 120.0

#: The tutorial as the docs show it: terminal 1 runs, terminal 2 talks to the run.
TERMINAL_1 = "nous-inbox run --steps 8 --step-seconds 2 incident-7"
TERMINAL_2 = """\
nous-inbox steer incident-7 "read cdn.log next, it matters most"
nous-inbox inject incident-7 "fyi: the deploy is frozen until 14:00"
nous-inbox show incident-7
"""


def command(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[0] == "nous-inbox"
    return [sys.executable, "-m", "nous_inbox", *words[1:]]


def test_the_tutorial_redirects_the_agent(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "NOUS_INBOX_STORE": f"sqlite:{tmp_path / 'inbox.sqlite'}"}
    env.pop("NO_COLOR", None)
    run = subprocess.Popen(command(TERMINAL_1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=ROOT, env=env)
    assert run.stdout is not None and run.stderr is not None
    try:
        seen = []
        for line in run.stdout:  # the agent is working: its first tool is running
            seen.append(line)
            if "read_log(" in line and line.rstrip().endswith("…"):
                break
        for line in TERMINAL_2.splitlines():
            done = subprocess.run(command(line), capture_output=True, text=True, cwd=ROOT,
                                  env=env)
            assert done.returncode == 0, (line, done.stderr)
        for line in run.stdout:  # terminal 1 shows the redirection as it happens
            seen.append(line)
            if 'read_log(name="cdn.log") …' in line:
                break
        shown = "".join(seen)
        assert "steer     user: read cdn.log next, it matters most" in shown
        assert "Noted: 'read cdn.log next, it matters most'." in shown
    finally:
        run.send_signal(signal.SIGINT)  # Ctrl-C in terminal 1: the run is cancelled, then ends
        run.wait(WAIT)
    assert "Traceback" not in run.stderr.read()

    log = subprocess.run(command("nous-inbox log incident-7 --json"), capture_output=True,
                         text=True, cwd=ROOT, env=env)
    assert log.returncode == 0, log.stderr
    events = [json.loads(line) for line in log.stdout.splitlines()]
    (steer,) = [e for e in events if e["type"] == "message_sent" and e["wakeup"]
                and e["target"] == "next_step"]
    calls = [(e["seq"], e["call"]["arguments"]["name"]) for e in events
             if e["type"] == "tool_called"]
    claimed = next(e["seq"] for e in events
                   if e["type"] == "queue_claimed" and e["seq"] > steer["seq"])
    after_steer = [name for seq, name in calls if seq > claimed]
    assert after_steer[0] == "cdn.log"  # read right after the steer was claimed ...
    unsteered = log_names(8)
    assert unsteered.index("cdn.log") == 6
    assert [name for _, name in calls].index("cdn.log") < 6  # ... ahead of its place in the plan


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


def test_two_demos_in_the_same_second_each_get_their_own_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = time.localtime()
    real = time.strftime
    monkeypatch.setattr(time, "strftime", lambda fmt, *_: real(fmt, frozen))
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    assert cli("demo", "--store", url, "--step-seconds", "0")[0] == 0
    assert cli("demo", "--store", url, "--step-seconds", "0")[0] == 0
    with open_store(url) as store:
        first, second = store.streams()
        # Each demo's prompt opened turn 1 of its own session: neither ran on in the other's log.
        for session in (first, second):
            prompts = [e for e in store.read(session) if isinstance(e, TurnStarted) and e.reason == "prompt"]
            assert [e.turn for e in prompts] == [1], session
    assert first != second


def test_the_demo_says_which_store_it_writes_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:{tmp_path / 'default.sqlite'}"
    monkeypatch.setenv("NOUS_INBOX_STORE", url)
    status, text = cli("demo", "--step-seconds", "0")
    assert status == 0
    where = f" in {url} (the default store; --store URL picks another)\n"
    assert text.splitlines(keepends=True)[1].endswith(where)
    status, text = cli("demo", "--step-seconds", "0", "--json")
    assert status == 0 and all(json.loads(line) for line in text.splitlines())
    err = capsys.readouterr().err
    assert err.startswith("nous-inbox demo: session 'demo-")
    assert err.endswith(where)
