"""The whole exception tree of ``agency_runtime``.

Every error a user can cause derives from :class:`AgencyError` and has a message that says
what happened and how to fix it. Lower-layer errors (``sqlite3``, litellm, HTTP) are mapped
into these classes at the boundary, with the original chained as ``__cause__``.

Control-flow signals (:class:`RunPaused`, :class:`RestoreSignal`, :class:`RunHandedBack`)
derive from ``BaseException`` like ``asyncio.CancelledError``, so a user's
``except Exception:`` never swallows them.

This module imports nothing of the package: it is the bottom of the layers, below the shapes
(``_types``), whose ``RunResult.unwrap`` raises :class:`RunFailedError`. So the shapes an
error or a signal carries are typed ``Any`` here: ``RunFailedError.result`` and
``RunPausedError.result`` are the ``RunResult`` that was unwrapped, ``RunPaused.interrupts``
the ``Interrupt`` objects the run paused on, ``RestoreSignal.checkpoint`` the ``Checkpoint``
to rewind to.

Tree::

    AgencyError
    ├── InvalidArgumentError (also ValueError)
    │   └── InterruptAnswerError
    ├── OutsideFrameError (also RuntimeError)
    ├── NotInRunError (also RuntimeError)
    ├── EventLoopRunningError (also RuntimeError)
    ├── NoModelError
    ├── StoreError
    │   ├── StoreUnavailableError
    │   ├── StoreSchemaError
    │   └── JournalCorruptError
    ├── RunNotFoundError (also LookupError)
    ├── RunWaitTimeoutError (also TimeoutError)
    ├── RunFinishedError
    ├── EventTimeoutError (also TimeoutError)
    ├── ScheduleNotFoundError (also LookupError)
    ├── RunConflictError
    ├── EntryImportError
    │   └── EntryNotAllowedError
    ├── RunFailedError
    ├── RunPausedError
    ├── ResultSerializationError
    │   └── StepResultError
    ├── NondeterminismError
    ├── CheckpointError
    ├── HandlerRecursionError
    ├── AgencyCancelledError
    ├── RunInterruptedError
    ├── GuardExceededError
    ├── GuardApproveError
    ├── LockReentryError
    ├── LockTimeoutError
    ├── LLMCallError
    │   └── ToolRoundsExceededError
    ├── ProviderError
    └── StructuredOutputError

    RunPaused (BaseException)
    RestoreSignal (BaseException)
    RunHandedBack (BaseException)
    RunParked (BaseException)
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "TRANSIENT_KINDS",
    "AgencyCancelledError",
    "AgencyError",
    "CheckpointError",
    "EntryImportError",
    "EntryNotAllowedError",
    "EntryResultError",
    "ErrorKind",
    "EventLoopRunningError",
    "EventTimeoutError",
    "GuardApproveError",
    "GuardExceededError",
    "HandlerRecursionError",
    "InterruptAnswerError",
    "InvalidArgumentError",
    "JournalCorruptError",
    "LLMCallError",
    "LockReentryError",
    "LockTimeoutError",
    "NoModelError",
    "NondeterminismError",
    "NotInRunError",
    "OutsideFrameError",
    "ProviderError",
    "RestoreSignal",
    "ResultSerializationError",
    "RunConflictError",
    "RunFailedError",
    "RunFinishedError",
    "RunHandedBack",
    "RunInterruptedError",
    "RunNotFoundError",
    "RunParked",
    "RunPaused",
    "RunPausedError",
    "RunWaitTimeoutError",
    "ScheduleNotFoundError",
    "StepResultError",
    "StoreError",
    "StoreSchemaError",
    "StoreUnavailableError",
    "StructuredOutputError",
    "ToolRoundsExceededError",
]


ErrorKind = Literal[
    "timeout", "rate_limit", "server", "connection", "bad_request", "auth", "not_found", "other"
]
"""What went wrong at the provider, as far as the seam cares."""

TRANSIENT_KINDS: frozenset[str] = frozenset({"timeout", "rate_limit", "server", "connection"})
"""The kinds that are worth retrying: the same request may well succeed in a moment."""


class AgencyError(Exception):
    """Base class of every error raised by agency_runtime."""


class InvalidArgumentError(AgencyError, ValueError):
    """An argument had a value the runtime cannot accept."""


class OutsideFrameError(AgencyError, RuntimeError):
    """An ``agency.*`` member that needs a run was called outside any execution frame."""

    def __init__(self, member: str) -> None:
        self.member = member
        super().__init__(
            f"agency.{member} was called outside an agency execution frame. "
            "Call it from code running inside `agency.run(...)` / `agency.run_sync(...)`, "
            "or, in a unit test, wrap the call in `agency.with_test_context(fn=...)` "
            "or `with agency.test_context():`."
        )


class NotInRunError(AgencyError, RuntimeError):
    """Something that needs a durable run (a pause, a global lock) was asked in a test frame."""


class EventLoopRunningError(AgencyError, RuntimeError):
    """``agency.run_sync`` was called from inside a running event loop."""


class NoModelError(AgencyError):
    """``agency.llm`` has no model to call (no ``model=``, no run model, no AGENCY_MODEL)."""


class StoreError(AgencyError):
    """The durable store failed to read or write."""


class StoreUnavailableError(StoreError):
    """The store named by a URL could not be opened (bad URL, unwritable path, missing extra)."""


class StoreSchemaError(StoreError):
    """The store holds data in a schema this version of agency-runtime cannot use."""


class JournalCorruptError(StoreError):
    """A journal row of a run could not be read back."""


class RunNotFoundError(AgencyError, LookupError):
    """No run with the given run id exists in the store."""

    def __init__(self, run_id: str, store: str | None = None) -> None:
        self.run_id = run_id
        where = f" in store {store}" if store else ""
        super().__init__(
            f"no run with id {run_id!r}{where}; "
            "list the runs with `agency.runs.list()` to find the right id"
        )


class RunWaitTimeoutError(AgencyError, TimeoutError):
    """``agency.runs.wait`` gave up: the run was still queued or running at its timeout."""

    def __init__(self, run_id: str, status: str, timeout: float) -> None:
        self.run_id = run_id
        self.status = status
        super().__init__(
            f"run {run_id!r} is still {status} after {timeout:g} s; is a worker serving its "
            "queue (`agency worker --store URL --queue NAME`)? Wait longer, or look at it "
            "with `agency runs show ID`"
        )


class RunFinishedError(AgencyError):
    """An event was sent to a run that is completed or cancelled: nothing will ever take it."""

    def __init__(self, run_id: str, status: str, event: str) -> None:
        self.run_id = run_id
        self.status = status
        self.event = event
        super().__init__(
            f"cannot send event {event!r} to run {run_id!r}: the run is {status}, so no wait "
            "will ever take it. Send it to a run that is still going, or start a new run"
        )


class EventTimeoutError(AgencyError, TimeoutError):
    """``agency.wait_for_event`` gave up: no event of that name came within its timeout."""

    def __init__(self, name: str, timeout: float, run_id: str | None = None) -> None:
        self.name = name
        self.timeout = timeout
        self.run_id = run_id
        super().__init__(
            f"no event {name!r} came to run {run_id!r} within {timeout:g} s; send one with "
            f"`agency.runs.send(run_id, {name!r}, payload)`, or wait with a longer timeout"
        )


class ScheduleNotFoundError(AgencyError, LookupError):
    """No schedule with the given name exists in the store."""

    def __init__(self, name: str, store: str | None = None) -> None:
        self.name = name
        where = f" in store {store}" if store else ""
        super().__init__(
            f"no schedule named {name!r}{where}; list them with `agency.schedules.list()`"
        )


class ChildRunRejectedError(AgencyError):
    """A child run was refused: a ``std::run`` handler rejected it, or it is too deep."""

    def __init__(self, run_id: str, depth: int, reason: str) -> None:
        self.run_id = run_id
        self.depth = depth
        self.reason = reason
        super().__init__(f"child run {run_id!r} (depth {depth}) was not started: {reason}")


class RunConflictError(AgencyError):
    """A run id was reused with a different entry or different arguments."""

    def __init__(self, run_id: str, differences: list[str]) -> None:
        self.run_id = run_id
        self.differences = differences
        detail = "; ".join(differences)
        super().__init__(
            f"run {run_id!r} already exists with different inputs: {detail}. "
            "A run id is an idempotency key: reuse it only with the same entry and "
            "arguments, or pick a new run id."
        )


class EntryImportError(AgencyError):
    """A run's entry could not be re-imported from its recorded ``module:qualname``."""


