"""Journal: one stream's session, kept in step with the store that holds its events.

Whoever keeps a session value beside a shared log does the same three things: fold the log into
the value once, append each change with the version the value was computed from (so a change
computed from stale state is refused rather than written), and, when another writer got there
first, read what it wrote and compute the change again. The owner does this for a whole session,
the mailbox for its threads, the aimu adapter for each agent's queues; all do it here, and every
write a journal makes (:meth:`~Journal.commit`, :meth:`~Journal.append`, :meth:`~Journal.send`,
:meth:`~Journal.claim`) goes through one retry loop.

>>> from nous_inbox.events import MessageSent
>>> from nous_inbox.store import open_store
>>> store = open_store("memory:")
>>> journal = Journal(store, "s")
>>> def steer(session):
...     return [MessageSent(target="next_step", wakeup=True, message=Message.user("go"))], None
>>> stored, _ = journal.commit(steer)
>>> _ = store.append("s", [MessageSent(target="next_step", wakeup=False, message=Message.user("fyi"))])
>>> stored, _ = journal.commit(steer)     # refused once (stale), caught up, computed again
>>> [m.content for m, _ in journal.session.inbox.entries("next_step")], journal.session.version
(['go', 'fyi', 'go'], 3)

A journal is not locked: its holder serializes calls (the owner and the adapter lock around each
use). ``store=None`` keeps the session in memory: folded and numbered, written nowhere.

Long sessions. Opening starts from the stream's newest usable snapshot and replays only the
events after it (:func:`~nous_inbox.store.snapshot.load_session`, equal to a full replay). A new
snapshot is saved once ``snapshot_every`` events (:data:`~nous_inbox.store.snapshot.SNAPSHOT_EVERY`;
0 never) or a tenth of the session, whichever is more, were folded since the last (or replayed by
an open): a save encodes the whole session, so with the tenth its cost per event stays flat and an
open replays at most a tenth. Only a journal that keeps the transcript saves; a failed save is
logged, never raised: the log is the truth.

The collector and a long history (``freeze_gc``, off by default). A session of a million events
is millions of objects the cyclic garbage collector tracks (vector nodes, tuples, metadata maps),
though none can be part of a cycle, and each full collection walks them all, so its pauses grow
with the history. With ``freeze_gc=True`` the journal calls ``gc.freeze()`` once the session
holds ``snapshot_every`` events (:data:`~nous_inbox.store.snapshot.SNAPSHOT_EVERY` when that is 0),
after an open and again every ``snapshot_every`` events: every object then alive moves to the
collector's permanent generation, and full collections walk only what was made since, as for a
short session. A full collection runs just before each freeze, so no garbage is frozen.

Turn it on in a long-lived host that keeps long sessions loaded and minds collection pauses. The
cost: ``gc.freeze`` is process-wide (the host's objects are frozen too); reference counting still
frees them, but one later caught in a reference cycle (an asyncio task or future, an exception
with its traceback) is never collected. A library leaves its host's collector alone unasked.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol, TypeVar

import msgspec
from pyrsistent import pvector

from nous_inbox.codec import MAX_RECORD_SIZE
from nous_inbox.errors import ConcurrencyError
from nous_inbox.events import Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Inbox, as_message, as_target, as_wakeup
from nous_inbox.message import Message
from nous_inbox.queued import Claimed
from nous_inbox.session import Session
from nous_inbox.store.base import append_once
from nous_inbox.store.snapshot import (
    SNAPSHOT_EVERY,
    SNAPSHOT_SHARE,
    check_snapshot_every,
    load_session,
    save_snapshot,
)
from nous_inbox.verbs import Target

__all__ = ["ATTEMPTS", "Change", "Journal", "Log", "claim_event", "send_to", "sent_event"]

T = TypeVar("T")

logger: Final = logging.getLogger("nous_inbox.store.journal")

#: How often a change is computed again after losing a race before giving up: each retry means
#: another writer appended in between, so running out means the stream never stood still.
ATTEMPTS: Final = 100

_NEVER: Final = 2**63  # a version no stream reaches: "no checkpoint due"
_replace: Final = msgspec.structs.replace
_time: Final = time.time


class Log(Protocol):
    """What a journal needs of a store: append with an expected version, read back, and a cheap
    version number (every ``nous_inbox.store`` store fits, and so may a host's own)."""

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None
    ) -> Sequence[Event]:
        """Append all of ``events`` or none; ``ConcurrencyError`` if the stream moved on."""

    def read(self, stream: str, after: int = 0) -> Iterable[Event]:
        """The events of ``stream`` numbered above ``after``, oldest first."""

    def version(self, stream: str) -> int:
        """The ``seq`` of the stream's last event (0 when it has none)."""


