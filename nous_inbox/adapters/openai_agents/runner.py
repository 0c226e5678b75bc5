"""The agent wrapper: :class:`AgentRunner` runs each turn as the SDK's ``Runner.run_streamed`` of
an ``Agent``, with the turn's :class:`~nous_inbox.adapters.openai_agents.hooks.TurnHooks` as its
model-input filter and run hooks.

The runner decides only what is its own: where the port's calls go (the owner's store worker, a
thread, or inline), the options each run takes (``context=`` per prompt), how a turn that stopped
is ended in the log, and how a threaded owner drives an asyncio run.

>>> from agents import Agent
>>> from agents.testing import ScriptedModel, assistant_message
>>> from nous_inbox.runner.port import LocalSession
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> agent = Agent("greeter", model=ScriptedModel([[assistant_message("hi")]]))
>>> [type(e).__name__ for e in AgentRunner(agent, tracing_disabled=True).run_turn(local)][-1]
'TurnEnded'
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Final, Protocol

from agents import Agent, AgentOutputSchemaBase, RunConfig, Runner
from agents.stream_events import RawResponsesStreamEvent
from openai.types.responses import ResponseTextDeltaEvent
from pydantic import TypeAdapter

from nous_inbox.adapters.driving import caller, check_deliverable, drive_in_thread, open_turn
from nous_inbox.adapters.openai_agents.hooks import RunStopped, TurnHooks
from nous_inbox.adapters.openai_agents.memory import BothHooks, check_hooks, check_session, mirror
from nous_inbox.events import Event
from nous_inbox.happenings import Cancelled, Failed
from nous_inbox.loop import Phase, new_state
from nous_inbox.message import Message
from nous_inbox.runner.deltas import Deltas, deltas_of
from nous_inbox.runner.guard import describe_error
from nous_inbox.runner.port import SessionPort, check_port

__all__ = ["AgentRunner"]

logger: Final = logging.getLogger("nous_inbox.adapters.openai_agents")

_NO_ADAPTER: Final = object()

#: Run options the adapter sets itself, and why each cannot be given.
_OWN: Final = {
    "input": "the inbox and the transcript are the run's input",
    "starting_agent": "the runner's agent starts every turn",
    "conversation_id": "the log is the session: a server-managed conversation would hold it "
                       "a second time",
    "previous_response_id": "the log is the session: a server-managed conversation would hold "
                            "it a second time",
    "auto_previous_response_id": "the log is the session: a server-managed conversation would "
                                 "hold it a second time",
}


class _Flag(Protocol):
    def is_set(self) -> bool:
        """Whether the turn should end at its next model call."""


def _say_text(sdk_event: Any, deltas: Deltas) -> None:
    """Hand a piece of the reply's text the SDK streamed (a raw text delta) to the session's
    live readers; every other streamed event is the run's own business."""
    if isinstance(sdk_event, RawResponsesStreamEvent) and isinstance(
            sdk_event.data, ResponseTextDeltaEvent):
        deltas.say(sdk_event.data.delta)


async def _mirror(memory: Any, transcript: Sequence[Message]) -> None:
    """The log's transcript into the user's SDK ``Session`` (``memory``): a failing ``Session``
    is logged, and the next mirror puts it right."""
    try:
        await mirror(memory, transcript)
    except Exception:
        logger.exception("could not mirror the transcript into the SDK session")


