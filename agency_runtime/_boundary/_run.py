"""The run boundary: ``agency.run`` / ``agency.run_sync``.

A run is claimed atomically in the store (a lease row), executed inside a fresh frame, and
its outcome stored before it is returned. A run id is an idempotency key: calling again with
the id of a completed (or cancelled) run returns the stored result without executing
anything; a concurrent call waits for the holder and returns its result; a holder that died
is detected when its lease expires, and the waiter takes the run over.
"""

from __future__ import annotations

import functools
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import anyio
from pydantic import ValidationError

from .._clock import Clock, SystemClock
from .._core import _observe
from .._core._branches import run_root
from .._core._changes import Recorder
from .._core._context import BranchState, RuntimeContext
from .._core._frame import Frame, call_in_frame
from .._core._jsondata import check_text
from .._core._money import pico_to_usd
from .._core._threads import ThreadStore
from .._durable._entries import location_ref
from .._durable._journal import JOURNAL, RunJournal
from .._durable._leases import holder_is_dead, owner_id
from .._durable._values import (
    annotation_text,
    check_entry,
    decode_arguments,
    diff_arguments,
    encode_arguments,
    encode_overrides,
    encode_value,
    return_adapter,
    return_annotation,
    revive_value,
    stored_globals,
    validation_problems,
)
from .._errors import (
    AgencyCancelledError,
    AgencyError,
    EntryResultError,
    EventLoopRunningError,
    InvalidArgumentError,
    RestoreSignal,
    RunConflictError,
    RunFinishedError,
    RunHandedBack,
    RunInterruptedError,
    RunNotFoundError,
    RunParked,
    RunPaused,
    StoreError,
    StoreUnavailableError,
)
from .._llm._model import MODELS, Model, known_secrets, model_name, run_model
from .._llm._model import check_model as check_llm_model
from .._locks import share_run_locks
from .._store import RunRecord, Store
from .._types import (
    ErrorInfo,
    Interrupt,
    InterruptResponse,
    RunResult,
    RunStatus,
    bind_store,
    complete,
    store_of,
)
from ._handback import HandBack
from ._runtime import RUNTIME

__all__ = [
    "LEASE_SECONDS",
    "check_model",
    "check_run_id",
    "check_same_inputs",
    "drive",
    "execute",
    "result_from_record",
    "run",
    "run_sync",
    "stored_result",
    "warn_lease_lost",
]

logger = logging.getLogger("agency_runtime.run")

LEASE_SECONDS = 30.0
"""How long a claim on a run lasts without renewal; the holder renews every third of it."""

T = TypeVar("T")

_WAIT_MIN, _WAIT_MAX = 0.005, 0.25
_MAX_RUN_ID = 512


def check_run_id(run_id: object) -> str:
    if run_id is None:
        return uuid.uuid4().hex
    if not isinstance(run_id, str) or not run_id.strip():
        raise InvalidArgumentError(f"run_id must be a non-empty string, got {run_id!r}")
    if len(run_id) > _MAX_RUN_ID or any(ord(c) < 32 for c in run_id):
        raise InvalidArgumentError(
            f"run_id must be at most {_MAX_RUN_ID} printable characters, got {run_id!r:.80}"
        )
    check_text(run_id, "run_id")
    return run_id


def check_same_inputs(
    stored: RunRecord, ref: str, arguments: str, location: str | None = None
) -> None:
    differences: list[str] = []
    if stored.entry not in (ref, location):
        differences.append(f"entry: stored {stored.entry!r}, given {ref!r}")
    if stored.arguments != arguments:
        differences.extend(diff_arguments(stored.arguments, arguments))
    if differences:
        raise RunConflictError(stored.run_id, differences)


def check_model(model: object) -> str | None:
    """The name a run records for ``model`` (``None``, a model string, or an
    :class:`~agency_runtime.Model`, which is registered under its name in this process so
    the run resumes with it); else an InvalidArgumentError."""
    checked = check_llm_model(model)
    if isinstance(checked, Model):
        checked = MODELS.adopt(checked)
    return model_name(checked)


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def stored_result(record: RunRecord) -> RunResult:
    """The stored outcome of a run, its value revived into the entry's return type when this
    process knows the entry already (nothing is imported for it)."""
    return result_from_record(record, RUNTIME.entries.known(record.run_id, record.entry))


