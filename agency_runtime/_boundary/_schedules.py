"""Schedules: ``agency.schedules.add/get/list/remove``, and firing their occurrences.

A schedule starts ``entry`` at every occurrence of a cron expression (read by ``croniter``,
in the schedule's time zone) or every ``every`` seconds (counted from the epoch, so
``every=3600`` is the top of each UTC hour). Workers serving its queue fire it: each
occurrence becomes one queued run with the id ``"{name}@{ISO time}"``, and the store moves
the schedule's ``next_at`` and queues that run in one transaction, only if no other worker
moved it first, so every occurrence starts exactly once however many workers run.
Occurrences missed while no worker ran start once (the latest of them), not once per miss.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .._bounds import check_seconds
from .._core._jsondata import check_name
from .._durable._values import check_entry, encode_arguments
from .._errors import EntryImportError, InvalidArgumentError, ScheduleNotFoundError
from .._store import RunRecord, Store
from .._types import Schedule
from ._queue import check_queue, check_worker_entry
from ._runtime import RUNTIME

__all__ = [
    "SchedulesNamespace",
    "fire_due",
    "latest_due",
    "next_after",
    "occurrence_run_id",
]


def _zone(name: str) -> tzinfo:
    if name == "UTC":
        return UTC
    return ZoneInfo(name)


def _cron(schedule: Schedule, start: float) -> Any:
    from croniter import croniter  # imported by the first schedule, not by the package

    assert schedule.cron is not None
    return croniter(schedule.cron, datetime.fromtimestamp(start, _zone(schedule.timezone)))


def next_after(schedule: Schedule, moment: float) -> float:
    """The first occurrence of ``schedule`` strictly after ``moment``."""
    if schedule.every is not None:
        return (math.floor(moment / schedule.every) + 1) * schedule.every
    following: datetime = _cron(schedule, moment).get_next(datetime)
    return following.timestamp()


def latest_due(schedule: Schedule, now: float) -> float:
    """The latest occurrence at or before ``now`` (never before ``schedule.next_at``)."""
    if schedule.every is not None:
        latest = math.floor(now / schedule.every) * schedule.every
    else:
        # croniter counts from a start that is not itself an occurrence: step back from
        # just after ``now`` so an occurrence at exactly ``now`` is found.
        latest = _cron(schedule, now + 1).get_prev(datetime).timestamp()
        if latest > now:  # sub-second schedules do not exist; only guard the rounding
            latest = _cron(schedule, now).get_prev(datetime).timestamp()
    return max(latest, schedule.next_at)


def occurrence_run_id(name: str, at: float) -> str:
    """The run id of schedule ``name``'s occurrence at ``at``: ``name@2026-12-02T09:00:00Z``."""
    moment = datetime.fromtimestamp(at, UTC)
    spec = "seconds" if at == int(at) else "milliseconds"
    return f"{name}@{moment.replace(tzinfo=None).isoformat(timespec=spec)}Z"


def _check_name(name: object) -> str:
    # no "@": an occurrence's run id is "name@time"
    return check_name(name, "a schedule name", "daily-digest", without="@")


