"""Traces: a turn, its steps, its model requests and tool calls as OpenTelemetry spans.

Every run emits the same spans, whoever drives it (the :class:`~nous_inbox.runner.Runner`, sync or
asyncio, the framework adapters through their shared bridge, an ``Owner``, an ``AsyncOwner`` or
``serve``): a ``nous_inbox.turn`` span, a ``nous_inbox.step`` child per step, and in each step a
``nous_inbox.model_request`` span and a ``nous_inbox.tool_call`` span per tool the runner calls
(under an adapter, the framework's own instrumentation makes those: pydantic-ai's nest under the
step span, which is current while it works; the LangGraph and OpenAI Agents SDK adapters emit
the turn and step spans beside their framework's own). Each claim is a ``nous_inbox.claim`` event on
the step it joins (the queue, how many, the claim's seq), and a message that carries its sender's
W3C ``traceparent`` in its metadata (:func:`carried`: what the owners' sends and the web face do) is
a span link from that step to the trace that sent it: a steer is followed from its HTTP request to
the step that read it, across processes.

Spans go through ``opentelemetry-api`` only, and only when the host configured a tracer provider
(the SDK, or any other): without the API, or with it and no provider, nothing is built, so a run
pays one check a turn. The API is imported at the first turn, never by ``import nous_inbox``.

>>> from nous_inbox.runner import LocalSession, Runner
>>> local = LocalSession()
>>> _ = local.steer("hello")
>>> events = list(Runner(lambda transcript, tools: "hi").run_turn(local))  # traced if configured
>>> carried("hi")  # no span is current: nothing to carry
'hi'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from msgspec.structs import replace

from nous_inbox.events import (
    Event,
    ModelReplied,
    QueueClaimed,
    StepEnded,
    StepStarted,
    TurnEnded,
    TurnStarted,
)
from nous_inbox.message import Message, ToolCall

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, Tracer

__all__ = ["TRACEPARENT", "TurnTrace", "carried", "server_span", "turn_trace"]

TRACEPARENT: Final = "traceparent"
"""The metadata key a message carries its sender's span context under (W3C Trace Context)."""

_UNSET: Final = object()
_api: Any = _UNSET  # the OpenTelemetry API, once looked for: a namespace, or None when absent
_tracing: tuple[object, Tracer] | None = None  # the provider last seen, and our tracer from it


def _otel() -> Any:
    """The OpenTelemetry API's modules, imported once (``None`` when not installed)."""
    global _api
    if _api is _UNSET:
        try:
            from opentelemetry import context, propagate, trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _api = None
        else:
            _api = _Api(trace, context, propagate, TraceContextTextMapPropagator())
    return _api


class _Api:
    __slots__ = ("context", "propagate", "trace", "w3c")

    def __init__(self, trace: Any, context: Any, propagate: Any, w3c: Any) -> None:
        self.trace, self.context, self.propagate, self.w3c = trace, context, propagate, w3c


def _tracer() -> Tracer | None:
    """Our tracer from the global provider, or ``None`` when nothing would record: no API, or
    the API's placeholder provider (no SDK configured)."""
    global _tracing
    api = _otel()
    if api is None:
        return None
    provider = api.trace.get_tracer_provider()
    if isinstance(provider, api.trace.ProxyTracerProvider):
        return None
    cached = _tracing
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer: Tracer = provider.get_tracer("nous_inbox")
    _tracing = (provider, tracer)
    return tracer


def _ns(at: float) -> int | None:
    """An event's time as a span timestamp (``None``, now, for an event not stamped)."""
    return int(at * 1e9) if at else None


# -- the sender's side ---------------------------------------------------------------------------


def carried(message: Message | str) -> Message | str:
    """``message`` carrying the current span's context as a W3C ``traceparent`` in its metadata,
    so the step that claims it links back to the trace that sent it, in this process or another.
    Unchanged when no span is current, or when it carries one already (the first sender's wins).

    >>> carried(Message.user("hi", metadata={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    ... ).metadata["traceparent"][:6]
    '00-111'
    """
    api = _otel()
    if api is None:
        return message
    span_context = api.trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return message
    if isinstance(message, Message):
        if TRACEPARENT in message.metadata:
            return message
        metadata = {**message.metadata, TRACEPARENT: _traceparent(span_context)}
        return replace(message, metadata=metadata)
    return Message.user(message, metadata={TRACEPARENT: _traceparent(span_context)})


