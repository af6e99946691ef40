"""OpenTelemetry tracing of runs: ``agency_runtime.otel.instrument()``.

Install the extra (``pip install 'agency-runtime[otel]'``), configure a tracer provider and
call :func:`instrument` once; from then on every run is traced (:func:`uninstrument` stops
it). Importing :mod:`agency_runtime` never imports OpenTelemetry: only this module does, and
a process that never calls :func:`instrument` pays one ``None`` check per traced point.

Spans (their attributes; ``agency.replayed`` is ``true`` for what came from the journal, a
span of no work):

* ``agency.run {entry}``: one execution of a run (a resume is another execution).
  ``agency.run_id``, ``agency.entry``, ``agency.attempt``, and at the end
  ``agency.run.status`` and ``agency.cost_usd`` (the run's whole cost so far). It has a span
  link to the run's previous execution (the store notes each execution's ``traceparent``),
  and a queued child run's first execution links to its parent's call.
* ``agency.step {name}``: a journaled unit (a scope step, an ``agency.llm`` call, a memory
  operation, a sleep or an event wait). ``agency.step.path``, ``agency.replayed``.
* ``chat {model}``: one request to a model, with the GenAI semantic conventions:
  ``gen_ai.operation.name="chat"``, ``gen_ai.provider.name`` (the provider prefix of the
  model string: ``openai``, ``fake``), ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``,
  ``gen_ai.usage.output_tokens``, ``gen_ai.response.model``, ``gen_ai.response.id`` and
  ``gen_ai.response.finish_reasons`` (what the provider reported), and ``agency.cost_usd``.
  With ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` (off by default: prompts
  hold users' data) also ``gen_ai.input.messages`` and ``gen_ai.output.messages``, JSON in
  the OpenAI chat shape, the model's api_key masked wherever they quote it. A replayed
  answer is a ``chat`` span with ``agency.replayed=true``, no usage and no provider call.
* ``execute_tool {name}``: a tool the model called (``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``agency.replayed``); a tool that raised is an error span.
* ``agency.interrupt {effect}``: ``agency.interrupt.id``, ``agency.replayed`` (answered from
  the journal), ``agency.interrupt.decision``, ``agency.interrupt.paused``.
* ``agency.guard {type}``: a cost or time guard over its budget (``agency.guard.id``,
  ``agency.guard.label``, ``agency.guard.budget``, ``agency.guard.spent``: US dollars or
  seconds), around the ``std::guard`` interrupt it asks.

A span that ends with an exception records it and has status ERROR, except the run-control
signals (a pause, a park, a worker handing a run back, a restore, a cancellation): those
set ``agency.signal`` (``paused``, ``parked``, ``handed_back``, ``restored``,
``cancelled``) instead. Steps and tools run inside their span, so a user's own spans nest.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "agency_runtime.otel needs OpenTelemetry: pip install 'agency-runtime[otel]' "
        "(opentelemetry-api and opentelemetry-sdk)"
    ) from missing

from pydantic_core import to_json

from . import __version__
from ._core import _observe
from ._errors import InvalidArgumentError, RestoreSignal, RunHandedBack, RunParked, RunPaused
from ._secrets import mask

__all__ = ["instrument", "instrumented", "uninstrument"]

_SCOPE = "agency_runtime"

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""Set to ``true`` to record prompts and completions on chat spans (off by default)."""

_SIGNALS: tuple[tuple[type[BaseException], str], ...] = (
    (RunPaused, "paused"),
    (RunParked, "parked"),
    (RunHandedBack, "handed_back"),
    (RestoreSignal, "restored"),
)


