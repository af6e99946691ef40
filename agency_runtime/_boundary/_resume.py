"""Continuing runs from the store: ``agency.resume`` and ``agency.respond_to_interrupts``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import aclosing
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


async def _continue(
    store: Store, record: RunRecord, entry: Callable[..., Any] | None = None
) -> RunResult:
    """Run ``record`` again from its journal with its stored entry and arguments.

    The entry must be one the application declared or this process ran
    (:meth:`~agency_runtime._durable._entries.EntryRegistry.find`); else
    :class:`EntryNotAllowedError` is raised and nothing runs. ``entry``: the one the
    caller found for ``record`` already.
    """
    if entry is None:
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
    run reaches it. A parent paused on its child runs' questions (their ``run_id`` is the
    child's) is answered the same way: each answer is stored in the run that asked, then the
    parent continues (and continues the child at its call). Answering a child directly
    continues it, then its paused parents; the result is the run ``target`` names.
    Without ``store``, a result, record or interrupts this process read are
    answered on the store they came from (a run id: on ``AGENCY_STORE``, else the default
    store). A second process answers in one line::

        await agency.respond_to_interrupts("order-7", [approve()], store="sqlite:///a.db")
    """
    store_ = RUNTIME.stores.resolve(store if store is not None else store_of(target))
    asked = await _asked(target, store_)
    keys = [i.interrupt_id for i in asked]
    if len(set(keys)) != len(keys):
        raise InterruptAnswerError(f"respond_to_interrupts: interrupt ids repeat in {keys}")
    if None in {i.run_id for i in asked}:
        raise InterruptAnswerError(
            "respond_to_interrupts: every interrupt must name the run that asked it"
        )
    answers = _answers(keys, responses)
    top_id = _named_run(target, asked)
    top = await get_record(store_, top_id)
    if top.status != "paused":
        raise InterruptAnswerError(
            f"respond_to_interrupts: run {top_id!r} is {top.status}, not paused, so it has "
            "no interrupts to answer"
        )
    asking = await _asking_runs(store_, top, asked)
    entry = None
    if not enqueue:  # an undeclared entry: refused before anything is stored
        entry = RUNTIME.entries.find(top.run_id, top.entry)
    for run_id, record in asking.items():
        mine = {i.interrupt_id: answers[i.interrupt_id] for i in asked if i.run_id == run_id}
        # A child that runs on workers (queue=) goes back to them with its answers.
        queued_child = record.parent_id is not None and record.queue is not None
        refused = await store_.answer_interrupts(
            run_id, mine, enqueue=(enqueue and run_id == top_id) or queued_child
        )
        if refused:
            pending = [i.interrupt_id for i in record.interrupts]
            raise InterruptAnswerError(
                f"respond_to_interrupts: interrupt(s) {refused} of run {run_id!r} are not "
                f"pending (unknown, or answered already); pending: {pending}. Nothing of "
                f"run {run_id!r} was stored."
            )
        RUNTIME.journals.answered(store_, run_id, record.version, mine)
    if enqueue:
        if top_id not in asking:  # only its children asked: hand the parent itself over
            await store_.answer_interrupts(top_id, {}, enqueue=True)
        return stored_result(await get_record(store_, top_id))
    result = await _continue(store_, top, entry)
    await _continue_parents(store_, top)
    return result


def _answers(
    keys: list[str], responses: Sequence[InterruptResponse] | Mapping[str, InterruptResponse]
) -> dict[str, InterruptResponse]:
    """The answers by interrupt id: a dict matching ``keys`` one to one, or a list aligned."""
    if isinstance(responses, Mapping):
        unknown = sorted(set(responses) - set(keys))
        missing = [k for k in keys if k not in responses]
        if unknown or missing:
            raise InterruptAnswerError(
                f"respond_to_interrupts: answers must match the interrupts one to one "
                f"(unknown ids: {unknown}, unanswered: {missing})"
            )
        return {k: _as_response(responses[k], k) for k in keys}
    if isinstance(responses, Sequence) and not isinstance(responses, str):
        if len(responses) != len(keys):
            raise InterruptAnswerError(
                f"respond_to_interrupts: {len(keys)} interrupt(s) but {len(responses)} answer(s)"
            )
        return {k: _as_response(r, k) for k, r in zip(keys, responses, strict=True)}
    raise InterruptAnswerError(
        "respond_to_interrupts: responses must be a list aligned with the interrupts "
        "or a dict keyed by interrupt_id"
    )


def _named_run(
    target: RunResult | RunRecord | str | Sequence[Interrupt | Mapping[str, Any]],
    asked: list[Interrupt],
) -> str:
    """The run ``target`` names: the result's, the record's, the id; for bare interrupts, the
    one run that asked them all."""
    if isinstance(target, str):
        return target
    if isinstance(target, RunResult | RunRecord):
        return target.run_id
    run_ids = {str(i.run_id) for i in asked}
    if len(run_ids) != 1:
        raise InterruptAnswerError(
            "respond_to_interrupts: the interrupts must all come from one run, "
            f"got run ids {sorted(run_ids)}; give the paused parent run instead"
        )
    return run_ids.pop()


async def _asking_runs(
    store: Store, top: RunRecord, asked: list[Interrupt]
) -> dict[str, RunRecord]:
    """The paused runs that asked ``asked``: ``top`` itself or its descendants (a child's
    interrupts bubble up to its parent), each checked."""
    runs: dict[str, RunRecord] = {}
    for run_id in dict.fromkeys(str(i.run_id) for i in asked):
        record = top if run_id == top.run_id else await get_record(store, run_id)
        if record.status != "paused":
            raise InterruptAnswerError(
                f"respond_to_interrupts: run {run_id!r} is {record.status}, not paused, so "
                "it has no interrupts to answer"
            )
        if record is not top and not await _descends_from(store, record, top.run_id):
            raise InterruptAnswerError(
                f"respond_to_interrupts: interrupt(s) of run {run_id!r} are not run "
                f"{top.run_id!r}'s, nor one of its child runs'"
            )
        runs[run_id] = record
    return runs


_MAX_DEPTH_WALKED = 1000
"""How many parents :func:`_parents` walks at most (a damaged store may hold a cycle)."""


async def _parents(store: Store, record: RunRecord) -> AsyncGenerator[RunRecord, None]:
    """``record``'s parent, its parent's, and so on up to the top-level run."""
    parent_id = record.parent_id
    for _ in range(_MAX_DEPTH_WALKED):
        if parent_id is None:
            return
        parent = await store.get_run(parent_id)
        if parent is None:
            return
        yield parent
        parent_id = parent.parent_id


async def _descends_from(store: Store, record: RunRecord, ancestor: str) -> bool:
    """Whether ``ancestor`` is ``record``'s parent, or its parent's, and so on."""
    async with aclosing(_parents(store, record)) as parents:
        async for parent in parents:
            if parent.run_id == ancestor:
                return True
    return False


async def _continue_parents(store: Store, record: RunRecord) -> None:
    """Continue the paused runs above ``record`` (a child answered directly): each waits
    for it at its call, which now returns the child's outcome (or pauses again on it)."""
    if record.parent_id is None:
        return  # a top-level run
    async with aclosing(_parents(store, record)) as parents:
        async for parent in parents:
            if parent.status != "paused":
                return
            await _continue(store, parent)


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
