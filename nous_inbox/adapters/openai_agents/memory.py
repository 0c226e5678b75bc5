"""The SDK's own memory and hooks, kept beside the inbox's: a user's ``Session`` and ``RunHooks``.

An SDK run builds its ``Session`` (and its result's input list) from the items it generated, and
keeps nothing a ``call_model_input_filter`` added: a message the inbox delivered mid-run would
be missing from it. So the adapter never hands the SDK the user's ``Session``. It keeps the log
as the one record and, after each turn, mirrors the log's transcript (what the model saw, in the
SDK's input-item form) into that ``Session`` with :func:`mirror`: a reader of the ``Session``
sees every delivered message in place. A user's ``RunHooks`` are called beside the adapter's own
(:class:`BothHooks`), the adapter's first: a reply is recorded before the user hears of it.

>>> import asyncio
>>> from agents import SQLiteSession
>>> from nous_inbox import Message
>>> mine = SQLiteSession("s")
>>> asyncio.run(mirror(mine, [Message.user("hi"), Message.assistant("hello")]))
>>> asyncio.run(mine.get_items())
[{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents import RunHooks
from agents.lifecycle import RunHooksBase
from agents.memory import Session

from nous_inbox.adapters.openai_agents.transcript import to_input_items
from nous_inbox.message import Message

__all__ = ["BothHooks", "check_hooks", "check_session", "mirror"]


def check_session(session: object) -> None:
    """Refuse what is not an SDK ``Session``: a ``TypeError`` naming what it got."""
    if not isinstance(session, Session):
        raise TypeError(f"session must be an agents Session (get_items, add_items, pop_item, "
                        f"clear_session: SQLiteSession, ...), got {type(session).__name__}")


def check_hooks(hooks: object) -> None:
    """Refuse what is not an SDK ``RunHooks``: a ``TypeError`` naming what it got."""
    if not isinstance(hooks, RunHooksBase):
        raise TypeError(f"hooks must be an agents.RunHooks, got {type(hooks).__name__}")


async def mirror(session: Session, transcript: Sequence[Message]) -> None:
    """Make ``session`` hold ``transcript`` as the SDK's input items: what it lacks is added at
    its end when it holds the start of it (a session the adapter kept), else it is cleared and
    written whole (the log is the record: a session changed by hand, or by another run, is put
    back to what the model saw)."""
    items = to_input_items(transcript)
    held = await session.get_items()
    if len(held) <= len(items) and held == items[:len(held)]:
        if len(items) > len(held):
            await session.add_items(items[len(held):])  # type: ignore[arg-type]
        return
    await session.clear_session()
    if items:
        await session.add_items(items)  # type: ignore[arg-type]


class BothHooks(RunHooks[Any]):
    """The adapter's run hooks (``ours``), then the user's (``theirs``), at each of the SDK's
    hook points: the inbox records a reply before the user's hook hears of it."""

    def __init__(self, ours: RunHooks[Any], theirs: RunHooks[Any]) -> None:
        self.ours = ours
        self.theirs = theirs

    async def on_llm_start(self, *args: Any, **kwargs: Any) -> None:
        await self.ours.on_llm_start(*args, **kwargs)
        await self.theirs.on_llm_start(*args, **kwargs)

    async def on_llm_end(self, *args: Any, **kwargs: Any) -> None:
        await self.ours.on_llm_end(*args, **kwargs)
        await self.theirs.on_llm_end(*args, **kwargs)

    async def on_agent_start(self, *args: Any, **kwargs: Any) -> None:
        await self.ours.on_agent_start(*args, **kwargs)
        await self.theirs.on_agent_start(*args, **kwargs)

    async def on_agent_end(self, *args: Any, **kwargs: Any) -> None:
        await self.ours.on_agent_end(*args, **kwargs)
        await self.theirs.on_agent_end(*args, **kwargs)

    async def on_handoff(self, *args: Any, **kwargs: Any) -> None:
        await self.ours.on_handoff(*args, **kwargs)
        await self.theirs.on_handoff(*args, **kwargs)

    async def on_tool_start(self, *args: Any, **kwargs: Any) -> None:
        await self.ours.on_tool_start(*args, **kwargs)
        await self.theirs.on_tool_start(*args, **kwargs)

    async def on_tool_end(self, *args: Any, **kwargs: Any) -> None:
        await self.ours.on_tool_end(*args, **kwargs)
        await self.theirs.on_tool_end(*args, **kwargs)