Change = Callable[[Session], tuple[Sequence[Event], T]]
"""Computes, from the session as it stands, the events to append and a result for the caller."""

def sent_event(
    message: Message | str, target: Target | str, wakeup: bool, *, seq: int = 0, at: float = 0.0
) -> MessageSent:
    """Check a send's three parts and build its ``MessageSent``: the one place a send is built.

    The parts are checked in :meth:`Inbox.send <nous_inbox.inbox.Inbox.send>`'s order (message,
    target, wakeup), so a send with several bad parts raises the same error wherever it is made,
    before anything is written. ``seq`` and ``at`` are left for the log unless given.

    >>> sent_event("go", "next_step", True).message.content
    'go'
    >>> sent_event("go", "next_step", "yes")
    Traceback (most recent call last):
    ...
    TypeError: wakeup must be a bool, got str
    """
    message = as_message(message)
    return MessageSent(target=as_target(target), wakeup=as_wakeup(wakeup), message=message,
                       seq=seq, at=at)


def send_to(log: Log, stream: str, message: Message | str, target: Target | str,
            wakeup: bool) -> MessageSent:
    """Append one send to ``stream`` from a writer that does not hold its session (the command
    line; a web host whose session another process holds); returns it as stored.

    The event is :func:`sent_event`'s, so its parts are checked before anything is written, and
    the append is :func:`~nous_inbox.store.base.append_once`, as a journal's own are: an append
    whose outcome the store could not learn is made again with its identity, so the send is
    stored once whichever way it went. No expected version: a send joins its queue whatever came
    before it, and the session's holder folds it in when it next reads the log.

    >>> from nous_inbox.store import open_store
    >>> send_to(open_store("memory:"), "s", "go", "next_step", True).seq
    1
    """
    (stored,) = append_once(log, stream, [sent_event(message, target, wakeup)])
    return stored  # type: ignore[return-value]  # the MessageSent built above


