"""Pruning (DESIGN §11.7): ``agency.runs.prune`` and the store's ``prune_runs``, on every
store backend, and a worker's ``prune_after``.

A prune deletes the runs that ended (completed, failed, cancelled) before the cutoff, with
every row that is theirs (steps, interrupts, checkpoints, events) and their child runs; it
never deletes a run that has not ended, nor a run above one, nor a child whose parent stays.
Time is the store's fake clock, moved by the test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import anyio
import pytest

from agency_runtime import (
    InvalidArgumentError,
    ResumableScope,
    RunRecord,
    Schedule,
    Store,
    StoreError,
    Worker,
    agency,
)
from agency_runtime._store._core import Sql, StoreCore
from agency_runtime._store._core._program import Op
from agency_runtime._types import RunStatus
from agency_runtime.testing import FakeClock
from tests.support import serving, wait_for

pytestmark = pytest.mark.anyio

DAY = 86_400.0
_TABLES = ("runs", "steps", "interrupts", "checkpoints", "events")
"""Every table with rows of one run (keyed by ``run_id``)."""


@pytest.fixture
def clocked(fake_clock: FakeClock, make_store: Callable[..., Store]) -> tuple[FakeClock, Store]:
    """The runtime's fake clock, and a store of this test's backend stamping times on it."""
    return fake_clock, make_store(clock=fake_clock)


# -- runs made by real entries -------------------------------------------------------------


async def _child(n: int) -> int:
    async def body(s: ResumableScope) -> int:
        return await s.step(lambda: n + 1, name="add")

    return await agency.with_resumable_scope("child", body)


async def _parent(n: int) -> int:
    """Two steps, a checkpoint and a child run, then completed."""

    async def body(s: ResumableScope) -> int:
        first = await s.step(lambda: n, name="first")
        await agency.checkpoint()
        child = await agency.run(_child, first)
        return await s.step(lambda: int(child.value) * 2, name="last")

    return await agency.with_resumable_scope("parent", body)


async def _asks(n: int) -> str:
    """A step and a child run, then a question: paused (a live parent of a finished child)."""

    async def body(s: ResumableScope) -> str:
        await s.step(lambda: n, name="before")
        await agency.run(_child, n)
        answer = await agency.interrupt("approve", "go on?")
        return "yes" if answer.approved else "no"

    return await agency.with_resumable_scope("asks", body)


def _fails(n: int) -> int:
    raise ValueError(f"no {n}")


async def _counts(store: Store, run_ids: Sequence[str]) -> dict[str, int]:
    """How many rows each table holds for ``run_ids`` (read with the store's own SQL)."""
    core = cast(StoreCore, store)
    d = core._d

    def work() -> Op[dict[str, int]]:
        counts: dict[str, int] = {}
        for table in _TABLES:
            row = (
                yield Sql(
                    f"SELECT count(*) FROM {d.t}{table} WHERE run_id{d.among('ids')}",
                    {"ids": d.array(list(run_ids))},
                )
            ).one()
            assert row is not None
            counts[table] = int(row[0])
        return counts

    return await core._run("count rows", work)


async def _ids(store: Store) -> set[str]:
    return {r.run_id for r in await store.list_runs(limit=-1)}


async def test_old_runs_that_ended_go_with_their_journals_events_and_children(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    assert (await agency.run(_parent, 1, run_id="done", store=store)).value == 4
    assert (await agency.run(_fails, 2, run_id="failed", store=store)).status == "failed"
    await store.send_event("failed", "nudge", "1")  # a failed run may be sent events
    assert (await agency.run(_asks, 3, run_id="asking", store=store)).status == "paused"
    await store.send_event("asking", "nudge", "2")
    assert (await agency.run(_asks, 4, run_id="stopped", store=store)).status == "paused"
    await agency.runs.cancel("stopped", store=store)
    old = ["done", "done/parent/run#0", "failed", "stopped", "stopped/asks/run#0"]
    before = await _counts(store, old)
    assert before["runs"] == 5
    assert before["steps"] >= 6
    assert before["checkpoints"] >= 1
    assert before["events"] == 1
    assert before["interrupts"] == 1  # the cancelled run's question

    clock.advance(31 * DAY)
    assert (await agency.run(_parent, 5, run_id="recent", store=store)).value == 12
    deleted = await agency.runs.prune(older_than="30d", store=store)

    assert deleted == 5
    assert await _counts(store, old) == dict.fromkeys(_TABLES, 0)
    # A paused run and its finished child stay (the child's parent has not ended), as does
    # what ended since the cutoff.
    assert await _ids(store) == {"asking", "asking/asks/run#0", "recent", "recent/parent/run#0"}
    kept = await _counts(store, ["asking", "asking/asks/run#0"])
    assert kept["steps"] >= 3
    assert (kept["interrupts"], kept["events"]) == (1, 1)
    assert (await store.load_journal("recent")).entries
    assert await agency.runs.prune(older_than="30d", store=store) == 0  # nothing left to do


async def _stored(
    store: Store,
    run_id: str,
    status: RunStatus,
    parent: RunRecord | None = None,
) -> RunRecord:
    """A run stored with ``status`` (a child of ``parent`` when given), at the store's now."""
    tree: dict[str, Any] = {}
    if parent is not None:
        tree = {"parent_id": parent.run_id, "root_id": parent.root_id or parent.run_id,
                "depth": parent.depth + 1}  # fmt: skip
    record = RunRecord.model_validate(
        {"run_id": run_id, "status": "running", "entry": "m:f", "arguments": "{}",
         "created_at": 0.0, **tree}
    )  # fmt: skip
    claim = await store.claim_run(record, owner="o", lease_seconds=30)
    assert claim.acquired
    if status == "running":
        return claim.record
    if status == "queued":
        ended = claim.record.model_copy(update={"status": "queued"})
    elif status == "waiting":
        ended = claim.record.model_copy(update={"status": "waiting", "wake_at": 1e10})
    else:
        ended = claim.record.model_copy(update={"status": status})
    assert await store.finish_run(ended, owner="o")
    stored = await store.get_run(run_id)
    assert stored is not None
    assert stored.status == status
    return stored


async def test_a_run_that_has_not_ended_is_never_pruned_nor_the_runs_above_it(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    for status in ("queued", "running", "waiting", "paused"):
        await _stored(store, status, status)
        # An old parent that ended, whose child has not: both stay.
        top = await _stored(store, f"top-of-{status}", "completed")
        middle = await _stored(store, f"middle-of-{status}", "failed", top)
        await _stored(store, f"under-{status}", status, middle)
        await _stored(store, f"sibling-of-{status}", "completed", top)
    everything = await _ids(store)
    clock.advance(400 * DAY)
    assert await agency.runs.prune(older_than=0, store=store) == 0
    assert await _ids(store) == everything


async def test_a_tree_goes_only_when_every_run_in_it_is_old(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    top = await _stored(store, "top", "completed")
    await _stored(store, "old-child", "completed", top)
    late_top = await _stored(store, "late-top", "completed")
    clock.advance(10 * DAY)
    await _stored(store, "late-child", "cancelled", late_top)  # ended later than its parent
    clock.advance(5 * DAY)
    assert await agency.runs.prune(older_than=timedelta(days=7), store=store) == 2
    assert await _ids(store) == {"late-top", "late-child"}
    clock.advance(10 * DAY)
    assert await agency.runs.prune(older_than=7 * DAY, store=store) == 2
    assert await _ids(store) == set()


async def test_a_child_whose_parent_stays_stays(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    live = await _stored(store, "live", "running")
    await _stored(store, "done-child", "completed", live)
    young = await _stored(store, "young", "completed")
    failed = await _stored(store, "failed", "failed")
    await _stored(store, "child-of-failed", "completed", failed)
    clock.advance(2 * DAY)
    await _stored(store, "young-child", "completed", young)  # ended after its parent
    clock.advance(2 * DAY)
    # Only completed runs: the failed tree stays, children of the failed run with it.
    assert await agency.runs.prune(older_than="3d", status="completed", store=store) == 0
    assert await _ids(store) >= {"live", "done-child", "failed", "child-of-failed"}
    assert await agency.runs.prune(older_than="1d", status=["completed"], store=store) == 2
    assert "young" not in await _ids(store)
    assert await agency.runs.prune(older_than="1d", status={"failed"}, store=store) == 2
    assert await _ids(store) == {"live", "done-child"}


async def test_the_status_filter_picks_the_runs_that_go(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    for status in ("completed", "failed", "cancelled"):
        for n in range(2):
            await _stored(store, f"{status}-{n}", status)
    clock.advance(DAY)
    assert await agency.runs.prune(older_than=60, status="cancelled", store=store) == 2
    assert await agency.runs.prune(older_than=60, status=("failed",), store=store) == 2
    assert await _ids(store) == {"completed-0", "completed-1"}
    assert await agency.runs.prune(older_than=60, store=store) == 2
    assert await _ids(store) == set()


async def test_the_cutoff_is_the_store_clock_minus_the_age(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    await _stored(store, "a", "completed")
    clock.advance(3600)
    await _stored(store, "b", "completed")
    clock.advance(1800)
    assert await agency.runs.prune(older_than="1h", store=store) == 1  # a is 1.5 h old
    assert await _ids(store) == {"b"}
    assert await agency.runs.prune(older_than="45m", store=store) == 0  # b is 30 min old
    assert await agency.runs.prune(older_than="30m", store=store) == 0  # not *more* than
    clock.advance(1)
    assert await agency.runs.prune(older_than="1800s", store=store) == 1


async def test_a_big_prune_goes_in_batches_and_counts_every_run(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    keep = await _stored(store, "keep", "paused")
    for n in range(7):
        top = await _stored(store, f"t{n}", ("completed", "failed", "cancelled")[n % 3])
        if n % 2:
            child = await _stored(store, f"t{n}/c", "completed", top)
            await _stored(store, f"t{n}/c/g", "completed", child)
        if n == 3:
            await _stored(store, "t3/live", "waiting", top)  # this tree stays whole
    await _stored(store, "keep/c", "completed", keep)
    clock.advance(DAY)
    batches: list[int] = []
    core = cast(StoreCore, store)
    real = core._run

    async def counted(what: str, work: Callable[[], Op[Any]], **kwargs: Any) -> Any:
        value = await real(what, work, **kwargs)
        if what == "prune runs":
            batches.append(value.deleted)
        return value

    core._run = counted  # type: ignore[method-assign]
    try:
        deleted = await store.prune_runs(older_than=60, batch=2)
    finally:
        del core._run
    # t0..t6 but t3 (6) and the children and grandchildren of t1 and t5 (4); t3's tree
    # stays.
    assert deleted == 10
    assert await _ids(store) == {"keep", "keep/c", "t3", "t3/c", "t3/c/g", "t3/live"}
    # In creation order, two runs looked at a time, a tree never split: t0; t1's tree; t2;
    # t3 (stays) and t3/c; t3/c/g and t4; t5's tree; t6 and keep/c; then nothing more.
    assert batches == [1, 3, 1, 0, 1, 3, 1, 0]
    assert max(batches) <= 3  # a tree of three is never split, nor joined to more
    assert await store.prune_runs(older_than=60, batch=1) == 0


async def test_a_run_whose_parent_is_gone_is_pruned_as_a_top_level_run(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    gone = RunRecord.model_validate(
        {"run_id": "gone", "status": "completed", "entry": "m:f", "arguments": "{}",
         "created_at": 0.0}
    )  # fmt: skip
    orphan = await _stored(store, "orphan", "completed", gone)
    await _stored(store, "orphan/c", "failed", orphan)
    clock.advance(DAY)
    assert await agency.runs.prune(older_than=60, store=store) == 2
    assert await _ids(store) == set()


async def test_a_schedule_s_fired_runs_are_pruned_and_the_schedule_stays(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    now = clock.time()
    plan = Schedule(name="nightly", entry="m:f", arguments="{}", every=60.0, next_at=now)
    await store.put_schedule(plan)
    fired = RunRecord.model_validate(
        {"run_id": "nightly@1", "status": "queued", "entry": "m:f", "arguments": "{}",
         "created_at": now, "queue": "default"}
    )  # fmt: skip
    assert await store.fire_schedule("nightly", due=now, next_at=now + 60, run=fired)
    claim = await store.claim_run(fired, owner="o", lease_seconds=30)
    done = claim.record.model_copy(update={"status": "completed"})
    assert await store.finish_run(done, owner="o")
    clock.advance(DAY)
    assert await agency.runs.prune(older_than="1h", store=store) == 1
    assert await _ids(store) == set()
    kept = await store.get_schedule("nightly")
    assert kept is not None
    assert kept.next_at == now + 60


@pytest.mark.parametrize(
    ("older_than", "message"),
    [
        ("3w", "must be a duration like '30d', '12h', '90m' or '45s'"),
        ("", "must be a duration like"),
        ("-1d", "must be a duration like"),
        ("thirty days", "must be a duration like"),
        ("99999999d", "at most 36525d"),
        (-5, "must be a number of seconds >= 0"),
        (float("nan"), "must be a number of seconds >= 0"),
        (timedelta(days=-1), "must be a number of seconds >= 0"),
        (True, "must be a number of seconds, a datetime.timedelta or a duration"),
        (None, "must be a number of seconds, a datetime.timedelta or a duration"),
        ([30], "must be a number of seconds, a datetime.timedelta or a duration"),
    ],
)
async def test_a_bad_age_is_refused_saying_what_to_write(
    store: Store, older_than: object, message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="older_than") as caught:
        await agency.runs.prune(older_than=older_than, store=store)  # type: ignore[arg-type]
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("paused", "status 'paused' cannot be pruned: a paused run has not ended"),
        (["completed", "running"], "status 'running' cannot be pruned"),
        ("done", "status must be one of completed, failed or cancelled"),
        ([], "status must be one of completed, failed or cancelled, or a list of them"),
        (3, "status must be one of completed, failed or cancelled, or a list of them"),
        ([None], "status must be one of completed, failed or cancelled (or a list of them)"),
    ],
)
async def test_a_status_that_cannot_be_pruned_is_refused(
    store: Store, status: object, message: str
) -> None:
    await _stored(store, "done", "completed")
    with pytest.raises(InvalidArgumentError) as caught:
        await agency.runs.prune(older_than=0, status=status, store=store)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert await _ids(store) == {"done"}  # nothing was deleted


async def test_the_store_ignores_statuses_that_cannot_be_pruned(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    await _stored(store, "p", "paused")
    clock.advance(DAY)
    assert await store.prune_runs(older_than=0, statuses=["paused", "running"]) == 0
    assert await _ids(store) == {"p"}


# -- a worker's prune_after ------------------------------------------------------------------


async def test_a_worker_prunes_at_start_and_then_every_prune_every(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    await _stored(store, "old", "completed")
    clock.advance(2 * DAY)
    await _stored(store, "newer", "failed")
    await _stored(store, "paused", "paused")
    worker = Worker(store, poll=0.05, prune_after="1d", prune_every=3600)
    assert worker.prune_after == DAY
    async with serving(worker):
        await wait_for(lambda: worker.runs_pruned == 1)
        assert await _ids(store) == {"newer", "paused"}
        clock.advance(DAY - 3600)  # the hourly prunes come; "newer" is not a day old yet
        await anyio.wait_all_tasks_blocked()
        assert await _ids(store) == {"newer", "paused"}
        clock.advance(3600 + 1)  # the next hourly prune finds it over a day old
        await wait_for(lambda: worker.runs_pruned == 2)
        assert await _ids(store) == {"paused"}
    assert not worker.serving  # draining stopped the pruning too


async def test_a_worker_whose_prune_fails_logs_it_and_serves_on(
    clocked: tuple[FakeClock, Store], caplog: pytest.LogCaptureFixture
) -> None:
    clock, store = clocked
    await _stored(store, "old", "completed")
    clock.advance(2 * DAY)
    failures = {"left": 1}
    real = store.prune_runs

    async def flaky(**kwargs: Any) -> int:
        if failures["left"]:
            failures["left"] -= 1
            raise StoreError("the database is restarting")
        return await real(**kwargs)

    store.prune_runs = flaky  # type: ignore[method-assign]
    worker = Worker(store, poll=0.05, prune_after=DAY, prune_every=60)
    with caplog.at_level(logging.WARNING, logger="agency_runtime.worker"):
        async with serving(worker):
            await wait_for(lambda: "cannot prune runs" in caplog.text)
            assert worker.serving
            await anyio.wait_all_tasks_blocked()
            clock.advance(60)
            await wait_for(lambda: worker.runs_pruned == 1)
    assert "the database is restarting" in caplog.text
    assert await _ids(store) == set()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prune_after": "soon"}, "Worker: prune_after must be a duration like"),
        ({"prune_after": -1}, "Worker: prune_after must be a number of seconds >= 0"),
        ({"prune_after": "1d", "prune_every": 0}, "Worker: prune_every must be a number"),
    ],
)
def test_a_worker_refuses_a_bad_prune_option(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Worker("memory://", **kwargs)


def test_a_worker_prunes_nothing_unless_told() -> None:
    assert Worker("memory://").prune_after is None
