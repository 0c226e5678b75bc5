"""One readable line per event, for ``nous-inbox log``, ``run`` and ``demo``.

The same events a store holds and replay folds are what a person watches scroll by; this module
only decides how each one reads on a terminal.

Text that came from a message, a model or a tool is shown through ``printable``: a message could
otherwise carry terminal escape sequences that move the cursor, recolour or retitle the reader's
terminal, or bidi overrides that reorder what a line seems to say (see
``nous_inbox.cli.terminal``). ``--json`` prints :func:`nous_inbox.safe_json.event_json`, which
escapes what JSON encoders leave raw (DEL, C1 and bidi controls) as ``\\u`` escapes, so the output
still decodes to the exact log; the web face's event stream sends the same lines.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

import msgspec

from nous_inbox.cli.style import Style
from nous_inbox.cli.terminal import printable
from nous_inbox.events import (
    CancelRequested,
    Event,
    MailAgent,
    MailAnswered,
    MailDropped,
    MailEvent,
    MailNoticed,
    MailRead,
    MailReceived,
    MailSent,
    MailWithdrawn,
    MessageSent,
    MessageWithdrawn,
    ModelReplied,
    ModelRequested,
    Nudged,
    QueueClaimed,
    SessionReleased,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.frozen import thaw_json
from nous_inbox.message import enc_hook
from nous_inbox.verbs import name_of

__all__ = ["FINAL_LIMIT", "LIMIT", "format_event", "short"]

#: How much of a message one event line shows; a final answer (no tool calls) gets more room,
#: since it is what the run was for (the demo's summary runs to some 400 characters).
LIMIT: Final = 100
FINAL_LIMIT: Final = 500


def short(text: str, limit: int = LIMIT) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis; safe to print.

    >>> short("a\\nb" + "c" * 200, 10)
    'a bcccccc…'
    >>> short("red \\x1b[31mtext")
    'red \\\\x1b[31mtext'
    """
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def format_event(event: Event, style: Style, *, with_time: bool = True) -> str:
    """One human line for ``event``: sequence number, time, what happened.

    >>> from nous_inbox.message import Message
    >>> e = MessageSent(seq=3, target="next_step", wakeup=True, message=Message.user("go"))
    >>> format_event(e, Style(None, force=False), with_time=False)
    '#3     steer     user: go'
    """
    head = f"#{event.seq:<5}"
    if with_time and event.at:
        head += " " + style.paint(time.strftime("%H:%M:%S", time.localtime(event.at)), "dim")
    return f"{head} {_body(event, style)}"


def _body(event: Event, style: Style) -> str:
    if isinstance(event, MessageSent):
        mode = name_of(event.target, event.wakeup) or (
            f"send({event.target}, {'wakes' if event.wakeup else 'no wake'})")
        return f"{style.paint(f'{mode:<9}', 'magenta', 'bold')} {event.message.role}: {short(event.message.content)}"
    if isinstance(event, MessageWithdrawn):
        return style.paint(f"withdrawn the message sent at #{event.sent} from "
                           f"{printable(event.target)}", "magenta")
    if isinstance(event, QueueClaimed):
        return style.paint(f"claimed   {event.count} from {printable(event.target)}", "green")
    if isinstance(event, TurnStarted):
        return style.paint(f"turn {event.turn} opened ({printable(event.reason)})", "bold", "cyan")
    if isinstance(event, StepStarted):
        return style.paint(f"  step {event.step}", "cyan")
    if isinstance(event, ModelRequested):
        return style.paint(f"  model    asked with {event.count} messages", "dim")
    if isinstance(event, ModelReplied):
        message = event.message
        calls = ", ".join(f"{printable(c.name)}({_args(c.arguments)})" for c in message.tool_calls)
        limit = LIMIT if message.tool_calls else FINAL_LIMIT
        text = short(message.content, limit) if message.content.strip() else ""
        parts = [p for p in (text, f"calls {calls}" if calls else "") if p]
        return f"  {style.paint('model', 'blue')}    {' · '.join(parts) or style.paint('(empty reply)', 'yellow')}"
    if isinstance(event, ToolCalled):
        return f"  {style.paint('tool', 'yellow')}     {printable(event.call.name)}({_args(event.call.arguments)}) …"
    if isinstance(event, ToolReturned):
        return f"  {style.paint('tool', 'yellow')}     -> {short(event.message.content, 80)}"
    if isinstance(event, StepEnded):
        return style.paint(f"  step {event.step} ended", "dim")
    if isinstance(event, Nudged):
        return style.paint(f"  nudge    {short(event.message.content)}", "dim")
    if isinstance(event, TurnEnded):
        colour = "green" if event.reason == "final" else "yellow"
        extra = f": {short(event.error, 200)}" if event.error else ""
        return style.paint(
            f"turn {event.turn} ended after {event.steps} step(s): {printable(event.reason)}{extra}",
            "bold", colour,
        )
    if isinstance(event, Warned):
        return style.paint(f"warning  {short(event.text, 200)}", "red")
    if isinstance(event, CancelRequested):
        return style.paint(f"cancel of turn {event.turn} asked", "bold", "yellow")
    if isinstance(event, SessionReleased):
        carried = f", turn {event.turn} to be carried on" if event.turn else ""
        return style.paint(f"released by its holder{carried}", "bold", "cyan")
    return _mail(event, style)


def _mail(event: MailEvent, style: Style) -> str:
    """The mailbox's events, in its own stream: who sent what to whom, and what came of it."""
    if isinstance(event, MailAgent):
        parent = f" under {printable(event.parent)}" if event.parent else ""
        worked = " has worked" if event.worked else ""
        return f"{style.paint('agent    ', 'magenta')} {printable(event.agent)}{parent}{worked}"
    return f"{style.paint('mail     ', 'magenta')} {_mail_fact(event)}"


def _mail_fact(event: MailEvent) -> str:
    if isinstance(event, MailSent):
        kind = printable(event.kind) + (f", re {printable(event.reply_to)}" if event.reply_to else "")
        body = event.body if isinstance(event.body, str) else msgspec.json.encode(
            event.body, enc_hook=enc_hook).decode()
        return (f"{printable(event.id)} {printable(event.sender)} -> {printable(event.recipient)} "
                f"({kind}): {short(body)}")
    if isinstance(event, MailDropped):
        return f"{printable(event.id)} to {printable(event.recipient)} dropped to make room"
    if isinstance(event, MailWithdrawn):
        how = "retracted" if event.retracted else "withdrawn"
        return f"{printable(event.id)} to {printable(event.recipient)} {how}"
    if isinstance(event, MailReceived):
        return f"{printable(event.recipient)} received {_ids(event.ids)}"
    if isinstance(event, MailNoticed):
        return (f"notice {printable(event.notice)} to {printable(event.recipient)}: "
                f"{_ids(event.ids)}")
    if isinstance(event, MailRead):
        return f"{printable(event.recipient)} read {_ids(event.ids)}"
    if isinstance(event, MailAnswered):
        return (f"{_ids(event.ids)} to {printable(event.recipient)} answered by "
                f"{printable(event.by)}")
    raise AssertionError(f"no line for {type(event).__name__}")  # pragma: no cover


def _ids(ids: tuple[str, ...]) -> str:
    return printable(", ".join(ids))


def _args(arguments: Any) -> str:
    return ", ".join(f"{printable(k)}={printable(json.dumps(v))}"
                     for k, v in thaw_json(arguments).items())
