"""Continuing runs from the store: ``agency.resume`` and ``agency.respond_to_interrupts``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, to_json

from .._durable._values import decode_arguments
from .._errors import (
    EntryImportError,
    InterruptAnswerError,
    InvalidArgumentError,
    RunNotFoundError,
)
from .._interrupts import HandlerDecision
from .._store import RunRecord, Store
from .._types import Interrupt, InterruptResponse, RunResult, bind_store, store_of
from ._run import drive, stored_result
from ._runtime import RUNTIME

__all__ = ["get_record", "respond_to_interrupts", "resume"]


async def get_record(store: Store, run_id: str) -> RunRecord:
    if not isinstance(run_id, str) or not run_id:
        raise InvalidArgumentError(f"run_id must be a non-empty string, got {run_id!r}")
    record = await store.get_run(run_id)
    if record is None:
        raise RunNotFoundError(run_id, store.url)
    return bind_store(record, store)


async def _continue(store: Store, record: RunRecord) -> RunResult:
    """Run ``record`` again from its journal with its stored entry and arguments.

    The entry must be one the application declared or this process ran
    (:meth:`~agency_runtime._durable._entries.EntryRegistry.find`); else
    :class:`EntryNotAllowedError` is raised and nothing runs.
    """
    entry = RUNTIME.entries.find(record.run_id, record.entry)
    try:
        args, kwargs = decode_arguments(entry, record.arguments)
    except ValidationError as exc:
        raise EntryImportError(
            f"the stored arguments of run {record.run_id!r} no longer validate against "
            f"{record.entry}: {exc}"
        ) from exc
    template = record.model_copy(update={"status": "running"})
    return await drive(store, template, entry, args, kwargs)


async def resume(run_id: str, *, store: str | Store | None = None) -> RunResult[Any]:
    """Continue run ``run_id`` from its journal (after a crash, a failure or a pause).

    The store is data, never code: the entry is the one this process ran it with, else a
    declared entry (``@agency.entry`` / ``agency.register_entry``) found by its recorded name
    or ``module:qualname`` (or script path), imported only from the application's modules;
    anything else raises :class:`EntryNotAllowedError` and nothing runs. A completed or
    cancelled run returns its stored result and imports nothing (its value is revived into
    the entry's return type only when this process knows the entry already).
    """
    store_ = RUNTIME.stores.resolve(store)
    record = await get_record(store_, run_id)
    if record.is_final:
        return stored_result(record)
    return await _continue(store_, record)


def _as_response(value: object, key: str) -> InterruptResponse:
    response = _parse_response(value, key)
    try:
        to_json(response.value)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InterruptAnswerError(
            f"respond_to_interrupts: the value of the answer for {key} is a "
            f"{type(response.value).__name__}, which cannot be stored as JSON ({exc})"
        ) from exc
    return response


def _parse_response(value: object, key: str) -> InterruptResponse:
    if isinstance(value, InterruptResponse):
        return value
    if isinstance(value, HandlerDecision) and value.type in ("approve", "reject"):
        return InterruptResponse(type=value.type, value=value.value)
    if isinstance(value, dict):
        try:
            return InterruptResponse.model_validate(value)
        except ValidationError:
            pass
    shown = value.type if isinstance(value, HandlerDecision) else type(value).__name__
    raise InterruptAnswerError(
        f"respond_to_interrupts: the answer for {key} is {shown!r}; answers must be "
        "approve(value) or reject(value)"
    )


async def respond_to_interrupts(
    target: RunResult[Any] | RunRecord | str | Sequence[Interrupt | Mapping[str, Any]],
    responses: Sequence[InterruptResponse] | Mapping[str, InterruptResponse],
    *,
    store: str | Store | None = None,
    enqueue: bool = False,
) -> RunResult[Any]:
    """Answer a paused run's interrupts, then continue the run and return its result.

    With ``enqueue=True`` the answers are stored and, in the same transaction, the run is
    handed to a worker of its queue (``"default"`` for a run started with ``agency.run``)
    instead of continuing in this process: the result returned is the run as queued, and
    ``agency.runs.wait(run_id)`` waits for its outcome.

    ``target`` names the paused run: its :class:`RunResult`, its :class:`RunRecord`
    (``agency.runs.get(...)``), its run id, or the list of its interrupts. ``responses`` is
    a list aligned with the run's pending interrupts or a dict keyed by ``interrupt_id``;
    every answer is ``approve(value)`` or ``reject(value)``. Answers are stored before
    anything runs again, and the call that asked each question gets its answer when the
    run reaches it. Without ``store``, a result, record or interrupts this process read are
    answered on the store they came from (a run id: on ``AGENCY_STORE``, else the default
    store). A second process answers in one line::

        await agency.respond_to_interrupts("order-7", [approve()], store="sqlite:///a.db")
    """
    store_ = RUNTIME.stores.resolve(store if store is not None else store_of(target))
    asked = await _asked(target, store_)
    keys = [i.interrupt_id for i in asked]
    if len(set(keys)) != len(keys):
        raise InterruptAnswerError(f"respond_to_interrupts: interrupt ids repeat in {keys}")
    run_ids = {i.run_id for i in asked}
    if len(run_ids) != 1 or None in run_ids:
        raise InterruptAnswerError(
            "respond_to_interrupts: the interrupts must all come from one run, "
            f"got run ids {sorted(str(r) for r in run_ids)}"
        )
    if isinstance(responses, Mapping):
        unknown = sorted(set(responses) - set(keys))
        missing = [k for k in keys if k not in responses]
        if unknown or missing:
            raise InterruptAnswerError(
                f"respond_to_interrupts: answers must match the interrupts one to one "
                f"(unknown ids: {unknown}, unanswered: {missing})"
            )
        answers = {k: _as_response(responses[k], k) for k in keys}
    elif isinstance(responses, Sequence) and not isinstance(responses, str):
        if len(responses) != len(keys):
            raise InterruptAnswerError(
                f"respond_to_interrupts: {len(keys)} interrupt(s) but {len(responses)} answer(s)"
            )
        answers = {k: _as_response(r, k) for k, r in zip(keys, responses, strict=True)}
    else:
        raise InterruptAnswerError(
            "respond_to_interrupts: responses must be a list aligned with the interrupts "
            "or a dict keyed by interrupt_id"
        )
    run_id = str(asked[0].run_id)
    record = await get_record(store_, run_id)
    if record.status != "paused":
        raise InterruptAnswerError(
            f"respond_to_interrupts: run {run_id!r} is {record.status}, not paused, so it has "
            "no interrupts to answer"
        )
    if not enqueue:  # an undeclared entry: refused before anything is stored
        RUNTIME.entries.find(record.run_id, record.entry)
    refused = await store_.answer_interrupts(run_id, answers, enqueue=enqueue)
    if not refused:
        RUNTIME.journals.answered(store_, run_id, record.version, answers)
    if refused:
        pending = [i.interrupt_id for i in record.interrupts]
        raise InterruptAnswerError(
            f"respond_to_interrupts: interrupt(s) {refused} of run {run_id!r} are not pending "
            f"(unknown, or answered already); pending: {pending}. Nothing was stored."
        )
    if enqueue:
        return stored_result(await get_record(store_, run_id))
    return await _continue(store_, record)


async def _asked(
    target: RunResult | RunRecord | str | Sequence[Interrupt | Mapping[str, Any]], store: Store
) -> list[Interrupt]:
    """The interrupts ``target`` points at (read from the store for a run id or record)."""
    if isinstance(target, str | RunRecord):
        run_id = target if isinstance(target, str) else target.run_id
        record = await get_record(store, run_id)
        if record.status != "paused" or not record.interrupts:
            raise InterruptAnswerError(
                f"respond_to_interrupts: run {run_id!r} is {record.status}, not paused on "
                "interrupts, so there is nothing to answer"
            )
        return list(record.interrupts)
    interrupts: Any = target.interrupts if isinstance(target, RunResult) else target
    if isinstance(target, RunResult) and target.status != "paused":
        raise InterruptAnswerError(
            f"respond_to_interrupts: run {target.run_id!r} is {target.status}, not paused, so "
            "it has no interrupts to answer"
        )
    if not isinstance(interrupts, Sequence) or isinstance(interrupts, str) or not interrupts:
        raise InterruptAnswerError(
            "respond_to_interrupts: give the paused run (its RunResult, RunRecord or run id) "
            "or its interrupts"
        )
    try:
        return [i if isinstance(i, Interrupt) else Interrupt.model_validate(i) for i in interrupts]
    except ValidationError as exc:
        raise InterruptAnswerError(
            f"respond_to_interrupts: the interrupts given are not interrupts of a run: {exc}"
        ) from exc
