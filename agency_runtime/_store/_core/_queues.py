"""The core's queues: queueing runs, claiming queued ones, queue limits, and wake-ups."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from ..._errors import InvalidArgumentError, StoreError
from ..._types import Claim, RunRecord
from .._protocols import ClaimedRun
from .._rows import run_values
from .._rules import pick_claims, queued_record
from ._base import COLS, COLUMNS, VALUES, CoreBase
from ._base import record as run_record
from ._program import Op, Sql

__all__ = ["QueuesCore"]

_PRIORITY, _CREATED = COLUMNS.index("priority"), COLUMNS.index("created_at")
_SEQ = len(COLUMNS)
"""In a row of the folded claim: the run's insertion order (then whether its journal is empty)."""
_JOURNAL_TABLES = ("steps", "interrupts", "checkpoints")
"""The tables holding a run's journal (what ``load_journal`` reads)."""


class QueuesCore(CoreBase):
    """:class:`~agency_runtime._store.RunQueue`'s operations."""

    async def enqueue_run(self, record: RunRecord) -> Claim:
        d = self._d
        query = d.notifying(
            f"INSERT INTO {d.t}runs ({COLS}) VALUES ({VALUES}) ON CONFLICT (run_id) DO NOTHING",
            "run_id",
        )

        def work() -> Op[Claim]:
            stored = queued_record(record, (yield from self._now()))
            if (yield Sql(query, run_values(stored))).rows:
                return Claim(acquired=False, created=True, record=stored)
            existing = yield from self._fetch(record.run_id)
            if existing is None:  # deleted in between: runs are deleted only when final
                raise StoreError(f"run {record.run_id!r} vanished while being queued")
            return Claim(acquired=False, created=False, record=existing)

        claim = await self._run(f"queue run {record.run_id!r}", work, check="always")
        if claim.created:
            self._wakeups.ring()
        return claim

    async def claim_queued(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[RunRecord]:
        claimed = await self.claim_queued_runs(
            queues=queues, owner=owner, lease_seconds=lease_seconds, limit=limit,
            exclude=exclude,
        )  # fmt: skip
        return [run.record for run in claimed]

    async def claim_queued_runs(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[ClaimedRun]:
        self._wakeups.looking()  # what is queued from now on ends this task's next wait
        names = list(dict.fromkeys(queues))
        if limit <= 0 or not names:
            return []
        d = self._d
        t = d.t
        what = f"claim queued runs of {names}"
        if d.folds:
            one_queue = len(names) == 1
            params = {"skip": d.array(list(exclude)), "n": limit, "owner": owner,
                      "lease": lease_seconds, "now": self._now_param(),
                      "session": self._session()}  # fmt: skip
            if one_queue:
                params["queue"] = names[0]
            else:
                params["names"] = d.array(names)
            sql = self._claim_folded_sql(one_queue, limit)
            folded = await self._run(
                what, lambda: self._claim_folded(sql, params), check="throttled"
            )
            if folded is not None:
                return folded

        def work() -> Op[list[ClaimedRun]]:
            now = yield from self._now()
            # Limited queues: their rows are locked for the rest of this transaction, so no
            # other claimant counts their running runs until these claims are committed.
            capped = yield Sql(
                f"SELECT name, concurrency FROM {t}queues WHERE name{d.among('names')} "
                f"AND concurrency IS NOT NULL ORDER BY name{d.for_update}",
                {"names": d.array(names)},
            )
            limits = {str(name): int(cap) for name, cap in capped.rows}
            room: dict[str, int] = {}
            if limits:
                running = yield Sql(
                    f"SELECT queue, count(*) FROM {t}runs WHERE queue{d.among('limited')} "
                    f"AND status = 'running' AND lease_expires_at > %(now)s "
                    f"AND NOT {d.session_gone} GROUP BY queue",
                    {"limited": d.array(list(limits)), "now": now},
                )
                busy = {str(queue): int(count) for queue, count in running.rows}
                room = {name: max(0, cap - busy.get(name, 0)) for name, cap in limits.items()}
            open_queues = [name for name in names if room.get(name, 1) > 0]
            skip, taken = list(exclude), list[str]()
            while open_queues and len(taken) < limit:
                due = yield Sql(
                    f"SELECT run_id, queue FROM {t}runs WHERE queue{d.among('queues')} "
                    "AND (status = 'queued' OR (status = 'running' AND (lease_expires_at IS NULL "
                    f"OR lease_expires_at <= %(now)s OR {d.session_gone})) OR (status = 'waiting' "
                    "AND wake_at <= %(now)s)) "
                    f"AND run_id{d.among('skip', negated=True)} "
                    f"ORDER BY priority DESC, created_at, {d.seq} LIMIT %(n)s{d.skip_locked}",
                    {"queues": d.array(open_queues), "now": now, "skip": d.array(skip),
                     "n": limit - len(taken)},
                )  # fmt: skip
                rows = due.rows
                if not rows:
                    break
                skip.extend(run_id for run_id, _ in rows)
                taken += pick_claims(rows, room, limit - len(taken))
                open_queues = [name for name in open_queues if room.get(name, 1) > 0]
            if not taken:
                return []
            updated = yield Sql(
                f"UPDATE {t}runs SET status = 'running', attempts = attempts + 1, "
                "version = version + 1, started_at = COALESCE(started_at, %(now)s), "
                "updated_at = %(now)s, lease_owner = %(owner)s, "
                f"lease_expires_at = %(expires)s{d.session_set}, wake_at = NULL, "
                f"waiting_for = NULL WHERE run_id{d.among('ids')} RETURNING {COLS}",
                {"now": now, "owner": owner, "expires": now + lease_seconds,
                 "ids": d.array(taken), "session": self._session()},
            )  # fmt: skip
            claimed = {run.run_id: run for run in map(run_record, updated.rows)}
            # Which of them journaled something: later than the claim, but its row locks
            # keep a holder that lost the run from committing more until this transaction
            # ends (and then its lease check fails), so nothing is missed.
            journaled = yield Sql(
                " UNION ".join(
                    f"SELECT run_id FROM {t}{table} WHERE run_id{d.among('ids')}"
                    for table in _JOURNAL_TABLES
                ),
                {"ids": d.array(taken)},
            )
            seen = {str(row[0]) for row in journaled.rows}
            return [ClaimedRun(claimed[run_id], run_id not in seen) for run_id in taken]

        return await self._run(what, work, tx=True, check="throttled")

    @functools.cached_property
    def _claim_folded_sqls(self) -> dict[tuple[bool, int], str]:
        """:meth:`_claim_folded_sql`'s statements, made once each."""
        return {}

    def _claim_folded_sql(self, one_queue: bool, limit: int) -> str:
        """The folded claim's statement for one queue (else a list of them) and up to
        ``limit`` runs.

        Made so that a prepared claim is planned once, not at every execution: each queue's
        scan is bounded by a number written in the statement (``limit`` rounded up to a
        power of two, so a worker has a few statements, not one per count of free slots),
        and a single queue is a parameter, not a list. With the bound and the list as
        parameters PostgreSQL priced its generic plan ~10x its custom ones (it guesses a
        tenth of the queue for a ``LIMIT $n``, ten queues for a list) and planned the claim
        anew at every execution, ~0.6 ms of server time a claim; now, after its first five
        executions, it keeps the generic plan, which is the custom plans' (an ordered index
        scan that stops after the bound)."""
        scan = 1 << max(0, limit - 1).bit_length()
        key = (one_queue, scan)
        made = self._claim_folded_sqls.get(key)
        if made is None:
            made = self._claim_folded_sqls[key] = self._folded_claim(one_queue, scan)
        return made

    def _folded_claim(self, one_queue: bool, scan: int) -> str:
        d = self._d
        t = d.t
        returned = ", ".join(f"u.{c}" for c in COLUMNS)
        nulls = ", ".join(["NULL"] * (len(COLUMNS) + 2))
        # Whether a claimed run's journal is empty: only said of a run that was queued in
        # this statement's snapshot. A queued run has no holder, so no step, checkpoint or
        # answer can be committed for it after the snapshot; a running run taken from a
        # holder that lost it might commit one in between (read later, from the journal).
        empty = "picked.status = 'queued' AND " + " AND ".join(
            f"NOT EXISTS (SELECT 1 FROM {t}{table} j WHERE j.run_id = u.run_id)"
            for table in _JOURNAL_TABLES
        )

        def due(status: str) -> str:
            # The first ``scan`` (>= %(n)s) runs of one queue (q) in claim order, locked (SKIP
            # LOCKED, as the general claim's). One queue at a time, so the queue's index
            # (runs_runnable, runs_waking) gives that order and the scan stops after those
            # rows, instead of sorting every queued run of a list of queues.
            unclaimed = d.among("skip", negated=True)
            return (
                f"SELECT r.run_id, r.status, r.priority, r.created_at, r.{d.seq} AS seq "
                f"FROM {t}runs r "
                f"WHERE r.queue = q.name AND ({status}) "
                f"AND r.run_id{unclaimed} AND NOT EXISTS (SELECT 1 FROM capped) "
                f"ORDER BY r.priority DESC, r.created_at, r.{d.seq} LIMIT {scan:d}{d.skip_locked}"
            )

        runnable = (
            "r.status = 'queued' OR (r.status = 'running' AND (r.lease_expires_at IS NULL "
            f"OR r.lease_expires_at <= t.now OR {d.session_gone}))"
        )
        waking = "r.status = 'waiting' AND r.wake_at <= t.now"
        if one_queue:
            queues = "(SELECT CAST(%(queue)s AS text) AS name) AS q CROSS JOIN t"
            limited = " = %(queue)s"
        else:
            queues = "unnest(CAST(%(names)s AS text[])) AS q(name) CROSS JOIN t"
            limited = d.among("names")
        # One statement, so one round trip and its own transaction: the time once (t), whether
        # a queue is limited (capped: then nothing is claimed here), each queue's first due
        # runs locked (due), the first %(n)s of them all (picked), and the claim of each; its
        # rows are the claimed runs with their insertion order, then a flag row when a queue
        # is limited. The rows due locks but picked leaves are free again when it ends.
        return (
            f"WITH t AS (SELECT {d.now} AS now), "
            f"capped AS (SELECT 1 FROM {t}queues WHERE name{limited} "
            "AND concurrency IS NOT NULL LIMIT 1), "
            f"due AS (SELECT c.* FROM {queues}, LATERAL ({due(runnable)}) c "
            f"UNION ALL SELECT c.* FROM {queues}, "
            f"LATERAL ({due(waking)}) c), "
            "picked AS (SELECT run_id, status FROM due ORDER BY priority DESC, created_at, "
            "seq LIMIT %(n)s), "
            f"claimed AS (UPDATE {t}runs u SET status = 'running', attempts = u.attempts + 1, "
            "version = u.version + 1, started_at = COALESCE(u.started_at, t.now), "
            "updated_at = t.now, lease_owner = %(owner)s, "
            f"lease_expires_at = t.now + %(lease)s{d.session_set}, wake_at = NULL, "
            "waiting_for = NULL FROM picked, t WHERE u.run_id = picked.run_id "
            f"RETURNING {returned}, u.{d.seq}, {empty}) "
            f"SELECT *, false FROM claimed UNION ALL SELECT {nulls}, true FROM capped"
        )

    def _claim_folded(self, sql: str, params: dict[str, Any]) -> Op[list[ClaimedRun] | None]:
        """:meth:`claim_queued_runs` in one statement ``sql`` (a dialect that
        :attr:`~.Dialect.folds`); ``None`` when a queue among them is limited: then the
        general program claims, in a transaction that locks the limited queues' rows while
        it counts their runs."""
        rows = (yield Sql(sql, params)).rows
        if rows and rows[-1][-1]:
            return None
        rows.sort(key=lambda row: (-row[_PRIORITY], row[_CREATED], row[_SEQ]))
        return [ClaimedRun(run_record(row), bool(row[_SEQ + 1])) for row in rows]

    async def configure_queue(self, name: str, *, concurrency: int | None) -> None:
        if concurrency is not None and (
            not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 0
        ):
            raise InvalidArgumentError(
                f"the concurrency of queue {name!r} must be a whole number, 0 or more, or "
                f"None (no limit); got {concurrency!r}"
            )
        query = (
            f"INSERT INTO {self._d.t}queues (name, concurrency) VALUES (%(name)s, %(cap)s) "
            "ON CONFLICT (name) DO UPDATE SET concurrency = EXCLUDED.concurrency"
        )

        def work() -> Op[None]:
            yield Sql(query, {"name": name, "cap": concurrency})

        await self._run(f"configure queue {name!r}", work)
        self._wakeups.ring()  # a raised limit may make runs claimable

    async def queue_concurrency(self, name: str) -> int | None:
        query = f"SELECT concurrency FROM {self._d.t}queues WHERE name = %(name)s"

        def work() -> Op[int | None]:
            row = (yield Sql(query, {"name": name})).one()
            return None if row is None or row[0] is None else int(row[0])

        return await self._run(f"read the limit of queue {name!r}", work)

    async def next_wake(self, queues: Sequence[str], *, after: float | None = None) -> float | None:
        names = list(dict.fromkeys(queues))
        if not names:
            return None
        d = self._d
        query = (
            f"SELECT (SELECT min(wake_at) FROM {d.t}runs WHERE status = 'waiting' "
            f"AND queue{d.among('queues')} AND wake_at > %(after)s), (SELECT "
            f"min(next_at) FROM {d.t}schedules WHERE queue{d.among('queues')} "
            "AND next_at > %(after)s)"
        )
        params = {"queues": d.array(names), "after": -math.inf if after is None else after}

        def work() -> Op[float | None]:
            row = (yield Sql(query, params)).one()
            times = [float(t) for t in row or () if t is not None]
            return min(times) if times else None

        return await self._run("read when runs fall due", work)

    async def wait_for_runs(self, timeout: float) -> None:
        """Return when this process queued, answered for a worker, handed back or ended a
        run, or after ``timeout`` seconds; spurious returns are allowed."""
        await self._wakeups.wait(timeout)