def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Trace every run of this process with ``tracer_provider`` (default: the global one).

    Calling it again replaces the provider; :func:`uninstrument` stops tracing.
    """
    if tracer_provider is not None and not isinstance(tracer_provider, TracerProvider):
        raise InvalidArgumentError(
            "tracer_provider must be an opentelemetry TracerProvider (or None for the global "
            f"one), got {type(tracer_provider).__name__}"
        )
    tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
    _observe.install(_Tracing(tracer))


def uninstrument() -> None:
    """Stop tracing (spans already open still end)."""
    _observe.install(None)


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return isinstance(_observe.OBSERVER, _Tracing)


# -- how a span ends -------------------------------------------------------------------------


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _cancelled(exc: BaseException) -> bool:
    if isinstance(exc, asyncio.CancelledError):
        return True
    trio = sys.modules.get("trio")
    return trio is not None and isinstance(exc, trio.Cancelled)


def _signal(exc: BaseException) -> str | None:
    """The run-control signal ``exc`` is (every leaf of a group one), else ``None``."""
    found: str | None = None
    for leaf in _leaves(exc):
        name = next((name for kind, name in _SIGNALS if isinstance(leaf, kind)), None)
        if name is None and _cancelled(leaf):
            name = "cancelled"
        if name is None:
            return None
        found = found or name
    return found


def _failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _attributes(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _provider_and_model(model: str) -> tuple[str, str]:
    """``gen_ai.provider.name`` and ``gen_ai.request.model`` of a provider model string.

    ``openai/gpt-4o-mini`` is ``("openai", "gpt-4o-mini")``; a model string without a
    prefix goes to litellm, which names its provider when it is loaded.
    """
    prefix, slash, rest = model.partition("/")
    if slash and prefix and rest:
        return prefix, rest
    litellm = sys.modules.get("litellm")
    if litellm is not None:
        try:
            _, provider, _, _ = litellm.get_llm_provider(model)
        except Exception:  # litellm does not know it either
            pass
        else:
            if isinstance(provider, str) and provider:
                return provider, model
    return "litellm", model


_W3C = TraceContextTextMapPropagator()
"""Writes and reads the ``traceparent`` the store keeps for each run (span links)."""


def _traceparent(span: Span) -> str | None:
    """``span``'s context as a W3C ``traceparent`` (``None`` for an invalid one)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def _span_context(traceparent: str | None) -> trace.SpanContext | None:
    """The span a stored ``traceparent`` names (``None`` when there is none or it is bad)."""
    if not traceparent:
        return None
    context = trace.get_current_span(_W3C.extract({"traceparent": traceparent}))
    found = context.get_span_context()
    return found if found.is_valid else None


# -- the observer ----------------------------------------------------------------------------


