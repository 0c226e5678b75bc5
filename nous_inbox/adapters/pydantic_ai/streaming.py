"""The model's text as it streams: each piece of a reply handed to the session's live readers
while the model produces it (:mod:`nous_inbox.runner.deltas`).

While someone reads the session's deltas (``AsyncOwner.events(deltas=True)``, the web page), the
run's hooks wrap the model that serves each request in :class:`StreamedText`: it asks the model
for a streamed response, says each piece of text as it arrives, and gives the run the whole
response, as a plain request would. So the run, its hooks and what is recorded are the same
with or without readers (the reply is logged once, whole, as ``ModelReplied``); only the model
is asked to stream. While nobody reads, nothing is wrapped: a request costs what it costs in a
bare run. A model that cannot stream (a ``FunctionModel`` without a ``stream_function``, a
model without ``request_stream``) is never asked to.

>>> import asyncio
>>> from pydantic_ai import Agent
>>> from pydantic_ai.models.function import FunctionModel
>>> from nous_inbox.runner.deltas import Deltas
>>> async def words(messages, info):
...     for word in ("Hel", "lo"):
...         yield word
>>> heard = []
>>> deltas = Deltas(lambda: (1, 1))
>>> _ = deltas.subscribe(heard.append)
>>> model = StreamedText(FunctionModel(stream_function=words), deltas)
>>> asyncio.run(Agent(model).run("hi")).output, [d.text for d in heard]
('Hello', ['Hel', 'lo'])
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from nous_inbox.runner.deltas import Deltas

__all__ = ["StreamedText", "can_stream", "streamed"]


class StreamedText(WrapperModel):
    """``wrapped``, asked for a streamed response: each piece of text is said to ``deltas`` as
    it arrives; the run gets the whole response."""

    def __init__(self, wrapped: Model, deltas: Deltas) -> None:
        super().__init__(wrapped)
        self.deltas = deltas

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        say = self.deltas.say
        async with self.wrapped.request_stream(
                messages, model_settings, model_request_parameters) as response:
            async for event in response:
                text = _text_of(event)
                if text:
                    say(text)
        return response.get()


def _text_of(event: ModelResponseStreamEvent) -> str | None:
    """The reply text ``event`` adds (a text part starting, or more of one), else ``None``:
    thinking, tool calls and their arguments are not the model's words to the reader."""
    if type(event) is PartDeltaEvent:
        delta = event.delta
        return delta.content_delta if type(delta) is TextPartDelta else None
    if type(event) is PartStartEvent and type(event.part) is TextPart:
        return event.part.content
    return None


def can_stream(model: Model) -> bool:
    """Whether ``model`` answers a streamed request: it has ``request_stream`` of its own (and,
    a ``FunctionModel``, a ``stream_function``), through any wrapper around it.

    >>> from pydantic_ai.models.test import TestModel
    >>> can_stream(TestModel()), can_stream(FunctionModel(lambda messages, info: None))
    (True, False)
    """
    while True:
        if type(model).request_stream is Model.request_stream:
            return False
        if isinstance(model, FunctionModel):
            return model.stream_function is not None
        if not isinstance(model, WrapperModel):
            return True
        model = model.wrapped


def streamed(model: Model, deltas: Deltas) -> Any:
    """``model`` wrapped to stream its text to ``deltas``, while someone reads them and it can
    stream; else ``None`` (pydantic-ai's answer for "leave the model as it is")."""
    if deltas.listening and can_stream(model):
        return StreamedText(model, deltas)
    return None
