"""The ``nous-inbox`` argument parser: one small function per command, each listed in ``COMMANDS``.

A command is two functions: one here that declares its arguments (every one with a help text) and
names its handler, and the handler in ``nous_inbox.cli.commands`` that runs it. Adding a command
is adding those two and one entry to ``COMMANDS``; nothing else changes. The send commands are the
core's verb table (:mod:`nous_inbox.verbs`), one command a verb; beyond that table, loaded with the
package anyway, the parser imports none of the library, so ``nous-inbox --help`` stays instant.

>>> args = build_parser().parse_args(["steer", "incident-7", "-"])
>>> args.handler, args.session, args.text, args.create
('send', 'incident-7', '-', False)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any, Final, NamedTuple, NoReturn, TypeAlias

from nous_inbox.cli.terminal import one_line
from nous_inbox.verbs import VERBS, Verb

__all__ = ["COMMANDS", "Extra", "build_parser"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr, then exit status 2.

    argparse's own ``error`` prints the whole usage block first; a person reads the one line
    and asks ``--help`` for the rest, and a script gets one line to log.
    """

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")
        raise SystemExit(2)


_Sub: TypeAlias = "argparse._SubParsersAction[_Parser]"


def _store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", metavar="URL", default=None,
        help="memory:, file:PATH, sqlite:PATH, postgresql://... or a path "
             "(default: $NOUS_INBOX_STORE or the embedded SQLite file)",
    )


def _session(parser: argparse.ArgumentParser, what: str = "the session's name") -> None:
    parser.add_argument("session", metavar="SESSION", help=what)


def _json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=what)


def _command(sub: _Sub, name: str, text: str, handler: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=text, description=text)
    parser.set_defaults(handler=handler)
    return parser


def _demo(sub: _Sub) -> None:
    demo = _command(sub, "demo", "a live scripted agent session, steered while it works", "demo")
    _store(demo)
    demo.add_argument("--step-seconds", type=float, default=0.4, metavar="SECONDS",
                      help="how long each tool takes (default 0.4)")
    _json(demo, "print one JSON event per line (the store's place goes to stderr)")


def _tour(sub: _Sub) -> None:
    _command(sub, "tour", "a walkthrough of the inbox value's semantics", "tour")


def _run(sub: _Sub) -> None:
    run = _command(sub, "run", "run the scripted agent on SESSION; steer it from another terminal",
                   "run")
    _store(run)
    _session(run, "the session to run; a new name starts a new session")
    run.add_argument("--steps", type=int, default=5, metavar="N",
                     help="tool steps the scripted task takes (default 5)")
    run.add_argument("--step-seconds", type=float, default=0.5, metavar="SECONDS",
                     help="seconds each tool takes (default 0.5)")
    _json(run, "print one JSON event per line")
    run.add_argument("--task", default="survey the staging logs",
                     help="the prompt that starts the run (default: %(default)r)")


def _send_help(verb: Verb) -> str:
    """What a send command does, from its verb: ``prompt`` is stored as a followup (a send has
    one form in the log).

    >>> _send_help(VERBS["inject"])
    '"have this to hand if you make another request"; wakes nothing'
    """
    wakes = "wakes an idle agent" if verb.wakeup else "wakes nothing"
    stored = " (stored as a followup)" if verb.own_turn else ""
    return f'"{verb.meaning}"; {wakes}{stored}'


def _sends(sub: _Sub) -> None:
    for verb in VERBS.values():
        send = _command(sub, verb.name, _send_help(verb), "send")
        _store(send)
        _session(send, "the session to send to; it must have events, unless --create")
        send.add_argument("text", metavar="TEXT", nargs="?", default=None,
                          help="the message; - reads it from stdin")
        send.add_argument("--file", metavar="PATH", default=None,
                          help="read the message from PATH instead of TEXT")
        send.add_argument("--create", action="store_true",
                          help="send even if SESSION has no events yet (it starts its log)")
        send.add_argument("--wait", action="store_true",
                          help="wait until a run claims the message (or it is withdrawn) and "
                               "say which turn and step took it")
        send.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                          help="with --wait: give up after SECONDS (the message stays queued)")


