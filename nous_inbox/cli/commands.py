"""The ``nous-inbox`` subcommands: each takes the parsed arguments and an output stream.

They are thin on purpose: open a store, append or replay, print. All the semantics live below.
``show``, ``log`` and ``sessions`` only read, so they open the store read-only: a store that is
not there is an error naming the path, never an empty file created by a typo.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from typing import IO, Any, Final

from nous_inbox.cli.live import run_demo, run_session
from nous_inbox.cli.progress import with_progress
from nous_inbox.cli.render import format_event
from nous_inbox.cli.style import Style
from nous_inbox.cli.terminal import printable
from nous_inbox.cli.text import message_text
from nous_inbox.cli.tour import run_tour
from nous_inbox.cli.usage import UsageError
from nous_inbox.errors import StoreError, StreamOwnedError
from nous_inbox.events import Event
from nous_inbox.frozen import thaw_json
from nous_inbox.message import Message
from nous_inbox.owner.port import request_cancel
from nous_inbox.owner.receipts import receipt_in, request_withdraw
from nous_inbox.receipts import Deliveries, Receipt
from nous_inbox.runner.scripted import MAX_STEPS
from nous_inbox.safe_json import event_json, json_safe
from nous_inbox.session import Session
from nous_inbox.store import Store, default_store_url, open_store
from nous_inbox.store.journal import send_to
from nous_inbox.store.snapshot import load_session, save_snapshot
from nous_inbox.verbs import as_verb

__all__ = [
    "FOLLOW_POLL_SECONDS", "MAX_STEP_SECONDS", "cancel", "demo", "log", "rm", "run", "send", "sessions",
    "show", "snapshot", "tour", "withdraw",
]

#: How often ``log --follow`` looks for new events.
FOLLOW_POLL_SECONDS: Final = 0.2


def _open(args: argparse.Namespace, *, read_only: bool = False) -> Store:
    # Commands that only look open read-only: a mistyped --store is "no store at PATH", not a
    # fresh empty store quietly created where the typo points.
    return open_store(args.store or default_store_url(), read_only=read_only)


def _replayed(store: Store, session: str) -> Session:
    total = store.version(session)
    if total == 0:
        raise _no_session(session)
    # From the session's snapshot when it has a usable one (the same value, sooner).
    return load_session(_WithProgress(store, total), session).session


class _WithProgress:
    """A store whose reads draw a progress bar (what ``load_session`` replays is counted)."""

    def __init__(self, store: Store, total: int) -> None:
        self._store = store
        self._total = total

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        return with_progress(self._store.read(stream, after), self._total - after, "replaying")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


#: The longest a scripted tool step may take: more is a typo, and would outlast the demo's waits.
MAX_STEP_SECONDS: Final = 60.0


def _check_step_seconds(value: float) -> float:
    # float() accepts "nan" and "inf", and NaN slips past every comparison, so ask isfinite first.
    if not math.isfinite(value) or not 0 <= value <= MAX_STEP_SECONDS:
        raise UsageError(
            f"--step-seconds must be a number of seconds from 0 to {MAX_STEP_SECONDS:g}, got {value}"
        )
    return value


def demo(args: argparse.Namespace, out: IO[str]) -> int:
    """A live scripted session: a person steers an agent while it works; the log replays equal."""
    _check_step_seconds(args.step_seconds)
    url = args.store or default_store_url()
    with open_store(url) as store:
        return run_demo(store, url, out, step_seconds=args.step_seconds, as_json=args.json,
                        default=args.store is None)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    """Run the scripted agent on a session so another terminal can steer it."""
    if not 1 <= args.steps <= MAX_STEPS:
        raise UsageError(f"--steps must be from 1 to {MAX_STEPS}, got {args.steps}")
    _check_step_seconds(args.step_seconds)
    with _open(args) as store:
        return run_session(
            store, args.session, out, task=args.task, steps=args.steps,
            step_seconds=args.step_seconds, as_json=args.json,
        )


def tour(args: argparse.Namespace, out: IO[str]) -> int:
    """Walk through the inbox value's semantics."""
    return run_tour(out)


_LISTS: Final = "`nous-inbox sessions` lists the ones there are"


def _no_session(session: str, hint: str = _LISTS) -> ValueError:
    return ValueError(f"no session {session!r} in this store ({hint})")


def _check_exists(args: argparse.Namespace, hint: str = _LISTS) -> None:
    """Refuse a session with no events; read-only, so a mistyped ``--store`` creates nothing."""
    with _open(args, read_only=True) as store:
        if store.version(args.session) == 0:
            raise _no_session(args.session, hint)


