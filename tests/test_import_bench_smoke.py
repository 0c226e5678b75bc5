"""The import benchmark runs and renders its table (structure only: timings belong to bench/)."""

from bench import import_bench


def test_the_import_bench_sets_the_core_against_its_libraries_in_fresh_interpreters() -> None:
    report = import_bench.run(quick=True)
    lines = report.splitlines()
    assert lines[0].startswith("| a fresh interpreter runs | modules loaded |")
    assert lines[2].startswith("| `import msgspec, pyrsistent, attrs` | ")
    assert lines[3].startswith("| `from nous_inbox import Inbox` | ")
    assert lines[2].endswith("| 1.00x |") and lines[3].endswith("x |")


def test_the_core_alone_is_what_the_import_loads() -> None:
    ours, _ = import_bench.measure(quick=True)
    assert "nous_inbox.inbox" in ours.ours
    assert not [m for m in ours.ours if m.startswith(("nous_inbox.owner", "nous_inbox.store"))]
