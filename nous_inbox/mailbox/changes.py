"""The changes a mailbox commits: for each verb that writes, the events it appends, worked out from
the fold, and what the verb answers.

Each function here is pure: it reads the state (:class:`~nous_inbox.mailbox.state.MailboxState`)
and returns the events and the answer, or raises, naming the problem and the place, before
anything is written. The mailbox (:mod:`nous_inbox.mailbox.mailbox`) commits them through its
journal, which works a change out again on the new state when another writer came first; so a
change decides from the state it is given, never from one it kept.

>>> from nous_inbox.mailbox.state import MailboxState
>>> state = MailboxState()
>>> mail = MailSent(id="m1", sender="lead", recipient="dev", body="ship it")
>>> events, answer = sent(mail, False, Bound(max_queue=1), False, state)
>>> [type(e).__name__ for e in events], answer.state
(['MailSent'], 'queued')
>>> state.apply(mail)
>>> sent(MailSent(id="m2", sender="qa", recipient="dev", body="?"), False, Bound(1), False, state)
Traceback (most recent call last):
...
nous_inbox.mailbox.answers.MailboxFullError: send to 'dev': 1 messages already queued (max_queue); nothing was queued (receive some, or use overflow='drop_oldest')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, Literal, NamedTuple

from nous_inbox.events import (
    Event,
    MailAgent,
    MailDropped,
    MailReceived,
    MailSent,
    MailWithdrawn,
)
from nous_inbox.frozen import freeze_json
from nous_inbox.mailbox.answers import MailboxFullError, Receipt, not_yours
from nous_inbox.mailbox.records import Mail
from nous_inbox.mailbox.rules import MAX_QUEUE
from nous_inbox.mailbox.state import MailboxState

__all__ = ["Bound", "Overflow", "checked_body", "receipt", "received", "sent", "withdrawn"]

_ID = attrgetter("id")  # (a C callable: a receive's batch of ids without a frame per message)

Overflow = Literal["refuse", "drop_oldest"]
"""What a send beyond a recipient's bound does: refused, or the oldest queued message makes room."""


class Bound(NamedTuple):
    """How many messages a recipient may have queued, and what a send beyond that does."""

    max_queue: int = MAX_QUEUE
    overflow: Overflow = "refuse"


def checked_body(body: Any, where: str, *names: object) -> Any:
    """``body`` frozen and checked, or the error naming the place: ``where`` formatted with
    ``names``, only when there is an error to name (plain ASCII text, the commonest body, needs
    no check at all).

    >>> checked_body({"v": [1]}, "send to {!r}", "dev") == {"v": [1]}
    True
    >>> checked_body({1: 2}, "send to {!r}", "dev")
    Traceback (most recent call last):
    ...
    TypeError: send to 'dev': body: key 1 is int, keys must be str
    """
    if type(body) is str and body.isascii():
        return body
    try:
        return freeze_json(body, "body")
    except (TypeError, ValueError):
        # Checked again with the place named in full: an error is rare, a send is not.
        freeze_json(body, f"{where.format(*names) if names else where}: body")
        raise


def receipt(state: MailboxState, id: str) -> Receipt | None:
    """What became of message ``id``, as a resend of it is answered (``None``: never sent, or
    forgotten)."""
    mail = state.mail(id)
    if mail is not None:
        return Receipt(id, mail.state, True, mail.answered_by)
    gone = state.outcome(id)
    if gone is not None:
        return Receipt(id, gone[0], True, gone[1])
    return None


def sent(event: MailSent, given: bool, bound: Bound, worked: bool,
         state: MailboxState) -> tuple[Sequence[Event], Receipt]:
    """The events a send appends, and its receipt: none for an id already sent (``given``: the
    sender named the id), the ``MailSent`` otherwise, after a mark that its recipient had a turn
    (``worked``: no longer its first work) and, at the bound, a drop of its oldest message (or
    the refusal)."""
    if given:
        seen = receipt(state, event.id)
        if seen is not None:
            # The same message again, or another (whose, it must not say: ids are guessable).
            kept = state.mail(event.id)
            if kept is None:  # let go: only its parties are remembered
                same = state.parties(event.id) == (event.sender, event.recipient)
            else:
                same = ((kept.event.sender, kept.event.recipient, kept.event.body)
                        == (event.sender, event.recipient, event.body))
            if not same:
                raise ValueError(
                    f"send to {event.recipient!r}: id {event.id!r} names another message; "
                    "an id names one message: use a new id")
            return [], seen
    recipient = event.recipient
    box = state.boxes.get(recipient)
    events: list[Event] = [event]
    if worked:
        events.insert(0, MailAgent(agent=recipient, worked=True, at=event.at))
    if box is None or box.queued < bound.max_queue:
        return events, Receipt(event.id, "queued")
    if bound.overflow == "refuse":
        raise MailboxFullError(
            f"send to {recipient!r}: {bound.max_queue} messages already queued "
            "(max_queue); nothing was queued (receive some, or use overflow='drop_oldest')"
        )
    (oldest,) = state.oldest_queued(recipient, 1)
    return ([MailDropped(id=oldest.id, recipient=recipient, at=event.at), *events],
            Receipt(event.id, "queued"))


def received(agent: str, limit: int, at: float,
             state: MailboxState) -> tuple[list[Event], list[MailSent]]:
    """The event a receive appends, and what it takes: the ``limit`` oldest queued messages of
    ``agent`` leave the mailbox."""
    taken = state.oldest_queued(agent, limit)
    if not taken:
        return [], []
    return [MailReceived(recipient=agent, ids=tuple(map(_ID, taken)), at=at)], taken


def withdrawn(id: str, sender: str, at: float, carried: Callable[[Mail], bool],
              state: MailboxState) -> tuple[list[Event], str]:
    """The event a withdraw appends, and its answer: ``"withdrawn"`` when no notice carried the
    message yet (nor one on its way does: ``carried``), ``"retracted"`` when one did; what
    became of a message already gone. Another agent's message is refused, saying no more than
    that it is not ``sender``'s."""
    where = f"withdraw by {sender!r}"
    parties = state.parties(id)
    if parties is None:
        raise LookupError(f"{where}: no message {id!r}")
    if parties[0] != sender:
        raise not_yours(where, id)
    mail = state.mail(id)
    if mail is None:
        gone = state.outcome(id)
        assert gone is not None  # (it has parties, and is not kept)
        return [], gone[0]
    if mail.retracted:
        return [], "retracted"
    retract = mail.noticed or mail.read or carried(mail)
    return ([MailWithdrawn(id=id, recipient=mail.event.recipient, retracted=retract, at=at)],
            "retracted" if retract else "withdrawn")
