"""``nous-inbox``: talk to an agent's inbox from a terminal.

Commands::

    nous-inbox demo                                   a live, scripted agent session, steered while it works
    nous-inbox tour                                   a walkthrough of the inbox value's semantics
    nous-inbox run [--store URL] SESSION [--json]     run the scripted agent on SESSION (steer it from elsewhere)
    nous-inbox steer|inject|followup [--store URL] SESSION TEXT
    nous-inbox show [--store URL] SESSION [--json]    the replayed inbox
    nous-inbox log [--store URL] SESSION [--json]     the events, one per line
    nous-inbox sessions [--store URL]

Exit status: 0 on success, 2 for a usage error (including an empty ``--store`` and a session
name a store refuses), 1 for a data error (a bad log, an unknown store). Errors are one line on
stderr, with any control or bidi character from a log or an argument shown escaped (see
``nous_inbox.cli.terminal``), never a traceback: argparse's usage errors too (``_Parser``), and
warnings the library logs while a command runs (``_OneLine``; a failing tool, say). Without
``--store`` the default store is an SQLite file (see ``nous_inbox.store.default_store_url``; the
environment variable ``NOUS_INBOX_STORE`` overrides it).

>>> import io, contextlib
>>> err = io.StringIO()
>>> with contextlib.redirect_stderr(err):
...     main(["show"])
2
>>> print(err.getvalue(), end="")
nous-inbox show: the following arguments are required: session (see nous-inbox show --help)

Output that goes to a pipe which closes early (``nous-inbox log s | head -3``) ends the command
quietly with status 0, the way SIGPIPE ends a C tool: see ``nous_inbox.cli.pipe``.
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, NoReturn

from nous_inbox.cli.pipe import quiet_broken_pipe
from nous_inbox.cli.terminal import one_line
from nous_inbox.cli.usage import UsageError

__all__ = ["UsageError", "main"]

class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr, then exit status 2.

    argparse's own ``error`` prints the whole usage block first; a person reads the one line
    and asks ``--help`` for the rest, and a script gets one line to log.
    """

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")
        raise SystemExit(2)


class _OneLine(logging.Formatter):
    """Formats a log record as ``nous-inbox: warning: <message>`` on one line, no traceback.

    The library logs what it survives (a tool that raised, a listener that failed) with the
    exception attached, for programs that want it; on a terminal the exception's name and text
    are enough, and a traceback per event would bury the output.
    """

    def formatException(self, ei: object) -> str:
        return ""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text += f" ({type(exc).__name__}: {exc})"
        return f"nous-inbox: {record.levelname.lower()}: {one_line(text)}"


