"""A host's own port, as a run uses it: each claim guarded, each record made through the port.

A port that is not a journal (or a journal's whose ``claim`` or ``record`` a host rewrote: a
source of its own) is called member by member: a boundary records the loop's events with
``record`` and makes each claim the loop asks for with ``claim``. A claim that raises or answers
in the wrong shape is met by :class:`ClaimGuard`, which every driver claims through: logged,
recorded as ``Warned``, and the run goes on without it (ruling 7). :func:`guarded_boundary` is
that boundary for the runner; a journal's port makes the same walk in one append
(:meth:`JournalPort.boundary <nous_inbox.runner.port.JournalPort.boundary>`).
:func:`describe_error` words a failure so the log can hold it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from nous_inbox.commands import Claim
from nous_inbox.errors import HandedOverError, LeaseLostError
from nous_inbox.events import Event, QueueClaimed, Warned
from nous_inbox.happenings import ClaimAnswered
from nous_inbox.loop import Advance, advance
from nous_inbox.message import Message
from nous_inbox.runner.port import SessionPort
from nous_inbox.runner.walk import Ended, finish
from nous_inbox.verbs import Target

__all__ = ["Boundary", "ClaimGuard", "describe_error", "guarded_boundary"]

logger: Final = logging.getLogger("nous_inbox.runner.port")

Boundary = Callable[[Advance, "Ended | None"], tuple[list[Event], Advance]]
"""A run's boundary on a port: records ``adv``'s events and makes the claims the loop asks for;
the events as recorded and where the loop stands after."""


def guarded_boundary(port: SessionPort, guard: ClaimGuard) -> Boundary:
    """The boundary over a host's own ``port``: its events with ``record``, each claim through
    ``guard``, and the events the loop answers a claim with, recorded next."""

    def boundary(adv: Advance, ended: Ended | None) -> tuple[list[Event], Advance]:
        recorded: list[Event] = []
        if adv.events:
            recorded += port.record(finish(adv.events, adv.state, ended))
        while type(adv.command) is Claim:
            asked: Claim = adv.command
            messages, claimed = guard.claim(asked.target, wake_only=asked.wake_only)
            recorded += claimed
            adv = advance(adv.state, ClaimAnswered(asked.target, messages))
            if adv.events:
                recorded += port.record(finish(adv.events, adv.state, ended))
        return recorded, adv

    return boundary


class ClaimGuard:
    """A port's claim as a run makes it, guarded (ruling 7): a claim that raises or answers in
    the wrong shape is logged, recorded as ``Warned``, and not asked again for the rest of the
    turn, which goes on without it. One per turn; every driver (the runner, the adapters)
    claims through one, so a host's own port fails the same way under each.

    ``claim`` returns the messages claimed and the events recorded: the port's ``QueueClaimed``,
    or the ``Warned`` saying the source failed (kept as ``warning``), or nothing.

    >>> from nous_inbox.runner.port import LocalSession
    >>> class Broken(LocalSession):
    ...     def claim(self, target, *, wake_only=False):
    ...         raise OSError("disk on fire")
    >>> guard = ClaimGuard(Broken())
    >>> messages, events = guard.claim(Target.NEXT_TURN)
    >>> messages, events == [guard.warning]
    ((), True)
    >>> print(guard.warning.text)
    message source failed: Broken.claim(next_turn) raised OSError: disk on fire; the run goes on without it for this turn
    >>> guard.claim(Target.NEXT_STEP)  # not asked again this turn
    ((), [])
    """

    __slots__ = ("port", "warning")

    def __init__(self, port: SessionPort) -> None:
        self.port = port
        self.warning: Event | None = None

    def claim(self, target: Target, *, wake_only: bool = False) -> tuple[Sequence[Message], list[Event]]:
        """Claim ``target`` from the port, unless it failed earlier this turn."""
        if self.warning is not None:
            return (), []
        port = self.port
        try:
            # Whether a waking message extends the run is the core's decision, made inside the
            # port's atomic claim: a driver only says which claim the loop asked for.
            result = port.claim(target, wake_only=True) if wake_only else port.claim(target)
        except (HandedOverError, LeaseLostError):
            raise  # the owner's, not the source's: the run stops where it is
        except Exception as exc:
            logger.warning("message source %s failed", type(port).__name__, exc_info=True)
            return self._fail(f"claim({target}) raised {describe_error(exc)}")
        problem = _claim_shape_problem(result, target)
        if problem:
            return self._fail(f"claim({target}) {problem}")
        messages, claimed = result
        return messages, ([claimed] if claimed is not None else [])

    def _fail(self, problem: str) -> tuple[Sequence[Message], list[Event]]:
        """Stop asking, and say so: a log line and a recorded ``Warned``."""
        text = (f"message source failed: {type(self.port).__name__}.{problem}; the run goes on "
                "without it for this turn")
        logger.warning(text)
        (self.warning,) = self.port.record([Warned(text=text)])
        return (), [self.warning]


def _claim_shape_problem(result: object, target: Target) -> str | None:
    expected = "expected (messages, QueueClaimed | None)"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        if isinstance(result, str):
            return f"returned the str {result[:40]!r}, {expected} (a str is not iterated)"
        return f"returned {type(result).__name__}, {expected}"
    messages, event = result
    # A tuple (what a journal's claim answers) is a sequence: the general test only for others.
    if type(messages) is not tuple and (
            isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence)):
        return f"returned messages of type {type(messages).__name__}, {expected}"
    for i, message in enumerate(messages):
        if not isinstance(message, Message):
            return f"returned messages[{i}] of type {type(message).__name__}, not a Message"
    if event is None:
        if messages:
            return f"returned {len(messages)} message(s) but no QueueClaimed: the claim was not recorded"
        return None
    if not isinstance(event, QueueClaimed) or event.target != target or event.count != len(messages):
        return f"returned {event!r} for {len(messages)} message(s) claimed from {target}"
    return None


_MAX_DESCRIBED: Final = 4000
"""The most characters of an exception's message the log keeps (the exception itself, raised to
the consumer, keeps it all)."""


def describe_error(exc: BaseException) -> str:
    """An exception as one line of text the log can hold, whatever its message: a message with
    a lone surrogate (a name ``os.listdir`` returned) is escaped, a long one (a whole payload
    in a ``ValueError``) is cut short, and one whose ``__str__`` raises is said to be so. Else
    the event recording the failure would itself fail, and a turn end go unrecorded.

    >>> print(describe_error(ValueError("caf" + chr(0xDCE9))))
    ValueError: caf\\udce9
    """
    try:
        message = str(exc)
    except Exception:
        message = "(its message cannot be printed)"
    text = f"{type(exc).__name__}: {message}"
    if len(text) > _MAX_DESCRIBED:
        text = f"{text[:_MAX_DESCRIBED]}... ({len(text) - _MAX_DESCRIBED} more characters)"
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
