"""Workers: claiming queued runs, concurrency, queue limits, draining, recovery, hand-backs.

Every test runs on every store backend (the ``store`` fixture) and on asyncio and trio. The
worker's polls are real time but short; everything a test waits for is an event or a run's
outcome (``agency.runs.wait``), never a sleep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import anyio
import pytest

from agency_runtime import (
    InvalidArgumentError,
    JournalEntry,
    MemoryStore,
    RunRecord,
    Store,
    StoreUnavailableError,
    Worker,
    agency,
    approve,
)
from agency_runtime.testing import FakeClock
from tests.support import serving, wait_for

pytestmark = pytest.mark.anyio

CALLS: Counter[str] = Counter()
"""Step bodies count their executions here: ``"<run id>/<step>"``."""


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


def _count(step: str) -> Callable[[], str]:
    def body() -> str:
        CALLS[f"{agency.ctx().run_id}/{step}"] += 1
        return step

    return body


@agency.entry
async def three_steps(n: int) -> int:
    async def body(s: object) -> int:
        await s.step(_count("a"), name="a")  # type: ignore[attr-defined]
        await s.step(_count("b"), name="b")  # type: ignore[attr-defined]
        await s.step(_count("c"), name="c")  # type: ignore[attr-defined]
        return n * 10

    return await agency.with_resumable_scope("work", body)


async def test_a_worker_runs_queued_runs_once_each(store: Store) -> None:
    ids = [await agency.enqueue(three_steps, i, store=store) for i in range(12)]
    async with serving(Worker(store, concurrency=4, poll=0.05)) as worker:
        results = [await agency.runs.wait(i, store=store, timeout=30) for i in ids]
    assert [r.value for r in results] == [i * 10 for i in range(12)]
    assert all(r.status == "completed" for r in results)
    assert set(CALLS.values()) == {1}
    assert len(CALLS) == 36
    assert worker.runs_finished == 12
    assert worker.running == frozenset()


@agency.entry
async def ask_then_add(a: int) -> int:
    answer = await agency.interrupt("confirm", f"add {a}?")
    return a + int(answer.value or 0)


class CountingStore(MemoryStore):
    """A memory store that counts journal loads."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[str] = []

    async def load_journal(self, run_id: str):  # type: ignore[no-untyped-def]
        self.loads.append(run_id)
        return await super().load_journal(run_id)


async def test_a_worker_reads_no_journal_for_a_run_that_never_started() -> None:
    store = CountingStore()
    await agency.enqueue(three_steps, 1, run_id="fresh", store=store)
    paused = await agency.run(ask_then_add, 1, run_id="ask", store=store)
    await agency.respond_to_interrupts(paused, [approve(2)], store=store, enqueue=True)
    async with serving(Worker(store, poll=0.05)):
        fresh = await agency.runs.wait("fresh", store=store, timeout=30)
        answered = await agency.runs.wait("ask", store=store, timeout=30)
    assert (fresh.value, answered.value) == (10, 3)  # the answer was read from its journal
    assert "fresh" not in store.loads  # nothing to read: it never started


class SlowLookStore(MemoryStore):
    """A memory store whose ``next_wake`` returns only once its worker has no run left
    (a run ends while the worker looks at the store, before it waits)."""

    worker: Worker | None = None

    async def next_wake(self, queues, *, after=None):  # type: ignore[no-untyped-def]
        while self.worker is not None and self.worker.running:  # noqa: ASYNC110
            await anyio.sleep(0.001)
        return await super().next_wake(queues, after=after)


async def test_a_slot_that_frees_while_the_worker_looks_is_not_missed() -> None:
    store = SlowLookStore()
    ids = [await agency.enqueue(three_steps, i, store=store) for i in range(2)]
    store.worker = worker = Worker(store, concurrency=1, poll=60.0)
    async with serving(worker):
        with anyio.fail_after(10):  # not after the poll: the freed slot takes the next run
            results = [await agency.runs.wait(i, store=store) for i in ids]
    assert [r.value for r in results] == [0, 10]


