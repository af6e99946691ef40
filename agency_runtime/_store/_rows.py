"""Rows ↔ models, shared by the SQL stores (SQLite, PostgreSQL).

Both keep runs, steps, answers and checkpoints in the same columns, holding the same JSON
text; only the SQL around them differs. What a stored row means is written here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ConfigDict, TypeAdapter

from .._errors import StoreError
from .._types import (
    Checkpoint,
    ErrorInfo,
    Interrupt,
    InterruptAnswer,
    InterruptResponse,
    Journal,
    JournalEntry,
    RunRecord,
    Schedule,
)

__all__ = [
    "SCHEDULE_COLUMNS",
    "STEP_COLUMNS",
    "error_json",
    "interrupts_json",
    "journal_from_rows",
    "record_from",
    "run_values",
    "schedule_from",
    "schedule_values",
    "waiting_from",
    "waiting_json",
]

STEP_COLUMNS = (
    "run_id", "path", "seq", "name", "callsite", "result", "locals", "scopes", "deltas",
    "error", "cost_pico", "tokens", "created_at",
)  # fmt: skip
"""A step row's columns, in the order the stores select them."""

SCHEDULE_COLUMNS = (
    "name", "entry", "arguments", "cron", "every", "timezone", "queue", "next_at",
    "created_at", "updated_at",
)  # fmt: skip
"""A schedule row's columns, in the order the stores select them."""

_DEFERRED = ConfigDict(defer_build=True)  # built on first use, not by the import
_INTERRUPTS = TypeAdapter(list[Interrupt], config=_DEFERRED)
_NAMES = TypeAdapter(list[str], config=_DEFERRED)


def error_json(error: ErrorInfo | None) -> str | None:
    """The stored form of the error that ended a run (``None`` for none)."""
    return None if error is None else error.model_dump_json()


def interrupts_json(interrupts: list[Interrupt]) -> str | None:
    """The stored form of a run's pending interrupts (``None`` for none)."""
    return _INTERRUPTS.dump_json(interrupts).decode() if interrupts else None


def waiting_json(names: list[str]) -> str | None:
    """The stored form of the events a waiting run waits for (``None`` for none)."""
    return _NAMES.dump_json(names).decode() if names else None


def waiting_from(run_id: str, text: str | None) -> list[str]:
    """The events a stored ``waiting_for`` names; a damaged one is a StoreError."""
    if text is None:
        return []
    try:
        return _NAMES.validate_json(text)
    except ValueError as exc:
        raise StoreError(f"the stored row of run {run_id!r} is damaged: {exc}") from exc


def run_values(record: RunRecord) -> dict[str, Any]:
    """Every column of ``record``'s run row, by name."""
    values = record.model_dump()
    values["error"] = error_json(record.error)
    values["interrupts"] = interrupts_json(record.interrupts)
    values["waiting_for"] = waiting_json(record.waiting_for)
    return values


def schedule_values(schedule: Schedule) -> tuple[Any, ...]:
    """A schedule's row, in :data:`SCHEDULE_COLUMNS` order."""
    values = schedule.model_dump()
    return tuple(values[column] for column in SCHEDULE_COLUMNS)


def schedule_from(row: Sequence[Any]) -> Schedule:
    """The schedule a row (:data:`SCHEDULE_COLUMNS`) holds; a damaged row is a StoreError."""
    try:
        return Schedule.model_validate(dict(zip(SCHEDULE_COLUMNS, row, strict=True)))
    except ValueError as exc:
        raise StoreError(f"the stored schedule {row[0]!r} is damaged: {exc}") from exc


def record_from(values: Mapping[str, Any]) -> RunRecord:
    """The run a row holds (``values`` by column name); a damaged row is a StoreError."""
    data = dict(values)
    try:
        data["error"] = (
            None if data["error"] is None else ErrorInfo.model_validate_json(data["error"])
        )
        data["interrupts"] = (
            [] if data["interrupts"] is None else _INTERRUPTS.validate_json(data["interrupts"])
        )
        data["waiting_for"] = waiting_from(str(data["run_id"]), data.get("waiting_for"))
        return RunRecord.model_validate(data)
    except ValueError as exc:
        raise StoreError(f"the stored row of run {data['run_id']!r} is damaged: {exc}") from exc


def journal_from_rows(
    run_id: str,
    steps: Iterable[Sequence[Any]],
    answers: Iterable[Sequence[Any]],
    checkpoints: Iterable[Sequence[Any]],
) -> Journal:
    """A run's journal from its rows: steps (:data:`STEP_COLUMNS`), answers (seq, interrupt,
    response, answered_at) and checkpoints (body), each in journal order."""
    try:
        return Journal.model_construct(  # the rows are built (or validated) below
            entries=[
                # zip without strict=: three times faster, and the rows come from a SELECT
                # of exactly these columns
                JournalEntry.from_row(dict(zip(STEP_COLUMNS, row)))  # noqa: B905
                for row in steps
            ],
            answers=[
                InterruptAnswer(
                    run_id=run_id,
                    seq=seq,
                    interrupt=Interrupt.model_validate_json(interrupt),
                    response=None
                    if response is None
                    else InterruptResponse.model_validate_json(response),
                    answered_at=answered_at,
                )
                for seq, interrupt, response, answered_at in answers
            ],
            checkpoints=[Checkpoint.model_validate_json(body) for (body,) in checkpoints],
        )
    except ValueError as exc:
        raise StoreError(f"the journal of run {run_id!r} is damaged: {exc}") from exc