def _traceparent(span_context: Any) -> str:
    return (f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{int(span_context.trace_flags):02x}")


def _links(api: Any, messages: Iterable[Message]) -> list[Link]:
    """A link to each sender's span that ``messages`` carry (a malformed one is skipped)."""
    links: list[Link] = []
    for message in messages:
        parent = message.metadata.get(TRACEPARENT) if message.metadata else None
        if type(parent) is str:
            span_context = api.trace.get_current_span(
                api.w3c.extract({TRACEPARENT: parent})).get_span_context()
            if span_context.is_valid:
                links.append(api.trace.Link(span_context, {"nous_inbox.message.role": message.role}))
    return links


# -- the server's side ---------------------------------------------------------------------------


@contextlib.contextmanager
def server_span(method: str, path: str, headers: Mapping[str, str]) -> Iterator[Span | None]:
    """A server span for one HTTP request, current while it is handled, continuing the trace of
    an incoming ``traceparent`` header (through the host's configured propagators). Yields
    ``None`` and starts nothing when nothing would record, or when a span is current already
    (an ASGI instrumentation the host installed made one: its span is the request's)."""
    tracer = _tracer()
    api = _api
    if tracer is None or api.trace.get_current_span().get_span_context().is_valid:
        yield None
        return
    parent = api.propagate.extract(headers)
    span = tracer.start_span(f"{method} {path}", parent, kind=api.trace.SpanKind.SERVER,
                             attributes={"http.request.method": method, "url.path": path})
    token = api.context.attach(api.trace.set_span_in_context(span, parent))
    try:
        yield span
    except Exception as exc:
        _record(api, span, exc)
        raise
    finally:
        api.context.detach(token)
        span.end()


def _record(api: Any, span: Span, exc: Exception) -> None:
    """``exc`` on ``span``, as an error. An exception that cannot even be printed is still
    the call's to raise: recording it must never replace it."""
    span.set_status(api.trace.StatusCode.ERROR, type(exc).__name__)
    with contextlib.suppress(Exception):
        span.record_exception(exc)


# -- a run's side --------------------------------------------------------------------------------


def turn_trace(port: object) -> TurnTrace | None:
    """The spans of a turn about to run on ``port`` (``None``, and nothing to do at any step,
    when nothing would record them). Its parent is the span current now, if any."""
    tracer = _tracer()
    if tracer is None:
        return None
    return TurnTrace(tracer, getattr(getattr(port, "journal", None), "stream", None))


class TurnTrace:
    """One turn's spans, built from the events the turn records.

    A driver tells it every event it records (:meth:`saw`), the messages each claim took
    (:meth:`claimed`), wraps each model or tool call in :meth:`calling` (the runner) or the
    framework's work in :meth:`current` (an adapter), and closes it at the end (:meth:`close`).
    """

    __slots__ = ("_api", "_claims", "_links", "_parent", "_replied", "_session", "_step",
                 "_step_adopted", "_tracer", "_turn")

    def __init__(self, tracer: Tracer, session: str | None) -> None:
        self._api = _api
        self._tracer = tracer
        self._session = session
        self._parent: Context = self._api.context.get_current()
        self._turn: Span | None = None
        self._step: Span | None = None
        self._step_adopted = False  # whether the step span has seen its StepStarted
        self._replied = False  # whether the step's model request answered
        self._claims: list[QueueClaimed] = []
        self._links: list[Link] = []

    def _attributes(self, **more: Any) -> dict[str, Any]:
        if self._session is not None:
            more["nous_inbox.session.id"] = self._session
        return more

    def saw(self, event: Event) -> None:
        """One recorded event: a turn or a step starts or ends, a claim, a reply."""
        kind = type(event)
        if kind is QueueClaimed:
            self._claims.append(event)  # type: ignore[arg-type]
        elif kind is StepStarted:
            self._start_step(event)  # type: ignore[arg-type]
        elif kind is ModelReplied:
            self._replied = True
        elif kind is StepEnded:
            if self._step_adopted:  # else the step ended already, when the next opened early
                self._end_step(_ns(event.at))
        elif kind is TurnStarted:
            self._start_turn(event)  # type: ignore[arg-type]
        elif kind is TurnEnded:
            self._end_turn(event)  # type: ignore[arg-type]

    def saw_all(self, events: Iterable[Event]) -> None:
        """:meth:`saw` each of ``events``, in order."""
        for event in events:
            self.saw(event)

    def claimed(self, messages: Sequence[Message]) -> None:
        """The messages a claim took: the step they join links to each one's sender."""
        if messages:
            self._links += _links(self._api, messages)

    def _start_turn(self, event: TurnStarted) -> None:
        self._turn = self._tracer.start_span(
            "nous_inbox.turn", self._parent, start_time=_ns(event.at),
            attributes=self._attributes(**{"nous_inbox.turn": event.turn,
                                           "nous_inbox.turn.reason": event.reason}))

    def _open_step(self, at: int | None = None) -> Span:
        parent = None if self._turn is None else self._api.trace.set_span_in_context(self._turn)
        self._step, self._step_adopted, self._replied = self._tracer.start_span(
            "nous_inbox.step", parent, start_time=at, links=self._links or None,
            attributes=self._attributes()), False, False
        self._links = []
        return self._step

    def _start_step(self, event: StepStarted) -> None:
        step = self._step if self._step is not None and not self._step_adopted else None
        if step is None:
            self._end_step(None)
            step = self._open_step(_ns(event.at))
        for link in self._links:  # claims that came after the span opened early
            step.add_link(link.context, link.attributes)
        self._links = []
        self._step_adopted = True
        step.set_attributes({"nous_inbox.turn": event.turn, "nous_inbox.step": event.step})
        self._add_claims(step)

    def _add_claims(self, span: Span) -> None:
        for claim in self._claims:
            span.add_event("nous_inbox.claim", {
                "nous_inbox.queue": str(claim.target), "nous_inbox.claim.count": claim.count,
                "nous_inbox.claim.seq": claim.seq, "nous_inbox.claim.rest": claim.rest,
            }, timestamp=_ns(claim.at))
        self._claims = []

    def _end_step(self, at: int | None) -> None:
        step, self._step = self._step, None
        if step is not None:
            if not self._step_adopted:  # opened for a request the loop then did not make
                step.update_name("nous_inbox.boundary")
            step.end(at)

    def _end_turn(self, event: TurnEnded) -> None:
        at = _ns(event.at)
        self._end_step(at)
        turn, self._turn = self._turn, None
        if turn is None:
            return
        if self._claims:
            self._add_claims(turn)
        turn.set_attributes({"nous_inbox.turn.steps": event.steps,
                             "nous_inbox.turn.end_reason": str(event.reason)})
        if event.reason == "error":
            turn.set_status(self._api.trace.StatusCode.ERROR, event.error or "error")
        turn.end(at)

    def begin_request(self) -> None:
        """A framework is about to make a model request (an adapter says so before the
        framework's own request span starts): if the open step's request has answered already,
        this request is the next step's, whose span opens now, so the framework's spans nest
        under it; the step's ``StepStarted``, recorded inside the request, then names it."""
        if self._step is None or self._replied:
            self._end_step(None)
            self._open_step()

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The open step's span (else the turn's) made current: what a framework does inside,
        its own spans included, nests under it."""
        span = self._step or self._turn
        if span is None:
            yield
            return
        api = self._api
        token = api.context.attach(api.trace.set_span_in_context(span, self._parent))
        try:
            yield
        finally:
            api.context.detach(token)

    @contextlib.contextmanager
    def calling(self, call: ToolCall | None) -> Iterator[None]:
        """The model request (``call`` None) or the tool call, as a span in the open step,
        current while it runs: a model client's or a tool's own spans nest under it."""
        api = self._api
        parent_span = self._step or self._turn
        parent = None if parent_span is None else api.trace.set_span_in_context(
            parent_span, self._parent)
        # The session, turn and step are the step's attributes: a call's spans stay lean.
        if call is None:
            span = self._tracer.start_span("nous_inbox.model_request", parent)
        else:
            span = self._tracer.start_span("nous_inbox.tool_call", parent, attributes={
                "gen_ai.tool.name": call.name, "gen_ai.tool.call.id": call.id})
        token = api.context.attach(api.trace.set_span_in_context(span, parent))
        try:
            yield
        except Exception as exc:  # a cancel (a BaseException) is no error of the call's
            _record(api, span, exc)
            raise
        finally:
            api.context.detach(token)
            span.end()

    def close(self) -> None:
        """End what is still open: a turn abandoned (its consumer stopped reading, its task was
        cancelled) records its end where this trace does not see it."""
        self._end_step(None)
        turn, self._turn = self._turn, None
        if turn is not None:
            if self._claims:
                self._add_claims(turn)
            turn.set_attribute("nous_inbox.turn.end_reason", "cancelled")
            turn.end()