def result_from_record(record: RunRecord, entry: Callable[..., Any] | None) -> RunResult:
    """The stored outcome of a run, its value revived into the entry's return type (as
    plain JSON data when the entry is not known here); it remembers the record's store."""
    duration = None
    if record.started_at is not None and record.finished_at is not None:
        duration = max(0.0, record.finished_at - record.started_at)
    result = RunResult(
        run_id=record.run_id,
        status=record.status,
        value=revive_value(record.value, None if entry is None else return_adapter(entry)),
        interrupts=record.interrupts,
        cost=pico_to_usd(record.cost_pico),
        tokens=record.tokens,
        error=record.error,
        created_at=_when(record.created_at),
        started_at=_when(record.started_at),
        finished_at=_when(record.finished_at),
        duration=duration,
        replayed=True,
        wake_at=_when(record.wake_at),
    )
    return bind_store(result, store_of(record))


_CHILD_EVENT = "agency.child:"
_REPORTED = frozenset({"completed", "failed", "cancelled", "paused"})
"""The ends of a queued child its parent is told of (each one it waits for)."""


def child_event(run_id: str) -> str:
    """The event a queued child run ``run_id`` sends its parent when it ends or pauses."""
    name = _CHILD_EVENT + run_id
    if len(name) <= 200:  # an event name's bound
        return name
    import hashlib  # only for very long ids: hashlib's import is not free

    return _CHILD_EVENT + hashlib.sha256(run_id.encode()).hexdigest()


async def tell_parent(store: Store, record: RunRecord) -> None:
    """Wake the parent waiting for the queued child ``record``, which just ended or paused
    (an event to the parent: buffered, and by NOTIFY on PostgreSQL). A parent that is final
    already waits for nothing."""
    if record.parent_id is None or record.queue is None or record.status not in _REPORTED:
        return
    try:
        status = encode_value(record.status, what="a child run's status")
        await store.send_event(record.parent_id, child_event(record.run_id), status)
    except (RunFinishedError, RunNotFoundError):
        pass


# Typed for users by the facade's overloads (``agency.run``): an awaitable's value, else the value.
async def run(
    entry: Callable[..., Any],
    *args: Any,
    run_id: str | None = None,
    store: str | Store | None = None,
    model: str | Model | None = None,
    **kwargs: Any,
) -> RunResult[Any]:
    """Run ``entry(*args, **kwargs)`` as a durable run and return its :class:`RunResult`.

    ``run_id``, ``store`` and ``model`` are run options; every other argument goes to
    ``entry`` (sync or async) and must be JSON data or pydantic models, since it is stored.
    ``store`` is a URL or a :class:`Store` (default: ``AGENCY_STORE``, else
    ``sqlite:///./.agency/agency.db``). ``model`` is the default for ``agency.llm``
    (else ``AGENCY_MODEL``): a model string, an :class:`~agency_runtime.Model` or a
    registered model's name. The run records only the name (never a key); a process that
    resumes the run uses the model registered there under that name (register models at
    import, like entries), else the name as a plain model string.

    With the ``run_id`` of a completed or cancelled run, the stored result is returned and
    nothing executes; a paused, failed or crashed run continues from its journal (completed
    steps are not run again); reusing an id with a different entry or different arguments
    raises :class:`RunConflictError` saying what differs.
    """
    check_entry(entry)
    run_id = check_run_id(run_id)
    store_ = RUNTIME.stores.resolve(store)
    ref = RUNTIME.entries.entry_ref(entry)
    arguments = encode_arguments(args, kwargs)
    name = check_model(model)
    stored = await store_.get_run(run_id)
    if stored is not None:
        check_same_inputs(stored, ref, arguments, location_ref(entry))
        if stored.is_final:
            return result_from_record(bind_store(stored, store_), entry)
        name = name or stored.model
    RUNTIME.entries.remember(run_id, entry)
    record = RunRecord(
        run_id=run_id,
        status="running",
        entry=ref,
        arguments=arguments,
        model=name or os.environ.get("AGENCY_MODEL") or None,
        created_at=(now := RUNTIME.clock.time()),
        updated_at=now,
    )
    return await drive(store_, record, entry, args, kwargs)


