"""The core's journal: loading it, committing steps, interrupts, checkpoints and rewinds."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any

from ..._types import (
    Checkpoint,
    InterruptAnswer,
    InterruptResponse,
    Journal,
    JournalEntry,
    JournalPage,
)
from .._rows import STEP_COLUMNS, journal_from_rows
from ._base import CoreBase, Refused, json_rows
from ._program import Op, Sql, changed_one

__all__ = ["JournalCore"]


class JournalCore(CoreBase):
    """:class:`~agency_runtime._store.RunLog`'s journal operations."""

    async def load_journal(self, run_id: str) -> Journal:
        t = self._d.t
        params = {"run": run_id}
        if self._d.folds:
            return await self._run(
                f"load the journal of run {run_id!r}", lambda: self._load_folded(run_id)
            )

        def work() -> Op[Journal]:
            steps = yield Sql(
                f"SELECT {', '.join(STEP_COLUMNS)} FROM {t}steps WHERE run_id = %(run)s "
                "ORDER BY seq",
                params,
            )
            answers = yield Sql(
                f"SELECT seq, interrupt, response, answered_at FROM {t}interrupts "
                "WHERE run_id = %(run)s ORDER BY seq",
                params,
            )
            checkpoints = yield Sql(
                f"SELECT body FROM {t}checkpoints WHERE run_id = %(run)s ORDER BY seq", params
            )
            return journal_from_rows(run_id, steps.rows, answers.rows, checkpoints.rows)

        # No transaction: at READ COMMITTED (PostgreSQL's level) each SELECT would take its own
        # snapshot inside one anyway, so BEGIN and COMMIT would only add two round trips.
        return await self._run(f"load the journal of run {run_id!r}", work, several=True)

    @functools.cached_property
    def _load_folded_sql(self) -> str:
        t = self._d.t

        # Each row: its table (0 steps, 1 interrupts, 2 checkpoints), then a step's columns;
        # an interrupt's (seq, interrupt, response, answered_at) in seq, path, name and
        # created_at, a checkpoint's body in path.
        def nulls(n: int) -> str:
            return ", ".join(["NULL"] * n)

        return (
            f"SELECT 0 AS k, {', '.join(STEP_COLUMNS)} FROM {t}steps WHERE run_id = %(run)s "
            f"UNION ALL SELECT 1, NULL, interrupt, seq, response, {nulls(8)}, answered_at "
            f"FROM {t}interrupts WHERE run_id = %(run)s "
            f"UNION ALL SELECT 2, NULL, body, seq, {nulls(10)} "
            f"FROM {t}checkpoints WHERE run_id = %(run)s ORDER BY k, seq"
        )

    def _load_folded(self, run_id: str) -> Op[Journal]:
        """:meth:`load_journal` in one statement (a dialect that :attr:`~.Dialect.folds`):
        the steps, interrupts and checkpoints in one snapshot, in one round trip."""
        rows = (yield Sql(self._load_folded_sql, {"run": run_id})).rows
        steps = [row[1:] for row in rows if row[0] == 0]
        answers = [(row[3], row[2], row[4], row[13]) for row in rows if row[0] == 1]
        checkpoints = [(row[2],) for row in rows if row[0] == 2]
        return journal_from_rows(run_id, steps, answers, checkpoints)

    async def load_journal_page(
        self, run_id: str, *, after_seq: int | None = None, limit: int = 200
    ) -> JournalPage:
        t = self._d.t
        after = -1 if after_seq is None else after_seq

        def work() -> Op[JournalPage]:
            params = {"run": run_id, "after": after, "n": limit + 1}
            steps = (
                yield Sql(
                    f"SELECT {', '.join(STEP_COLUMNS)} FROM {t}steps WHERE run_id = %(run)s "
                    "AND seq > %(after)s ORDER BY seq LIMIT %(n)s",
                    params,
                )
            ).rows
            more = len(steps) > limit
            steps = steps[:limit]
            # The window: after ``after`` up to the page's last step (to the end on the last
            # page); the interrupts and checkpoints in it, and the journal's size.
            upto = int(steps[-1][STEP_COLUMNS.index("seq")]) if more else 2**62
            window = {"run": run_id, "after": after, "upto": upto}
            answers = yield Sql(
                f"SELECT seq, interrupt, response, answered_at FROM {t}interrupts "
                "WHERE run_id = %(run)s AND seq > %(after)s AND seq <= %(upto)s ORDER BY seq",
                window,
            )
            checkpoints = yield Sql(
                f"SELECT body FROM {t}checkpoints WHERE run_id = %(run)s "
                "AND seq > %(after)s AND seq <= %(upto)s ORDER BY seq",
                window,
            )
            size = (
                yield Sql(f"SELECT count(*) FROM {t}steps WHERE run_id = %(run)s", {"run": run_id})
            ).one()
            journal = journal_from_rows(run_id, steps, answers.rows, checkpoints.rows)
            return JournalPage.model_construct(
                entries=journal.entries,
                answers=journal.answers,
                checkpoints=journal.checkpoints,
                next_after=upto if more else None,
                size=0 if size is None else int(size[0]),
            )

        return await self._run(f"load a page of the journal of run {run_id!r}", work, several=True)

    async def journal_position(self, run_id: str, index: int) -> int | None:
        query = (
            f"SELECT seq FROM {self._d.t}steps WHERE run_id = %(run)s ORDER BY seq "
            "LIMIT 1 OFFSET %(index)s"
        )

        def work() -> Op[int | None]:
            row = (yield Sql(query, {"run": run_id, "index": max(0, index)})).one()
            return None if row is None else int(row[0])

        return await self._run(f"find a position in the journal of run {run_id!r}", work)

    @functools.cached_property
    def _commit_step_sqls(self) -> dict[tuple[bool, ...], str]:
        """A step's statement for each combination of empty :data:`_NULLABLE` columns (the
        key: which of them are ``None``), those written as a literal ``NULL``.

        One statement: the lease check locks the run's row (FOR SHARE), so a claimant
        taking the run over waits for this commit, or this insert sees the lease gone and
        writes nothing. No ``None`` is bound: sqlite3 binds one only after looking for an
        adapter, which formats and drops an ``AttributeError`` (a trivial step has three,
        a seventh of its commit's instructions). Built once: they are every step's."""
        d = self._d
        statements = {}
        for nulls in itertools.product((False, True), repeat=len(_NULLABLE)):
            null = {column for column, empty in zip(_NULLABLE, nulls, strict=True) if empty}
            values = ", ".join("NULL" if c in null else f"%({c})s" for c in STEP_COLUMNS)
            statements[nulls] = (
                f"WITH lease AS ({self._holds(d.for_share)}) INSERT INTO {d.t}steps "
                f"({', '.join(STEP_COLUMNS)}) SELECT {values} FROM lease"
            )
        return statements

    async def commit_step(self, entry: JournalEntry, *, owner: str) -> bool:
        # The entry's fields are the step's columns (a test holds them equal): its __dict__,
        # not a getattr per column, on every step.
        values = entry.__dict__
        query = self._commit_step_sqls[_nulls(values)]
        params = {**values, "run": values["run_id"], "owner": owner}

        def what() -> str:
            return f"commit step {entry.path!r} of run {entry.run_id!r}"

        changed = self._write_now(what, query, params, check="throttled")  # SQLite: right here
        if changed is None:
            changed = (await self._one(what, Sql(query, params), check="throttled")).rowcount
        return changed == 1

    @functools.cached_property
    def _commit_steps_sql(self) -> str:
        """:meth:`commit_steps`'s statement: the rows as one JSON parameter, each written when
        its own owner holds its run's lease (the same check as one step's, row by row; the
        runs' rows locked as one step's is), returning the keys of the rows written."""
        d = self._d
        columns = ", ".join(STEP_COLUMNS)
        typed = (("owner", "text"), *((c, _STEP_TYPES.get(c, "text")) for c in STEP_COLUMNS))
        return (
            f"WITH x AS (SELECT * FROM {d.rows_of('rows', typed)}), "
            f"lease AS (SELECT run_id, lease_owner FROM {d.t}runs "
            f"WHERE run_id IN (SELECT run_id FROM x) AND status = 'running'{d.for_share}) "
            f"INSERT INTO {d.t}steps ({columns}) "
            f"SELECT {', '.join(f'x.{c}' for c in STEP_COLUMNS)} FROM x JOIN lease "
            "ON lease.run_id = x.run_id AND lease.lease_owner = x.owner "
            "RETURNING run_id, path"
        )

    async def commit_steps(self, commits: list[tuple[JournalEntry, str]]) -> list[bool]:
        """Commit several steps, each ``(entry, owner)``, in one statement: whether each was
        written (its owner held its run's lease), in order. As :meth:`commit_step` for each,
        but one round trip and one transaction; a row the database refuses (a step already
        journaled) fails them all, so callers then commit each alone."""
        rows = [{**entry.__dict__, "owner": owner} for entry, owner in commits]
        params = {"rows": json_rows(rows)}
        query = self._commit_steps_sql

        def work() -> Op[set[tuple[str, str]]]:
            written = yield Sql(query, params)
            return {(str(run_id), str(path)) for run_id, path in written.rows}

        keys = await self._run(f"commit {len(commits)} steps", work)
        return [(entry.run_id, entry.path) in keys for entry, _ in commits]

    async def record_interrupts(self, answers: list[InterruptAnswer], *, owner: str) -> bool:
        if not answers:
            return True
        d = self._d
        run_id = answers[0].run_id
        latest = {(a.run_id, a.interrupt.interrupt_id): a for a in answers}  # the last one wins
        rows = [
            {"r": a.run_id, "i": a.interrupt.interrupt_id, "s": a.seq,
             "b": a.interrupt.model_dump_json()}
            for a in latest.values()
        ]  # fmt: skip
        query = (
            f"WITH lease AS ({self._holds(d.for_share)}) INSERT INTO {d.t}interrupts "
            "(run_id, interrupt_id, seq, interrupt, response, answered_at) "
            "SELECT x.r, x.i, x.s, x.b, NULL, NULL FROM lease, "
            f"{d.rows_of('rows', (('r', 'text'), ('i', 'text'), ('s', 'bigint'), ('b', 'text')))} "
            "WHERE true ON CONFLICT (run_id, interrupt_id) DO UPDATE SET seq = EXCLUDED.seq, "
            "interrupt = EXCLUDED.interrupt, response = NULL, answered_at = NULL"
        )
        params = {"run": run_id, "owner": owner, "rows": json_rows(rows)}

        def work() -> Op[bool]:
            # Every answer is written when the lease is held, none when it is not.
            return (yield Sql(query, params)).rowcount > 0

        return await self._run(f"record the interrupts of run {run_id!r}", work, check="always")

    async def answer_interrupts(
        self, run_id: str, responses: dict[str, InterruptResponse], *, enqueue: bool = False
    ) -> list[str]:
        d = self._d
        keys = list(responses)
        rows = [{"k": key, "b": responses[key].model_dump_json()} for key in keys]
        params = {"run": run_id, "now": self._now_param(), "rows": json_rows(rows),
                  "enqueue": enqueue}  # fmt: skip
        bump = (
            f"UPDATE {d.t}runs SET version = version + 1, updated_at = {d.now}, "
            "status = CASE WHEN %(enqueue)s AND status = 'paused' THEN 'queued' "
            "ELSE status END, "
            "queue = CASE WHEN %(enqueue)s AND status = 'paused' "
            "THEN COALESCE(queue, 'default') ELSE queue END "
            "WHERE run_id = %(run)s"
        )
        if enqueue:
            bump = d.notifying(bump, "run_id")

        def work() -> Op[list[str]]:
            if keys:
                updated = yield Sql(
                    f"UPDATE {d.t}interrupts AS i SET response = x.b, answered_at = {d.now} "
                    f"FROM {d.rows_of('rows', (('k', 'text'), ('b', 'text')))} "
                    "WHERE i.run_id = %(run)s AND i.interrupt_id = x.k AND i.response IS NULL "
                    "RETURNING interrupt_id",
                    params,
                )
                answered = {key for (key,) in updated.rows}
                refused = [key for key in keys if key not in answered]
                if refused:
                    raise Refused(refused)  # rolls the whole transaction back
            yield Sql(bump, params)
            return []

        try:
            await self._run(f"answer the interrupts of run {run_id!r}", work, tx=bool(keys))
        except Refused as refusal:
            return refusal.keys
        if enqueue:
            self._wakeups.ring()
        return []

    async def save_checkpoint(self, checkpoint: Checkpoint, *, owner: str) -> bool:
        d = self._d
        run_id = checkpoint.run_id or ""
        params = {"run": run_id, "owner": owner, "id": checkpoint.checkpoint_id,
                  "seq": checkpoint.seq, "body": checkpoint.model_dump_json()}  # fmt: skip
        query = (
            f"WITH lease AS ({self._holds(d.for_share)}) INSERT INTO {d.t}checkpoints "
            "(run_id, checkpoint_id, seq, body) SELECT %(run)s, %(id)s, %(seq)s, %(body)s "
            "FROM lease WHERE true ON CONFLICT (run_id, checkpoint_id) DO UPDATE "
            "SET seq = EXCLUDED.seq, body = EXCLUDED.body"
        )
        what = f"save checkpoint {checkpoint.checkpoint_id!r}"
        return await self._run(what, lambda: changed_one(query, params), check="always")

    async def rewind(
        self,
        run_id: str,
        seq: int,
        *,
        owner: str,
        overrides: str | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        d = self._d
        t = d.t
        params = {"run": run_id, "owner": owner, "seq": seq, "overrides": overrides}

        def work() -> Op[bool]:
            if (yield Sql(self._holds(d.for_update), params)).one() is None:
                return False
            pico, tokens = yield from self._drop_steps(run_id, "seq > %(seq)s", params)
            yield Sql(
                f"UPDATE {t}runs SET overrides = COALESCE(%(overrides)s, overrides), "
                "unjournaled_pico = unjournaled_pico + %(pico)s, "
                "unjournaled_tokens = unjournaled_tokens + %(tokens)s WHERE run_id = %(run)s",
                {**params, "pico": pico, "tokens": tokens},
            )
            for table in ("interrupts", "checkpoints"):
                yield Sql(f"DELETE FROM {t}{table} WHERE run_id = %(run)s AND seq > %(seq)s",
                          params)  # fmt: skip
            if checkpoint is not None:
                yield Sql(
                    f"INSERT INTO {t}checkpoints (run_id, checkpoint_id, seq, body) "
                    "VALUES (%(run)s, %(id)s, %(cseq)s, %(body)s) "
                    "ON CONFLICT (run_id, checkpoint_id) DO UPDATE "
                    "SET seq = EXCLUDED.seq, body = EXCLUDED.body",
                    {"run": run_id, "id": checkpoint.checkpoint_id, "cseq": checkpoint.seq,
                     "body": checkpoint.model_dump_json()},
                )  # fmt: skip
            return True

        return await self._run(f"rewind run {run_id!r}", work, tx=True, check="always")


_NULLABLE = ("locals", "scopes", "deltas", "error")
"""The step columns that may be ``NULL`` (see ``JournalCore._commit_step_sqls``)."""

_STEP_TYPES = {"seq": "bigint", "cost_pico": "bigint", "tokens": "bigint",
               "created_at": "double precision"}  # fmt: skip
"""The SQL types of the step columns that are not text (``JournalCore._commit_steps_sql``)."""


def _nulls(values: Mapping[str, Any]) -> tuple[bool, ...]:
    """Which of :data:`_NULLABLE` ``values`` leaves empty, in that order."""
    return (
        values["locals"] is None,
        values["scopes"] is None,
        values["deltas"] is None,
        values["error"] is None,
    )
