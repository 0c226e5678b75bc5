"""Where a LangGraph run meets the inbox: before and after each model call.

Three ways to put the inbox in a graph, one logic behind them (:class:`GraphTurn`):

- ``create_agent`` (LangChain 1.x): ``middleware=[InboxMiddleware()]``. It joins inside the
  model node (``awrap_model_call``): the claimed messages go into the request and, with the
  reply, into the node's update, so the graph's checkpointer keeps them, in place; when a
  waking message waits at a final answer it is added and the model asked again, in the same
  node (ruling 2). No node of its own: each node is a graph step on every request.
- the prebuilt ``create_react_agent``: ``pre_model_hook=before_model_node`` and
  ``post_model_hook=post_model_hook``.
- a plain ``StateGraph``: :func:`before_model_node` as a node before the model node and
  :func:`after_model_node` after it, routed with :func:`route_after_model`. For these two a node
  before and after the model is the only place the inbox can join.

Every message the inbox delivers persists in the graph's ``messages`` (none goes to the model
alone, as ``llm_input_messages``): a claim is a transcript entry (ruling 6), which the model is
shown on every later request of the session, so the checkpoint and the log hold one conversation.

The hooks find the turn they belong to in the run's config (``GraphRunner`` puts it there); in
a graph run without one (``graph.invoke`` by hand) they do nothing, and the graph runs bare.

Where each ruling meets the graph:

- Before every model call after the first, the tool results the graph holds are the loop's
  ``ToolsFinished`` (recorded in LangGraph's own rendering: the words the model is shown); what
  the loop then claims joins that very request, after them (ruling 1).
- After a reply, its tool calls are recorded before any tool runs; a reply that would end the
  run meets the loop's wake-only claim: a pending steer extends the run by one request (ruling
  2); after a blank reply, a pending message or the loop's nudge follows (rulings 3 and 4).
  These added requests are what the step budget counts (ruling 5: the graph bounds its own with
  its ``recursion_limit``).
- A cancel ends the run at its next model boundary, by the graph's own jump to its end
  (``jump_to: "end"``): the results of tools that ran are kept, and calls left unrun are
  answered as cancelled in the log and in the graph's state alike (ruling 9).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ExtendedModelResponse, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.config import get_config
from langgraph.graph import END
from langgraph.types import Command

from nous_inbox.adapters.bridge import CLAIMS, Part, TurnBridge, numeric_counts, stop_cause
from nous_inbox.adapters.langgraph.transcript import from_lc_message, to_lc_messages
from nous_inbox.happenings import Cancelled, Failed, ModelAnswered, Retried
from nous_inbox.loop import Phase
from nous_inbox.message import Message

__all__ = [
    "TURN_KEY", "GraphTurn", "InboxMiddleware", "after_model_node", "before_model_node",
    "current_turn", "post_model_hook", "route_after_model",
]

TURN_KEY: Final = "nous_inbox_turn"
"""The key of the run's ``configurable`` that holds the :class:`GraphTurn` a hook serves."""

Caller = Callable[[Callable[[], Any]], Awaitable[Any]]


async def _inline(fn: Callable[[], Any]) -> Any:
    return fn()


