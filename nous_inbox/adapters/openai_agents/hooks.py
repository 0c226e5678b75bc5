"""The bridge: where an OpenAI Agents SDK run meets the inbox, at the run's own model calls.

The SDK calls ``RunConfig.call_model_input_filter`` right before every model call, with the input
it rebuilt for that call: the run's input, then the items the run generated so far (replies,
tool calls, tool results), and nothing a filter returned before. One :class:`TurnHooks`, built
per turn by :class:`~nous_inbox.adapters.openai_agents.runner.AgentRunner`, is that filter and a
set of run hooks: it tells the loop (:mod:`nous_inbox.loop`) what the SDK did and carries out what
the loop says, deciding nothing of its own.

- A turn opens: the loop claims ``next_turn`` then ``next_step`` (ruling 1); the run starts from
  the loop's first request, the whole transcript as its input list.
- Every later call, in the filter: the tool results the SDK shows are the loop's
  ``ToolsFinished``; what the loop then claims joins that very call, after them, so a steer sent
  during a tool call lands after that tool's result. The SDK keeps nothing a filter returns, so
  every message the inbox delivered in this run is placed again, at its position (after the
  items the call it joined had), on every later call of the run.
- The run ends (a final output): the loop's wake-only claim extends the turn for a pending steer
  (ruling 2), and after a blank reply its plain claim delivers a pending message or its nudge
  (rulings 3 and 4), by a new SDK run that starts from the transcript as it now stands (the run
  that ended cannot take input: the SDK refuses input to a finished run's state). Those added
  runs are what the step budget counts (ruling 5, ``new_state(added_only=True)``); the SDK's
  ``max_turns`` bounds each run's own calls.
- A cancel ends the run at its next model call, before it is made, recorded as ``"cancelled"``
  (ruling 9): the results of the tools that ran are recorded, and calls left unrun are answered
  as cancelled. A run stopped inside a tool (its task cancelled) answers that call as interrupted.

Each reply is recorded in ``on_llm_end``, which the SDK awaits before it runs any tool the reply
asks for, so a crash inside a tool leaves the call in the log, answered as interrupted when the
next turn opens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from agents import RunHooks
from agents.items import ModelResponse
from agents.run_config import CallModelData, ModelInputData
from agents.usage import Usage
from pydantic_core import to_jsonable_python

from nous_inbox.adapters.bridge import CLAIMS, Part, TurnBridge, numeric_counts, stop_cause
from nous_inbox.adapters.openai_agents.transcript import (
    as_input_item,
    from_model_response,
    to_input_items,
    tool_outputs,
)
from nous_inbox.commands import EndTurn
from nous_inbox.events import Event
from nous_inbox.happenings import Cancelled, Failed, ModelAnswered
from nous_inbox.loop import LoopState, Phase
from nous_inbox.message import Message, ToolCall
from nous_inbox.runner.port import SessionPort

__all__ = ["INTERRUPTED", "RunStopped", "TurnHooks"]

logger: Final = logging.getLogger("nous_inbox.adapters.openai_agents")

#: What the model is shown for a call an earlier turn left open (its process stopped in the tool).
INTERRUPTED: Final = "interrupted: the run stopped before this tool answered"


class RunStopped(Exception):
    """Raised from the filter to end the run before the call it would make: a cancel, or the
    loop ending the turn there. ``shown`` are the SDK's items the call would have shown."""

    def __init__(self, shown: Sequence[Any]) -> None:
        super().__init__("the turn stopped before this model call")
        self.shown = list(shown)


def _left_open(call: ToolCall) -> Message:
    return Message.tool(INTERRUPTED, call.id, name=call.name, metadata={"error": "interrupted"})


