"""The store's side of durable time and events, on every backend: parked (``waiting``) runs,
their wake-ups, events sent to runs, and schedules fired exactly once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agency_runtime import (
    RunFinishedError,
    RunNotFoundError,
    RunRecord,
    Schedule,
    Store,
)
from agency_runtime.testing import FakeClock

pytestmark = pytest.mark.anyio

ENTRY = "tests.runtime.test_store_time:nothing"
ARGS = '{"args":[],"kwargs":{}}'


def nothing() -> None:
    """The entry the records name (never run here)."""


def _record(run_id: str, *, queue: str = "default", at: float = 0.0) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        status="queued",
        entry=ENTRY,
        arguments=ARGS,
        queue=queue,
        created_at=at,
        updated_at=at,
    )


async def _park(
    store: Store, run_id: str, *, wake_at: float | None, waiting_for: list[str] | None = None
) -> RunRecord:
    """Queue ``run_id``, claim it as worker ``w`` and park it the way a worker does."""
    await store.enqueue_run(_record(run_id))
    (claimed,) = await store.claim_queued(
        queues=["default"], owner="w", lease_seconds=30, limit=1, exclude=()
    )
    assert claimed.run_id == run_id
    parked = claimed.model_copy(
        update={"status": "waiting", "wake_at": wake_at, "waiting_for": waiting_for or []}
    )
    assert await store.finish_run(parked, owner="w")
    stored = await store.get_run(run_id)
    assert stored is not None
    return stored


async def _claim_ids(store: Store, owner: str = "w2") -> list[str]:
    claimed = await store.claim_queued(queues=["default"], owner=owner, lease_seconds=30, limit=9)
    return [r.run_id for r in claimed]


# -- parked runs -------------------------------------------------------------------------------


async def test_a_parked_run_is_claimed_only_when_due(make_store: Callable[..., Store]) -> None:
    clock = FakeClock(start=1_000.0)
    store = make_store(clock=clock)
    parked = await _park(store, "sleeper", wake_at=1_060.0)
    assert (parked.status, parked.wake_at, parked.lease_owner) == ("waiting", 1_060.0, None)
    assert await store.next_wake(["default"]) == 1_060.0
    assert await store.next_wake(["other"]) is None
    assert await _claim_ids(store) == []
    clock.advance(59)
    assert await _claim_ids(store) == []
    clock.advance(1)
    assert await _claim_ids(store) == ["sleeper"]
    woken = await store.get_run("sleeper")
    assert woken is not None
    assert (woken.status, woken.wake_at, woken.waiting_for, woken.attempts) == (
        "running",
        None,
        [],
        2,
    )
    assert await store.next_wake(["default"]) is None


async def test_a_run_waiting_for_an_event_alone_is_never_due(
    make_store: Callable[..., Store],
) -> None:
    clock = FakeClock(start=1_000.0)
    store = make_store(clock=clock)
    await _park(store, "listener", wake_at=None, waiting_for=["paid"])
    clock.advance(10**6)
    assert await _claim_ids(store) == []
    assert await store.next_wake(["default"]) is None


async def test_an_event_a_parked_run_waits_for_makes_it_due_now(
    make_store: Callable[..., Store],
) -> None:
    clock = FakeClock(start=1_000.0)
    store = make_store(clock=clock)
    await _park(store, "listener", wake_at=5_000.0, waiting_for=["paid"])
    await store.send_event("listener", "shipped", "1")  # not what it waits for
    assert await _claim_ids(store) == []
    event = await store.send_event("listener", "paid", '{"amount": 3}')
    assert (event.run_id, event.name, event.payload, event.sent_at) == (
        "listener",
        "paid",
        '{"amount": 3}',
        1_000.0,
    )
    assert await store.next_wake(["default"]) == 1_000.0
    assert await _claim_ids(store) == ["listener"]


async def test_a_run_parking_after_its_event_came_is_due_at_once(
    make_store: Callable[..., Store],
) -> None:
    """The send raced the park: the event was buffered while the run still ran."""
    clock = FakeClock(start=1_000.0)
    store = make_store(clock=clock)
    await store.enqueue_run(_record("racer"))
    (claimed,) = await store.claim_queued(queues=["default"], owner="w", lease_seconds=30, limit=1)
    await store.send_event("racer", "paid", "null")  # running: nothing to wake yet
    parked = claimed.model_copy(
        update={"status": "waiting", "wake_at": None, "waiting_for": ["paid"]}
    )
    assert await store.finish_run(parked, owner="w")
    stored = await store.get_run("racer")
    assert stored is not None
    assert (stored.status, stored.wake_at) == ("waiting", 1_000.0)
    assert await _claim_ids(store) == ["racer"]


async def test_a_takeover_of_a_parked_run_clears_its_wake_up(
    make_store: Callable[..., Store],
) -> None:
    clock = FakeClock(start=1_000.0)
    store = make_store(clock=clock)
    parked = await _park(store, "sleeper", wake_at=2_000.0, waiting_for=["x"])
    claim = await store.claim_run(parked, owner="resumer", lease_seconds=30)
    assert claim.acquired
    assert (claim.record.status, claim.record.wake_at, claim.record.waiting_for) == (
        "running",
        None,
        [],
    )


# -- events ----------------------------------------------------------------------------------


async def test_events_are_taken_once_each_in_order_per_name(store: Store) -> None:
    await store.enqueue_run(_record("r"))
    first = await store.send_event("r", "go", '"one"')
    await store.send_event("r", "other", '"x"')
    second = await store.send_event("r", "go", '"two"')
    assert second.event_id > first.event_id
    taken = await store.take_event("r", "go", "event#0")
    assert taken is not None
    assert (taken.payload, taken.taken_by) == ('"one"', "event#0")
    again = await store.take_event("r", "go", "event#0")  # the same wait, run again
    assert again is not None
    assert (again.event_id, again.payload) == (first.event_id, '"one"')
    later = await store.take_event("r", "go", "event#1")
    assert later is not None
    assert later.payload == '"two"'
    assert await store.take_event("r", "go", "event#2") is None
    other = await store.take_event("r", "other", "event#3")
    assert other is not None
    assert other.payload == '"x"'


async def test_events_belong_to_their_run(store: Store) -> None:
    await store.enqueue_run(_record("a"))
    await store.enqueue_run(_record("b"))
    await store.send_event("a", "go", "1")
    assert await store.take_event("b", "go", "event#0") is None
    assert await store.take_event("a", "go", "event#0") is not None


async def test_sending_to_an_unknown_or_finished_run_fails(store: Store) -> None:
    with pytest.raises(RunNotFoundError, match="ghost"):
        await store.send_event("ghost", "go", "1")
    await store.enqueue_run(_record("done"))
    cancelled = await store.cancel_run("done")
    assert cancelled is not None
    with pytest.raises(RunFinishedError, match="cancelled"):
        await store.send_event("done", "go", "1")
    assert await store.take_event("done", "go", "event#0") is None


# -- schedules -------------------------------------------------------------------------------


def _schedule(name: str, *, next_at: float, queue: str = "default") -> Schedule:
    return Schedule(
        name=name,
        entry=ENTRY,
        arguments=ARGS,
        every=60.0,
        queue=queue,
        next_at=next_at,
        created_at=1.0,
        updated_at=1.0,
    )


async def test_schedules_are_stored_listed_replaced_and_removed(store: Store) -> None:
    await store.put_schedule(_schedule("b", next_at=120.0))
    await store.put_schedule(_schedule("a", next_at=60.0, queue="q"))
    assert [s.name for s in await store.list_schedules()] == ["a", "b"]
    await store.put_schedule(_schedule("b", next_at=180.0).model_copy(update={"cron": None}))
    got = await store.get_schedule("b")
    assert got is not None
    assert got == _schedule("b", next_at=180.0)
    assert await store.get_schedule("missing") is None
    assert await store.next_wake(["default"]) == 180.0
    assert await store.next_wake(["default", "q"]) == 60.0
    assert await store.remove_schedule("a")
    assert not await store.remove_schedule("a")
    assert [s.name for s in await store.list_schedules()] == ["b"]


async def test_a_schedule_fires_each_occurrence_once(store: Store) -> None:
    await store.put_schedule(_schedule("tick", next_at=60.0))
    await store.put_schedule(_schedule("later", next_at=600.0))
    due = await store.due_schedules(["default"], 100.0)
    assert [s.name for s in due] == ["tick"]
    assert await store.due_schedules(["other"], 100.0) == []
    run = _record("tick@1970-01-01T00:01:00Z", at=100.0)
    assert await store.fire_schedule("tick", due=60.0, next_at=120.0, run=run)
    # a second worker that read the same due time loses
    assert not await store.fire_schedule("tick", due=60.0, next_at=120.0, run=run)
    stored = await store.get_schedule("tick")
    assert stored is not None
    assert stored.next_at == 120.0
    queued = await store.get_run(run.run_id)
    assert queued is not None
    assert (queued.status, queued.queue) == ("queued", "default")
    assert [r.run_id for r in await store.list_runs()] == [run.run_id]
    assert not await store.fire_schedule("gone", due=60.0, next_at=120.0, run=run)


async def test_firing_keeps_a_run_that_exists_already(store: Store) -> None:
    await store.put_schedule(_schedule("tick", next_at=60.0))
    run = _record("tick@1970-01-01T00:01:00Z")
    await store.enqueue_run(run)
    await store.claim_queued(queues=["default"], owner="w", lease_seconds=30, limit=1)
    assert await store.fire_schedule("tick", due=60.0, next_at=120.0, run=run)
    stored = await store.get_run(run.run_id)
    assert stored is not None
    assert stored.status == "running"  # untouched


async def test_next_wake_after_skips_what_fell_due_before(make_store: Callable[..., Store]) -> None:
    clock = FakeClock(start=1_000.0)
    store = make_store(clock=clock)
    await _park(store, "first", wake_at=1_010.0)
    await _park(store, "second", wake_at=1_050.0)
    await store.put_schedule(_schedule("tick", next_at=1_030.0))
    assert await store.next_wake(["default"]) == 1_010.0
    assert await store.next_wake(["default"], after=1_010.0) == 1_030.0
    assert await store.next_wake(["default"], after=1_030.0) == 1_050.0
    assert await store.next_wake(["default"], after=1_050.0) is None
