"""Live sessions for the CLI: ``nous-inbox demo`` (a person talks to a working agent) and ``run``.

``demo`` starts the scripted agent on a task and plays a person who, while the agent's tools are
running, injects context, steers it and asks a followup. Every event is printed as it is recorded,
the log goes to a store (the embedded SQLite file unless ``--store`` says otherwise), and at the
end the log is read back and replayed to show it equals the live state.

The person reacts to the agent's events (the n-th tool call starting), not to a clock, so the
demo tells the same story on a fast machine and a slow one.

Output to a pipe whose reader leaves early (``nous-inbox run s --json | head -3``) stops quietly;
the run goes on to its end, so the log another terminal is steering stays whole, and the
command exits 0.
"""

from __future__ import annotations

import secrets
import sys
import threading
import time
from typing import IO, Final

import attrs

from nous_inbox.cli.pipe import is_broken_pipe, quiet_broken_pipe
from nous_inbox.cli.render import format_event
from nous_inbox.cli.style import Style
from nous_inbox.cli.terminal import printable
from nous_inbox.events import Event, ToolCalled
from nous_inbox.owner import Owner
from nous_inbox.runner import Runner
from nous_inbox.runner.scripted import ScriptedAgent
from nous_inbox.safe_json import event_json
from nous_inbox.session import replay
from nous_inbox.store import Store

__all__ = ["new_demo_session", "run_demo", "run_session"]

#: What the simulated person does, and when: as the n-th tool call starts.
PERSON: Final = (
    (1, "inject", "fyi: the deploy is frozen until 14:00"),
    (2, "steer", "the cdn.log matters most, read it next"),
    (3, "followup", "afterwards, draft a note for the on-call channel"),
)

TASK: Final = "survey the logs from this morning's incident"


@attrs.define(eq=False)
class _Printer:
    """Prints each event as one line (or JSON) the moment the owner records it.

    All of a command's output goes through ``write``, from whichever thread: the owner's worker
    (events), the demo's person, the main thread. One lock keeps lines whole. When the reader of
    a pipe leaves, the printer goes quiet for the rest of the run (``broken``) while the run
    itself finishes and its log stays complete.
    """

    out: IO[str]
    as_json: bool
    style: Style = attrs.field(init=False)
    broken: bool = attrs.field(default=False, init=False)
    tool_calls: int = attrs.field(default=0, init=False)
    tool_started: threading.Condition = attrs.field(factory=threading.Condition, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    @style.default
    def _style(self) -> Style:
        return Style(self.out)

    def write(self, text: str) -> None:
        """Write and flush ``text``, or nothing once the reader of the output has gone."""
        with self._lock:
            if self.broken:
                return
            try:
                self.out.write(text)
                self.out.flush()
            except OSError as exc:
                if not is_broken_pipe(exc):
                    raise
                self.broken = True
                quiet_broken_pipe(self.out)

    def __call__(self, event: Event) -> None:
        if not self.broken:
            self.write((event_json(event) if self.as_json else format_event(event, self.style)) + "\n")
        if isinstance(event, ToolCalled):
            with self.tool_started:
                self.tool_calls += 1
                self.tool_started.notify_all()

    def wait_tool(self, n: int, timeout: float) -> bool:
        with self.tool_started:
            return self.tool_started.wait_for(lambda: self.tool_calls >= n, timeout)


def _person(owner: Owner, printer: _Printer, as_json: bool) -> None:
    style = printer.style
    for n, mode, text in PERSON:
        if not printer.wait_tool(n, timeout=60):
            return
        if not as_json:
            printer.write(style.paint(f"        person > {mode}: {text}", "magenta") + "\n")
        getattr(owner, mode)(text)


def new_demo_session(store: Store) -> str:
    """A session name no log in ``store`` has yet: the time, then random digits, so two demos
    started in the same second each get their own.

    >>> from nous_inbox.store import open_store
    >>> new_demo_session(open_store("memory:")).startswith("demo-")
    True
    """
    while True:
        session = time.strftime("demo-%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        if store.version(session) == 0:
            return session


def run_demo(
    store: Store, url: str, out: IO[str], *, step_seconds: float, as_json: bool,
    default: bool = False,
) -> int:
    """Play the demo on ``store``; returns 0 when the replayed log equals the live state.

    The first lines say which session and store the log went to (on stderr with ``as_json``);
    ``default`` says the store is the default one, which the person did not choose.
    """
    session = new_demo_session(store)
    agent = ScriptedAgent(steps=4, step_seconds=step_seconds)
    printer = _Printer(out, as_json)
    style, write = printer.style, printer.write
    url = str(getattr(store, "url", url))  # the store's own, any password hidden
    where = f"session {session!r} in {printable(url)}"
    if default:
        where += " (the default store; --store URL picks another)"
    if as_json:  # stdout is the events alone; where they went is said on stderr
        sys.stderr.write(f"nous-inbox demo: {where}\n")
    else:
        write(style.paint("nous-inbox demo", "bold") + ": a person talks to an agent while it works\n")
        write(f"  {where}\n")
        write("  The agent reads logs, one tool call per step. While a tool runs, the person\n")
        write("  injects context, steers, and asks a followup; watch where each one lands.\n\n")
        write(style.paint(f"        person > prompt: {TASK}", "magenta") + "\n")
    with Owner(store, session, Runner(agent, agent.tools, max_steps=12), listen=printer) as owner:
        person = threading.Thread(target=_person, args=(owner, printer, as_json), daemon=True)
        person.start()
        owner.prompt(TASK)
        person.join(timeout=120)
        while not owner.wait_idle(timeout=120):
            pass
        live = owner.session
    replayed = replay(store.read(session), stream=session)
    if as_json:
        return 0 if replayed == live else 1
    write("\n")
    if replayed != live:
        write(style.paint("replay differs from the live state", "red", "bold") + "\n")
        return 1
    write(style.paint("replayed", "green", "bold"))
    write(
        f" {replayed.version} events from the store: inbox, transcript and turns equal the live "
        f"state ({len(replayed.transcript)} transcript entries, "
        f"{replayed.inbox.count()} message(s) still queued).\n"
    )
    if url == "memory:":
        write("  The memory: store ends with this command; --store sqlite:PATH keeps the log.\n")
    else:
        write(f"  See it again: nous-inbox log --store {printable(url)} {session}\n")
    return 0


def run_session(
    store: Store, session: str, out: IO[str], *, task: str, steps: int, step_seconds: float,
    as_json: bool,
) -> int:
    """Run the scripted agent on ``session`` until it is idle, printing events as they happen."""
    agent = ScriptedAgent(steps=steps, step_seconds=step_seconds)
    printer = _Printer(out, as_json)
    with Owner(store, session, Runner(agent, agent.tools, max_steps=steps * 2 + 4),
               listen=printer) as owner:
        owner.prompt(task)
        try:
            while not owner.wait_idle(timeout=1):
                pass
        except KeyboardInterrupt:
            owner.cancel()
            owner.wait_idle(timeout=30)
            raise
    return 0
