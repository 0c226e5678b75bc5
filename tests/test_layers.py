"""The layers of docs/design.md hold: the core imports alone and small, and the contracts in
pyproject.toml (checked by import-linter) keep every import pointing downward."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nous_inbox

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("sqlite3", "asyncio", "threading", "socket", "subprocess", "selectors", "concurrent")


def _fresh(code: str) -> dict[str, list[str]]:
    """What a fresh interpreter has in ``sys.modules`` after ``code``: the package's own modules
    and the heavy standard modules among them."""
    probe = (f"import sys\n{code}\n"
             "import json\n"
             "print(json.dumps({'ours': sorted(m for m in sys.modules if m.startswith('nous_inbox')),"
             f" 'heavy': sorted(m for m in {HEAVY!r} if m in sys.modules)}}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                         check=True, cwd=ROOT).stdout
    answer: dict[str, list[str]] = json.loads(out)
    return answer


def test_importing_the_core_loads_no_store_owner_thread_socket_or_event_loop() -> None:
    core = _fresh("import nous_inbox")
    # what the core's own dependencies load is theirs (pyrsistent loads threading), not ours
    theirs = set(_fresh("import attrs, msgspec, pyrsistent, logging")["heavy"])
    assert set(core["heavy"]) <= theirs, f"the core loads {sorted(set(core['heavy']) - theirs)}"
    assert "sqlite3" not in core["heavy"] and "asyncio" not in core["heavy"]
    assert len(core["ours"]) <= 12, core["ours"]
    assert not [m for m in core["ours"] if m.split(".")[1:2] and m.split(".")[1] in
                ("store", "runner", "owner", "mailbox", "adapters", "cli", "web")]


def test_the_version_is_read_only_when_asked() -> None:
    assert _fresh("import nous_inbox; nous_inbox.__version__")["ours"] == _fresh(
        "import nous_inbox")["ours"]
    assert isinstance(nous_inbox.__version__, str) and nous_inbox.__version__


def test_the_public_face_is_small_and_every_name_is_there() -> None:
    assert len(nous_inbox.__all__) <= 25
    for name in nous_inbox.__all__:
        assert getattr(nous_inbox, name) is not None


def test_every_module_of_the_core_is_bound_by_the_core_contract() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    core = next(c for c in contracts["contracts"] if c["type"] == "forbidden")
    modules = {f"nous_inbox.{p.stem}" for p in (ROOT / "nous_inbox").glob("*.py")
               if p.stem not in ("__init__", "__main__")}
    assert modules == set(core["source_modules"])
    packages = {f"nous_inbox.{p.parent.name}" for p in (ROOT / "nous_inbox").glob("*/__init__.py")}
    assert packages <= set(core["forbidden_modules"])
    layered = {name.strip() for layer in contracts["contracts"][0]["layers"]
               for name in layer.split("|")}
    assert packages <= layered


def test_the_layers_hold() -> None:
    linter = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports")
    assert linter, "import-linter is part of the test extra: pip install -e '.[test]'"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([linter, "--no-cache"], capture_output=True, text=True, cwd=ROOT,
                          env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
