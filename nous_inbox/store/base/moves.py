"""MoveLog: which streams a local store saw move, in the order they last moved, numbered.

A host asks a store which streams moved since its last look (:meth:`Store.moved
<nous_inbox.store.base.Store.moved>`); a store that keeps its index in memory (``memory:``,
``file:``) answers from this log, so a look costs the streams that moved since, not every
stream stored. Each stream keeps only its last move, so the log holds one entry per stream.

>>> moves = MoveLog()
>>> first = moves.cursor()
>>> moves.note("s1"); moves.note("s2"); moves.note("s1")
>>> moves.since(first)
['s1', 's2']
>>> moves.since(moves.cursor())
[]
"""

from __future__ import annotations

__all__ = ["MoveLog"]


class MoveLog:
    """The last move of each stream a store saw, numbered in order; its cursors are
    ``(log, number)`` pairs, good for this log only."""

    __slots__ = ("_count", "_floor", "_last")

    def __init__(self) -> None:
        self._count = 0
        self._floor = 0  # a cursor numbered below this was given before what the log knows
        self._last: dict[str, int] = {}  # stream -> the number of its last move, newest last

    def note(self, stream: str) -> None:
        """``stream`` moved (an append, a delete)."""
        self._count += 1
        last = self._last
        last.pop(stream, None)  # to the end: the dict stays in the order of last moves
        last[stream] = self._count

    def forget(self) -> None:
        """What moved until now is no longer known (the store read its file afresh): the next
        look from an older cursor is a full one."""
        self._count += 1
        self._floor = self._count
        self._last = {}

    def cursor(self) -> tuple[MoveLog, int]:
        """The cursor of a look made now."""
        return (self, self._count)

    def since(self, cursor: object) -> list[str] | None:
        """The streams that moved after ``cursor``, sorted; ``None`` when the log cannot tell
        (no cursor, or one from before :meth:`forget`): then the look must be a full one."""
        if cursor is None:
            return None
        if type(cursor) is not tuple or len(cursor) != 2 or cursor[0] is not self:
            raise ValueError(f"moved: {cursor!r} is not a cursor this store gave")
        number = cursor[1]
        if number < self._floor:
            return None
        last = self._last
        moved = []
        for stream in reversed(last):  # newest first: stop at the first move already seen
            if last[stream] <= number:
                break
            moved.append(stream)
        return sorted(moved)
