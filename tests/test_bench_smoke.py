"""The inbox benchmark runs and reports what it says it reports.

This runs ``bench.inbox_bench.run(quick=True)`` (tiny queues, few repeats) and checks the shape of
the markdown only. It never asserts a timing: performance is measured by the benchmark itself, on a
quiet machine, never by the test suite.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from nous_inbox import Message

# bench/ is not an installed package: make the project root importable when pytest was started as
# `pytest` rather than `python -m pytest` (which puts the working directory on sys.path itself).
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from bench import inbox_bench  # noqa: E402


@pytest.fixture(scope="module")
def report() -> str:
    return inbox_bench.run(quick=True)


def _table(report: str, index: int) -> list[list[str]]:
    tables = [block for block in report.split("\n\n") if block.startswith("|")]
    lines = tables[index].splitlines()
    assert re.fullmatch(r"\|(-+:?\|)+", lines[1].replace("---:", "--:")), lines[1]
    return [
        [cell.strip() for cell in line.strip("|").split("|")] for line in [lines[0], *lines[2:]]
    ]


def test_the_comparison_table_has_a_row_per_operation_and_size(report: str) -> None:
    header, *rows = _table(report, 0)
    assert header == [
        "operation",
        "pending",
        "immutable / mutable",
        "ns per op (immutable / mutable)",
    ]
    operations = [row[0] for row in rows]
    for preset in ("steer", "inject", "followup", "send(m, 'next_step', True)"):
        assert f"{preset} vs mutable send" in operations
    for query in ("claim", "claim + read every message", "wants_wake", "count"):
        assert operations.count(query) == 3  # one row per queue size
    for row in rows:
        assert re.fullmatch(r"[0-9.e+-]+x", row[2]), row
        assert re.fullmatch(r"[0-9.,]+ / [0-9.,]+", row[3]), row


def test_the_growth_table_compares_both_sides_for_each_query(report: str) -> None:
    header, *rows = _table(report, 1)
    assert header[0].startswith("growth from 1 to ")
    assert header[1:] == ["immutable", "mutable"]
    assert [row[0] for row in rows] == [
        "claim",
        "claim + read every message",
        "wants_wake",
        "count",
    ]


def test_the_floor_table_sets_steer_against_the_mutable_send_with_the_collector_off_and_on(
    report: str,
) -> None:
    header, *rows = _table(report, 2)
    assert header[0].startswith("steer of ") and "built messages in a row" in header[0]
    assert [row[0] for row in rows] == ["collector off", "collector on"]
    for row in rows:
        assert re.fullmatch(r"[0-9.]+x", row[1]), row
        assert re.fullmatch(r"at most 1\.3x: (met|NOT met)", row[3]), row


def test_the_report_says_how_it_was_measured(report: str) -> None:
    assert "quick pass" in report
    assert "msgspec" in report and "pyrsistent" in report


def test_the_baseline_behaves_like_an_inbox() -> None:
    # The comparison is only fair if the baseline does the same job.
    box = inbox_bench.MutableInbox()
    box.send(Message.user("fyi"), "next_step", False)
    assert box.wants_wake() is False
    box.send(Message.user("go"), "next_step", True)
    box.send(Message.user("later"), "next_turn", True)
    assert (box.count(), box.count("next_step"), box.wants_wake()) == (3, 2, True)
    assert [m.content for m in box.claim("next_step")] == ["fyi", "go"]
    assert box.claim("next_step") == []
    assert [m.content for m in box.claim("next_turn")] == ["later"]
    assert box.wants_wake() is False


def test_main_prints_the_report(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inbox_bench, "run", lambda quick: f"report quick={quick}")
    inbox_bench.main(["--quick"])
    assert capsys.readouterr().out == "report quick=True\n"
