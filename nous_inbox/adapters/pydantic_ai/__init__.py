"""pydantic-ai adapter: a real pydantic-ai ``Agent`` whose runs read a durable inbox.

The idea: pydantic-ai already knows where a run's step boundaries are (its capability hooks); this
module puts the inbox behind them and records everything in the session's store, so a message
sent from another process (``nous-inbox steer --store URL S "text"``) reaches a running agent at
its next model request, survives a crash, and a replay of the log gives back the transcript the
model was shown. :class:`AgentRunner` is a turn runner for an :class:`~nous_inbox.owner.Owner`
or :class:`~nous_inbox.owner.async_owner.AsyncOwner`; each turn is one pydantic-ai run.

>>> import asyncio
>>> from pydantic_ai import Agent
>>> from pydantic_ai.messages import ModelResponse, TextPart
>>> from pydantic_ai.models.function import FunctionModel
>>> from nous_inbox.runner.port import LocalSession
>>> def reply(messages, info):
...     return ModelResponse(parts=[TextPart(f"heard {len(messages)} message(s)")])
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> async def turn():
...     return [type(e).__name__ async for e in AgentRunner(Agent(FunctionModel(reply))).arun_turn(local)]
>>> asyncio.run(turn())  # doctest: +NORMALIZE_WHITESPACE
['TurnStarted', 'QueueClaimed', 'StepStarted', 'ModelRequested', 'ModelReplied', 'StepEnded',
 'TurnEnded']
>>> [m.content for m in local.session.transcript]
['hello', 'heard 1 message(s)']

What is recorded: ``TurnStarted``; the claims (``QueueClaimed``: the claim *is* the transcript
entry, ruling 6); per request ``StepStarted``, ``ModelRequested``, ``ModelReplied`` (the response as
an assistant ``Message``) and a ``ToolCalled`` per tool call, all before the tools run; each tool
result or retry prompt the model is then shown as ``ToolReturned`` (pydantic-ai's own retry
prompt, as ``Nudged``), an output tool's return included; ``StepEnded`` and ``TurnEnded``, which
carries the run's usage and its output as JSON (unless the output is the final reply's text), so
a prompt's result (:mod:`nous_inbox.owner.turn_result`) gives ``output`` typed again
(:meth:`AgentRunner.load_output`), live or after a restart. A call an
older log left open is answered as pydantic-ai answers it to the model ("interrupted") when the
next turn opens, so the replayed transcript is the one the model saw. Design choice: tool results are recorded
from the request that carries them, in pydantic-ai's own rendering, rather than from the tool's
raw return value, because the promise is the transcript *the model saw*. Not recorded: the
agent's instructions and system prompts (configuration, not conversation: they reach the model
at every turn, the system prompts at the start of the history, as a bare run shows them), and
content a host adds through pydantic-ai's own ``enqueue`` (send it through the inbox to have it
kept).

Store I/O never runs on the event loop. Each hook makes all its port calls in one trip, and
records what it records in one append (:meth:`JournalPort.commit
<nous_inbox.runner.port.JournalPort.commit>`): a model request costs two transactions, the boundary
before it (what the request shows, the step, the claim) and the reply after it. The trip goes
where the port says (an ``AsyncOwner``'s port: its store worker, or inline when its store does
not block), else to a thread (``asyncio.to_thread``), or inline with ``offload=False`` (an
in-memory port, where a thread hop costs more than the call).

Its parts: :mod:`~nous_inbox.adapters.pydantic_ai.transcript` (one transcript in our spelling and
pydantic-ai's), :mod:`~nous_inbox.adapters.pydantic_ai.hooks` (the run hooks: where the inbox joins
a run, and what the loop is told there) and :mod:`~nous_inbox.adapters.pydantic_ai.runner` (the
agent wrapper, :class:`AgentRunner`: each turn's run, built and driven).
"""

try:
    import pydantic_ai  # noqa: F401  # the extra's check, before any part imports it
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "nous_inbox.adapters.pydantic_ai needs pydantic-ai: pip install 'nous-inbox[pydantic-ai]'"
    ) from exc

from nous_inbox.adapters.pydantic_ai.runner import AgentRunner
from nous_inbox.adapters.pydantic_ai.transcript import from_model_response, to_model_messages

__all__ = ["AgentRunner", "from_model_response", "to_model_messages"]
