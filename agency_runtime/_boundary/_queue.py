"""Queued runs: ``agency.enqueue``, ``agency.runs.wait`` and ``agency.queues``.

``enqueue`` stores a run as ``queued`` and returns once it is durable; a worker
(:class:`~agency_runtime.Worker`, ``agency worker``) of its queue claims and runs it.
``runs.wait`` returns a run's result once it is completed, failed, cancelled or paused,
woken by the store (PostgreSQL's NOTIFY, or this process) and polling otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import anyio

from .._bounds import check_seconds
from .._core._jsondata import check_name
from .._durable._entries import location_ref
from .._durable._values import check_entry, encode_arguments
from .._errors import EntryNotAllowedError, InvalidArgumentError, RunWaitTimeoutError
from .._llm._model import Model
from .._store import RunRecord, Store
from .._types import RunResult
from ._resume import get_record
from ._run import check_model, check_run_id, check_same_inputs, stored_result
from ._runtime import RUNTIME

__all__ = ["QueuesNamespace", "check_queue", "check_worker_entry", "enqueue", "wait"]

WAIT_POLL_SECONDS = 0.5
"""How often ``runs.wait`` looks at the store when no wake-up comes (other processes on a
store without notifications)."""

_MAX_QUEUE = 200


def check_queue(queue: object) -> str:
    """``queue`` when it is a usable queue name; else an :class:`InvalidArgumentError`."""
    return check_name(queue, "a queue name", "emails", limit=_MAX_QUEUE)


def check_worker_entry(entry: Callable[..., Any], member: str) -> str:
    """The reference a worker finds ``entry`` by (``agency.{member}``); raises
    :class:`EntryNotAllowedError` unless ``entry`` is declared and importable by that name.

    A worker, maybe in another process, runs only declared entries it can import by name, so
    a run it could never run (handed back from worker to worker forever) is refused here,
    before it is stored: a lambda, a function defined inside another one (unless it was
    declared with a name), or a function not declared with ``@agency.entry``.
    """
    ref = RUNTIME.entries.entry_ref(entry)
    if ":" in ref and ("<locals>" in ref or "<lambda>" in ref):
        raise EntryNotAllowedError(
            f"agency.{member}: the entry {ref!r} is a lambda or a function defined inside "
            "another function, so no worker can import it by name; define it at module level "
            "and declare it with @agency.entry (or give it a name: "
            "@agency.entry(name='...') in a module the workers import)"
        )
    if not RUNTIME.entries.is_entry(entry):
        raise EntryNotAllowedError(
            f"agency.{member}: {ref!r} is not a declared entry, and workers run only declared "
            "entries (the store is data, never code); decorate it with @agency.entry (or call "
            "agency.register_entry(fn)) in a module the workers import "
            "(`agency worker --import MODULE`)"
        )
    return ref


async def enqueue(
    entry: Callable[..., Any],
    *args: Any,
    run_id: str | None = None,
    queue: str = "default",
    priority: int = 0,
    store: str | Store | None = None,
    model: str | Model | None = None,
    **kwargs: Any,
) -> str:
    """Queue ``entry(*args, **kwargs)`` as a durable run for a worker; return its run id.

    Returns once the run is stored (``queued``); a :class:`~agency_runtime.Worker` serving
    ``queue`` claims it, higher ``priority`` first, then the oldest. Arguments must be JSON
    data or pydantic models, as for :func:`agency.run`. A worker in another process runs only
    entries the application declares (``@agency.entry``) and imports (``--import MODULE``).

    ``model`` is the run's default model, as for :func:`agency.run`: the run records its
    name, and the worker that runs it uses the model registered under that name in its
    process (a ``Model`` given here is registered in this one), else the name as a plain
    model string.

    ``run_id`` is an idempotency key: enqueuing an id that exists returns it without queuing
    again (the entry and arguments must match, else :class:`RunConflictError`). An entry
    no worker could run — not declared, a lambda, a nested function — raises
    :class:`EntryNotAllowedError` and nothing is stored.
    """
    check_entry(entry)
    run_id = check_run_id(run_id)
    queue = check_queue(queue)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 2**63:
        raise InvalidArgumentError(f"priority must be a whole number, got {priority!r}")
    model = check_model(model)
    ref = check_worker_entry(entry, "enqueue")
    store_ = RUNTIME.stores.resolve(store)
    arguments = encode_arguments(args, kwargs)
    now = RUNTIME.clock.time()
    record = RunRecord(
        run_id=run_id,
        status="queued",
        entry=ref,
        arguments=arguments,
        model=model or os.environ.get("AGENCY_MODEL") or None,
        queue=queue,
        priority=priority,
        created_at=now,
        updated_at=now,
    )
    RUNTIME.entries.remember(run_id, entry)
    claim = await store_.enqueue_run(record)
    if not claim.created:
        check_same_inputs(claim.record, ref, arguments, location_ref(entry))
    return run_id


async def wait(
    run_id: str, *, store: str | Store | None = None, timeout: float | None = None
) -> RunResult:
    """Wait for run ``run_id`` to be completed, failed, cancelled or paused; its result.

    A run that is ``waiting`` (parked in a sleep or a wait for an event) is waited through.
    Raises :class:`RunNotFoundError` for an unknown id and :class:`RunWaitTimeoutError`
    when ``timeout`` seconds pass first (the run goes on).
    """
    if timeout is not None:
        timeout = check_seconds(timeout, "agency.runs.wait: timeout (None: no limit)")
    store_ = RUNTIME.stores.resolve(store)
    deadline = None if timeout is None else anyio.current_time() + timeout
    while True:
        record = await get_record(store_, run_id)
        if record.status not in ("queued", "running", "waiting"):
            return stored_result(record)
        pause = WAIT_POLL_SECONDS
        if deadline is not None:
            left = deadline - anyio.current_time()
            if left <= 0:
                raise RunWaitTimeoutError(run_id, record.status, timeout or 0.0)
            pause = min(pause, left)
        await store_.wait_for_runs(pause)


class QueuesNamespace:
    """``agency.queues``: limits that hold across every worker of a store."""

    async def configure(
        self, name: str, *, concurrency: int | None = None, store: str | Store | None = None
    ) -> None:
        """Let at most ``concurrency`` runs of queue ``name`` run at once, across all workers
        of the store (``None``: no limit)."""
        name = check_queue(name)
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise InvalidArgumentError(
                f"concurrency must be None (no limit) or a whole number >= 1, got {concurrency!r}"
            )
        await RUNTIME.stores.resolve(store).configure_queue(name, concurrency=concurrency)

    async def concurrency(self, name: str, *, store: str | Store | None = None) -> int | None:
        """The limit of queue ``name`` (``None``: no limit)."""
        return await RUNTIME.stores.resolve(store).queue_concurrency(check_queue(name))
