"""Every ``nous-inbox`` command line the README shows works as shown.

The README's ``sh`` blocks are run in order, each ``nous-inbox ...`` line as
``python -m nous_inbox ...`` with the same arguments, in a temporary directory (so a relative
``sqlite:agent.db`` is a fresh store there) with the default store pointed there too, and each
must exit 0. So a README command that stops working, or that only works on a store prepared by
hand, fails the suite.

Left out, because other tests cover them: the Quickstart pair (``tests/test_docs.py`` checks its
shape, and CI runs its test command), and the long-running ``demo``, ``serve`` and ``run``
(``tests/test_cli*.py`` and ``tests/test_web*.py``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LONG_RUNNING = frozenset({"demo", "serve", "run"})


def readme_commands() -> list[list[str]]:
    """The arguments of each ``nous-inbox`` line in the README's ``sh`` blocks, in order, less
    the Quickstart section and the long-running commands."""
    readme = (ROOT / "README.md").read_text()
    before, rest = readme.split("\n## Quickstart\n", 1)
    after = rest.split("\n## ", 1)[1]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", before + "\n## " + after, re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["nous-inbox"] and words[1] not in LONG_RUNNING:
                commands.append(words[1:])
    return commands


def test_the_readme_shows_commands_to_run() -> None:
    commands = readme_commands()
    assert commands, "no nous-inbox line found: the pattern no longer matches the README"
    assert {"steer", "cancel"} <= {words[0] for words in commands}


def test_every_readme_command_exits_0_in_order(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "NOUS_INBOX_STORE": f"sqlite:{tmp_path / 'default.sqlite'}",
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    for words in readme_commands():
        done = subprocess.run(
            [sys.executable, "-m", "nous_inbox", *words], cwd=tmp_path, env=env,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )
        if done.returncode != 0:
            pytest.fail(f"README command `nous-inbox {shlex.join(words)}` exited "
                        f"{done.returncode}: {done.stderr.strip()}")
