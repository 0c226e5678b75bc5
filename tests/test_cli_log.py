"""``log --after/--follow/--limit`` and ``sessions --json``: reading a session as it grows."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import get_args

import pytest

from nous_inbox.__main__ import main
from nous_inbox.cli.terminal import BIDI_CONTROLS
from nous_inbox.events import (
    SCHEMA_VERSION,
    Event,
    MailAgent,
    MailSent,
    MessageSent,
    ToolCalled,
    TurnEnded,
)
from nous_inbox.message import Message, ToolCall
from nous_inbox.safe_json import event_json, json_safe
from nous_inbox.store import open_store
from tests import fixture_logs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
WAIT = 60.0


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


@pytest.fixture(params=["sqlite", "file", "postgres"])
def url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"{request.param}:{tmp_path / 'inbox.log'}"


def steer(url: str, *texts: str) -> None:
    for text in texts:
        assert cli("steer", "--create", "--store", url, "s", text)[0] == 0


class Lines(io.StringIO):
    """An output a test can wait on: ``wait_for(n)`` returns once ``n`` lines were written."""

    def __init__(self) -> None:
        super().__init__()
        self._written = threading.Condition()

    def write(self, text: str) -> int:
        with self._written:
            count = super().write(text)
            self._written.notify_all()
        return count

    def wait_for(self, lines: int) -> bool:
        with self._written:
            return self._written.wait_for(lambda: self.getvalue().count("\n") >= lines, WAIT)


def test_after_starts_after_the_given_seq(url: str) -> None:
    steer(url, "one", "two", "three")
    status, text = cli("log", "--store", url, "s", "--json", "--after", "1")
    assert status == 0
    assert [json.loads(line)["seq"] for line in text.splitlines()] == [2, 3]
    assert cli("log", "--store", url, "s", "--after", "3") == (0, "")


def test_limit_stops_after_n_events(url: str) -> None:
    steer(url, "one", "two", "three")
    text = cli("log", "--store", url, "s", "--json", "--limit", "2")[1]
    assert [json.loads(line)["message"]["content"] for line in text.splitlines()] == ["one", "two"]


def test_follow_prints_events_recorded_later_resuming_after_the_given_seq(url: str) -> None:
    steer(url, "one", "two")
    out = Lines()
    status: list[int] = []
    follower = threading.Thread(target=lambda: status.append(main(
        ["log", "--store", url, "s", "--json", "--follow", "--after", "1", "--limit", "3"],
        out=out,
    )))
    follower.start()
    assert out.wait_for(1)  # event 2, already there
    steer(url, "three")  # recorded while the follower waits
    assert out.wait_for(2)
    steer(url, "four", "five")
    follower.join(WAIT)
    assert not follower.is_alive() and status == [0]
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["seq"], e["message"]["content"]) for e in events] == [
        (2, "two"), (3, "three"), (4, "four"),
    ]


def test_a_follow_whose_session_is_deleted_says_so_rather_than_wait_or_skip_the_new_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Deleted under the follower (the rows removed, as an rm from another terminal would) and
    # begun again: following on from event #2 would skip the new log's first two events.
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    steer(url, "one", "two")
    out = Lines()
    status: list[int] = []
    follower = threading.Thread(target=lambda: status.append(main(
        ["log", "--store", url, "s", "--json", "--follow"], out=out,
    )), daemon=True)
    follower.start()
    assert out.wait_for(2)
    with sqlite3.connect(tmp_path / "inbox.sqlite") as db:
        db.execute("DELETE FROM events WHERE stream = 's'")
    follower.join(WAIT)
    assert not follower.is_alive() and status == [1]
    assert "session 's' was deleted while it was followed" in capsys.readouterr().err
    assert out.getvalue().count("\n") == 2


def test_ctrl_c_ends_a_follow_with_status_0_and_nothing_on_stderr(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    steer(url, "one")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    follow = subprocess.Popen(
        [sys.executable, "-m", "nous_inbox", "log", "--store", url, "s", "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )
    assert follow.stdout is not None and follow.stderr is not None
    assert follow.stdout.readline().startswith("#1 ")  # it is following now
    follow.send_signal(signal.SIGINT)
    assert follow.wait(WAIT) == 0
    assert follow.stderr.read() == "" and follow.stdout.read() == ""


@pytest.mark.parametrize(("option", "value"), [("--after", "-1"), ("--limit", "0")])
def test_a_range_out_of_bounds_is_a_usage_error(
    url: str, option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    steer(url, "one")
    assert cli("log", "--store", url, "s", option, value)[0] == 2
    assert option in capsys.readouterr().err


def test_sessions_json_is_one_object_per_session(url: str) -> None:
    steer(url, "one", "two")
    assert cli("inject", "--create", "--store", url, "b\u202eeta", "x")[0] == 0
    status, text = cli("sessions", "--store", url, "--json")
    assert status == 0 and "\u202e" not in text  # escaped, as all --json output is
    assert [json.loads(line) for line in text.splitlines()] == [
        {"session": "b\u202eeta", "events": 1}, {"session": "s", "events": 2},
    ]


# -- every event type has a line -------------------------------------------------------------


def test_every_event_type_has_a_line_of_its_own(tmp_path: Path) -> None:
    """``log`` on a store of this version's fixture, whose run and mailbox hold every event type
    (``tests.fixture_logs``): each event is one line of its own, never a Python repr."""
    store = tmp_path / "store.sqlite"
    shutil.copyfile(DATA / f"schema{SCHEMA_VERSION}.sqlite", store)
    examples = {stream: fixture_logs.events(SCHEMA_VERSION, stream) for stream in ("run", "mailbox")}
    assert {type(e) for events in examples.values() for e in events} == set(get_args(Event))
    for stream, events in examples.items():
        status, text = cli("log", "--store", f"sqlite:{store}", stream)
        lines = text.splitlines()
        assert status == 0 and len(lines) == len(events)
        for event, line in zip(events, lines, strict=True):
            assert line.startswith(f"#{event.seq:<5} ")
            assert f"{type(event).__name__}(" not in line, line
    text = cli("log", "--store", f"sqlite:{store}", "mailbox")[1]
    assert 'mail      m1 lead -> dev (action): {"task":"tidy","logs":["a.log"]}' in text
    assert "mail      m3 dev -> lead (reply, re m1): done" in text
    assert "agent     dev under lead" in text and "mail      m4 to dev withdrawn" in text
    assert "cancel of turn 2 asked" in cli("log", "--store", f"sqlite:{store}", "run")[1]


def test_log_json_is_the_codec_line_of_each_event(url: str) -> None:
    steer(url, "\x9b2J \u202eevil \u2028 end")
    text = cli("log", "--store", url, "s", "--json")[1]
    with open_store(url, read_only=True) as store:
        assert text.splitlines() == [event_json(e) for e in store.read("s")]
    assert not any(c in text for c in "\x9b\u202e\u2028")


def test_log_prints_no_control_or_bidi_character_raw_in_any_field(tmp_path: Path) -> None:
    hostile = "\x1b]0;pwned\x07\x9b2J\x7f\u202eevil\u2066"
    url = f"sqlite:{tmp_path / 'store.sqlite'}"
    with open_store(url) as store:
        store.append("s", [
            MessageSent(target="next_step", wakeup=False, message=Message.user(hostile)),
            ToolCalled(turn=1, step=1, call=ToolCall("c1", f"read{hostile}", {hostile: hostile})),
            TurnEnded(turn=1, steps=1, reason="error", error=hostile),
            MailSent(id=hostile, sender=hostile, recipient=hostile, body={hostile: [hostile]},
                     kind=hostile, reply_to=hostile),
            MailAgent(agent=hostile, parent=hostile),
        ])
    status, text = cli("log", "--store", url, "s")
    assert status == 0 and len(text.splitlines()) == 5
    assert not any(c in text for c in "\x1b\x07\x9b\x7f\u202e\u2066"), text


def test_json_output_escapes_every_bidi_control_text_output_escapes() -> None:
    for code in BIDI_CONTROLS:
        assert chr(code) not in json_safe(json.dumps(f"a{chr(code)}b", ensure_ascii=False))
