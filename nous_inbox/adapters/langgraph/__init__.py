"""LangGraph / LangChain adapter: a real graph whose runs read a durable inbox.

The idea: a LangGraph agent already has a step boundary before every model call; this package
puts the inbox there and records everything in the session's store, so a message sent from
another process (``nous-inbox steer --store URL S "text"``) reaches a running agent at its next
model call, survives a crash, and a replay of the log gives back the transcript the model was
shown, which the graph's own checkpointer holds too. :class:`GraphRunner` is a turn runner for
an :class:`~nous_inbox.owner.Owner` or :class:`~nous_inbox.owner.async_owner.AsyncOwner`; each
turn is one run of the graph, on the session's own thread.

>>> import asyncio
>>> from langchain.agents import create_agent
>>> from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
>>> from langchain_core.messages import AIMessage
>>> from nous_inbox.runner.port import LocalSession
>>> agent = create_agent(GenericFakeChatModel(messages=iter([AIMessage("hello to you")])),
...                      middleware=[InboxMiddleware()])
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> async def turn():
...     return [type(e).__name__ async for e in GraphRunner(agent, offload=False).arun_turn(local)]
>>> asyncio.run(turn())  # doctest: +NORMALIZE_WHITESPACE
['TurnStarted', 'QueueClaimed', 'StepStarted', 'ModelRequested', 'ModelReplied', 'StepEnded',
 'TurnEnded']
>>> [m.content for m in local.session.transcript]
['hello', 'hello to you']

Its parts: :mod:`~nous_inbox.adapters.langgraph.transcript` (one transcript in our spelling and
LangChain's), :mod:`~nous_inbox.adapters.langgraph.hooks` (where the inbox joins a
graph: the ``create_agent`` middleware, the prebuilt agent's hooks, a ``StateGraph``'s nodes)
and :mod:`~nous_inbox.adapters.langgraph.runner` (:class:`GraphRunner`: each turn's run); one
turn's loop and how a boundary is recorded are the shared :mod:`~nous_inbox.adapters.bridge`'s.
"""

try:
    import langchain  # noqa: F401  # the extra's check, before any part imports it
    import langgraph  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "nous_inbox.adapters.langgraph needs langgraph and langchain: "
        "pip install 'nous-inbox[langgraph]'"
    ) from exc

from nous_inbox.adapters.langgraph.hooks import (
    InboxMiddleware,
    after_model_node,
    before_model_node,
    post_model_hook,
    route_after_model,
)
from nous_inbox.adapters.langgraph.runner import GraphRunner
from nous_inbox.adapters.langgraph.transcript import from_lc_message, to_lc_messages

__all__ = [
    "GraphRunner", "InboxMiddleware", "after_model_node", "before_model_node",
    "from_lc_message", "post_model_hook", "route_after_model", "to_lc_messages",
]