class EntryNotAllowedError(EntryImportError):
    """A stored run names an entry the application did not declare, so it is not run."""


class RunFailedError(AgencyError):
    """``RunResult.unwrap()`` was called on a run that failed or was cancelled."""

    def __init__(self, result: Any) -> None:
        self.result = result
        error = result.error
        what = f"{error.type}: {error.message}" if error is not None else result.status
        super().__init__(f"run {result.run_id!r} {result.status}: {what}")


class RunPausedError(AgencyError):
    """``RunResult.unwrap()`` was called on a run that is paused waiting for answers."""

    def __init__(self, result: Any) -> None:
        self.result = result
        count = len(result.interrupts)
        super().__init__(
            f"run {result.run_id!r} is paused on {count} interrupt(s); answer them with "
            "`await agency.respond_to_interrupts(result, responses)`"
        )


class InterruptAnswerError(InvalidArgumentError):
    """Answers given to ``respond_to_interrupts`` do not fit the run's pending interrupts."""


class ResultSerializationError(AgencyError):
    """A value that must be stored durably cannot be serialized to JSON."""


class StepResultError(ResultSerializationError):
    """A resumable step returned a value that cannot be journaled as JSON."""


class McpError(Exception):
    """An MCP call failed (``isError``, a timeout, no server): the model reads it, as any tool's."""


