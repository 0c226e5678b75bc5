"""One readable line per event, for ``nous-inbox log``, ``run`` and ``demo``.

The same events a store holds and replay folds are what a person watches scroll by; this module
only decides how each one reads on a terminal.

Text that came from a message, a model or a tool is shown through ``printable``: a message could
otherwise carry terminal escape sequences that move the cursor, recolour or retitle the reader's
terminal, or bidi overrides that reorder what a line seems to say (see
``nous_inbox.cli.terminal``). ``event_json`` escapes what JSON encoders leave raw (DEL, C1 and
bidi controls) as ``\\u`` escapes, so ``--json`` output still decodes to the exact log.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

import msgspec

from nous_inbox.cli.style import Style
from nous_inbox.cli.terminal import json_safe, printable
from nous_inbox.events import (
    CancelRequested,
    Event,
    MessageSent,
    ModelReplied,
    ModelRequested,
    Nudged,
    QueueClaimed,
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

__all__ = ["FINAL_LIMIT", "LIMIT", "event_json", "format_event", "short"]

#: How much of a message one event line shows; a final answer (no tool calls) gets more room,
#: since it is what the run was for (the demo's summary runs to some 400 characters).
LIMIT: Final = 100
FINAL_LIMIT: Final = 500

_SEND_MODE = {
    ("next_step", True): "steer",
    ("next_step", False): "inject",
    ("next_turn", True): "followup",
    ("next_turn", False): "send(next_turn, no wake)",
}


def short(text: str, limit: int = LIMIT) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis; safe to print.

    >>> short("a\\nb" + "c" * 200, 10)
    'a bcccccc…'
    >>> short("red \\x1b[31mtext")
    'red \\\\x1b[31mtext'
    """
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def event_json(event: Event) -> str:
    """The event as one line of JSON (the JSON Lines log form), safe to print on a terminal.

    >>> from nous_inbox.message import Message
    >>> line = event_json(MessageSent(target="next_step", wakeup=False,
    ...                               message=Message.user("\\x9b2J")))
    >>> "\\x9b" in line, "\\\\u009b2J" in line
    (False, True)
    """
    return json_safe(msgspec.json.encode(event, enc_hook=enc_hook).decode())


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
        mode = _SEND_MODE[(str(event.target), event.wakeup)]
        return f"{style.paint(f'{mode:<9}', 'magenta', 'bold')} {event.message.role}: {short(event.message.content)}"
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
    return repr(event)  # an event type added later still prints


def _args(arguments: Any) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in thaw_json(arguments).items())
