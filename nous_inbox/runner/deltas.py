"""Text deltas: the model's words handed to live readers while it produces them.

A person watching an agent wants to read its answer as it is written, not only once the reply is
whole. A run that streams (an adapter over a framework's streamed response) hands each piece of
text to its session's :class:`Deltas` with :meth:`Deltas.say`; every reader that asked for deltas
(``AsyncOwner.events(after, deltas=True)``, ``Owner.follow(deltas=True)``, the web face's event
stream with ``?deltas=1``) gets it as a :class:`TextDelta`, stamped with the turn and step the
piece belongs to.

A delta is not an event. Nothing of it is logged, numbered or replayed: the reply it is part of
is, as one ``ModelReplied``, once the model has finished it. So a reader that reconnects reads
the logged events exactly as before, and a delta's text is never the record of what was said.
Saying a delta never waits for a reader: each reader's buffer is its own, bounded, and a slow
reader gets the pieces it has not read yet joined into one (see :mod:`nous_inbox.owner.event_readers`).

An adapter finds its session's outlet with :func:`deltas_of`; a port without one (the in-memory
:class:`~nous_inbox.runner.LocalSession`, a port of one's own) gives a silent outlet whose
``listening`` is ``False``, so the adapter streams nothing nobody would read:

>>> heard = []
>>> deltas = Deltas(lambda: (1, 2))          # the session is at turn 1, step 2
>>> unsubscribe = deltas.subscribe(heard.append)
>>> deltas.listening
True
>>> deltas.say("Hel"); deltas.say("lo")
>>> [(d.text, d.turn, d.step) for d in heard]
[('Hel', 1, 2), ('lo', 1, 2)]
>>> unsubscribe(); deltas.listening
False
>>> deltas_of(object()).listening             # a port without an outlet: nobody listens
False
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final

import msgspec

__all__ = ["Deltas", "TextDelta", "deltas_of"]

logger: Final = logging.getLogger("nous_inbox.runner.deltas")


class TextDelta(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag="text_delta"):
    """A piece of the model's reply in ``turn``'s ``step``, as it was produced: ``text`` follows
    the pieces before it. Not an event: it has no ``seq`` and is never logged (the whole reply
    is, as that step's ``ModelReplied``)."""

    text: str
    turn: int
    step: int


Reader = Callable[[TextDelta], object]
"""What :meth:`Deltas.subscribe` takes: called with each delta on the thread that says it, so it
must only hand the delta on (to a buffer of its own) and never wait."""


def _nowhere() -> tuple[int, int]:
    return 0, 0


class Deltas:
    """One session's outlet for text deltas: a run says each piece with :meth:`say`, and every
    subscribed reader is handed it at once, on the saying thread.

    ``where()`` gives the session's ``(turn, step)`` now, which stamps each delta (a run
    streams inside a step it has already recorded). Subscribing and saying are safe from any
    thread; saying costs nothing while nobody listens.
    """

    __slots__ = ("__weakref__", "_lock", "_readers", "_where")

    def __init__(self, where: Callable[[], tuple[int, int]] = _nowhere) -> None:
        self._where = where
        self._lock = threading.Lock()  # for subscribers only: say reads the tuple as it is
        self._readers: tuple[Reader, ...] = ()

    @property
    def listening(self) -> bool:
        """Whether any reader asked for deltas now: a run may skip streaming while none does."""
        return bool(self._readers)

    def say(self, text: str) -> None:
        """Hand ``text``, the next piece of the model's reply, to every reader listening now.
        Never waits, and a reader that fails is logged and left out of this delta only; a
        ``text`` that is not a ``str`` is a runner's bug, refused with ``TypeError`` while
        anyone listens (checked only then, so saying costs nothing while nobody does). An empty
        piece is not said."""
        readers = self._readers
        if not readers:
            return
        if type(text) is not str:
            raise TypeError(f"Deltas.say: text must be a str, got {type(text).__name__}")
        if not text:
            return
        turn, step = self._where()
        delta = TextDelta(text=text, turn=turn, step=step)
        for reader in readers:
            try:
                reader(delta)
            except Exception:
                logger.exception("a text delta reader failed")

    def subscribe(self, reader: Reader) -> Callable[[], None]:
        """Hand ``reader`` every delta said from now on; returns the call that stops it."""
        if not callable(reader):
            raise TypeError(f"Deltas.subscribe needs a callable, got {type(reader).__name__}")
        with self._lock:
            self._readers = (*self._readers, reader)

        def unsubscribe() -> None:
            with self._lock:
                self._readers = tuple(r for r in self._readers if r is not reader)

        return unsubscribe


class _Silent(Deltas):
    """The outlet of a port that has none: nobody can listen, so nothing said goes anywhere."""

    __slots__ = ()

    def subscribe(self, reader: Reader) -> Callable[[], None]:
        raise TypeError("this port has no text-delta outlet: nobody can read its deltas "
                        "(an owner's port has one)")


SILENT: Final[Deltas] = _Silent()
"""The outlet of a port that has none: nobody ever listens, so nothing said goes anywhere."""


def deltas_of(port: object) -> Deltas:
    """The text-delta outlet of the session behind ``port`` (an owner's port has one), or
    :data:`SILENT` for a port without one. An adapter asks it once per turn and calls
    ``say(text)`` for each piece of text its framework streams."""
    deltas = getattr(port, "deltas", None)
    return deltas if isinstance(deltas, Deltas) else SILENT
