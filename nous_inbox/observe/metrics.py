"""Prometheus metrics of owners, their store and a web host, each set in a registry of its own.

A :class:`Metrics` counts what the owners attached to it do, read off the events they already
publish (``owner.listen``): sends by mode, claims by queue, turn and step durations, the time from
a send to the claim that delivers it, takeovers; at each scrape it counts the sessions held and
running and the leases lost. A store's appends are timed by the store's own observation point
(``store.observe_appends``), and a web host adds its event-stream readers. Nothing is global: each
``Metrics`` has its own ``CollectorRegistry``, so several hosts (or tests) in one process never
share a count. ``nous-inbox serve`` makes one for its host and serves it at ``/metrics``.

Outside ``serve``, attach an owner (an ``AsyncOwner`` best before ``async with``, so a turn its
open closes as interrupted counts as a takeover) and expose the registry as you already do:

>>> from nous_inbox.owner import Owner
>>> from nous_inbox.runner import Runner
>>> from nous_inbox.store import open_store
>>> metrics = Metrics()
>>> store = open_store("memory:")
>>> stop_timing = metrics.observe_store(store)
>>> owner = Owner(store, "s1", Runner(lambda transcript, tools: "done"))
>>> detach = metrics.attach(owner)
>>> _ = owner.steer("go"); owner.wait_idle(timeout=5)
True
>>> text = metrics.exposition().decode()
>>> 'nous_inbox_sends_total{mode="steer"} 1.0' in text, "nous_inbox_sessions_held 1.0" in text
(True, True)
>>> owner.close(); detach(); stop_timing()

``prometheus_client.start_http_server(port, registry=metrics.registry)`` serves it from a
thread of its own. Labels are queues, modes and turn-end reasons only, never a session id or a
text, so a series count stays small and ``/metrics`` shows no one's words. A prompt is stored as
a followup, so it is counted as one (``nous_inbox_turn_seconds`` tells the turns apart by how they
ended, not how they began).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from nous_inbox.events import (
    Event,
    MessageSent,
    MessageWithdrawn,
    QueueClaimed,
    StepEnded,
    StepStarted,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.owner.core import INTERRUPTED
from nous_inbox.verbs import Target, name_of

__all__ = ["CONTENT_TYPE", "Metrics", "Observed"]

#: The media type of :meth:`Metrics.exposition`: Prometheus's text format.
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

# Buckets in seconds, spanning what each measures: a store append is milliseconds, a step is a
# model request (seconds), a turn many steps; a send waits for the next boundary.
_APPEND_BUCKETS: Final = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0)
_STEP_BUCKETS: Final = (.01, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TURN_BUCKETS: Final = (.05, .1, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
_WAIT_BUCKETS: Final = (.001, .005, .01, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Observed(Protocol):
    """What :meth:`Metrics.attach` reads of an owner (``Owner`` and ``AsyncOwner`` both are)."""

    def listen(self, callback: Callable[[Event], None]) -> None: ...

    @property
    def closed(self) -> bool: ...

    @property
    def running(self) -> bool: ...

    @property
    def lost(self) -> BaseException | None: ...


class Metrics:
    """The metric families of the owners attached, their store and a web host, registered in
    ``registry`` (a new ``CollectorRegistry`` by default, never the global one).

    Every family is named ``nous_inbox_*``; :meth:`exposition` renders them as Prometheus text.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        on = self.registry
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        self._prune_at = 64  # prune closed owners when this many are attached: amortised O(1)
        # First, so a scrape forgets closed owners (counting their lost leases) before it reads
        # the counters.
        on.register(_Held(self))
        self.sends = Counter("nous_inbox_sends", "Messages sent, by the verb their queue and wake "
                             "name (a prompt is stored, and counted, as a followup; send: no verb)",
                             ["mode"], registry=on)
        self.claims = Counter("nous_inbox_claims", "Claims that took messages from a queue",
                              ["queue"], registry=on)
        self.claimed = Counter("nous_inbox_claimed_messages", "Messages claims took, by queue",
                               ["queue"], registry=on)
        self.send_to_claim = Histogram(
            "nous_inbox_send_to_claim_seconds", "From a send stored to the claim that delivered it",
            ["queue"], buckets=_WAIT_BUCKETS, registry=on)
        self.turns = Histogram("nous_inbox_turn_seconds", "Turns, from opening to end, by how "
                               "they ended", ["reason"], buckets=_TURN_BUCKETS, registry=on)
        self.steps = Histogram("nous_inbox_step_seconds", "Steps (a model request and its tools)",
                               buckets=_STEP_BUCKETS, registry=on)
        self.appends = Histogram("nous_inbox_store_append_seconds", "Store appends, from call "
                                 "to return", buckets=_APPEND_BUCKETS, registry=on)
        self.takeovers = Counter("nous_inbox_takeovers", "Sessions taken with a turn open that "
                                 "their last holder left (closed as interrupted)", registry=on)
        self.leases_lost = Counter("nous_inbox_leases_lost", "Owners stopped because another "
                                   "took their session's lease over", registry=on)
        self.sse_readers = Gauge("nous_inbox_sse_readers", "Event streams (Server-Sent Events) "
                                 "open", registry=on)
        # Each label's child made once: a lookup by label values costs more than the count. (A
        # Target is a str enum: it finds its own value's key.)
        self._sends = {(str(t), w): self.sends.labels(name_of(t, w) or "send")
                       for t in Target for w in (True, False)}
        self._queues = {str(t): (self.claims.labels(str(t)), self.claimed.labels(str(t)),
                                 self.send_to_claim.labels(str(t))) for t in Target}

    def attach(self, owner: Observed) -> Callable[[], None]:
        """Count what ``owner`` does from now on; returns the call that stops counting it.

        An owner that closes is forgotten at the next scrape (or the next attach once many are
        attached), its lost lease counted then, so a host need not detach each one."""
        watch = _Watch(self, owner)
        with self._lock:
            self._watches.add(watch)
            crowded = len(self._watches) >= self._prune_at
        if crowded:
            self._prune()
            with self._lock:
                self._prune_at = max(64, 2 * len(self._watches))
        owner.listen(watch.event)
        return watch.detach

    def observe_store(self, store: object) -> Callable[[], None]:
        """Time each append ``store`` makes (a store without ``observe_appends`` is not timed);
        returns the call that stops it."""
        observe = getattr(store, "observe_appends", None)
        if not callable(observe):
            return lambda: None
        histogram = self.appends

        def appended(stream: str, events: int, seconds: float) -> None:
            histogram.observe(seconds)

        stop: Callable[[], None] = observe(appended)
        return stop

    def exposition(self) -> bytes:
        """Every family, as Prometheus text (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def _prune(self) -> list[_Watch]:
        """Forget closed owners, counting each lost lease once; the open ones."""
        with self._lock:
            watches = list(self._watches)
        open_ = []
        for watch in watches:
            if watch.owner.closed:
                watch.detach()
            else:
                open_.append(watch)
        return open_

    def _forget(self, watch: _Watch) -> None:
        with self._lock:
            if watch not in self._watches:
                return
            self._watches.discard(watch)
        if watch.owner.lost is not None:
            self.leases_lost.inc()


class _Held:
    """The sessions held and running, read from the attached owners at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return self._families(0, 0)

    def collect(self) -> Iterable[Metric]:
        open_ = self._metrics._prune()
        return self._families(len(open_), sum(1 for w in open_ if w.owner.running))

    @staticmethod
    def _families(held: int, running: int) -> list[Metric]:
        return [GaugeMetricFamily("nous_inbox_sessions_held", "Sessions whose owner is open here",
                                  value=held),
                GaugeMetricFamily("nous_inbox_sessions_running", "Sessions with a run going here",
                                  value=running)]