@contextmanager
def _cli_logging() -> Iterator[None]:
    """Route warnings to stderr as one line each for the length of a command, then undo it.

    Scoped to the call rather than set once, so ``main()`` called in-process (tests, a host
    program) leaves the caller's logging as it found it.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_OneLine())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="memory:, file:PATH, sqlite:PATH, postgresql://... or a path (default: $NOUS_INBOX_STORE or the embedded SQLite file)",
    )


def _version() -> str:
    from nous_inbox import __version__  # the package face, read only when asked

    return __version__


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="nous-inbox",
        description="Talk to an AI agent while it is working: an inbox a run claims at its next step.",
    )
    parser.add_argument("--version", action="version", version=f"nous-inbox {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    demo = sub.add_parser("demo", help="a live scripted agent session, steered while it works")
    _store_option(demo)
    demo.add_argument("--step-seconds", type=float, default=0.4, help="how long each tool takes")
    demo.add_argument("--json", action="store_true", help="print one JSON event per line")

    sub.add_parser("tour", help="a walkthrough of the inbox value's semantics")

    run = sub.add_parser("run", help="run the scripted agent on SESSION; steer it from another terminal")
    _store_option(run)
    run.add_argument("session")
    run.add_argument("--steps", type=int, default=5, help="tool steps the scripted task takes (default 5)")
    run.add_argument("--step-seconds", type=float, default=0.5, help="seconds each tool takes (default 0.5)")
    run.add_argument("--json", action="store_true", help="print one JSON event per line")
    run.add_argument("--task", default="survey the staging logs", help="the prompt that starts the run")

    for mode, text in (
        ("steer", "read before the agent's next model request; wakes an idle agent"),
        ("inject", "have to hand at the next request; wakes nothing"),
        ("followup", "answer after the current turn; wakes an idle agent"),
    ):
        send = sub.add_parser(mode, help=text)
        _store_option(send)
        send.add_argument("session")
        send.add_argument("text")

    show = sub.add_parser("show", help="the replayed inbox of SESSION")
    _store_option(show)
    show.add_argument("session")
    show.add_argument("--json", action="store_true")

    log = sub.add_parser("log", help="the events of SESSION, one per line")
    _store_option(log)
    log.add_argument("session")
    log.add_argument("--json", action="store_true")

    sessions = sub.add_parser("sessions", help="the sessions in the store")
    _store_option(sessions)

    snapshot = sub.add_parser("snapshot", help="save a snapshot of SESSION, so opening it replays less")
    _store_option(snapshot)
    snapshot.add_argument("session")

    from nous_inbox.web.serve import add_parser as add_serve  # no web import until it runs

    add_serve(sub)
    return parser


def _check_usage(args: argparse.Namespace) -> None:
    """Refuse, as usage errors, the arguments only the library can judge.

    An explicitly empty ``--store ""`` would otherwise fall back to the default store (a
    script's unset variable must not write somewhere else); a session name a store refuses
    (empty, a control character, a byte that is not UTF-8) is a mistake on the command line,
    not a data error; so are ``--store file:`` without a path and a TEXT that is not UTF-8.
    """
    store = getattr(args, "store", None)
    if store is not None and not store.strip():
        raise UsageError(
            "--store is empty: give a store URL (memory:, file:PATH, sqlite:PATH or a path), "
            "or leave --store out for the default store"
        )
    if store is not None:
        scheme, colon, rest = store.partition(":")
        if colon and scheme in ("file", "sqlite") and not rest.strip():
            raise UsageError(f"--store {store} has no path: give {scheme}:PATH")
    text = getattr(args, "text", None)
    if isinstance(text, str) and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UsageError(
                f"TEXT is not valid UTF-8 (a byte that decodes to nothing, at character "
                f"{exc.start}); no store can keep it"
            ) from None
    session = getattr(args, "session", None)
    if session is not None:
        from nous_inbox.store.base import check_stream

        try:
            check_stream(session)
        except ValueError as exc:
            raise UsageError(str(exc).replace("stream name", "SESSION", 1)) from None


def _serve(args: argparse.Namespace, out: IO[str]) -> int:
    from nous_inbox.web.serve import serve

    return serve(args, out)


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    out = sys.stdout if out is None else out
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # _Parser has printed its one-line error, or --help its help
        return exc.code if isinstance(exc.code, int) else 2
    from nous_inbox.cli import commands  # imported late: `--help` stays instant

    handlers: dict[str, Callable[[argparse.Namespace, IO[str]], int]] = {
        "demo": commands.demo,
        "tour": commands.tour,
        "run": commands.run,
        "steer": commands.send,
        "inject": commands.send,
        "followup": commands.send,
        "show": commands.show,
        "log": commands.log,
        "sessions": commands.sessions,
        "snapshot": commands.snapshot,
        "serve": _serve,
    }
    try:
        _check_usage(args)
        with _cli_logging():
            return handlers[args.command](args, out)
    except UsageError as exc:
        sys.stderr.write(f"nous-inbox {args.command}: {one_line(str(exc))}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("nous-inbox: interrupted\n")
        return 130
    except BrokenPipeError:
        quiet_broken_pipe(out)  # the reader left: nothing to say, and nowhere to say it
        return 0
    # sqlite3.Error is not an OSError; listed so a store the engine refuses is one line, too.
    except (ValueError, OSError, RuntimeError, TypeError, sqlite3.Error) as exc:
        sys.stderr.write(f"nous-inbox {args.command}: {one_line(str(exc))}\n")
        return 1
