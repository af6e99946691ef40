"""The core's retention: deleting runs that ended long ago, with everything that is theirs.

A prune deletes *trees*: a top-level run (or one whose parent is gone) of the statuses asked
for, last updated before the cutoff, together with every descendant (its child runs,
theirs, …), their journals (steps, interrupts, checkpoints) and their events. A tree is
deleted only when every run in it has ended (:data:`~agency_runtime._types.PRUNABLE_STATUSES`)
and none was updated since the cutoff: a run that is queued, running, waiting or paused is
never deleted, nor any run above it, and a child run is never deleted while its parent
stays. Scheduled runs are ordinary runs (``NAME@ISO-TIME``): pruning them removes a
schedule's history, never the schedule.

Each batch is one transaction: it looks at the next :data:`PRUNE_BATCH` runs of those
statuses and age, in insertion order after the last batch's, and deletes at most that many
runs (but a bigger tree whole, never split). So a large prune never holds one long
transaction, each batch reads only the runs it looks at (never the whole table again), and a
concurrent claim, resume or event waits at most one batch. The cutoff is taken once, on the
store's clock (the server's on a PostgreSQL store without one), when the prune starts.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..._types import PRUNABLE_STATUSES
from ._base import CoreBase
from ._program import Op, Sql

__all__ = ["PRUNE_BATCH", "RetentionCore"]

PRUNE_BATCH = 500
"""How many runs one transaction of a prune looks at, and deletes at most (a bigger tree is
deleted whole)."""

_OWNED = ("steps", "interrupts", "checkpoints")
"""The tables whose rows belong to one run (keyed by ``run_id`` first), beside ``events``."""

_FIRST_SEQ = -(2**63)
"""Before every run's insertion order (SQLite's ``rowid``, PostgreSQL's ``seq``)."""


class _Batch(NamedTuple):
    """What one batch did: how many runs it deleted, the cutoff, the last candidate it looked
    at (the next batch starts after it), and whether there may be more."""

    deleted: int
    cutoff: float
    after: int
    more: bool


class RetentionCore(CoreBase):
    """:class:`~agency_runtime._store.RunLog`'s ``prune_runs``."""

    async def prune_runs(
        self,
        *,
        older_than: float,
        statuses: Sequence[str] = PRUNABLE_STATUSES,
        batch: int = PRUNE_BATCH,
    ) -> int:
        wanted = [s for s in dict.fromkeys(statuses) if s in PRUNABLE_STATUSES]
        if not wanted:
            return 0
        size = max(1, batch)
        done = _Batch(0, math.nan, _FIRST_SEQ, True)
        deleted = 0
        while done.more:
            work = functools.partial(
                self._prune_batch, done.cutoff, older_than, done.after, wanted, size
            )
            done = await self._run("prune runs", work, tx=True)
            deleted += done.deleted
        return deleted

    def _prune_batch(
        self, cutoff: float, older_than: float, after: int, statuses: Sequence[str], batch: int
    ) -> Op[_Batch]:
        """One transaction: the candidates after ``after``, their trees, and the trees that
        may go, deleted (``cutoff``: NaN in the first batch, which takes it)."""
        d = self._d
        t = d.t
        if math.isnan(cutoff):
            cutoff = (yield from self._now()) - older_than
        params = {"statuses": d.array(statuses), "cutoff": cutoff, "after": after, "limit": batch}
        # The runs in insertion order from the cursor (not from the status index, which would
        # read every old run again each batch, and sort them), then those whose parent is
        # gone: top-level runs and orphans are the roots of the trees a prune deletes.
        candidates = (
            yield Sql(
                f"SELECT run_id, {d.seq}, parent_id FROM {t}runs "
                f"WHERE {d.unindexed}status{d.among('statuses')} AND updated_at < %(cutoff)s "
                f"AND {d.seq} > %(after)s ORDER BY {d.seq} LIMIT %(limit)s",
                params,
            )
        ).rows
        if not candidates:
            return _Batch(0, cutoff, after, False)
        parents = sorted({str(row[2]) for row in candidates if row[2] is not None})
        present: set[str] = set()
        if parents:
            found = yield Sql(
                f"SELECT run_id FROM {t}runs WHERE run_id{d.among('parents')}",
                {"parents": d.array(parents)},
            )
            present = {str(row[0]) for row in found.rows}
        roots = [str(row[0]) for row in candidates if row[2] is None or row[2] not in present]
        if not roots:  # children of runs that stay, every one
            return _Batch(0, cutoff, int(candidates[-1][1]), len(candidates) == batch)
        # Each candidate's tree (UNION, not UNION ALL: a parent cycle a damaged store may
        # hold ends), then every run of those trees as it is now, locked in one order (two
        # prunes at once never deadlock; a claim or resume of one of them waits for this).
        trees = (
            yield Sql(
                f"WITH RECURSIVE tree(root, run_id) AS (SELECT run_id, run_id FROM {t}runs "
                f"WHERE run_id{d.among('roots')} UNION SELECT tree.root, c.run_id "
                f"FROM {t}runs c JOIN tree ON c.parent_id = tree.run_id) "
                "SELECT root, run_id FROM tree",
                {"roots": d.array(roots)},
            )
        ).rows
        members: dict[str, list[str]] = {root: [] for root in roots}
        for root, run_id in trees:
            members[str(root)].append(str(run_id))
        everyone = sorted({run for runs in members.values() for run in runs})
        current = {
            str(row[0]): (str(row[1]), float(row[2]))
            for row in (
                yield Sql(
                    f"SELECT run_id, status, updated_at FROM {t}runs "
                    f"WHERE run_id{d.among('runs')} ORDER BY run_id{d.for_update}",
                    {"runs": d.array(everyone)},
                )
            ).rows
        }
        doomed: list[str] = []
        last = after
        for run_id, seq, _ in candidates:
            tree = members.get(str(run_id))  # None: a child of a run that stays
            if tree is not None and doomed and len(doomed) + len(tree) > batch:
                break  # the next batch starts with this tree
            last = int(seq)
            if tree is not None and all(
                (now := current.get(run)) is not None
                and now[0] in PRUNABLE_STATUSES
                and now[1] < cutoff
                for run in tree
            ):
                doomed += tree
        gone = (yield from self._delete_runs(doomed)) if doomed else 0
        more = len(candidates) == batch or last != int(candidates[-1][1])
        return _Batch(gone, cutoff, last, more)

    def _delete_runs(self, run_ids: list[str]) -> Op[int]:
        """Delete the runs ``run_ids`` and every row that is theirs; how many runs."""
        d = self._d
        t = d.t
        params: dict[str, Any] = {"runs": d.array(run_ids)}
        for table in _OWNED:
            yield Sql(f"DELETE FROM {t}{table} WHERE run_id{d.among('runs')}", params)
        # Two statements, each on one of the events' partial indexes (taken and not).
        for taken in ("IS NULL", "IS NOT NULL"):
            yield Sql(
                f"DELETE FROM {t}events WHERE run_id{d.among('runs')} AND taken_by {taken}",
                params,
            )
        return (yield Sql(f"DELETE FROM {t}runs WHERE run_id{d.among('runs')}", params)).rowcount
