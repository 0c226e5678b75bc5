"""The code is typed and lint-clean: ``mypy --strict`` and ``ruff check`` run as part of the suite.

They run here, under pytest, so the one test command a user runs checks exactly what CI checks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> list[str]:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    assert found, f"{name} is not installed: install the test extra, pip install -e '.[test]'"
    return [found]


def test_mypy_strict_is_clean() -> None:
    result = subprocess.run(
        [*_tool("mypy"), "--no-incremental"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_is_clean() -> None:
    result = subprocess.run(
        [*_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
