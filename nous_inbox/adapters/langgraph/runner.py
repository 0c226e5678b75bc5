"""The graph wrapper: :class:`GraphRunner` runs each turn as one run of a compiled graph.

A turn opens with the loop's claims, gives the graph what it claimed (its thread's checkpoint
holds the rest), and streams the run; the graph's hooks (:mod:`~nous_inbox.adapters.langgraph.hooks`)
record each boundary. The runner decides only what is its own: the thread a session's runs
use, what the graph is given so that its checkpoint and the log hold one conversation, where the
port's calls go, and how a run that stopped is ended in the log.

>>> from nous_inbox.runner.port import LocalSession
>>> from langchain.agents import create_agent
>>> from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
>>> from langchain_core.messages import AIMessage
>>> from nous_inbox.adapters.langgraph.hooks import InboxMiddleware
>>> agent = create_agent(GenericFakeChatModel(messages=iter([AIMessage("hi")])),
...                      middleware=[InboxMiddleware()])
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> [type(e).__name__ for e in GraphRunner(agent).run_turn(local)][-1]
'TurnEnded'
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Final

from langchain_core.messages import AIMessageChunk, BaseMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.pregel import Pregel
from langgraph.types import StreamMode

from nous_inbox.adapters.bridge import CLAIMS, TurnBridge
from nous_inbox.adapters.driving import caller, check_deliverable, drive_in_thread
from nous_inbox.adapters.langgraph import langsmith_hops
from nous_inbox.adapters.langgraph.hooks import TURN_KEY, GraphTurn
from nous_inbox.adapters.langgraph.transcript import from_lc_message, same_as_shown
from nous_inbox.events import Event
from nous_inbox.happenings import Cancelled, Failed, ToolsFinished, cancelled_result
from nous_inbox.loop import Phase, new_state
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner.deltas import deltas_of
from nous_inbox.runner.guard import describe_error
from nous_inbox.runner.port import JournalPort, SessionPort, check_port

__all__ = ["GraphRunner"]

logger: Final = logging.getLogger("nous_inbox.adapters.langgraph")


_OURS: Final = ("thread_id", "checkpoint_id", "checkpoint_ns", TURN_KEY)


def _options(port: SessionPort) -> dict[str, Any]:
    """The run options the prompt this turn claimed came with (an owner's port keeps them)."""
    return dict(getattr(port, "turn_options", None) or {})


class GraphRunner:
    """Runs turns of a compiled LangGraph graph over a session port: one graph run per turn.

    The graph is a LangChain ``create_agent`` with :class:`~nous_inbox.adapters.langgraph.hooks.InboxMiddleware`
    first in its middleware, a prebuilt ``create_react_agent`` with the inbox's hooks, or a
    ``StateGraph`` of your own with the inbox's nodes (see the hooks module). Give the runner to
    an owner: ``AsyncOwner(store, stream, GraphRunner(agent))``, or the threaded ``Owner``.

    ``thread_id`` names the graph thread a session's runs use (a callable of the session's
    stream name; by default the stream name itself), so a checkpointer keeps one thread per
    session. ``max_steps`` is the inbox's budget (ruling 5): it bounds only the requests the
    inbox adds; the graph bounds its own with its ``recursion_limit``. ``config`` is merged
    into every run's config (``recursion_limit``, callbacks, ``configurable`` values of your
    own, ...) and ``context`` is every run's LangGraph runtime context; a prompt's own
    (``owner.prompt(text, context=..., config={...})``) win for its turn (see
    :meth:`check_run_options`). While someone reads the session's text deltas
    (``AsyncOwner.events(deltas=True)``, ``Owner.follow(deltas=True)``, the web stream's
    ``?deltas=1``), a run streams with ``stream_mode="messages"`` too and each piece of the
    model's text is said to them (:mod:`nous_inbox.runner.deltas`); while nobody reads, it
    does not. A port that says where its calls belong (``call_io``) is called there; any other
    in a thread, or inline with ``offload=False``.
    """

    def __init__(
        self, graph: Pregel[Any, Any, Any, Any], *, max_steps: int = 10, offload: bool = True,
        thread_id: Callable[[str], str] | None = None, config: dict[str, Any] | None = None,
        context: Any = None,
    ) -> None:
        if not isinstance(graph, Pregel):
            raise TypeError(f"GraphRunner needs a compiled LangGraph graph (graph.compile(), "
                            f"create_agent(...)), got {type(graph).__name__}")
        self._start = new_state(max_steps, added_only=True)
        self.graph = graph
        self.offload = bool(offload)
        self.thread_id = thread_id
        self.check_run_options({"config": config or {}})
        self.config = dict(config or {})
        self.context = context
        langsmith_hops.install()

    @staticmethod
    def check_run_options(options: dict[str, Any]) -> None:
        """Refuse run options this runner does not take: a ``TypeError`` naming the option. A
        prompt's turn takes ``context`` (the graph's runtime context, ``Runtime.context``) and
        ``config`` (merged into the run's config, ``configurable`` and ``metadata`` entry by
        entry), never the thread or the checkpoint a run resumes from, which the runner sets
        from the session. An owner asks this before anything is written.

        >>> GraphRunner.check_run_options({"config": {"configurable": {"thread_id": "t"}}})
        Traceback (most recent call last):
        ...
        TypeError: GraphRunner sets configurable['thread_id'] itself (each turn runs on the session's thread, named by GraphRunner(thread_id=...), from its latest checkpoint); do not pass it
        """
        for name in options:
            if name not in ("context", "config"):
                raise TypeError(f"GraphRunner takes context= and config= per prompt, not {name}")
        config = options.get("config")
        if config is None:
            return
        if not isinstance(config, dict):
            raise TypeError(f"GraphRunner's config is a dict (a RunnableConfig), got "
                            f"{type(config).__name__}")
        configurable = config.get("configurable") or {}
        if not isinstance(configurable, dict):
            raise TypeError(f"GraphRunner's config['configurable'] is a dict, got "
                            f"{type(configurable).__name__}")
        for key in _OURS:
            if key in configurable:
                raise TypeError(f"GraphRunner sets configurable[{key!r}] itself (each turn runs "
                                f"on the session's thread, named by GraphRunner(thread_id=...), "
                                f"from its latest checkpoint); do not pass it")

    def _config(self, turn: GraphTurn, port: SessionPort, options: dict[str, Any]) -> RunnableConfig:
        """A turn's run config: the runner's, the prompt's over it, then the thread and turn."""
        mine, theirs = self.config, options.get("config") or {}
        config: dict[str, Any] = {**mine, **theirs}
        for key in ("configurable", "metadata"):
            if key in mine and key in theirs:
                config[key] = {**mine[key], **theirs[key]}
        config["configurable"] = {**(config.get("configurable") or {}),
                                  "thread_id": self.thread_of(port), TURN_KEY: turn}
        return config  # type: ignore[return-value]

    def thread_of(self, port: SessionPort) -> str:
        """The graph thread of ``port``'s session: its stream's, named by ``thread_id``."""
        stream = port.journal.stream if isinstance(port, JournalPort) else "nous-inbox"
        return stream if self.thread_id is None else self.thread_id(stream)

    def check_message(self, message: Message) -> None:
        """Refuse a message this runner cannot deliver to the model as it is: a ``ValueError``
        naming the role. A graph takes a user or system message as sent; a tool result only as
        the answer to a call of its own run, an assistant message only from the model.

        >>> from langgraph.graph import StateGraph, MessagesState
        >>> g = StateGraph(MessagesState)
        >>> _ = g.add_node("n", lambda s: {}).add_edge("__start__", "n")
        >>> GraphRunner(g.compile()).check_message(Message.tool("42", "c1"))
        Traceback (most recent call last):
        ...
        ValueError: GraphRunner cannot deliver a 'tool' message to a graph run (it takes a tool result only as the answer to a call of its own run); send it as a 'user' or 'system' message
        """
        check_deliverable("GraphRunner", "a graph run", message)

    def arun_turn(
        self, port: SessionPort, *, reason: str = "wake",
        cancel: asyncio.Event | threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """Run one turn on ``port`` under asyncio, yielding each event as it is recorded.

        Setting ``cancel`` ends the run at its next model boundary as ``"cancelled"``; so does
        closing the iterator early or cancelling its task (a tool in flight is then answered
        as interrupted). A failing model or graph ends the turn as ``"error"``, recorded, and
        the exception is re-raised.
        """
        check_port(port)
        return self._arun(port, reason, cancel)

    async def _input(self, config: RunnableConfig, turn: GraphTurn, transcript: Sequence[Message],
                     prior: int) -> dict[str, Any]:
        """What the graph is given: what its thread's checkpoint does not hold when it holds the
        start of the transcript, as the model was shown it; else the whole transcript, in place
        of whatever the thread held (the log is what the model was shown). A run stopped
        inside its tools or at its own ``interrupt()`` left tasks pending on the thread: a new
        input makes LangGraph drop them, so none runs in a later turn."""
        if self.graph.checkpointer:
            snapshot = await self.graph.aget_state(config)
            # Its values show the writes of tasks that finished in a step the run stopped in;
            # the new input drops those with the tasks, so they are not the thread's.
            pending = {m.id for m in _written(snapshot.tasks)}
            held = [m for m in (snapshot.values or {}).get("messages") or []
                    if m.id is None or m.id not in pending]
            if len(held) <= prior and same_as_shown(held, transcript[:len(held)]):
                turn.learn(held)
                return {"messages": turn.deliver(transcript[len(held):])}
            if held:
                return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES),
                                     *turn.deliver(transcript)]}
        return {"messages": turn.deliver(transcript)}

    async def _left_over(self, config: RunnableConfig | None, turn: GraphTurn,
                         values: dict[str, Any]) -> list[Message]:
        """The tool results of a stopped run that the log does not hold: in the graph's last
        values, and (with a checkpointer) those of tasks that finished in the step it stopped
        in, which LangGraph keeps as the checkpoint's pending writes."""
        results = _results(turn, values)
        if config is not None and self.graph.checkpointer:
            snapshot = await self.graph.aget_state(config)
            have = {m.tool_call_id for m in results}
            for message in _written(snapshot.tasks):
                if isinstance(message, ToolMessage) and message.tool_call_id not in have:
                    have.add(message.tool_call_id)
                    results.append(from_lc_message(message))
        return results

    async def _arun(self, port: SessionPort, reason: str, *cancels: Any) -> AsyncIterator[Event]:
        bridge = TurnBridge(port, self._start, log=logger)
        deltas = deltas_of(port)
        call = caller(port, self.offload)
        turn = GraphTurn(bridge, call, cancels)
        values: dict[str, Any] = {}
        config: RunnableConfig | None = None
        ending: Cancelled | Failed | None = None
        try:
            transcript, options = await call(lambda: (bridge.open(reason), _options(port)))
            config = self._config(turn, port, options)
            context = options.get("context", self.context)
            prior = bridge.prior
            for event in bridge.take():
                yield event
            while bridge.phase() is Phase.MODEL:
                graph_input = await self._input(config, turn, transcript, prior)
                # The model streams only while someone reads its text: a bare run's cost else.
                modes: list[StreamMode] = ["values", "messages"] if deltas.listening else ["values"]
                async for mode, chunk in self.graph.astream(graph_input, config, context=context,
                                                            stream_mode=modes):
                    if mode == "messages":
                        if isinstance(chunk[0], AIMessageChunk):
                            deltas.say(str(chunk[0].text))
                        continue
                    values = chunk if isinstance(chunk, dict) else {}
                    for event in bridge.take():
                        yield event
                    if turn.halted:
                        break  # the loop ended the turn before a model node of the graph's
                waiting = _waiting(values)
                if bridge.phase() is not Phase.TOOLS or turn.halted:
                    if waiting and bridge.phase() is not Phase.ENDED:
                        ending = Failed(f"the graph stopped for a person before the model "
                                        f"answered, asking {waiting}: GraphRunner resumes no "
                                        f"interrupt; the next prompt runs the graph afresh")
                    break
                # The graph ended on its tools: a tool that returns directly, or one that (or a
                # hook before it) stopped at the graph's own interrupt() to wait for a person.
                # Their answers are the would-be final answer, where a pending steer goes on
                # (ruling 2); else the turn ends, and the next prompt answers from the log.
                left = await self._left_over(config, turn, values)
                finished = ToolsFinished(_answering(bridge, left, waiting), final=True)
                turn.learn(values.get("messages") or [])
                deliver = await call(functools.partial(bridge.write, finished, CLAIMS))
                for event in bridge.take():
                    yield event
                transcript = list(bridge.adv.state.transcript)
                prior = len(transcript) - len(deliver)
            if bridge.phase() is not Phase.ENDED and ending is None:
                ending = Failed("the graph ended its run before the model answered: the inbox's "
                                "hooks are not on its path to the model")
        except (asyncio.CancelledError, GeneratorExit):
            async def stop() -> None:
                left = await self._left_over(config, turn, values)
                await call(lambda: turn.close(Cancelled(), left, stopped=True))
            await asyncio.shield(stop())
            raise
        except Exception as exc:
            failed = Failed(describe_error(exc))
            left = await self._left_over(config, turn, values)
            await call(lambda: turn.close(failed, left, stopped=True))
            for event in bridge.take():
                yield event
            raise
        if ending is not None:
            await call(lambda: turn.close(ending, _results(turn, values)))
        for event in bridge.take():
            yield event

    def run_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """The same turn for a thread (the threaded ``Owner``'s worker): the graph runs on an
        event loop of its own, and each event is handed over as it is recorded."""
        check_port(port)
        return self._run(port, reason, cancel)

    def _run(self, port: SessionPort, reason: str,
             cancel: threading.Event | None) -> Iterator[Event]:
        return drive_in_thread(lambda stop: self._arun(port, reason, cancel, stop),
                               "nous-inbox langgraph turn")

    def __repr__(self) -> str:
        return f"GraphRunner({self.graph.name!r})"


