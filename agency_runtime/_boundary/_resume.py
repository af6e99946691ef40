"""Continuing runs: ``resume``, ``respond_to_interrupts`` and the ``agency.runs`` admin view."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError, to_json

from .._durable._entries import (
    decode_arguments,
    find_entry,
    known_entry,
    remember_entry,
    remembered_entry,
)
from .._durable._journal import paused_journals
from .._errors import (
    EntryImportError,
    InterruptAnswerError,
    InvalidArgumentError,
    RunNotFoundError,
)
from .._interrupts import HandlerDecision
from .._store import RunRecord, Store, resolve_store
from .._types import Interrupt, InterruptResponse, JournalEntry, RunResult, RunStatus
from ._run import _result_from_record, drive

__all__ = ["MAX_LIST_LIMIT", "RunsNamespace", "respond_to_interrupts", "resume"]

MAX_LIST_LIMIT = 10_000
"""The most runs one ``agency.runs.list`` call returns; page with ``offset`` for more."""
_MAX_OFFSET = 2**63 - 1  # SQLite's largest integer


async def _get(store: Store, run_id: str) -> RunRecord:
    if not isinstance(run_id, str) or not run_id:
        raise InvalidArgumentError(f"run_id must be a non-empty string, got {run_id!r}")
    record = await store.get_run(run_id)
    if record is None:
        raise RunNotFoundError(run_id, store.url)
    return record


async def _continue(store: Store, record: RunRecord) -> RunResult:
    """Run ``record`` again from its journal with its stored entry and arguments.

    The entry must be one the application declared or this process ran
    (:func:`~agency_runtime._durable._entries.find_entry`); else
    :class:`EntryNotAllowedError` is raised and nothing runs.
    """
    entry = find_entry(record.run_id, record.entry)
    try:
        args, kwargs = decode_arguments(entry, record.arguments)
    except ValidationError as exc:
        raise EntryImportError(
            f"the stored arguments of run {record.run_id!r} no longer validate against "
            f"{record.entry}: {exc}"
        ) from exc
    template = record.model_copy(update={"status": "running"})
    return await drive(store, template, entry, args, kwargs)


async def resume(run_id: str, *, store: str | Store | None = None) -> RunResult:
    """Continue run ``run_id`` from its journal (after a crash, a failure or a pause).

    The store is data, never code: the entry is the one this process ran it with, else a
    declared entry (``@agency.entry`` / ``agency.register_entry``) found by its recorded name
    or ``module:qualname`` (or script path), imported only from the application's modules;
    anything else raises :class:`EntryNotAllowedError` and nothing runs. A completed or
    cancelled run returns its stored result and imports nothing (its value is revived into
    the entry's return type only when this process knows the entry already).
    """
    store_ = resolve_store(store)
    record = await _get(store_, run_id)
    if record.is_final:
        entry: Any = known_entry(record.run_id, record.entry)
        return _result_from_record(record, entry)
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
    target: RunResult | RunRecord | str | Sequence[Interrupt | Mapping[str, Any]],
    responses: Sequence[InterruptResponse] | Mapping[str, InterruptResponse],
    *,
    store: str | Store | None = None,
) -> RunResult:
    """Answer a paused run's interrupts, then continue the run and return its result.

    ``target`` names the paused run: its :class:`RunResult`, its :class:`RunRecord`
    (``agency.runs.get(...)``), its run id, or the list of its interrupts. ``responses`` is
    a list aligned with the run's pending interrupts or a dict keyed by ``interrupt_id``;
    every answer is ``approve(value)`` or ``reject(value)``. Answers are stored before
    anything runs again, and the call that asked each question gets its answer when the
    run reaches it. A second process answers in one line::

        await agency.respond_to_interrupts("order-7", [approve()], store="sqlite:///a.db")
    """
    store_ = resolve_store(store)
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
    record = await _get(store_, run_id)
    if record.status != "paused":
        raise InterruptAnswerError(
            f"respond_to_interrupts: run {run_id!r} is {record.status}, not paused, so it has "
            "no interrupts to answer"
        )
    find_entry(record.run_id, record.entry)  # refused entries are refused before any answer
    refused = await store_.answer_interrupts(run_id, answers)
    if not refused:
        paused_journals.answered(store_, run_id, record.version, answers)
    if refused:
        pending = [i.interrupt_id for i in record.interrupts]
        raise InterruptAnswerError(
            f"respond_to_interrupts: interrupt(s) {refused} of run {run_id!r} are not pending "
            f"(unknown, or answered already); pending: {pending}. Nothing was stored."
        )
    return await _continue(store_, record)


async def _asked(
    target: RunResult | RunRecord | str | Sequence[Interrupt | Mapping[str, Any]], store: Store
) -> list[Interrupt]:
    """The interrupts ``target`` points at (read from the store for a run id or record)."""
    if isinstance(target, str | RunRecord):
        run_id = target if isinstance(target, str) else target.run_id
        record = await _get(store, run_id)
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


class RunsNamespace:
    """``agency.runs``: an admin view of the runs in a store."""

    async def list(
        self,
        *,
        store: str | Store | None = None,
        status: RunStatus | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> builtins.list[RunRecord]:
        """Up to ``limit`` runs, newest first, after the first ``offset`` (a page).

        Optionally only those with ``status``. ``limit`` is 1 to ``MAX_LIST_LIMIT``
        (10 000); ``offset`` is 0 or more. The order is stable, so consecutive pages
        (``offset=0, 100, 200, ...``) do not overlap while no run is added.
        """
        if status is not None and status not in get_args(RunStatus):
            raise InvalidArgumentError(
                f"status must be one of {', '.join(get_args(RunStatus))}, got {status!r}"
            )
        for what, value, low, high in (
            ("limit", limit, 1, MAX_LIST_LIMIT),
            ("offset", offset, 0, _MAX_OFFSET),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                raise InvalidArgumentError(
                    f"{what} must be a whole number from {low} to {high}, got {shown}"
                )
        return await resolve_store(store).list_runs(status=status, limit=limit, offset=offset)

    async def get(self, run_id: str, *, store: str | Store | None = None) -> RunRecord:
        """The stored run ``run_id``; raises :class:`RunNotFoundError` if there is none."""
        return await _get(resolve_store(store), run_id)

    async def journal(
        self, run_id: str, *, store: str | Store | None = None
    ) -> builtins.list[JournalEntry]:
        """The completed steps of ``run_id``, in the order they were committed."""
        store_ = resolve_store(store)
        await _get(store_, run_id)
        return (await store_.load_journal(run_id)).entries

    async def cancel(self, run_id: str, *, store: str | Store | None = None) -> RunRecord:
        """Cancel ``run_id`` (final). A process running it stops at its next step."""
        store_ = resolve_store(store)
        record = await store_.cancel_run(run_id)
        if record is None:
            raise RunNotFoundError(run_id, store_.url)
        return record

    async def fork(
        self,
        run_id: str,
        step_path: str,
        *,
        new_run_id: str | None = None,
        store: str | Store | None = None,
    ) -> str:
        """Copy ``run_id`` with its journal up to and including ``step_path``; return the new id.

        The fork is paused: continue it with ``agency.resume(new_id)``; the steps after
        ``step_path`` run again there.
        """
        store_ = resolve_store(store)
        await _get(store_, run_id)
        entries = (await store_.load_journal(run_id)).entries
        match = next((e for e in entries if e.path == step_path), None)
        if match is None:
            known = ", ".join(e.path for e in entries[:10]) or "none"
            raise InvalidArgumentError(
                f"run {run_id!r} has no completed step {step_path!r} (steps: {known})"
            )
        new_id = new_run_id or f"{run_id}-fork-{uuid.uuid4().hex[:8]}"
        if await store_.get_run(new_id) is not None:
            raise InvalidArgumentError(f"a run {new_id!r} exists already; pick another new_run_id")
        await store_.fork_run(run_id, new_id, match.seq)
        remembered = remembered_entry(run_id)
        if remembered is not None:
            remember_entry(new_id, remembered)  # a closure's fork resumes in this process too
        return new_id
