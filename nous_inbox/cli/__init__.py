"""The ``nous-inbox`` command (also ``python -m nous_inbox``); see ``nous_inbox.cli.main``."""

from nous_inbox.cli.main import main

__all__ = ["main"]
