"""One injectable clock: tests move time by hand instead of sleeping."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from agency_runtime import (
    ConversationMemory,
    GuardExceededError,
    MemoryStore,
    RunRecord,
    RuntimeContext,
    agency,
    open_store,
)
from agency_runtime._boundary._runtime import RUNTIME
from agency_runtime._clock import SYSTEM_CLOCK, FakeClock

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def fake() -> Iterator[FakeClock]:
    clock = FakeClock()
    RUNTIME.configure(clock=clock)
    yield clock
    RUNTIME.configure(clock=SYSTEM_CLOCK)


async def test_a_sleep_waits_until_time_is_advanced() -> None:
    clock = FakeClock(start=1000.0)
    woke: list[float] = []

    async def sleeper(seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(clock.monotonic())

    async with anyio.create_task_group() as group:
        group.start_soon(sleeper, 7200.0)
        group.start_soon(sleeper, 60.0)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 2
        clock.advance(59)
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        clock.advance(1)
        await anyio.wait_all_tasks_blocked()
        assert woke == [60.0]
        clock.advance(7140)
    assert woke == [60.0, 7200.0]  # each woke at its own time, in order
    assert clock.time() == 1000.0 + 7200.0


def test_time_only_moves_forward() -> None:
    with pytest.raises(ValueError, match="forward"):
        FakeClock().advance(-1)


async def test_a_time_guard_trips_when_fake_time_runs_out() -> None:
    clock = FakeClock()
    with agency.test_context(ctx=RuntimeContext(clock=clock)):
        caught: list[GuardExceededError] = []

        async def guarded() -> None:
            try:
                async with agency.time_guard(10, label="slow"):
                    await anyio.sleep_forever()  # cancelled by the guard's timer
            except GuardExceededError as exc:
                caught.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(guarded)
            await anyio.wait_all_tasks_blocked()
            clock.advance(9.5)
            await anyio.wait_all_tasks_blocked()
            assert caught == []
            clock.advance(1)
    assert [e.type for e in caught] == ["time"]
    assert caught[0].spent == pytest.approx(10.5)


async def test_a_run_reads_the_runtimes_clock(fake: FakeClock) -> None:
    store = MemoryStore(clock=fake)

    async def entry() -> float:
        return agency.ctx().clock.time()

    result = await agency.run(entry, run_id="clocked", store=store)
    assert result.value == fake.time()
    record = await agency.runs.get("clocked", store=store)
    assert record.created_at == fake.time()


async def test_memory_ttls_follow_the_run_clock(fake: FakeClock) -> None:
    store = MemoryStore(clock=fake)
    memory = ConversationMemory(store)

    async def entry() -> list[str]:
        await memory.save("short-lived", tags=["c"], ttl_seconds=60)
        return [item.content for item in await memory.recall("", tags=["c"])]

    assert (await agency.run(entry, store=store)).value == ["short-lived"]
    outside = ConversationMemory(store, clock=fake)  # outside a run: the clock it is given
    assert [i.content for i in await outside.recall("", tags=["c"])] == ["short-lived"]
    fake.advance(61)
    assert await outside.recall("", tags=["c"]) == []  # expired in fake time, no sleep


@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
async def test_a_store_opened_by_url_stamps_leases_on_the_runtimes_clock(
    fake: FakeClock, scheme: str, tmp_path: Path
) -> None:
    url = (
        f"memory://clock-{uuid.uuid4().hex}" if scheme == "memory" else f"sqlite:///{tmp_path}/a.db"
    )
    store = open_store(url)
    run = RunRecord(run_id="leased", status="running", entry="m:f", arguments="{}")
    claim = await store.claim_run(run, owner="first", lease_seconds=30)
    assert claim.record.lease_expires_at == fake.time() + 30  # written on the fake clock
    assert claim.record.lease_alive(RUNTIME.clock.time())  # judged on the same clock
    fake.advance(29)
    assert not (await store.claim_run(run, owner="second", lease_seconds=30)).acquired
    fake.advance(2)
    stored = await store.get_run("leased")
    assert stored is not None
    assert not stored.lease_alive(RUNTIME.clock.time())
    assert (await store.claim_run(run, owner="second", lease_seconds=30)).acquired
    later = FakeClock(start=fake.time() + 1000)  # a clock swapped later: the store follows
    RUNTIME.configure(clock=later)
    assert (await store.get_run("leased")) is not None
    assert await store.renew_lease("leased", owner="second", lease_seconds=30)
    renewed = await store.get_run("leased")
    assert renewed is not None
    assert renewed.lease_expires_at == later.time() + 30
    store.close()


async def test_the_system_clock_does_not_wait_for_a_time_already_past() -> None:
    from agency_runtime._clock import SYSTEM_CLOCK

    with anyio.fail_after(1):
        await SYSTEM_CLOCK.sleep(-5.0)  # a due time that passed: no wait, no error
        await SYSTEM_CLOCK.sleep(0.0)
