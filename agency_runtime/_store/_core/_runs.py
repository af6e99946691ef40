"""The core's runs: claiming one, its lease, its outcome, reading, cancelling and forking."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from ..._errors import RunNotFoundError
from ..._types import Checkpoint, Claim, RunRecord, RunStatus
from .._rows import STEP_COLUMNS, error_json, interrupts_json, run_values, waiting_json
from .._rules import claim_decision
from ._base import COLS, VALUES, CoreBase, json_rows, listed
from ._base import record as run_record
from ._program import Op, Sql

__all__ = ["RunsCore", "parks_for_events"]


class RunsCore(CoreBase):
    """:class:`~agency_runtime._store.RunLog`'s run operations."""

    async def claim_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        lease_seconds: float,
        steal_from: str | None = None,
    ) -> Claim:
        t = self._d.t

        def work() -> Op[Claim]:
            while True:
                existing = yield from self._fetch(record.run_id, lock=True)
                now = yield from self._now()
                decision = claim_decision(existing, now, steal_from)
                if decision == "refuse" and (yield from self._holder_gone(record.run_id)):
                    assert existing is not None
                    decision = claim_decision(existing, now, existing.lease_owner)
                if decision == "refuse":
                    assert existing is not None
                    return Claim(acquired=False, created=False, record=existing)
                lease = {"lease_owner": owner, "lease_expires_at": now + lease_seconds}
                if decision == "insert":
                    stored = record.model_copy(
                        update={"status": "running", "attempts": 1, "version": 1,
                                "started_at": now, "updated_at": now, **lease}
                    )  # fmt: skip
                    inserted = yield Sql(
                        f"INSERT INTO {t}runs ({COLS}) VALUES ({VALUES}) "
                        "ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
                        run_values(stored),
                    )
                    if not inserted.rows:
                        continue  # another claimant inserted it first: decide again
                    yield from self._record_session(record.run_id)
                    return Claim(acquired=True, created=True, record=stored)
                row = (
                    yield Sql(
                        f"UPDATE {t}runs SET status = 'running', attempts = attempts + 1, "
                        "version = version + 1, started_at = %(now)s, updated_at = %(now)s, "
                        "lease_owner = %(lease_owner)s, "
                        f"lease_expires_at = %(lease_expires_at)s{self._d.session_set}, "
                        f"wake_at = NULL, waiting_for = NULL WHERE run_id = %(run)s "
                        f"RETURNING {COLS}",
                        {"now": now, "run": record.run_id, "session": self._session(), **lease},
                    )
                ).one()
                assert row is not None
                return Claim(acquired=True, created=False, record=run_record(row))

        return await self._run(f"claim run {record.run_id!r}", work, tx=True, check="always")

    async def renew_lease(self, run_id: str, *, owner: str, lease_seconds: float) -> bool:
        query = (
            f"UPDATE {self._d.t}runs SET lease_expires_at = {self._d.now} + %(lease)s "
            "WHERE run_id = %(run)s AND lease_owner = %(owner)s AND status = 'running'"
        )

        def work() -> Op[bool]:
            params = {"now": self._now_param(), "lease": lease_seconds, "run": run_id,
                      "owner": owner}  # fmt: skip
            return (yield Sql(query, params)).rowcount == 1

        return await self._run(f"renew the lease of run {run_id!r}", work)

    async def finish_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        unjournaled: tuple[int, int] = (0, 0),
        forget: Sequence[str] = (),
    ) -> bool:
        d = self._d
        t = d.t
        params: dict[str, Any] = {
            **_outcome_values(record, owner), "now": self._now_param(),
            "forget": d.array(list(forget)), "names": d.array(list(record.waiting_for)),
        }  # fmt: skip
        # A run parking to wait for events needs a transaction: see the check below.
        parks = parks_for_events(record)
        finish = d.notifying(
            f"UPDATE {t}runs AS u SET {self._finish_set(lambda name: f'%({name})s')} "
            "WHERE run_id = %(run)s AND lease_owner = %(owner)s AND status = 'running'",
            "run_id",
        )

        def work() -> Op[bool]:
            # Added to this attempt's own totals: a retried attempt starts again from
            # ``unjournaled``, not from what the rolled-back one had added.
            params["upico"], params["utokens"] = unjournaled
            if forget:
                if (yield Sql(self._holds(d.for_update), params)).one() is None:
                    return False
                pico, tokens = yield from self._drop_steps(
                    record.run_id, f"path{d.among('forget')}", params
                )
                params["upico"] += pico
                params["utokens"] += tokens
            # One guarded UPDATE, and the notification that whoever waits on runs looks again.
            if len((yield Sql(finish, params)).rows) != 1:
                return False
            if parks:
                # An event it waits for may be buffered already (sent while it still ran):
                # then it is due now. This statement's snapshot is newer than the UPDATE's
                # row lock, and send_event locks the run's row before it inserts, so an
                # event committed before that lock is seen here, and one sent later finds
                # the run waiting and wakes it itself.
                yield Sql(
                    f"UPDATE {t}runs SET wake_at = {d.now} WHERE run_id = %(run)s "
                    "AND status = 'waiting' AND EXISTS (SELECT 1 FROM "
                    f"{t}events e WHERE e.run_id = %(run)s AND e.taken_by IS NULL "
                    f"AND e.name{d.among('names')})",
                    params,
                )
            return True

        finished = await self._run(
            f"store the outcome of run {record.run_id!r}",
            work,
            tx=bool(forget) or parks,
            check="always",
        )
        if finished:
            self._wakeups.ring()
            self._finished(record.status)
        return finished

    def _finish_set(self, value: Callable[[str], str]) -> str:
        """The ``SET`` list of a run's outcome, ``value(name)`` the SQL of each value (a
        parameter, or a column of the rows of :meth:`finish_runs`)."""
        status = value("status")
        return (
            f"status = {status}, value = {value('value')}, error = {value('error')}, "
            f"interrupts = {value('interrupts')}, cost_pico = {value('cost')}, "
            f"descendants_pico = {value('descendants')}, tokens = {value('tokens')}, "
            f"unjournaled_pico = u.unjournaled_pico + {value('upico')}, "
            f"unjournaled_tokens = u.unjournaled_tokens + {value('utokens')}, "
            f"finished_at = {value('finished')}, updated_at = {self._d.now}, "
            f"version = u.version + 1, queue = CASE WHEN {status} = 'queued' "
            "THEN COALESCE(u.queue, 'default') ELSE u.queue END, lease_owner = NULL, "
            f"lease_expires_at = NULL, wake_at = {value('wake_at')}, "
            f"waiting_for = {value('waiting_for')}"
        )

    @functools.cached_property
    def _finish_runs_sql(self) -> str:
        """:meth:`finish_runs`'s statement: one row per outcome, each run updated when its
        row's owner holds its lease, and the notification of each run updated."""
        d = self._d
        columns = (
            ("run", "text"), ("owner", "text"), ("status", "text"), ("value", "text"),
            ("error", "text"), ("interrupts", "text"), ("cost", "bigint"),
            ("descendants", "bigint"), ("tokens", "bigint"), ("upico", "bigint"),
            ("utokens", "bigint"), ("finished", "double precision"),
            ("wake_at", "double precision"), ("waiting_for", "text"),
        )  # fmt: skip
        return d.notifying(
            f"UPDATE {d.t}runs AS u SET {self._finish_set(lambda name: f'x.{name}')} "
            f"FROM {d.rows_of('rows', columns)} WHERE u.run_id = x.run "
            "AND u.lease_owner = x.owner AND u.status = 'running'",
            "run_id",
        )

    async def finish_runs(
        self, outcomes: list[tuple[RunRecord, str, tuple[int, int]]]
    ) -> list[bool]:
        """Store several runs' outcomes, each ``(record, owner, unjournaled)``, in one
        statement: whether each was stored (its owner held its lease), in order. As
        :meth:`finish_run` for each (without ``forget``, and no run that
        :func:`parks_for_events`: those need their own transaction), but one round trip."""
        rows = [
            {**_outcome_values(record, owner), "upico": pico, "utokens": tokens}
            for record, owner, (pico, tokens) in outcomes
        ]
        params = {"rows": json_rows(rows), "now": self._now_param()}
        query = self._finish_runs_sql

        def work() -> Op[set[str]]:
            return {str(row[0]) for row in (yield Sql(query, params)).rows}

        stored = await self._run(f"store the outcomes of {len(rows)} runs", work, check="always")
        if stored:
            self._wakeups.ring()
        for record, _, _ in outcomes:
            if record.run_id in stored:
                self._finished(record.status)
        return [record.run_id in stored for record, _, _ in outcomes]

    def _finished(self, status: str) -> None:
        """Called after a run's outcome (``status``) was stored (the SQLite store trims its
        WAL here)."""

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._run(f"read run {run_id!r}", lambda: self._fetch(run_id))

    async def trace_context(self, run_id: str) -> str | None:
        query = f"SELECT trace_context FROM {self._d.t}runs WHERE run_id = %(run)s"

        def work() -> Op[str | None]:
            row = (yield Sql(query, {"run": run_id})).one()
            return None if row is None or row[0] is None else str(row[0])

        return await self._run(f"read the trace context of run {run_id!r}", work)

    async def note_trace_context(self, run_id: str, context: str) -> None:
        query = f"UPDATE {self._d.t}runs SET trace_context = %(context)s WHERE run_id = %(run)s"
        await self._one(
            lambda: f"note the trace context of run {run_id!r}",
            Sql(query, {"run": run_id, "context": context}),
        )

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        limit: int = 100,
        offset: int = 0,
        parent: str | None = None,
    ) -> list[RunRecord]:
        d = self._d
        conditions = []
        if status is not None:
            conditions.append("status = %(status)s")
        if parent is not None:
            conditions.append("parent_id = %(parent)s")
        where = f"WHERE {' AND '.join(conditions)} " if conditions else ""
        query = (
            f"SELECT {COLS} FROM {d.t}runs {where}ORDER BY created_at DESC, {d.seq} DESC "
            "LIMIT %(limit)s OFFSET %(offset)s"
        )
        params = {"status": status, "parent": parent,
                  "limit": d.no_limit if limit < 0 else limit,
                  "offset": max(0, offset)}  # fmt: skip

        def work() -> Op[list[RunRecord]]:
            return [listed(row) for row in (yield Sql(query, params)).rows]

        return await self._run("list runs", work)

    async def cancel_run(self, run_id: str) -> RunRecord | None:
        d = self._d
        query = d.notifying(
            f"UPDATE {d.t}runs SET status = 'cancelled', lease_owner = NULL, "
            f"lease_expires_at = NULL, version = version + 1, finished_at = {d.now}, "
            f"updated_at = {d.now} WHERE run_id = %(run)s "
            "AND status NOT IN ('completed', 'cancelled')",
            COLS,
        )

        def work() -> Op[tuple[RunRecord | None, bool]]:
            row = (yield Sql(query, {"run": run_id, "now": self._now_param()})).one()
            if row is not None:
                return run_record(row), True
            return (yield from self._fetch(run_id)), False

        stored, changed = await self._run(f"cancel run {run_id!r}", work)
        if changed:
            self._wakeups.ring()
        return stored

    async def fork_run(self, run_id: str, new_run_id: str, upto_seq: int) -> RunRecord:
        t = self._d.t
        params = {"run": run_id, "new": new_run_id, "upto": upto_seq}

        def work() -> Op[RunRecord]:
            source = yield from self._fetch(run_id)
            if source is None:
                raise RunNotFoundError(run_id, self.url)
            row = (
                yield Sql(
                    "SELECT COALESCE(SUM(cost_pico), 0), COALESCE(SUM(tokens), 0) "
                    f"FROM {t}steps WHERE run_id = %(run)s AND seq <= %(upto)s",
                    params,
                )
            ).one()
            assert row is not None
            forked = source.fork_as(new_run_id, cost_pico=int(row[0]), tokens=int(row[1]))
            yield Sql(f"INSERT INTO {t}runs ({COLS}) VALUES ({VALUES})", run_values(forked))
            others = ", ".join(STEP_COLUMNS[1:])
            yield Sql(
                f"INSERT INTO {t}steps ({', '.join(STEP_COLUMNS)}) SELECT %(new)s, {others} "
                f"FROM {t}steps WHERE run_id = %(run)s AND seq <= %(upto)s",
                params,
            )
            # Answers are not copied: interrupt ids derive from the run id.
            kept = yield Sql(
                f"SELECT checkpoint_id, seq, body FROM {t}checkpoints "
                "WHERE run_id = %(run)s AND seq <= %(upto)s",
                params,
            )
            for cid, seq, body in kept.rows:
                moved = Checkpoint.model_validate_json(body).model_copy(
                    update={"run_id": new_run_id}
                )
                yield Sql(
                    f"INSERT INTO {t}checkpoints (run_id, checkpoint_id, seq, body) "
                    "VALUES (%(new)s, %(id)s, %(seq)s, %(body)s)",
                    {"new": new_run_id, "id": cid, "seq": seq, "body": moved.model_dump_json()},
                )
            return forked

        return await self._run(f"fork run {run_id!r}", work, tx=True)


def parks_for_events(record: RunRecord) -> bool:
    """Whether storing ``record`` parks its run to wait for events (in a transaction of its
    own, which checks the events already sent: see :meth:`RunsCore.finish_run`)."""
    return record.status == "waiting" and bool(record.waiting_for)


def _outcome_values(record: RunRecord, owner: str) -> dict[str, Any]:
    """The values of ``record``'s outcome that :meth:`RunsCore._finish_set` names, its run and
    ``owner``: the parameters of one outcome, a row of several."""
    return {
        "run": record.run_id, "owner": owner, "status": record.status, "value": record.value,
        "error": error_json(record.error), "interrupts": interrupts_json(record.interrupts),
        "cost": record.cost_pico, "descendants": record.descendants_pico,
        "tokens": record.tokens, "finished": record.finished_at, "wake_at": record.wake_at,
        "waiting_for": waiting_json(record.waiting_for),
    }  # fmt: skip
