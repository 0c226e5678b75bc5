"""The log benchmark runs end to end on a tiny log and reports every table (no timing asserted)."""

from __future__ import annotations

import pytest

from bench import log_bench
from nous_inbox.codec import iter_events


def test_the_benchmark_reports_replay_growth_and_appends():
    report = log_bench.run(quick=True, events=600)
    assert "Replay of a 600-event JSON Lines log of runner sessions" in report
    assert "Replay of a 600-event JSON Lines log of sends and claims only" in report
    assert report.count("at most 2.50x raw") == report.count("at least 3x faster") == 2
    assert "raw `msgspec.json.decode`" in report
    assert "hand-written fold" in report
    assert "ours from a `file:` store" in report
    assert "ours from a `sqlite:` store" in report
    assert "How replay grows with log length" in report
    for store in ("`memory:`", "`file:`", "`sqlite:`"):
        assert store in report
    assert report.count("\n|---") == 5  # five tables
    assert "Opening a store of" in report


@pytest.mark.parametrize("shape", log_bench.SHAPES)
def test_the_generated_log_is_valid_and_the_baseline_fold_agrees_with_replay(shape):
    data = log_bench.make_log(500, shape)
    events = [event for _, _, event in iter_events(data)]
    assert [e.seq for e in events] == list(range(1, 501))
    queues, transcript, version = log_bench.hand_fold(data)
    assert version == 500
    replayed = log_bench._ours(data)
    assert sum(map(len, queues.values())) == replayed.inbox.count()
    assert len(transcript) == len(log_bench._ours(data).transcript)
    assert log_bench.hand_fold(data.decode())[1] == transcript


def test_the_stores_replay_the_same_session_as_the_log(tmp_path):
    data = log_bench.make_log(700)
    urls = log_bench._stores(str(tmp_path), 700)
    expected = log_bench._ours(data)
    for url in urls.values():
        assert log_bench._from_store(url)(data) == expected
