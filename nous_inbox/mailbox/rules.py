"""The mailbox's rules: message classes, who may wake whom, when a message is settled, the bounds,
and how and when an agent hears of its new mail (one notice).

Everything here is a decision made from plain values, with no storage and no I/O, so the fold
(:mod:`nous_inbox.mailbox.state`) and the mailbox (:mod:`nous_inbox.mailbox.mailbox`) only ask.

Another agent's message is never a turn of its own (ruling 11): it waits in the recipient's
mailbox and may wake an idle recipient only by its class: ``"action"`` (the default),
``"result"`` (an action that also reports work the recipient gave out), ``"blocker"`` (aliases
``"question"``, ``"block"``), ``"report"``, ``"fyi"`` or ``"reply"``. Its thread is the one its
sender names, else the sender. Retention keeps ``retain`` messages per recipient and lets go only
of settled ones, in the order they became so.

>>> wakes("fyi", "lead", parent=None, started=False, gave_work=())
False
>>> wakes("result", "lead", parent=None, started=False, gave_work=())   # its first work
True
>>> wakes("action", "qa", parent="lead", started=True, gave_work=())    # not from its parent
False
>>> wakes("result", "dev", parent=None, started=True, gave_work={"dev"})  # work it gave out
True
>>> wakes("report", "dev", parent="dev", started=True, gave_work=())    # not work it gave out
False
>>> settled("fyi", read=True, retracted=False, answered=False)          # asks no answer
True

The agent hears of everything new as ONE notice: a message tagged as the mailbox's
(``metadata["provenance"] == "mailbox_notice"``), not as anyone's words, with one line per
thread (the count, the sender(s), the newest message's first line cut to 120 characters),
blockers first, then the most recent threads.

>>> from nous_inbox.events import MailSent
>>> from nous_inbox.mailbox.state import MailboxState
>>> state = MailboxState()
>>> state.apply(MailSent(id="1", sender="qa", recipient="dev", body="tests are green", kind="fyi"))
>>> state.apply(MailSent(id="2", sender="lead", recipient="dev", body="which branch?\\nmain?",
...                      kind="blocker"))
>>> message, ids = compose(state, "dev", "n1")
>>> print(message.content)
2 new messages in your mailbox (read a thread to see it whole):
- lead [blocker]: 1 from lead: which branch?
- qa: 1 from qa: tests are green
>>> ids
('1', '2')

When a notice goes (:func:`plan`): in a running agent, at its next boundary, everything that
came since the last one as one notice (a turn that opens, a person's prompt included, takes it
along); never ahead of a waiting prompt; in an idle agent, ``debounce`` seconds after the first
message that may wake it (a burst is one wake), or ``max_wait`` after the oldest new message
when none may wake it. Only one notice is in flight per agent; the caller checks that before
asking.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Final, Literal

from nous_inbox.boundary import BoundaryKind
from nous_inbox.frozen import thaw_json
from nous_inbox.message import Message

if TYPE_CHECKING:
    from nous_inbox.mailbox.records import Mail
    from nous_inbox.mailbox.state import MailboxState

__all__ = [
    "DEBOUNCE",
    "KINDS",
    "KIND_ALIASES",
    "MAX_QUEUE",
    "MAX_WAIT",
    "NOTICE",
    "NO_ANSWER",
    "PREVIEW",
    "REMEMBER",
    "RETAIN",
    "GIVES_WORK",
    "Plan",
    "check_options",
    "compose",
    "kind_of",
    "plan",
    "preview",
    "settled",
    "wakes",
]

KINDS: Final = frozenset({"action", "blocker", "result", "report", "fyi", "reply"})
"""The classes of a message; they decide whether it may wake an idle recipient (see ``wakes``)."""

KIND_ALIASES: Final = {
    "action": "action", "result": "result", "blocker": "blocker", "question": "blocker",
    "block": "blocker", "report": "report", "fyi": "fyi", "reply": "reply",
}
"""Every accepted ``kind`` and the class it means."""

GIVES_WORK: Final = frozenset({"action"})
"""The classes that give their recipient work, so that the recipient's result or report wakes
the sender (``wakes``'s ``gave_work``). Only an action does: a result reports work, and if it
gave work too, two agents' results would wake each other back and forth (a set, so the fold asks
it per send for the price of a look-up).

