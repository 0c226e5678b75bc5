"""``nous-inbox serve`` as a real process: Uvicorn on 127.0.0.1 and an ephemeral port, a real SSE
client cut off at random points and resumed, a clean stop on SIGTERM, and the safety refusals."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from nous_inbox.__main__ import main  # noqa: E402
from nous_inbox.events import TurnEnded  # noqa: E402
from nous_inbox.safe_json import event_json  # noqa: E402
from nous_inbox.store import open_store  # noqa: E402
from tests.helpers import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WAIT = 30.0  # seconds: a bound for what should happen soon, never a sleep to synchronise
TOKEN = "serve-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Served:
    """A ``nous-inbox serve`` process and the address it printed."""

    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url

    def client(self) -> Any:
        return httpx.Client(base_url=self.url, headers=AUTH, timeout=WAIT)

    def stop(self) -> int:
        """SIGTERM, and the exit status once it has stopped."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(WAIT)


def start_serve(store: str, *extra: str, env: dict[str, str] | None = None) -> Served:
    process = subprocess.Popen(
        [sys.executable, "-m", "nous_inbox", "serve", "--store", store, "--port", "0",
         "--token", TOKEN, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(process.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(WAIT)
    if not line or "http://" not in line[0]:
        process.kill()
        raise AssertionError(f"serve printed no address: {line!r} {process.stderr.read()!r}")  # type: ignore[union-attr]
    return Served(process, line[0].split()[2])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    store = f"sqlite:{tmp_path / 'log.sqlite'}"
    server = start_serve(store, "--agent", "nous_inbox.web.scripted:agent", env={
        "NOUS_INBOX_SCRIPTED_STEPS": "12", "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0.01"})
    try:
        yield server, store
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def read_cut(client: Any, session: str, last: int, cut_after: int) -> list[tuple[int, str]]:
    """Read the event stream from ``Last-Event-ID: last`` and hang up after ``cut_after`` bytes,
    mid-event as likely as not: the (id, data) pairs completed before the cut."""
    got: list[tuple[int, str]] = []
    buffer = b""
    with client.stream("GET", f"/api/sessions/{session}/events",
                       headers={"Last-Event-ID": str(last)}) as response:
        assert response.status_code == 200
        read = 0
        for chunk in response.iter_raw():
            take = chunk[: cut_after - read]
            read += len(take)
            buffer += take
            while b"\n\n" in buffer:
                block, buffer = buffer.split(b"\n\n", 1)
                fields = dict(line.split(": ", 1) for line in block.decode().splitlines()
                              if not line.startswith(":"))
                if fields:
                    got.append((int(fields["id"]), fields["data"]))
            if read >= cut_after or any('"turn_ended"' in data for _, data in got):
                break
    return got


def test_a_stream_cut_at_random_points_and_resumed_sees_every_event_once_in_order(
        served: tuple[Served, str]) -> None:
    server, store_url = served
    rng = random.Random(20)
    seen: list[tuple[int, str]] = []
    with server.client() as client:
        sent = client.post("/api/sessions/s1/messages", json={"mode": "prompt", "text": "survey the logs"})
        assert sent.status_code == 202
        steered = False

        def read_on() -> bool:
            nonlocal steered
            last = seen[-1][0] if seen else 0
            seen.extend(read_cut(client, "s1", last, rng.randint(1, 1500)))
            if not steered and len(seen) > 10:  # a person speaks while it works
                steered = client.post("/api/sessions/s1/messages",
                                      json={"mode": "steer", "text": "read db.log next"}).is_success
            return any('"turn_ended"' in data for _, data in seen)

        wait_until(read_on, what="the run ended, read in cut streams", timeout=WAIT, pace=0)
    with open_store(store_url, read_only=True) as store:
        stored = list(store.read("s1", 0))
    assert [seq for seq, _ in seen] == list(range(1, len(seen) + 1))
    assert [json.loads(data) for _, data in seen] == [
        json.loads(event_json(e)) for e in stored[: len(seen)]]
    assert isinstance(stored[len(seen) - 1], TurnEnded)
    assert server.stop() == 0


def test_sigterm_ends_open_streams_and_stops_cleanly(served: tuple[Served, str]) -> None:
    server, store_url = served
    with server.client() as client:
        client.post("/api/sessions/s1/messages", json={"mode": "inject", "text": "fyi"})
        with client.stream("GET", "/api/sessions/s1/events") as response:
            lines = response.iter_lines()
            while next(lines) != "id: 1":
                pass
            server.process.send_signal(signal.SIGTERM)
            rest = list(lines)  # the stream ends rather than hanging on
        # The drain lets the session go, which the stream shows before it ends: nothing else.
        shown = [line for line in rest if line.startswith("id:")]
        assert shown in ([], ["id: 2"])
        assert not shown or '"session_released"' in rest[rest.index("id: 2") + 1]
    assert server.process.wait(WAIT) == 0
    with open_store(store_url) as store:
        store.own("s1").release()  # the lease went back with the host


def test_the_token_is_needed_and_a_bad_request_is_a_clear_4xx(served: tuple[Served, str]) -> None:
    server, _ = served
    assert httpx.get(f"{server.url}api/sessions", timeout=WAIT).status_code == 401
    with server.client() as client:
        response = client.post("/api/sessions/s1/messages", json={"mode": "shout", "text": "x"})
        assert response.status_code == 400 and "mode: Invalid enum value 'shout'" in response.json()["error"]
        assert client.get("/").headers["content-type"].startswith("text/html")
    assert server.stop() == 0


@pytest.mark.parametrize(("args", "says"), [
    (["--host", "0.0.0.0"], "is not loopback: give --token"),
    (["--port", "70000"], "--port must be from 0 to 65535"),
    (["--idle-timeout", "nan"], "--idle-timeout must be a positive number"),
    (["--max-sessions", "0"], "--max-sessions must be at least 1"),
    (["--agent", "nous_inbox.web.scripted"], "--agent must be MODULE:FACTORY"),
    (["--agent", "no_such_module_here:agent"], "cannot import 'no_such_module_here'"),
    (["--agent", "nous_inbox.web.scripted:nothing"], "has no callable 'nothing'"),
])
def test_serve_refuses_unsafe_or_bad_options(
        args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOUS_INBOX_TOKEN", raising=False)
    argv = ["serve", "--store", f"sqlite:{tmp_path / 'log.sqlite'}",
            "--agent", "nous_inbox.web.scripted:agent", *args]
    assert main(argv) == 1
    assert says in capsys.readouterr().err


def test_without_the_web_extra_the_command_line_works_and_serve_says_what_is_missing() -> None:
    script = (
        "import sys\n"
        "sys.modules['starlette'] = sys.modules['uvicorn'] = None  # as if not installed\n"
        "from nous_inbox.__main__ import main\n"
        "assert main(['sessions', '--store', 'memory:']) == 0\n"
        "sys.exit(main(['serve', '--store', 'memory:', '--agent', 'nous_inbox.web.scripted:agent']))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=WAIT)
    assert result.returncode == 1, result.stderr
    assert "needs the web extra: pip install 'nous-inbox[web]'" in result.stderr
