"""Notices: how an agent hears of its new messages, and when.

Another agent's message is never a turn of its own (acpmux's lesson: a coordinator had 319 agent
messages queued as 319 turns). The agent hears of everything new as ONE notice: a message tagged
as a notice (``metadata["provenance"] == "mailbox_notice"``), not as anyone's words, with one line
per thread: the count, the sender(s) and the newest message's first line cut to 120 characters,
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

When a notice goes (:func:`plan`): in a running turn at once, as a steer read at the next step;
if a person's prompt is waiting, as a followup, so it joins that prompt's turn and never goes
ahead of it; in an idle agent, ``debounce`` seconds after the first message that may wake it (a
burst is one wake), or ``max_wait`` after the oldest new message when none may wake it. Only one
notice is in flight per agent; the caller checks that before asking.
"""

from __future__ import annotations

import json
from typing import Final, Literal

from nous_inbox.mailbox.state import Mail, MailboxState
from nous_inbox.message import Message, thaw_json

__all__ = ["DEBOUNCE", "MAX_WAIT", "NOTICE", "PREVIEW", "Plan", "compose", "plan", "preview"]

DEBOUNCE: Final = 2.0
"""Seconds an idle agent waits after the first message that may wake it, so a burst is one wake."""

MAX_WAIT: Final = 600.0
"""Seconds a message that may not wake an idle agent waits at most before a notice brings it."""

NOTICE: Final = "mailbox_notice"
"""The ``provenance`` a notice's metadata carries: it is the mailbox's message, not a person's."""

PREVIEW: Final = 120
"""Characters of the newest message's first line shown in a notice line."""

Plan = tuple[Literal["steer", "followup"] | None, float | None]
"""How to deliver a notice now (``None``: not now) and, if not now, when to look again."""


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
    metadata names them, and their messages' orders beside them).

    Costs O(new messages): threads with nothing new are not looked at.
    """
    groups: dict[str, list[Mail]] = {}
    for mail in state.fresh(agent):
        groups.setdefault(mail.event.thread or mail.event.sender, []).append(mail)
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
    # Each id with its message's order, unique over the stream's life (an id is not, once
    # forgotten: it may be sent again), so a claimed notice marks exactly what it carried.
    orders = [mail.order for mails in groups.values() for mail in mails]
    metadata = {"provenance": NOTICE, "notice": notice_id, "threads": [key for key, _ in ranked],
                "ids": list(ids), "orders": orders}
    return Message.user("\n".join([head, *lines]), metadata=metadata), ids


def plan(
    state: MailboxState, agent: str, now: float, *, running: bool, prompt_waiting: bool,
    debounce: float = DEBOUNCE, max_wait: float = MAX_WAIT,
) -> Plan:
    """Whether to deliver a notice to ``agent`` now, and how; else when to look again.

    >>> from nous_inbox.events import MailSent
    >>> state = MailboxState()
    >>> state.apply(MailSent(id="1", sender="qa", recipient="dev", body="fyi", kind="fyi", at=10.0))
    >>> plan(state, "dev", 11.0, running=False, prompt_waiting=False)
    (None, 610.0)
    >>> plan(state, "dev", 11.0, running=True, prompt_waiting=False)
    ('steer', None)
    >>> plan(state, "dev", 11.0, running=True, prompt_waiting=True)
    ('followup', None)
    """
    oldest = state.oldest_fresh(agent)
    if oldest is None:
        return None, None
    if prompt_waiting:
        return "followup", None
    if running:
        return "steer", None
    waking = state.oldest_fresh(agent, waking=True)
    due = oldest.event.at + max_wait
    if waking is not None:
        due = min(due, waking.event.at + debounce)
    if now >= due:
        return "followup", None
    return None, due
