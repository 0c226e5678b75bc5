"""Mailbox: addressed delivery between named agents, durable, with threads, notices and replies.

An agent acts through its handle (``box.agent(name)``, :mod:`nous_inbox.mailbox.handle`) and
sends to other agents by name; the recipient pulls it (``receive``), is called back
(``subscribe``), or, when an owner runs it (``attach``), hears of it as one notice at the right
moment. Every fact is an event in one stream of the store, so a restarted mailbox is exactly
where the old one stopped.

>>> box = Mailbox()
>>> researcher, writer = box.agent("researcher"), box.agent("writer")
>>> researcher.send("writer", "draft ready").state
'queued'
>>> for agent in ("writer", "editor"):
...     _ = researcher.send(agent, {"v": 2}, correlation_id="q1")
>>> box.pending("writer"), box.pending("editor")
(2, 1)
>>> [(m.sender, m.body) for m in writer.receive()]
[('researcher', 'draft ready'), ('researcher', {'v': 2})]
>>> researcher.send("writer", object())
Traceback (most recent call last):
...
TypeError: send to 'writer': body: object is not JSON-able (allowed: None, bool, int, float, str, list, tuple, dict with str keys)

Rules (what classes and retention mean is :mod:`nous_inbox.mailbox.rules`'):

* A body is any JSON-able value, checked (and frozen) at send; anything else is an error and
  nothing is queued. Each recipient's queue is bounded (``max_queue``): by default a send beyond
  it is refused with :class:`MailboxFullError`; with ``overflow="drop_oldest"`` the oldest queued
  message makes room, and the drop is an event and counted (``dropped(agent)``).
* ``id`` makes a send idempotent: sending an id again answers what became of it (the
  :class:`Receipt` has ``duplicate=True``) and carries nothing, before or after a restart, while
  the mailbox keeps the message, and for ``remember`` more messages sent after it let it go; a
  resend of an id forgotten since is a new message. ``remember`` and ``retain`` shape the fold:
  processes sharing a stream must use the same values.
* ``read`` reads a thread whole and marks it read; ``reply`` answers into the original
  sender's inbox under the same thread, waking nobody (unless its ``kind`` says so);
  ``withdraw`` unsends a message no notice has carried yet, and retracts one that was.
* Every verb that acts as an agent is its handle's: the mailbox itself takes no agent's name to
  act as, so whoever holds the mailbox cannot act as anyone.

One lock guards the fold (:class:`~nous_inbox.mailbox.state.MailboxState`) and the append: an
event is appended before it is folded, so the fold never holds what the store does not.
Subscribers and owners are called outside the lock, so a callback may send. With a store, every
change goes through the store's :class:`~nous_inbox.store.journal.Journal` (``commit``: computed from
the state, appended at the version it was computed on, computed again when another writer came
first), and every read first folds what other writers appended, so two processes sharing a store
see each other's mail. Without one, nothing is kept but the fold.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, cast

from nous_inbox.events import (
    Event,
    MailAgent,
    MailAnswered,
    MailRead,
    MailSent,
)
from nous_inbox.mailbox.answers import (
    Letter,
    Receipt,
    ThreadSummary,
    letter,
)
from nous_inbox.mailbox.changes import (
    Bound,
    Overflow,
    checked_body,
    receipt,
    received,
    sent,
    withdrawn,
)
from nous_inbox.mailbox.handle import AgentHandle
from nous_inbox.mailbox.names import send_names, text
from nous_inbox.mailbox.owner_link import NoticeDelivery, held
from nous_inbox.mailbox.records import Thread
from nous_inbox.mailbox.rules import (
    DEBOUNCE,
    KIND_ALIASES,
    MAX_QUEUE,
    MAX_WAIT,
    REMEMBER,
    RETAIN,
    check_options,
    kind_of,
    preview,
)
from nous_inbox.mailbox.state import MailboxState
from nous_inbox.owner.group_commit import GroupCommit, commit_in_threads
from nous_inbox.store import Store, open_store
from nous_inbox.store.journal import Journal

__all__ = ["STREAM", "Mailbox"]

logger: Final = logging.getLogger("nous_inbox.mailbox")

STREAM: Final = "mailbox"
"""The store stream a mailbox keeps its events in, unless told another."""

Subscriber = Callable[[MailSent], None]
_T = TypeVar("_T")


class Mailbox(NoticeDelivery):
    """Addressed delivery between named agents; ``store`` (a Store or a URL) makes it durable.

    ``retain`` bounds the settled messages kept per recipient, ``remember`` how many messages
    sent after one was let go its outcome is still remembered (for resends of its id, and
    ``status``); see the module's rules. Both are part of what the stream folds into: every
    mailbox on one stream must be given the same.

    ``clock`` gives every time the mailbox uses (sends are stamped with it; debounce and the
    bounded wait are measured by it), so tests advance time without sleeping; ``ids`` gives
    every id it makes up (a message's with none given, a notice's), by default a random prefix
    and a count, so two mailboxes can be made to agree. ``autotick``
    starts a thread that delivers notices to attached agents when they fall due; without it,
    call :meth:`tick`.
    """

    def __init__(self, store: Store | str | None = None, *, stream: str = STREAM,
                 max_queue: int = MAX_QUEUE, overflow: Overflow = "refuse", retain: int = RETAIN,
                 remember: int = REMEMBER, debounce: float = DEBOUNCE, max_wait: float = MAX_WAIT,
                 clock: Callable[[], float] = time.time, ids: Callable[[], str] | None = None,
                 autotick: bool = False) -> None:
        check_options(max_queue=max_queue, overflow=overflow, retain=retain, remember=remember,
                      debounce=debounce, max_wait=max_wait)
        if not callable(clock):
            raise TypeError(f"Mailbox: clock must be callable (like time.time), got {clock!r}")
        if ids is not None and not callable(ids):
            raise TypeError(f"Mailbox: ids must be callable (returning a new str id), got {ids!r}")
        if type(stream) is not str or not stream:
            raise TypeError(f"Mailbox: stream must be a non-empty str, got {stream!r}")
        if type(autotick) is not bool:
            raise TypeError(f"Mailbox: autotick must be a bool, got {autotick!r}")
        self._owns_store = isinstance(store, str)
        self._store: Store | None = open_store(store) if isinstance(store, str) else store
        self._stream = stream
        self._max_queue = max_queue
        self._bound = Bound(max_queue, overflow)
        self._clock = clock
        self._lock = threading.RLock()
        self._state = MailboxState(retain, remember)
        self._subscribers: dict[str, list[Subscriber]] = {}
        self._handles: dict[str, AgentHandle] = {}  # the agents that act only through a handle
        self._wakers: set[Callable[[], object]] = set()  # askers, woken as their mail moves
        self._new_id = _counted(os.urandom(5).hex() + "-") if ids is None else ids
        self._journal: Journal | None = None
        self._group: GroupCommit[threading.Lock] | None = None  # a durable store's sends
        self._queue_lock = threading.Lock()  # the group commit's; never held across I/O
        if self._store is not None:
            if getattr(self._store, "blocking", True):
                self._group = GroupCommit()
            self._journal = Journal(self._store, stream, on_events=self._fold,
                                    transcript=False, clock=clock, snapshot_every=0,
                                    freeze_gc=False)
            for event in self._store.read(stream):
                if event.seq > self._journal.session.version:
                    break  # the journal folds it as it catches up
                self._state.apply(event)
        NoticeDelivery.__init__(self, debounce=debounce, max_wait=max_wait, autotick=autotick)

    # -- agents -----------------------------------------------------------------------------------

    def agent(self, name: str, *, parent: str | None = None) -> AgentHandle:
        """The handle agent ``name`` acts through: its verbs send, read and drain as ``name``,
        and only ``name``'s own mail. Given out once per mailbox, so who holds the handle is who
        ``name`` is.

        ``parent`` declares the agent that started ``name``: an action from it wakes ``name``,
        and a result from ``name`` wakes it. Recorded in the stream, so a restart knows it.
        """
        name = text(name, "name", "agent")
        if parent is not None:
            parent = text(parent, "parent", f"agent {name!r}")
            if parent == name:
                raise ValueError(f"agent {name!r}: an agent cannot be its own parent")
        with self._lock:
            handle = AgentHandle(self, name)  # refused if given out before
            if parent is not None:
                try:
                    self._commit(lambda state: ([] if state.box(name).parent == parent else [
                        MailAgent(agent=name, parent=parent, at=self._clock())], None))
                except BaseException:
                    del self._handles[name]  # nothing was given out
                    raise
        return handle

    @property
    def sends_waiting(self) -> int:
        """How many sends wait to share the next commit of a durable store (while another
        send's commit runs, those that arrive queue and go in one transaction)."""
        return 0 if self._group is None else self._group.queued

    # -- sending ----------------------------------------------------------------------------------

    def _send(self, sender: str, recipient: str, body: Any, kind: str, thread: str | None,
              correlation_id: str | None, id: str | None) -> Receipt:
        """Queue ``body`` for ``recipient`` from ``sender`` (a handle's name: checked when the
        handle was made); see the module's rules.

        Raises ``TypeError``/``ValueError`` for bad input and :class:`MailboxFullError` at the
        bound (default policy), leaving everything unchanged.
        """
        if (type(recipient) is not str or not recipient
                or (thread is not None and (type(thread) is not str or not thread))
                or (correlation_id is not None and type(correlation_id) is not str)):
            recipient, thread, correlation_id = send_names(recipient, thread, correlation_id)
        if type(body) is not str or not body.isascii():  # (plain ASCII text needs no check)
            body = checked_body(body, "send to {!r}", recipient)
        cls = KIND_ALIASES.get(kind) if type(kind) is str else None
        if cls is None:
            cls = kind_of(kind, f"send to {recipient!r}")  # raises, naming the kinds
        given = id is not None
        if id is None:
            id = self._new_id()
        elif type(id) is not str or not id:
            id = text(id, "id", f"send to {recipient!r}")
        event = MailSent(id, sender, recipient, body, cls, thread or "", correlation_id,
                         at=self._clock())
        if self._journal is None and not given:
            # Nothing to append nor to look up by id: with room in the queue and the recipient
            # not attached, what :func:`~nous_inbox.mailbox.changes.sent` computes is the
            # MailSent alone, so it is folded as it is (the in-memory send's speed floor).
            state = self._state
            with self._lock:
                box = state.boxes.get(recipient)
                folded = (box is None or box.queued < self._max_queue) and not self._attached
                if folded:
                    state.apply(event)
            if folded:
                if self._subscribers:
                    self._announce((event,))
                return Receipt(id, "queued")
        if self._group is not None and not given and not held(self._lock):
            # Durable, and nothing to look up by id: share a transaction with concurrent sends.
            stored: Sequence[Event] = [commit_in_threads(self._group, self._queue_lock, event,
                                                         self._commit_sends)]
            receipt = Receipt(id, "queued")
        else:
            with self._lock:
                stored, receipt = self._commit(self._sent, event, given)
        if self._subscribers or self._attached:
            self._announce(stored)
        return receipt

    def _commit_sends(self, events: Sequence[Event]) -> Sequence[Event]:
        """A group commit's batch of sends (ids of their own, none sent before): one append when
        none of them needs more than its ``MailSent`` (no bound reached, no first turn to mark);
        else refused before anything is written, so each is sent on its own (``settle``)."""
        with self._lock:
            if len(events) == 1:
                stored, _ = self._commit(self._sent, events[0], False)
                return [stored[-1]]  # its MailSent comes last

            def change(state: MailboxState) -> tuple[Sequence[Event], None]:
                counts: dict[str, int] = {}
                for event in cast("Sequence[MailSent]", events):
                    recipient = event.recipient
                    n = counts[recipient] = counts.get(recipient, 0) + 1
                    if state.box(recipient).queued + n > self._max_queue or self._worked(
                            state, recipient):
                        raise ValueError("a send of this batch needs more than its message")
                return events, None

            return self._commit(change)[0]

    def _sent(
        self, event: MailSent, given: bool, state: MailboxState
    ) -> tuple[Sequence[Event], Receipt]:
        """What a send appends (:func:`~nous_inbox.mailbox.changes.sent`), by this mailbox's
        bound and its attached agents' turns."""
        return sent(event, given, self._bound, self._worked(state, event.recipient), state)

    def _worked(self, state: MailboxState, agent: str) -> bool:
        """Whether attached ``agent`` had a turn its mailbox has not recorded yet."""
        link = self._attached.get(agent)
        return (link is not None and not state.box(agent).started
                and link.owner.session.turn > 0)

    def _announce(self, stored: Sequence[Event]) -> None:
        """Tell a sent message's subscribers, and its attached recipient (who hears of it at
        its next step when running); outside the lock, so either may send."""
        for message in reversed(stored):
            if type(message) is MailSent:
                break
        else:
            return
        recipient = message.recipient
        for callback in self._subscribers.get(recipient, ()):
            try:
                callback(message)
            except Exception:
                logger.exception("a mailbox subscriber of %r failed on message %r",
                                 recipient, message.id)
        if self._attached and recipient in self._attached:
            self.tick((recipient,))

    def _reply(self, agent: str, thread: str, body: Any, *, to: str | None = None,
               kind: str = "reply", id: str | None = None) -> Receipt:
        """``agent`` answers ``thread``: into the original sender's inbox, same thread, waking
        nobody unless ``kind`` says so (a counter-question as a ``"blocker"``).

        ``to`` is whom to answer (default: the newest other writer in the thread). The reply
        goes under the thread the answered message named, or none (then, in ``to``'s inbox, it
        is the replier's thread). It marks every message of ``to``'s in the thread answered, in
        the same append, so a crash leaves both or neither; a retry with the same ``id`` carries
        nothing again but still marks what is left unanswered.
        """
        thread = text(thread, "thread", f"reply of {agent!r}")
        where = f"reply of {agent!r} in thread {thread!r}"
        if to is not None:
            to = text(to, "to", where)
        body = checked_body(body, where)
        cls = kind_of(kind, where)
        given = id is not None
        id = self._new_id() if id is None else text(id, "id", where)
        with self._lock:
            self._catch_up()
            found = self._thread(agent, thread, where)
            mails = found.mails
            if to is None:
                others = [m for m in mails if m.event.sender != agent]
                if not others:
                    raise LookupError(f"{where}: no message from another agent to answer")
                to = others[-1].event.sender
            answered = [m.id for m in mails if m.event.sender == to]
            if not answered:
                raise LookupError(f"{where}: {to!r} wrote nothing in this thread to answer")
            newest = next(m for m in reversed(mails) if m.event.sender == to)
            event = MailSent(id=id, sender=agent, recipient=to, body=body, kind=cls,
                             thread=newest.event.thread and found.key,
                             correlation_id=newest.event.correlation_id, at=self._clock())

            def change(state: MailboxState) -> tuple[Sequence[Event], Receipt]:
                events, receipt = self._sent(event, given, state)
                still = tuple(i for i in answered
                              if (m := state.mail(i)) is not None and m.answered_by is None)
                if still:
                    events = [*events, MailAnswered(recipient=agent, ids=still, by=id,
                                                    at=event.at)]
                return events, receipt

            stored, receipt = self._commit(change)
        self._announce(stored)
        return receipt

    def _withdraw(self, id: str, *, sender: str) -> str:
        """``sender`` takes back message ``id``: ``"withdrawn"`` if no notice carried it yet (it
        is unsent), ``"retracted"`` if one did or one on its way does (it stays in its thread,
        marked retracted). A message already gone answers what became of it. Another agent's
        message is refused, saying no more than that it is not ``sender``'s."""
        id = text(id, "id", f"withdraw by {sender!r}")
        with self._lock:
            _, answer = self._commit(withdrawn, id, sender, self._clock(), self._carried)
        return answer

    # -- receiving --------------------------------------------------------------------------------

    def _receive(self, agent: str, *, limit: int = 50) -> list[MailSent]:
        """Take up to ``limit`` of ``agent``'s queued messages, oldest first; they leave the
        mailbox. ``agent`` is a handle's name (checked when the handle was made)."""
        if type(limit) is not int or limit < 0:
            raise ValueError(f"receive for {agent!r}: limit must be an int >= 0, got {limit!r}")

        with self._lock:
            _, taken = self._commit(received, agent, limit, self._clock())
        return taken

    def subscribe(self, agent: str, callback: Subscriber) -> None:
        """Call ``callback(message)`` for every message sent to ``agent`` from now on.

        Called on the sender's thread, outside the mailbox's lock (so it may send); one that
        raises is logged, and the others still run.
        """
        agent = text(agent, "agent", "subscribe")
        if not callable(callback):
            raise TypeError(f"subscribe to {agent!r}: callback must be callable")
        with self._lock:
            self._subscribers[agent] = [*self._subscribers.get(agent, ()), callback]

    def pending(self, agent: str) -> int:
        """How many messages wait for ``agent``: neither received, read nor withdrawn."""
        agent = text(agent, "agent", "pending")
        with self._lock:
            self._catch_up()
            return self._state.pending(agent)

    def dropped(self, agent: str) -> int:
        """How many of ``agent``'s messages ``drop_oldest`` let go of, ever."""
        agent = text(agent, "agent", "dropped")
        with self._lock:
            self._catch_up()
            return self._state.box(agent).dropped

    def status(self, id: str) -> str | None:
        """What became of message ``id`` (``None`` if it was never sent, or was forgotten)."""
        id = text(id, "id", "status")
        with self._lock:
            self._catch_up()
            answer = receipt(self._state, id)
        return None if answer is None else answer.state

    def _threads(self, agent: str) -> list[ThreadSummary]:
        """``agent``'s threads, the most recent first."""
        with self._lock:
            self._catch_up()
            result = []
            for thread in self._state.threads(agent):
                newest = thread.newest.event
                result.append(ThreadSummary(thread.key, thread.senders, len(thread.mails),
                                            thread.unread, thread.new, newest.at,
                                            preview(newest.body)))
            return result

    def _read_thread(self, agent: str, thread: str) -> list[Letter]:
        """Read ``agent``'s ``thread`` whole and mark it read."""
        thread = text(thread, "thread", f"read of {agent!r}")
        where = f"read of thread {thread!r} of {agent!r}"
        with self._lock:
            self._catch_up()
            mails = self._thread(agent, thread, where).mails
            letters = [letter(m) for m in mails]
            unread = tuple(m.id for m in mails if not m.read)
            if unread:
                self._commit(lambda state: (
                    [MailRead(recipient=agent, ids=unread, at=self._clock())], None))
            return letters

    # -- the state --------------------------------------------------------------------------------

    @property
    def state(self) -> MailboxState:
        """The folded state (read it under no illusions: it changes as mail moves)."""
        return self._state

    def events(self) -> list[Event]:
        """The mailbox's stored events (none without a store)."""
        return [] if self._store is None else list(self._store.read(self._stream))

    def close(self) -> None:
        """Stop the notice timer; close the store if the mailbox opened it from a URL."""
        self._stop_delivery()
        if self._owns_store and self._store is not None:
            self._store.close()

    def __enter__(self) -> Mailbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _thread(self, agent: str, thread: str, where: str) -> Thread:
        found = self._state.thread(agent, thread)
        if found is None:
            raise LookupError(f"{where}: no such thread")
        return found

    def _fold(self, events: Sequence[Event]) -> None:
        for event in events:
            self._state.apply(event)
            # An ask ends when its question is answered or let go unanswered: wake the askers
            # on any event but a send, so none waits on for a question that is gone.
            if self._wakers and type(event) is not MailSent:
                for wake in list(self._wakers):
                    wake()

    def _catch_up(self) -> bool:
        """Fold in what other writers appended to the stream; whether there was any."""
        return self._journal is not None and bool(self._journal.catch_up())

    def _commit(
        self, change: Callable[..., tuple[Sequence[Event], _T]], *args: Any
    ) -> tuple[Sequence[Event], _T]:
        """Append what ``change(*args, state)`` computes, then fold it; called with the lock.
        With a store, through the journal's one retry loop (its ``on_events`` folds the state
        the change reads); without one there is nobody to race: the change is folded."""
        journal = self._journal
        if journal is None:
            events, result = change(*args, self._state)
            self._fold(events)
            return events, result
        journal.catch_up()  # the change reads the state: let it see every writer's events
        return journal.commit(lambda _: change(*args, self._state))


def _counted(prefix: str) -> Callable[[], str]:
    """Ids ``prefix`` + 1, 2, 3, ...: the prefix random per mailbox, so processes sharing a
    store never make up the same id."""
    # Built of C callables (no Python frame per id): a send makes one.
    return map(prefix.__add__, map(str, itertools.count(1))).__next__
