"""``nous-inbox tour``: a terminal walkthrough of the inbox value's semantics.

Each scene performs real operations on an ``Inbox`` and prints what a reader needs to see: which
queue a message went to, whether it asks for a wake, and what a claim at each boundary takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from nous_inbox.cli.style import Style
from nous_inbox.inbox import Inbox

__all__ = ["run_tour"]


def _show(inbox: Inbox, out: IO[str], style: Style) -> None:
    for target in ("next_turn", "next_step"):
        entries = inbox.entries(target)
        shown = ", ".join(
            f"{m.content!r}{style.paint(' (wakes)', 'yellow') if wake else ''}" for m, wake in entries
        )
        out.write(f"    {target:<9}  [{shown}]\n")
    wake = style.paint("yes", "green") if inbox.wants_wake() else style.paint("no", "dim")
    out.write(f"    wants_wake -> {wake}\n")


def run_tour(out: IO[str]) -> int:
    """Print the walkthrough to ``out``; returns the exit status (0)."""
    style = Style(out)

    def scene(title: str) -> None:
        out.write("\n" + style.paint(f"== {title}", "bold", "cyan") + "\n")

    def say(text: str) -> None:
        out.write(f"  {text}\n")

    out.write(style.paint("nous-inbox tour", "bold") + ": talking to an agent while it works\n")
    say("A running agent claims its inbox at two boundaries: next_turn when a turn opens,")
    say("next_step right before every model request. Nothing else enters a run.")

    scene("1. inject is inert on an idle agent")
    inbox = Inbox().inject("fyi: the deploy is frozen")
    say('inbox = Inbox().inject("fyi: the deploy is frozen")')
    _show(inbox, out, style)
    say("An injection waits for a request the agent makes anyway; it wakes nothing.")

    scene("2. steer wakes it, and the injection rides along")
    inbox = inbox.steer("stop and summarize the staging log")
    say('inbox = inbox.steer("stop and summarize the staging log")')
    _show(inbox, out, style)
    claimed, inbox = inbox.claim("next_step")
    say('claimed, inbox = inbox.claim("next_step")   # the next model request')
    for message in claimed:
        say(f"    -> {message.role}: {message.content}")
    _show(inbox, out, style)

    scene("3. followup waits for a new turn")
    inbox = Inbox().followup("afterwards, open a ticket").steer("use the EU region")
    say('inbox = Inbox().followup("afterwards, open a ticket").steer("use the EU region")')
    _show(inbox, out, style)
    say("A turn opens: next_turn is claimed first, then next_step at the first step.")
    for target in ("next_turn", "next_step"):
        claimed, inbox = inbox.claim(target)
        say(f'claim("{target}") -> {[m.content for m in claimed]}')
    _show(inbox, out, style)

    scene("4. the wake intent belongs to each entry")
    inbox = Inbox().followup("then tell me").inject("context")
    claimed, drained = inbox.claim("next_step")
    say('Inbox().followup("then tell me").inject("context"), then claim("next_step")')
    _show(drained, out, style)
    say("Draining next_step did not clear the wake: the followup still owes a turn.")

    scene("5. values, not objects")
    before = Inbox().steer("a")
    after = before.steer("b")
    say(f"before.count() = {before.count()}, after.count() = {after.count()}: old values stay usable")
    say(f"Inbox().steer('a') == before -> {Inbox().steer('a') == before}")
    restored = Inbox.from_json(after.to_json())
    say(f"Inbox.from_json(after.to_json()) == after -> {restored == after}")
    say(f"to_json(): {after.to_json().decode()}")

    scene("6. bad input is refused, and nothing changes")
    attempts: tuple[tuple[str, Callable[[], object]], ...] = (
        ('send("hi", "later", True)', lambda: before.send("hi", "later", True)),
        ('send(42, "next_step", True)', lambda: before.send(42, "next_step", True)),  # type: ignore[arg-type]
        ('send("hi", "next_step", 1)', lambda: before.send("hi", "next_step", 1)),  # type: ignore[arg-type]
    )
    for label, attempt in attempts:
        try:
            attempt()
        except (TypeError, ValueError) as exc:
            say(f"{label}: {style.paint(type(exc).__name__, 'red')}: {exc}")
    say(f"before is still {before!r}")
    out.write("\n")
    return 0