def _results(turn: GraphTurn, values: dict[str, Any]) -> list[Message]:
    """The tool results the graph holds that the log does not: a stopped run's left-overs."""
    messages = values.get("messages") or [] if isinstance(values, dict) else []
    return [from_lc_message(m) for m in messages
            if isinstance(m, ToolMessage) and m.id not in turn.known]


def _written(tasks: Sequence[Any]) -> list[BaseMessage]:
    """The messages the finished tasks of a step that did not finish wrote (a checkpoint's
    pending writes, as ``StateSnapshot.tasks`` shows them)."""
    written: list[BaseMessage] = []
    for task in tasks:
        messages = task.result.get("messages") if isinstance(task.result, dict) else None
        if isinstance(messages, list):
            written.extend(m for m in messages if isinstance(m, BaseMessage))
    return written


def _waiting(values: dict[str, Any]) -> str:
    """What a graph that stopped at its own ``interrupt()`` asks, as JSON (``""``: it did not)."""
    asked = [getattr(i, "value", i) for i in values.get("__interrupt__") or ()]
    return "; ".join(json.dumps(value, default=str, ensure_ascii=False) for value in asked)


def _answering(bridge: TurnBridge, results: Sequence[Message], waiting: str = "") -> list[Message]:
    """An answer to each call the loop waits for: its result, else (the graph waits for a
    person) what the graph asks, else cancelled."""
    by_id = {m.tool_call_id: m for m in results}
    return [by_id.get(c.id) or (_waiting_result(c, waiting) if waiting else cancelled_result(c))
            for c in bridge.calls]


def _waiting_result(call: ToolCall, asked: str) -> Message:
    """The answer to a call the graph stopped in to wait for a person, asking ``asked``."""
    return Message.tool(f"waiting: the graph stopped for a person, asking {asked}, before this "
                        f"tool answered", call.id, name=call.name,
                        metadata={"error": "interrupted"})