def _check_timing(cron: object, every: object, timezone: object) -> tuple[str | None, float | None]:
    if not isinstance(timezone, str):
        raise InvalidArgumentError(f"timezone must be an IANA name like 'UTC', got {timezone!r}")
    try:
        _zone(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidArgumentError(
            f"unknown time zone {timezone!r}: use an IANA name like 'UTC' or 'Europe/Berlin'"
        ) from exc
    if (cron is None) == (every is None):
        raise InvalidArgumentError(
            "a schedule needs exactly one of cron='0 9 * * *' (a cron expression) or "
            "every=<seconds> (an interval)"
        )
    if every is not None:
        if timezone != "UTC":
            raise InvalidArgumentError("timezone applies to cron schedules only; every= is UTC")
        return None, check_seconds(every, "every", low=1)
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidArgumentError(f"cron must be a cron expression like '0 9 * * *', got {cron!r}")
    if len(cron.split()) > 5:  # croniter reads a sixth field as seconds, a seventh as years
        raise InvalidArgumentError(
            f"the cron expression {cron!r} has {len(cron.split())} fields; use five, minute "
            "hour day-of-month month day-of-week, like '0 9 * * 1-5' (09:00 on weekdays): "
            "occurrences are whole minutes (no seconds field); for a shorter period use "
            "every=SECONDS"
        )
    from croniter import CroniterError, croniter

    try:
        croniter(cron, datetime.now(UTC)).get_next(datetime)
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidArgumentError(
            f"malformed cron expression {cron!r}: {exc}. Use five fields, minute hour "
            "day-of-month month day-of-week, like '0 9 * * 1-5' (09:00 on weekdays)"
        ) from exc
    return cron, None


async def fire_due(store: Store, queues: Sequence[str], now: float) -> int:
    """Queue the due occurrence of every schedule of ``queues``; return how many this
    process started (others may have been fired by another worker first)."""
    fired = 0
    for schedule in await store.due_schedules(queues, now):
        due = latest_due(schedule, now)
        run = RunRecord(
            run_id=occurrence_run_id(schedule.name, due),
            status="queued",
            entry=schedule.entry,
            arguments=schedule.arguments,
            queue=schedule.queue,
            created_at=now,
            updated_at=now,
        )
        nxt = next_after(schedule, now)
        if await store.fire_schedule(schedule.name, due=schedule.next_at, next_at=nxt, run=run):
            fired += 1
    return fired


class SchedulesNamespace:
    """``agency.schedules``: entries started at cron or interval occurrences by workers."""

    async def add(
        self,
        name: str,
        entry: Callable[..., Any] | str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        queue: str = "default",
        timezone: str = "UTC",
        store: str | Store | None = None,
    ) -> Schedule:
        """Start ``entry(*args, **kwargs)`` at every occurrence, by the workers of ``queue``.

        Exactly one of ``cron`` (a cron expression, read in ``timezone``) and ``every``
        (seconds >= 1, counted from the epoch). The entry must be declared
        (``@agency.entry``, at module level or with a name; else
        :class:`EntryNotAllowedError`), since workers run it; it may be given as its declared
        name or ``"module:qualname"``. Adding a schedule
        that exists with the same plan changes nothing (safe at every start-up); with
        another plan it is replaced and its next occurrence counted from now. Returns the
        schedule as stored.
        """
        name = _check_name(name)
        if isinstance(entry, str):
            try:
                entry = RUNTIME.entries.find(f"schedule:{name}", entry)
            except EntryImportError as exc:
                raise type(exc)(f"agency.schedules.add: cannot schedule {entry!r}: {exc}") from exc
        check_entry(entry)
        ref = check_worker_entry(entry, "schedules.add")
        cron, interval = _check_timing(cron, every, timezone)
        queue = check_queue(queue)
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise InvalidArgumentError(f"args must be a list or tuple, got {type(args).__name__}")
        if kwargs is not None and not isinstance(kwargs, dict):
            raise InvalidArgumentError(f"kwargs must be a dict, got {type(kwargs).__name__}")
        store_ = RUNTIME.stores.resolve(store)
        now = RUNTIME.clock.time()
        wanted = Schedule(
            name=name,
            entry=ref,
            arguments=encode_arguments(tuple(args), dict(kwargs or {})),
            cron=cron,
            every=interval,
            timezone=timezone,
            queue=queue,
            next_at=0.0,
            created_at=now,
            updated_at=now,
        )
        existing = await store_.get_schedule(name)
        if existing is not None and existing.same_plan(wanted):
            return existing
        stored = wanted.model_copy(update={"next_at": next_after(wanted, now)})
        await store_.put_schedule(stored)
        return stored

    async def get(self, name: str, *, store: str | Store | None = None) -> Schedule:
        """The schedule called ``name``; :class:`ScheduleNotFoundError` if there is none."""
        store_ = RUNTIME.stores.resolve(store)
        found = await store_.get_schedule(_check_name(name))
        if found is None:
            raise ScheduleNotFoundError(name, store_.url)
        return found

    async def list(self, *, store: str | Store | None = None) -> builtins.list[Schedule]:
        """Every schedule of the store, by name."""
        return await RUNTIME.stores.resolve(store).list_schedules()

    async def remove(self, name: str, *, store: str | Store | None = None) -> None:
        """Delete the schedule called ``name``; :class:`ScheduleNotFoundError` if there is none.

        Its occurrences still queued that have not started (no step done) are cancelled, so
        none waits forever for a schedule that is gone; the runs it started go on.
        """
        store_ = RUNTIME.stores.resolve(store)
        if not await store_.remove_schedule(_check_name(name)):
            raise ScheduleNotFoundError(name, store_.url)
        for run_id in await _queued_occurrences(store_, name):
            if not (await store_.load_journal(run_id)).entries:
                await store_.cancel_run(run_id)


async def _queued_occurrences(store: Store, name: str) -> builtins.list[str]:
    """The ids of the queued runs that are occurrences of schedule ``name``."""
    found: builtins.list[str] = []
    offset, page = 0, 1000
    while True:
        records = await store.list_runs(status="queued", limit=page, offset=offset)
        found.extend(r.run_id for r in records if _occurrence_of(r.run_id, name))
        if len(records) < page:
            return found
        offset += page


def _occurrence_of(run_id: str, name: str) -> bool:
    """Whether ``run_id`` is an id :func:`occurrence_run_id` gives schedule ``name``."""
    head, at, moment = run_id.partition("@")
    if head != name or not at or not moment.endswith("Z"):
        return False
    try:
        datetime.fromisoformat(moment[:-1])
    except ValueError:
        return False
    return True