class StepFailedError(AgencyError):
    """A step with retries failed on its last attempt (``attempts``, each attempt's ``errors``)."""

    def __init__(self, path: str, attempts: int, errors: list[dict[str, str]]) -> None:
        self.path = path
        self.attempts = attempts
        self.errors = errors
        last = errors[-1] if errors else {"type": "?", "message": ""}
        super().__init__(
            f"step {path!r} failed after {attempts} attempt(s); the last: "
            f"{last['type']}: {last['message']}"
        )


class EntryResultError(ResultSerializationError, ValueError):
    """A run's entry returned a value that does not fit the entry's return annotation."""


class NondeterminismError(AgencyError):
    """A replayed run called different steps than the journal recorded."""


class CheckpointError(AgencyError):
    """A checkpoint does not exist, or restoring it looped too many times."""


class HandlerRecursionError(AgencyError):
    """Interrupt handlers were nested more deeply than allowed."""


class AgencyCancelledError(AgencyError):
    """The run (or its branch) was cancelled, by ``ctx.cancel()`` or a time guard."""

    def __init__(self, message: str = "Agent execution was cancelled", *, cause: Any = None):
        self.agency_cause = cause
        super().__init__(message)


class RunInterruptedError(AgencyError):
    """A run was interrupted from outside (its caller cancelled, Ctrl-C) before it finished."""


class GuardExceededError(AgencyError):
    """A cost or time guard's budget was exceeded."""

    def __init__(
        self,
        type: str,
        limit: float,
        spent: float,
        guard_id: str,
        label: str | None = None,
    ) -> None:
        # The dimension is "cost" (limit and spent in US dollars) or "time" (in seconds);
        # guard_id and label name the guard. The message says which guard tripped, by how
        # much, and the ways on: raise the limit, approve more budget, or catch the error.
        self.type = type
        self.limit = limit
        self.spent = spent
        self.guard_id = guard_id
        self.label = label
        if label:
            name, where = f'{type} guard "{label}"', f" (guard id {guard_id})"
        else:
            name, where = f"{type} guard {guard_id}", ""
        if type == "time":
            amounts = f"its budget of {self._seconds(limit)}: {self._seconds(spent)} passed"
            factories, more = "agency.time_guard(...) / agency.with_time_guard(...)", "time"
            grant = '{"max_time": <extra seconds>}'
        else:
            amounts = (
                f"its budget of {self._dollars(limit)} (US dollars): spent {self._dollars(spent)}"
            )
            factories, more = "agency.cost_guard(...) / agency.with_cost_guard(...)", "budget"
            grant = '{"max_cost": <extra US dollars>}'
        super().__init__(
            f"{name} exceeded {amounts}{where}. To go on: raise the limit given to {factories}; "
            f"approve more {more} when the guard asks through a std::guard interrupt (after an "
            f"LLM call): approve({grant}); or catch GuardExceededError where the work may stop."
        )

    @staticmethod
    def _dollars(usd: float) -> str:
        """``$0.050000``: at least six decimals, up to twelve (pico-dollars) when they matter."""
        whole, _, decimals = f"{usd:.12f}".partition(".")
        return f"${whole}.{decimals.rstrip('0').ljust(6, '0')}"

    @staticmethod
    def _seconds(seconds: float) -> str:
        """``30 seconds``, ``0.05 seconds``: to the millisecond, trailing zeros cut."""
        text = f"{seconds:.3f}".rstrip("0").rstrip(".")
        return f"{text} second" if text == "1" else f"{text} seconds"


