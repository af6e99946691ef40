"""The core's events: sending one to a run (waking it when it waits) and taking one."""

from __future__ import annotations

from ..._errors import RunFinishedError, RunNotFoundError
from ..._types import RunEvent
from .._rows import waiting_from
from ._base import CoreBase
from ._program import Op, Sql

__all__ = ["EventsCore"]

EVENT_COLUMNS = ("event_id", "run_id", "name", "payload", "sent_at", "taken_by")
_EVENT_COLS = ", ".join(EVENT_COLUMNS)


class EventsCore(CoreBase):
    """:class:`~agency_runtime._store.EventLog`'s operations."""

    async def send_event(self, run_id: str, name: str, payload: str) -> RunEvent:
        d = self._d
        t = d.t
        params = {"run": run_id, "name": name, "payload": payload, "now": self._now_param()}
        insert = d.notifying(
            f"INSERT INTO {t}events (run_id, name, payload, sent_at) "
            f"VALUES (%(run)s, %(name)s, %(payload)s, {d.now})",
            "event_id, sent_at",
        )

        def work() -> Op[RunEvent]:
            # The run's row first, locked: a finish_run parking it either committed before
            # (then its wait is seen here) or waits for this commit (then it sees the event).
            row = (
                yield Sql(
                    f"SELECT status, waiting_for FROM {t}runs WHERE run_id = %(run)s{d.for_update}",
                    params,
                )
            ).one()
            if row is None:
                raise RunNotFoundError(run_id, self.url)
            status, waiting = str(row[0]), row[1]
            if status in ("completed", "cancelled"):
                raise RunFinishedError(run_id, status, name)
            sent = (yield Sql(insert, params)).one()
            assert sent is not None
            event_id, sent_at = int(sent[0]), float(sent[1])
            if status == "waiting" and name in waiting_from(run_id, waiting):
                # It waits for this event: due now (at the event's own time).
                yield Sql(
                    f"UPDATE {t}runs SET wake_at = %(at)s, updated_at = %(at)s "
                    "WHERE run_id = %(run)s",
                    {"run": run_id, "at": sent_at},
                )
            return RunEvent(
                event_id=event_id, run_id=run_id, name=name, payload=payload, sent_at=sent_at
            )

        event = await self._run(
            f"send event {name!r} to run {run_id!r}", work, tx=True, check="always"
        )
        self._wakeups.ring()
        return event

    async def take_event(self, run_id: str, name: str, taker: str) -> RunEvent | None:
        d = self._d
        t = d.t
        params = {"run": run_id, "name": name, "taker": taker}
        mine = (
            f"SELECT {_EVENT_COLS} FROM {t}events WHERE run_id = %(run)s "
            "AND taken_by = %(taker)s AND name = %(name)s"
        )
        # The oldest untaken one, taken now (one statement: rows another taker is taking at
        # this moment are skipped, never waited for).
        take = (
            f"UPDATE {t}events SET taken_by = %(taker)s WHERE event_id = "
            f"(SELECT event_id FROM {t}events WHERE run_id = %(run)s AND name = %(name)s "
            f"AND taken_by IS NULL ORDER BY event_id LIMIT 1{d.skip_locked}) "
            f"RETURNING {_EVENT_COLS}"
        )

        def work() -> Op[RunEvent | None]:
            row = (yield Sql(mine, params)).one()
            if row is None:
                row = (yield Sql(take, params)).one()
            return None if row is None else RunEvent(**dict(zip(EVENT_COLUMNS, row, strict=True)))

        return await self._run(f"take event {name!r} of run {run_id!r}", work)
