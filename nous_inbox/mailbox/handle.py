"""An agent's handle on the mailbox: the verbs an agent acts through, as itself and on its own
mail only.

:meth:`Mailbox.agent <nous_inbox.mailbox.mailbox.Mailbox.agent>` gives out each agent's handle
once, so identity is held, not declared: whoever holds ``dev``'s handle sends as ``dev`` and reads
``dev``'s mail, and nobody else can list, read or drain it.

>>> from nous_inbox.mailbox import Mailbox
>>> box = Mailbox()
>>> lead, dev = box.agent("lead"), box.agent("dev", parent="lead")
>>> receipt = lead.send("dev", "which branch?", kind="question")
>>> [t.thread for t in dev.threads()]
['lead']
>>> _ = dev.reply("lead", "main")
>>> lead.ask("dev", "and the tag?", timeout=0)
Traceback (most recent call last):
...
nous_inbox.mailbox.answers.AskTimeoutError: ask of 'lead' to 'dev': no answer within 0 seconds (message ...-3 waits on)
>>> lead.message(receipt.id).state, lead.message(lead.send("dev", "x").id).recipient
('answered', 'dev')

A handle is its agent's identity in this mailbox, so it never leaves it: pickling or copying one
is a ``TypeError``. Another process opens a mailbox on the same store and takes the agent's
handle there.

A waited answer: :meth:`AgentHandle.ask` sends (a question, by default: it wakes the recipient)
and returns the reply once the recipient answers it; :meth:`AgentHandle.ask_async` is the same
for an asyncio host. Both wait on one body (:meth:`_Asking.answer`), woken when a reply lands or
the question is let go and, with a store another process may write to, looking again every
``POLL`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, NoReturn

from nous_inbox.events import MailRead, MailSent
from nous_inbox.mailbox.answers import (
    AskTimeoutError,
    Letter,
    Receipt,
    ThreadSummary,
    letter,
    not_yours,
)
from nous_inbox.mailbox.changes import receipt
from nous_inbox.mailbox.names import text

if TYPE_CHECKING:
    from nous_inbox.mailbox.mailbox import Mailbox

__all__ = ["AgentHandle"]

POLL: Final = 0.05
"""Seconds between looks at the store for a reply another process wrote."""


class AgentHandle:
    """Agent ``name``'s verbs on ``mailbox``; see the module. Get one from ``box.agent(name)``.

    A mailbox gives out each agent's handle once, whichever way it is asked: a second, by
    ``box.agent`` or by this class, is a ``ValueError`` and changes nothing.
    """

    __slots__ = ("_mailbox", "_name")

    def __init__(self, mailbox: Mailbox, name: str) -> None:
        name = text(name, "name", "agent")
        with mailbox._lock:
            if name in mailbox._handles:
                raise ValueError(f"agent {name!r}: its handle was already given out; "
                                 "pass that handle to whoever acts as it")
            mailbox._handles[name] = self
        self._mailbox = mailbox  # (private: holding a handle gives no way to other agents)
        self._name = name

    def __repr__(self) -> str:
        return f"<AgentHandle {self._name!r}>"

    def _stays(self, *_: object) -> NoReturn:
        """Refuse a pickle or a copy: a second handle, or one in another process, would be a
        second holder of this agent's identity."""
        raise TypeError(f"the handle of {self._name!r} cannot leave its mailbox (no pickle, no "
                        "copy): pass the handle itself; in another process, open a Mailbox on "
                        f"the same store and take box.agent({self._name!r}) there")

    __reduce_ex__ = __reduce__ = __copy__ = __deepcopy__ = _stays

    @property
    def name(self) -> str:
        """The agent this handle acts as (fixed: a handle is one agent's for good)."""
        return self._name

    def send(self, to: str, body: Any, *, kind: str = "action", thread: str | None = None,
             correlation_id: str | None = None, id: str | None = None) -> Receipt:
        """Send ``body`` to agent ``to``, of class ``kind``, in ``thread`` (default: this agent's
        name); ``id`` makes the send idempotent."""
        return self._mailbox._send(self._name, to, body, kind, thread, correlation_id, id)

    def reply(self, thread: str, body: Any, *, to: str | None = None, kind: str = "reply",
              id: str | None = None) -> Receipt:
        """Answer ``thread`` of this agent's mail, into the asker's inbox under the same thread:
        it marks what ``to`` (default: the newest other writer) wrote there answered. ``kind``
        other than ``"reply"`` makes it that class too: a counter-question as a ``"blocker"``
        wakes the asker, and still answers it."""
        return self._mailbox._reply(self._name, thread, body, to=to, kind=kind, id=id)

    def withdraw(self, id: str) -> str:
        """Take back message ``id`` this agent sent: ``"withdrawn"`` if no notice carried it yet,
        else ``"retracted"`` (it stays in its thread, marked so, and shows there as new)."""
        return self._mailbox._withdraw(id, sender=self._name)

    def receive(self, *, limit: int = 50) -> list[MailSent]:
        """Take up to ``limit`` of this agent's queued messages, oldest first."""
        return self._mailbox._receive(self._name, limit=limit)

    def threads(self) -> list[ThreadSummary]:
        """This agent's threads, the most recent first."""
        return self._mailbox._threads(self._name)

    def read(self, thread: str) -> list[Letter]:
        """Read this agent's ``thread`` whole and mark it read."""
        return self._mailbox._read_thread(self._name, thread)

    def pending(self) -> int:
        """How many messages wait for this agent."""
        return self._mailbox.pending(self._name)

    def message(self, id: str) -> Letter:
        """Message ``id``, if this agent sent or received it (``PermissionError`` otherwise)."""
        return _message(self._mailbox, self._name, id)

    def ask(self, to: str, body: Any, *, timeout: float | None = None, kind: str = "question",
            thread: str | None = None) -> Letter:
        """Send ``body`` to ``to`` and wait up to ``timeout`` seconds (None: for ever) for the
        reply, which it returns (marked read). On timeout, :class:`AskTimeoutError` (a
        ``TimeoutError``) carries the question's ``id``: the question stays sent, so
        :meth:`message` finds its answer later, or :meth:`withdraw` takes it back.

        The question goes in ``thread``, by default a thread of its own named by its id: a reply
        answers every message of the asker's in its thread, so asks sharing one get one reply."""
        asking = _Asking(self, to, body, timeout, kind, thread)
        event = threading.Event()
        with asking.waiting(event.set):
            while (letter := asking.answer()) is None:
                event.wait(asking.wait())
                event.clear()
        return letter

    async def ask_async(self, to: str, body: Any, *, timeout: float | None = None,
                        kind: str = "question", thread: str | None = None) -> Letter:
        """:meth:`ask` for an asyncio host: the loop runs on while the answer is awaited."""
        asking = _Asking(self, to, body, timeout, kind, thread)
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with asking.waiting(lambda: loop.call_soon_threadsafe(event.set)):
            while (letter := asking.answer()) is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), asking.wait())
                event.clear()
        return letter