def _show(sub: _Sub) -> None:
    show = _command(sub, "show", "the replayed inbox of SESSION", "show")
    _store(show)
    _session(show)
    _json(show, "print one JSON document: both queues, wants_wake, transcript_length, version")


def _log(sub: _Sub) -> None:
    log = _command(sub, "log", "the events of SESSION, one per line", "log")
    _store(log)
    _session(log)
    _json(log, "print one JSON event per line (JSON Lines)")
    log.add_argument("--after", type=int, default=0, metavar="SEQ",
                     help="only the events after event #SEQ (default 0: all)")
    log.add_argument("--follow", "-f", action="store_true",
                     help="keep printing new events as they are recorded, until Ctrl-C")
    log.add_argument("--limit", type=int, default=None, metavar="N",
                     help="stop after N events (with --follow too)")


def _sessions(sub: _Sub) -> None:
    sessions = _command(sub, "sessions", "the sessions in the store, with their event counts",
                        "sessions")
    _store(sessions)
    _json(sessions, 'print one JSON object per line: {"session": NAME, "events": N}')


def _snapshot(sub: _Sub) -> None:
    snapshot = _command(sub, "snapshot", "save a snapshot of SESSION, so opening it replays less",
                        "snapshot")
    _store(snapshot)
    _session(snapshot)


def _cancel(sub: _Sub) -> None:
    cancel = _command(sub, "cancel", "end SESSION's open turn at its next boundary, wherever it "
                      "runs; wakes nothing", "cancel")
    _store(cancel)
    _session(cancel, "the session whose turn to cancel")


def _withdraw(sub: _Sub) -> None:
    withdraw = _command(sub, "withdraw", "take back a message no run has claimed yet, by the "
                        "event # its send was queued as; one already claimed says where it went",
                        "withdraw")
    _store(withdraw)
    _session(withdraw, "the session the message was sent to")
    withdraw.add_argument("seq", metavar="SEQ", type=int,
                          help="the event # the send was queued as (what the send printed)")
    _json(withdraw, "print the receipt as one JSON object")


def _rm(sub: _Sub) -> None:
    rm = _command(sub, "rm", "delete SESSION and its log (refused while an owner holds it)", "rm")
    _store(rm)
    _session(rm, "the session to delete")
    rm.add_argument("--yes", "-y", action="store_true",
                    help="delete without asking (required when stdin is not a terminal)")


class Extra(NamedTuple):
    """A command the command line does not hold itself, added by whoever composes it (the
    ``nous-inbox`` launcher adds the web face's ``serve``), so the command line imports no layer
    beside it.

    ``add_parser(commands)`` adds the command's parser to ``commands`` (an ``add_subparsers``
    result) and returns it; ``run(args, out)`` runs it and answers the exit status.
    """

    add_parser: Callable[[Any], argparse.ArgumentParser]
    run: Callable[[argparse.Namespace, IO[str]], int]


#: Every command, in the order ``--help`` lists them.
COMMANDS: Final[tuple[Callable[[_Sub], None], ...]] = (
    _demo, _tour, _run, _sends, _show, _log, _sessions, _snapshot, _cancel, _withdraw, _rm,
)


def _version() -> str:
    from nous_inbox import __version__  # the package face, read only when asked

    return __version__


def build_parser(extra: Sequence[Extra] = ()) -> argparse.ArgumentParser:
    """The ``nous-inbox`` parser; each parsed command carries ``handler``: its function's name in
    ``nous_inbox.cli.commands``, or an ``extra`` command's ``run``."""
    parser = _Parser(
        prog="nous-inbox",
        description="Talk to an AI agent while it is working: an inbox a run claims at its next step.",
    )
    parser.add_argument("--version", action="version", version=f"nous-inbox {_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser,
                                help="what to do (nous-inbox COMMAND --help for its arguments)")
    sub.required = True
    for add in COMMANDS:
        add(sub)
    for command in extra:
        command.add_parser(sub).set_defaults(handler=command.run)
    return parser
