"""One turn's bridge between a running graph and a session port: the loop's bookkeeping.

The adapter decides nothing of its own: at each of the graph's boundaries its hooks
(:mod:`~nous_inbox.adapters.langgraph.hooks`) tell the loop (:mod:`nous_inbox.loop`) what the
graph did, as happenings, and carry out what the loop says. :class:`TurnBridge` keeps the loop's
state for one turn, records each boundary in one append where the port can (ruling 6: a claim is
recorded with the request it joins), and answers what the next request must carry.

>>> from nous_inbox.loop import new_state
>>> from nous_inbox.runner.port import LocalSession
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> bridge = TurnBridge(local, new_state(added_only=True))
>>> [m.content for m in bridge.open("wake")], [type(e).__name__ for e in bridge.take()]
(['hello'], ['TurnStarted', 'QueueClaimed', 'StepStarted', 'ModelRequested'])
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
from pyrsistent import pvector

from nous_inbox.commands import CallModel, Claim
from nous_inbox.events import Event, Nudged, ToolReturned, TurnEnded, Warned
from nous_inbox.frozen import freeze_json
from nous_inbox.happenings import (
    Cancelled,
    ClaimAnswered,
    Failed,
    Happening,
    ToolsFinished,
    TurnOpened,
    cancelled_result,
    interrupted_result,
    open_calls,
)
from nous_inbox.loop import Advance, LoopState, Phase, advance
from nous_inbox.message import Message
from nous_inbox.runner.port import ClaimGuard, JournalPort, SessionPort
from nous_inbox.session import Session
from nous_inbox.store.journal import claim_event

__all__ = ["CLAIMS", "TurnBridge"]

logger: Final = logging.getLogger("nous_inbox.adapters.langgraph")

CLAIMS: Final = object()
"""A boundary part: make the claims the loop asks for now, until it asks for something else."""

Part = Event | Happening | object
"""What a boundary records, in order: an event as given, a happening the loop advances by (its
events recorded), or :data:`CLAIMS`."""

def _walk(adv: Advance, parts: Sequence[Part], claim: Callable[[Claim], Sequence[Message]],
          emit: Callable[[Any], None]) -> tuple[Advance, list[Message]]:
    """Advance the loop through ``parts``, emitting every event in order, and at
    :data:`CLAIMS` making each claim the loop asks for. Returns where the loop stands and what
    the next request must carry that the graph does not hold yet (the claimed messages and the
    loop's own nudge), in order."""
    deliver: list[Message] = []
    for part in parts:
        if isinstance(part, Happening):
            if adv.state.phase is not Phase.ENDED:
                adv = advance(adv.state, part)
                for event in adv.events:
                    emit(event)
            continue
        if part is not CLAIMS:
            emit(part)
            continue
        while isinstance(adv.command, Claim):
            command = adv.command
            messages = claim(command)
            deliver.extend(messages)
            adv = advance(adv.state, ClaimAnswered(command.target, messages))
            for event in adv.events:
                emit(event)
                if type(event) is Nudged:
                    deliver.append(event.message)
    return adv, deliver


class TurnBridge:
    """The loop's state for one turn over ``port``, and the one way a boundary is recorded.

    ``start`` is the loop's starting state (the runner's budget); ``recorded`` holds the events
    recorded and not yet handed to the turn's reader (:meth:`take`); ``usage`` sums the token
    counts the model reported; ``output`` is the run's structured answer, when it has one.
    """

    def __init__(self, port: SessionPort, start: LoopState) -> None:
        self.port = port
        self.start = start
        self.adv = Advance(start, CallModel(pvector()), ())
        self.claims = ClaimGuard(port)
        self.recorded: list[Event] = []
        self.usage: dict[str, int | float] = {}
        self.output: Any = None
        #: How many transcript entries came before this turn: what a graph's thread holds.
        self.prior = 0

    def phase(self) -> Phase:
        """Where the loop stands."""
        return self.adv.state.phase

    def open(self, reason: str) -> list[Message]:
        """The turn's opening: ``TurnStarted``, the answers to calls an earlier turn left open
        (the model must see every call answered), then the loop's claims. Returns what the
        first request shows, the whole transcript, or ``[]`` when the loop ended the turn."""
        session = self.port.session
        answers = [interrupted_result(call, "the run stopped")
                   for call in open_calls(session.transcript)]
        turn = session.turn + 1
        self.prior = len(session.transcript)
        opened = advance(self.start, TurnOpened(turn, reason, [*session.transcript, *answers]))
        self.adv = opened._replace(events=())
        self.write(*opened.events, *(ToolReturned(turn=turn, step=0, message=m) for m in answers),
                   CLAIMS)
        command = self.adv.command
        return list(command.transcript) if type(command) is CallModel else []

    def write(self, *parts: Part) -> list[Message]:
        """Record a boundary: one atomic append when the port is a journal (worked out again
        from the new session if another writer appended first), one port call each otherwise.
        Returns what the next request must carry."""
        before = len(self.recorded)
        if isinstance(self.port, JournalPort):
            if getattr(self.port, "heard", False) and any(p is CLAIMS for p in parts):
                self._reaching(parts)
            limit_of = getattr(self.port, "claim_limit", None)  # an owner's: a turn per options

            def boundary(session: Session) -> tuple[list[Event], tuple[Advance, list[Message]]]:
                events: list[Event] = []
                inbox = session.inbox

                def claim(command: Claim) -> Sequence[Message]:
                    nonlocal inbox
                    messages, event, inbox = claim_event(
                        inbox, command.target, wake_only=command.wake_only,
                        limit=None if limit_of is None else limit_of(command.target))
                    if event is not None:
                        events.append(event)
                    return messages

                return events, _walk(self.adv, parts, claim,
                                     lambda event: events.append(self._finished(event)))

            stored, walked = self.port.commit(boundary)
            self.recorded.extend(stored)
        else:
            def claim(command: Claim) -> Sequence[Message]:
                messages, events = self.claims.claim(command.target, wake_only=command.wake_only)
                self.recorded.extend(events)
                return messages

            walked = _walk(self.adv, parts, claim,
                           lambda event: self.recorded.extend(self.port.record([self._finished(event)])))
        self.adv, deliver = walked
        for event in self.recorded[before:]:
            if isinstance(event, Warned) and event is not self.claims.warning:
                logger.warning(event.text)  # the loop's budget warning: a log line too
        return deliver

    def _finished(self, event: Any) -> Any:
        """A turn's end with what the run reported: its structured output and its usage."""
        if type(event) is not TurnEnded or (self.output is None and not self.usage):
            return event
        output = None if self.output is None else freeze_json(self.output, "the run's output")
        return msgspec.structs.replace(event, output=output, usage=dict(self.usage) or None)

    def _reaching(self, parts: Sequence[Part]) -> None:
        """Tell the owner's boundary subscribers of each claim this boundary will make, before
        the one commit that makes them (a send of theirs must not land inside that commit)."""
        reaching = self.port.reaching  # type: ignore[attr-defined]
        claims: list[Claim] = []

        def claim(command: Claim) -> Sequence[Message]:
            claims.append(command)
            return ()

        _walk(self.adv, parts, claim, lambda event: None)
        for command in claims:
            reaching(command.target, self.adv.state.turn, wake_only=command.wake_only)

    def add_usage(self, counts: Any) -> None:
        """Add a reply's token counts (LangChain's ``usage_metadata``) to the turn's usage."""
        if not isinstance(counts, dict):
            return
        for name, value in counts.items():
            if type(value) in (int, float) and value:
                self.usage[name] = self.usage.get(name, 0) + value

    def close(self, ending: Cancelled | Failed, results: Sequence[Message] = (),
              stopped: bool = False) -> list[Message]:
        """End the turn, unless the loop ended it. The tool ``results`` the graph holds are
        recorded first; every call still open is answered as interrupted when the run was
        ``stopped`` inside the graph (a tool may have started), else as cancelled, as the
        built-in runner does (ruling 9); nothing is claimed. Returns those answers, for the
        graph's own state."""
        if self.phase() is Phase.ENDED:
            return []
        parts: list[Part] = []
        answers: list[Message] = []
        if self.phase() is Phase.TOOLS:
            by_id = {m.tool_call_id: m for m in results}
            why = "the turn was cancelled" if type(ending) is Cancelled else "the run failed"
            finished: list[Message] = []
            for call in self.adv.state.calls:
                answer = by_id.pop(call.id, None)
                if answer is None:
                    answer = interrupted_result(call, why) if stopped else cancelled_result(call)
                    answers.append(answer)
                finished.append(answer)
            parts.append(ToolsFinished(finished))
        self.write(*parts, ending)
        return answers

    def take(self) -> list[Event]:
        """The events recorded since the last take, in order."""
        taken, self.recorded = self.recorded, []
        return taken
