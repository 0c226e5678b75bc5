"""A boundary walked: the events the loop gave, then each claim it asks for, as one record.

At a step boundary the loop hands its driver events to record and, often, a claim to make; what
the claim took goes back to the loop, which answers with the events of the next request (or of
the turn's end), and at a turn's opening with a second claim. :func:`walk_claims` makes that
whole walk on a session as it stands, purely, so a journal can append all of it in one commit
(:meth:`JournalPort.boundary <nous_inbox.runner.port.JournalPort.boundary>`): a step costs a
port call per boundary, not one per record and claim. What is claimed, and what comes after, is
the loop's table (:mod:`nous_inbox.loop`) and the inbox's decision (:meth:`Session.claim
<nous_inbox.session.Session.claim>`); this only carries it out.

>>> from nous_inbox.happenings import TurnOpened
>>> from nous_inbox.inbox import Inbox
>>> from nous_inbox.loop import advance, new_state
>>> from nous_inbox.session import Session
>>> opened = advance(new_state(), TurnOpened(1))
>>> [c.target.value for c in claims_ahead(opened)]
['next_turn', 'next_step']
>>> events, adv = walk_claims(opened, Session(inbox=Inbox().followup("hi")))
>>> [type(e).__name__ for e in events], type(adv.command).__name__
(['TurnStarted', 'QueueClaimed', 'StepStarted', 'ModelRequested'], 'CallModel')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from nous_inbox.commands import Claim
from nous_inbox.events import Event, TurnEnded
from nous_inbox.happenings import ClaimAnswered
from nous_inbox.loop import Advance, LoopState, advance
from nous_inbox.session import Session
from nous_inbox.verbs import Target

__all__ = ["Ended", "LimitOf", "claims_ahead", "finish", "walk_claims"]

Ended = Callable[[TurnEnded, LoopState], TurnEnded]
"""What a driver adds to a turn's end as it is recorded (the usage its model reported), given
the loop's state there."""

LimitOf = Callable[[Target], "int | None"]
"""How many of a queue's oldest messages a claim may take now (``None``: all)."""


def _all(target: Target) -> int | None:
    return None


def finish(events: Sequence[Event], state: LoopState, ended: Ended | None) -> Sequence[Event]:
    """``events`` with the turn's end among them (if any) as ``ended`` completes it."""
    if ended is None or type(events[-1]) is not TurnEnded:  # a turn's end is always last
        return events
    return [*events[:-1], ended(events[-1], state)]


def walk_claims(
    adv: Advance, session: Session, limit_of: LimitOf = _all, ended: Ended | None = None,
) -> tuple[list[Event], Advance]:
    """The events of ``adv``, then, while the loop asks for a claim, the claim made on
    ``session`` (its ``QueueClaimed`` when it took something) and the events the loop answers
    with; and where the loop stands after. Pure: the same arguments give the same walk, so a
    journal that lost a race to another writer walks again on the session it caught up to.
    ``seq`` and ``at`` are left for the append."""
    events = list(finish(adv.events, adv.state, ended)) if adv.events else []
    while type(adv.command) is Claim:
        asked: Claim = adv.command
        target = asked.target
        claimed, event, session = session.claim(target, wake_only=asked.wake_only,
                                                limit=limit_of(target))
        if event is not None:
            events.append(event)
        adv = advance(adv.state, ClaimAnswered(target, claimed))
        if adv.events:
            events += finish(adv.events, adv.state, ended)
    return events, adv


_NOTHING: Final = ()


def claims_ahead(adv: Advance) -> list[Claim]:
    """The claims a walk from ``adv`` makes, in order: told to an owner's boundary subscribers
    before the commit that makes them. Which claims follow a claim does not depend on what it
    took (a turn's opening always claims ``next_step`` after ``next_turn``), so a walk that
    takes nothing names them all."""
    claims: list[Claim] = []
    while type(adv.command) is Claim:
        asked: Claim = adv.command
        claims.append(asked)
        adv = advance(adv.state, ClaimAnswered(asked.target, _NOTHING))
    return claims
