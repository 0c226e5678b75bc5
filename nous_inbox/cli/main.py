"""``nous-inbox``: talk to an agent's inbox from a terminal.

Commands (``nous-inbox COMMAND --help`` for each one's arguments)::

    nous-inbox demo                      a live, scripted agent session, steered while it works
    nous-inbox tour                      a walkthrough of the inbox value's semantics
    nous-inbox run SESSION               run the scripted agent on SESSION (steer it from elsewhere)
    nous-inbox steer|inject|followup|prompt SESSION TEXT|-|--file PATH [--create]
    nous-inbox show SESSION [--json]     the replayed inbox
    nous-inbox log SESSION [--json] [--after SEQ] [--follow] [--limit N]
    nous-inbox sessions [--json]         the sessions in the store
    nous-inbox snapshot SESSION          save a snapshot, so opening SESSION replays less
    nous-inbox cancel SESSION            end SESSION's open turn, wherever its owner runs
    nous-inbox rm SESSION [--yes]        delete a session no owner holds
    nous-inbox serve --agent MOD:FACTORY host the store's sessions on the web (the web extra)

``serve`` is the web face's (:mod:`nous_inbox.web.serve`): the ``nous-inbox`` launcher
(``nous_inbox.__main__``) adds it as an :class:`~nous_inbox.cli.parser.Extra`, so the command line
and the web face import nothing of each other.

Every command takes ``--store URL``. The parser lives in ``nous_inbox.cli.parser``, the
commands in ``nous_inbox.cli.commands``.

Exit status: 0 on success, 2 for a usage error (including an empty ``--store`` and a session
name a store refuses), 1 for a data error (a bad log, an unknown store). Errors are one line on
stderr, with any control or bidi character from a log or an argument shown escaped (see
``nous_inbox.cli.terminal``), never a traceback: argparse's usage errors too, and
warnings the library logs while a command runs (``_OneLine``; a failing tool, say). Without
``--store`` the default store is an SQLite file (see ``nous_inbox.store.default_store_url``; the
environment variable ``NOUS_INBOX_STORE`` overrides it).

>>> import io, contextlib
>>> err = io.StringIO()
>>> with contextlib.redirect_stderr(err):
...     main(["show"])
2
>>> print(err.getvalue(), end="")
nous-inbox show: the following arguments are required: SESSION (see nous-inbox show --help)

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
from typing import IO

from nous_inbox.cli.parser import Extra, build_parser
from nous_inbox.cli.pipe import quiet_broken_pipe
from nous_inbox.cli.terminal import one_line
from nous_inbox.cli.usage import UsageError

__all__ = ["main"]


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


def _check_usage(args: argparse.Namespace) -> None:
    """Refuse, as usage errors, the arguments only the library can judge.

    An explicitly empty ``--store ""`` would otherwise fall back to the default store (a
    script's unset variable must not write somewhere else); a session name a store refuses
    (empty, a control character, a byte that is not UTF-8) is a mistake on the command line,
    not a data error; so is ``--store file:`` without a path.
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
    session = getattr(args, "session", None)
    if session is not None:
        from nous_inbox.store.base import check_stream

        try:
            check_stream(session)
        except ValueError as exc:
            raise UsageError(str(exc).replace("stream name", "SESSION", 1)) from None


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None,
         extra: Sequence[Extra] = ()) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``), with the ``extra`` commands
    beside the command line's own; returns the exit status."""
    out = sys.stdout if out is None else out
    parser = build_parser(extra)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # _Parser has printed its one-line error, or --help its help
        return exc.code if isinstance(exc.code, int) else 2
    from nous_inbox.cli import commands  # imported late: `--help` stays instant

    try:
        _check_usage(args)
        with _cli_logging():
            handler: Callable[[argparse.Namespace, IO[str]], int] = (
                args.handler if callable(args.handler) else getattr(commands, args.handler))
            return handler(args, out)
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
    except (ValueError, LookupError, OSError, RuntimeError, TypeError, sqlite3.Error) as exc:
        sys.stderr.write(f"nous-inbox {args.command}: {one_line(str(exc))}\n")
        return 1
