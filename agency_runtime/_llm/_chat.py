"""``agency.llm``: one LLM turn on a thread, through the provider seam, billed and journaled.

A call delivers the thread's queued messages (FIFO), pushes the prompt as a user message,
asks the model's provider (:func:`~._registry.provider_for`: litellm by default, the
offline fake provider for ``fake/...``; transient provider errors are retried here with
capped exponential backoff, for every provider alike), pushes the answer as an assistant
message and bills its cost and tokens to the run and every guard in scope. With
``schema=``, the answer is parsed tolerantly (code fences, envelopes, single-key objects)
and validated; a failed validation is fed back to the model
and retried (``retries``, default 1), then :class:`StructuredOutputError` is raised.

Inside a run every call is journaled when it completes: on replay it returns the recorded
answer without calling the provider and costs nothing more, while its spend still counts
toward the guards. After the call a guard it pushed over its budget raises a resumable
``std::guard`` interrupt.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError

from .._core._branches import qualify
from .._core._cancel import AbortSignal, abort_reason, cancelled_by
from .._core._frame import Frame, current_frame, position_of
from .._core._money import usd_to_pico
from .._core._threads import MessageContent, MessageThread
from .._durable._effect import RECORDED_FAILURES, journaled
from .._durable._journal import journal_of
from .._errors import (
    AgencyError,
    InvalidArgumentError,
    LLMCallError,
    NoModelError,
    StructuredOutputError,
)
from .._guards import charge, gate
from ._provider import DEFAULT_TIMEOUT, ChatRequest, ChatResponse, ProviderError, Usage
from ._registry import provider_for

__all__ = ["DEFAULT_TIMEOUT", "bill", "llm", "with_transient_retries"]

logger = logging.getLogger("agency_runtime.llm")

T = TypeVar("T")

TRANSIENT_ATTEMPTS = 3
"""Attempts per request when the provider fails transiently (timeouts, 429, 5xx, drops)."""

BACKOFF_BASE, BACKOFF_CAP = 0.5, 10.0

FEEDBACK = (
    "Your previous response did not match the required output format. Errors:\n{errors}\n"
    "Respond again with only a JSON document that matches the schema."
)

_unpriced: set[str] = set()
_adapters: dict[object, TypeAdapter[Any]] = {}


def _is_empty(prompt: object) -> bool:
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        return all(
            (isinstance(part, str) and not part.strip())
            or (isinstance(part, dict) and not str(part.get("text", "x")).strip())
            for part in prompt
        )
    return False


def _resolve_model(frame: Frame, model: str | None) -> str:
    chosen = model or frame.ctx.model or os.environ.get("AGENCY_MODEL")
    if not chosen:
        raise NoModelError(
            "agency.llm needs a model: pass model='provider/name', run with "
            "agency.run(..., model=...), or set AGENCY_MODEL (offline: AGENCY_MODEL=fake/echo)"
        )
    if not isinstance(chosen, str) or not chosen.strip():
        raise InvalidArgumentError(f"model must be a non-empty string, got {chosen!r}")
    return chosen


def _resolve_thread(frame: Frame, thread: MessageThread | str | int | None) -> MessageThread:
    if thread is None:
        return frame.threads.get_or_create_active()
    if isinstance(thread, MessageThread):
        return thread
    return frame.threads.get(thread)


def _adapter(schema: Any) -> TypeAdapter[Any]:
    try:
        return _adapters[schema]
    except (KeyError, TypeError):
        pass
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(schema)
    except Exception as exc:  # pydantic cannot build a validator for it
        raise InvalidArgumentError(
            f"schema must be a pydantic model or a type pydantic can validate, got {schema!r}"
        ) from exc
    try:
        _adapters[schema] = adapter
    except TypeError:
        pass
    return adapter


def _response_format(schema: Any) -> type[BaseModel]:
    """Providers want an object at the top: other types travel inside ``{"value": ...}``."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema
    return create_model("Output", value=(schema, ...))


