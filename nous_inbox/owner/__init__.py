"""Owners: the actors that hold one session, append before they act, and decide when to wake.

:class:`Owner` runs its turns on a worker thread; :class:`AsyncOwner` on an asyncio event loop.
Both share one body of rules (:mod:`nous_inbox.owner.body`). A prompt or followup answers with a
handle on the turn that answers it (:class:`TurnHandle`, :class:`AsyncTurnHandle`), whose result is
a :class:`TurnResult`; :func:`request_cancel` asks a session's open turn to end from any process.
An owner's ``group_commit`` is a :class:`GroupCommitState`: its send backlog.
"""

from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.group_commit import GroupCommitState
from nous_inbox.owner.port import request_cancel
from nous_inbox.owner.threaded import Owner
from nous_inbox.owner.turn_ledger import TurnCancelled, TurnError, TurnFailed, TurnResult
from nous_inbox.owner.turn_result import AsyncTurnHandle, TurnHandle

__all__ = [
    "AsyncOwner",
    "AsyncTurnHandle",
    "GroupCommitState",
    "Owner",
    "TurnCancelled",
    "TurnError",
    "TurnFailed",
    "TurnHandle",
    "TurnResult",
    "request_cancel",
]
