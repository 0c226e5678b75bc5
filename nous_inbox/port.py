"""The session port: what a runner needs from a session, and ``LocalSession``, the in-memory one.

A run reads and writes its session through three members. ``session`` is the folded
:class:`~nous_inbox.session.Session` (the runner reads it as a turn opens, for the turn number and
transcript, and at a would-be final answer, for whether a waking message is pending).
``claim(target, *, wake_only=False)`` drains one queue *and records the claim* in one atomic step
(the claim is the transcript entry, ruling 6) and returns ``(messages, event)``: the messages in
send order and the ``QueueClaimed`` it recorded, or ``((), None)`` when nothing was claimed (an
empty claim records nothing). ``wake_only=True`` is the claim a run makes where it would otherwise
stop: the core's ``Inbox.claim(target, wake_only=True)`` decides, on the session as it stands at
that moment, whether a queued waking entry is worth a model round; if not, nothing is claimed. ``record(event)`` durably appends one event and returns it as recorded, ``seq`` and
``at`` set. An owner implements these over its store; :class:`LocalSession` implements them over
a list, for tests, examples and single-process hosts.

>>> local = LocalSession()
>>> local.inject("recall: the deploy is frozen").seq, local.steer("stop and summarize").seq
(1, 2)
>>> messages, event = local.claim("next_step")
>>> [m.content for m in messages], (event.count, event.seq)
(['recall: the deploy is frozen', 'stop and summarize'], (2, 3))
>>> local.claim("next_step")
((), None)
>>> _ = local.inject("fyi"); local.claim("next_step", wake_only=True)   # an injection alone
((), None)
>>> replay(local.events) == local.session
True

:func:`check_port` is the rehearsal the runner makes before a turn starts (ruling 7): a port it
could not call the way it calls one is refused with a ``TypeError`` naming the class, what was
found and the fix, rather than failing mid-run or, worse, silently never delivering.
"""

from __future__ import annotations

import abc
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol, runtime_checkable

import msgspec

from nous_inbox.events import EVENT_TYPES, Event, MessageSent, QueueClaimed
from nous_inbox.inbox import Target, as_message, as_target
from nous_inbox.message import Message
from nous_inbox.session import Session, replay

__all__ = ["LocalSession", "SendPresets", "SessionPort", "check_port", "sent_event"]

_EVENT_TYPES: Final = frozenset(EVENT_TYPES)


@runtime_checkable
class SessionPort(Protocol):
    """What the runner needs from a session: its state, an atomic claim, and a durable record."""

    @property
    def session(self) -> Session:
        """The session folded so far (turn number, transcript, inbox)."""

    def claim(
        self, target: Target, *, wake_only: bool = False
    ) -> tuple[Sequence[Message], QueueClaimed | None]:
        """Drain ``target`` and record the claim atomically; ``((), None)`` if nothing was
        claimed. ``wake_only``: claim only if ``Inbox.claim(target, wake_only=True)`` would."""

    def record(self, event: Event) -> Event:
        """Durably append ``event``; return it as recorded (``seq`` and ``at`` set)."""


_PORT_FIX: Final = (
    "A session port needs `session` (a property holding the folded Session), "
    "`claim(self, target, *, wake_only=False)` and `record(self, event)`; see "
    "nous_inbox.port.SessionPort."
)


def check_port(port: object) -> None:
    """Refuse, with a ``TypeError`` naming the class, what was found and the fix, a port the
    runner could not call the way it calls one (ruling 7: refused before the run starts).

    A signature that cannot be read (a C function behind ``functools.partial``) is let through,
    since an unreadable signature is no evidence of a wrong one.

    >>> class Drain:
    ...     session = Session()
    ...     def claim(self):
    ...         return (), None
    ...     def record(self, event):
    ...         return event
    >>> check_port(Drain())
    Traceback (most recent call last):
    ...
    TypeError: Drain.claim() cannot be called the way the runner calls it: claim(target), with the queue to claim as one positional argument. Widen the signature in the class body: `def claim(self, target, *, wake_only=False)`.

    A claim written before ``wake_only`` existed is refused too, with the same fix:

    >>> class OldDrain(Drain):
    ...     def claim(self, target):
    ...         return (), None
    >>> check_port(OldDrain())
    Traceback (most recent call last):
    ...
    TypeError: OldDrain.claim(target) cannot take the keyword wake_only, which the runner passes where a run would otherwise stop (the core's Inbox.claim(target, wake_only=True) decides). Widen the signature in the class body: `def claim(self, target, *, wake_only=False)`.
    """
    cls = type(port).__name__
    for name in ("session", "claim", "record"):
        try:
            found = inspect.getattr_static(port, name)
        except AttributeError:
            raise TypeError(f"{cls} has no {name!r}, so it cannot be a session port. {_PORT_FIX}") from None
        if name == "session":
            if inspect.isfunction(found) or isinstance(found, (classmethod, staticmethod)):
                raise TypeError(
                    f"{cls}.session is a method, but the runner reads it as a value: make it a "
                    f"property (`@property def session(self) -> Session`). {_PORT_FIX}"
                )
            continue
        member = getattr(port, name)
        if not callable(member):
            raise TypeError(f"{cls}.{name} is a {type(member).__name__}, not callable. {_PORT_FIX}")
        try:
            signature = inspect.signature(member)
        except (TypeError, ValueError):
            continue
        arg = "target" if name == "claim" else "event"
        what = "the queue to claim" if name == "claim" else "the event to record"
        fix = "def claim(self, target, *, wake_only=False)" if name == "claim" else "def record(self, event)"
        try:
            signature.bind(Target.NEXT_STEP)
        except TypeError:
            raise TypeError(
                f"{cls}.{name}{signature} cannot be called the way the runner calls it: "
                f"{name}({arg}), with {what} as one positional argument. Widen the signature "
                f"in the class body: `{fix}`."
            ) from None
        if name == "claim":
            try:
                signature.bind(Target.NEXT_STEP, wake_only=True)
            except TypeError:
                raise TypeError(
                    f"{cls}.claim{signature} cannot take the keyword wake_only, which the runner "
                    "passes where a run would otherwise stop (the core's Inbox.claim(target, "
                    "wake_only=True) decides). Widen the signature in the class body: "
                    f"`{fix}`."
                ) from None