async def drive(
    store: Store,
    record: RunRecord,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    parent: RuntimeContext | None = None,
) -> RunResult:
    """Claim ``record.run_id`` (waiting for a live holder) and execute it, or return its result.

    ``parent``: the context of the run whose call started this one as a child run (its
    run-scoped locks are shared with it)."""
    owner = owner_id(uuid.uuid4().hex[:12])
    delay = _WAIT_MIN
    dead: str | None = None
    while True:
        claim = await store.claim_run(
            record, owner=owner, lease_seconds=LEASE_SECONDS, steal_from=dead
        )
        if claim.acquired:
            break
        check_same_inputs(claim.record, record.entry, record.arguments, location_ref(entry))
        if claim.record.is_final:
            return result_from_record(bind_store(claim.record, store), entry)
        if holder_is_dead(claim.record.lease_owner):
            dead = claim.record.lease_owner  # a crashed process on this machine: take over now
            continue
        finished = await _wait_for_holder(store, record.run_id, delay)
        if finished is not None:
            return result_from_record(bind_store(finished, store), entry)
        delay = min(delay * 2, _WAIT_MAX)
    return await execute(
        store, claim.record, owner, entry, args, kwargs, fresh=claim.created, parent=parent
    )


async def _wait_for_holder(store: Store, run_id: str, delay: float) -> RunRecord | None:
    """Wait while another caller executes ``run_id``.

    Returns the run once its holder stored an outcome; ``None`` when the holder's lease
    expired (it died), so the caller should claim the run itself. It polls in real time (it
    watches another task or process make progress). Whether the lease expired is read on the
    runtime's clock only as a hint of when to try: the claim that follows is decided by the
    store, on the store's clock (the runtime's for memory and SQLite stores opened by URL, the
    server's for PostgreSQL, the one clock every host shares), so a host whose clock runs
    ahead asks again sooner but never takes a live lease.
    """
    clock = RUNTIME.clock
    while True:
        await anyio.sleep(delay)
        current = await store.get_run(run_id)
        if current is None:
            return None
        if current.status != "running":
            return current
        if not current.lease_alive(clock.time()) or holder_is_dead(current.lease_owner):
            return None
        delay = min(delay * 2, _WAIT_MAX)


def warn_lease_lost(run_id: str) -> None:
    """Log that run ``run_id`` lost its lease to another process (this execution's outcome
    will not be stored)."""
    logger.warning(
        "run %r: lost its lease (another process took the run over); "
        "its outcome here will not be stored",
        run_id,
    )


async def _renew_lease(
    store: Store, run_id: str, owner: str, lease_seconds: float, clock: Clock, stop: anyio.Event
) -> None:
    """Renew run ``run_id``'s lease every third of it (on ``clock``) until ``stop`` is set, or
    the lease was lost.

    On the system clock, whose sleep is anyio's, it waits for ``stop`` up to the next
    renewal, so a run's end stops it by setting ``stop``: cancelling the task cost each run
    ~0.05 to 0.1 ms (and most runs end long before their first renewal). On another clock (a
    test's ``FakeClock``) it sleeps on that clock, and the run's end also cancels it.
    """
    while True:
        if type(clock) is SystemClock:
            with anyio.move_on_after(lease_seconds / 3):
                await stop.wait()
        else:
            await clock.sleep(lease_seconds / 3)
        if stop.is_set():
            return
        if not await store.renew_lease(run_id, owner=owner, lease_seconds=lease_seconds):
            warn_lease_lost(run_id)
            return