def _check_options(max_tokens: int | None, retries: int | None, timeout: float | None) -> None:
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise InvalidArgumentError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
    ):
        raise InvalidArgumentError(f"retries must be 0 or more, got {retries!r}")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")


async def llm(
    prompt: MessageContent,
    *,
    model: str | None = None,
    schema: Any = None,
    thread: MessageThread | str | int | None = None,
    max_tokens: int | None = None,
    retries: int | None = None,
    timeout: float | None = None,
) -> Any:
    """Ask the model; return its answer (``str``, or an instance of ``schema``).

    ``model`` applies to this call only (default: the run's model, else ``AGENCY_MODEL``).
    ``thread`` is a :class:`MessageThread` or a thread id (default: the active thread).
    ``retries`` counts structured-output validation retries (default 1); transient
    provider errors are retried separately. ``timeout`` bounds each request (seconds).
    An empty prompt returns ``""`` and does nothing else.
    """
    frame = current_frame("llm()")
    if _is_empty(prompt):
        return ""
    if not isinstance(prompt, str | list):
        raise InvalidArgumentError(
            f"the prompt must be a string or a list of content parts, got {type(prompt).__name__}"
        )
    _check_options(max_tokens, retries, timeout)
    target = _resolve_thread(frame, thread)
    chosen = _resolve_model(frame, model)
    adapter = None if schema is None else _adapter(schema)
    journal = journal_of(frame.ctx)
    address = position_of(frame).address
    branch, ordinal = journal.count(address, "llm")
    segment = qualify(branch, f"llm#{ordinal}")
    path = f"{address}/{segment}" if address else segment
    value, _text = await journaled(
        frame,
        path,
        "agency.llm",
        lambda: _converse(
            frame, target, prompt, chosen, schema, adapter, retries, timeout, max_tokens
        ),
        encode=lambda outcome: _recorded(outcome, adapter),
        decode=lambda recorded: _revived(recorded, adapter),
        callsite=chosen,
        failures=RECORDED_FAILURES,
    )
    await gate(frame)
    return value


def _recorded(outcome: tuple[Any, str], adapter: TypeAdapter[Any] | None) -> dict[str, Any]:
    value, text = outcome
    try:
        stored = text if adapter is None else adapter.dump_python(value, mode="json")
    except (PydanticSerializationError, TypeError, ValueError):
        stored = None
    return {"text": text, "value": stored}


def _revived(recorded: Any, adapter: TypeAdapter[Any] | None) -> tuple[Any, str]:
    text = str(recorded["text"])
    return (text if adapter is None else adapter.validate_python(recorded["value"])), text


async def _converse(
    frame: Frame,
    thread: MessageThread,
    prompt: MessageContent,
    model: str,
    schema: Any,
    adapter: TypeAdapter[Any] | None,
    retries: int | None,
    timeout: float | None,
    max_tokens: int | None,
) -> tuple[Any, str]:
    for queued in thread.take_queued():
        thread.add(queued.role, queued.content, queued.label)
    thread.add("user", prompt)
    attempts = (1 if retries is None else retries) + 1
    for attempt in range(1, attempts + 1):
        response = await _request(frame, thread, model, schema, timeout, max_tokens)
        text = response.text
        thread.add("assistant", text)
        pico, tokens = bill(response.cost, response.usage, model)
        charge(frame, pico=pico, tokens=tokens, enforce=False)
        if adapter is None:
            return text, text
        try:
            return parse_structured(text, adapter), text
        except (ValidationError, ValueError) as exc:
            errors = _errors_of(exc)
            if attempt == attempts:
                raise StructuredOutputError(
                    f"the model's answer did not match the schema after {attempts} attempt(s): "
                    f"{'; '.join(errors)}",
                    raw=text,
                    errors=errors,
                ) from exc
            thread.add("user", FEEDBACK.format(errors="\n".join(f"- {e}" for e in errors)))
    raise AssertionError("unreachable")  # pragma: no cover


def _errors_of(exc: Exception) -> list[str]:
    if isinstance(exc, ValidationError):
        return [
            f"{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}"
            for error in exc.errors()
        ]
    return [str(exc)]


