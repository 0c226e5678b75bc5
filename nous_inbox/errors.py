"""The errors the library raises on purpose, each a subclass of a built-in a caller already catches.

Every error names the problem and the place: the file and line or byte offset of a bad record, the
stream and sequence number of an event, the path inside a message. None leaves state changed.

>>> issubclass(StoreError, OSError), issubclass(StreamOwnedError, ConcurrencyError)
(True, True)
"""

from __future__ import annotations

import uuid

__all__ = [
    "ConcurrencyError",
    "DecodeError",
    "HandedOverError",
    "LeaseLostError",
    "OutcomeUnknownError",
    "RecordTooLargeError",
    "ReplayError",
    "StoreError",
    "StreamOwnedError",
    "UnexpectedHappeningError",
]


class DecodeError(ValueError):
    """Bytes that are not a valid inbox, event or log record; the message says what and where."""


class RecordTooLargeError(DecodeError):
    """A record above the configured size limit (16 MiB by default), refused rather than read."""


class ReplayError(ValueError):
    """An event stream that cannot be folded: a gap in sequence numbers, or a claim that does
    not match the queue it claims. The message names the stream position."""


class UnexpectedHappeningError(ValueError):
    """A driver told the turn loop something its current phase does not take: a model reply
    while it waits for a claim, a claim of the wrong queue, anything after the turn ended.

    The loop's state is unchanged; the fault is the driver's, so it is raised rather than
    smoothed over. ``phase`` is the loop's phase (its value, e.g. ``"model"``) and
    ``happening`` the object it was handed.
    """

    def __init__(self, message: str, *, phase: str, happening: object) -> None:
        super().__init__(message)
        self.phase = phase
        self.happening = happening


class ConcurrencyError(RuntimeError):
    """An append whose expected version no longer matches the stream; nothing was written."""


class StreamOwnedError(ConcurrencyError):
    """A stream that another owner holds: one session has one owner at a time, across processes.

    ``stream`` is the stream's name and ``pid`` the holder's process id when it is known.
    """

    def __init__(self, message: str, *, stream: str = "", pid: int | None = None) -> None:
        super().__init__(message)
        self.stream = stream
        self.pid = pid


class HandedOverError(RuntimeError):
    """Raised inside a run whose owner let its session go at a boundary (a rolling restart's
    hand-over): the run stops there and records nothing more; the open turn is the next holder's
    to carry on. Like :class:`LeaseLostError`, never a message source's failure: every driver lets
    it through."""


class LeaseLostError(RuntimeError):
    """An owner whose lease on a stream expired and was taken over by another owner.

    A store whose leases expire (PostgreSQL: a host that stopped renewing is presumed dead) fences
    every append of the old owner: it writes nothing and raises this. Deliberately not a
    :class:`ConcurrencyError`: reading what the new owner wrote and trying again would run the
    session twice, so nothing retries it; the old owner must stop. ``stream`` names the stream
    and ``epoch`` the lost lease's fencing token.
    """

    def __init__(self, message: str, *, stream: str = "", epoch: int = 0) -> None:
        super().__init__(message)
        self.stream = stream
        self.epoch = epoch


class StoreError(OSError):
    """A store that cannot be opened or used: missing, a directory, not a store at all, or a
    database that failed underneath. The message names the store's path and what failed."""


class OutcomeUnknownError(StoreError):
    """An append whose outcome the store could not learn: it may or may not have been written.

    A store that loses its server during an append reconnects and looks the append up before it
    answers; this is raised only when it could not look in time. Retry with the same identity
    and the append is written once, whichever way it went::

        try:
            store.append(stream, events, identity=identity)
        except OutcomeUnknownError as exc:
            store.append(stream, events, identity=exc.identity)

    ``stream`` names the stream; ``identity`` is the append's (the caller's, or the one the
    store gave it). Every other ``StoreError`` of an append means nothing was written.
    """

    def __init__(self, message: str, *, stream: str = "",
                 identity: uuid.UUID | str | None = None) -> None:
        super().__init__(message)
        self.stream = stream
        self.identity = identity
