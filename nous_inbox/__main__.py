"""The ``nous-inbox`` command (also ``python -m nous_inbox``): the command line's own commands and
the web face's ``serve``, composed here so neither of the two imports the other.

The web face's parser is argparse alone; Starlette and Uvicorn load only when ``serve`` runs, so
the command works without the web extra installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from nous_inbox.cli.main import main as run_command_line
from nous_inbox.cli.parser import Extra
from nous_inbox.web.serve import add_parser, serve

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run ``nous-inbox argv`` (default ``sys.argv[1:]``); returns the exit status."""
    return run_command_line(argv, out, extra=(Extra(add_parser, serve),))


if __name__ == "__main__":
    raise SystemExit(main())