def _message(box: Mailbox, viewer: str, id: str) -> Letter:
    """Message ``id`` as ``viewer`` may see it: its sender or recipient (not any writer in its
    thread: a thread's key is whatever a sender names, so anyone could write under it);
    :func:`~nous_inbox.mailbox.answers.not_yours` for anyone else, ``LookupError`` for one not
    kept."""
    where = f"message of {viewer!r}"
    id = text(id, "id", where)
    with box._lock:
        box._catch_up()
        state = box._state
        parties = state.parties(id)
        if parties is None:
            raise LookupError(f"{where}: no such message {id!r}")
        if viewer not in parties:
            raise not_yours(where, id)
        mail = state.mail(id)
        if mail is None:
            gone = state.outcome(id)
            raise LookupError(f"{where}: message {id!r} is no longer kept "
                              f"({'let go' if gone is None else gone[0]})")
        return letter(mail)

def _answer(box: Mailbox, asker: str, id: str) -> Letter | None:
    """The reply that answered ``asker``'s message ``id`` (marked read), or None yet."""
    with box._lock:
        box._catch_up()
        found = receipt(box.state, id)
        if found is None:
            raise LookupError(f"ask of {asker!r}: message {id!r} was forgotten unanswered")
        if found.answer is None:
            if found.state in ("withdrawn", "dropped", "received", "released"):
                raise LookupError(f"ask of {asker!r}: message {id!r} was {found.state} "
                                  "unanswered")
            return None
        letter = _message(box, asker, found.answer)
        mail = box.state.mail(found.answer)
        if mail is not None and not mail.read:
            box._commit(lambda state: ([MailRead(recipient=asker, ids=(letter.id,),
                                                  at=box._clock())], None))
        return letter



class _Asking:
    """One ask: the question sent, and the body both pumps wait on."""

    def __init__(self, handle: AgentHandle, to: str, body: Any, timeout: float | None,
                 kind: str, thread: str | None) -> None:
        where = f"ask of {handle.name!r} to {to!r}"
        if timeout is not None and (type(timeout) not in (int, float) or not timeout >= 0):
            raise ValueError(f"{where}: timeout must be a number of seconds >= 0 or None, "
                             f"got {timeout!r}")
        self.where, self.box, self.asker, self.timeout = where, handle._mailbox, handle.name, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        # A reply answers every message of the asker's in its thread, so a question asked in a
        # thread of its own (named by its id) is answered by its own reply only, never by a late
        # one to an earlier question.
        box = self.box
        id = None if thread is not None else box._new_id()
        self.id = handle.send(to, body, kind=kind, thread=id if thread is None else thread,
                              id=id).id

    @contextlib.contextmanager
    def waiting(self, wake: Callable[[], object]) -> Iterator[None]:
        """``wake`` is called whenever a message is answered or let go, while the ``with``
        lasts."""
        self.box._wakers.add(wake)
        try:
            yield
        finally:
            self.box._wakers.discard(wake)

    def answer(self) -> Letter | None:
        """The reply, or None while there is time left (``TimeoutError`` once there is none)."""
        letter = _answer(self.box, self.asker, self.id)
        if letter is None and self.deadline is not None and time.monotonic() >= self.deadline:
            raise AskTimeoutError(f"{self.where}: no answer within {self.timeout} seconds "
                                  f"(message {self.id} waits on)", self.id)
        return letter

    def wait(self) -> float | None:
        """How long to wait before looking again: until the deadline, and no longer than
        ``POLL`` when another process may write the reply."""
        left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        if self.box._journal is None:
            return left
        return POLL if left is None else min(left, POLL)