class _Handle:
    """What a span's context manager yields: the span, and the runtime's reports on it."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def finished(self, status: str, cost_usd: float, error: BaseException | None) -> None:
        self.span.set_attribute("agency.run.status", status)
        self.span.set_attribute("agency.cost_usd", cost_usd)
        if status == "failed" and error is not None:
            _failed(self.span, error)

    def context(self) -> str | None:
        return _traceparent(self.span)

    def answered(
        self,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float,
        *,
        model: str | None = None,
        response_id: str | None = None,
        finish_reasons: Sequence[str] = (),
    ) -> None:
        self.span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        self.span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        self.span.set_attribute("agency.cost_usd", cost_usd)
        if model:
            self.span.set_attribute("gen_ai.response.model", _provider_and_model(model)[1])
        if response_id:
            self.span.set_attribute("gen_ai.response.id", response_id)
        if finish_reasons:
            self.span.set_attribute("gen_ai.response.finish_reasons", list(finish_reasons))

    @property
    def captures_content(self) -> bool:
        return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"

    def content(
        self,
        messages: Sequence[Mapping[str, Any]],
        text: str,
        tool_calls: Sequence[Any],
        secrets: Sequence[str],
    ) -> None:
        output: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            output["tool_calls"] = list(tool_calls)
        for name, value in (("input", list(messages)), ("output", [output])):
            shown = to_json(value, fallback=str).decode()
            self.span.set_attribute(f"gen_ai.{name}.messages", mask(shown, *secrets))

    def failed(self, message: str, error: BaseException | None = None) -> None:
        if error is not None:
            self.span.record_exception(error)
        kind = "tool_error" if error is None else type(error).__qualname__
        self.span.set_attribute("error.type", kind)
        self.span.set_status(Status(StatusCode.ERROR, message))

    def decided(self, decision: str) -> None:
        self.span.set_attribute("agency.interrupt.decision", decision)


class _Tracing:
    """The :class:`~agency_runtime._core._observe.Observer` that makes OpenTelemetry spans."""

    __slots__ = ("tracer",)

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    @contextmanager
    def _span(
        self,
        name: str,
        attributes: Mapping[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
        interrupt: bool = False,
        links: Sequence[trace.Link] = (),
    ) -> Iterator[_Handle]:
        with self.tracer.start_as_current_span(
            name,
            kind=kind,
            attributes=_attributes(attributes),
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield _Handle(span)
            except BaseException as exc:
                signal = _signal(exc)
                if signal is None:
                    _failed(span, exc)
                else:
                    span.set_attribute("agency.signal", signal)
                if interrupt:
                    span.set_attribute("agency.interrupt.paused", isinstance(exc, RunPaused))
                raise
            if interrupt:
                span.set_attribute("agency.interrupt.paused", False)

    def run(
        self, run_id: str, entry: str, attempt: int, link: str | None = None
    ) -> AbstractContextManager[_Handle]:
        attributes = {"agency.run_id": run_id, "agency.entry": entry, "agency.attempt": attempt}
        followed = _span_context(link)
        links = () if followed is None else (trace.Link(followed),)
        return self._span(f"agency.run {entry}", attributes, links=links)

    def current(self) -> str | None:
        return _traceparent(trace.get_current_span())

    def step(self, name: str, path: str, replayed: bool) -> AbstractContextManager[_Handle]:
        attributes = {"agency.step.path": path, "agency.replayed": replayed}
        return self._span(f"agency.step {name}", attributes)

    def chat(
        self, model: str, name: str, path: str, replayed: bool
    ) -> AbstractContextManager[_Handle]:
        provider, requested = _provider_and_model(model)
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": requested,
            "agency.model": None if name == model else name,
            "agency.step.path": path,
            "agency.replayed": replayed,
        }
        return self._span(f"chat {requested}", attributes, SpanKind.CLIENT)

    def tool(
        self, name: str, call_id: str, path: str, replayed: bool, *, server: str | None = None
    ) -> AbstractContextManager[_Handle]:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function" if server is None else "extension",
            "agency.step.path": path,
            "agency.replayed": replayed,
        }
        if server is not None:  # a tool of an MCP server (agency.mcp)
            attributes["agency.mcp.server"] = server
        return self._span(f"execute_tool {name}", attributes)

    def interrupt(
        self, effect: str, interrupt_id: str, replayed: bool
    ) -> AbstractContextManager[_Handle]:
        attributes = {
            "agency.interrupt.id": interrupt_id,
            "agency.interrupt.effect": effect,
            "agency.replayed": replayed,
        }
        return self._span(f"agency.interrupt {effect}", attributes, interrupt=True)

    def retried(
        self, path: str, attempt: int, error_type: str, message: str, due: float | None
    ) -> None:
        trace.get_current_span().add_event(
            "agency.step.retry",
            _attributes(
                {
                    "agency.step.path": path,
                    "agency.step.attempt": attempt,
                    "exception.type": error_type,
                    "exception.message": message,
                    "agency.step.next_attempt_at": due,
                }
            ),
        )

    def guard(
        self, kind: str, guard_id: str, label: str | None, budget: float, spent: float
    ) -> AbstractContextManager[_Handle]:
        attributes = {
            "agency.guard.type": kind,
            "agency.guard.id": guard_id,
            "agency.guard.label": label,
            "agency.guard.budget": budget,
            "agency.guard.spent": spent,
        }
        return self._span(f"agency.guard {kind}", attributes)
