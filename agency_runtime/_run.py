"""The run boundary: ``agency.run`` / ``agency.run_sync``.

A run is claimed atomically in the store (a lease row), executed inside a fresh frame, and
its outcome stored before it is returned. A run id is an idempotency key: calling again with
the id of a completed (or cancelled) run returns the stored result without executing
anything; a concurrent call waits for the holder and returns its result; a holder that died
is detected when its lease expires, and the waiter takes the run over.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from ._context import BranchState, RuntimeContext
from ._entry import (
    check_entry,
    diff_arguments,
    encode_arguments,
    encode_value,
    entry_ref,
    return_adapter,
    revive_value,
)
from ._errors import (
    AgencyCancelledError,
    AgencyError,
    InvalidArgumentError,
    ResultSerializationError,
    RunConflictError,
)
from ._frame import Frame, call_in_frame
from ._money import pico_to_usd
from ._results import ErrorInfo, RunResult, RunStatus
from ._store import RunRecord, Store, resolve_store
from ._threads import ThreadStore

__all__ = ["run", "run_sync"]

logger = logging.getLogger("agency_runtime.run")

LEASE_SECONDS = 30.0
"""How long a claim on a run lasts without renewal; the holder renews every third of it."""

_WAIT_MIN, _WAIT_MAX = 0.005, 0.25
_MAX_RUN_ID = 512


def _check_run_id(run_id: object) -> str:
    if run_id is None:
        return uuid.uuid4().hex
    if not isinstance(run_id, str) or not run_id.strip():
        raise InvalidArgumentError(f"run_id must be a non-empty string, got {run_id!r}")
    if len(run_id) > _MAX_RUN_ID or any(ord(c) < 32 for c in run_id):
        raise InvalidArgumentError(
            f"run_id must be at most {_MAX_RUN_ID} printable characters, got {run_id!r:.80}"
        )
    return run_id


def _check_same_inputs(stored: RunRecord, ref: str, arguments: str) -> None:
    differences: list[str] = []
    if stored.entry != ref:
        differences.append(f"entry: stored {stored.entry!r}, given {ref!r}")
    if stored.arguments != arguments:
        differences.extend(diff_arguments(stored.arguments, arguments))
    if differences:
        raise RunConflictError(stored.run_id, differences)


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def _result_from_record(record: RunRecord, entry: Callable[..., Any]) -> RunResult:
    """The stored outcome of a run, its value revived into the entry's return type."""
    duration = None
    if record.started_at is not None and record.finished_at is not None:
        duration = max(0.0, record.finished_at - record.started_at)
    return RunResult(
        run_id=record.run_id,
        status=record.status,
        value=revive_value(record.value, return_adapter(entry)),
        interrupts=record.interrupts,
        cost=pico_to_usd(record.cost_pico),
        tokens=record.tokens,
        error=record.error,
        created_at=_when(record.created_at),
        started_at=_when(record.started_at),
        finished_at=_when(record.finished_at),
        duration=duration,
        replayed=True,
    )


async def run(
    entry: Callable[..., Any],
    *args: Any,
    run_id: str | None = None,
    store: str | Store | None = None,
    model: str | None = None,
    **kwargs: Any,
) -> RunResult:
    """Run ``entry(*args, **kwargs)`` as a durable run and return its :class:`RunResult`.

    ``run_id``, ``store`` and ``model`` are run options; every other argument goes to
    ``entry`` (sync or async) and must be JSON data or pydantic models, since it is stored.
    ``store`` is a URL or a :class:`Store` (default: ``AGENCY_STORE``, else
    ``sqlite:///./.agency/agency.db``). ``model`` is the default for ``agency.llm``
    (else ``AGENCY_MODEL``).

    With the ``run_id`` of a completed or cancelled run, the stored result is returned and
    nothing executes; a paused or failed run continues; reusing an id with a different entry
    or different arguments raises :class:`RunConflictError` saying what differs.
    """
    check_entry(entry)
    run_id = _check_run_id(run_id)
    store_ = resolve_store(store)
    ref = entry_ref(entry)
    arguments = encode_arguments(args, kwargs)
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise InvalidArgumentError(
            f"model must be a non-empty string like 'openai/gpt-4o-mini', got {model!r}"
        )

    stored = await store_.get_run(run_id)
    if stored is not None:
        _check_same_inputs(stored, ref, arguments)
        if stored.is_final:
            return _result_from_record(stored, entry)
        model = model or stored.model

    record = RunRecord(
        run_id=run_id,
        status="running",
        entry=ref,
        arguments=arguments,
        model=model or os.environ.get("AGENCY_MODEL") or None,
    )
    owner = f"{os.getpid()}:{uuid.uuid4().hex[:12]}"
    delay = _WAIT_MIN
    while True:
        claim = await store_.claim_run(record, owner=owner, lease_seconds=LEASE_SECONDS)
        if claim.acquired:
            break
        _check_same_inputs(claim.record, ref, arguments)
        if claim.record.is_final:
            return _result_from_record(claim.record, entry)
        finished = await _wait_for_holder(store_, run_id, delay)
        if finished is not None:
            return _result_from_record(finished, entry)
        delay = min(delay * 2, _WAIT_MAX)
    return await _execute(store_, claim.record, owner, entry, args, kwargs)