async def execute(
    store: Store,
    record: RunRecord,
    owner: str,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    fresh: bool = False,
    lease_seconds: float | None = None,
    handback: HandBack | None = None,
    parent: RuntimeContext | None = None,
    empty_journal: bool = False,
    renews: bool = True,
) -> RunResult:
    """Execute a claimed run and store its outcome; never leaves it ``running``.

    Whatever happens inside — a value that does not fit the entry's annotation, a store
    failure, a bug of ours — ends as a result (``failed`` with the error); an interruption
    from outside (an enclosing cancel scope, ``KeyboardInterrupt``) still stores the run as
    ``failed`` and releases its lease before it propagates.

    ``lease_seconds`` is how long the lease lasts between renewals (default
    :data:`LEASE_SECONDS`). With ``handback`` (a worker's run), the run goes back to its
    queue instead: after the next step commit once ``handback.requested`` is set (a draining
    worker), and when it is interrupted from outside (another worker continues it from its
    journal). ``fresh``: the claim created the run; ``empty_journal``: the claim found
    nothing journaled for it (a queued run that never started); either way its journal is
    not read. ``renews=False``: the caller renews the lease every third of
    ``lease_seconds`` (a worker, for all of its runs at once). With an observer installed
    (:mod:`agency_runtime.otel`) the execution is one observed run, its steps inside it.
    """
    obs = _observe.OBSERVER
    if obs is None:
        return await _execute(
            store, record, owner, entry, args, kwargs,
            fresh=fresh, lease_seconds=lease_seconds, handback=handback, parent=parent,
            empty_journal=empty_journal, renews=renews,
        )  # fmt: skip
    link = None if fresh else await read_trace_context(store, record.run_id)
    with obs.run(record.run_id, record.entry, record.attempts, link) as watch:
        await note_trace_context(store, record.run_id, watch.context())
        result = await _execute(
            store, record, owner, entry, args, kwargs,
            fresh=fresh, lease_seconds=lease_seconds, handback=handback, parent=parent,
            empty_journal=empty_journal, renews=renews,
        )  # fmt: skip
        watch.finished(result.status, result.cost, result.exception)
    return result


async def read_trace_context(store: Store, run_id: str) -> str | None:
    """The span the run's execution follows (its previous one, or the parent's call of a
    queued child); ``None`` when unknown. Tracing never fails a run: a store error is
    logged."""
    try:
        return await store.trace_context(run_id)
    except StoreError as exc:
        logger.debug("the trace context of run %r could not be read: %s", run_id, exc)
        return None


async def note_trace_context(store: Store, run_id: str, context: str | None) -> None:
    """Note this execution's span for the run's next one (a store error is logged)."""
    if context is None:
        return
    try:
        await store.note_trace_context(run_id, context)
    except StoreError as exc:
        logger.debug("the trace context of run %r could not be noted: %s", run_id, exc)


@dataclass(slots=True)
class _Attempt:
    """One execution of a claimed run: what its steps share."""

    store: Store
    record: RunRecord
    owner: str
    lease: float
    """How long the lease lasts between renewals."""
    handback: HandBack | None
    """A worker's hold on the run (``None`` in a plain run)."""
    ctx: RuntimeContext
    root: Recorder
    """Collects the spend made outside journaled steps (stored as the run's unjournaled spend)."""
    started: float
    renews: bool
    """Whether this execution renews its lease (else its caller does: a worker)."""
    journal: RunJournal | None = None
    """The run's journal, once it is open (``None`` if opening it failed)."""


@dataclass(slots=True)
class _Ending:
    """How an execution ended: the status it is stored with and what goes with it."""

    status: RunStatus = "failed"
    value: Any = None
    value_json: str | None = None
    error: BaseException | None = None
    interrupts: list[Interrupt] = field(default_factory=list)
    parked: RunParked | None = None