class QueueWhileLookingStore(MemoryStore):
    """A memory store whose ``next_wake`` queues a run the first time an idle worker reads
    it (between its claim and its wait: the store's wake-up rings while nobody waits)."""

    queued = False

    async def next_wake(self, queues, *, after=None):  # type: ignore[no-untyped-def]
        if not self.queued:
            self.queued = True
            await agency.enqueue(three_steps, 2, run_id="late", store=self)
        return await super().next_wake(queues, after=after)


async def test_a_run_queued_while_the_worker_looks_is_not_left_for_the_poll() -> None:
    store = QueueWhileLookingStore()
    async with serving(Worker(store, poll=60.0)):
        await wait_for(lambda: store.queued)
        with anyio.fail_after(10):  # not after the poll: the wake-up it missed still counts
            result = await agency.runs.wait("late", store=store)
    assert result.value == 20


EXPIRIES: list[float] = []
"""What ``long_on_the_clock`` read of its own lease after each pause."""


@agency.entry
async def long_on_the_clock(pauses: int) -> str:
    for _ in range(pauses):
        await agency.ctx().clock.sleep(0.05)  # work taking 0.05 s of the runtime's clock
        record = await agency.ctx().store.get_run(agency.ctx().run_id)
        assert record is not None
        assert record.lease_expires_at is not None
        EXPIRIES.append(record.lease_expires_at)
    return "ok"


async def test_a_worker_renews_the_leases_of_its_runs(
    make_store: Callable[..., Store], fake_clock: FakeClock
) -> None:
    store = make_store(clock=fake_clock)
    EXPIRIES.clear()
    await agency.enqueue(long_on_the_clock, 6, run_id="long", store=store)
    worker = Worker(store, lease=0.15, poll=0.05)
    async with serving(worker):
        await wait_for(lambda: "long" in worker.running)
        for _ in range(6):  # 0.3 s of fake time: two leases
            await anyio.wait_all_tasks_blocked()
            fake_clock.advance(0.05)
        result = await agency.runs.wait("long", store=store, timeout=30)
    assert (result.status, result.value) == ("completed", "ok")
    record = await agency.runs.get("long", store=store)
    assert (record.attempts, record.lease_owner) == (1, None)  # never taken from it
    assert len(EXPIRIES) == 6
    assert EXPIRIES[-1] > EXPIRIES[0]  # still leased after more than one lease period
    assert EXPIRIES[-1] > fake_clock.time() - 0.05  # renewed within the last period


GATE: dict[str, anyio.Event] = {}
ACTIVE = {"now": 0, "most": 0}


@agency.entry
async def held(name: str) -> str:
    ACTIVE["now"] += 1
    ACTIVE["most"] = max(ACTIVE["most"], ACTIVE["now"])
    try:
        await GATE["open"].wait()
    finally:
        ACTIVE["now"] -= 1
    return name


@pytest.fixture
def gate() -> anyio.Event:
    GATE["open"] = anyio.Event()
    ACTIVE.update(now=0, most=0)
    return GATE["open"]


async def test_a_worker_runs_at_most_concurrency_runs_at_once(
    store: Store, gate: anyio.Event
) -> None:
    ids = [await agency.enqueue(held, f"h{i}", store=store) for i in range(7)]
    async with serving(Worker(store, concurrency=3, poll=0.05)) as worker:
        await wait_for(lambda: ACTIVE["now"] == 3)  # three runs wait at the gate
        await anyio.wait_all_tasks_blocked()
        assert len(worker.running) == 3
        assert ACTIVE["most"] == 3
        queued = await agency.runs.list(store=store, status="queued")
        assert len(queued) == 4
        gate.set()
        for run_id in ids:
            assert (await agency.runs.wait(run_id, store=store, timeout=30)).status == "completed"
    assert ACTIVE["most"] == 3