>>> "action" in GIVES_WORK, "result" in GIVES_WORK
(True, False)
"""

NO_ANSWER: Final = frozenset({"fyi", "result", "report", "reply"})
"""The classes that ask for no answer: reading such a message settles it."""

MAX_QUEUE: Final = 1000
"""Messages queued per recipient before the overflow policy applies."""

RETAIN: Final = 500
"""Messages kept per recipient by default before settled ones are let go."""

REMEMBER: Final = 10_000
"""Messages sent after one was let go during which its outcome is still remembered, by default
(however long it was kept before): a resend of its id within them answers what became of it and
carries nothing."""

DEBOUNCE: Final = 2.0
"""Seconds an idle agent waits after the first message that may wake it, so a burst is one wake."""

MAX_WAIT: Final = 600.0
"""Seconds a message that may not wake an idle agent waits at most before a notice brings it."""

NOTICE: Final = "mailbox_notice"
"""The ``provenance`` a notice's metadata carries: it is the mailbox's message, not a person's."""

PREVIEW: Final = 120
"""Characters of the newest message's first line shown in a notice line."""

Plan = tuple[Literal["steer", "inject", "join", "followup"] | None, float | None]
"""How to deliver a notice now (``None``: not now) and, if not now, when to look again."""

def check_options(*, max_queue: int, overflow: str, retain: int, remember: int,
                  debounce: float, max_wait: float) -> None:
    """Refuse a mailbox's bounds and timings that cannot work, naming the option.

    >>> check_options(max_queue=0, overflow="refuse", retain=1, remember=0, debounce=0,
    ...               max_wait=0)
    Traceback (most recent call last):
    ...
    ValueError: Mailbox: max_queue must be an int > 0, got 0
    """
    if type(max_queue) is not int or max_queue <= 0:
        raise ValueError(f"Mailbox: max_queue must be an int > 0, got {max_queue!r}")
    if overflow not in ("refuse", "drop_oldest"):
        raise ValueError(f"Mailbox: overflow must be 'refuse' or 'drop_oldest', got {overflow!r}")
    if type(retain) is not int or retain <= 0:
        raise ValueError(f"Mailbox: retain must be an int > 0, got {retain!r}")
    if type(remember) is not int or remember < 0:
        raise ValueError(f"Mailbox: remember must be an int >= 0, got {remember!r}")
    for name, seconds in (("debounce", debounce), ("max_wait", max_wait)):
        if type(seconds) not in (int, float) or not 0 <= seconds < float("inf"):
            raise ValueError(f"Mailbox: {name} must be a number of seconds >= 0, "
                             f"got {seconds!r}")


def kind_of(kind: object, where: str) -> str:
    """The class ``kind`` names (an alias included), or a ``ValueError`` naming ``where``.

    >>> kind_of("question", "send"), kind_of("block", "send")
    ('blocker', 'blocker')
    """
    # (A str subclass is looked up by its value, not by an __eq__ or __hash__ of its own.)
    found = KIND_ALIASES.get(str.__str__(kind)) if isinstance(kind, str) else None
    if found is None:
        raise ValueError(f"{where}: kind must be one of {sorted(KIND_ALIASES)}, got {kind!r}")
    return found


def wakes(kind: str, sender: str, parent: str | None, started: bool,
          gave_work: Collection[str]) -> bool:
    """Whether a message of class ``kind`` from ``sender`` may wake its idle recipient, whose
    declared ``parent`` started it, which ``started`` once it had a turn or took any message,
    and which ``gave_work`` to those agents.

    A blocker always may. An action may when it is the recipient's first work or comes from its
    parent. A result is an action that also reports back: it wakes wherever an action does, and
    also the agent that gave ``sender`` the work; a report wakes only that agent. An FYI or a reply never wakes anyone.
    """
    if kind == "blocker":
        return True
    if (kind == "action" or kind == "result") and (sender == parent or not started):
        return True
    return (kind == "result" or kind == "report") and sender in gave_work


def settled(kind: str, *, read: bool, retracted: bool, answered: bool) -> bool:
    """Whether a kept message owes nothing more, so retention may let it go: read and answered;
    read, if its class asks no answer; or read and retracted.

    A retraction alone does not settle a message: it is only retracted because a notice carried
    it, so its recipient was told of it, and the thread, where it shows as retracted, is the only
    place it learns that it no longer holds.
    """
    return read and (retracted or answered or kind in NO_ANSWER)