def send(args: argparse.Namespace, out: IO[str]) -> int:
    """Append one send, with the verb the command names (:data:`~nous_inbox.verbs.VERBS`), to a
    session's log.

    A session with no events is refused unless ``--create``: a mistyped name must not quietly
    start a log nobody runs. The check opens the store read-only, so a mistyped ``--store``
    creates nothing either.
    """
    verb = as_verb(args.command, "command")
    if args.timeout is not None and (not args.wait or not math.isfinite(args.timeout)
                                     or args.timeout < 0):
        raise UsageError(f"--timeout must be a number of seconds >= 0 given with --wait, got "
                         f"{args.timeout}")
    stdin = sys.stdin.buffer if sys.stdin is not None else None  # None: started without one
    text = message_text(args.file, args.text, stdin)
    if not args.create:
        try:
            _check_exists(args, "nothing was sent; --create sends anyway and starts its log")
        except StoreError as exc:
            raise StoreError(f"{exc}; nothing was sent (--create starts the store)") from None
    with _open(args) as store:
        # The log has one form for a prompt and a followup: a prompt is a turn of its own only
        # for an owner that takes it from its own verb.
        stored = send_to(store, args.session, text, verb.target, verb.wakeup)
        out.write(f"{args.command} queued for {args.session!r} as event #{stored.seq}\n")
        if not args.wait:
            return 0
        out.flush()
        found = _delivered(store, args.session, stored.seq, args.timeout)
    out.write(f"{found}\n")
    return 0 if found.state == "claimed" else 1


def _delivered(store: Store, stream: str, sent: int, timeout: float | None) -> Receipt:
    """Wait until the send at ``sent`` is claimed or withdrawn (polling the store's version, as
    ``log --follow`` does), folding only what is new; its receipt, or the one saying it is still
    queued once ``timeout`` seconds passed. Ctrl-C stops the wait, not the message."""
    opened = load_session(store, stream).session
    deliveries = Deliveries(opened)
    if deliveries.queued(sent) is None:  # settled before the wait began: the log says where
        return receipt_in(store, stream, sent)
    deadline = None if timeout is None else time.monotonic() + timeout
    after = opened.version
    while True:
        events = list(store.read(stream, after))
        for found in deliveries.fold(events):
            if found.sent == sent:
                return found
        after = events[-1].seq if events else after
        if deadline is not None and time.monotonic() >= deadline:
            queued = deliveries.queued(sent)
            assert queued is not None
            return queued
        while store.version(stream) <= after and (
                deadline is None or time.monotonic() < deadline):
            time.sleep(FOLLOW_POLL_SECONDS)


def withdraw(args: argparse.Namespace, out: IO[str]) -> int:
    """Take back a message no run has claimed yet, by the event # its send was queued as: its
    owner, in whichever process, folds the ``MessageWithdrawn`` in and the message never
    reaches the model. A message already claimed answers which turn and step took it (status
    1: it was not withdrawn); one withdrawn already says so (status 0)."""
    _check_exists(args)
    with _open(args) as store:
        found = request_withdraw(store, args.session, args.seq)
    out.write((json.dumps(found.to_dict()) if args.json else str(found)) + "\n")
    return 0 if found.state == "withdrawn" else 1


def _entry_dict(message: Message, wakeup: bool) -> dict[str, Any]:
    entry: dict[str, Any] = thaw_json(message.to_dict())
    entry["wakeup"] = wakeup
    return entry


def show(args: argparse.Namespace, out: IO[str]) -> int:
    """Print the replayed inbox of a session."""
    with _open(args, read_only=True) as store:
        session = _replayed(store, args.session)
    inbox = session.inbox
    if args.json:
        document = {
            target: [_entry_dict(m, w) for m, w in inbox.entries(target)]
            for target in ("next_turn", "next_step")
        }
        document["wants_wake"] = inbox.wants_wake()  # type: ignore[assignment]
        document["transcript_length"] = len(session.transcript)  # type: ignore[assignment]
        document["version"] = session.version  # type: ignore[assignment]
        out.write(json_safe(json.dumps(document, ensure_ascii=False)) + "\n")
        return 0
    style = Style(out)
    out.write(style.paint(f"session {args.session!r}", "bold") + f" at event #{session.version}, ")
    out.write(f"{len(session.transcript)} message(s) in the transcript, ")
    out.write(("a turn is open" if session.running else "idle") + "\n")
    for target in ("next_turn", "next_step"):
        entries = inbox.entries(target)
        out.write(style.paint(f"{target} ({len(entries)})", "cyan") + "\n")
        for message, wake in entries:
            flag = style.paint(" [wakes]", "yellow") if wake else ""
            out.write(f"  {message.role}: {printable(message.content)}{flag}\n")
    out.write(f"wants_wake: {'yes' if inbox.wants_wake() else 'no'}\n")
    return 0


def _check_log_range(args: argparse.Namespace) -> None:
    if args.after < 0:
        raise UsageError(f"--after must be a seq >= 0, got {args.after}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")