def sent_event(message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
    """Check a send's three parts and build its ``MessageSent`` (``seq`` is left for the log).

    Whoever records sends calls this first, so bad input raises before anything is written.

    >>> sent_event("go", "next_step", True).message.content
    'go'
    >>> sent_event("go", "next_step", "yes")
    Traceback (most recent call last):
    ...
    TypeError: wakeup must be a bool, got str
    """
    if type(wakeup) is not bool:
        raise TypeError(f"wakeup must be a bool, got {type(wakeup).__name__}")
    return MessageSent(target=as_target(target), wakeup=wakeup, message=as_message(message))


class SendPresets(abc.ABC):
    """``steer``, ``inject`` and ``followup`` defined once, over a class's own ``send``."""

    @abc.abstractmethod
    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` (the primitive); returns the recorded ``MessageSent``."""

    def steer(self, message: Message | str) -> MessageSent:
        """Next step, wakes: "read this before your next model request"."""
        return self.send(message, Target.NEXT_STEP, True)

    def inject(self, message: Message | str) -> MessageSent:
        """Next step, no wake: "have this to hand if you make another request"."""
        return self.send(message, Target.NEXT_STEP, False)

    def followup(self, message: Message | str) -> MessageSent:
        """Next turn, wakes: "answer this after you finish what you are doing"."""
        return self.send(message, Target.NEXT_TURN, True)


class LocalSession(SendPresets):
    """An in-memory, thread-safe session port: the inbox and its event log in one process.

    Sends (``steer``, ``inject``, ``followup``, ``send``) and the runner's claims and records all
    append to one event list under one lock, and fold into ``session`` as they do; so
    ``replay(local.events) == local.session`` at every moment. Give it earlier ``events`` to resume.

    >>> local = LocalSession()
    >>> _ = local.followup("later")
    >>> LocalSession(local.events).session == local.session
    True
    """

    def __init__(
        self, events: Iterable[Event] = (), *, clock: Callable[[], float] = time.time
    ) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = list(events)
        self._session = replay(self._events)
        self._clock = clock

    @property
    def session(self) -> Session:
        """The session as the events so far fold it."""
        return self._session

    @property
    def events(self) -> tuple[Event, ...]:
        """Every event recorded, in order (a snapshot)."""
        with self._lock:
            return tuple(self._events)

    def send(self, message: Message | str, target: Target | str, wakeup: bool) -> MessageSent:
        """Queue ``message`` on ``target`` (the primitive); returns the recorded ``MessageSent``."""
        sent = sent_event(message, target, wakeup)
        with self._lock:
            return self._append(sent)  # type: ignore[return-value]

    def claim(
        self, target: Target | str, *, wake_only: bool = False
    ) -> tuple[Sequence[Message], QueueClaimed | None]:
        """Drain ``target`` and record the claim, atomically; ``((), None)`` if nothing was
        claimed (``wake_only``: see :class:`SessionPort`)."""
        where = as_target(target)
        with self._lock:
            claimed, _ = self._session.inbox.claim(where, wake_only=wake_only)
            if not claimed:
                return (), None
            event = self._append(QueueClaimed(target=where, count=len(claimed)))
            return tuple(claimed), event  # type: ignore[return-value]

    def record(self, event: Event) -> Event:
        """Append ``event``, numbered and timed; returns it as recorded.

        An event that does not fold (a claim count the inbox cannot meet) raises ``ReplayError``
        and nothing changes.
        """
        if type(event) not in _EVENT_TYPES and not isinstance(event, EVENT_TYPES):
            raise TypeError(f"record needs an event, got {type(event).__name__}")
        with self._lock:
            return self._append(event)

    def _append(self, event: Event) -> Event:
        stamped = msgspec.structs.replace(event, seq=self._session.version + 1, at=self._clock())
        self._session = self._session.apply(stamped)
        self._events.append(stamped)
        return stamped

    def __repr__(self) -> str:
        s = self._session
        return f"LocalSession(events={s.version}, turn={s.turn}, inbox={s.inbox!r})"