async def _execute(
    store: Store,
    record: RunRecord,
    owner: str,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    fresh: bool,
    lease_seconds: float | None,
    handback: HandBack | None,
    parent: RuntimeContext | None,
    empty_journal: bool,
    renews: bool,
) -> RunResult:
    """:func:`execute` without the observer: run, judge the ending, store it, return it."""
    attempt = _prepare(store, record, owner, lease_seconds, handback, parent, renews)
    interrupted: BaseException | None = None
    try:
        ending = await _run_leased(attempt, entry, args, kwargs, fresh=fresh or empty_journal)
    except BaseException as exc:  # cancelled from outside, KeyboardInterrupt, SystemExit
        interrupted = exc
        ending = _interrupted(record.run_id, exc, worker=handback is not None)
    if handback is not None and ending.status == "failed" and _outage(ending.error):
        ending = _Ending("queued")  # the store failed, not the run: another try later
    finished = None if ending.status in ("queued", "waiting") else attempt.ctx.clock.time()
    outcome, stored = await _store_outcome(attempt, ending, finished)
    if stored:
        with anyio.CancelScope(shield=True):
            await tell_parent(store, outcome)
    if interrupted is not None:
        raise interrupted
    _after_storing(attempt, ending, stored)
    return _result(attempt, ending, outcome, finished)


def _prepare(
    store: Store,
    record: RunRecord,
    owner: str,
    lease_seconds: float | None,
    handback: HandBack | None,
    parent: RuntimeContext | None,
    renews: bool,
) -> _Attempt:
    """One execution of the claimed ``record``, in a fresh context (the run's model and store,
    the runtime's clock)."""
    clock = RUNTIME.clock
    ctx = RuntimeContext(
        record.run_id,
        model=run_model(record.model),
        store=store,
        clock=clock,
        subprocess_depth=record.depth,
    )
    if parent is not None:  # a child run: its parent's run-scoped locks are its locks too
        share_run_locks(parent, ctx)
    lease = LEASE_SECONDS if lease_seconds is None else lease_seconds
    started = record.started_at or clock.time()
    return _Attempt(
        store, record, owner, lease, handback, ctx, Recorder(keep=False), started, renews
    )


async def _run_leased(
    attempt: _Attempt,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    fresh: bool,
) -> _Ending:
    """Open the journal, run the entry and judge how it ended, renewing the lease meanwhile
    (unless the caller renews it: a worker renews all of its runs' leases together).

    A failure of any kind (the entry's, the store's, ours) is the run's ending; only an
    interruption from outside propagates.
    """
    if not attempt.renews:
        return await _judged(attempt, entry, args, kwargs, fresh=fresh)
    ending = _Ending()
    clock, stop = RUNTIME.clock, anyio.Event()
    async with anyio.create_task_group() as renewals:
        store, record = attempt.store, attempt.record
        renewals.start_soon(
            _renew_lease, store, record.run_id, attempt.owner, attempt.lease, clock, stop
        )
        try:
            ending = await _judged(attempt, entry, args, kwargs, fresh=fresh)
        finally:
            stop.set()
            if type(clock) is not SystemClock:  # it sleeps on that clock: wake it
                renewals.cancel_scope.cancel()
    return ending


async def _judged(
    attempt: _Attempt,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    fresh: bool,
) -> _Ending:
    """Open the journal, run the entry and judge how it ended (any failure is the ending)."""
    store, record = attempt.store, attempt.record
    try:
        journal = await _open_journal(store, record, attempt.owner, attempt.ctx, fresh=fresh)
        attempt.journal = journal
        journal.parking = attempt.handback  # a worker's run: it may be asked to stop or park
        outcome = await _run_entry(attempt, journal, entry, args, kwargs)
        return await _classify(record, journal, entry, outcome)
    except Exception as exc:  # a failure of any kind is the run's result
        return _failure(record.run_id, exc)


