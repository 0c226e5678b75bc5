"""The bridge every framework adapter shares: one turn's bookkeeping between a run and a port.

An adapter decides nothing of its own. At each of its framework's boundaries it tells the loop
(:mod:`nous_inbox.loop`) what the framework did, as happenings, and carries out what the loop
says. :class:`TurnBridge` is where that happens, the same for every framework: it keeps the
loop's state for one turn, records each boundary in one append where the port can (ruling 6: a
claim is recorded with the request it joins), answers what the next request must carry, answers
the calls a run left open as cancelled or interrupted (ruling 9), and logs the loop's budget
warning. What stays in an adapter is the translation to and from its framework's types.

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
import math
from collections.abc import Callable, Collection, Mapping, Sequence
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
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner.guard import ClaimGuard, describe_error
from nous_inbox.runner.port import JournalPort, SessionPort
from nous_inbox.runner.tracing import turn_trace
from nous_inbox.session import Session
from nous_inbox.store.journal import claim_event

__all__ = ["CLAIMS", "Part", "TurnBridge", "numeric_counts", "stop_cause"]

logger: Final = logging.getLogger("nous_inbox.adapters")

CLAIMS: Final = object()
"""A boundary part: make the claims the loop asks for now, until it asks for something else."""

Part = Event | Happening | object
"""What a boundary records, in order: an event as given, a happening the loop advances by (its
events recorded), or :data:`CLAIMS`."""


def _walk(adv: Advance, parts: Sequence[Part], claim: Callable[[Claim], Sequence[Message]],
          emit: Callable[[Any, LoopState], None]) -> tuple[Advance, list[Message]]:
    """Advance the loop through ``parts``, emitting every event in order with the state the
    walk has reached when it is emitted (a turn's end reads its final reply there), and at
    :data:`CLAIMS` making each claim the loop asks for with ``claim``. What is claimed, and
    whether the run goes on, is the loop's table; this only carries it out. Returns where the
    loop stands and what the next request must carry that the framework does not put there
    itself (the claimed messages and the loop's own nudge), in order."""
    deliver: list[Message] = []
    for part in parts:
        if isinstance(part, Happening):
            if adv.state.phase is not Phase.ENDED:
                adv = advance(adv.state, part)
                for event in adv.events:
                    emit(event, adv.state)
            continue
        if part is not CLAIMS:
            emit(part, adv.state)
            continue
        while isinstance(adv.command, Claim):
            command = adv.command
            messages = claim(command)
            deliver.extend(messages)
            adv = advance(adv.state, ClaimAnswered(command.target, messages))
            for event in adv.events:
                emit(event, adv.state)
                if type(event) is Nudged:  # the loop's own nudge: the framework has not shown it
                    deliver.append(event.message)
    return adv, deliver


def stop_cause(ending: Cancelled | Failed) -> str:
    """Why a run stopped, as an interrupted call's answer words it.

    >>> stop_cause(Cancelled()), stop_cause(Failed("boom"))
    ('the turn was cancelled', 'the run failed')
    """
    return "the turn was cancelled" if type(ending) is Cancelled else "the run failed"


def numeric_counts(*fields: Mapping[str, Any]) -> dict[str, int | float] | None:
    """A framework's usage as the counts a turn's end records: the non-zero, finite numbers of
    ``fields`` (the first field naming a count wins); ``None`` when there are none.

    >>> numeric_counts({"input_tokens": 10, "model": "x", "cached": 0}, {"input_tokens": 3, "a": 1})
    {'input_tokens': 10, 'a': 1}
    """
    counts: dict[str, int | float] = {}
    for field in fields:
        for name, value in field.items():
            if type(value) in (int, float) and value and math.isfinite(value):
                counts.setdefault(name, value)
    return counts or None


def _no_counts() -> dict[str, int | float] | None:
    return None


def _as_is(value: Any) -> Any:
    return value


class TurnBridge:
    """The loop's state for one turn over ``port``, and the one way a boundary is recorded.

    ``start`` is the loop's starting state (the runner's budget). ``left_open`` answers a call
    an earlier turn left open, in the words the framework itself uses for one. What the turn's
    end records of the run: ``output`` (set by the adapter; made JSON by ``jsonable``, and left
    out when it is only the final reply's text) and ``counts()``, the usage the model reported.
    ``recorded`` holds the events recorded and not yet handed on (:meth:`take`).
    """

    def __init__(self, port: SessionPort, start: LoopState, *,
                 left_open: Callable[[ToolCall], Message] | None = None,
                 counts: Callable[[], dict[str, int | float] | None] = _no_counts,
                 jsonable: Callable[[Any], Any] = _as_is,
                 log: logging.Logger = logger) -> None:
        self.port = port
        self.start = start
        self.adv = Advance(start, CallModel(pvector()), ())
        self.claims = ClaimGuard(port)  # a port that is not a journal is claimed from guarded
        self.recorded: list[Event] = []
        self.output: Any = None
        self.counts = counts
        self.left_open = left_open or (lambda call: interrupted_result(call, "the run stopped"))
        self.jsonable = jsonable
        self.log = log
        #: How many transcript entries came before this turn: what the framework holds already.
        self.prior = 0
        #: The turn's spans (``None`` when nothing records them): an adapter makes the step's
        #: span current around its framework's work (:meth:`TurnTrace.current`).
        self.trace = turn_trace(port)

    def phase(self) -> Phase:
        """Where the loop stands."""
        return self.adv.state.phase

    @property
    def calls(self) -> Sequence[ToolCall]:
        """The tool calls the loop waits for the results of (in ``Phase.TOOLS``)."""
        return self.adv.state.calls

    def open(self, reason: str) -> list[Message]:
        """The turn's opening: ``TurnStarted``, the answers to calls an earlier turn left open
        (the model must see every call answered), then the loop's claims. Returns what the
        first request shows, the whole transcript, or ``[]`` when the turn is over already.

        A turn with nothing to answer is over at its opening: the claims took nothing and the
        transcript ends with the model's own reply (a message withdrawn between the owner's
        decision to wake and this claim). A model asked to follow its own last word would
        repeat or invent, and some providers refuse the request, so the turn ends cancelled,
        with no error and no request made.
        """
        session = self.port.session
        answers = [self.left_open(call) for call in open_calls(session.transcript)]
        turn = session.turn + 1
        self.prior = len(session.transcript)
        opened = advance(self.start, TurnOpened(turn, reason, [*session.transcript, *answers]))
        self.adv = opened._replace(events=())
        self.write(*opened.events, *(ToolReturned(turn=turn, step=0, message=m) for m in answers),
                   CLAIMS)
        request = self.request()
        if request and request[-1].role == "assistant":
            self.close(Cancelled())
            return []
        return request

    def request(self) -> list[Message]:
        """What the request the loop asks for now shows (the whole transcript), else ``[]``."""
        command = self.adv.command
        return list(command.transcript) if type(command) is CallModel else []

    def write(self, *parts: Part) -> list[Message]:
        """Record a boundary (see :func:`_walk`): one atomic append when the port is a journal
        (:meth:`JournalPort.commit <nous_inbox.runner.port.JournalPort.commit>`, worked out again
        from the new session if another writer appended first), one port call each otherwise.
        Returns what the next request must carry."""
        before = len(self.recorded)
        if isinstance(self.port, JournalPort):
            if getattr(self.port, "heard", False) and any(p is CLAIMS for p in parts):
                self._reaching(parts)
            limit_of = getattr(self.port, "claim_limit", None)  # an owner's: a turn per options

            taken: list[Sequence[Message]] = []  # what the commit's last try claimed

            def boundary(session: Session) -> tuple[list[Event], tuple[Advance, list[Message]]]:
                events: list[Event] = []
                inbox = session.inbox
                taken.clear()

                def claim(command: Claim) -> Sequence[Message]:
                    nonlocal inbox
                    messages, event, inbox = claim_event(
                        inbox, command.target, wake_only=command.wake_only,
                        limit=None if limit_of is None else limit_of(command.target))
                    if event is not None:
                        events.append(event)
                        taken.append(messages)
                    return messages

                return events, _walk(self.adv, parts, claim,
                                     lambda event, state: events.append(
                                         self._finished(event, state)))

            stored, walked = self.port.commit(boundary)
            if self.trace is not None:
                for messages in taken:
                    self.trace.claimed(messages)
            self.recorded.extend(stored)
        else:
            def claim(command: Claim) -> Sequence[Message]:
                messages, events = self.claims.claim(command.target, wake_only=command.wake_only)
                if self.trace is not None:
                    self.trace.claimed(messages)
                self.recorded.extend(events)
                return messages

            walked = _walk(self.adv, parts, claim, lambda event, state: self.recorded.extend(
                self.port.record([self._finished(event, state)])))
        self.adv, deliver = walked
        for event in self.recorded[before:]:
            if isinstance(event, Warned) and event is not self.claims.warning:
                self.log.warning(event.text)  # the loop's budget warning: a log line too
        if self.trace is not None:
            self.trace.saw_all(self.recorded[before:])
        return deliver

    def _finished(self, event: Any, state: LoopState) -> Any:
        """A turn's end with what the run reported: its output (as JSON; only when it is more
        than the final reply's text, the last of ``state``'s transcript: the walk's, which a
        boundary that ends the turn has already carried past ``self.adv``) and its usage (the
        counts the model reported)."""
        if type(event) is not TurnEnded:
            return event
        usage = self.counts()
        output = self.output
        reply = state.transcript[-1] if state.transcript else None
        if isinstance(output, str) and reply is not None and reply.content == output:
            output = None  # the final reply says it already
        if output is None and usage is None:
            return event
        if output is not None:
            output = freeze_json(self.jsonable(output), "the run's output")
        return msgspec.structs.replace(event, output=output, usage=usage)

    def _reaching(self, parts: Sequence[Part]) -> None:
        """Tell the owner's boundary subscribers of each claim this boundary will make, before
        the one commit that makes them (a send of theirs must not land inside that commit):
        the claims are the loop's, worked out on a dry walk that claims nothing."""
        reaching = self.port.reaching  # type: ignore[attr-defined]
        claims: list[Claim] = []

        def claim(command: Claim) -> Sequence[Message]:
            claims.append(command)
            return ()

        _walk(self.adv, parts, claim, lambda event, state: None)
        for command in claims:
            reaching(command.target, self.adv.state.turn, wake_only=command.wake_only)

    def finished(self, results: Mapping[str, Message], *, final: bool = False, stopped: str = "",
                 started: Collection[str] | None = None) -> ToolsFinished | None:
        """The results of the calls the loop waits for, as its ``ToolsFinished`` (``None`` when
        it waits for none): each call's from ``results`` (by call id), else interrupted when the
        run ``stopped`` (saying why) and its tool started (any tool, when ``started`` is
        ``None``: the framework cannot tell), else cancelled: it never ran."""
        if self.phase() is not Phase.TOOLS:
            return None
        answers = [
            results[call.id] if call.id in results
            else interrupted_result(call, stopped)
            if stopped and (started is None or call.id in started)
            else cancelled_result(call)
            for call in self.calls]
        return ToolsFinished(answers, final=final)

    def close(self, ending: Cancelled | Failed, *parts: Part) -> None:
        """End the turn, unless the loop ended it: ``parts`` first (what the run holds and never
        showed: the results of tools that ran, each open call answered), then ``ending``;
        nothing is claimed."""
        if self.phase() is not Phase.ENDED:
            self.write(*parts, ending)

    def end_opening(self, failure: BaseException | None) -> None:
        """End a turn whose opening was cut short (by ``failure``, or a cancel when ``None``),
        if it got as far as recording the turn's start: a turn the log shows open would keep
        the session running. The opening records that start first (or, in one append, with
        all the rest), so anything recorded means the turn started."""
        if self.recorded:
            ending = Cancelled() if failure is None else Failed(describe_error(failure))
            self.close(ending, *filter(None, [self.finished({})]))

    def take(self) -> list[Event]:
        """The events recorded since the last take, in order."""
        taken, self.recorded = self.recorded, []
        return taken
