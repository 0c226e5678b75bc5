"""Routing for mailboxes that hold one inbox value per agent: addresses, a send clock, and which
followups a run is owed.

A host that keeps one two-queue :class:`~nous_inbox.inbox.Inbox` per agent name (the aimu adapter
does) needs three decisions, made here once so an adapter is only a face over them:

* **Addresses.** Each agent name has its own inbox, plus one shared address (``None``) whose
  messages go to whichever run asks first. A run opened for agent ``a`` reads ``a``'s inbox and
  then the shared one (:func:`addresses`); ``""`` and ``"*"`` are reserved (:func:`check_agent`).
  In a store, each address is a stream named by a prefix (:func:`stream_name`).
* **A send clock.** Messages of several inboxes (and processes) are merged in the order they were
  sent: each carries its send position in ``metadata[ORDER_KEY]``. :class:`SendClock` hands out
  positions later than every one it made or saw, else the wall clock in nanoseconds, so a
  restarted or second process never sorts a new message before an older one.
* **What a run is owed.** A run is owed the followups queued when it opened (noted as entries);
  followups that arrive later wait for the next run. :func:`claim_for_run` carries out on one
  address the claims the loop names for a drain (:func:`~nous_inbox.commands.round_claims`): a
  claim of ``next_turn`` takes only the owed followups (the oldest entries, leaving the late
  ones queued), a claim of ``next_step`` every step message.

>>> from nous_inbox.commands import round_claims
>>> from nous_inbox.inbox import Inbox
>>> clock = SendClock()
>>> box = Inbox().followup(stamped(Message.user("owed"), clock.next()))
>>> owed = box.entries("next_turn")                  # what the run is owed, as it opens
>>> box = box.followup(stamped(Message.user("late"), clock.next()))
>>> box, events, (turn, step) = claim_for_run(box, round_claims(first=True), owed)
>>> [m.content for m in turn], box.count("next_turn"), events[0].rest
(['owed'], 1, 1)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec

from nous_inbox.commands import Claim
from nous_inbox.events import Event
from nous_inbox.inbox import Inbox
from nous_inbox.message import Message
from nous_inbox.queued import Entry
from nous_inbox.store.journal import claim_event
from nous_inbox.verbs import Target

__all__ = [
    "ORDER_KEY",
    "SHARED",
    "SendClock",
    "addresses",
    "check_agent",
    "claim_for_run",
    "order_of",
    "split_owed",
    "stamped",
    "stream_name",
]

ORDER_KEY: Final = "nous_inbox.order"
"""The metadata key carrying a queued message's send position."""

SHARED: Final = "*"
"""The name the shared address (``None``) has in a stream name."""

_TURN: Final = Target.NEXT_TURN


def check_agent(agent: object, where: str) -> str | None:
    """``agent`` if it is an agent name or ``None`` (the shared address), else an error naming
    ``where``.

    >>> check_agent("*", "send")
    Traceback (most recent call last):
    ...
    ValueError: send: agent '*' is reserved; use None for every run
    """
    if agent is None:
        return None
    if not isinstance(agent, str):
        raise TypeError(f"{where}: agent must be a str or None, got {type(agent).__name__}")
    if agent in ("", SHARED):
        # Both would share a stream with the shared address.
        raise ValueError(f"{where}: agent {agent!r} is reserved; use None for every run")
    return agent


def addresses(agent: str | None) -> tuple[str | None, ...]:
    """The addresses a run opened for ``agent`` reads, its own first.

    >>> addresses("researcher"), addresses(None)
    (('researcher', None), (None,))
    """
    return (None,) if agent is None else (agent, None)


def stream_name(prefix: str, agent: str | None) -> str:
    """The store stream of ``agent``'s inbox under ``prefix`` (``None``: the shared one).

    >>> stream_name("aimu:", "researcher"), stream_name("aimu:", None)
    ('aimu:researcher', 'aimu:*')
    """
    return prefix + (SHARED if agent is None else agent)


def order_of(message: Message) -> int:
    """A message's send position; ``-1`` for one written without a position (it sorts first,
    and since a merge only takes from the heads, each queue's own order is kept regardless)."""
    value = message.metadata.get(ORDER_KEY)
    return value if type(value) is int else -1


def stamped(message: Message, order: int) -> Message:
    """``message`` carrying send position ``order`` (``Message``'s checks run again)."""
    return msgspec.structs.replace(message, metadata={**message.metadata, ORDER_KEY: order})


class SendClock:
    """Send positions: each later than every one made or seen here, else the wall clock (ns).

    Not locked: its holder serializes calls.

    >>> clock = SendClock()
    >>> clock.saw([stamped(Message.user("from the future"), 2**62)])
    >>> clock.next() == 2**62 + 1
    True
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = 0

    def next(self) -> int:
        """The next send position."""
        self._last = max(self._last + 1, time.time_ns())
        return self._last

    def saw(self, messages: Iterable[Message]) -> None:
        """Move the clock past every position among ``messages`` (read from a store, say)."""
        for message in messages:
            self._last = max(self._last, order_of(message))


def split_owed(
    entries: Sequence[Entry], at_start: Sequence[Entry]
) -> tuple[list[Message], list[Entry]]:
    """Split the queued followups into those a run is owed (queued when it opened) and the rest.

    An entry is owed if it was among ``at_start``, counted as a multiset: another run may have
    claimed some of them meanwhile, and two equal messages are two entries.
    """
    if entries is at_start:  # the queue did not move since the run opened: no scan needed
        return [message for message, _ in entries], []
    remaining = Counter(at_start)
    owed: list[Message] = []
    late: list[Entry] = []
    for entry in entries:
        if remaining[entry] > 0:
            remaining[entry] -= 1
            owed.append(entry[0])
        else:
            late.append(entry)
    return owed, late


def claim_for_run(
    box: Inbox, claims: Sequence[Claim], owed_turn: Sequence[Entry] | None
) -> tuple[Inbox, list[Event], list[list[Message]]]:
    """Carry out ``claims`` (the loop's, for this boundary) on one address, in one append: a
    claim of ``next_turn`` takes the followups owed to the run (``owed_turn``: the ``next_turn``
    entries queued when it opened) and nothing else, a claim of ``next_step`` the queue as the
    claim says. Returns the new value, the events recording it, and what each claim took, in
    order. Each claim is built by the one claim path,
    :func:`~nous_inbox.store.journal.claim_event`.
    """
    events: list[Event] = []
    taken: list[list[Message]] = []
    for claim in claims:
        limit: int | None = None
        if claim.target == _TURN:
            owed: list[Message] = []
            if owed_turn and box.has_pending(_TURN):
                owed, _ = split_owed(box.entries(_TURN), owed_turn)
            if not owed:
                taken.append([])
                continue
            # The owed entries are the oldest (claims take the oldest; sends join the end), so
            # a claim of that many leaves the late ones queued, for the next run, untouched.
            limit = len(owed)
        messages, event, box = claim_event(box, claim.target, wake_only=claim.wake_only,
                                           limit=limit)
        if event is not None:
            events.append(event)
        taken.append(messages)
    return box, events, taken