async def _wait_for_holder(store: Store, run_id: str, delay: float) -> RunRecord | None:
    """Wait while another caller executes ``run_id``.

    Returns the run once its holder stored an outcome; ``None`` when the holder's lease
    expired (it died), so the caller should claim the run itself.
    """
    while True:
        await anyio.sleep(delay)
        current = await store.get_run(run_id)
        if current is None:
            return None
        if current.status != "running":
            return current
        if not current.lease_alive(time.time()):
            return None
        delay = min(delay * 2, _WAIT_MAX)


async def _renew_lease(store: Store, run_id: str, owner: str) -> None:
    while True:
        await anyio.sleep(LEASE_SECONDS / 3)
        if not await store.renew_lease(run_id, owner=owner, lease_seconds=LEASE_SECONDS):
            logger.warning(
                "run %r: lost its lease (another process took the run over); "
                "its outcome here will not be stored",
                run_id,
            )
            return


async def _execute(
    store: Store,
    record: RunRecord,
    owner: str,
    entry: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> RunResult:
    ctx = RuntimeContext(record.run_id, model=record.model)
    frame = Frame(ctx, BranchState.for_context(ctx), ThreadStore.with_default_active())
    status: RunStatus
    value: Any = None
    value_json: str | None = None
    error: BaseException | None = None
    started = record.started_at or time.time()
    async with anyio.create_task_group() as renewals:
        renewals.start_soon(_renew_lease, store, record.run_id, owner)
        try:
            with anyio.CancelScope() as scope:
                unsubscribe = ctx.abort_signal.add_callback(lambda _reason: scope.cancel())
                try:
                    value = await call_in_frame(frame, lambda: entry(*args, **kwargs))
                finally:
                    unsubscribe()
            if scope.cancelled_caught:
                status, error = "cancelled", ctx.abort_signal.reason
            else:
                status = "completed"
                value_json = encode_value(
                    value, what=f"the value returned by run {record.run_id!r}"
                )
                value = revive_value(value_json, return_adapter(entry))
        except AgencyCancelledError as exc:
            status, error = "cancelled", exc
        except ResultSerializationError as exc:
            status, error, value = "failed", exc, None
        except Exception as exc:
            status, error = "failed", exc
            logger.debug("run %r failed", record.run_id, exc_info=True)
        finally:
            renewals.cancel_scope.cancel()
    finished = time.time()
    outcome = record.model_copy(
        update={
            "status": status,
            "value": value_json,
            "error": None if error is None else ErrorInfo.from_exception(error),
            "cost_pico": record.cost_pico + ctx.cost_pico,
            "tokens": record.tokens + ctx.tokens,
            "finished_at": finished,
        }
    )
    with anyio.CancelScope(shield=True):
        stored = await store.finish_run(outcome, owner=owner)
    if not stored:
        logger.warning(
            "run %r finished with status %r, but another process holds its lease now; "
            "the store keeps that process's outcome",
            record.run_id,
            status,
        )
    return RunResult(
        run_id=record.run_id,
        status=status,
        value=value,
        cost=pico_to_usd(outcome.cost_pico),
        tokens=outcome.tokens,
        error=outcome.error,
        created_at=_when(record.created_at),
        started_at=_when(started),
        finished_at=_when(finished),
        duration=finished - started,
        exception=error,
    )


def run_sync(entry: Callable[..., Any], *args: Any, **kwargs: Any) -> RunResult:
    """:func:`run` for scripts: starts an event loop, runs, and returns the result.

    Takes the same arguments as :func:`run`. It cannot be called from inside a running event
    loop; there, ``await agency.run(...)``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise AgencyError(
            "agency.run_sync() was called from inside a running event loop; "
            "use `await agency.run(...)` there instead"
        )
    return anyio.run(functools.partial(run, entry, *args, **kwargs))
