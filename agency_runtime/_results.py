"""What a run returns: :class:`RunResult`, :class:`ErrorInfo` and :class:`Interrupt`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._errors import RunFailedError, RunPausedError

__all__ = ["ErrorInfo", "Interrupt", "RunResult", "RunStatus"]

RunStatus = Literal["running", "completed", "paused", "failed", "cancelled"]
"""A run's state. ``completed`` and ``cancelled`` are final; the others can continue."""

FINAL_STATUSES: frozenset[str] = frozenset({"completed", "cancelled"})


class ErrorInfo(BaseModel):
    """The JSON form of an exception that ended a run."""

    model_config = ConfigDict()

    type: str
    message: str
    module: str | None = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        """Describe ``exc`` by its class name, message and defining module."""
        kind = type(exc)
        return cls(type=kind.__qualname__, message=str(exc), module=kind.__module__)


class Interrupt(BaseModel):
    """A question a run asks a human (or a handler) before it can go on.

    Interrupt ids are deterministic: derived from the run id and the call site, so a resumed
    run matches each answer to the call that asked it.
    """

    model_config = ConfigDict()

    interrupt_id: str
    effect: str = "unknown"
    message: str = ""
    data: Any = None
    origin: str = ""
    run_id: str | None = None
    expects_value: bool = False
    checkpoint_id: str | None = None


class RunResult(BaseModel):
    """The outcome of ``agency.run``: status, value or error, interrupts, spend and timings.

    ``exception`` holds the original exception object in the process that ran the entry; it
    is never stored (``error`` is its JSON form).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    run_id: str
    status: RunStatus
    value: Any = None
    interrupts: list[Interrupt] = Field(default_factory=list)
    cost: float = 0.0
    tokens: int = 0
    error: ErrorInfo | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration: float | None = Field(
        default=None, description="Seconds the last execution of the entry took."
    )
    replayed: bool = Field(
        default=False,
        description="True when this result was read from the store instead of executed now.",
    )
    exception: BaseException | None = Field(default=None, exclude=True, repr=False)

    @property
    def ok(self) -> bool:
        """Whether the run completed."""
        return self.status == "completed"

    def unwrap(self) -> Any:
        """The run's value; raises :class:`RunPausedError` or :class:`RunFailedError` otherwise.

        A failed run's original exception (when this process ran it) is chained as the cause.
        """
        if self.status == "completed":
            return self.value
        if self.status == "paused":
            raise RunPausedError(self)
        raise RunFailedError(self) from self.exception
