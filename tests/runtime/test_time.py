"""Durable time and events: ``agency.sleep``, ``agency.wait_for_event``, ``agency.runs.send``,
and workers parking long waits (``waiting``, ``wake_at``) — on every store backend, with a
fake clock (a 2-hour sleep takes milliseconds)."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from agency_runtime import (
    EventTimeoutError,
    InvalidArgumentError,
    NotInRunError,
    OutsideFrameError,
    RunFinishedError,
    RunNotFoundError,
    Store,
    Worker,
    agency,
)
from agency_runtime.testing import FakeClock
from tests.support import serving, wait_for, wait_for_status

pytestmark = pytest.mark.anyio

CALLS: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


@pytest.fixture
def clocked(fake_clock: FakeClock, make_store: Callable[..., Store]) -> tuple[FakeClock, Store]:
    """The runtime's fake clock and a store of this backend that reads it."""
    return fake_clock, make_store(clock=fake_clock)


def _count(name: str) -> Callable[[], str]:
    def body() -> str:
        CALLS[name] += 1
        return name

    return body


@agency.entry
async def napper(seconds: float) -> float:
    async def body(s: Any) -> None:
        await s.step(_count("before"), name="before")

    await agency.with_resumable_scope("nap", body)
    await agency.sleep(seconds)
    CALLS["after"] += 1
    return agency.ctx().clock.time()  # when it woke


@agency.entry
async def listener(timeout: float | None = None) -> Any:
    return await agency.wait_for_event("paid", timeout=timeout)


@agency.entry
async def two_events() -> list[Any]:
    first = await agency.wait_for_event("item")
    second = await agency.wait_for_event("item")
    return [first, second]


@agency.entry
async def timeout_caught() -> str:
    try:
        await agency.wait_for_event("never", timeout=30)
    except EventTimeoutError:
        CALLS["timed out"] += 1
        return "gave up"
    return "got it"


async def _sleepers(clock: FakeClock, count: int) -> None:
    await wait_for(lambda: clock.sleepers >= count)


# -- agency.sleep in a plain run ---------------------------------------------------------------


async def test_a_two_hour_sleep_waits_on_the_runs_clock(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    start = clock.time()
    async with anyio.create_task_group() as group:
        results: list[Any] = []

        async def go() -> None:
            results.append(await agency.run(napper, 7200, run_id="nap", store=store))

        group.start_soon(go)
        await _sleepers(clock, 2)  # the sleep and the lease renewal
        record = await store.get_run("nap")
        assert record is not None
        assert record.status == "running"  # a plain run waits in its process
        clock.advance(7199)
        await anyio.wait_all_tasks_blocked()  # everything ran that could
        assert not results
        clock.advance(1)
    (result,) = results
    assert (result.status, result.value) == ("completed", start + 7200)
    journal = await agency.runs.journal("nap", store=store)
    assert [e.name for e in journal] == ["before", "agency.sleep"]


async def test_a_resumed_sleep_waits_only_what_remains(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    start = clock.time()
    with anyio.move_on_after(0.2):  # the process "dies" in the middle of the sleep
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agency.run, napper, 3600, run_id="cut", store=store))
            await _sleepers(clock, 2)
            clock.advance(1000)
            await anyio.wait_all_tasks_blocked()
            group.cancel_scope.cancel()
    async with anyio.create_task_group() as group:
        results: list[Any] = []

        async def resume() -> None:
            results.append(await agency.resume("cut", store=store))

        group.start_soon(resume)
        await _sleepers(clock, 2)
        clock.advance(2599)
        await anyio.wait_all_tasks_blocked()
        assert not results
        clock.advance(1)
    assert results[0].status == "completed"
    assert results[0].value == start + 3600  # only what remained of the hour
    assert CALLS["before"] == 1  # the step before the sleep ran once


async def test_a_sleep_that_is_over_returns_at_once(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    result = await agency.run(napper, 0, store=store)
    assert result.value == clock.time()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "5", True, [3]])
