"""What is queued, seen from outside the inbox: a claim's messages and a queue's entries.

An inbox keeps each queued message with its wake intent in a :class:`Queued` entry; a claim
hands the drained vector back behind :class:`Claimed`, and :meth:`Inbox.entries
<nous_inbox.inbox.Inbox.entries>` shows a queue as ``(message, wakeup)`` pairs through
:class:`Entries`. Neither view copies the vector, so neither costs more the longer the queue.

>>> from nous_inbox import Inbox
>>> claimed, _ = Inbox().steer("a").inject("b").claim("next_step")
>>> [m.content for m in claimed]
['a', 'b']
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Annotated, Any, Final, overload

import msgspec
from pyrsistent import PVector, pvector

from nous_inbox.message import Message

__all__ = ["NO_ENTRIES", "Claimed", "Entries", "Entry", "Queued"]

Entry = tuple[Message, bool]
"""One queued message plus the wake intent of the send that queued it."""


class Queued(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """A queued entry as the inbox keeps it (and writes it): left out of the cyclic collector.

    ``seq`` is the seq of the ``MessageSent`` that queued it (0 for a send made on a bare
    inbox, outside any log): the handle a withdraw and a receipt name it by.
    """

    message: Message
    wakeup: bool
    seq: Annotated[int, msgspec.Meta(ge=0)] = 0


NO_ENTRIES: Final[PVector[Any]] = pvector()
"""An empty queue: every empty inbox shares it."""
_message_of: Final = attrgetter("message")


class Claimed(Sequence[Message]):
    """The messages one claim took, in send order: a read-only sequence.

    It wraps the drained queue without copying it, which is why a claim costs the same whether
    one message or a hundred thousand were waiting. It compares equal to any sequence holding
    the same messages.

    Claiming: ``loop.Claim`` asks, ``loop.ClaimAnswered`` answers, ``events.QueueClaimed`` is
    recorded, ``Claimed`` is the view.

    >>> from nous_inbox import Inbox
    >>> claimed, _ = Inbox().steer("a").steer("b").claim("next_step")
    >>> len(claimed), claimed[0].content, claimed == [Message.user("a"), Message.user("b")]
    (2, 'a', True)
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: PVector[Any] = NO_ENTRIES) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return Claimed(self._entries[index])
        message: Message = self._entries[index].message
        return message

    def __iter__(self) -> Iterator[Message]:
        # map/itemgetter iterates in C: reading a large claim costs what copying a list would.
        return map(_message_of, self._entries)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Claimed):
            return list(self) == list(other)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Claimed({list(self)!r})"


class Entries(Sequence[Entry]):
    """One queue's entries as ``(message, wakeup)`` pairs: a read-only view, nothing copied."""

    __slots__ = ("_queued",)

    def __init__(self, queued: PVector[Any]) -> None:
        self._queued = queued

    def __len__(self) -> int:
        return len(self._queued)

    @overload
    def __getitem__(self, index: int) -> Entry: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Entry]: ...

    def __getitem__(self, index: int | slice) -> Entry | Sequence[Entry]:
        if isinstance(index, slice):
            return Entries(self._queued[index])
        entry: Queued = self._queued[index]
        return entry.message, entry.wakeup

    def __iter__(self) -> Iterator[Entry]:
        return ((entry.message, entry.wakeup) for entry in self._queued)

    def __eq__(self, other: object) -> bool:
        # What it shows, (message, wakeup) pairs, is what it compares: not the sends' seqs.
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"[{', '.join(map(repr, self))}]"
