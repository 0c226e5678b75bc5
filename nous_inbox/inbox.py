"""Inbox: two ordered queues of messages waiting to enter a run.

A run in progress is usually unreachable: a message sent to it is dropped, queued behind the whole
run, or it cancels the work. An inbox is the third way. A run claims from it at two boundaries,
once when a turn opens (``next_turn``) and again at every step boundary, right before the model
request (``next_step``), so a message that arrives mid-run joins the *next* request.

``send(message, target, wakeup)`` is the primitive; the presets ``steer``, ``inject`` and
``followup`` are the send verbs of :mod:`nous_inbox.verbs`, whose table says the queue each joins
and whether it wakes an idle agent (``steer``: next step, wakes; ``inject``: next step, no wake;
``followup``: next turn, wakes).

>>> inbox = Inbox().inject("recall: the deploy is frozen").steer("stop and summarize")
>>> inbox.wants_wake()
True
>>> claimed, inbox = inbox.claim("next_step")
>>> [m.content for m in claimed]
['recall: the deploy is frozen', 'stop and summarize']
>>> inbox.has_pending()
False

The value is immutable and persistent: every operation returns a new inbox and leaves the old one
usable, and equal contents mean equal values and equal hashes.

Design notes. Each queue is a ``pyrsistent.pvector`` of ``Queued(message, wakeup, seq)``
entries (``seq``: the number of the send that queued it, what :meth:`Inbox.withdraw` names it
by; 0 on a bare inbox), and the
inbox also keeps, per queue, two flags: an entry asked for a wake, and one of those is worth a
model round (not blank, ruling 4: the message decided that when it was built,
:attr:`Message.blank <nous_inbox.message.Message.blank>`). The flags only ever turn on as
entries arrive and are reset by the claim that empties the queue. So ``count``, ``has_pending``,
``wants_wake`` and ``worth_waking`` read a field or two, and ``claim`` hands back the drained
vector itself behind a read-only view: none of them grows with the queue. The wake intent belongs
to each entry, not to the inbox, because it must survive being queued: a steer that lands after a
run's last claim is still pending when the run ends, and that entry is what says a new run is
owed. An inbox and each queued entry are built with ``gc=False``: they hold only messages,
which hold only JSON-able values, so they can never be part of a reference cycle. That matters
for a send's cost, not only its size: an entry the cyclic collector tracked would make it walk
the whole young vector at each of its passes, so a send would cost more the longer the queue.
:meth:`Inbox.entries` shows the entries as ``(message, wakeup)`` pairs.

Every claim decision lives here, pure: ``claim(target)`` at a turn or step boundary, and
``claim(target, wake_only=True)`` where a run would otherwise stop, which claims only when
``worth_waking(target)``. A driver asks; it never inspects the queues itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
from pyrsistent import PVector, pvector

from nous_inbox.errors import DecodeError
from nous_inbox.message import Message, enc_hook
from nous_inbox.queued import NO_ENTRIES, Claimed, Entries, Entry, Queued
from nous_inbox.verbs import FOLLOWUP, INJECT, STEER, Target

__all__ = ["Inbox", "as_message", "as_target", "as_wakeup", "is_blank"]


_NOTHING_CLAIMED: Final = Claimed()
_TURN: Final = Target.NEXT_TURN
_STEP: Final = Target.NEXT_STEP
# Each preset's queue and wake, read from the verb table once: a preset is the hottest send.
_STEER_AT, _STEER_WAKES = STEER.target, STEER.wakeup
_INJECT_AT, _INJECT_WAKES = INJECT.target, INJECT.wakeup
_FOLLOWUP_AT, _FOLLOWUP_WAKES = FOLLOWUP.target, FOLLOWUP.wakeup


def as_target(target: object) -> Target:
    """Normalize ``target`` to a :class:`Target`, or raise ``ValueError`` naming the choices.

    >>> as_target("next_step") is Target.NEXT_STEP
    True
    >>> as_target("later")
    Traceback (most recent call last):
    ...
    ValueError: target must be 'next_turn' or 'next_step', got 'later'
    """
    if target == "next_step":  # a Target is a str: both spellings match
        return _STEP
    if target == "next_turn":
        return _TURN
    raise ValueError(f"target must be 'next_turn' or 'next_step', got {target!r}")


def as_message(message: object) -> Message:
    """A ``Message`` passes through untouched; a ``str`` becomes a user message; else TypeError.

    >>> as_message("hi") == Message.user("hi")
    True
    >>> as_message(42)
    Traceback (most recent call last):
    ...
    TypeError: message must be a Message or a str, got int
    """
    if isinstance(message, Message):
        return message
    if isinstance(message, str):
        return Message.user(message)
    raise TypeError(f"message must be a Message or a str, got {type(message).__name__}")


def as_wakeup(wakeup: object) -> bool:
    """A ``bool`` passes through; anything else (``1``, ``"yes"``, ``None``) is a TypeError.

    Whoever takes a send's parts checks them in one order, message, target, then wakeup
    (:meth:`Inbox.send`, :func:`~nous_inbox.store.journal.sent_event`,
    :meth:`Journal.send <nous_inbox.store.journal.Journal.send>`), so a send with several bad parts
    raises the same error wherever it is made. A hot path tests ``type(wakeup) is not bool``
    itself and calls this only to raise.

    >>> as_wakeup(True)
    True
    >>> as_wakeup(1)
    Traceback (most recent call last):
    ...
    TypeError: wakeup must be a bool, got int
    """
    if type(wakeup) is not bool:
        raise TypeError(f"wakeup must be a bool, got {type(wakeup).__name__}")
    return wakeup


def is_blank(messages: Iterable[Message]) -> bool:
    """Whether these messages hold nothing worth a model round: each one is
    :attr:`Message.blank <nous_inbox.message.Message.blank>` (ruling 4), as decided when it
    was built. The loop asks it of what a claim delivered.

    >>> is_blank([Message.user("  \\n")]), is_blank([Message.user(" "), Message.user("go")])
    (True, False)
    """
    return all(message.blank for message in messages)


_WAKE: Final = 1
"""A queue's flag: an entry on it asked for a wake."""
_WORTH: Final = 2
"""A queue's flag: an entry on it asked for a wake and is worth a model round (not blank)."""
_WAKE_WORTH: Final = _WAKE | _WORTH