async def test_sleep_refuses_bad_durations(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"agency\.sleep: seconds"):
        await agency.with_test_context(lambda: agency.sleep(bad))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="timeout"):
        await agency.with_test_context(
            lambda: agency.wait_for_event("x", timeout=bad)  # type: ignore[arg-type]
        )


async def test_sleep_outside_a_frame_says_so() -> None:
    with pytest.raises(OutsideFrameError, match="sleep"):
        await agency.sleep(1)


# -- events in a plain run -----------------------------------------------------------------


async def test_an_event_sent_before_the_wait_is_buffered(clocked: tuple[FakeClock, Store]) -> None:
    _, store = clocked
    await agency.enqueue(listener, run_id="early", queue="nobody", store=store)
    await agency.runs.send("early", "paid", {"amount": 42}, store=store)
    result = await agency.run(listener, run_id="early", store=store)
    assert (result.status, result.value) == ("completed", {"amount": 42})


async def test_a_waiting_run_gets_the_event_sent_meanwhile(
    clocked: tuple[FakeClock, Store],
) -> None:
    _, store = clocked
    async with anyio.create_task_group() as group:
        results: list[Any] = []

        async def go() -> None:
            results.append(await agency.run(listener, run_id="live", store=store))

        group.start_soon(go)
        await wait_for_status(store, "live", "running")
        await anyio.wait_all_tasks_blocked()  # the run waits for its event
        await agency.runs.send("live", "paid", [1, 2], store=store)
    assert results[0].value == [1, 2]


async def test_each_event_is_taken_by_one_wait_in_order(clocked: tuple[FakeClock, Store]) -> None:
    _, store = clocked
    await agency.enqueue(two_events, run_id="pair", queue="nobody", store=store)
    for payload in ("a", "b", "c"):
        await agency.runs.send("pair", "item", payload, store=store)
    result = await agency.run(two_events, run_id="pair", store=store)
    assert result.value == ["a", "b"]
    # a replay of the finished run consumes nothing more
    again = await agency.run(two_events, run_id="pair", store=store)
    assert again.value == ["a", "b"]
    assert await store.take_event("pair", "item", "someone else") is not None  # "c" is left


