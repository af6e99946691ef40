"""Queued runs: ``agency.enqueue``, ``agency.runs.wait``, ``agency.queues`` and the store's
``RunQueue`` protocol (claims, priorities, limits, expired leases), on every store backend."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from agency_runtime import (
    InvalidArgumentError,
    RunConflictError,
    RunNotFoundError,
    RunRecord,
    RunWaitTimeoutError,
    Store,
    agency,
    approve,
)
from agency_runtime.testing import FakeClock

pytestmark = pytest.mark.anyio


@agency.entry
def add(a: int, b: int) -> int:
    return a + b


def _record(
    run_id: str, *, queue: str = "default", priority: int = 0, at: float = 0.0
) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        status="queued",
        entry=f"{__name__}:add",
        arguments='{"args":[1,2],"kwargs":{}}',
        queue=queue,
        priority=priority,
        created_at=at,
        updated_at=at,
    )


# -- agency.enqueue ------------------------------------------------------------------------


async def test_enqueue_stores_a_queued_run_and_runs_nothing(store: Store) -> None:
    run_id = await agency.enqueue(add, 1, 2, run_id="q-1", queue="math", priority=5, store=store)
    assert run_id == "q-1"
    record = await agency.runs.get("q-1", store=store)
    assert (record.status, record.queue, record.priority) == ("queued", "math", 5)
    assert (record.attempts, record.lease_owner, record.started_at) == (0, None, None)
    assert await store.load_journal("q-1") is not None


async def test_enqueue_gives_an_id_when_none_is_given(store: Store) -> None:
    first = await agency.enqueue(add, 1, 2, store=store)
    second = await agency.enqueue(add, 1, 2, store=store)
    assert first != second
    assert {r.run_id for r in await agency.runs.list(store=store, status="queued")} == {
        first,
        second,
    }


async def test_enqueue_with_a_taken_id_is_idempotent(store: Store) -> None:
    await agency.enqueue(add, 1, 2, run_id="same", store=store)
    assert await agency.enqueue(add, 1, 2, run_id="same", store=store) == "same"
    assert len(await agency.runs.list(store=store)) == 1
    with pytest.raises(RunConflictError, match="stored 2, given 3"):
        await agency.enqueue(add, 1, 3, run_id="same", store=store)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": ""}, "queue name"),
        ({"queue": "a\nb"}, "queue name"),
        ({"queue": 3}, "queue name"),
        ({"priority": True}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"model": ""}, "model"),
        ({"run_id": ""}, "run_id"),
    ],
)
async def test_enqueue_refuses_bad_options(
    store: Store, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        await agency.enqueue(add, 1, 2, store=store, **options)  # type: ignore[arg-type]
    assert await agency.runs.list(store=store) == []


async def test_enqueue_refuses_arguments_that_cannot_be_stored(store: Store) -> None:
    with pytest.raises(InvalidArgumentError):
        await agency.enqueue(add, {1, 2}, 3, store=store)
    assert await agency.runs.list(store=store) == []


# -- the store's claims ---------------------------------------------------------------------


async def test_claims_take_the_highest_priority_then_the_oldest(store: Store) -> None:
    for run_id, priority, at in [("old", 0, 1.0), ("new", 0, 2.0), ("urgent", 9, 3.0)]:
        assert (await store.enqueue_run(_record(run_id, priority=priority, at=at))).created
    await store.enqueue_run(_record("elsewhere", queue="other", priority=99))
    claimed = await store.claim_queued(queues=["default"], owner="w1", lease_seconds=30, limit=2)
    assert [r.run_id for r in claimed] == ["urgent", "old"]
    assert all(r.status == "running" and r.lease_owner == "w1" for r in claimed)
    assert all(r.attempts == 1 and r.started_at is not None for r in claimed)
    rest = await store.claim_queued(queues=["default"], owner="w2", lease_seconds=30, limit=5)
    assert [r.run_id for r in rest] == ["new"]
    assert await store.claim_queued(queues=["default"], owner="w3", lease_seconds=30, limit=5) == []


async def test_claims_of_several_queues_take_the_best_runs_of_them_all(store: Store) -> None:
    """One order over every queue claimed, queued runs and parked runs that fell due alike
    (highest priority, then the oldest); a parked run not yet due, or another queue's run,
    stays."""
    for run_id, wake_at in [("due", 0.0), ("later", 1e11)]:
        await store.enqueue_run(_record(run_id, queue="y", at=1.5 if run_id == "due" else 0.5))
        (claimed,) = await store.claim_queued(queues=["y"], owner="w", lease_seconds=30, limit=1)
        assert claimed.run_id == run_id
        parked = claimed.model_copy(update={"status": "waiting", "wake_at": wake_at})
        assert await store.finish_run(parked, owner="w")
    for run_id, queue, priority, at in [("a", "x", 0, 1.0), ("b", "y", 0, 2.0),
                                        ("c", "y", 5, 3.0), ("d", "x", 0, 4.0),
                                        ("other", "z", 99, 0.0)]:  # fmt: skip
        await store.enqueue_run(_record(run_id, queue=queue, priority=priority, at=at))
    first = await store.claim_queued(queues=["x", "y"], owner="w1", lease_seconds=30, limit=4)
    assert [r.run_id for r in first] == ["c", "a", "due", "b"]
    assert all(r.status == "running" and r.lease_owner == "w1" for r in first)
    rest = await store.claim_queued(queues=["y", "x"], owner="w2", lease_seconds=30, limit=9)
    assert [r.run_id for r in rest] == ["d"]
    later = await store.get_run("later")
    assert later is not None
    assert later.status == "waiting"


async def test_claims_skip_excluded_runs(store: Store) -> None:
    await store.enqueue_run(_record("a", at=1.0))
    await store.enqueue_run(_record("b", at=2.0))
    claimed = await store.claim_queued(
        queues=["default"], owner="w", lease_seconds=30, limit=5, exclude=["a"]
    )
    assert [r.run_id for r in claimed] == ["b"]


async def test_concurrent_claimants_never_get_the_same_run(store: Store) -> None:
    for index in range(60):
        await store.enqueue_run(_record(f"r{index}", at=float(index)))
    got: dict[str, list[str]] = {}

    async def claimant(owner: str) -> None:
        mine = got.setdefault(owner, [])
        while True:
            claimed = await store.claim_queued(
                queues=["default"], owner=owner, lease_seconds=30, limit=3
            )
            if not claimed:
                return
            mine.extend(r.run_id for r in claimed)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        for owner in ("w1", "w2", "w3", "w4"):
            group.start_soon(claimant, owner)
    everything = [run_id for runs in got.values() for run_id in runs]
    assert sorted(everything) == sorted(f"r{i}" for i in range(60))


async def test_a_queue_limit_holds_across_claimants(store: Store) -> None:
    await agency.queues.configure("tight", concurrency=2, store=store)
    assert await agency.queues.concurrency("tight", store=store) == 2
    assert await agency.queues.concurrency("loose", store=store) is None
    for index in range(5):
        await store.enqueue_run(_record(f"t{index}", queue="tight", at=float(index)))
    await store.enqueue_run(_record("free", queue="loose"))
    first = await store.claim_queued(
        queues=["tight", "loose"], owner="w1", lease_seconds=30, limit=10
    )
    assert sorted(r.run_id for r in first) == ["free", "t0", "t1"]
    assert await store.claim_queued(queues=["tight"], owner="w2", lease_seconds=30, limit=10) == []
    done = first[1] if first[1].queue == "tight" else first[0]
    assert await store.finish_run(done.model_copy(update={"status": "completed"}), owner="w1")
    again = await store.claim_queued(queues=["tight"], owner="w2", lease_seconds=30, limit=10)
    assert [r.run_id for r in again] == ["t2"]
    await agency.queues.configure("tight", concurrency=None, store=store)
    rest = await store.claim_queued(queues=["tight"], owner="w2", lease_seconds=30, limit=10)
    assert [r.run_id for r in rest] == ["t3", "t4"]


async def test_a_run_whose_holder_stopped_renewing_is_claimed_again(
    make_store: Callable[..., Store],
) -> None:
    clock = FakeClock(start=1000.0)
    store = make_store(clock=clock)
    await store.enqueue_run(_record("orphan"))
    [taken] = await store.claim_queued(queues=["default"], owner="dead", lease_seconds=5, limit=1)
    assert await store.claim_queued(queues=["default"], owner="w", lease_seconds=5, limit=1) == []
    clock.advance(5.1)  # the holder died: its lease ran out
    [again] = await store.claim_queued(queues=["default"], owner="w", lease_seconds=5, limit=1)
    assert (again.run_id, again.lease_owner, again.attempts) == ("orphan", "w", 2)
    assert again.started_at == taken.started_at
    assert not await store.renew_lease("orphan", owner="dead", lease_seconds=5)


async def test_a_run_handed_back_is_queued_again_with_its_lease_released(store: Store) -> None:
    await store.enqueue_run(_record("back"))
    [taken] = await store.claim_queued(queues=["default"], owner="w1", lease_seconds=30, limit=1)
    handed = taken.model_copy(update={"status": "queued"})
    assert await store.finish_run(handed, owner="w1", unjournaled=(7, 1))
    stored = await store.get_run("back")
    assert stored is not None
    assert (stored.status, stored.lease_owner, stored.finished_at) == ("queued", None, None)
    assert stored.unjournaled_pico == 7
    [again] = await store.claim_queued(queues=["default"], owner="w2", lease_seconds=30, limit=1)
    assert (again.run_id, again.attempts) == ("back", 2)


async def test_configure_refuses_bad_limits(store: Store) -> None:
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(InvalidArgumentError, match="concurrency"):
            await agency.queues.configure("q", concurrency=bad, store=store)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="queue name"):
        await agency.queues.configure("", concurrency=1, store=store)


# -- agency.runs.wait ----------------------------------------------------------------------


async def test_wait_returns_the_outcome_of_a_run(store: Store) -> None:
    await agency.run(add, 2, 3, run_id="done", store=store)
    result = await agency.runs.wait("done", store=store)
    assert (result.status, result.value) == ("completed", 5)


async def test_wait_gives_up_at_its_timeout(store: Store) -> None:
    await agency.enqueue(add, 1, 2, run_id="nobody", store=store)
    with pytest.raises(RunWaitTimeoutError, match="still queued") as caught:
        await agency.runs.wait("nobody", store=store, timeout=0.05)
    assert isinstance(caught.value, TimeoutError)
    assert (await agency.runs.get("nobody", store=store)).status == "queued"


async def test_wait_wakes_when_this_process_finishes_the_run(store: Store) -> None:
    await agency.enqueue(add, 4, 5, run_id="soon", store=store)
    results = []

    async def waiter() -> None:
        results.append(await agency.runs.wait("soon", store=store, timeout=30))

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        [claimed] = await store.claim_queued(
            queues=["default"], owner="me", lease_seconds=30, limit=1
        )
        done = claimed.model_copy(update={"status": "completed", "value": "9"})
        with anyio.fail_after(5):  # woken by the store, not by the 0.5 s poll
            assert await store.finish_run(done, owner="me")
    assert results[0].value == 9


async def test_wait_refuses_unknown_runs_and_bad_timeouts(store: Store) -> None:
    with pytest.raises(RunNotFoundError):
        await agency.runs.wait("missing", store=store, timeout=1)
    await agency.enqueue(add, 1, 2, run_id="x", store=store)
    for bad in (-1, float("nan"), float("inf"), "1", True):
        with pytest.raises(InvalidArgumentError, match="timeout"):
            await agency.runs.wait("x", store=store, timeout=bad)  # type: ignore[arg-type]


# -- answers for a worker ------------------------------------------------------------------


@agency.entry
async def ask_then_add(a: int) -> int:
    answer = await agency.interrupt("confirm", f"add {a}?")
    return a + int(answer.value or 0)


@pytest.mark.parametrize("limited", [False, True], ids=["unlimited", "limited"])
async def test_a_claim_says_which_runs_have_an_empty_journal(store: Store, limited: bool) -> None:
    # A limited queue is claimed by the general program (a transaction), an unlimited one
    # on PostgreSQL by one statement: both say it.
    if limited:
        await store.configure_queue("default", concurrency=10)
    paused = await agency.run(ask_then_add, 1, run_id="ask", store=store)
    await agency.respond_to_interrupts(paused, [approve(41)], store=store, enqueue=True)
    await store.enqueue_run(_record("fresh"))
    claimed = await store.claim_queued_runs(
        queues=["default"], owner="w", lease_seconds=30, limit=5
    )
    empty = {run.record.run_id: run.empty_journal for run in claimed}
    assert empty == {"ask": False, "fresh": True}
    assert all(run.record.status == "running" for run in claimed)
    assert (await store.load_journal("fresh")).entries == []


async def test_an_answer_with_enqueue_hands_the_paused_run_to_a_queue(store: Store) -> None:
    paused = await agency.run(ask_then_add, 1, run_id="ask", store=store)
    assert paused.status == "paused"
    queued = await agency.respond_to_interrupts(paused, [approve(41)], store=store, enqueue=True)
    assert queued.status == "queued"
    record = await agency.runs.get("ask", store=store)
    assert (record.status, record.queue) == ("queued", "default")
    [claimed] = await store.claim_queued(queues=["default"], owner="w", lease_seconds=30, limit=1)
    assert claimed.run_id == "ask"
    journal = await store.load_journal("ask")
    assert [a.response.value for a in journal.answers if a.response is not None] == [41]
