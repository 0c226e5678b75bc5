"""The ``nous-inbox`` command: exit statuses, one-line errors, the documented JSON, live sessions."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_inbox.__main__ import main
from nous_inbox.events import Warned
from nous_inbox.store import open_store

ROOT = Path(__file__).resolve().parent.parent


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


@pytest.fixture(params=["sqlite", "postgres"])
def url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The store the commands use: the embedded default, then a PostgreSQL server."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return f"sqlite:{tmp_path / 'inbox.sqlite'}"


def test_steer_inject_followup_then_show_json_prints_the_documented_shape(url: str) -> None:
    assert cli("inject", "--create", "--store", url, "s1", "fyi")[0] == 0
    assert cli("steer", "--create", "--store", url, "s1", "go")[0] == 0
    assert cli("followup", "--create", "--store", url, "s1", "later")[0] == 0
    status, text = cli("show", "--store", url, "s1", "--json")
    assert status == 0
    shown = json.loads(text)
    assert shown["next_turn"] == [{"role": "user", "content": "later", "wakeup": True}]
    assert shown["next_step"] == [
        {"role": "user", "content": "fyi", "wakeup": False},
        {"role": "user", "content": "go", "wakeup": True},
    ]
    assert shown["wants_wake"] is True


def test_show_log_and_sessions_read_what_was_appended(url: str) -> None:
    cli("steer", "--create", "--store", url, "alpha", "one")
    cli("inject", "--create", "--store", url, "beta", "two")
    status, text = cli("sessions", "--store", url)
    assert status == 0
    assert text.splitlines() == ["alpha\t1 events", "beta\t1 events"]
    status, text = cli("log", "--store", url, "alpha")
    assert status == 0 and "steer" in text and "one" in text
    status, text = cli("log", "--store", url, "alpha", "--json")
    (line,) = text.splitlines()
    assert json.loads(line)["type"] == "message_sent"
    status, text = cli("show", "--store", url, "beta")
    assert status == 0 and "fyi" not in text and "two" in text and "wants_wake: no" in text


def test_the_default_store_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOUS_INBOX_STORE", f"sqlite:{tmp_path / 'env.sqlite'}")
    assert cli("steer", "--create", "s", "hello")[0] == 0
    assert (tmp_path / "env.sqlite").exists()
    assert json.loads(cli("show", "s", "--json")[1])["next_step"][0]["content"] == "hello"


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["steer", "only-a-session"],
        ["show"],
        ["show", "s", "extra"],
        ["run", "s", "--steps", "zero"],
        ["run", "s", "--steps", "0"],
        ["run", "s", "--steps", "1001"],
        ["run", "s", "--step-seconds", "nan"],
        ["run", "s", "--step-seconds", "inf"],
        ["run", "s", "--step-seconds", "-1"],
        ["run", "s", "--step-seconds", "1e308"],
        ["demo", "--step-seconds", "nan"],
        ["demo", "--step-seconds", "-inf"],
        ["steer", "", "text"],
        ["show", ""],
        ["log", "a\x1b[2Jb"],
        ["run", "tab\there"],
        ["followup", "bell\x07", "text"],
        ["steer", "--store", "", "s", "text"],
        ["show", "--store", "", "s"],
        ["sessions", "--store", "  "],
        ["demo", "--store", ""],
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("NOUS_INBOX_STORE", f"sqlite:{tmp_path / 'untouched.sqlite'}")
    assert cli(*argv)[0] == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err  # one line, argparse's usage block too
    assert err.startswith("nous-inbox") and "Traceback" not in err
    assert not (tmp_path / "untouched.sqlite").exists()  # refused before any store was opened


def test_a_parse_error_points_at_the_help_of_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("show")[0] == 2
    assert capsys.readouterr().err == (
        "nous-inbox show: the following arguments are required: SESSION "
        "(see nous-inbox show --help)\n"
    )
    assert cli("bogus")[0] == 2
    err = capsys.readouterr().err
    assert err.startswith("nous-inbox: argument COMMAND: invalid choice: 'bogus'")
    assert err.endswith(" (see nous-inbox --help)\n")


@pytest.mark.parametrize("argv", [["--help"], ["show", "--help"], ["run", "-h"]])
def test_help_still_prints_and_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(*argv)[0] == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("usage: nous-inbox") and captured.err == ""


def test_an_empty_message_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("steer", "--store", url, "s", "   ")[0] == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "empty" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["show", "--store", "{url}", "nobody"], "no session 'nobody'"),
        (["log", "--store", "{url}", "nobody"], "no session 'nobody'"),
        (["show", "--store", "ftp:x", "s"], "ftp"),
    ],
)
def test_data_errors_exit_1_with_one_line_and_no_traceback(
    url: str, argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli("inject", "--create", "--store", url, "somebody", "so the store exists")[0] == 0
    status, _ = cli(*[a.replace("{url}", url) for a in argv])
    err = capsys.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["show", "s"], ["log", "s"], ["sessions"], ["steer", "s", "x"]])
def test_a_directory_for_a_store_is_one_line_exit_1(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, _ = cli(command[0], "--store", f"sqlite:{tmp_path}", *command[1:])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert str(tmp_path) in err


@pytest.mark.parametrize("scheme", ["sqlite", "file"])
@pytest.mark.parametrize("command", [["show", "s"], ["show", "s", "--json"], ["log", "s"], ["sessions"]])
def test_reading_a_store_that_is_not_there_says_so_and_creates_nothing(
    tmp_path: Path, scheme: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.sqlite"
    status, text = cli(command[0], "--store", f"{scheme}:{missing}", *command[1:])
    err = capsys.readouterr().err
    assert status == 1 and text == ""
    assert err.count("\n") == 1 and "no store at" in err and str(missing) in err
    assert not missing.exists() and list(tmp_path.iterdir()) == []


def test_writing_commands_still_create_the_store(tmp_path: Path) -> None:
    path = tmp_path / "new" / "inbox.sqlite"
    path.parent.mkdir()
    assert cli("inject", "--create", "--store", f"sqlite:{path}", "s", "hello")[0] == 0
    assert path.exists()
    assert cli("sessions", "--store", f"sqlite:{path}")[1] == "s\t1 events\n"


def test_a_file_that_is_not_a_store_is_one_line_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    for command in (["show", "s"], ["steer", "s", "x"]):
        status, _ = cli(command[0], "--store", f"sqlite:{junk}", *command[1:])
        err = capsys.readouterr().err
        assert status == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert junk.read_bytes() == b"this is not a database" * 100


def test_a_database_error_from_below_is_one_line_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    from nous_inbox.cli import commands

    def fails(args: object, out: object) -> int:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(commands, "sessions", fails)
    assert cli("sessions", "--store", "memory:")[0] == 1
    assert capsys.readouterr().err == "nous-inbox sessions: disk I/O error\n"


def test_a_corrupt_log_is_a_data_error_naming_the_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log.jsonl"
    url = f"file:{path}"
    cli("steer", "--create", "--store", url, "s", "one")
    cli("steer", "--create", "--store", url, "s", "two")
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"seq":1', b'"seq":"x"')
    path.write_bytes(b"".join(lines))
    status, _ = cli("show", "--store", url, "s")
    err = capsys.readouterr().err
    assert status == 1 and "line 2" in err and "Traceback" not in err


def test_tour_walks_through_the_semantics() -> None:
    status, text = cli("tour")
    assert status == 0
    for needle in ("inject is inert", "steer wakes it", "followup waits", "ValueError"):
        assert needle in text


def test_demo_replays_equal_to_the_live_state(url: str) -> None:
    status, text = cli("demo", "--store", url, "--step-seconds", "0")
    assert status == 0, text
    assert "replayed" in text and "equal the live state" in text
    for mode in ("inject", "steer", "followup"):
        assert f"person > {mode}" in text
    (session,) = open_store(url).streams()
    assert session.startswith("demo-")


#: The steer names a log to read and says stop, so the scripted run (a thousand steps otherwise)
#: ends at the step that takes it, however long the steer's process took to start.
STEER = "read auth.log too, then stop"


def test_run_can_be_steered_from_another_process(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        [sys.executable, "-m", "nous_inbox", "run", "--store", url, "s", "--json",
         "--steps", "1000", "--step-seconds", "0.3"],  # until the steer stops it
        stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )
    assert run.stdout is not None
    events = []
    for line in run.stdout:
        events.append(json.loads(line))
        if events[-1]["type"] == "tool_called":
            break
    steer = subprocess.run(
        [sys.executable, "-m", "nous_inbox", "steer", "--store", url, "s", STEER],
        capture_output=True, text=True, cwd=ROOT, env=env,
    )
    assert steer.returncode == 0, steer.stderr
    events.extend(json.loads(line) for line in run.stdout)
    assert run.wait(timeout=60) == 0
    replies = [e["message"]["content"] for e in events if e["type"] == "model_replied"]
    assert any(f"Noted: {STEER!r}" in r for r in replies)
    assert any(e["type"] == "message_sent" and e["message"]["content"] == STEER
               for e in events)  # the running owner saw the other process's append


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_replay_draws_a_progress_bar_on_a_terminal_only() -> None:
    from nous_inbox.cli.progress import MIN_EVENTS, with_progress

    terminal, pipe = _Terminal(), io.StringIO()
    assert list(with_progress(range(MIN_EVENTS), MIN_EVENTS, "replaying", terminal)) == list(
        range(MIN_EVENTS)
    )
    assert list(with_progress(range(MIN_EVENTS), MIN_EVENTS, "replaying", pipe)) == list(
        range(MIN_EVENTS)
    )
    drawn = terminal.getvalue()
    assert "replaying [" in drawn and f"{MIN_EVENTS:,}/{MIN_EVENTS:,}" in drawn
    assert drawn.endswith("\n") and "events in" in drawn
    assert pipe.getvalue() == ""
    short = _Terminal()
    assert list(with_progress(range(10), 10, "replaying", short)) == list(range(10))
    assert short.getvalue() == ""  # a short replay is over before a bar could help


# -- quiet on a closed pipe, and no tracebacks from the library's logging ---------------------------


class _ClosesAfter(io.StringIO):
    """An output whose reader leaves after ``lines`` writes, the way ``| head -3`` does."""

    def __init__(self, lines: int) -> None:
        super().__init__()
        self.left = lines
        self.refused = 0

    def write(self, text: str) -> int:
        if self.left <= 0:
            self.refused += 1
            raise BrokenPipeError(32, "Broken pipe")
        self.left -= 1
        return super().write(text)


@pytest.mark.parametrize("command", [["demo"], ["demo", "--json"], ["run", "s"], ["run", "s", "--json"]])
def test_a_reader_that_leaves_ends_the_command_quietly_with_0(
    url: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = _ClosesAfter(3)
    status = main([*command, "--store", url, "--step-seconds", "0"], out=out)
    err = capsys.readouterr().err
    if command == ["demo", "--json"]:  # where the log went, on stderr, before any event
        assert err.startswith("nous-inbox demo: session 'demo-") and err.count("\n") == 1
        err = ""
    assert status == 0 and err == ""
    assert out.getvalue().count("\n") == 3 and out.refused == 1  # one try, then silence
    with open_store(url) as store:
        (session,) = store.streams()
        events = list(store.read(session))
    assert type(events[-1]).__name__ == "TurnEnded"  # the run went on to its end


def _spawn(*argv: str, stdout: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NO_COLOR", None)
    return subprocess.Popen(
        [sys.executable, "-m", "nous_inbox", *argv], stdout=stdout, stderr=subprocess.PIPE,
        text=True, cwd=ROOT, env=env,
    )


def test_run_piped_into_a_reader_that_closes_after_3_lines_exits_0_without_tracebacks(
    url: str,
) -> None:
    # Each tool takes 0.2 s, so the reader is gone long before the later events are written.
    run = _spawn("run", "--store", url, "s", "--json", "--steps", "3", "--step-seconds", "0.2",
                 stdout=subprocess.PIPE)
    assert run.stdout is not None and run.stderr is not None
    lines = [json.loads(run.stdout.readline()) for _ in range(3)]
    run.stdout.close()
    err = run.stderr.read()
    assert run.wait(timeout=60) == 0, err
    assert "Traceback" not in err and err == ""
    assert lines[0]["type"] == "message_sent"
    with open_store(url) as store:
        assert store.version("s") > 3  # it kept running, and recorded, after the reader left


def test_output_into_a_pipe_nobody_reads_exits_0_without_tracebacks(url: str) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first write: every write is EPIPE
    try:
        run = _spawn("run", "--store", url, "s", "--steps", "1", "--step-seconds", "0",
                     stdout=write_end)
    finally:
        os.close(write_end)
    assert run.stderr is not None
    err = run.stderr.read()
    assert run.wait(timeout=60) == 0 and err == ""
    cli("steer", "--store", url, "s", "one more")
    log = _spawn("log", "--store", url, "s", stdout=subprocess.PIPE)
    assert log.stdout is not None and log.stderr is not None
    assert log.stdout.readline().startswith("#1")
    log.stdout.close()
    assert log.wait(timeout=60) == 0 and "Traceback" not in log.stderr.read()


def test_a_failing_tool_is_one_warning_line_not_a_traceback(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nous_inbox.runner.scripted import ScriptedAgent

    def read_log(self: ScriptedAgent, name: str) -> str:
        raise RuntimeError("disk\non fire")

    monkeypatch.setattr(ScriptedAgent, "read_log", read_log)
    status, text = cli("run", "--store", url, "s", "--steps", "1", "--step-seconds", "0")
    err = capsys.readouterr().err
    assert status == 0 and "error: RuntimeError: disk on fire" in text
    assert "Traceback" not in err and err.strip()
    for line in err.splitlines():
        assert line.startswith("nous-inbox: warning: "), line
    assert "tool 'read_log' raised; the model gets an error result (RuntimeError: disk on fire)" in err


def test_main_leaves_the_callers_logging_as_it_found_it(url: str) -> None:
    import logging

    before = list(logging.getLogger().handlers)
    cli("steer", "--create", "--store", url, "s", "x")
    assert logging.getLogger().handlers == before


# -- what reaches a terminal -------------------------------------------------------------------------

HOSTILE = "look \x1b]0;pwned\x07\x1b[2J\x9b1;1H here\x7f"


def test_show_and_log_escape_control_characters_but_json_keeps_them(url: str) -> None:
    assert cli("steer", "--create", "--store", url, "s", HOSTILE)[0] == 0
    for command in ("show", "log"):
        status, text = cli(command, "--store", url, "s")
        assert status == 0
        assert not any(c in text for c in "\x1b\x07\x9b\x7f"), repr(text)
        assert "look \\x1b]0;pwned\\x07\\x1b[2J\\x9b1;1H here\\x7f" in text
    shown = json.loads(cli("show", "--store", url, "s", "--json")[1])
    assert shown["next_step"][0]["content"] == HOSTILE
    (line,) = cli("log", "--store", url, "s", "--json")[1].splitlines()
    assert json.loads(line)["message"]["content"] == HOSTILE


def test_every_rendered_event_field_is_escaped() -> None:
    from nous_inbox.cli.render import format_event
    from nous_inbox.cli.style import Style
    from nous_inbox.events import (
        Event,
        ModelReplied,
        Nudged,
        ToolCalled,
        ToolReturned,
        TurnEnded,
        TurnStarted,
        Warned,
    )
    from nous_inbox.message import Message, ToolCall

    call = ToolCall("c1", "read_log", {"name": HOSTILE})
    events: list[Event] = [
        ModelReplied(turn=1, step=1, message=Message.assistant(HOSTILE)),
        ModelReplied(turn=1, step=1, message=Message.assistant(HOSTILE, tool_calls=[call])),
        ToolCalled(turn=1, step=1, call=call),
        ToolReturned(turn=1, step=1, message=Message.tool(HOSTILE, tool_call_id="c1")),
        Nudged(turn=1, step=1, message=Message.user(HOSTILE)),
        TurnStarted(turn=1, reason=HOSTILE),
        TurnEnded(turn=1, steps=1, reason="error", error=HOSTILE),
        Warned(text=HOSTILE),
    ]
    for event in events:
        line = format_event(event, Style(None, force=False))
        assert not any(c in line for c in "\x1b\x07\x9b\x7f"), (event, line)


def test_a_final_answer_shows_in_full_a_reply_with_tool_calls_is_cut() -> None:
    from nous_inbox.cli.render import format_event
    from nous_inbox.cli.style import Style
    from nous_inbox.events import ModelReplied
    from nous_inbox.message import Message, ToolCall

    summary = "Read 5 log(s): " + "; ".join(f"log{i}.log: finding number {i}" for i in range(15)) + "."
    assert 300 < len(summary) < 500
    final = format_event(ModelReplied(turn=1, step=3, message=Message.assistant(summary)),
                         Style(None, force=False))
    assert final.endswith(summary)
    working = format_event(
        ModelReplied(turn=1, step=3, message=Message.assistant(
            summary, tool_calls=[ToolCall("c", "read_log", {"name": "api.log"})])),
        Style(None, force=False),
    )
    assert summary not in working and "…" in working and 'read_log(name="api.log")' in working


def test_run_takes_as_many_steps_as_asked(url: str) -> None:
    status, text = cli("run", "--store", url, "long", "--json", "--steps", "9", "--step-seconds", "0")
    assert status == 0
    calls = [json.loads(line) for line in text.splitlines()]
    names = [e["call"]["arguments"]["name"] for e in calls if e["type"] == "tool_called"]
    assert len(names) == 9 and names[-1] == "shard-2.log"


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    import nous_inbox

    assert cli("--version")[0] == 0
    assert capsys.readouterr().out.strip() == f"nous-inbox {nous_inbox.__version__}"


def test_the_cli_modules_import_one_way_commands_never_import_main() -> None:
    # main dispatches to commands; commands raising main's error made an import circle.
    import ast

    for path in (ROOT / "nous_inbox" / "cli").glob("*.py"):
        if path.name in ("__init__.py", "__main__.py", "main.py"):
            continue
        tree = ast.parse(path.read_text())
        imported = {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        } | {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
            for alias in node.names
        }
        assert "nous_inbox.cli.main" not in imported, path.name


def test_the_usage_error_is_still_importable_from_main() -> None:
    from nous_inbox.cli.usage import UsageError
    from nous_inbox.cli.usage import UsageError as Moved

    assert UsageError is Moved


# -- hostile text: nothing from a log or an argument steers the terminal ---------------------------

RAW_CONTROLS = "\x1b\x07\x7f\x9b\x85\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
CRAFTED = "pay \u202eexe.txt\u202c now \x1b]0;pwned\x07 \x9b2J \x7f \u2066x\u2069 \u2028 end"


def test_json_output_escapes_del_c1_and_bidi_controls_and_still_decodes_to_the_log(url: str) -> None:
    assert cli("steer", "--create", "--store", url, "s", CRAFTED)[0] == 0
    shown = cli("show", "--store", url, "s", "--json")[1]
    logged = cli("log", "--store", url, "s", "--json")[1]
    for text in (shown, logged):
        assert not any(c in text for c in RAW_CONTROLS + "\u2028"), repr(text)
    assert "\\u009b2J" in shown and "\\u202e" in logged and "\\u007f" in logged
    assert json.loads(shown)["next_step"][0]["content"] == CRAFTED
    assert json.loads(logged)["message"]["content"] == CRAFTED


def test_run_json_output_is_escaped_too(url: str) -> None:
    out = io.StringIO()
    status = main(["run", "--store", url, "s", "--json", "--steps", "1", "--step-seconds", "0",
                   "--task", f"survey {CRAFTED}"], out=out)
    assert status == 0
    assert not any(c in out.getvalue() for c in RAW_CONTROLS), repr(out.getvalue())
    first = json.loads(out.getvalue().splitlines()[0])
    assert first["message"]["content"] == f"survey {CRAFTED}"


def test_text_output_neutralises_bidi_overrides(url: str) -> None:
    assert cli("steer", "--create", "--store", url, "s", CRAFTED)[0] == 0
    for command in ("show", "log"):
        status, text = cli(command, "--store", url, "s")
        assert status == 0
        assert not any(c in text for c in RAW_CONTROLS), repr(text)
        assert "pay \\u202eexe.txt\\u202c now" in text


def test_an_error_quoting_a_crafted_log_prints_its_controls_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "log.jsonl"
    url = f"file:{path}"
    assert cli("steer", "--create", "--store", url, "s", "one")[0] == 0
    header, record = path.read_text().splitlines()
    crafted = json.dumps({"stream": "s", "event": {"type": "\x1b]0;pwned\x07\x9b2J\u202eevil"}})
    path.write_text("\n".join([header, crafted, record]) + "\n")
    status, _ = cli("show", "--store", url, "s")
    err = capsys.readouterr().err
    assert status == 1, err
    assert not any(c in err for c in RAW_CONTROLS), repr(err)
    assert "\\x1b]0;pwned\\x07" in err and err.count("\n") == 1


def test_a_bad_session_name_is_a_usage_error_shown_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("NOUS_INBOX_STORE", f"sqlite:{tmp_path / 'untouched.sqlite'}")
    assert cli("show", "evil\x1b[2J\u202e")[0] == 2
    err = capsys.readouterr().err
    assert "control character" in err and "\x1b" not in err and "\u202e" not in err
    assert cli("steer", "", "text")[0] == 2
    assert "SESSION must not be empty" in capsys.readouterr().err
    assert not (tmp_path / "untouched.sqlite").exists()


def test_an_explicitly_empty_store_is_a_usage_error_not_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    default = tmp_path / "default.sqlite"
    monkeypatch.setenv("NOUS_INBOX_STORE", f"sqlite:{default}")
    assert cli("steer", "--store", "", "s", "text")[0] == 2
    assert "--store is empty" in capsys.readouterr().err
    assert not default.exists()


def _steers_the_terminal(c: str) -> bool:
    import unicodedata

    return unicodedata.category(c) == "Cc" or 0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069


@given(st.text())
def test_printable_and_one_line_leave_nothing_a_terminal_obeys(text: str) -> None:
    from nous_inbox.cli.terminal import one_line, printable

    for shown in (printable(text), one_line(text)):
        assert not any(_steers_the_terminal(c) for c in shown)


@given(st.recursive(st.none() | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_json_safe_output_decodes_to_the_same_value_and_has_no_raw_controls(value: object) -> None:
    from nous_inbox.safe_json import json_safe

    document = json_safe(json.dumps(value, ensure_ascii=False))
    assert json.loads(document) == value
    assert not any(_steers_the_terminal(c) or c in "\u2028\u2029" for c in document)


def test_sessions_escapes_what_a_terminal_would_obey_in_a_session_name(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    with open_store(url) as store:
        store.append("evil\u202egnp.exe", [Warned(text="x")])
    status, text = cli("sessions", "--store", url)
    assert status == 0
    assert "\u202e" not in text and "evil\\u202egnp.exe\t1 events" in text


@pytest.mark.parametrize("store", ["file:", "sqlite:", "file:  "])
def test_a_store_url_without_a_path_is_a_usage_error(
    store: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli("steer", "--store", store, "s", "text")[0] == 2
    assert "has no path" in capsys.readouterr().err


def test_a_session_name_or_text_that_is_not_utf8_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    bad = b"caf\xe9".decode("utf-8", "surrogateescape")  # what argv holds for a Latin-1 byte
    assert cli("steer", "--store", url, bad, "text")[0] == 2
    assert "no UTF-8 form" in capsys.readouterr().err
    assert cli("steer", "--store", url, "s", bad)[0] == 2
    assert "TEXT is not valid UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "inbox.sqlite").exists()
