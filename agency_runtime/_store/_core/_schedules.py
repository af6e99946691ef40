"""The core's schedules: storing them, reading the due ones, and firing an occurrence."""

from __future__ import annotations

from collections.abc import Sequence

from ..._types import RunRecord, Schedule
from .._rows import (
    SCHEDULE_COLUMNS,
    listed_schedule,
    readable_schedules,
    run_values,
    schedule_from,
    schedule_values,
)
from .._rules import queued_record
from ._base import COLS, VALUES, CoreBase
from ._program import Op, Sql, changed_one

__all__ = ["SchedulesCore"]

_SCHEDULE_COLS = ", ".join(SCHEDULE_COLUMNS)


class SchedulesCore(CoreBase):
    """:class:`~agency_runtime._store.ScheduleTable`'s operations."""

    async def put_schedule(self, schedule: Schedule) -> None:
        d = self._d
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in SCHEDULE_COLUMNS[1:])
        query = d.notifying(
            f"INSERT INTO {d.t}schedules ({_SCHEDULE_COLS}) VALUES "
            f"({', '.join(f'%({c})s' for c in SCHEDULE_COLUMNS)}) "
            f"ON CONFLICT (name) DO UPDATE SET {updates}",
            "name",
        )
        params = dict(zip(SCHEDULE_COLUMNS, schedule_values(schedule), strict=True))

        def work() -> Op[None]:
            yield Sql(query, params)

        await self._run(f"store schedule {schedule.name!r}", work, check="always")
        self._wakeups.ring()

    async def get_schedule(self, name: str) -> Schedule | None:
        query = f"SELECT {_SCHEDULE_COLS} FROM {self._d.t}schedules WHERE name = %(name)s"

        def work() -> Op[Schedule | None]:
            row = (yield Sql(query, {"name": name})).one()
            return None if row is None else schedule_from(row)

        return await self._run(f"read schedule {name!r}", work)

    async def list_schedules(self) -> list[Schedule]:
        d = self._d
        query = f"SELECT {_SCHEDULE_COLS} FROM {d.t}schedules ORDER BY name{d.bytewise}"

        def work() -> Op[list[Schedule]]:
            return [listed_schedule(row) for row in (yield Sql(query)).rows]

        return await self._run("list schedules", work)

    async def remove_schedule(self, name: str) -> bool:
        query = f"DELETE FROM {self._d.t}schedules WHERE name = %(name)s"
        return await self._run(
            f"remove schedule {name!r}", lambda: changed_one(query, {"name": name})
        )

    async def due_schedules(self, queues: Sequence[str], now: float) -> list[Schedule]:
        names = list(dict.fromkeys(queues))
        if not names:
            return []
        d = self._d
        query = (
            f"SELECT {_SCHEDULE_COLS} FROM {d.t}schedules WHERE queue{d.among('queues')} "
            f"AND next_at <= %(now)s ORDER BY next_at, name{d.bytewise}"
        )
        params = {"queues": d.array(names), "now": now}

        def work() -> Op[list[Schedule]]:
            return readable_schedules((yield Sql(query, params)).rows)

        return await self._run("read due schedules", work)

    async def fire_schedule(self, name: str, *, due: float, next_at: float, run: RunRecord) -> bool:
        d = self._d
        move = d.notifying(
            f"UPDATE {d.t}schedules SET next_at = %(next)s, updated_at = %(now)s "
            "WHERE name = %(name)s AND next_at = %(due)s",
            "name",
        )

        def work() -> Op[bool]:
            now = yield from self._now()
            # Only while its next_at is still ``due``: a second worker firing the same
            # occurrence waits for this row lock, then finds next_at moved and does nothing.
            moved = yield Sql(move, {"next": next_at, "now": now, "name": name, "due": due})
            if not moved.rows:
                return False
            yield Sql(
                f"INSERT INTO {d.t}runs ({COLS}) VALUES ({VALUES}) ON CONFLICT (run_id) DO NOTHING",
                run_values(queued_record(run, now)),
            )
            return True

        fired = await self._run(f"fire schedule {name!r}", work, tx=True, check="always")
        if fired:
            self._wakeups.ring()
        return fired
