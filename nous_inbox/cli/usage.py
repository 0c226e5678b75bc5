"""UsageError: a command line that does not say something runnable (exit status 2).

It lives apart from ``nous_inbox.cli.main`` (which catches it) and ``nous_inbox.cli.commands``
(which raises it), so that neither module has to import the other: the dependency goes one way,
``main`` -> ``commands`` -> ``usage``.

>>> raise UsageError("TEXT is empty")
Traceback (most recent call last):
...
nous_inbox.cli.usage.UsageError: TEXT is empty
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """A command line that does not say something runnable: ``main`` exits with status 2.

    Raised for what argparse cannot check alone (an empty ``--store``, a session name a store
    refuses, a number out of range), so every usage mistake ends the same way: one line on
    stderr and status 2, never the data-error status 1.
    """
