"""The docs keep their promises: the Quickstart CI relies on, the rulings the code cites, a
reference page for every public module.

The docs site itself is built by ``mkdocs build --strict`` in ``.ci/run`` (a broken link or a
reference to a module that moved fails there); these checks need no docs tooling.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fenced_blocks(markdown: str, after_heading: str) -> list[list[str]]:
    """The fenced code blocks of ``markdown`` below ``after_heading``, each as its lines."""
    text = markdown.split(f"\n{after_heading}\n", 1)[1]
    return [block.strip("\n").splitlines() for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S)]


def test_the_quickstart_opens_with_exactly_two_commands() -> None:
    first = fenced_blocks((ROOT / "README.md").read_text(), "## Quickstart")[0]
    assert len(first) == 2
    assert first[0].endswith("nous-inbox demo")
    assert first[1].endswith("python -m pytest")


def test_ci_runs_the_quickstart_test_command() -> None:
    test_command = fenced_blocks((ROOT / "README.md").read_text(), "## Quickstart")[0][1]
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_ci_builds_the_docs_strictly() -> None:
    assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()


def test_the_design_numbers_rulings_one_to_eleven() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    rulings = design.split("## The rulings", 1)[1].split("\n## ", 1)[0]
    numbers = [int(n) for n in re.findall(r"^(\d+)\. \*\*", rulings, re.M)]
    assert numbers == list(range(1, 12))


def test_every_ruling_the_code_cites_is_in_the_design() -> None:
    cited: set[int] = set()
    for path in (ROOT / "nous_inbox").rglob("*.py"):
        for match in re.finditer(r"\brulings? (\d+(?:(?:, | and )\d+)*)", path.read_text()):
            cited.update(int(n) for n in re.findall(r"\d+", match.group(1)))
    assert cited, "the code cites no ruling: the pattern above no longer matches how it cites"
    assert cited <= set(range(1, 12))


def public_modules() -> set[str]:
    """Every module a user may import: not private, not a command line helper."""
    names = set()
    for path in (ROOT / "nous_inbox").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue
        if parts[:2] == ("nous_inbox", "cli") and parts[2:] != ("main",):
            continue  # the CLI's helpers; the command line documents itself (docs/cli.md)
        names.add(".".join(parts))
    return names


def test_every_public_module_has_a_reference_page() -> None:
    documented = set()
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        documented.update(re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    missing = public_modules() - documented
    assert not missing, f"add these to a page under docs/reference/: {sorted(missing)}"


def test_every_changelog_entry_is_a_line_of_its_own() -> None:
    entries = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines()
               if line.startswith("- ")]
    glued = [line for line in entries if re.search(r"[.)]\s*- [A-Z`]", line)]
    unfinished = [line for line in entries if not line.endswith(".")]
    assert entries and not glued and not unfinished, glued + unfinished


def test_no_page_keeps_a_fold_in_marker() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")]
    left = [page.name for page in pages if "<!-- fold-in" in page.read_text()]
    assert not left, f"fold these notes into the page's text: {left}"


def towncrier(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``towncrier`` (the test extra's) in ``cwd`` with this project's configuration."""
    return subprocess.run([sys.executable, "-m", "towncrier", *args], cwd=cwd,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def test_the_changelog_fragments_build_into_a_draft() -> None:
    done = towncrier("build", "--draft", "--version", "0.0.0", "--date", "2099-01-01", cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("## 0.0.0 (2099-01-01)\n"), done.stdout


def test_every_changelog_fragment_is_one_line_that_ends_a_sentence() -> None:
    fragments = [path for path in (ROOT / "changes").iterdir() if path.name != "README.md"]
    bad = [path.name for path in fragments
           if len(path.read_text().strip().splitlines()) != 1
           or not path.read_text().strip().endswith(".")]
    assert not bad, f"a fragment is one line ending with a period (changes/README.md): {bad}"


def test_a_fragment_becomes_a_line_of_the_next_release_above_the_last(tmp_path: Path) -> None:
    for name in ("pyproject.toml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "changes", tmp_path / "changes")
    (tmp_path / "changes" / "+frob.added.md").write_text("You can frob an inbox.\n")
    (tmp_path / "changes" / "+slow-frob.fixed.md").write_text("Frobbing is quick again.\n")

    done = towncrier("build", "--yes", "--version", "9.9.9", "--date", "2099-01-01", cwd=tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    changelog = (tmp_path / "CHANGELOG.md").read_text()
    release = changelog.split("## 9.9.9 (2099-01-01)\n", 1)[1].split("\n## ", 1)[0]
    sections = {part.split("\n", 1)[0]: part for part in release.split("### ")[1:]}
    assert "- You can frob an inbox.\n" in sections["Added"]  # beside the fragments already here
    assert "- Frobbing is quick again.\n" in sections["Fixed"]
    assert changelog.index("## 9.9.9") < changelog.index("## 0.1.0")
    assert not (tmp_path / "changes" / "+frob.added.md").exists()
