"""The failures an LLM call journals like an answer, registered with the durable layer.

An ``agency.llm`` call that failed after its retries (:class:`LLMCallError`, or
:class:`ToolRoundsExceededError` when the model kept calling tools), or whose answer never
matched its schema (:class:`StructuredOutputError`), is recorded as the call's outcome and
raised again on replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from .._durable._failures import register_failure
from .._errors import LLMCallError, StructuredOutputError, ToolRoundsExceededError

__all__ = ["RECORDED_FAILURES"]

RECORDED_FAILURES: tuple[type[Exception], ...] = (StructuredOutputError, LLMCallError)
"""The failures an LLM call journals like an answer."""

C = TypeVar("C", bound=LLMCallError)


def _structured(message: str, data: dict[str, Any]) -> StructuredOutputError:
    return StructuredOutputError(
        message, raw=str(data.get("raw", "")), errors=[str(e) for e in data["errors"]]
    )


def _call_error(kind: type[C]) -> Callable[[str, dict[str, Any]], C]:
    def decode(message: str, data: dict[str, Any]) -> C:
        return kind(
            message, model=str(data.get("model", "")), attempts=int(data.get("attempts", 0))
        )

    return decode


def _call_fields(exc: LLMCallError) -> dict[str, Any]:
    return {"model": exc.model, "attempts": exc.attempts}


register_failure(
    StructuredOutputError, lambda exc: {"raw": exc.raw, "errors": exc.errors}, _structured
)
register_failure(LLMCallError, _call_fields, _call_error(LLMCallError))
register_failure(ToolRoundsExceededError, _call_fields, _call_error(ToolRoundsExceededError))
