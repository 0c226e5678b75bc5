"""Pipeline style: the inbox's methods as functions of the inbox, for a chain of calls.

Each function is the method of the same name (:class:`~nous_inbox.inbox.Inbox`), the inbox first,
so a program that threads a value through functions (``functools.reduce``, a fold over events)
reads as it would in a functional language. Same checks, same errors, same values.

>>> from nous_inbox import pipeline
>>> inbox = pipeline.steer(pipeline.inject(Inbox(), "recall: the deploy is frozen"), "summarize")
>>> messages, inbox = pipeline.claim(inbox, "next_step")
>>> [m.content for m in messages], pipeline.has_pending(inbox)
(['recall: the deploy is frozen', 'summarize'], False)
"""

from __future__ import annotations

from nous_inbox.inbox import Inbox
from nous_inbox.message import Message
from nous_inbox.queued import Claimed
from nous_inbox.verbs import Target

__all__ = [
    "claim", "count", "followup", "has_pending", "inject", "send", "steer", "wants_wake",
    "worth_waking",
]


def send(inbox: Inbox, message: Message | str, target: Target | str, wakeup: bool) -> Inbox:
    """``inbox.send(message, target, wakeup)``, for pipeline style.

    >>> wants_wake(send(Inbox(), "hi", "next_step", False))
    False
    """
    return inbox.send(message, target, wakeup)


def followup(inbox: Inbox, message: Message | str) -> Inbox:
    """``inbox.followup(message)``: next turn, wakes."""
    return inbox.followup(message)


def steer(inbox: Inbox, message: Message | str) -> Inbox:
    """``inbox.steer(message)``: next step, wakes."""
    return inbox.steer(message)


def inject(inbox: Inbox, message: Message | str) -> Inbox:
    """``inbox.inject(message)``: next step, no wake."""
    return inbox.inject(message)


def claim(
    inbox: Inbox, target: Target | str, limit: int | None = None, *, wake_only: bool = False
) -> tuple[Claimed, Inbox]:
    """``inbox.claim(target, limit, wake_only=...)``: ``(messages, drained_inbox)``."""
    return inbox.claim(target, limit, wake_only=wake_only)


def wants_wake(inbox: Inbox, target: Target | str | None = None) -> bool:
    """``inbox.wants_wake(target)``: whether a queued entry asked for a wake."""
    return inbox.wants_wake(target)


def worth_waking(inbox: Inbox, target: Target | str | None = None) -> bool:
    """``inbox.worth_waking(target)``: whether a waking entry is worth a model round.

    >>> worth_waking(steer(Inbox(), " ")), worth_waking(steer(Inbox(), "stop"))
    (False, True)
    """
    return inbox.worth_waking(target)


def has_pending(inbox: Inbox, target: Target | str | None = None) -> bool:
    """``inbox.has_pending(target)``."""
    return inbox.has_pending(target)


def count(inbox: Inbox, target: Target | str | None = None) -> int:
    """``inbox.count(target)``."""
    return inbox.count(target)
