"""Boundaries: an owner tells the floors above when a run reaches one, before it claims there.

A floor that holds messages for an agent (the mailbox, first) wants them read at the run's next
boundary, not at the next send that happens to come by. So an owner tells its subscribers, in
order, each time its run reaches a boundary, *before* the claim the boundary makes (which claim
that is, is the loop's table, :data:`nous_inbox.commands.CLAIMS`):

* ``"turn_opening"``: a turn opened and is about to claim ``next_turn`` (ruling 1);
* ``"step"``: a step boundary, about to claim ``next_step`` right before a model request the run
  makes anyway (ruling 1; after a blank reply too, ruling 3);
* ``"stop"``: where the run would otherwise stop (a would-be final answer, a spent budget), about
  to claim ``next_step`` only for a waking message worth a round (ruling 2): what goes in there
  without a wake waits for a later claim;
* ``"turn_ended"``: the turn's closing event is stored (the owner asks next whether to open
  another turn).

A subscriber is told on the thread that makes the claim, holding the owner's lock: an
``Owner``'s run thread; an ``AsyncOwner``'s event loop, or its store worker thread when the
store blocks (so a subscriber never awaits, nor touches the loop's objects directly). It may send
from inside its callback with the owner's own verbs (``steer``, ``inject``, ``followup``): the
send commits at once, on that thread, so it is in the claim that follows (a followup sent at
``"turn_ended"`` opens the next turn). An ``AsyncOwner``'s verb called there has done its work
when it returns: the awaitable it returns need not be awaited. A subscriber that raises is
logged (the ``nous_inbox`` logger) and the run goes on. A single-shot run (ruling 8) claims
nothing, so it tells no boundary but its ``"turn_ended"``.

>>> seen = []
>>> boundaries = Boundaries("s")
>>> unsubscribe = boundaries.subscribe(seen.append)
>>> boundaries.tell("stop", 3)
>>> seen
[Boundary(kind='stop', stream='s', turn=3)]
>>> unsubscribe()
>>> boundaries.tell("turn_ended", 3)
>>> len(seen)
1
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final, Literal, get_args

import attrs

from nous_inbox.events import Event, TurnEnded

__all__ = ["Boundaries", "Boundary", "BoundaryKind"]

logger: Final = logging.getLogger("nous_inbox")

BoundaryKind = Literal["turn_opening", "step", "stop", "turn_ended"]
"""Which boundary a run reached: a turn opening, a step boundary, where the run would stop, or a
turn's end."""

_KINDS: Final = frozenset(get_args(BoundaryKind))


@attrs.frozen
class Boundary:
    """A boundary a run reached: its ``kind``, the session's ``stream`` and the ``turn`` number."""

    kind: BoundaryKind
    stream: str
    turn: int


class Boundaries:
    """The subscribers of one owner's boundaries, told in the order they subscribed.

    Not locked: the owner tells them holding its own lock, and a subscribe or an unsubscribe
    replaces the list rather than changing it, so a telling under way is never disturbed.
    """

    __slots__ = ("_callbacks", "_stream")

    def __init__(self, stream: str) -> None:
        self._stream = stream
        self._callbacks: tuple[Callable[[Boundary], object], ...] = ()

    def subscribe(self, callback: Callable[[Boundary], object]) -> Callable[[], None]:
        """Tell ``callback`` of every boundary from now on; returns the call that stops it."""
        if not callable(callback):
            raise TypeError(f"on_boundary needs a callable, got {type(callback).__name__}")
        self._callbacks = (*self._callbacks, callback)

        def unsubscribe() -> None:
            kept = list(self._callbacks)
            if callback in kept:
                kept.remove(callback)
            self._callbacks = tuple(kept)

        return unsubscribe

    def __bool__(self) -> bool:
        """Whether anyone subscribed (a boundary with no subscriber costs one look)."""
        return bool(self._callbacks)

    def ended(self, events: Sequence[Event]) -> None:
        """Tell of every turn that ``events`` (a batch just stored) ended."""
        if self._callbacks:
            for event in events:
                if type(event) is TurnEnded:
                    self.tell("turn_ended", event.turn)

    def tell(self, kind: BoundaryKind, turn: int) -> None:
        """Tell every subscriber that the run reached ``kind`` in ``turn``; log one that raises."""
        if not self._callbacks:
            return
        if kind not in _KINDS:
            raise ValueError(f"no boundary {kind!r}; the kinds are {', '.join(sorted(_KINDS))}")
        boundary = Boundary(kind, self._stream, turn)
        for callback in self._callbacks:
            try:
                callback(boundary)
            except Exception:
                logger.exception("a boundary subscriber of session %r failed at %s of turn %d",
                                 self._stream, kind, turn)