async def test_a_queue_limit_holds_across_workers(store: Store, gate: anyio.Event) -> None:
    await agency.queues.configure("narrow", concurrency=2, store=store)
    ids = [await agency.enqueue(held, f"n{i}", queue="narrow", store=store) for i in range(6)]
    one = Worker(store, queues=["narrow"], concurrency=4, poll=0.05)
    two = Worker(store, queues=["narrow"], concurrency=4, poll=0.05)
    async with serving(one), serving(two):
        await wait_for(lambda: ACTIVE["now"] == 2)
        await anyio.wait_all_tasks_blocked()
        assert len(one.running) + len(two.running) == 2
        assert ACTIVE["most"] == 2
        gate.set()
        for run_id in ids:
            assert (await agency.runs.wait(run_id, store=store, timeout=30)).status == "completed"
    assert ACTIVE["most"] == 2


async def test_higher_priority_runs_first(store: Store) -> None:
    order: list[str] = []

    @agency.entry(name="test_worker.note")
    def note(label: str) -> None:
        order.append(label)

    for label, priority in [("low", 0), ("high", 5), ("mid", 1)]:
        await agency.enqueue(note, label, run_id=label, priority=priority, store=store)
    async with serving(Worker(store, concurrency=1, poll=0.05)):
        for run_id in ("low", "high", "mid"):
            await agency.runs.wait(run_id, store=store, timeout=30)
    assert order == ["high", "mid", "low"]


STEP_GATE: dict[str, anyio.Event] = {}


@agency.entry
async def pausing_between_steps() -> str:
    async def body(s: object) -> str:
        await s.step(_count("a"), name="a")  # type: ignore[attr-defined]
        STEP_GATE["reached"].set()
        await STEP_GATE["go"].wait()
        await s.step(_count("b"), name="b")  # type: ignore[attr-defined]
        await s.step(_count("c"), name="c")  # type: ignore[attr-defined]
        return "done"

    return await agency.with_resumable_scope("work", body)


@pytest.fixture
def step_gate() -> dict[str, anyio.Event]:
    STEP_GATE.update(reached=anyio.Event(), go=anyio.Event())
    return STEP_GATE


async def test_drain_hands_a_run_back_after_its_next_commit(
    store: Store, step_gate: dict[str, anyio.Event]
) -> None:
    await agency.enqueue(pausing_between_steps, run_id="drained", store=store)
    first = Worker(store, poll=0.05)
    async with anyio.create_task_group() as group:
        group.start_soon(first.run)
        await step_gate["reached"].wait()
        group.start_soon(first.drain)
        await wait_for(lambda: first.draining)
        step_gate["go"].set()  # step b commits; then the run stops and goes back
    record = await agency.runs.get("drained", store=store)
    assert (record.status, record.lease_owner, record.finished_at) == ("queued", None, None)
    assert [e.name for e in (await store.load_journal("drained")).entries] == ["a", "b"]
    async with serving(Worker(store, poll=0.05)):
        result = await agency.runs.wait("drained", store=store, timeout=30)
    assert (result.status, result.value) == ("completed", "done")
    assert CALLS == {"drained/a": 1, "drained/b": 1, "drained/c": 1}


async def test_drain_with_a_timeout_interrupts_a_stuck_run_and_hands_it_back(
    store: Store, step_gate: dict[str, anyio.Event]
) -> None:
    await agency.enqueue(pausing_between_steps, run_id="stuck", store=store)
    first = Worker(store, poll=0.05)
    async with anyio.create_task_group() as group:
        group.start_soon(first.run)
        await step_gate["reached"].wait()
        await first.drain(timeout=0.01)  # the run never commits again by itself
    record = await agency.runs.get("stuck", store=store)
    assert (record.status, record.lease_owner, record.error) == ("queued", None, None)
    step_gate["go"].set()
    async with serving(Worker(store, poll=0.05)):
        result = await agency.runs.wait("stuck", store=store, timeout=30)
    assert result.status == "completed"
    assert CALLS == {"stuck/a": 1, "stuck/b": 1, "stuck/c": 1}