class Journal:
    """``stream``'s :class:`Session` in ``store``, folded from the log and kept up to date.

    ``on_events`` is called with every batch of events folded in, the journal's own appends and
    what another writer appended alike, in log order. ``transcript=False`` keeps only the inbox
    and the run bookkeeping (the transcript stays empty), for a holder that needs the queues
    but would otherwise keep every delivered message in memory for nothing. ``clock``, when
    given, times the events this journal appends (the store times them otherwise).
    ``snapshot_every`` and ``freeze_gc`` (off by default) are the long-session knobs described
    in the module's docstring; :attr:`replayed` says how many events the open replayed (after
    its snapshot).
    """

    def __init__(
        self,
        store: Log | None,
        stream: str,
        *,
        on_events: Callable[[Sequence[Event]], None] | None = None,
        transcript: bool = True,
        clock: Callable[[], float] | None = None,
        snapshot_every: int = SNAPSHOT_EVERY,
        freeze_gc: bool = False,
    ) -> None:
        check_snapshot_every(snapshot_every, "Journal")
        if type(freeze_gc) is not bool:
            raise TypeError(f"Journal: freeze_gc must be a bool, got {type(freeze_gc).__name__}")
        self._store = store
        self._clock = clock if clock is not None else _time
        self._stream = stream
        self._on_events = on_events
        self._keep_transcript = transcript
        self._every = snapshot_every
        self._freeze = freeze_gc
        if store is None:
            session, self._snapshot_at, self.replayed = Session(), 0, 0
        else:
            opened = load_session(store, stream)
            session, self._snapshot_at, self.replayed = (
                opened.session, opened.snapshot, opened.replayed
            )
        self._session = session if transcript else _without_transcript(session)
        self._frozen_at = 0
        self._due = 0  # the version from which _checkpoint has work (see _schedule)
        self._writes = 0
        if store is not None:
            self._checkpoint()
        else:
            self._schedule()

    @property
    def stream(self) -> str:
        """The stream's name in the store."""
        return self._stream

    @property
    def session(self) -> Session:
        """The session as folded so far (call :meth:`catch_up` to read other writers first)."""
        return self._session

    @property
    def writes(self) -> int:
        """How many appends of this journal the store has taken (the events of each are then
        stored, whatever happened after).

        A caller that must tell "refused, nothing written" from "written, then something raised"
        (``on_events`` runs after the append) compares it before and after: the session's
        version cannot say, as a retry's catch-up moves it for another writer's events.
        """
        return self._writes

    @property
    def max_record_size(self) -> int | None:
        """The largest record the store takes, in bytes: its ``max_record_size``, or the codec's
        default for a log without the attribute (a host's own, or none). A runner checks a
        tool's result against it, so a result the store would refuse becomes an error the model
        sees. Passed on as the store says it, ``None`` included (a log that names no limit):
        the runner is the one place that holds ``None`` to the codec's default and refuses a
        value that is not an int >= 1 (stores check their own when they open), so a default put
        in place here would be a limit the store does not enforce."""
        limit: int | None = getattr(self._store, "max_record_size", MAX_RECORD_SIZE)
        return limit

    def catch_up(self) -> list[Event]:
        """Fold in what other writers appended since this journal's version; return it. (The
        stream's version is asked first: cheap, and most of the time nothing is new.)"""
        store = self._store
        if store is None or store.version(self._stream) == self._session.version:
            return []
        missed = list(store.read(self._stream, self._session.version))
        if missed:
            session = self._session.apply_all(missed, self._stream)
            self._session = session if self._keep_transcript else _without_transcript(session)
            if self._on_events is not None:
                self._on_events(missed)
            self._checkpoint()
        return missed

    def snapshot(self) -> bool:
        """Save the session as the stream's snapshot now; whether the store kept it.

        Not kept: no store, a read-only one, one without snapshots, a journal without the
        transcript, an empty session. A failure is logged (``nous_inbox.store.journal``) and answered
        ``False``: a snapshot is a cache, and nothing the log holds depends on it.
        """
        self._snapshot_at = self._session.version  # tried again after snapshot_every more
        self._schedule()
        if self._store is None or not self._keep_transcript:
            return False
        try:
            return save_snapshot(self._store, self._stream, self._session)
        except Exception as exc:  # logged: the write that triggered it succeeded
            logger.warning("stream %r: snapshot at seq %d not saved: %s",
                           self._stream, self._session.version, exc)
            return False

    # -- writing: four verbs, one retry loop ----------------------------------------------------

    def commit(self, change: Change[T]) -> tuple[list[Event], T]:
        """Append the events ``change`` computes from the session, then fold them in: the
        general write, and the one retry loop: :meth:`append`, :meth:`send` and :meth:`claim`
        are commits.

        ``change(session)`` returns the events to append (numbered and timed here) and a result
        for the caller. The append carries the session's version as the expected one, so a
        change computed from stale state is refused by the store rather than written; the
        journal then reads what the other writer appended and calls ``change`` again, up to
        ``ATTEMPTS`` times. A refusal with nothing new to read (a lock that timed out) is
        raised as it is. A change that computes no events writes nothing; if other writers
        appended meanwhile, it is asked once more on their events, then its answer stands.

        The events are folded before they are appended, so one that does not fold (a claim the
        inbox cannot meet) raises ``ReplayError`` with nothing written. On any failure nothing
        was written and the session is unchanged, except for what ``on_events`` raises: it is
        called once the events are stored and folded, so its error comes with the append made
        (:attr:`writes` moved on). Returns the events as stored (``[]`` when none) and
        ``change``'s result.

        >>> from nous_inbox.store import open_store
        >>> journal = Journal(open_store("memory:"), "s")
        >>> def claim_if_two(session):     # a decision on the session as it stands
        ...     if session.inbox.count("next_step") < 2:
        ...         return [], "waiting"
        ...     return [QueueClaimed(target="next_step", count=2)], "claimed"
        >>> journal.commit(claim_if_two)
        ([], 'waiting')
        >>> for text in ("a", "b"):
        ...     _ = journal.send(text, "next_step", False)
        >>> stored, result = journal.commit(claim_if_two)
        >>> [type(e).__name__ for e in stored], stored[0].seq, result
        (['QueueClaimed'], 3, 'claimed')
        """
        return self._retried(change, ATTEMPTS)

    def _retried(self, change: Change[T], attempts: int,
                 lost: ConcurrencyError | None = None) -> tuple[list[Event], T]:
        looked = False  # whether a change that computed nothing has read other writers yet
        for _ in range(attempts):
            events, result = change(self._session)
            if not events:
                # Nothing to write cannot lose a race: read others once (a steer sent from
                # elsewhere joins a claim), not until the stream stands still, so a writer
                # busy on the other queue cannot turn "nothing" into an error.
                if looked or not self.catch_up():
                    return [], result
                looked = True
                continue
            try:
                stored = self._append(events)
            except ConcurrencyError as exc:
                if not self.catch_up():
                    raise
                lost = exc
                continue
            return self._stored(stored), result
        raise ConcurrencyError(
            f"stream {self._stream!r}: other writers kept appending; gave up after {ATTEMPTS} "
            "attempts (nothing was written)"
        ) from lost

    def append(self, events: Sequence[Event]) -> list[Event]:
        """Append ``events`` (numbered and timed here) and fold them in: a :meth:`commit` whose
        change does not depend on the session (a run's record). Returns them as stored.

        >>> Journal(None, "s").append([sent_event("go", "next_step", True)])[0].seq
        1
        """
        if not events:
            return self.commit(lambda session: (events, None))[0]
        try:  # the first attempt outside commit's loop, which costs more than the append
            stored = self._append(events)
        except ConcurrencyError as exc:
            if not self.catch_up():
                raise
            return self._retried(lambda session: (events, None), ATTEMPTS - 1, exc)[0]
        return self._stored(stored)

    def _stored(self, stored: list[Event]) -> list[Event]:
        # Stored: from here on nothing is a lost race, so what on_events raises is raised.
        if self._on_events is not None:
            self._on_events(stored)
        if self._session.version >= self._due:
            self._checkpoint()
        return stored

    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target``: append one ``MessageSent`` (built by
        :func:`sent_event`, so its parts are checked before anything is written), then fold it
        in; return it as stored. A send on its own; the owners' group commits build theirs
        with :func:`sent_event` too and :meth:`commit` them several to an append.

        >>> from nous_inbox.store import open_store
        >>> journal = Journal(open_store("memory:"), "s")
        >>> journal.send("go", "next_step", True).seq, journal.session.inbox.wants_wake()
        (1, True)
        """
        event = sent_event(message, target, wakeup, seq=self._session.version + 1,
                           at=float(self._clock()))
        (stored,) = self.append((event,))  # renumbered by the retry after another writer's
        return stored  # type: ignore[return-value]  # the MessageSent built above

    def claim(
        self, target: Target | str, *, wake_only: bool = False, limit: int | None = None
    ) -> tuple[list[Message], QueueClaimed | None]:
        """Drain ``target`` and record the claim in one atomic append.

        A claimer of one queue at a time claims here (the owner's runs and a
        :class:`~nous_inbox.runner.port.LocalSession`, through their port); one that records
        several claims, or a claim and what surrounds it, in one append (the aimu adapter's drain,
        the pydantic-ai adapter's boundaries) builds each with :func:`claim_event` and appends them
        in one :meth:`commit`. Either way a claim is one ``QueueClaimed``, built by
        :meth:`Session.claim <nous_inbox.session.Session.claim>`, that both drains the queue and
        becomes the transcript entries (ruling 6). What is claimed is the core's decision
        (:meth:`Inbox.claim <nous_inbox.inbox.Inbox.claim>`: ``wake_only`` claims only when a
        waking message worth a round is queued; ``limit`` takes only the oldest few, and the
        event's ``rest`` says how many stayed). A claim is a :meth:`commit`: computed on the
        session as it stands, appended at its version, made again after another writer's
        append; and a claim that finds nothing reads other writers once before it says so, so a
        steer sent from another process joins it either way, with no version asked beforehand.
        Returns the messages in send order and the stored event, or ``([], None)`` when nothing
        was claimed (nothing is recorded then).

        >>> from nous_inbox.store import open_store
        >>> journal = Journal(open_store("memory:"), "s")
        >>> _ = journal.send("fyi", "next_step", False)
        >>> journal.claim("next_step", wake_only=True)       # an injection alone: not worth it
        ([], None)
        >>> messages, event = journal.claim("next_step")
        >>> [m.content for m in messages], event.count, event.seq
        (['fyi'], 1, 2)
        """
        def claiming(session: Session) -> tuple[Sequence[Event], Claimed | None]:
            # ``at`` is left 0 for the append to stamp: a claim of nothing reads no clock.
            claimed, event, _ = session.claim(target, wake_only=wake_only, limit=limit)
            return ([], None) if event is None else ([event], claimed)

        # The commonest claim, a step boundary with nothing queued, is commit's "nothing to
        # write" answered without its loop: others' events read once, the claim asked again.
        if not claiming(self._session)[0] and (not self.catch_up()
                                               or not claiming(self._session)[0]):
            return [], None
        stored, claimed = self.commit(claiming)
        if claimed is None:
            return [], None
        return list(claimed), stored[0]  # type: ignore[return-value]  # the QueueClaimed above

    def _append(self, events: Sequence[Event]) -> list[Event]:
        """One attempt: number, time and fold ``events``, append them at the session's version
        and keep the folded session; ``ConcurrencyError`` (nothing changed) if the stream moved
        on. Folded first, so an event that does not fold is refused with nothing written.
        Nothing of the holder's runs here (``on_events`` is :meth:`commit`'s), so a
        ``ConcurrencyError`` out of it is always the store's refusal."""
        version, now = self._session.version, 0.0
        stamped: list[Event] = []
        for event in events:
            version += 1
            if event.seq != version or type(event.at) is not float or not event.at:
                now = now or float(self._clock())
                event = _replace(event, seq=version, at=float(event.at or now))
            stamped.append(event)
        folded = self._session.apply_all(stamped, self._stream)
        if not self._keep_transcript:
            folded = _without_transcript(folded)
        store = self._store
        stored = (stamped if store is None
                  else append_once(store, self._stream, stamped, self._session.version))
        self._writes += 1
        self._session = folded
        return stored

    # -- long sessions ---------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        # After each fold: save a snapshot when due, and freeze what a long session holds out
        # of the collector's way when asked to (see the module docstring).
        version = self._session.version
        every = self._every
        if every and version - self._snapshot_at >= max(every, self._snapshot_at // SNAPSHOT_SHARE):
            self.snapshot()
        cadence = every or SNAPSHOT_EVERY
        if self._freeze and version >= cadence and version - self._frozen_at >= cadence:
            gc.collect()  # garbage frozen now would never be collected: clear it first
            gc.freeze()
            self._frozen_at = version
        self._schedule()

    def _schedule(self) -> None:
        # The version at which _checkpoint may next have work: worked out once here, so a fold
        # before it costs one comparison rather than the rules above.
        every = self._every
        due = _NEVER
        if every:
            due = self._snapshot_at + max(every, self._snapshot_at // SNAPSHOT_SHARE)
        if self._freeze:
            cadence = every or SNAPSHOT_EVERY
            due = min(due, max(cadence, self._frozen_at + cadence))
        self._due = due


def claim_event(
    inbox: Inbox, target: Target | str, *, wake_only: bool = False, limit: int | None = None
) -> tuple[list[Message], QueueClaimed | None, Inbox]:
    """A claim as the log records it: the messages, the ``QueueClaimed`` event (``None`` when
    nothing was claimed; ``seq`` and ``at`` left for the log) and the inbox left behind. Pure;
    the decision is :meth:`Inbox.claim`'s.

    Every claim's event is built by :meth:`Session.claim <nous_inbox.session.Session.claim>`:
    :meth:`Journal.claim` calls it directly, and this is it for a holder that records several
    claims in one :meth:`Journal.commit` (the aimu adapter's drain of an agent's two queues, the
    pydantic-ai adapter's claims at a boundary), so a claim's event always says what the core
    decided.

    >>> claimed, event, rest = claim_event(Inbox().followup("a").followup("b"), "next_turn", limit=1)
    >>> [m.content for m in claimed], event.count, event.rest, event.seq, rest.count()
    (['a'], 1, 1, 0, 1)
    """
    claimed, event, after = Session(inbox=inbox).claim(target, wake_only=wake_only, limit=limit)
    if event is None:
        return [], None, inbox
    return list(claimed), _replace(event, seq=0), after.inbox


def _without_transcript(session: Session) -> Session:
    if not session.transcript:
        return session
    return _replace(session, transcript=pvector())