async def test_a_timeout_is_journaled_and_raised_again_on_replay(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    async with anyio.create_task_group() as group:
        results: list[Any] = []

        async def go() -> None:
            results.append(await agency.run(listener, 30, run_id="late", store=store))

        group.start_soon(go)
        await _sleepers(clock, 2)
        clock.advance(30)
    assert results[0].status == "failed"
    assert isinstance(results[0].exception, EventTimeoutError)
    assert "'paid'" in str(results[0].exception)
    # a retry fails at once: the deadline is journaled, not counted again from now
    retried = await agency.resume("late", store=store)
    assert retried.status == "failed"
    assert isinstance(retried.exception, EventTimeoutError)


async def test_a_caught_timeout_replays_the_same_way(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    async with anyio.create_task_group() as group:
        results: list[Any] = []

        async def go() -> None:
            results.append(await agency.run(timeout_caught, run_id="caught", store=store))

        group.start_soon(go)
        await _sleepers(clock, 2)
        clock.advance(30)
    assert results[0].value == "gave up"
    replay = await agency.run(timeout_caught, run_id="caught", store=store)
    assert replay.value == "gave up"
    assert CALLS["timed out"] == 1


async def test_events_to_unknown_or_finished_runs_fail_clearly(store: Store) -> None:
    with pytest.raises(RunNotFoundError, match="nope"):
        await agency.runs.send("nope", "paid", store=store)
    done = await agency.run(napper, 0, store=store)
    with pytest.raises(RunFinishedError, match="completed"):
        await agency.runs.send(done.run_id, "paid", store=store)


@pytest.mark.parametrize(
    ("name", "payload", "message"),
    [("", None, "event name"), ("a\nb", None, "event name"), ("ok", {1, 2}, "JSON")],
)
async def test_send_refuses_bad_input(
    store: Store, name: str, payload: object, message: str
) -> None:
    await agency.enqueue(listener, run_id="r", queue="nobody", store=store)
    with pytest.raises(InvalidArgumentError, match=message):
        await agency.runs.send("r", name, payload, store=store)


async def test_waiting_for_an_event_needs_a_run() -> None:
    with pytest.raises(NotInRunError, match="wait_for_event"):
        await agency.with_test_context(lambda: agency.wait_for_event("x"))


# -- workers park long waits --------------------------------------------------------------------


async def test_a_worker_parks_a_long_sleep_and_continues_it_when_due(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    start = clock.time()
    async with serving(Worker(store, park_after=60, poll=0.05, concurrency=1)) as worker:
        await agency.enqueue(napper, 7200, run_id="parked", store=store)
        await wait_for_status(store, "parked", "waiting")
        record = await agency.runs.get("parked", store=store)
        assert record.wake_at == clock.time() + 7200
        assert record.lease_owner is None
        assert worker.running == frozenset()  # the slot is free
        # the free slot serves other work meanwhile
        await agency.enqueue(napper, 0, run_id="quick", store=store)
        assert (await agency.runs.wait("quick", store=store, timeout=10)).value == start
        clock.advance(7200)
        result = await agency.runs.wait("parked", store=store, timeout=10)
    assert (result.status, result.value) == ("completed", start + 7200)
    assert CALLS["before"] == 2
    assert CALLS["after"] == 2
    assert (await agency.runs.get("parked", store=store)).attempts == 2


async def test_a_short_sleep_is_waited_in_the_worker(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    start = clock.time()
    async with serving(Worker(store, park_after=60, poll=0.05)) as worker:
        await agency.enqueue(napper, 30, run_id="short", store=store)
        await wait_for(lambda: "short" in worker.running)
        await _sleepers(clock, 2)
        clock.advance(30)
        result = await agency.runs.wait("short", store=store, timeout=10)
    assert result.value == start + 30
    assert (await agency.runs.get("short", store=store)).attempts == 1


async def test_a_parked_wait_for_an_event_wakes_when_it_comes(
    clocked: tuple[FakeClock, Store],
) -> None:
    _, store = clocked
    async with serving(Worker(store, park_after=0, poll=0.05)):
        await agency.enqueue(listener, run_id="parked-listener", store=store)
        await wait_for_status(store, "parked-listener", "waiting")
        record = await agency.runs.get("parked-listener", store=store)
        assert (record.wake_at, record.waiting_for) == (None, ["paid"])
        await agency.runs.send("parked-listener", "paid", "ok", store=store)
        result = await agency.runs.wait("parked-listener", store=store, timeout=10)
    assert result.value == "ok"


async def test_a_parked_wait_with_a_timeout_times_out_on_time(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    async with serving(Worker(store, park_after=10, poll=0.05)):
        await agency.enqueue(timeout_caught, run_id="give-up", store=store)
        await wait_for_status(store, "give-up", "waiting")
        record = await agency.runs.get("give-up", store=store)
        assert record.wake_at == clock.time() + 30
        clock.advance(30)
        result = await agency.runs.wait("give-up", store=store, timeout=10)
    assert result.value == "gave up"


async def test_runs_wait_waits_through_a_parked_run(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    async with serving(Worker(store, park_after=0, poll=0.05)):
        await agency.enqueue(napper, 600, run_id="through", store=store)
        await wait_for_status(store, "through", "waiting")
        with pytest.raises(Exception, match="still waiting"):
            await agency.runs.wait("through", store=store, timeout=0.05)
        clock.advance(600)
        assert (await agency.runs.wait("through", store=store, timeout=10)).ok


async def test_a_draining_worker_parks_a_sleep_in_progress(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    start = clock.time()
    worker = Worker(store, park_after=3600, poll=0.05)
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run)
        await agency.enqueue(napper, 600, run_id="drained", store=store)
        await wait_for(lambda: "drained" in worker.running)
        await _sleepers(clock, 2)
        with anyio.fail_after(10):
            await worker.drain()  # does not wait out the sleep
    record = await agency.runs.get("drained", store=store)
    assert (record.status, record.wake_at) == ("waiting", clock.time() + 600)
    async with serving(Worker(store, park_after=3600, poll=0.05)):
        clock.advance(600)
        result = await agency.runs.wait("drained", store=store, timeout=10)
    assert result.value == start + 600


async def test_park_after_must_be_seconds(store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="park_after"):
        Worker(store, park_after=-1)
    assert Worker(store, park_after=0).park_after == 0.0


async def test_a_parked_run_resumed_by_hand_waits_what_remains_in_process(
    clocked: tuple[FakeClock, Store],
) -> None:
    clock, store = clocked
    start = clock.time()
    await agency.enqueue(napper, 600, run_id="by-hand", store=store)
    async with serving(Worker(store, park_after=0, poll=0.05)):
        await wait_for_status(store, "by-hand", "waiting")  # then no worker is left
    clock.advance(100)
    async with anyio.create_task_group() as group:
        results: list[Any] = []

        async def resume() -> None:
            results.append(await agency.resume("by-hand", store=store))

        group.start_soon(resume)
        await _sleepers(clock, 2)
        clock.advance(500)
    assert results[0].value == start + 600
    assert CALLS["before"] == 1


async def test_a_cancelled_parked_run_never_wakes(clocked: tuple[FakeClock, Store]) -> None:
    clock, store = clocked
    async with serving(Worker(store, park_after=0, poll=0.05)):
        await agency.enqueue(napper, 60, run_id="doomed", store=store)
        await wait_for_status(store, "doomed", "waiting")
        await agency.runs.cancel("doomed", store=store)
        clock.advance(120)
        await anyio.wait_all_tasks_blocked()  # the worker looked, and found nothing due
        assert (await agency.runs.get("doomed", store=store)).status == "cancelled"
    assert CALLS["after"] == 0
    with pytest.raises(RunFinishedError):
        await agency.runs.send("doomed", "paid", store=store)


async def test_a_parked_sleep_wakes_on_time_on_the_real_clock(store: Store) -> None:
    """No fake clock: the worker's own timer (the next wake-up the store knows) wakes it."""
    async with serving(Worker(store, park_after=0, poll=5.0)):
        await agency.enqueue(napper, 0.2, run_id="real", store=store)
        result = await agency.runs.wait("real", store=store, timeout=10)
    record = await agency.runs.get("real", store=store)
    journal = await agency.runs.journal("real", store=store)
    (slept,) = [e for e in journal if e.name == "agency.sleep"]
    wake_at = float(slept.result)
    assert wake_at <= result.value < wake_at + 1.0  # not at the 5 s poll
    assert record.attempts == 2  # parked once, then continued


@agency.entry
async def sleeps_in_a_step() -> str:
    async def body(s: Any) -> str:
        async def wait_then_work() -> str:
            CALLS["step started"] += 1
            await agency.sleep(300)
            return "worked"

        return str(await s.step(wait_then_work, name="wait-then-work"))

    return str(await agency.with_resumable_scope("inner", body))


async def test_a_sleep_inside_a_step_parks_and_the_step_runs_again_after_it(
    clocked: tuple[FakeClock, Store],
) -> None:
    """The step is not committed while it sleeps: it runs again when the run wakes, and its
    sleep (journaled on its own) ends when it was due, not 300 s after the wake-up."""
    clock, store = clocked
    async with serving(Worker(store, park_after=0, poll=0.05)):
        await agency.enqueue(sleeps_in_a_step, run_id="inside", store=store)
        await wait_for_status(store, "inside", "waiting")
        clock.advance(300)
        result = await agency.runs.wait("inside", store=store, timeout=10)
    assert result.value == "worked"
    assert CALLS["step started"] == 2
    names = [e.name for e in await agency.runs.journal("inside", store=store)]
    assert names == ["agency.sleep", "wait-then-work"]
