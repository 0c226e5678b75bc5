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

import bisect
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
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

# Bucket bounds in seconds, spanning what each measures: a store append is milliseconds, a step
# a model request (seconds), a turn many steps; a send waits for the next boundary.
_APPEND_BOUNDS: Final = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0)
_STEP_BOUNDS: Final = (.01, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TURN_BOUNDS: Final = (.05, .1, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
_WAIT_BOUNDS: Final = (.001, .005, .01, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_QUEUES: Final = tuple(Target)
_SENDS: Final = tuple((target, wakeup) for target in Target for wakeup in (True, False))


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
    Counting costs a send a few plain additions: each owner keeps its own tally (its events come
    one at a time), and a scrape adds the tallies up.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._lock = threading.Lock()  # the set of owners, the retired tally, appends, readers
        self._watches: set[_Watch] = set()
        self._prune_at = 64  # forget closed owners when this many are attached: amortised O(1)
        self._retired = _Tally()  # what the owners forgotten so far counted
        self._appends = _Histogram(_APPEND_BOUNDS)
        self._leases_lost = 0
        self._readers = 0
        self.registry.register(_Collector(self))

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
        lock, appends = self._lock, self._appends
        bounds, counts, find = appends.bounds, appends.counts, bisect.bisect_left

        def appended(stream: str, events: int, seconds: float) -> None:
            with lock:  # any thread appends (inlined: this is on every append's path)
                counts[find(bounds, seconds)] += 1
                appends.sum += seconds

        stop: Callable[[], None] = observe(appended)
        return stop

    def reader_opened(self) -> None:
        """An event stream (Server-Sent Events) opened; :meth:`reader_closed` when it ends."""
        with self._lock:
            self._readers += 1

    def reader_closed(self) -> None:
        with self._lock:
            self._readers -= 1

    def exposition(self) -> bytes:
        """Every family, as Prometheus text (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def _prune(self) -> list[_Watch]:
        """Forget closed owners, their tallies kept and each lost lease counted once; the
        open ones."""
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
            self._retired.add(watch.tally)
            if watch.owner.lost is not None:
                self._leases_lost += 1


class _Histogram:
    """Counts by bucket and their sum: what a Prometheus histogram shows, at a bisect per value."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def add(self, other: _Histogram) -> None:
        for i, count in enumerate(other.counts):
            self.counts[i] += count
        self.sum += other.sum

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative, as Prometheus's ``le`` buckets are."""
        total, out = 0, []
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, float(total)))
        return out


class _Tally:
    """What one owner counted (or, added up, several)."""

    __slots__ = ("claimed", "claims", "sends", "steps", "takeovers", "turns", "waited")

    def __init__(self) -> None:
        self.sends: dict[tuple[str, bool], int] = dict.fromkeys(_SENDS, 0)
        self.claims: dict[str, int] = dict.fromkeys(_QUEUES, 0)
        self.claimed: dict[str, int] = dict.fromkeys(_QUEUES, 0)
        self.waited = {queue: _Histogram(_WAIT_BOUNDS) for queue in _QUEUES}
        self.turns: dict[str, _Histogram] = {}  # by how they ended
        self.steps = _Histogram(_STEP_BOUNDS)
        self.takeovers = 0

    def add(self, other: _Tally) -> None:
        for key, count in other.sends.items():
            self.sends[key] += count
        for queue in _QUEUES:
            self.claims[queue] += other.claims[queue]
            self.claimed[queue] += other.claimed[queue]
            self.waited[queue].add(other.waited[queue])
        for reason, turns in list(other.turns.items()):
            self.turns.setdefault(reason, _Histogram(_TURN_BOUNDS)).add(turns)
        self.steps.add(other.steps)
        self.takeovers += other.takeovers


class _Watch:
    """One owner's events, counted into its own tally: it keeps only what a later event needs
    (when the open turn and step began, and when each send it saw queued was stored)."""

    __slots__ = ("_metrics", "_on", "_queued", "_step_at", "_turn_at", "owner", "tally")

    def __init__(self, metrics: Metrics, owner: Observed) -> None:
        self._metrics, self.owner, self.tally = metrics, owner, _Tally()
        self._queued: dict[str, deque[tuple[int, float]]] = {queue: deque() for queue in _QUEUES}
        self._turn_at = self._step_at = 0.0
        self._on: dict[type, Callable[[Event], None]] = {
            MessageSent: self._sent, QueueClaimed: self._claimed, MessageWithdrawn: self._withdrawn,
            TurnStarted: self._turn_started, TurnEnded: self._turn_ended,
            StepStarted: self._step_started, StepEnded: self._step_ended}

    def event(self, event: Event) -> None:
        on = self._on.get(type(event))
        if on is not None:
            on(event)

    def detach(self) -> None:
        self._on = {}  # (an owner cannot be told to stop telling: what it tells is ignored)
        self._metrics._forget(self)

    # (A Target is a str enum: an event's finds the key of its value, a plain str's too.)
    def _sent(self, event: Event) -> None:
        assert isinstance(event, MessageSent)
        self.tally.sends[event.target, event.wakeup] += 1
        self._queued[event.target].append((event.seq, event.at))

    def _claimed(self, event: Event) -> None:
        # A claim takes the oldest first: those queued before this watch began (it never saw
        # their sends), then the ones it saw, leaving ``rest`` behind. So the ones it saw that
        # this claim took are all it saw but the ``rest`` newest.
        assert isinstance(event, QueueClaimed)
        tally, target = self.tally, event.target
        tally.claims[target] += 1
        tally.claimed[target] += event.count
        queued, waited, at = self._queued[target], tally.waited[target], event.at
        for _ in range(min(event.count, len(queued) - event.rest)):
            _, sent_at = queued.popleft()
            _observe(waited, sent_at, at)

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
        tally = self.tally
        if event.error == INTERRUPTED:  # the open turn a holder left: this owner took it over
            tally.takeovers += 1
        turns = tally.turns.get(event.reason)
        if turns is None:
            turns = tally.turns[event.reason] = _Histogram(_TURN_BOUNDS)
        _observe(turns, self._turn_at, event.at)
        self._turn_at = 0.0

    def _step_started(self, event: Event) -> None:
        self._step_at = event.at

    def _step_ended(self, event: Event) -> None:
        _observe(self.tally.steps, self._step_at, event.at)
        self._step_at = 0.0


def _observe(histogram: _Histogram, start: float, end: float) -> None:
    """``end - start`` in seconds, if both are known (a stored event has its time; 0.0 is one
    a watch never saw); a wall clock set back counts as no time, never as negative."""
    if start and end:
        histogram.observe(max(0.0, end - start))


class _Collector:
    """The families, added up at each scrape from the owners attached and those forgotten."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return self._families(_Tally(), [], _Histogram(_APPEND_BOUNDS), 0, 0)

    def collect(self) -> Iterable[Metric]:
        metrics = self._metrics
        open_ = metrics._prune()
        total = _Tally()
        with metrics._lock:
            total.add(metrics._retired)
            appends = _Histogram(_APPEND_BOUNDS)
            appends.add(metrics._appends)
            lost, readers = metrics._leases_lost, metrics._readers
        for watch in open_:
            total.add(watch.tally)
        return self._families(total, open_, appends, lost, readers)

    @staticmethod
    def _families(total: _Tally, open_: list[_Watch], appends: _Histogram, lost: int,
                  readers: int) -> list[Metric]:
        held = GaugeMetricFamily("nous_inbox_sessions_held", "Sessions whose owner is open here",
                                 value=len(open_))
        running = GaugeMetricFamily("nous_inbox_sessions_running", "Sessions with a run going "
                                    "here", value=sum(1 for w in open_ if w.owner.running))
        sends = CounterMetricFamily("nous_inbox_sends", "Messages sent, by the verb their queue "
                                    "and wake name (a prompt is stored, and counted, as a "
                                    "followup; send: no verb)", labels=["mode"])
        for (target, wakeup), count in total.sends.items():
            sends.add_metric([name_of(target, wakeup) or "send"], count)
        claims = CounterMetricFamily("nous_inbox_claims", "Claims that took messages from a "
                                     "queue", labels=["queue"])
        claimed = CounterMetricFamily("nous_inbox_claimed_messages", "Messages claims took, by "
                                      "queue", labels=["queue"])
        waited = HistogramMetricFamily("nous_inbox_send_to_claim_seconds", "From a send stored "
                                       "to the claim that delivered it", labels=["queue"])
        for queue in _QUEUES:
            claims.add_metric([str(queue)], total.claims[queue])
            claimed.add_metric([str(queue)], total.claimed[queue])
            waited.add_metric([str(queue)], total.waited[queue].buckets(), total.waited[queue].sum)
        turns = HistogramMetricFamily("nous_inbox_turn_seconds", "Turns, from opening to end, "
                                      "by how they ended", labels=["reason"])
        for reason, histogram in sorted(total.turns.items()):
            turns.add_metric([reason], histogram.buckets(), histogram.sum)
        return [
            held, running, sends, claims, claimed, waited, turns,
            HistogramMetricFamily("nous_inbox_step_seconds", "Steps (a model request and its "
                                  "tools)", buckets=total.steps.buckets(), sum_value=total.steps.sum),
            HistogramMetricFamily("nous_inbox_store_append_seconds", "Store appends, from call "
                                  "to return", buckets=appends.buckets(), sum_value=appends.sum),
            CounterMetricFamily("nous_inbox_takeovers", "Sessions taken with a turn open that "
                                "their last holder left (closed as interrupted)",
                                value=total.takeovers),
            CounterMetricFamily("nous_inbox_leases_lost", "Owners stopped because another took "
                                "their session's lease over", value=lost),
            GaugeMetricFamily("nous_inbox_sse_readers", "Event streams (Server-Sent Events) open",
                              value=readers),
        ]
