"""Schemathesis against a live ``nous-inbox serve``: the document at /openapi.json drives
requests generated from its schemas (valid and invalid ones, and sequences linked by their
answers) at a real process on a free port, with the scripted agent and a token; every answer must
be as the document says, and none a 5xx.

Bounded and repeatable: a fixed seed, a fixed number of examples per operation, no example
database. The event stream is left out: it answers until the server stops, so a generated request
would wait out its timeout; tests/test_web_api.py walks its refusals."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

if importlib.util.find_spec("schemathesis") is None:
    if os.environ.get("CI"):
        pytest.fail("schemathesis is missing: pip install -e '.[web-test]'", pytrace=False)
    pytest.skip("schemathesis is not installed (the web-test extra)", allow_module_level=True)
httpx = pytest.importorskip("httpx")

from nous_inbox.events import SCHEMA_VERSION, ModelRequested  # noqa: E402
from nous_inbox.store import open_store  # noqa: E402
from tests.test_web_serve import AUTH, ROOT, TOKEN, WAIT, Served, start_serve  # noqa: E402

SEED = 20240601
EXAMPLES = 15  # per operation and phase: the whole run stays near a minute on a busy machine


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    store = tmp_path / "log.sqlite"
    # This version's fixture store: its session "run" holds model requests, whose views are
    # checked as generated requests cannot find one (a seq drawn at random names none).
    shutil.copyfile(ROOT / "tests" / "data" / f"schema{SCHEMA_VERSION}.sqlite", store)
    with open_store(f"sqlite:{store}") as opened:
        seq = next(e.seq for e in opened.read("run") if isinstance(e, ModelRequested))
    (tmp_path / "schemathesis.toml").write_text(
        '[[operations]]\ninclude-operation-id = "model_view"\n'
        f'parameters = {{ session = "run", seq = {seq} }}\n')
    server = start_serve(f"sqlite:{store}", "--agent",
                         "nous_inbox.web.scripted:agent", env={
                             "NOUS_INBOX_SCRIPTED_STEPS": "3",
                             "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0.01"})
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def test_every_answer_of_a_live_serve_is_as_the_document_says(served: Served,
                                                              tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", served.url + "openapi.json",
         "--header", f"Authorization: Bearer {TOKEN}", "--checks", "all",
         "--max-examples", str(EXAMPLES), "--seed", str(SEED), "--workers", "1",
         "--exclude-operation-id", "stream_events", "--request-timeout", str(WAIT),
         "--generation-database", "none", "--no-color"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "No issues found" in run.stdout


def test_a_mode_sent_as_a_list_is_refused_in_the_one_shape_by_a_live_serve(
    served: Served,
) -> None:
    with httpx.Client(base_url=served.url, headers=AUTH, timeout=WAIT) as client:
        response = client.post("/api/sessions/s1/messages", json={"mode": ["steer"], "text": "x"})
        assert response.status_code == 400
        assert response.json() == {"error": "mode: Expected `str`, got `array`; send "
                                   '{"mode": "steer" | "inject" | "followup" | "prompt", '
                                   '"text": "..."}'}
        assert client.get("/api/sessions?prefix=s1").json()["sessions"] == []  # nothing written