class AgentRunner:
    """Runs turns of an OpenAI Agents SDK ``agent`` over a session port: one SDK run per turn
    (and one more for each time the inbox extends it past its final output).

    Give it to an owner (``AsyncOwner(store, stream, AgentRunner(agent))``, or the threaded
    ``Owner``). The agent's own model calls are bounded by the SDK's ``max_turns`` (10 by
    default), as in a bare run; ``max_steps`` is the inbox's budget (ruling 5): it bounds only
    the runs the inbox adds past a final output. ``run_kwargs`` pass through to
    ``Runner.run_streamed`` (``context``, ``max_turns``, ``run_config``, ...), and so do the
    options given with a prompt, for its turn (``owner.prompt(text, context=...)``: they win).
    ``tracing_disabled`` is a shorthand for ``run_config=RunConfig(tracing_disabled=True)``.
    While someone reads the session's text deltas (``AsyncOwner.events(deltas=True)``,
    ``Owner.follow(deltas=True)``, the web stream's ``?deltas=1``), a run is the SDK's
    ``Runner.run_streamed`` and each piece of text the model streams is said to them (not logged:
    the final reply is; see :mod:`nous_inbox.runner.deltas`); while nobody reads, it is
    ``Runner.run``.

    ``session=`` (an SDK ``Session``: ``SQLiteSession``, ...) is kept as the log's mirror: after
    each turn it holds the whole transcript as the SDK's input items, every message the inbox
    delivered in place (the SDK itself would keep only what its runs generated; see
    :mod:`~nous_inbox.adapters.openai_agents.memory`). ``hooks=`` (an SDK ``RunHooks``) are
    called beside the adapter's own, after them.
    """

    def __init__(
        self, agent: Agent[Any], *, max_steps: int = 10, offload: bool = True,
        tracing_disabled: bool = False, **run_kwargs: Any,
    ) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"AgentRunner needs an agents.Agent, got {type(agent).__name__}")
        self.check_run_options(run_kwargs)
        self._start = new_state(max_steps, added_only=True)
        self.agent = agent
        self.offload = bool(offload)
        if tracing_disabled:
            run_kwargs["run_config"] = dataclasses.replace(
                run_kwargs.get("run_config") or RunConfig(), tracing_disabled=True)
        self.run_kwargs = run_kwargs
        self._output_adapter: Any = _NO_ADAPTER

    @staticmethod
    def check_run_options(options: dict[str, Any]) -> None:
        """Refuse run options this runner sets itself, and a ``session`` or ``hooks`` that is
        not the SDK's: a ``TypeError`` naming the option and why. An owner asks this of the options given with a prompt, before anything is written.

        >>> AgentRunner.check_run_options({"conversation_id": "conv_1"})
        Traceback (most recent call last):
        ...
        TypeError: AgentRunner sets conversation_id itself (the log is the session: a server-managed conversation would hold it a second time); do not pass it
        """
        for name, why in _OWN.items():
            if name in options:
                raise TypeError(f"AgentRunner sets {name} itself ({why}); do not pass it")
        config = options.get("run_config")
        if config is not None:
            if not isinstance(config, RunConfig):
                raise TypeError(f"run_config must be an agents.RunConfig, got "
                                f"{type(config).__name__}")
            if config.call_model_input_filter is not None:
                raise TypeError("run_config.call_model_input_filter is the adapter's own (where "
                                "the inbox joins each model call); do not set it")
        if options.get("session") is not None:
            check_session(options["session"])
        if options.get("hooks") is not None:
            check_hooks(options["hooks"])

    def load_output(self, data: Any) -> Any:
        """A turn's output, recorded as JSON, rebuilt as the agent's ``output_type`` (with
        pydantic): what a turn's result gives, live or read back after a restart. An output type
        pydantic cannot rebuild gives the JSON as recorded.

        >>> from pydantic import BaseModel
        >>> class Answer(BaseModel):
        ...     value: int
        >>> AgentRunner(Agent("a", output_type=Answer)).load_output({"value": 4})
        Answer(value=4)
        """
        if self._output_adapter is _NO_ADAPTER:
            kind = self.agent.output_type
            try:  # a custom AgentOutputSchemaBase is given back as recorded
                self._output_adapter = (
                    None if kind is None or kind is str or isinstance(kind, AgentOutputSchemaBase)
                    else TypeAdapter(kind))
            except Exception:
                self._output_adapter = None
        if self._output_adapter is None:
            return data
        try:
            return self._output_adapter.validate_python(data)
        except Exception:
            logger.warning("the recorded output does not fit the agent's output type; "
                           "giving it as recorded", exc_info=True)
            return data

    def check_message(self, message: Message) -> None:
        """Refuse a message this runner cannot deliver to the model as it is: a ``ValueError``
        naming the role. The SDK takes a user or system message as input; a tool result only as
        the answer to a call of its own run, and an assistant message only from the model.

        >>> AgentRunner(Agent("a")).check_message(Message.tool("42", "c1"))
        Traceback (most recent call last):
        ...
        ValueError: AgentRunner cannot deliver a 'tool' message to an Agents SDK run (it takes a tool result only as the answer to a call of its own run); send it as a 'user' or 'system' message
        """
        check_deliverable("AgentRunner", "an Agents SDK run", message)

    def arun_turn(
        self, port: SessionPort, *, reason: str = "wake",
        cancel: asyncio.Event | threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """Run one turn on ``port`` under asyncio, yielding each event as it is recorded.

        Setting ``cancel`` ends the run before its next model call, as ``"cancelled"``; so does
        closing the iterator early or cancelling its task (the SDK's run is then cancelled at
        once, a tool in flight answered as interrupted). A failing model, or a port that fails
        once the turn has started, ends the turn as ``"error"``, recorded, and the exception is
        re-raised.
        """
        check_port(port)
        return self._arun(port, reason, cancel)

    async def _arun(self, port: SessionPort, reason: str,
                    *cancels: _Flag | None) -> AsyncIterator[Event]:
        turn = TurnHooks(port, caller(port, self.offload), self._start, cancels)
        run_input: Any  # the SDK's input items, as the SDK's ``run`` takes them
        try:
            # The options are those of the prompts this opening claimed (an owner's port).
            run_input, options = await open_turn(
                turn.call, lambda: (turn.open(reason), dict(getattr(port, "turn_options", None) or {})),
                turn.end_opening)
        except Exception:  # the turn ended as an error, recorded
            for event in turn.take():
                yield event
            raise
        kwargs = {**self.run_kwargs, **options}
        memory = kwargs.pop("session", None)  # mirrored from the log, never the SDK's to build
        hooks: Any = turn.hooks
        if kwargs.get("hooks") is not None:
            hooks = BothHooks(turn.hooks, kwargs["hooks"])
        kwargs.pop("hooks", None)
        config = dataclasses.replace(kwargs.pop("run_config", None) or RunConfig(),
                                     call_model_input_filter=turn.filter)
        ending: Cancelled | Failed | None = Cancelled()
        shown: list[Any] = []
        agent: Agent[Any] = self.agent
        result: Any = None
        try:
            for event in turn.take():
                yield event
            deltas = deltas_of(port)
            while run_input is not None:
                if not deltas.listening:  # streaming costs; nobody would read it
                    running = Runner.run(agent, run_input, hooks=hooks, run_config=config,
                                         **kwargs)
                    async for event in self._as_recorded(turn, running):
                        yield event
                    result = turn.result
                else:
                    streamed = Runner.run_streamed(agent, run_input, hooks=hooks,
                                                   run_config=config, **kwargs)
                    try:
                        async for sdk_event in streamed.stream_events():
                            for event in turn.take():
                                yield event
                            _say_text(sdk_event, deltas)
                    finally:
                        if not streamed.is_complete:
                            streamed.cancel()  # the SDK's own cancel: its run stops at once
                    result = streamed
                for event in turn.take():
                    yield event
                if any(flag is not None and flag.is_set() for flag in cancels):
                    shown = result.to_input_list(mode="normalized")[turn.shown:]
                    break
                agent = result.last_agent
                if memory is not None:  # before the turn's end is recorded: a prompt's answer
                    await _mirror(memory, turn.bridge.adv.state.transcript)  # finds it there
                run_input = await turn.call(functools.partial(
                    turn.run_ended, result.to_input_list(mode="normalized"),
                    result.final_output))
                for event in turn.take():
                    yield event
            else:
                ending = None if turn.phase() is Phase.ENDED else ending
        except RunStopped as stop:
            shown = stop.shown
        except Exception as exc:
            await turn.call(functools.partial(turn.close, Failed(describe_error(exc))))
            for event in turn.take():
                yield event
            if memory is not None:
                await _mirror(memory, await turn.call(lambda: list(port.session.transcript)))
            raise
        finally:
            if type(ending) is Cancelled:
                try:
                    await turn.call(functools.partial(turn.close, Cancelled(), shown))
                except BaseException:
                    logger.exception("could not record the end of a cancelled turn")
        if ending is not None and type(ending) is not Cancelled:
            await turn.call(functools.partial(turn.close, ending))
        for event in turn.take():
            yield event
        if memory is not None:
            await _mirror(memory, await turn.call(lambda: list(port.session.transcript)))

    @staticmethod
    async def _as_recorded(turn: TurnHooks, run: Any) -> AsyncIterator[Event]:
        """Drive ``run`` (``Runner.run``'s coroutine) to its end, yielding what the turn
        records as it is recorded; the run's result is left in ``turn.result``. A consumer
        that stops reading cancels the run (a tool in flight is then interrupted)."""
        task = asyncio.ensure_future(run)
        try:
            while not task.done():
                recorded = asyncio.ensure_future(turn.fresh.wait())
                await asyncio.wait((task, recorded), return_when=asyncio.FIRST_COMPLETED)
                recorded.cancel()
                turn.fresh.clear()
                for event in turn.take():
                    yield event
            turn.result = task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    def run_turn(self, port: SessionPort, *, reason: str = "wake",
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        """The same turn for a thread (the threaded ``Owner``'s worker): an event loop of its
        own. Events are yielded as the turn records them, in order."""
        check_port(port)
        return self._run(port, reason, cancel)

    def _run(self, port: SessionPort, reason: str,
             cancel: threading.Event | None) -> Iterator[Event]:
        return drive_in_thread(lambda stop: self._arun(port, reason, cancel, stop),
                               "nous-inbox openai-agents turn")

    def __repr__(self) -> str:
        return f"AgentRunner({self.agent!r})"
