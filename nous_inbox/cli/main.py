"""``nous-inbox``: talk to an agent's inbox from a terminal.

Commands::

    nous-inbox demo                                   a live, scripted agent session, steered while it works
    nous-inbox tour                                   a walkthrough of the inbox value's semantics
    nous-inbox run [--store URL] SESSION [--json]     run the scripted agent on SESSION (steer it from elsewhere)
    nous-inbox steer|inject|followup [--store URL] SESSION TEXT
    nous-inbox show [--store URL] SESSION [--json]    the replayed inbox
    nous-inbox log [--store URL] SESSION [--json]     the events, one per line
    nous-inbox sessions [--store URL]

Exit status: 0 on success, 2 for a usage error, 1 for a data error (a bad log, an unknown store).
Errors are one line on stderr, never a traceback. Without ``--store`` the default store is an SQLite
file (see ``nous_inbox.store.default_store_url``; the environment variable ``NOUS_INBOX_STORE``
overrides it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import IO

__all__ = ["main"]


class UsageError(Exception):
    """A command line that does not say something runnable: exit status 2."""


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="memory:, file:PATH, sqlite:PATH or a path (default: $NOUS_INBOX_STORE or the embedded SQLite file)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nous-inbox",
        description="Talk to an AI agent while it is working: an inbox a run claims at its next step.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
    return parser


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    out = sys.stdout if out is None else out
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has already printed its one-line usage error
        return int(exc.code or 0)
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
    }
    try:
        return handlers[args.command](args, out)
    except UsageError as exc:
        sys.stderr.write(f"nous-inbox {args.command}: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("nous-inbox: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except (ValueError, OSError, RuntimeError, TypeError) as exc:
        sys.stderr.write(f"nous-inbox {args.command}: {exc}\n")
        return 1