class GraphTurn:
    """One turn's side of the graph: what the hooks know of the graph's messages, and the
    bridge (:class:`~nous_inbox.adapters.bridge.TurnBridge`) that records them.

    ``call`` is where the port's calls run (the owner's store worker, a thread, or inline);
    ``cancels`` are the flags that end the run at its next model boundary; ``known`` holds the
    ids of the graph's messages the log holds already; ``usage`` sums the token counts the
    model reported (LangChain's ``usage_metadata``), which the turn's end records.
    """

    def __init__(self, bridge: TurnBridge, call: Caller = _inline,
                 cancels: Sequence[threading.Event | Any] = ()) -> None:
        self.bridge = bridge
        self.call = call
        self.cancels = tuple(flag for flag in cancels if flag is not None)
        self.known: set[str] = set()
        #: Set when the loop ended the turn before a model node with no jump of its own (a
        #: ``pre_model_hook``, a ``StateGraph`` node): the runner stops the graph there.
        self.halted = False
        self.usage: dict[str, int | float] = {}
        bridge.counts = lambda: dict(self.usage) or None

    def add_usage(self, counts: Any) -> None:
        """Add a reply's token counts (its ``usage_metadata``) to the turn's usage."""
        if isinstance(counts, dict):
            for name, value in (numeric_counts(counts) or {}).items():
                self.usage[name] = self.usage.get(name, 0) + value

    def close(self, ending: Cancelled | Failed, results: Sequence[Message] = (),
              stopped: bool = False) -> list[Message]:
        """End the turn, unless the loop ended it: the tool ``results`` the graph holds first;
        every call still open answered as interrupted when the run was ``stopped`` inside the
        graph (a tool may have started), else as cancelled (ruling 9). Returns those answers,
        for the graph's own state."""
        by_id = {m.tool_call_id: m for m in results if m.tool_call_id is not None}
        finished = self.bridge.finished(by_id, stopped=stop_cause(ending) if stopped else "")
        self.bridge.close(ending, *filter(None, [finished]))
        return [] if finished is None else [
            m for m in finished.results if m.tool_call_id not in by_id]

    def cancelled(self) -> bool:
        """Whether a cancel flag is set."""
        return any(flag.is_set() for flag in self.cancels)

    def learn(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The messages the log does not hold yet, now known: those after the last known one
        (a graph's ``messages`` grow at their end), so a boundary costs what is new, not the
        length of the conversation."""
        start = len(messages)
        while start and (messages[start - 1].id is None or messages[start - 1].id not in self.known):
            start -= 1
        new = list(messages[start:])
        self.known.update(m.id for m in new if m.id is not None)
        return new

    def deliver(self, messages: Sequence[Message]) -> list[BaseMessage]:
        """Our messages as the graph's, known already (the log holds them)."""
        graph = to_lc_messages(messages)
        self.known.update(m.id for m in graph if m.id is not None)
        return graph

    def _happenings(self, new: Sequence[BaseMessage]) -> tuple[list[Part], list[Message]]:
        """What the graph added since the last boundary, as the loop's happenings: the results
        of the calls the loop waits for (a call without one answered as cancelled; returned,
        for the graph's state), then any words of its own for the model (``Retried``)."""
        results = {m.tool_call_id: from_lc_message(m) for m in new if isinstance(m, ToolMessage)}
        parts: list[Part] = []
        filled: list[Message] = []
        finished = self.bridge.finished(results)
        if finished is not None:
            filled = [m for m in finished.results if m.tool_call_id not in results]
            parts.append(finished)
        parts.extend(Retried(Message.user(str(m.text))) for m in new if isinstance(m, HumanMessage))
        return parts, filled

    async def before_model(self, messages: Sequence[BaseMessage]) -> dict[str, Any] | None:
        """A step boundary: the tool results the graph holds, then the loop's claim into this
        very request, after them. ``{"jump_to": "end"}`` when the turn ends here (a cancel)."""
        new = self.learn(messages)
        bridge = self.bridge
        if self.cancelled():
            results = [from_lc_message(m) for m in new if isinstance(m, ToolMessage)]
            answers = await self.call(lambda: self.close(Cancelled(), results))
            return {"messages": self.deliver(answers), "jump_to": "end"}
        if bridge.phase() is Phase.MODEL:
            return None  # the opening's request, or one the loop added: claimed already
        parts, filled = self._happenings(new)
        deliver = await self.call(lambda: bridge.write(*parts, CLAIMS))
        update: dict[str, Any] = {}
        if filled or deliver:
            update["messages"] = self.deliver([*filled, *deliver])
        if bridge.phase() is Phase.ENDED:
            update["jump_to"] = "end"
        return update or None

    async def after_model(self, messages: Sequence[BaseMessage],
                          structured: Any = None) -> dict[str, Any] | None:
        """The reply, and every tool call it asks for, recorded before any tool runs; at a
        would-be final answer, the loop's claim says whether the run goes on (``jump_to:
        "model"`` with what it claimed), or ends."""
        replies = [m for m in self.learn(messages) if isinstance(m, AIMessage)]
        return await self.answered(replies[-1], structured) if replies else None

    async def answered(self, reply: AIMessage, structured: Any = None) -> dict[str, Any] | None:
        """The model's ``reply`` (its ``structured`` response, when it has one) told to the
        loop, as :meth:`after_model` tells it."""
        bridge = self.bridge
        self.add_usage(reply.usage_metadata)
        if structured is not None:
            bridge.output = _jsonable(structured)
        answered = ModelAnswered(from_lc_message(reply))
        if self.cancelled():
            def cancel() -> list[Message]:
                bridge.write(answered)
                return self.close(Cancelled())

            answers = await self.call(cancel)
            return {"messages": self.deliver(answers), "jump_to": "end"}
        deliver = await self.call(lambda: bridge.write(answered, CLAIMS))
        if bridge.phase() is Phase.MODEL:  # the loop extended the run: one more request
            return {"messages": self.deliver(deliver), "jump_to": "model"}
        return None

    async def model_call(self, messages: Sequence[BaseMessage], structured: bool,
                         handler: Callable[[list[BaseMessage]], Awaitable[tuple[list[BaseMessage], Any]]],
                         ) -> tuple[list[BaseMessage], Any, bool]:
        """One model node, the inbox inside it: what :meth:`before_model` delivers, the model's
        reply (``handler`` runs the request), what :meth:`answered` delivers after it, and
        while the loop extends the run, the next request and its reply, all in the one node.
        Returns what the node adds to the graph's ``messages``, in order, the last structured
        response, and whether the run ends here."""
        added: list[BaseMessage] = []
        output: Any = None
        update = await self.before_model(messages)
        while True:
            if update is not None:
                added.extend(update.get("messages") or ())
                if update.get("jump_to") == "end":
                    return added, output, True
            result, output = await handler([*messages, *added])
            for message in result:
                if message.id is None:  # known by its id from here on, as the graph keeps it
                    message.id = uuid.uuid4().hex
            added.extend(result)
            replies = [m for m in result if isinstance(m, AIMessage)]
            # The reply is known; a tool result the reply came with (a structured-output
            # call's answer) stays new, for the next boundary to record as that call's answer.
            self.known.update(m.id for m in replies if m.id is not None)
            update = await self.answered(replies[-1], output if structured else None) if replies \
                else None
            if update is None or update.get("jump_to") != "model":
                if update is not None:
                    added.extend(update.get("messages") or ())
                return added, output, update is not None and update.get("jump_to") == "end"
            added.extend(update["messages"])
            # The extended request's boundary: a cancel set meanwhile ends the run here.
            update = await self.before_model([*messages, *added])


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def current_turn() -> GraphTurn | None:
    """The turn the running graph serves, from its config; ``None`` outside a ``GraphRunner``
    turn (the hooks then do nothing)."""
    try:
        config = get_config()
    except RuntimeError:
        return None
    turn = (config.get("configurable") or {}).get(TURN_KEY)
    return turn if isinstance(turn, GraphTurn) else None


class InboxMiddleware(AgentMiddleware[Any, Any, Any]):
    """The inbox in a LangChain ``create_agent`` graph: ``middleware=[InboxMiddleware()]``.

    It joins the graph inside its model node (``awrap_model_call``), adding no node of its
    own: a hook node is one more graph step on every request, which alone costs more than the
    inbox's own bookkeeping. The node's update is what the inbox claimed, then the reply, in
    order (and, when a waking message meets a would-be final answer, that message and the next
    reply, in the same node), so the graph's checkpointer keeps them all, in place.

    Put it first in the list (the outermost wrap), so what it delivers is what the other
    middleware's model wraps see. It holds no state of its own: each call serves the turn
    :class:`GraphRunner` put in the run's config, so one compiled agent serves every session;
    outside a turn (``agent.invoke`` by hand) the model is called as it is.
    """

    async def awrap_model_call(self, request: ModelRequest[Any],
                               handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
                               ) -> ExtendedModelResponse[Any] | ModelResponse[Any]:
        turn = current_turn()
        if turn is None:
            return await handler(request)

        async def call_model(messages: list[BaseMessage]) -> tuple[list[BaseMessage], Any]:
            response = await handler(request.override(messages=messages))  # type: ignore[arg-type]
            return list(response.result), response.structured_response

        added, output, end = await turn.model_call(
            request.messages, request.response_format is not None, call_model)
        response = ModelResponse(result=added, structured_response=output)
        if not end:
            return response
        return ExtendedModelResponse(model_response=response,
                                     command=Command(update={"jump_to": "end"}))

    def wrap_model_call(self, request: ModelRequest[Any],
                        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
                        ) -> ModelResponse[Any]:
        if current_turn() is not None:
            raise RuntimeError("GraphRunner runs a graph with astream: InboxMiddleware has no "
                               "synchronous turn to serve")
        return handler(request)


async def before_model_node(state: Any) -> dict[str, Any]:
    """A node to run before the model node: ``create_react_agent``'s ``pre_model_hook``, or a
    ``StateGraph``'s own. The loop's claim joins the ``messages`` the model is about to see (a
    turn the loop ends here is stopped by ``GraphRunner`` before the model node runs)."""
    turn = current_turn()
    update = dict(await turn.before_model(state["messages"]) or {}) if turn is not None else {}
    if update.pop("jump_to", None) is not None and turn is not None:
        turn.halted = True
    return update


async def after_model_node(state: Any) -> dict[str, Any]:
    """A ``StateGraph`` node to run after the model node: records the reply, and at a would-be
    final answer adds what the loop claimed for one more request; route on with
    :func:`route_after_model`."""
    turn = current_turn()
    update = dict(await turn.after_model(state["messages"]) or {}) if turn is not None else {}
    update.pop("jump_to", None)
    return update


async def post_model_hook(state: Any) -> Any:
    """``create_react_agent``'s ``post_model_hook``, with :func:`before_model_node` as its
    ``pre_model_hook``: as :func:`after_model_node`, and a run the loop extends goes back to
    the ``pre_model_hook`` (the prebuilt router would end it there)."""
    turn = current_turn()
    update = dict(await turn.after_model(state["messages"]) or {}) if turn is not None else {}
    if update.pop("jump_to", None) == "model":
        return Command(update=update, goto="pre_model_hook")
    return update


def route_after_model(state: Any) -> str:
    """Where a ``StateGraph`` goes after :func:`after_model_node`: ``"model"`` when the inbox
    extended the run (map it to the node before your model node), ``"tools"`` when the reply's
    tool calls wait, else ``END``.

    >>> from langchain_core.messages import AIMessage
    >>> route_after_model({"messages": [AIMessage("done")]})
    '__end__'
    """
    turn = current_turn()
    messages = state["messages"]
    last = messages[-1] if messages else None
    if turn is not None and turn.bridge.phase() is Phase.MODEL:
        return "model"
    if turn is not None and turn.bridge.phase() is not Phase.TOOLS:
        return END
    if isinstance(last, AIMessage) and last.tool_calls:
        return "tools"
    return END
