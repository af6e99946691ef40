"""Step policies: durable retries with backoff, and a timeout per attempt (DESIGN §11.3).

``await s.step(fn, retries=agency.Retry(attempts=3, backoff=1.0), timeout=10)``: an attempt
that raises an exception in ``on`` (``TimeoutError`` when it ran out of time) is **journaled**
as a failed attempt — ``{path}/attempt#K`` with the error's type and message and when the
next attempt is due — and the next one waits for that time with a durable sleep (a worker's
run parks past ``park_after``). A run killed between attempts resumes the count where it
was; after the last attempt the step raises :class:`~agency_runtime.StepFailedError`
(``attempts``, ``errors``), recorded at the step's path so that a replay raises it again
without calling ``fn``. An exception outside ``on`` fails the step at once, as without a
policy. The runtime's own errors (a cancellation, a determinism error, a guard, a result
that cannot be journaled) are never retried.

``retries=N`` is ``Retry(attempts=N + 1)``: N retries after the first attempt.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from pydantic import ConfigDict, field_validator
from pydantic_core import from_json, to_json

from ._bounds import check_seconds, check_whole
from ._core import _observe
from ._core._frame import Frame
from ._durable._effect import record
from ._durable._failures import register_failure
from ._durable._journal import RunJournal
from ._errors import (
    AgencyCancelledError,
    GuardExceededError,
    InvalidArgumentError,
    JournalCorruptError,
    NondeterminismError,
    StepFailedError,
    StepResultError,
)
from ._secrets import mask
from ._types import DeferredModel
from ._waits import sleep_until

__all__ = [
    "ATTEMPT_UNIT",
    "Retry",
    "as_policy",
    "attempt_path",
    "with_policy",
]

T = TypeVar("T")

ATTEMPT_UNIT = "agency.step.attempt"
"""The name a failed attempt is journaled under (at ``{step path}/attempt#K``)."""
MAX_ATTEMPTS = 1000
"""The most attempts a policy may ask for."""
_NEVER_RETRIED = (
    AgencyCancelledError,
    NondeterminismError,
    JournalCorruptError,
    StepResultError,
    GuardExceededError,
    StepFailedError,
)
"""The runtime's own errors: another attempt cannot mend them."""
_MESSAGE_LIMIT = 500


class Retry(DeferredModel):
    """How a step retries: ``attempts`` in all (the first included); before attempt K + 1 it
    waits ``backoff * multiplier ** (K - 1)`` seconds, at most ``max_backoff``, give or take
    ``jitter`` (a fraction); only exceptions in ``on`` are retried (Temporal's RetryPolicy,
    DBOS's step retries)."""

    model_config = ConfigDict(
        defer_build=True, frozen=True, arbitrary_types_allowed=True, extra="forbid"
    )

    attempts: int = 3
    backoff: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 60.0
    jitter: float = 0.1
    on: tuple[type[BaseException], ...] = (Exception,)

    @field_validator("attempts")
    @classmethod
    def _attempts(cls, value: int) -> int:
        return check_whole(value, "Retry: attempts", 1, MAX_ATTEMPTS)

    @field_validator("backoff", "max_backoff")
    @classmethod
    def _seconds(cls, value: float) -> float:
        return check_seconds(value, "Retry: backoff and max_backoff")

    @field_validator("multiplier")
    @classmethod
    def _multiplier(cls, value: float) -> float:
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 1:
            raise InvalidArgumentError(f"Retry: multiplier must be 1 or more, got {value!r}")
        return float(value)

    @field_validator("jitter")
    @classmethod
    def _jitter(cls, value: float) -> float:
        if not isinstance(value, int | float) or not 0 <= value <= 1:
            raise InvalidArgumentError(f"Retry: jitter must be from 0 to 1, got {value!r}")
        return float(value)

    @field_validator("on", mode="before")
    @classmethod
    def _on(cls, value: Any) -> tuple[type[BaseException], ...]:
        kinds = value if isinstance(value, tuple | list) else (value,)
        if not kinds or not all(isinstance(k, type) and issubclass(k, Exception) for k in kinds):
            raise InvalidArgumentError(
                f"Retry: on must be exception classes (e.g. (ConnectionError,)), got {value!r}"
            )
        return tuple(kinds)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (from 1) before the next."""
        base = min(self.backoff * self.multiplier ** (attempt - 1), self.max_backoff)
        spread = base * self.jitter
        return max(0.0, base + random.uniform(-spread, spread))

    def retries(self, exc: BaseException) -> bool:
        """Whether ``exc`` may be retried under this policy."""
        return isinstance(exc, self.on) and not isinstance(exc, _NEVER_RETRIED)


def as_policy(retries: Retry | int | None, timeout: float | None) -> Retry | None:
    """The policy of ``s.step(..., retries=, timeout=)``: ``None`` for none at all."""
    if retries is None:
        return None if timeout is None else Retry(attempts=1)
    if isinstance(retries, Retry):
        return retries
    count = check_whole(retries, "retries", 0, MAX_ATTEMPTS - 1)
    return Retry(attempts=count + 1)


def attempt_path(path: str, attempt: int) -> str:
    """Where failed attempt ``attempt`` of the step at ``path`` is journaled."""
    return f"{path}/attempt#{attempt}"


async def with_policy(
    frame: Frame,
    journal: RunJournal,
    path: str,
    name: str,
    policy: Retry,
    timeout: float | None,
    fn: Callable[[], Any],
    attempt: Callable[[Callable[[], Any]], Awaitable[T]],
    *,
    record: bool = True,
) -> T:
    """Run the step ``name`` at ``path`` under ``policy``: ``attempt(fn')`` runs and commits
    one attempt (``fn'`` is ``fn`` bounded by ``timeout``); failures are journaled here.
    ``record=False``: the final :class:`StepFailedError` is only raised (a tool call, whose
    unit commits what the model is told)."""
    if timeout is not None:
        timeout = check_seconds(timeout, "s.step: timeout", positive=True)
    errors, due = _recorded_attempts(journal, path)
    bounded = fn if timeout is None else _bounded(fn, timeout)
    first_error: BaseException | None = None
    for number in range(len(errors) + 1, policy.attempts + 1):
        if due is not None:
            await sleep_until(frame, due)
        try:
            return await attempt(bounded)
        except Exception as exc:
            if not policy.retries(exc):
                raise
            first_error = first_error or exc
            errors.append(_described(exc))
            last = number == policy.attempts
            due = None if last else frame.ctx.clock.time() + policy.delay(number)
            await _record_attempt(frame, journal, path, number, errors[-1], due)
            if (obs := _observe.OBSERVER) is not None:
                obs.retried(path, number, errors[-1]["type"], errors[-1]["message"], due)
    failure = StepFailedError(path, policy.attempts, errors)
    if record:
        await _record_failure(frame, journal, path, name, failure)
    raise failure from first_error


def _bounded(fn: Callable[[], Any], seconds: float) -> Callable[[], Awaitable[Any]]:
    """``fn`` with its awaiting bounded by ``seconds`` (real time, the event loop's clock,
    as other timeouts; code that blocks without awaiting cannot be cut short)."""

    async def call() -> Any:
        with anyio.fail_after(seconds):
            result = fn()
            if inspect.isawaitable(result):
                result = await result
            return result

    return call


def _described(exc: BaseException) -> dict[str, str]:
    """A failed attempt as journaled: its error's type and message (cut, secrets masked)."""
    message = mask(str(exc))
    if len(message) > _MESSAGE_LIMIT:
        message = message[: _MESSAGE_LIMIT - 3] + "..."
    return {"type": type(exc).__name__, "message": message}


def _recorded_attempts(journal: RunJournal, path: str) -> tuple[list[dict[str, str]], float | None]:
    """The failed attempts this run journaled for ``path`` so far, and when the next is due."""
    errors: list[dict[str, str]] = []
    due: float | None = None
    while (entry := journal.entries.get(attempt_path(path, len(errors) + 1))) is not None:
        journal.claimed.add(entry.path)
        try:
            data = from_json(entry.result)
            errors.append({"type": str(data["type"]), "message": str(data["message"])})
            due = None if data.get("due") is None else float(data["due"])
        except (ValueError, TypeError, KeyError) as exc:
            raise JournalCorruptError(
                f"the journal of run {journal.run_id!r} holds an unreadable attempt at "
                f"{entry.path!r}: {exc}"
            ) from exc
    return errors, due


async def _record_attempt(
    frame: Frame,
    journal: RunJournal,
    path: str,
    number: int,
    error: dict[str, str],
    due: float | None,
) -> None:
    """Journal failed attempt ``number`` (its error, and when the next one is due)."""
    result = to_json({"attempt": number, **error, "due": due}).decode()
    await record(frame, journal, attempt_path(path, number), ATTEMPT_UNIT, result)


async def _record_failure(
    frame: Frame, journal: RunJournal, path: str, name: str, failure: StepFailedError
) -> None:
    """Journal the step's outcome under its own name: it failed after its last attempt
    (a replay raises it again)."""
    await record(frame, journal, path, name, "null", failure)


def _failed_fields(exc: StepFailedError) -> dict[str, Any]:
    return {"path": exc.path, "attempts": exc.attempts, "errors": exc.errors}


def _failed_from(message: str, data: dict[str, Any]) -> StepFailedError:
    errors = [{"type": str(e["type"]), "message": str(e["message"])} for e in data["errors"]]
    return StepFailedError(str(data["path"]), int(data["attempts"]), errors)


register_failure(StepFailedError, _failed_fields, _failed_from)
"""A step that failed after its last attempt is journaled as its outcome."""