class _Watch:
    """One owner's events, counted: it keeps only what a later event needs (when the open turn
    and step began, and when each send it saw queued was stored)."""

    __slots__ = ("_metrics", "_on", "_queued", "_step_at", "_turn_at", "attached", "owner")

    def __init__(self, metrics: Metrics, owner: Observed) -> None:
        self._metrics, self.owner, self.attached = metrics, owner, True
        self._queued: dict[str, deque[tuple[int, float]]] = {str(t): deque() for t in Target}
        self._turn_at = self._step_at = 0.0
        self._on: dict[type, Callable[[Event], None]] = {
            MessageSent: self._sent, QueueClaimed: self._claimed, MessageWithdrawn: self._withdrawn,
            TurnStarted: self._turn_started, TurnEnded: self._turn_ended,
            StepStarted: self._step_started, StepEnded: self._step_ended}

    def event(self, event: Event) -> None:
        on = self._on.get(type(event))
        if on is not None and self.attached:
            on(event)

    def detach(self) -> None:
        self.attached = False
        self._metrics._forget(self)

    def _sent(self, event: Event) -> None:
        assert isinstance(event, MessageSent)
        self._metrics._sends[event.target, event.wakeup].inc()
        self._queued[event.target].append((event.seq, event.at))

    def _claimed(self, event: Event) -> None:
        # A claim takes the oldest first: those queued before this watch began (it never saw
        # their sends), then the ones it saw, leaving ``rest`` behind. So the ones it saw that
        # this claim took are all it saw but the ``rest`` newest.
        assert isinstance(event, QueueClaimed)
        claims, claimed, waited = self._metrics._queues[event.target]
        claims.inc()
        claimed.inc(event.count)
        queued = self._queued[event.target]
        for _ in range(min(event.count, len(queued) - event.rest)):
            _, at = queued.popleft()
            _observe(waited, at, event.at)

    def _withdrawn(self, event: Event) -> None:
        assert isinstance(event, MessageWithdrawn)
        queued = self._queued[event.target]
        for entry in queued:
            if entry[0] == event.sent:
                queued.remove(entry)
                break

    def _turn_started(self, event: Event) -> None:
        self._turn_at = event.at

    def _turn_ended(self, event: Event) -> None:
        assert isinstance(event, TurnEnded)
        if event.error == INTERRUPTED:  # the open turn a holder left: this owner took it over
            self._metrics.takeovers.inc()
        _observe(self._metrics.turns.labels(event.reason), self._turn_at, event.at)
        self._turn_at = 0.0

    def _step_started(self, event: Event) -> None:
        self._step_at = event.at

    def _step_ended(self, event: Event) -> None:
        _observe(self._metrics.steps, self._step_at, event.at)
        self._step_at = 0.0


def _observe(histogram: Histogram, start: float, end: float) -> None:
    """``end - start`` in seconds, if both are known (a stored event has its time; 0.0 is one
    this watch never saw); a wall clock set back counts as no time, never as negative."""
    if start and end:
        histogram.observe(max(0.0, end - start))
