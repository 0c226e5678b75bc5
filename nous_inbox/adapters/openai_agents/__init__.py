"""OpenAI Agents SDK adapter: a real ``agents.Agent`` whose runs read a durable inbox.

The idea: the SDK calls ``RunConfig.call_model_input_filter`` right before every model call; this
module puts the inbox there and records everything in the session's store, so a message sent
from another process (``nous-inbox steer --store URL S "text"``) reaches a running agent at its
next model call, survives a crash, and a replay of the log gives back the transcript the model
was shown. :class:`AgentRunner` is a turn runner for an :class:`~nous_inbox.owner.Owner` or
:class:`~nous_inbox.owner.async_owner.AsyncOwner`; each turn is one SDK run (``run_streamed``).

>>> import asyncio
>>> from agents import Agent
>>> from agents.testing import ModelStep, ScriptedModel, assistant_message
>>> from nous_inbox.runner.port import LocalSession
>>> def reply(call):
...     return [assistant_message(f"heard {len(call.input)} item(s)")]
>>> agent = Agent("echo", model=ScriptedModel([ModelStep.respond(reply)]))
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> async def turn():
...     runner = AgentRunner(agent, tracing_disabled=True)
...     return [type(e).__name__ async for e in runner.arun_turn(local)]
>>> asyncio.run(turn())  # doctest: +NORMALIZE_WHITESPACE
['TurnStarted', 'QueueClaimed', 'StepStarted', 'ModelRequested', 'ModelReplied', 'StepEnded',
 'TurnEnded']
>>> [m.content for m in local.session.transcript]
['hello', 'heard 1 item(s)']

What is recorded, as for the pydantic-ai adapter: ``TurnStarted``; the claims (``QueueClaimed``,
ruling 6); per model call ``StepStarted``, ``ModelRequested``, ``ModelReplied`` and a
``ToolCalled`` per function call (a handoff's included), all before the tools run; each tool
result as the ``function_call_output`` the SDK shows the model (``ToolReturned``); ``StepEnded``
and ``TurnEnded``, with the run's usage and its ``final_output`` as JSON (unless it is the final
reply's text), so a prompt's result gives ``output`` typed again
(:meth:`AgentRunner.load_output`). Not recorded: the agent's instructions (configuration) and
reasoning items (not shown to a later turn as text).

Its parts: :mod:`~nous_inbox.adapters.openai_agents.transcript` (one transcript in our spelling
and the SDK's), :mod:`~nous_inbox.adapters.openai_agents.hooks` (the filter and hooks: where the
inbox joins a run), :mod:`~nous_inbox.adapters.openai_agents.memory` (a user's SDK ``Session``,
kept as the log's mirror, and ``RunHooks``) and :mod:`~nous_inbox.adapters.openai_agents.runner`
(:class:`AgentRunner`);
one turn's loop and how a boundary is recorded are the shared :mod:`~nous_inbox.adapters.bridge`'s.
"""

try:
    import agents  # noqa: F401  # the extra's check, before any part imports it
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "nous_inbox.adapters.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'nous-inbox[openai-agents]'"
    ) from exc

from nous_inbox.adapters.openai_agents.runner import AgentRunner
from nous_inbox.adapters.openai_agents.transcript import from_model_response, to_input_items

__all__ = ["AgentRunner", "from_model_response", "to_input_items"]
