"""The ``nous-inbox`` command line's own commands; the command itself is ``nous_inbox.__main__``
(also ``python -m nous_inbox``), which adds the web face's ``serve``."""

from nous_inbox.cli.main import main

__all__ = ["main"]