class GuardApproveError(AgencyError):
    """A guard approval did not grant enough budget to continue."""


class LockReentryError(AgencyError):
    """An owner tried to acquire a lock it already holds."""


class LockTimeoutError(AgencyError, TimeoutError):
    """Waiting for a lock took longer than its timeout."""


class LLMCallError(AgencyError):
    """A call to the LLM provider failed (after retries, for transient errors)."""

    def __init__(self, message: str, *, model: str, attempts: int) -> None:
        self.model = model
        self.attempts = attempts
        super().__init__(message)


class ToolRoundsExceededError(LLMCallError):
    """The model kept calling tools for ``max_tool_rounds`` rounds without answering."""


class ProviderError(AgencyError):
    """A provider request failed; ``transient`` says whether retrying it may help."""

    # Providers raise it ``from`` their library's exception (then :attr:`original`); the
    # seam retries transient errors and turns the others, and transient ones that kept
    # failing, into LLMCallError chained to it. ``kind`` says what went wrong; ``transient``
    # defaults to whether ``kind`` is one of TRANSIENT_KINDS.

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind = "other",
        model: str = "",
        provider: str = "",
        transient: bool | None = None,
    ) -> None:
        self.kind: ErrorKind = kind
        self.model = model
        self.provider = provider
        self.transient = kind in TRANSIENT_KINDS if transient is None else transient
        super().__init__(message)

    @property
    def original(self) -> BaseException:
        """The provider library's exception this error was raised from (else itself)."""
        cause = self.__cause__
        return cause if cause is not None else self


class StructuredOutputError(AgencyError):
    """The model's answer never matched the requested schema within the allowed retries."""

    def __init__(self, message: str, *, raw: str, errors: list[str]) -> None:
        self.raw = raw
        self.errors = errors
        super().__init__(message)


class RunPaused(BaseException):
    """Signal: the run paused on interrupts; the run boundary turns it into a paused result."""

    def __init__(self, interrupts: list[Any]) -> None:
        self.interrupts = interrupts
        ids = ", ".join(i.interrupt_id for i in interrupts)
        super().__init__(f"run paused on interrupt(s) {ids}")


class RunHandedBack(BaseException):
    """Signal: a draining worker hands the run back to its queue after the step it committed."""


class RunParked(BaseException):
    """Signal: a worker's run parks in a long wait; the run boundary stores it ``waiting``.

    ``wake_at`` is when a worker continues it (``None``: only an event wakes it);
    ``events`` names the events that wake it earlier.
    """

    def __init__(self, wake_at: float | None, events: tuple[str, ...] = ()) -> None:
        self.wake_at = wake_at
        self.events = events
        super().__init__(f"run parked until {wake_at!r} or an event of {list(events)!r}")


class RestoreSignal(BaseException):
    """Signal: ``agency.restore`` asks the run boundary to rewind to a checkpoint."""

    def __init__(
        self,
        checkpoint: Any,
        args: dict[str, Any] | list[Any] | tuple[Any, ...] | None = None,
        globals: dict[str, Any] | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.new_args = args
        self.new_globals = globals
        super().__init__(f"Restoring to checkpoint {checkpoint.checkpoint_id}")