async def test_a_dead_workers_run_is_recovered_by_another(
    make_store: Callable[..., Store],
) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)
    await agency.enqueue(three_steps, 4, run_id="orphan", store=store)
    [taken] = await store.claim_queued(queues=["default"], owner="dead", lease_seconds=2, limit=1)
    clock.advance(2.5)  # the dead worker never renewed
    async with serving(Worker(store, poll=0.05)):
        result = await agency.runs.wait("orphan", store=store, timeout=30)
    assert (result.status, result.value) == ("completed", 40)
    assert (await agency.runs.get("orphan", store=store)).attempts == 2
    assert taken.attempts == 1


async def test_a_run_this_worker_cannot_run_goes_back_for_another(store: Store) -> None:
    alien = RunRecord(
        run_id="alien",
        status="queued",
        entry="some_other_app.jobs:unknown",
        arguments='{"args":[],"kwargs":{}}',
        queue="default",
        priority=10,
    )
    await store.enqueue_run(alien)
    await agency.enqueue(three_steps, 1, run_id="mine", store=store)
    async with serving(Worker(store, poll=0.05)):
        assert (await agency.runs.wait("mine", store=store, timeout=30)).value == 10
        record = await agency.runs.get("alien", store=store)
    assert (record.status, record.lease_owner, record.error) == ("queued", None, None)


@agency.entry
def broken() -> None:
    raise ValueError("the order is empty")


async def test_a_failing_run_fails_and_the_worker_goes_on(store: Store) -> None:
    await agency.enqueue(broken, run_id="bad", store=store)
    await agency.enqueue(three_steps, 2, run_id="good", store=store)
    async with serving(Worker(store, concurrency=1, poll=0.05)):
        bad = await agency.runs.wait("bad", store=store, timeout=30)
        good = await agency.runs.wait("good", store=store, timeout=30)
    assert bad.status == "failed"
    assert bad.error is not None
    assert bad.error.message == "the order is empty"
    assert good.value == 20


@agency.entry
async def approval(amount: int) -> str:
    answer = await agency.interrupt("refund", f"Refund ${amount}?")
    return "refunded" if answer.approved else "kept"


async def test_a_paused_run_answered_with_enqueue_is_finished_by_a_worker(store: Store) -> None:
    await agency.enqueue(approval, 42, run_id="refund", store=store)
    async with serving(Worker(store, poll=0.05)):
        paused = await agency.runs.wait("refund", store=store, timeout=30)
        assert paused.status == "paused"
        queued = await agency.respond_to_interrupts(
            "refund", [approve()], store=store, enqueue=True
        )
        assert queued.status == "queued"
        done = await agency.runs.wait("refund", store=store, timeout=30)
    assert (done.status, done.value) == ("completed", "refunded")


async def test_worker_refuses_bad_settings(store: Store) -> None:
    for options, message in [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"lease": 0}, "lease"),
        ({"poll": float("nan")}, "poll"),
        ({"queues": []}, "at least one queue"),
        ({"queues": [""]}, "queue name"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            Worker(store, **options)  # type: ignore[arg-type]


async def test_one_worker_serves_once(store: Store) -> None:
    worker = Worker(store, poll=0.05)
    async with serving(worker):
        await wait_for(lambda: worker.serving)
        with pytest.raises(InvalidArgumentError, match="running already"):
            await worker.run()


class _FlakyStore(MemoryStore):
    """A memory store whose next step commits fail as if the server were down."""

    outages = 0

    async def commit_step(self, entry: JournalEntry, *, owner: str) -> bool:
        if self.outages:
            self.outages -= 1
            raise StoreUnavailableError("the database server is restarting")
        return await super().commit_step(entry, owner=owner)


async def test_a_store_outage_mid_run_hands_the_run_back_instead_of_failing_it() -> None:
    store = _FlakyStore()
    store.outages = 1
    await agency.enqueue(three_steps, 3, run_id="outage", store=store)
    async with serving(Worker(store, poll=0.05)):
        result = await agency.runs.wait("outage", store=store, timeout=30)
    assert (result.status, result.value) == ("completed", 30)
    record = await agency.runs.get("outage", store=store)
    assert record.attempts == 2  # handed back once, then claimed again
    assert CALLS["outage/a"] == 2  # the step whose commit failed ran again; nothing else did
    assert CALLS["outage/b"] == CALLS["outage/c"] == 1