def preview(body: object, width: int = PREVIEW) -> str:
    """A body's first line, cut to ``width`` characters (JSON for a body that is not text).

    >>> preview("a" * 200)[-4:], preview({"k": 1})
    ('aaa…', '{"k": 1}')
    """
    text = body if isinstance(body, str) else json.dumps(thaw_json(body), ensure_ascii=False)
    line = text.split("\n", 1)[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def compose(state: MailboxState, agent: str, notice_id: str) -> tuple[Message, tuple[str, ...]]:
    """The notice of everything ``agent`` has not heard of yet, and the ids it carries (its
    metadata names them, and their messages' send orders beside them, unique over the stream's
    life where an id is not, so a claimed notice marks exactly what it carried).

    Costs O(new messages): threads with nothing new are not looked at.
    """
    groups: dict[str, list[Mail]] = {}
    for mail in state.fresh(agent):
        groups.setdefault(mail.thread, []).append(mail)
    ids = tuple(mail.id for mails in groups.values() for mail in mails)
    ranked = sorted(
        groups.items(),
        key=lambda item: (not any(m.event.kind == "blocker" for m in item[1]), -item[1][-1].order),
    )
    lines = []
    for key, mails in ranked:
        senders = ", ".join(dict.fromkeys(m.event.sender for m in mails))
        tag = " [blocker]" if any(m.event.kind == "blocker" for m in mails) else ""
        lines.append(f"- {key}{tag}: {len(mails)} from {senders}: {preview(mails[-1].event.body)}")
    count = len(ids)
    head = (f"{count} new message{'s' if count != 1 else ''} in your mailbox "
            "(read a thread to see it whole):")
    orders = [mail.order for mails in groups.values() for mail in mails]
    metadata = {"provenance": NOTICE, "notice": notice_id, "threads": [key for key, _ in ranked],
                "ids": list(ids), "orders": orders}
    return Message.user("\n".join([head, *lines]), metadata=metadata), ids


def plan(
    state: MailboxState, agent: str, now: float, *, boundary: BoundaryKind | None = None,
    running: bool, prompt_waiting: bool, debounce: float = DEBOUNCE, max_wait: float = MAX_WAIT,
) -> Plan:
    """Whether to deliver a notice to ``agent`` now, and how; else when to look again.

    At a ``boundary`` of its run (:data:`~nous_inbox.boundary.BoundaryKind`, as its owner tells
    it), everything new is one notice: joining the turn that opens (``"join"``: next turn, no
    wake, claimed right after), or at a ``"step"`` a ``"steer"`` when any of it may wake the
    agent, else an ``"inject"``; at a ``"stop"`` (the run stops unless a waking message comes) a
    ``"steer"`` or nothing: an FYI alone never extends a run, ruling 2, and waits as an idle
    agent's would. None at a step while a person's prompt waits: it joins that prompt's turn.
    Between boundaries a running agent hears nothing: its next boundary brings everything at
    once. An idle agent (and one whose turn just ended, ``"turn_ended"``) gets a ``"followup"``
    (a turn) ``debounce`` seconds after the first message that may wake it, ``max_wait`` after
    the oldest when none may, or at once when a prompt waits (it joins that prompt's turn).

    >>> from nous_inbox.events import MailSent
    >>> from nous_inbox.mailbox.state import MailboxState
    >>> state = MailboxState()
    >>> state.apply(MailSent(id="1", sender="qa", recipient="dev", body="fyi", kind="fyi", at=10.0))
    >>> plan(state, "dev", 11.0, running=False, prompt_waiting=False)
    (None, 610.0)
    >>> plan(state, "dev", 11.0, running=True, prompt_waiting=False)
    (None, None)
    >>> plan(state, "dev", 11.0, boundary="step", running=True, prompt_waiting=False)
    ('inject', None)
    >>> plan(state, "dev", 11.0, boundary="stop", running=True, prompt_waiting=False)
    (None, None)
    >>> plan(state, "dev", 11.0, boundary="turn_opening", running=True, prompt_waiting=False)
    ('join', None)
    """
    oldest = state.oldest_fresh(agent)
    if oldest is None:
        return None, None
    waking = state.oldest_fresh(agent, waking=True)
    if boundary == "turn_opening":
        return "join", None
    if boundary == "step" or boundary == "stop":
        if prompt_waiting or (boundary == "stop" and waking is None):
            return None, None
        return ("steer" if waking is not None else "inject"), None
    if running and boundary != "turn_ended":
        return None, None
    if prompt_waiting:
        return "followup", None
    due = oldest.event.at + max_wait
    if waking is not None:
        due = min(due, waking.event.at + debounce)
    if now >= due:
        return "followup", None
    return None, due