class TurnHooks:
    """One turn's side of the SDK's runs: the shared :class:`~nous_inbox.adapters.bridge.TurnBridge`
    (``bridge``) told what each run did, in the SDK's terms.

    ``call`` is where the port's calls go (the owner's store worker, a thread, or inline);
    ``cancels`` are the flags that end the run at its next model call. The run's filter is
    :meth:`filter`; its hooks are :attr:`hooks`.
    """

    def __init__(self, port: SessionPort, call: Callable[[Callable[[], Any]], Any],
                 start: LoopState, cancels: Sequence[Any]) -> None:
        self.port = port
        self.call = call
        self.cancels = [flag for flag in cancels if flag is not None]
        self.usage = Usage()  # every run's, summed: what the turn's end records
        self.bridge = TurnBridge(port, start, left_open=_left_open,
                                 counts=lambda: usage_counts(self.usage),
                                 jsonable=to_jsonable_python, log=logger)
        self.started: set[str] = set()  # the calls whose tools started
        self.returned: dict[str, str] = {}  # what tools returned, heard before any call shows it
        self.hooks = _Hooks(self)
        self.fresh = asyncio.Event()  # set when something was recorded since the last take
        self.result: Any = None  # the last run's result
        self.new_run()

    def new_run(self) -> None:
        """Forget the run that ended: the next one starts from the transcript afresh."""
        self.first = True
        self.shown = 0  # how many of the SDK's own items the last call showed
        self.placed: list[tuple[int, list[dict[str, Any]]]] = []  # (after how many, what)

    def phase(self) -> Phase:
        """Where the loop stands."""
        return self.bridge.phase()

    def take(self) -> list[Event]:
        """The events recorded since the last take, in order."""
        return self.bridge.take()

    def end_opening(self, failure: BaseException | None) -> None:
        """End a turn whose opening was cut short, if it recorded the turn's start."""
        self.bridge.end_opening(failure)

    # -- the turn's boundaries --------------------------------------------------------------------

    def open(self, reason: str) -> list[dict[str, Any]] | None:
        """The turn's opening: ``TurnStarted``, the answers to calls an earlier turn left open,
        then the loop's claims. Returns the first run's input, or ``None`` when the loop ended
        the turn there."""
        self.bridge.open(reason)
        return self.next_input()

    def next_input(self) -> list[dict[str, Any]] | None:
        """The input of the run the loop asks for now (the transcript it shows), else ``None``."""
        request = self.bridge.request()
        return to_input_items(request) if request else None

    def run_ended(self, items: Sequence[Any], output: Any) -> list[dict[str, Any]] | None:
        """A run gave its final output; ``items`` are its input list as the SDK keeps it. The
        loop's claim at the would-be end decides whether the turn goes on: the next run's input,
        or ``None`` when the turn is over."""
        self.bridge.output = output
        self.bridge.write(*self._results(tool_outputs(items[self.shown:]), final=True), CLAIMS)
        self.new_run()
        return self.next_input()

    def close(self, ending: Cancelled | Failed, shown: Sequence[Any] = ()) -> None:
        """End the turn, unless the loop ended it: the tool results the run holds but never
        showed are recorded first (``shown``, else what the hooks heard), every call still open
        is answered as interrupted if its tool started, else as cancelled (ruling 9)."""
        if self.phase() is Phase.ENDED:
            return
        heard = tool_outputs(shown) or {
            call.id: self.returned[call.id] for call in self.bridge.calls
            if call.id in self.returned}
        self.bridge.close(ending, *self._results(heard, stopped=stop_cause(ending)))

    def _results(self, outputs: Mapping[str, str], final: bool = False,
                 stopped: str = "") -> list[Part]:
        """The results of the calls the loop waits for, as its ``ToolsFinished``: what the SDK
        shows (or returned), else interrupted (a tool that started, when the run ``stopped``)
        or cancelled."""
        by_id = {call.id: Message.tool(outputs[call.id], call.id, name=call.name)
                 for call in self.bridge.calls if call.id in outputs}
        finished = self.bridge.finished(by_id, final=final, stopped=stopped, started=self.started)
        return [] if finished is None else [finished]

    # -- what the SDK calls -----------------------------------------------------------------------

    async def filter(self, data: CallModelData[Any]) -> ModelInputData:
        """Right before every model call: the tool results it shows and the loop's claim into
        this very call, then every message delivered in this run placed again where it joined."""
        base = data.model_data.input
        deliver: list[Message] = []
        if self.first:
            self.first = False  # the opening (or the run's start) claimed already
        else:
            if any(flag.is_set() for flag in self.cancels):
                raise RunStopped(base[self.shown:])
            parts = self._results(tool_outputs(base[self.shown:]))
            deliver = await self.call(lambda: self.bridge.write(*parts, CLAIMS))
            self.fresh.set()
            if type(self.bridge.adv.command) is EndTurn:
                raise RunStopped(())
        self.shown = len(base)
        if deliver:
            self.placed.append((len(base), [as_input_item(m) for m in deliver]))
        return ModelInputData(input=self._placed(base), instructions=data.model_data.instructions)

    def _placed(self, base: list[Any]) -> list[Any]:
        if not self.placed:
            return base
        out: list[Any] = []
        done = 0
        for after, items in self.placed:
            out.extend(base[done:after])
            out.extend(items)
            done = after
        out.extend(base[done:])
        return out

    async def answered(self, response: ModelResponse) -> None:
        """The reply, and every tool call it asks for, recorded before any tool runs."""
        if response.usage is not None:
            self.usage.add(response.usage)
        message = from_model_response(response)
        await self.call(lambda: self.bridge.write(ModelAnswered(message)))
        self.fresh.set()


class _Hooks(RunHooks[Any]):
    """The run hooks a turn adds: the reply recorded, and which tools started and returned."""

    def __init__(self, turn: TurnHooks) -> None:
        self.turn = turn

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        await self.turn.answered(response)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        call_id = getattr(context, "tool_call_id", None)
        if call_id is not None:
            self.turn.started.add(call_id)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        call_id = getattr(context, "tool_call_id", None)
        if call_id is not None:
            self.turn.returned[call_id] = result if isinstance(result, str) else str(result)


def usage_counts(usage: Usage | None) -> dict[str, int | float] | None:
    """The SDK's usage as the counts a turn's end records: its non-zero, finite numbers (requests,
    tokens) and those of its details; ``None`` when the model reported nothing.

    >>> usage_counts(Usage(requests=2, input_tokens=10, output_tokens=3, total_tokens=13))
    {'requests': 2, 'input_tokens': 10, 'output_tokens': 3, 'total_tokens': 13}
    """
    if usage is None:
        return None
    fields = vars(usage)
    details = [vars(value) for name, value in fields.items()
               if name.endswith("_details") and value is not None]
    return numeric_counts(fields, *details)