def _flags_of(entries: Iterable[Queued]) -> int:
    """A queue's flags, worked out from its entries (a send keeps them up to date instead)."""
    flags = 0
    for entry in entries:
        if entry.wakeup:
            flags |= _WAKE if entry.message.blank else _WAKE_WORTH
    return flags


def _check_seq(seq: object, least: int) -> None:
    if type(seq) is not int:
        raise TypeError(f"seq must be an int, got {type(seq).__name__}")
    if seq < least:
        raise ValueError(f"seq must be an int >= {least}, got {seq}")


def _check_limit(limit: int) -> None:
    if type(limit) is not int:
        raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


class _WireInbox(msgspec.Struct, frozen=True):
    next_turn: list[Queued] = []
    next_step: list[Queued] = []


_json_encoder: Final = msgspec.json.Encoder(enc_hook=enc_hook)
_msgpack_encoder: Final = msgspec.msgpack.Encoder(enc_hook=enc_hook)
_json_decoder: Final = msgspec.json.Decoder(_WireInbox)
_msgpack_decoder: Final = msgspec.msgpack.Decoder(_WireInbox)


class Inbox(msgspec.Struct, frozen=True, gc=False):
    """The two-queue value. Every method returns a new inbox; the receiver is never changed.

    >>> Inbox() == Inbox.new()
    True
    >>> a = Inbox().followup("later")
    >>> b = a.steer("now")
    >>> a.count(), b.count(), b.count("next_step")
    (1, 2, 1)
    """

    _turn: PVector[Any] = NO_ENTRIES
    _step: PVector[Any] = NO_ENTRIES
    _turn_flags: int = 0  # _WAKE | _WORTH, of the entries on next_turn
    _step_flags: int = 0

    @classmethod
    def new(cls) -> Inbox:
        """An empty inbox (the same as ``Inbox()``)."""
        return _EMPTY_INBOX

    # -- sending ---------------------------------------------------------------------------------

    def send(self, message: Message | str, target: Target | str, wakeup: bool,
             seq: int = 0) -> Inbox:
        """Queue ``message`` on ``target``, recording whether it should wake an idle agent.

        The primitive behind the presets. A ``str`` becomes ``Message.user(str)``; a ``Message``
        passes through untouched. A bad target is a ``ValueError``; a non-bool ``wakeup`` or a
        message of another type is a ``TypeError``. On error the inbox is unchanged (it always is).
        ``seq`` numbers the entry (the seq of the send's event, which a session's fold passes):
        what :meth:`withdraw` takes it back by; 0, the default, leaves it unnumbered.

        >>> Inbox().send("hi", "next_step", False).wants_wake()
        False
        >>> Inbox().send("hi", "next_step", 1)
        Traceback (most recent call last):
        ...
        TypeError: wakeup must be a bool, got int
        """
        if type(message) is not Message:
            message = as_message(message)
        if target is _STEP or target == "next_step":  # a Target is a str: both spellings match
            step = True
        elif target is _TURN or target == "next_turn":
            step = False
        else:
            as_target(target)  # raises the ValueError naming the choices
        if type(wakeup) is not bool:
            as_wakeup(wakeup)  # raises
        if type(seq) is not int or seq < 0:
            _check_seq(seq, 0)
        flags = (_WAKE if message.blank else _WAKE_WORTH) if wakeup else 0
        if step:
            return Inbox(self._turn, self._step.append(Queued(message, wakeup, seq)),
                         self._turn_flags, self._step_flags | flags)
        return Inbox(self._turn.append(Queued(message, wakeup, seq)), self._step,
                     self._turn_flags | flags, self._step_flags)

    def followup(self, message: Message | str) -> Inbox:
        """The ``followup`` verb: next **turn**, wakes, "answer this after you finish"."""
        return self.send(message, _FOLLOWUP_AT, _FOLLOWUP_WAKES)

    def steer(self, message: Message | str) -> Inbox:
        """The ``steer`` verb: next **step**, wakes, "read this before your next request"."""
        return self.send(message, _STEER_AT, _STEER_WAKES)

    def inject(self, message: Message | str) -> Inbox:
        """The ``inject`` verb: next **step** without waking, context for a request the agent
        makes anyway.

        >>> Inbox().inject("fyi").wants_wake()
        False
        """
        return self.send(message, _INJECT_AT, _INJECT_WAKES)

    # -- claiming --------------------------------------------------------------------------------

    def claim(
        self, target: Target | str, limit: int | None = None, *, wake_only: bool = False
    ) -> tuple[Claimed, Inbox]:
        """Take everything queued on ``target``, in send order, and return the drained inbox.

        The other queue is untouched; an empty claim returns an empty sequence and this same
        inbox. ``limit`` takes only the oldest ``limit`` messages and leaves the rest queued, in
        order, with their wake flags (for a host that owes a run exactly what was queued when it
        opened); a run's claims take everything.

        >>> inbox = Inbox().followup("later").steer("now")
        >>> claimed, inbox = inbox.claim("next_turn")
        >>> [m.content for m in claimed], inbox.has_pending("next_step")
        (['later'], True)
        >>> claimed, rest = Inbox().followup("a").followup("b").claim("next_turn", limit=1)
        >>> [m.content for m in claimed], [m.content for m, _ in rest.entries("next_turn")]
        (['a'], ['b'])

        ``wake_only`` is the claim a run makes where it would otherwise stop (a would-be final
        answer, a spent budget): it claims only if ``worth_waking(target)``, that is, only if
        a queued entry asked for a wake and holds something worth a model round, and otherwise
        returns the empty claim and this same inbox. An injection alone, or a blank steer, does
        not extend a run (rulings 2 and 4); when it does claim, it claims everything queued.

        >>> inbox = Inbox().inject("fyi").steer("   ")
        >>> claimed, same = inbox.claim("next_step", wake_only=True)
        >>> len(claimed), same is inbox
        (0, True)
        >>> claimed, _ = inbox.steer("stop").claim("next_step", wake_only=True)
        >>> [m.content for m in claimed]
        ['fyi', '   ', 'stop']
        """
        where = as_target(target)
        if wake_only is not False:
            if wake_only is not True:
                raise TypeError(f"wake_only must be a bool, got {type(wake_only).__name__}")
            if not (self._step_flags if where is _STEP else self._turn_flags) & _WORTH:
                if limit is not None:
                    _check_limit(limit)
                return _NOTHING_CLAIMED, self
        if limit is not None:
            return self._claim_oldest(where, limit)
        if where is _STEP:
            if not self._step:
                return _NOTHING_CLAIMED, self
            return Claimed(self._step), Inbox(self._turn, NO_ENTRIES, self._turn_flags, 0)
        if not self._turn:
            return _NOTHING_CLAIMED, self
        return Claimed(self._turn), Inbox(NO_ENTRIES, self._step, 0, self._step_flags)

    def _claim_oldest(self, where: Target, limit: int) -> tuple[Claimed, Inbox]:
        _check_limit(limit)
        queue = self._step if where is _STEP else self._turn
        if limit >= len(queue):
            return self.claim(where)
        if limit == 0:
            return _NOTHING_CLAIMED, self
        taken, kept = queue[:limit], queue[limit:]
        flags = _flags_of(kept)
        if where is _STEP:
            return Claimed(taken), Inbox(self._turn, kept, self._turn_flags, flags)
        return Claimed(taken), Inbox(kept, self._step, flags, self._step_flags)

    # -- withdrawing -----------------------------------------------------------------------------

    def withdraw(self, seq: int) -> tuple[Target | None, Inbox]:
        """Take back the entry numbered ``seq``, wherever it waits: the queue it left and the
        inbox without it, or ``(None, self)`` when no entry is numbered ``seq`` (never queued
        here, or claimed or withdrawn already). The entries behind it keep their order, and
        the queue's wake flags are worked out again from what stays (a withdrawn steer no
        longer wakes anyone). ``seq`` is an ``int >= 1``, else a ``TypeError`` or ``ValueError``.

        >>> inbox = Inbox().send("a", "next_step", True, seq=1).send("b", "next_step", False, seq=2)
        >>> where, rest = inbox.withdraw(1)
        >>> where, [m.content for m, _ in rest.entries("next_step")], rest.wants_wake()
        (<Target.NEXT_STEP: 'next_step'>, ['b'], False)
        >>> rest.withdraw(1) == (None, rest)
        True
        """
        _check_seq(seq, 1)
        where = self.holds(seq)
        if where is None:
            return None, self
        queue = self._step if where is _STEP else self._turn
        kept = queue.delete(next(i for i, entry in enumerate(queue) if entry.seq == seq))
        if where is _STEP:
            return where, Inbox(self._turn, kept or NO_ENTRIES, self._turn_flags, _flags_of(kept))
        return where, Inbox(kept or NO_ENTRIES, self._step, _flags_of(kept), self._step_flags)

    def holds(self, seq: int) -> Target | None:
        """The queue where the entry numbered ``seq`` waits, or ``None`` if none does.

        >>> Inbox().send("a", "next_turn", True, seq=4).holds(4), Inbox().holds(4)
        (<Target.NEXT_TURN: 'next_turn'>, None)
        """
        _check_seq(seq, 1)
        for where, queue in ((_STEP, self._step), (_TURN, self._turn)):
            for entry in queue:
                if entry.seq == seq:
                    return where
        return None

    def seqs(self, target: Target | str) -> list[int]:
        """The numbers of the entries queued on ``target``, in send order (0: unnumbered).

        >>> Inbox().send("a", "next_step", True, seq=3).inject("b").seqs("next_step")
        [3, 0]
        """
        return [entry.seq for entry in (self._step if as_target(target) is _STEP else self._turn)]

    # -- asking ----------------------------------------------------------------------------------

    def wants_wake(self, target: Target | str | None = None) -> bool:
        """Whether a queued entry asked for a wake (Nous's ``wake?``), on ``target`` or on either
        queue when ``target`` is None.

        It says what was *asked*; whether the ask is worth a model round is
        :meth:`worth_waking`, the question an owner asks before it starts a run.

        >>> inbox = Inbox().inject("fyi").steer("go")
        >>> inbox.wants_wake(), inbox.wants_wake("next_step"), inbox.wants_wake("next_turn")
        (True, True, False)
        """
        if target is None:
            return bool((self._turn_flags | self._step_flags) & _WAKE)
        return bool((self._step_flags if as_target(target) is _STEP else self._turn_flags) & _WAKE)

    def worth_waking(self, target: Target | str | None = None) -> bool:
        """Whether a queued entry asked for a wake **and** holds something worth a model round,
        on ``target`` or on either queue when ``target`` is None.

        This is the decision to start a run (an owner asks it when a message arrives and when a
        run ends) and to extend one at a would-be final answer (``claim(..., wake_only=True)``).
        A blank message (whitespace, or only invisible characters: ``Message.blank``) never
        earns a round of its own (ruling 4): it stays queued and rides along with the next
        request something else causes. A message with tool calls counts as worth it. Like
        ``wants_wake``, it reads flags kept as entries come and go, so it costs the same however
        long the queues are.

        >>> blank = Inbox().steer("  \\n")
        >>> blank.wants_wake(), blank.worth_waking()
        (True, False)
        >>> blank.followup("go on").worth_waking(), blank.followup("go on").worth_waking("next_step")
        (True, False)
        """
        if target is None:
            return bool((self._turn_flags | self._step_flags) & _WORTH)
        return bool((self._step_flags if as_target(target) is _STEP else self._turn_flags) & _WORTH)

    def has_pending(self, target: Target | str | None = None) -> bool:
        """Whether anything is queued on ``target``, or on either queue when ``target`` is None."""
        if target is None:
            return bool(self._turn) or bool(self._step)
        return bool(self._step if as_target(target) is _STEP else self._turn)

    def count(self, target: Target | str | None = None) -> int:
        """How many messages are queued on ``target``, or on both queues when it is None."""
        if target is None:
            return len(self._turn) + len(self._step)
        return len(self._step if as_target(target) is _STEP else self._turn)

    def entries(self, target: Target | str) -> Sequence[Entry]:
        """The ``(message, wakeup)`` entries queued on ``target``, in send order, without claiming.

        >>> Inbox().inject("a").steer("b").entries("next_step")
        [(Message(role='user', content='a'), False), (Message(role='user', content='b'), True)]
        """
        return Entries(self._step if as_target(target) is _STEP else self._turn)

    def __repr__(self) -> str:
        # A numbered entry shows its seq: two inboxes that differ only there are not equal.
        turn = [(e.message.content, e.wakeup, e.seq)[:3 if e.seq else 2] for e in self._turn]
        step = [(e.message.content, e.wakeup, e.seq)[:3 if e.seq else 2] for e in self._step]
        return f"Inbox(next_turn={turn!r}, next_step={step!r})"

    # -- serialization ---------------------------------------------------------------------------

    def _wire(self) -> _WireInbox:
        return _WireInbox(list(self._turn), list(self._step))

    def to_json(self) -> bytes:
        """Serialize to JSON bytes; ``Inbox.from_json`` gives back an equal inbox, wake flags too.

        >>> Inbox().inject("fyi").to_json()
        b'{"next_turn":[],"next_step":[{"message":{"role":"user","content":"fyi"},"wakeup":false}]}'
        """
        return _json_encoder.encode(self._wire())

    def to_msgpack(self) -> bytes:
        """Serialize to compact MessagePack bytes; ``Inbox.from_msgpack`` reads them back."""
        return _msgpack_encoder.encode(self._wire())

    @classmethod
    def from_json(cls, data: bytes | str) -> Inbox:
        """Read an inbox written by ``to_json``. Bad bytes raise ``DecodeError`` saying where.

        >>> Inbox.from_json(Inbox().steer("x").to_json()) == Inbox().steer("x")
        True
        >>> Inbox.from_json(b'{"next_step": [{"message": {"role": "user", "content": 7}, "wakeup": true}]}')
        Traceback (most recent call last):
        ...
        nous_inbox.errors.DecodeError: invalid inbox JSON: Expected `str`, got `int` - at `$.next_step[0].message.content`
        """
        if not isinstance(data, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"Inbox.from_json needs bytes or str, got {type(data).__name__}")
        return cls._from_wire(data, _json_decoder, "JSON")

    @classmethod
    def from_msgpack(cls, data: bytes) -> Inbox:
        """Read an inbox written by ``to_msgpack``. Bad bytes raise ``DecodeError`` saying where."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"Inbox.from_msgpack needs bytes, got {type(data).__name__}")
        return cls._from_wire(data, _msgpack_decoder, "MessagePack")

    @classmethod
    def _from_wire(cls, data: Any, decoder: Any, fmt: str) -> Inbox:
        try:
            wire: _WireInbox = decoder.decode(data)
        except RecursionError:
            raise DecodeError(f"invalid inbox {fmt}: nested too deeply") from None
        except (msgspec.DecodeError, TypeError, ValueError) as exc:
            raise DecodeError(f"invalid inbox {fmt}: {exc}") from None
        seqs = [entry.seq for entry in (*wire.next_turn, *wire.next_step) if entry.seq]
        if len(seqs) != len(set(seqs)):  # a seq names one send: a withdraw must find one entry
            twice = next(seq for seq in seqs if seqs.count(seq) > 1)
            raise DecodeError(f"invalid inbox {fmt}: the send at seq {twice} is queued twice")
        turn, step = pvector(wire.next_turn), pvector(wire.next_step)
        return cls(turn, step, _flags_of(turn), _flags_of(step))


_EMPTY_INBOX: Final = Inbox()
