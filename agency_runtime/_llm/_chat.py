"""``agency.llm``: one LLM turn on a thread, through litellm, billed and journaled.

A call delivers the thread's queued messages (FIFO), pushes the prompt as a user message,
asks the model (retrying transient provider errors with capped exponential backoff),
pushes the answer as an assistant message and bills its cost and tokens to the run and
every guard in scope. With ``schema=``, the answer is parsed tolerantly (code fences,
envelopes, single-key objects) and validated; a failed validation is fed back to the model
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
from typing import Any

import anyio
from pydantic import BaseModel, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError

from .._core._branches import qualify
from .._core._cancel import abort_reason, cancelled_by
from .._core._frame import Frame, current_frame, position_of
from .._core._threads import MessageContent, MessageThread
from .._durable._effect import RECORDED_FAILURES, journaled
from .._durable._journal import journal_of
from .._errors import (
    AgencyError,
    InvalidArgumentError,
    LLMCallError,
    StructuredOutputError,
)
from .._guards import charge, gate
from ._litellm import load_litellm

__all__ = ["DEFAULT_TIMEOUT", "llm"]

logger = logging.getLogger("agency_runtime.llm")

DEFAULT_TIMEOUT = 120.0
"""Seconds one provider request may take (litellm's own default is 6000 s)."""

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
        raise AgencyError(
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
        text = _text_of(response)
        thread.add("assistant", text)
        pico, tokens = await _spend(response, model)
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


def _text_of(response: Any) -> str:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError):
        return ""
    return content if isinstance(content, str) else ""


def _errors_of(exc: Exception) -> list[str]:
    if isinstance(exc, ValidationError):
        return [
            f"{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}"
            for error in exc.errors()
        ]
    return [str(exc)]


async def _spend(response: Any, model: str) -> tuple[int, int]:
    """The call's cost (pico-dollars; 0 when litellm has no price) and total tokens."""
    from .._core._money import usd_to_pico

    usage = getattr(response, "usage", None)
    tokens = int(getattr(usage, "total_tokens", 0) or 0)
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
    if cost is None:
        litellm = await load_litellm()
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:  # unmapped model: the cost is unknown, never a crash
            cost = None
    if cost is None or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
        if model not in _unpriced:
            _unpriced.add(model)
            logger.warning("litellm has no price for model %r: its calls are billed $0", model)
        return 0, tokens
    return usd_to_pico(float(cost)), tokens


def _transient(litellm: Any) -> tuple[type[BaseException], ...]:
    names = (
        "Timeout",
        "RateLimitError",
        "InternalServerError",
        "ServiceUnavailableError",
        "APIConnectionError",
    )
    return tuple(getattr(litellm, name) for name in names if hasattr(litellm, name))


async def _request(
    frame: Frame,
    thread: MessageThread,
    model: str,
    schema: Any,
    timeout: float | None,
    max_tokens: int | None,
) -> Any:
    if model.startswith("fake/"):
        import agency_runtime.testing  # noqa: F401 - registers the offline fake provider
    litellm = await load_litellm()
    messages = thread.to_llm_messages()
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "timeout": DEFAULT_TIMEOUT if timeout is None else float(timeout),
        "num_retries": 0,
    }
    if max_tokens is not None:
        kwargs["max_tokens"] = max_tokens
    if schema is not None:
        output = _response_format(schema)
        if _supports_schema(litellm, model):
            kwargs["response_format"] = output
        else:
            instruction = (
                "Respond with only a JSON document matching this JSON schema: "
                + json.dumps(output.model_json_schema())
            )
            kwargs["messages"] = [*messages, {"role": "system", "content": instruction}]
    transient = _transient(litellm)
    signal = frame.stack.abort_signal
    delay = BACKOFF_BASE
    for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
        signal.raise_if_aborted()
        try:
            with cancelled_by(signal) as scope:
                response = await litellm.acompletion(**kwargs)
            if scope.cancelled_caught:
                raise abort_reason(signal)
            return response
        except transient as exc:
            if attempt == TRANSIENT_ATTEMPTS:
                raise LLMCallError(
                    f"the call to {model!r} failed {attempt} times: {type(exc).__name__}: {exc}",
                    model=model,
                    attempts=attempt,
                ) from exc
            logger.info("transient error from %r (attempt %d): %s", model, attempt, exc)
            with cancelled_by(signal) as scope:
                await anyio.sleep(delay)
            if scope.cancelled_caught:
                raise abort_reason(signal) from exc
            delay = min(delay * 2, BACKOFF_CAP)
        except (AgencyError, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:
            raise LLMCallError(
                f"the call to {model!r} failed: {type(exc).__name__}: {exc}",
                model=model,
                attempts=attempt,
            ) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _supports_schema(litellm: Any, model: str) -> bool:
    if model.startswith("fake/"):
        return True
    try:
        return bool(litellm.supports_response_schema(model=model))
    except Exception:  # an unknown model: fall back to instructions in the prompt
        return False


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
