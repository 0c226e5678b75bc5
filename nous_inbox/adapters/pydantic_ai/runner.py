"""The agent wrapper: :class:`AgentRunner` builds each turn's pydantic-ai run and drives it.

A turn is one run of the agent, continued from the session's transcript, with the run hooks
(:mod:`~nous_inbox.adapters.pydantic_ai.hooks`) as one of its capabilities. The runner decides only
what is its own: where the port's calls go (the owner's store worker, a thread, or inline), how a
run that stopped is ended in the log (its failure, a cancel, a consumer that stopped reading), and
how a threaded owner drives an asyncio run (on a loop in a thread of its own).

>>> from pydantic_ai.messages import ModelResponse, TextPart
>>> from pydantic_ai.models.function import FunctionModel
>>> from nous_inbox.runner.port import LocalSession
>>> local = LocalSession()
>>> _ = local.followup("hello")
>>> agent = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("hi")])))
>>> [type(e).__name__ for e in AgentRunner(agent).run_turn(local)][-1]
'TurnEnded'
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final, Protocol, Union

from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelRequest

from nous_inbox.adapters.driving import caller, check_deliverable, drive_in_thread, open_turn
from nous_inbox.adapters.pydantic_ai.hooks import InboxHooks, StepSpans, TurnOver
from nous_inbox.events import Event
from nous_inbox.happenings import Cancelled, Failed
from nous_inbox.loop import new_state
from nous_inbox.message import Message
from nous_inbox.runner.guard import describe_error
from nous_inbox.runner.port import SessionPort, check_port

__all__ = ["AgentRunner"]

logger: Final = logging.getLogger("nous_inbox.adapters.pydantic_ai")



class _Flag(Protocol):
    """A cancel flag: an ``asyncio.Event`` or a ``threading.Event``."""

    def is_set(self) -> bool:
        """Whether the turn should end at its next node."""


def _options(port: SessionPort) -> dict[str, Any]:
    """The run options the prompts this turn claimed came with (an owner's port keeps them)."""
    return dict(getattr(port, "turn_options", None) or {})


_NO_ADAPTER: Final = object()


def _adapter(output_type: Any) -> TypeAdapter[Any] | None:
    """The pydantic adapter that rebuilds a recorded output of ``output_type``: the type itself,
    the types a marker (``ToolOutput``, ``NativeOutput``, ...) wraps, a list of types as their
    union; ``None`` for text and what is not a type (an output function)."""
    if isinstance(output_type, (list, tuple)):
        types = [t for item in output_type for t in _wrapped(item)]
    else:
        types = _wrapped(output_type)
    types = [t for t in types if t is not str]
    if not types or any(callable(t) and not isinstance(t, type) and not hasattr(t, "__origin__")
                        for t in types):
        return None
    try:
        return TypeAdapter(types[0] if len(types) == 1 else Union[tuple(types)])  # type: ignore[arg-type]  # noqa: UP007
    except Exception:
        return None


def _wrapped(spec: Any) -> list[Any]:
    if isinstance(spec, type) or hasattr(spec, "__origin__"):
        return [spec]
    inner = getattr(spec, "outputs", None) or getattr(spec, "output", None)
    if inner is None:
        return [spec]
    return list(inner) if isinstance(inner, (list, tuple)) else [inner]


class AgentRunner:
    """Runs turns of a pydantic-ai ``agent`` over a session port: one pydantic-ai run per turn.

    Give it to an owner (``AsyncOwner(store, stream, AgentRunner(agent))``, or the threaded
    ``Owner``). The agent's own requests are bounded by pydantic-ai's own limits, as in a bare
    run (``usage_limits=UsageLimits(request_limit=...)``, 50 by default); ``max_steps`` is the
    inbox's budget (ruling 5): it bounds only the requests the inbox adds, a run extended past
    its answer by a steer, so it never ends a run pydantic-ai would have finished.
    ``run_kwargs`` pass through to ``agent.iter`` (``deps``, ``usage_limits``,
    ``model_settings``, ...), and so do the options given with a prompt, for its turn
    (``owner.prompt(text, deps=..., model_settings=...)``, read from the owner's port as
    ``turn_options``: they win over these). A port that says where its calls belong (``call_io``, as an
    ``AsyncOwner``'s does) is called there; any other is called in a thread (``asyncio.to_thread``),
    or inline with ``offload=False`` (an in-memory port, where the hop costs more than the call).
    """

    def __init__(
        self, agent: Agent[Any, Any], *, max_steps: int = 10, offload: bool = True,
        **run_kwargs: Any,
    ) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"AgentRunner needs a pydantic_ai.Agent, got {type(agent).__name__}")
        self.check_run_options(run_kwargs)
        self._start = new_state(max_steps, added_only=True)
        self.agent = agent
        self.offload = bool(offload)
        self.run_kwargs = run_kwargs
        self._output_adapter: Any = _NO_ADAPTER

    @staticmethod
    def check_run_options(options: dict[str, Any]) -> None:
        """Refuse run options this runner sets itself: a ``TypeError`` naming the option. An
        owner asks this of the options given with a prompt (``owner.prompt(text, deps=...)``),
        before anything is written; the rest pass through to ``agent.iter`` for that turn."""
        for name in ("user_prompt", "message_history", "capabilities"):
            if name in options:
                raise TypeError(
                    f"AgentRunner sets {name} itself (from the inbox and the transcript); "
                    f"do not pass it"
                )

    def load_output(self, data: Any) -> Any:
        """A turn's output, recorded as JSON, rebuilt as the agent's ``output_type`` (with
        pydantic): what a turn's result gives, live or read back from the log after a restart.
        An output type pydantic cannot rebuild from JSON alone (an output function) gives the
        JSON as recorded.

        >>> from pydantic import BaseModel
        >>> from pydantic_ai.models.test import TestModel
        >>> class Answer(BaseModel):
        ...     value: int
        >>> AgentRunner(Agent(TestModel(), output_type=Answer)).load_output({"value": 4})
        Answer(value=4)
        """
        if self._output_adapter is _NO_ADAPTER:
            self._output_adapter = _adapter(self.agent.output_type)
        if self._output_adapter is None:
            return data
        try:
            return self._output_adapter.validate_python(data)
        except Exception:
            logger.warning("the recorded output does not fit the agent's output type; "
                           "giving it as recorded", exc_info=True)
            return data

    def arun_turn(
        self,
        port: SessionPort,
        *,
        reason: str = "wake",
        cancel: asyncio.Event | threading.Event | None = None,
    ) -> AsyncIterator[Event]:
        """Run one turn on ``port`` under asyncio, yielding each event as it is recorded.

        Setting ``cancel`` ends the run at its next node boundary as ``"cancelled"``; so does
        closing the iterator early or cancelling its task. A failing model, or a port that fails
        once the turn has started, ends the turn as ``"error"``, recorded, and the exception is
        re-raised.
        """
        check_port(port)
        return self._arun(port, reason, cancel)

    async def _arun(self, port: SessionPort, reason: str, *cancels: _Flag | None) -> AsyncIterator[Event]:
        hooks = InboxHooks(port, caller(port, self.offload), self._start)
        try:
            history, options = await open_turn(
                hooks.call, lambda: (hooks.open(reason), _options(port)), hooks.end_opening)
        except Exception:  # as a failing run: the turn ended as an error, recorded
            for event in hooks.take():
                yield event
            raise
        ending: Cancelled | Failed | None = Cancelled()  # unless the run says otherwise below
        run: Any = None
        try:
            # Inside the try: a consumer that stops reading at the opening's events (aclose,
            # break) still has the turn ended.
            for event in hooks.take():
                yield event
            if history and isinstance(history[-1], ModelRequest):
                run_kwargs = {**self.run_kwargs, **options}  # this turn's prompts' options win
                await self._with_system_prompts(history, run_kwargs)
                trace = hooks.bridge.trace
                capabilities = [hooks] if trace is None else [hooks, StepSpans(trace)]
                async with self.agent.iter(
                    None, message_history=history, capabilities=capabilities, **run_kwargs
                ) as run:
                    async for _node in run:
                        for event in hooks.take():
                            yield event
                        if any(flag is not None and flag.is_set() for flag in cancels):
                            break
                    else:
                        ending = None  # the loop ended the turn at the run's end
            else:
                ending = None  # the turn was over at its opening: nothing to answer
        except TurnOver:
            ending = None  # the loop ended the turn before a request
        except Exception as exc:
            await hooks.end(run, Failed(describe_error(exc)))
            for event in hooks.take():
                yield event
            raise
        finally:
            if type(ending) is Cancelled:
                # Cancelled, or the consumer stopped reading (aclose, its task cancelled): the
                # end is still recorded where the port's calls belong.
                try:
                    await hooks.end(run, Cancelled())
                except BaseException:
                    logger.exception("could not record the end of a cancelled turn")
        if type(ending) is not Cancelled:
            await hooks.end(run, ending or Cancelled())
        for event in hooks.take():
            yield event

    def check_message(self, message: Message) -> None:
        """Refuse a message this runner cannot deliver to the model as it is: a ``ValueError``
        naming the role. pydantic-ai takes a user or system message in a request; a tool result
        only as the answer to a call of its own run, and an assistant message only from the
        model. A host (or an owner) asks this before it sends, so the log never holds a message
        the model would not see as sent.

        >>> from pydantic_ai.models.test import TestModel
        >>> AgentRunner(Agent(TestModel())).check_message(Message.tool("42", "c1"))
        Traceback (most recent call last):
        ...
        ValueError: AgentRunner cannot deliver a 'tool' message to a pydantic-ai run (it takes a tool result only as the answer to a call of its own run); send it as a 'user' or 'system' message
        """
        check_deliverable("AgentRunner", "a pydantic-ai run", message)

    async def _with_system_prompts(self, history: list[ModelMessage],
                                   run_kwargs: dict[str, Any]) -> None:
        """Put the agent's system prompts at the start of ``history``, as a bare run of the agent
        shows them: pydantic-ai adds them only to a run with no history, and every turn here
        continues one. They are the agent's configuration, not the conversation: not recorded."""
        prompts = await self.agent.system_prompt_parts(
            message_history=history, deps=run_kwargs.get("deps"), model=run_kwargs.get("model"))
        if prompts:
            first = history[0]
            parts = first.parts if isinstance(first, ModelRequest) else []
            history[: 1 if parts else 0] = [ModelRequest(parts=[*prompts, *parts])]

    def run_turn(
        self, port: SessionPort, *, reason: str = "wake", cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        """The same turn for a thread (the threaded ``Owner``'s worker): an event loop of its own.

        Events are yielded as the turn records them, in order.
        """
        check_port(port)
        return self._run(port, reason, cancel)

    def _run(self, port: SessionPort, reason: str,
             cancel: threading.Event | None) -> Iterator[Event]:
        return drive_in_thread(lambda stop: self._arun(port, reason, cancel, stop),
                               "nous-inbox pydantic-ai turn")

    def __repr__(self) -> str:
        return f"AgentRunner({self.agent!r})"