def bill(cost: float | None, usage: Usage, model: str) -> tuple[int, int]:
    """A response's spend: (pico-dollars, total tokens); an unknown cost is $0, logged once."""
    tokens = usage.total_tokens
    if cost is None or not math.isfinite(cost) or cost < 0:
        if model not in _unpriced:
            _unpriced.add(model)
            logger.warning("no price is known for model %r: its calls are billed $0", model)
        return 0, tokens
    return usd_to_pico(float(cost)), tokens


async def with_transient_retries(
    call: Callable[[], Awaitable[T]],
    *,
    model: str,
    signal: AbortSignal | None,
    what: str = "call",
) -> T:
    """``await call()``, retrying transient :class:`ProviderError` with capped backoff.

    Up to :data:`TRANSIENT_ATTEMPTS` attempts, sleeping ``BACKOFF_BASE`` seconds after the
    first failure and twice as long after each next one (at most ``BACKOFF_CAP``). A
    permanent provider error, or a transient one on the last attempt, raises
    :class:`LLMCallError` chained to the provider library's original exception; any other
    exception a provider lets out (not an :class:`AgencyError`) is permanent too. When
    ``signal`` fires the call and the backoff sleep stop and its reason is raised.
    """
    delay = BACKOFF_BASE
    for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
        if signal is not None:
            signal.raise_if_aborted()
        try:
            if signal is None:
                return await call()
            with cancelled_by(signal) as scope:
                result = await call()
            if scope.cancelled_caught:
                raise abort_reason(signal)
            return result
        except ProviderError as exc:
            original = exc.original
            reason = f"{type(original).__name__}: {original}"
            if not exc.transient:
                raise LLMCallError(
                    f"the {what} to {model!r} failed: {reason}", model=model, attempts=attempt
                ) from original
            if attempt == TRANSIENT_ATTEMPTS:
                raise LLMCallError(
                    f"the {what} to {model!r} failed {attempt} times: {reason}",
                    model=model,
                    attempts=attempt,
                ) from original
            logger.info("transient error from %r (attempt %d): %s", model, attempt, reason)
            if signal is None:
                await anyio.sleep(delay)
            else:
                with cancelled_by(signal) as scope:
                    await anyio.sleep(delay)
                if scope.cancelled_caught:
                    raise abort_reason(signal) from exc
            delay = min(delay * 2, BACKOFF_CAP)
        except (AgencyError, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:
            raise LLMCallError(
                f"the {what} to {model!r} failed: {type(exc).__name__}: {exc}",
                model=model,
                attempts=attempt,
            ) from exc
    raise AssertionError("unreachable")  # pragma: no cover


async def _request(
    frame: Frame,
    thread: MessageThread,
    model: str,
    schema: Any,
    timeout: float | None,
    max_tokens: int | None,
) -> ChatResponse:
    provider = provider_for(model)
    messages = thread.to_llm_messages()
    output: type[BaseModel] | None = None
    if schema is not None:
        output = _response_format(schema)
        if not await provider.supports_schema(model):
            instruction = (
                "Respond with only a JSON document matching this JSON schema: "
                + json.dumps(output.model_json_schema())
            )
            messages = [*messages, {"role": "system", "content": instruction}]
            output = None
    request = ChatRequest(
        model=model,
        messages=messages,
        timeout=DEFAULT_TIMEOUT if timeout is None else float(timeout),
        max_tokens=max_tokens,
        response_format=output,
    )
    return await with_transient_retries(
        lambda: provider.complete(request), model=model, signal=frame.stack.abort_signal
    )


# -- tolerant parsing -----------------------------------------------------------------------------

_FENCE = re.compile(r"```(?:[A-Za-z]+)?\s*\n?(.*?)```", re.DOTALL)
_ENVELOPES = ("data", "result", "output", "response", "answer", "value")
_OPENERS = re.compile(r"[\[{]")
_DECODER = json.JSONDecoder()
_MAX_STARTS = 32
"""At most this many ``{``/``[`` positions of one text are tried as the start of a JSON value.

Each try may scan to the end of the text, so the bound keeps a pathological answer (thousands
of unclosed brackets) linear in its length instead of quadratic."""


class _NoJSONError(ValueError):
    """The answer holds no JSON value that could be parsed."""


def _values_in(text: str) -> tuple[list[Any], bool]:
    """The complete JSON values in ``text`` in order (bounded), and whether one nested too deep.

    The whole text first, when it is one JSON document (a scalar too); otherwise each value
    that starts at a ``{`` or ``[`` and parses completely, scanning on after its end. Trailing
    text after a value (``{"a": 1}}``, ``{"a": 1} (hope that helps :})``) is ignored.
    """
    too_deep = False
    try:
        return [json.loads(text)], False
    except RecursionError:
        too_deep = True
    except ValueError:
        pass
    values: list[Any] = []
    position = 0
    for _ in range(_MAX_STARTS):
        opener = _OPENERS.search(text, position)
        if opener is None:
            break
        try:
            value, end = _DECODER.raw_decode(text, opener.start())
        except RecursionError:
            too_deep = True
            position = opener.start() + 1
        except ValueError:
            position = opener.start() + 1
        else:
            values.append(value)
            position = end
    return values, too_deep


def _json_values(text: str) -> list[Any]:
    """The JSON values of a model's answer, the first complete one first.

    A code fence's content is searched before the rest of the answer. Raises
    :class:`_NoJSONError` (a ``ValueError``) when there is none.
    """
    stripped = text.strip()
    fence = _FENCE.search(stripped)
    too_deep = False
    for candidate in (fence.group(1).strip(), stripped) if fence else (stripped,):
        values, deep = _values_in(candidate)
        if values:
            return values
        too_deep = too_deep or deep
    snippet = f"{text[:80]!r}{'…' if len(text) > 80 else ''}"
    if too_deep:
        raise _NoJSONError(f"the answer's JSON is nested too deeply to parse: {snippet}")
    raise _NoJSONError(f"the answer contains no JSON value ({{...}} or [...]): {snippet}")


def _validate_unwrapping(data: Any, adapter: TypeAdapter[Any]) -> Any:
    """``data`` validated, else an envelope's or a single-key object's value; else the error."""
    try:
        return adapter.validate_python(data)
    except ValidationError as first:
        if isinstance(data, dict):
            inner = [data[k] for k in _ENVELOPES if k in data]
            if len(data) == 1:
                inner.append(next(iter(data.values())))
            for candidate in inner:
                try:
                    return adapter.validate_python(candidate)
                except ValidationError:
                    continue
        raise first


def parse_structured(text: str, adapter: TypeAdapter[Any]) -> Any:
    """Parse a model's answer into ``adapter``'s type, forgiving common wrappers.

    Accepts code fences, prose around the JSON, trailing text after it (a stray ``}``), an
    envelope such as ``{"data": ...}`` and a single-key object around the value. The first
    complete JSON value in the answer is used; when it does not validate, the later ones are
    tried (prose may cite ``[1]`` before the answer), and the first value's validation error
    is raised when none fits.

    Raises:
        pydantic.ValidationError: the answer's JSON does not match the schema.
        ValueError: the answer holds no JSON value (or only one nested too deeply to parse)
            and is not itself a valid value (the plain text of a ``str`` schema is).
    """
    try:
        values = _json_values(text)
    except _NoJSONError as missing:
        try:
            return adapter.validate_python(text.strip())  # a plain-text answer to a str schema
        except ValidationError as exc:
            reasons = "; ".join(str(error["msg"]) for error in exc.errors()[:3])
            raise _NoJSONError(f"{missing} (as plain text: {reasons})") from exc
    try:
        return _validate_unwrapping(values[0], adapter)
    except ValidationError as first:
        for data in values[1:]:
            try:
                return _validate_unwrapping(data, adapter)
            except ValidationError:
                continue
        raise first
