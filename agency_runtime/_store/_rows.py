"""Rows ↔ models, shared by the SQL stores (SQLite, PostgreSQL).

Both keep runs, steps, answers and checkpoints in the same columns, holding the same JSON
text; only the SQL around them differs. What a stored row means is written here once.

A damaged row (a column that does not hold what the runtime wrote: an unknown status, JSON
that does not parse, a time past any date) damages only itself. A list reads it as a record
marked damaged (:func:`run_from`, :func:`listed_schedule`: ``damaged`` says what is wrong, in
one line); opening it (:func:`record_from`, :func:`schedule_from`) raises :class:`StoreError`
saying the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args

from pydantic import ConfigDict, TypeAdapter, ValidationError

from .._bounds import shown
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
    RunStatus,
    Schedule,
)

__all__ = [
    "SCHEDULE_COLUMNS",
    "STEP_COLUMNS",
    "error_json",
    "interrupts_json",
    "journal_from_rows",
    "listed_schedule",
    "readable_schedules",
    "record_from",
    "run_from",
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
    try:
        return _waiting(text)
    except ValueError as exc:
        raise _damaged_run(run_id, f"waiting_for: {_problem(exc)}") from exc


def _waiting(text: str | None) -> list[str]:
    return [] if text is None else _NAMES.validate_json(text)


def _error(text: str | None) -> ErrorInfo | None:
    return None if text is None else ErrorInfo.model_validate_json(text)


def _interrupts(text: str | None) -> list[Interrupt]:
    return [] if text is None else _INTERRUPTS.validate_json(text)


_STATUSES: tuple[str, ...] = get_args(RunStatus)
_JSON_COLUMNS = (("error", _error), ("interrupts", _interrupts), ("waiting_for", _waiting))
"""The run columns holding JSON the record keeps parsed, and how each is parsed."""
_RUN_PLACEHOLDERS: dict[str, Any] = {"entry": "", "arguments": ""}
"""What a damaged run record holds for a required column it could not read."""
_SCHEDULE_PLACEHOLDERS: dict[str, Any] = {"entry": "", "arguments": "", "next_at": 0.0}


def _problem(exc: ValueError) -> str:
    """What a validation error says, in one line: each bad field, what is wrong, the value."""
    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        value = f" (stored {shown(error['input'], 60)})" if "input" in error else ""
        parts.append(f"{where + ': ' if where else ''}{error['msg']}{value}")
    return "; ".join(parts)


def _bad_fields(exc: ValidationError) -> set[str]:
    """The top-level fields a validation error is about."""
    return {str(error["loc"][0]) for error in exc.errors() if error["loc"]}


def _damaged_run(run_id: object, problem: str) -> StoreError:
    return StoreError(
        f"the stored row of run {shown(run_id, 200)} is damaged: {problem}. Only this run is "
        "affected: repair or delete its row in the store (agency runs list shows the others)"
    )


def run_from(values: Mapping[str, Any]) -> RunRecord:
    """The run a row holds (``values`` by column name); a damaged row is a record with
    ``status="damaged"`` and ``damaged`` saying what is wrong (what a list shows)."""
    data = dict(values)
    problems: list[str] = []
    if data.get("status") not in _STATUSES:  # "damaged" too: it is never stored
        problems.append(
            f"status: {shown(data.get('status'), 60)} is not a run status ({', '.join(_STATUSES)})"
        )
        del data["status"]
    for column, parse in _JSON_COLUMNS:
        try:
            data[column] = parse(data.get(column))
        except ValueError as exc:
            problems.append(f"{column}: {_problem(exc)}")
            del data[column]
    try:
        record = RunRecord.model_validate({"status": "damaged", **data})
    except ValidationError as exc:
        problems.append(_problem(exc))
        for field in _bad_fields(exc):
            data.pop(field, None)
    else:
        if not problems:
            return record
    data = {**_RUN_PLACEHOLDERS, **data, "status": "damaged", "damaged": "; ".join(problems)}
    try:
        return RunRecord.model_validate(data)
    except ValidationError:  # not even what is left reads: only the id and the damage
        return RunRecord(
            run_id=str(values.get("run_id")), status="damaged", damaged=data["damaged"],
            **_RUN_PLACEHOLDERS,
        )  # fmt: skip


def record_from(values: Mapping[str, Any]) -> RunRecord:
    """The run a row holds (``values`` by column name); a damaged row is a StoreError."""
    record = run_from(values)
    if record.damaged is not None:
        raise _damaged_run(values.get("run_id"), record.damaged)
    return record


def run_values(record: RunRecord) -> dict[str, Any]:
    """Every column of ``record``'s run row, by name (a damaged record is never stored)."""
    if record.damaged is not None:
        raise StoreError(f"run {record.run_id!r} was read damaged; it cannot be stored")
    values = record.model_dump()
    values["error"] = error_json(record.error)
    values["interrupts"] = interrupts_json(record.interrupts)
    values["waiting_for"] = waiting_json(record.waiting_for)
    return values


def schedule_values(schedule: Schedule) -> tuple[Any, ...]:
    """A schedule's row, in :data:`SCHEDULE_COLUMNS` order (a damaged one is never stored)."""
    if schedule.damaged is not None:
        raise StoreError(f"schedule {schedule.name!r} was read damaged; it cannot be stored")
    values = schedule.model_dump()
    return tuple(values[column] for column in SCHEDULE_COLUMNS)


def listed_schedule(row: Sequence[Any]) -> Schedule:
    """The schedule a row (:data:`SCHEDULE_COLUMNS`) holds; a damaged row is a schedule with
    ``damaged`` saying what is wrong (what a list shows)."""
    data = dict(zip(SCHEDULE_COLUMNS, row, strict=True))
    try:
        return Schedule.model_validate(data)
    except ValidationError as exc:
        problem = _problem(exc)
        for field in _bad_fields(exc):
            data.pop(field, None)
    data = {**_SCHEDULE_PLACEHOLDERS, **data, "damaged": problem}
    try:
        return Schedule.model_validate(data)
    except ValidationError:
        return Schedule(name=str(row[0]), damaged=problem, **_SCHEDULE_PLACEHOLDERS)


def schedule_from(row: Sequence[Any]) -> Schedule:
    """The schedule a row (:data:`SCHEDULE_COLUMNS`) holds; a damaged row is a StoreError."""
    schedule = listed_schedule(row)
    if schedule.damaged is not None:
        raise StoreError(
            f"the stored schedule {shown(row[0], 200)} is damaged: {schedule.damaged}. "
            "Remove it (agency schedules remove NAME) and add it again"
        )
    return schedule


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
        raise StoreError(
            f"the journal of run {run_id!r} is damaged: {_problem(exc)}. Only this run is "
            "affected: repair or delete its rows in the store"
        ) from exc


def readable_schedules(rows: Iterable[Sequence[Any]]) -> list[Schedule]:
    """The schedules of ``rows`` that read back; a damaged one is never fired (the list of
    schedules shows it, marked damaged)."""
    return [s for s in map(listed_schedule, rows) if s.damaged is None]