async def _run_entry(
    attempt: _Attempt,
    journal: RunJournal,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> _Outcome:
    """Run the entry (with the arguments and globals a restore stored) until it ends other
    than by restoring a checkpoint; each restore rewinds the journal and runs it again."""
    ctx, record = attempt.ctx, attempt.record
    if record.overrides is not None:
        args, kwargs = decode_arguments(entry, record.overrides)
        ctx.globals.update(stored_globals(record.overrides))
    while True:
        journal.begin_execution()
        outcome = await _call_entry(ctx, attempt.root, entry, args, kwargs)
        if not isinstance(outcome, RestoreSignal):
            return outcome
        args, kwargs = await _rewind(journal, ctx, entry, args, kwargs, outcome)


async def _classify(
    record: RunRecord, journal: RunJournal, entry: Callable[..., Any], outcome: _Outcome
) -> _Ending:
    """The ending of an execution that ended with ``outcome``: a pause records its
    interrupts first; a value must be data that fits the entry's return annotation."""
    if isinstance(outcome, RunHandedBack):
        return _Ending("queued")
    if isinstance(outcome, RunParked):
        return _Ending("waiting", parked=outcome)
    if isinstance(outcome, RunPaused):
        await journal.record_pause()
        return _Ending("paused", interrupts=_unique(journal.paused or outcome.interrupts))
    if isinstance(outcome, AgencyCancelledError):
        return _Ending("cancelled", error=outcome)
    if isinstance(outcome, _Completed):
        text = encode_value(outcome.value, what=f"the value returned by run {record.run_id!r}")
        value = _validated(text, entry, record.entry, outcome.value)
        return _Ending("completed", value=value, value_json=text)
    logger.debug("run %r failed", record.run_id, exc_info=outcome)
    return _Ending("failed", error=outcome)


def _failure(run_id: str, exc: Exception) -> _Ending:
    """The ending of an execution that raised ``exc`` (a cancellation ends it cancelled);
    an error that is neither ours to report nor a validation error is logged."""
    if not isinstance(exc, AgencyError | ValidationError):
        logger.warning("run %r failed inside the runtime", run_id, exc_info=exc)
    return _Ending("cancelled" if isinstance(exc, AgencyCancelledError) else "failed", error=exc)


def _interrupted(run_id: str, exc: BaseException, *, worker: bool) -> _Ending:
    """The ending of an execution interrupted from outside by ``exc``: a worker's run goes
    back to its queue (another worker continues it), any other run fails, saying so."""
    if worker:
        return _Ending("queued")
    return _Ending(
        error=RunInterruptedError(
            f"run {run_id!r} was interrupted ({type(exc).__name__}) before it "
            f"finished; continue it with agency.resume({run_id!r})"
        )
    )


async def _store_outcome(
    attempt: _Attempt, ending: _Ending, finished: float | None
) -> tuple[RunRecord, bool]:
    """Store the run's ending (shielded: an interrupted run is stored too) and release its
    lease; returns the record stored and whether this process still held the run.

    When the store fails, the ending becomes that failure (never "completed" unstored).
    """
    record, journal, root = attempt.record, attempt.journal, attempt.root
    outcome = _outcome_record(attempt, ending, finished)
    forget: list[str] = []  # recorded failures that ended the run: a retry performs them again
    if journal is not None and ending.status == "failed":
        forget = journal.uncaught(ending.error)
    with anyio.CancelScope(shield=True):
        try:
            stored = await attempt.store.finish_run(
                outcome, owner=attempt.owner, unjournaled=(root.pico, root.tokens), forget=forget
            )
        except Exception as exc:  # the outcome could not be stored: say so, never "completed"
            logger.warning("run %r: its outcome could not be stored", record.run_id, exc_info=exc)
            ending.status, ending.value, ending.error, ending.interrupts = "failed", None, exc, []
            outcome = outcome.model_copy(
                update={
                    "status": "failed",
                    "value": None,
                    "error": _error_info(attempt, exc),
                    "interrupts": [],
                    "wake_at": None,
                    "waiting_for": [],
                }
            )
            return outcome, False
    return outcome, stored


def _outcome_record(attempt: _Attempt, ending: _Ending, finished: float | None) -> RunRecord:
    """The run's record as ``ending`` leaves it, with the spend of this execution."""
    parked, error = ending.parked, ending.error
    return attempt.record.model_copy(
        update={
            "status": ending.status,
            "wake_at": None if parked is None else parked.wake_at,
            "waiting_for": [] if parked is None else list(parked.events),
            "value": ending.value_json,
            "error": None if error is None else _error_info(attempt, error),
            "interrupts": ending.interrupts,
            "cost_pico": attempt.ctx.cost_pico,
            "tokens": attempt.ctx.tokens,
            "descendants_pico": _descendants_pico(attempt.journal),
            "finished_at": finished,
        }
    )


def _error_info(attempt: _Attempt, error: BaseException) -> ErrorInfo:
    """The stored form of the error that ended the attempt, no api_key quoted in it."""
    return ErrorInfo.from_exception(error, *known_secrets(attempt.ctx.model))


def _descendants_pico(journal: RunJournal | None) -> int:
    """What the run's child runs spent: the spend billed with each child call's unit."""
    return 0 if journal is None else journal.children_pico


def _after_storing(attempt: _Attempt, ending: _Ending, stored: bool) -> None:
    """Keep a paused run's journal for its answer; warn when the outcome was not stored
    because the run was cancelled or taken over meanwhile."""
    record, status = attempt.record, ending.status
    if stored and status == "paused" and attempt.journal is not None:
        RUNTIME.journals.keep(attempt.store, record.run_id, record.version + 1, attempt.journal)
        # Its answer is an InterruptResponse (approve() / reject()): build that model's
        # schema now, once per process, rather than in the call that answers.
        complete(InterruptResponse)
    if not stored and ending.error is None and status not in ("queued", "waiting"):
        logger.warning(
            "run %r finished with status %r, but it was cancelled or another process holds "
            "its lease now; the store keeps that outcome",
            record.run_id,
            status,
        )


def _result(
    attempt: _Attempt, ending: _Ending, outcome: RunRecord, finished: float | None
) -> RunResult:
    """The caller's result of this execution (its value revived), bound to the run's store."""
    record, started = attempt.record, attempt.started
    result = RunResult(
        run_id=record.run_id,
        status=ending.status,
        value=ending.value,
        interrupts=ending.interrupts,
        cost=pico_to_usd(outcome.cost_pico),
        tokens=outcome.tokens,
        error=outcome.error,
        created_at=_when(record.created_at),
        started_at=_when(started),
        finished_at=_when(finished),
        duration=None if finished is None else finished - started,
        wake_at=_when(outcome.wake_at),
        exception=ending.error,
    )
    return bind_store(result, attempt.store)


def _outage(error: BaseException | None) -> bool:
    """Whether ``error`` is the store being unreachable (a server down or restarting)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, StoreUnavailableError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def _validated(text: str, entry: Callable[..., Any], ref: str, returned: Any) -> Any:
    """The run's value revived into the entry's return annotation.

    Raises :class:`EntryResultError` (the run fails with it), naming the entry, the value,
    the annotation and what did not fit, when the value does not fit the annotation.
    """
    try:
        return revive_value(text, return_adapter(entry))
    except ValidationError as exc:
        shown = repr(returned)
        raise EntryResultError(
            f"entry {ref!r} returned {shown if len(shown) <= 80 else shown[:77] + '...'}, "
            "which does not match its return annotation "
            f"{annotation_text(return_annotation(entry))}: {validation_problems(exc)}"
        ) from exc


async def _open_journal(
    store: Store, record: RunRecord, owner: str, ctx: RuntimeContext, *, fresh: bool
) -> RunJournal:
    """The run's journal (empty for a run created by this claim or claimed with nothing
    journaled, cached if this process paused it, else loaded), hung on ``ctx``, whose spend
    starts from what the store holds: the spend of every committed step plus the run's
    unjournaled spend."""
    journal = RunJournal(record.run_id, store, owner) if fresh else None
    if journal is None:
        journal = RUNTIME.journals.take(store, record.run_id, record.version)
    if journal is None:
        journal = RunJournal(record.run_id, store, owner, await store.load_journal(record.run_id))
    journal.owner = owner
    ctx.charge(
        pico=journal.spent_pico + record.unjournaled_pico,
        tokens=journal.spent_tokens + record.unjournaled_tokens,
    )
    ctx.put(JOURNAL, journal)
    return journal


class _Completed:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_Outcome = (
    _Completed
    | RunPaused
    | RunParked
    | RunHandedBack
    | RestoreSignal
    | AgencyCancelledError
    | Exception
)


async def _call_entry(
    ctx: RuntimeContext,
    root: Recorder,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> _Outcome:
    """Run the entry once in a fresh frame; sort how it ended (a value, a pause, …).

    ``root`` collects the spend made outside journaled steps. A run started inside another
    run's step is its own run: its changes and spend belong to its own journal, not to the
    enclosing step's.
    """
    with run_root(root):  # before the frame: its default thread is the run's own change
        frame = Frame(ctx, BranchState.for_context(ctx), ThreadStore.with_default_active())
        try:
            with anyio.CancelScope() as scope:
                unsubscribe = frame.ctx.abort_signal.add_callback(lambda _reason: scope.cancel())
                try:
                    value = await call_in_frame(frame, lambda: entry(*args, **kwargs))
                finally:
                    unsubscribe()
            if scope.cancelled_caught:
                reason = ctx.abort_signal.reason
                if isinstance(reason, AgencyCancelledError):
                    return reason
                return AgencyCancelledError()
            return _Completed(value)
        except BaseException as exc:  # sorted below; foreign signals are raised again
            return _sort(exc)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _sort(exc: BaseException) -> _Outcome:
    leaves = _leaves(exc)
    for kind in (RunHandedBack, RestoreSignal):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    for leaf in leaves:
        if isinstance(leaf, Exception) and not isinstance(leaf, AgencyCancelledError):
            return leaf
    for leaf in leaves:
        if isinstance(leaf, RunPaused | AgencyCancelledError):
            return leaf
    parked = [leaf for leaf in leaves if isinstance(leaf, RunParked)]
    if parked:
        return _earliest(parked)
    raise exc  # KeyboardInterrupt, SystemExit, an outer cancellation: not ours to handle


def _earliest(parked: list[RunParked]) -> RunParked:
    """Branches parked at once: the run wakes at the first wake-up, or on any of their events."""
    times = [p.wake_at for p in parked if p.wake_at is not None]
    events = tuple(dict.fromkeys(name for p in parked for name in p.events))
    return RunParked(min(times) if times else None, events)


def _unique(interrupts: list[Interrupt]) -> list[Interrupt]:
    seen: dict[str, Interrupt] = {}
    for item in interrupts:
        seen.setdefault(item.interrupt_id, item)
    return list(seen.values())


async def _rewind(
    journal: RunJournal,
    ctx: RuntimeContext,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    signal: RestoreSignal,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Rewind to ``signal.checkpoint`` and return the arguments to run the entry with.

    The rewind, the restore count and the arguments and globals the entry runs with from now
    on are stored in one transaction, so a process killed right after it resumes the
    restored run as it is, never restoring again by mistake.
    """
    if signal.new_args is not None:
        if isinstance(signal.new_args, dict):
            kwargs = {**kwargs, **signal.new_args}
        else:
            args = tuple(signal.new_args)
    restored = {module: dict(values) for module, values in signal.checkpoint.globals.items()}
    if signal.new_globals:
        restored.setdefault("", {}).update(signal.new_globals)
    overrides = encode_overrides(args, kwargs, restored)
    key = signal.checkpoint.checkpoint_id
    kept = journal.checkpoints.get(key, signal.checkpoint)
    counted = kept.model_copy(update={"restores": journal.restores[key]})
    await journal.rewind(signal.checkpoint.seq, overrides=overrides, checkpoint=counted)
    ctx.globals.clear()
    ctx.globals.update(restored)
    return args, kwargs


def run_sync(entry: Callable[..., Any], *args: Any, **kwargs: Any) -> RunResult[Any]:
    """:func:`run` for scripts: starts an event loop, runs, and returns the result.

    Takes the same arguments as :func:`run`. It cannot be called from inside a running event
    loop; there, ``await agency.run(...)``.
    """
    try:
        anyio.get_current_task()  # asyncio or trio: any event loop anyio knows
    except RuntimeError:
        pass
    else:
        raise EventLoopRunningError(
            "agency.run_sync() was called from inside a running event loop; "
            "use `await agency.run(...)` there instead"
        )
    return anyio.run(functools.partial(run, entry, *args, **kwargs))
