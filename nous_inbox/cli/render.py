"""One readable line per event, for ``nous-inbox log``, ``run`` and ``demo``.

The same events a store holds and replay folds are what a person watches scroll by; this module
only decides how each one reads on a terminal.
"""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from nous_inbox.cli.style import Style
from nous_inbox.events import (
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
from nous_inbox.message import enc_hook, thaw_json

__all__ = ["event_json", "format_event", "short"]

_SEND_MODE = {
    ("next_step", True): "steer",
    ("next_step", False): "inject",
    ("next_turn", True): "followup",
    ("next_turn", False): "send(next_turn, no wake)",
}


def short(text: str, limit: int = 100) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis.

    >>> short("a\\nb" + "c" * 200, 10)
    'a bcccccc…'
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def event_json(event: Event) -> str:
    """The event as one line of JSON (the JSON Lines log form)."""
    return msgspec.json.encode(event, enc_hook=enc_hook).decode()


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
        return style.paint(f"claimed   {event.count} from {event.target}", "green")
    if isinstance(event, TurnStarted):
        return style.paint(f"turn {event.turn} opened ({event.reason})", "bold", "cyan")
    if isinstance(event, StepStarted):
        return style.paint(f"  step {event.step}", "cyan")
    if isinstance(event, ModelRequested):
        return style.paint(f"  model    asked with {event.messages} messages", "dim")
    if isinstance(event, ModelReplied):
        message = event.message
        calls = ", ".join(f"{c.name}({_args(c.arguments)})" for c in message.tool_calls)
        text = short(message.content) if message.content.strip() else ""
        parts = [p for p in (text, f"calls {calls}" if calls else "") if p]
        return f"  {style.paint('model', 'blue')}    {' · '.join(parts) or style.paint('(empty reply)', 'yellow')}"
    if isinstance(event, ToolCalled):
        return f"  {style.paint('tool', 'yellow')}     {event.call.name}({_args(event.call.arguments)}) …"
    if isinstance(event, ToolReturned):
        return f"  {style.paint('tool', 'yellow')}     -> {short(event.message.content, 80)}"
    if isinstance(event, StepEnded):
        return style.paint(f"  step {event.step} ended", "dim")
    if isinstance(event, Nudged):
        return style.paint(f"  nudge    {short(event.message.content)}", "dim")
    if isinstance(event, TurnEnded):
        colour = "green" if event.reason == "final" else "yellow"
        extra = f": {event.error}" if event.error else ""
        return style.paint(
            f"turn {event.turn} ended after {event.steps} step(s): {event.reason}{extra}", "bold", colour
        )
    if isinstance(event, Warned):
        return style.paint(f"warning  {event.text}", "red")
    return repr(event)  # an event type added later still prints


def _args(arguments: Any) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in thaw_json(arguments).items())