def log(args: argparse.Namespace, out: IO[str]) -> int:
    """Print a session's events, one per line (JSON Lines with ``--json``).

    ``--after SEQ`` starts after event #SEQ, so a reader that stopped can resume where it was;
    ``--follow`` then waits for new events (polling the store's version, which every store keeps
    cheap) until Ctrl-C, which ends it with status 0; ``--limit N`` stops after N events. A
    followed session whose log shrinks was deleted: that ends it with status 1, rather than
    wait forever or, once a log of that name grows again, go on from the old log's place.
    """
    _check_log_range(args)
    style = Style(out)
    printed = 0
    try:
        with _open(args, read_only=True) as store:
            total = store.version(args.session)
            if total == 0:
                raise _no_session(args.session)
            after = args.after
            while True:
                events = store.read(args.session, after)
                if not args.follow:
                    events = with_progress(events, total - after, "reading")
                for event in events:
                    out.write((event_json(event) if args.json else format_event(event, style)) + "\n")
                    after = event.seq
                    printed += 1
                    if printed == args.limit:
                        return 0
                if not args.follow:
                    return 0
                out.flush()
                if printed:  # the log holds at least what was printed (--after may be beyond)
                    total = max(total, after)
                while (version := store.version(args.session)) <= after:
                    if version < total:
                        raise ValueError(f"session {args.session!r} was deleted while it was "
                                         f"followed (its log went from {total} to {version} events)")
                    time.sleep(FOLLOW_POLL_SECONDS)
    except KeyboardInterrupt:
        if args.follow:
            return 0  # the way out of --follow, not a failure
        raise


def sessions(args: argparse.Namespace, out: IO[str]) -> int:
    """List the sessions in the store with their event counts (JSON Lines with ``--json``)."""
    with _open(args, read_only=True) as store:
        for name in store.streams():
            if args.json:
                line = json.dumps({"session": name, "events": store.version(name)},
                                  ensure_ascii=False)
                out.write(json_safe(line) + "\n")
            else:
                out.write(f"{printable(name)}\t{store.version(name)} events\n")
    return 0


def cancel(args: argparse.Namespace, out: IO[str]) -> int:
    """Record a cancel of a session's open turn; its owner, in whichever process, ends the turn
    at its next boundary and wakes nothing after it (ruling 9).

    Status 0 when the session exists, with a line saying whether a request was recorded: none
    is when no turn is open (idle, or between two turns: ask again) or one was asked already.
    A session with no events is refused (status 1), as for a send.
    """
    _check_exists(args)
    with _open(args) as store:
        request = request_cancel(store, args.session)
        session = load_session(store, args.session).session if request is None else None
    name = printable(args.session)
    if session is not None:
        why = (f"the cancel of turn {session.turn} was asked already" if session.cancelling
               else "no turn is open")
        out.write(f"nothing to cancel in {name!r}: {why}; nothing recorded\n")
    elif request is not None:
        out.write(f"cancel of turn {request.turn} of {name!r} recorded as event #{request.seq}; "
                  f"its owner ends the turn at its next boundary\n")
    return 0


def _confirmed(question: str) -> bool:
    """Ask ``question`` on the terminal; only an answer of y or yes is a yes."""
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def rm(args: argparse.Namespace, out: IO[str]) -> int:
    """Delete a session's log, after asking on the terminal (``--yes`` asks nothing).

    Refused while an owner holds the session: the command takes the session's owner lease
    itself and keeps it while it asks and deletes, so no owner can start on the log it removes.
    Without ``--yes`` a stdin that is not a terminal is refused rather than read as an answer:
    a script must say it means it.
    """
    if not args.yes and (sys.stdin is None or not sys.stdin.isatty()):
        raise UsageError(
            f"rm asks before deleting {args.session!r}, but stdin is not a terminal: add --yes to "
            f"delete without asking"
        )
    _check_exists(args)
    with _open(args) as store:
        try:
            lease = store.own(args.session)
        except StreamOwnedError as exc:
            raise ValueError(
                f"session {args.session!r} is in use ({exc}): stop its owner first; nothing was "
                f"deleted"
            ) from None
        with lease:
            events = store.version(args.session)
            if not args.yes and not _confirmed(
                f"delete session {printable(args.session)!r} ({events} events) from {store!r}?"
            ):
                sys.stderr.write(f"nous-inbox rm: {printable(args.session)!r} kept\n")
                return 1
            store.delete(args.session)
    out.write(f"deleted session {printable(args.session)!r} ({events} events)\n")
    return 0


def snapshot(args: argparse.Namespace, out: IO[str]) -> int:
    """Save a snapshot of a session now (see :mod:`nous_inbox.store.snapshot`): opening it afterwards
    decodes the snapshot and replays only what came after."""
    _check_exists(args)
    with _open(args) as store:
        opened = load_session(store, args.session)
        if not save_snapshot(store, args.session, opened.session):
            load = getattr(store, "load_snapshot", None)
            kept = load(args.session) if callable(load) else None
            if kept is None or kept[0] <= opened.session.version:
                # (a file: store's save also skips while another holds its snapshot directory)
                raise ValueError(f"{store!r} saved no snapshot: it keeps none, or another save "
                                 f"was under way (then try again)")
            # an owner appended and saved meanwhile: its newer snapshot stays
            out.write(f"{printable(args.session)}: a newer snapshot (seq {kept[0]}) is kept "
                      f"already; nothing saved\n")
            return 0
        out.write(f"{printable(args.session)}: snapshot saved at seq {opened.session.version} "
                  f"(the open replayed {opened.replayed} events)\n")
    return 0
