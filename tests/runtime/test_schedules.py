"""``agency.schedules``: cron and interval schedules fired by workers, each occurrence exactly
once however many workers serve, missed occurrences started once — on every store backend,
with a fake clock."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime

import anyio
import pytest

from agency_runtime import (
    InvalidArgumentError,
    Schedule,
    ScheduleNotFoundError,
    Store,
    Worker,
    agency,
)
from agency_runtime._boundary._schedules import latest_due, next_after, occurrence_run_id
from agency_runtime.testing import FakeClock
from tests.support import serving

pytestmark = pytest.mark.anyio

RAN: Counter[str] = Counter()
"""Occurrence runs count their executions here, by run id."""

JAN_1 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()  # FakeClock's default start


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()


@pytest.fixture
def clocked(fake_clock: FakeClock, make_store: Callable[..., Store]) -> tuple[FakeClock, Store]:
    return fake_clock, make_store(clock=fake_clock)


@agency.entry
def tick(label: str = "tick") -> str:
    RAN[agency.ctx().run_id or ""] += 1
    return label


async def _runs(store: Store, count: int) -> list[str]:
    """Wait (bounded) until ``count`` runs completed; their ids, sorted."""
    with anyio.fail_after(20):
        while True:
            done = [r.run_id for r in await store.list_runs(status="completed")]
            if len(done) >= count:
                return sorted(done)
            await anyio.sleep(0.005)


# -- adding, listing, removing ---------------------------------------------------------------


async def test_add_stores_a_schedule_with_its_next_occurrence(
    clocked: tuple[FakeClock, Store],
) -> None:
    _, store = clocked
    daily = await agency.schedules.add("digest", tick, cron="0 9 * * *", args=["d"], store=store)
    assert isinstance(daily, Schedule)
    assert daily.next_time == datetime(2026, 1, 1, 9, tzinfo=UTC)
    hourly = await agency.schedules.add("hourly", tick, every=3600, store=store)
    assert hourly.next_at == JAN_1 + 3600  # counted from the epoch: the top of the hour
    listed = await agency.schedules.list(store=store)
    assert [s.name for s in listed] == ["digest", "hourly"]
    assert (await agency.schedules.get("digest", store=store)).arguments == (
        '{"args":["d"],"kwargs":{}}'
    )


async def test_adding_the_same_plan_again_changes_nothing(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    first = await agency.schedules.add("hourly", tick, every=3600, store=store)
    clock.advance(4000)  # an occurrence is missed: re-adding must not skip it
    again = await agency.schedules.add("hourly", tick, every=3600, store=store)
    assert again == first
    replaced = await agency.schedules.add("hourly", tick, every=600, store=store)
    assert replaced.every == 600.0
    assert replaced.next_at == JAN_1 + 4200  # counted from now


async def test_a_cron_schedule_reads_its_time_zone(clocked: tuple[FakeClock, Store]) -> None:
    _, store = clocked
    berlin = await agency.schedules.add(
        "berlin", tick, cron="0 9 * * *", timezone="Europe/Berlin", store=store
    )
    assert berlin.next_time == datetime(2026, 1, 1, 8, tzinfo=UTC)  # 09:00 CET


async def test_remove_and_get_say_when_there_is_no_such_schedule(store: Store) -> None:
    await agency.schedules.add("gone", tick, every=60, store=store)
    await agency.schedules.remove("gone", store=store)
    assert await agency.schedules.list(store=store) == []
    with pytest.raises(ScheduleNotFoundError, match="gone"):
        await agency.schedules.remove("gone", store=store)
    with pytest.raises(ScheduleNotFoundError, match="gone"):
        await agency.schedules.get("gone", store=store)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "malformed cron"),
        ({"cron": "every day"}, "malformed cron"),
        ({"cron": ""}, "cron expression"),
        ({}, "exactly one of"),
        ({"cron": "* * * * *", "every": 60}, "exactly one of"),
        ({"every": 0.5}, "every must be"),
        ({"every": float("inf")}, "every must be"),
        ({"every": "60"}, "every must be"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 60, "timezone": "Europe/Berlin"}, "cron schedules only"),
        ({"every": 60, "queue": ""}, "queue name"),
        ({"every": 60, "args": "abc"}, "args must be"),
        ({"every": 60, "args": [{1, 2}]}, "JSON"),
    ],
)
async def test_add_refuses_bad_input(
    store: Store, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        await agency.schedules.add("bad", tick, store=store, **options)  # type: ignore[arg-type]
    assert await agency.schedules.list(store=store) == []


@pytest.mark.parametrize("name", ["", "a@b", "x\ny", 5])
async def test_add_refuses_bad_names(store: Store, name: object) -> None:
    with pytest.raises(InvalidArgumentError, match="schedule name"):
        await agency.schedules.add(name, tick, every=60, store=store)  # type: ignore[arg-type]


# -- occurrences -------------------------------------------------------------------------------


def _plan(**fields: object) -> Schedule:
    base: dict[str, object] = {"name": "s", "entry": "m:f", "arguments": "{}", "next_at": 0.0}
    return Schedule.model_validate(base | fields)


def test_occurrence_math_at_the_edges() -> None:
    every = _plan(every=60.0, next_at=120.0)
    assert next_after(every, 120.0) == 180.0  # strictly after
    assert latest_due(every, 239.0) == 180.0
    assert latest_due(every, 240.0) == 240.0  # an occurrence exactly now is due now
    assert latest_due(every, 100.0) == 120.0  # never before next_at
    nine = _plan(cron="0 9 * * *", next_at=JAN_1 + 9 * 3600)
    assert latest_due(nine, JAN_1 + 9 * 3600) == JAN_1 + 9 * 3600
    assert latest_due(nine, JAN_1 + 5 * 86400) == JAN_1 + 4 * 86400 + 9 * 3600
    assert next_after(nine, JAN_1 + 9 * 3600) == JAN_1 + 86400 + 9 * 3600
    assert occurrence_run_id("digest", JAN_1 + 9 * 3600) == "digest@2026-01-01T09:00:00Z"
    assert occurrence_run_id("fast", 1.5) == "fast@1970-01-01T00:00:01.500Z"


async def test_a_worker_starts_each_occurrence_once(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    await agency.schedules.add("tick", tick, every=60, store=store)
    async with serving(Worker(store, poll=0.05)):
        for expected in (1, 2, 3):
            clock.advance(60)
            await _runs(store, expected)
    ids = await _runs(store, 3)
    assert ids == [
        "tick@2026-01-01T00:01:00Z",
        "tick@2026-01-01T00:02:00Z",
        "tick@2026-01-01T00:03:00Z",
    ]
    assert set(RAN.values()) == {1}


async def test_two_workers_never_start_an_occurrence_twice(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    await agency.schedules.add("tick", tick, every=60, store=store)
    await agency.schedules.add("tock", tick, every=120, args=["tock"], store=store)
    async with serving(Worker(store, poll=0.02), Worker(store, poll=0.02)):
        for minute in range(1, 7):
            clock.advance(60)
            await _runs(store, minute + minute // 2)
    assert len(RAN) == 9
    assert set(RAN.values()) == {1}
    assert sum(run_id.startswith("tock@") for run_id in RAN) == 3


async def test_missed_occurrences_start_once(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    await agency.schedules.add("tick", tick, every=60, store=store)
    clock.advance(60 * 10 + 30)  # ten occurrences while no worker ran
    async with serving(Worker(store, poll=0.05)):
        assert await _runs(store, 1) == ["tick@2026-01-01T00:10:00Z"]  # the latest
        stored = await agency.schedules.get("tick", store=store)
        assert stored.next_at == JAN_1 + 660
    assert len(RAN) == 1


async def test_workers_fire_only_the_schedules_of_their_queues(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    await agency.schedules.add("mail", tick, every=60, queue="mail", store=store)
    await agency.schedules.add("tick", tick, every=60, store=store)
    async with serving(Worker(store, poll=0.05)):
        clock.advance(60)
        await _runs(store, 1)
    assert list(RAN) == ["tick@2026-01-01T00:01:00Z"]
    stored = await agency.schedules.get("mail", store=store)
    assert stored.next_at == JAN_1 + 60  # still due, for a worker of "mail"


async def test_a_removed_schedule_starts_nothing_more(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    await agency.schedules.add("tick", tick, every=60, store=store)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(serving(Worker(store, poll=0.05)))
        clock.advance(60)
        await _runs(store, 1)
        await agency.schedules.remove("tick", store=store)
        clock.advance(600)
        await anyio.wait_all_tasks_blocked()  # the worker looked, and fired nothing
    assert len(RAN) == 1
