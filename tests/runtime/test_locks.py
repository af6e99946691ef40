"""Named locks: ``with_lock`` / ``lock`` with ``scope="run"`` and ``scope="global"``.

Covers DESIGN.md §4 "Locks", §8 (the ``scope`` keyword) and the spec's §8 (withLock) with
its "checkpoint/lock" cases: same-name calls run in sequence, re-entry gives /already holds
lock/, a timeout frees the slot for later waiters, the warning names the waiter and the
owner. Global locks are checked across tasks, across processes, and against a holder killed
with SIGKILL. The store methods behind global locks are checked on every store backend.

Nothing here sleeps to wait: tasks are sequenced with events and
``anyio.wait_all_tasks_blocked()``, leases run on a :class:`FakeClock` that the test
advances, and child processes are followed through their pipes. What stays in real time is
what the runtime itself times on the event loop's clock (a lock's ``timeout`` and
``warn_after``, the global-lock poll) and the leases of other processes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from agency_runtime import (
    AgencyError,
    InvalidArgumentError,
    LockReentryError,
    LockTimeoutError,
    MemoryStore,
    OutsideFrameError,
    RuntimeContext,
    SqliteStore,
    Store,
    StoreError,
    _locks,
    agency,
)
from agency_runtime._durable import _leases
from agency_runtime._locks import lock, with_lock
from agency_runtime.testing import FakeClock
from tests.support import asyncio_only, wait_for

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


async def settled() -> None:
    """Let every other task run until it waits for something."""
    await anyio.wait_all_tasks_blocked()


def waiters(name: str) -> int:
    """How many tasks wait for the run-scoped lock ``name`` of the current run."""
    registry = agency.ctx().get(_locks.RUN_LOCKS) or {}
    return len(registry[name].waiters) if name in registry else 0


def holder(name: str) -> str | None:
    registry = agency.ctx().get(_locks.RUN_LOCKS) or {}
    return registry[name].holder if name in registry else None


# -- scope="run" ------------------------------------------------------------------------------


async def test_same_name_calls_run_in_sequence() -> None:
    log: list[str] = []

    async def body(i: int) -> int:
        log.append(f"start {i}")
        await anyio.lowlevel.checkpoint()  # the other tasks run here: they must not enter
        log.append(f"end {i}")
        return i

    results: list[int] = []

    async def worker(i: int) -> None:
        results.append(await with_lock("x", lambda: body(i)))

    with agency.test_context():
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(worker, i)
        assert agency.ctx().get(_locks.RUN_LOCKS) in (None, {})  # an idle lock leaves nothing

    assert sorted(results) == [0, 1, 2]
    for k in range(0, len(log), 2):  # every start is followed by its own end
        who = log[k].split()[1]
        assert log[k : k + 2] == [f"start {who}", f"end {who}"]


async def test_without_a_lock_the_same_bodies_interleave() -> None:
    """The control for the test above: its bodies do overlap when nothing serializes them."""
    log: list[str] = []

    async def body(i: int) -> None:
        log.append(f"start {i}")
        await anyio.lowlevel.checkpoint()
        log.append(f"end {i}")

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(body, i)
    # Two bodies started before any ended (which ones first is the scheduler's choice).
    assert [line.split()[0] for line in log[:2]] == ["start", "start"]


async def test_sync_fn_value_and_context_manager_form() -> None:
    with agency.test_context():
        assert await with_lock("x", lambda: 42) == 42
        async with lock("x") as held:
            assert held.name == "x"
            assert held.scope == "run"
            assert held.owner == f"task:{anyio.get_current_task().id}"
            assert holder("x") == held.owner
        assert holder("x") is None


async def test_fn_runs_in_the_callers_frame() -> None:
    with agency.test_context() as frame:
        seen = await with_lock("x", lambda: agency.ctx())
        assert seen is frame.ctx


async def test_reentry_gives_already_holds_lock() -> None:
    with agency.test_context():

        async def inner() -> None:
            await with_lock("x", lambda: None)

        with pytest.raises(LockReentryError, match=r"Owner 'task:\d+' already holds lock 'x'"):
            await with_lock("x", inner)
        async with lock("x"):
            with pytest.raises(LockReentryError, match="already holds lock 'x'"):
                async with lock("x"):
                    pass  # pragma: no cover
            assert holder("x") is not None  # the failed re-entry did not release the lock
        assert holder("x") is None


async def test_owner_id_shared_between_two_tasks_makes_the_second_a_reentry() -> None:
    errors: list[BaseException] = []

    async def second() -> None:
        try:
            await with_lock("x", lambda: None, owner_id="shared")
        except LockReentryError as exc:
            errors.append(exc)

    with agency.test_context():
        async with lock("x", owner_id="shared") as held:
            assert held.owner == "shared"
            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
    assert len(errors) == 1
    assert "Owner 'shared' already holds lock 'x'" in str(errors[0])


async def test_a_timeout_frees_the_slot_for_later_waiters() -> None:
    order: list[str] = []
    release = anyio.Event()
    timed_out: list[BaseException] = []

    async def holder_task() -> None:
        async with lock("x"):
            order.append("A")
            await release.wait()

    gave_up = anyio.Event()

    async def impatient() -> None:
        try:
            # The lock's timeout runs on the event loop's clock: B gives up in real time.
            await with_lock("x", lambda: order.append("B"), timeout=0.25)
        except LockTimeoutError as exc:
            timed_out.append(exc)
            gave_up.set()

    async def patient() -> None:
        await with_lock("x", lambda: order.append("C"))

    with agency.test_context():
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder_task)
            await settled()
            assert holder("x") is not None
            tg.start_soon(impatient)
            await wait_for(lambda: waiters("x") == 1)
            tg.start_soon(patient)  # queued behind B
            await wait_for(lambda: waiters("x") == 2)
            await gave_up.wait()
            assert waiters("x") == 1  # B's slot is gone at once, not when A exits
            release.set()
        assert agency.ctx().get(_locks.RUN_LOCKS) in (None, {})
    assert order == ["A", "C"]
    assert str(timed_out[0]) == "Timed out waiting for lock 'x' after 0.25s"
    assert isinstance(timed_out[0], TimeoutError)


async def test_timeout_zero_takes_a_free_lock_and_fails_at_once_on_a_held_one() -> None:
    with agency.test_context():
        assert await with_lock("x", lambda: "free", timeout=0) == "free"
        async with anyio.create_task_group() as tg:
            release = anyio.Event()

            async def hold() -> None:
                async with lock("x"):
                    await release.wait()

            tg.start_soon(hold)
            await settled()
            assert holder("x") is not None
            with pytest.raises(LockTimeoutError, match="after 0s"):
                await with_lock("x", lambda: None, timeout=0)
            release.set()


async def test_the_warning_names_the_waiter_and_the_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")

    def messages_so_far() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "agency_runtime.locks"]

    release = anyio.Event()
    with agency.test_context():
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                async with lock("x", owner_id="holder-1"):
                    await release.wait()

            async def release_once_warned() -> None:
                # warn_after runs on the event loop's clock: the warning comes in real time.
                await wait_for(lambda: bool(messages_so_far()))
                release.set()

            tg.start_soon(hold)
            await settled()
            assert holder("x") is not None
            tg.start_soon(release_once_warned)
            await with_lock("x", lambda: None, owner_id="waiter-2", warn_after=0.02)
    messages = messages_so_far()
    assert messages == [
        "Still waiting for lock 'x' after 0.02s (waiter waiter-2, current owner holder-1)"
    ]
    assert caplog.records[0].levelno == logging.WARNING


@pytest.mark.parametrize("warn_after", [0, -1.0])
async def test_warn_after_zero_or_less_disables_the_warning(
    caplog: pytest.LogCaptureFixture, warn_after: float
) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")
    release = anyio.Event()
    with agency.test_context():
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                async with lock("x"):
                    await release.wait()

            tg.start_soon(hold)
            await settled()
            assert holder("x") is not None
            tg.start_soon(partial(with_lock, "x", lambda: None, warn_after=warn_after))
            await settled()
            assert waiters("x") == 1  # it waits; a warn_after <= 0 would have warned at once
            release.set()
    assert not [r for r in caplog.records if r.name == "agency_runtime.locks"]


async def test_waiters_acquire_in_arrival_order() -> None:
    order: list[int] = []
    release = anyio.Event()

    async def hold() -> None:
        async with lock("x"):
            await release.wait()

    async def waiter(i: int) -> None:
        async with lock("x"):
            order.append(i)
            await anyio.lowlevel.checkpoint()  # give the others a chance to cut in (they must not)

    with agency.test_context():
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await settled()
            assert holder("x") is not None
            for i in range(5):
                tg.start_soon(waiter, i)
                await settled()
                assert waiters("x") == i + 1
            release.set()
    assert order == [0, 1, 2, 3, 4]


async def test_different_names_do_not_block_each_other() -> None:
    with agency.test_context():
        async with lock("a"), lock("b"):
            assert holder("a") is not None
            assert holder("b") is not None
            assert await with_lock("c", lambda: "c", timeout=0) == "c"


async def test_release_on_exception() -> None:
    def boom() -> None:
        raise ValueError("boom")

    with agency.test_context():
        with pytest.raises(ValueError, match="boom"):
            await with_lock("x", boom)
        assert agency.ctx().get(_locks.RUN_LOCKS) in (None, {})
        with pytest.raises(KeyError):
            async with lock("x"):
                raise KeyError("k")
        assert await with_lock("x", lambda: "again", timeout=0) == "again"


async def test_cancellation_while_waiting_frees_the_slot() -> None:
    order: list[str] = []
    release = anyio.Event()

    async def hold() -> None:
        async with lock("x"):
            order.append("A")
            await release.wait()

    async def cancel_once_waiting(scope: anyio.CancelScope) -> None:
        await wait_for(lambda: waiters("x") == 1)
        scope.cancel()

    with agency.test_context():
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await settled()
            assert holder("x") is not None
            with anyio.CancelScope() as waiting:
                tg.start_soon(cancel_once_waiting, waiting)
                await with_lock("x", lambda: order.append("cancelled"))
            assert waiting.cancelled_caught
            assert waiters("x") == 0
            tg.start_soon(with_lock, "x", lambda: order.append("C"))
            await settled()
            assert waiters("x") == 1
            release.set()
        assert agency.ctx().get(_locks.RUN_LOCKS) in (None, {})
    assert order == ["A", "C"]


# asyncio only: ``Task.cancel()`` cancels a task whose wake-up is already scheduled, which is
# the window under test. trio (and anyio's cancel scopes) deliver a cancellation at the task's
# next checkpoint instead, and a granted waiter reaches none before it runs its function.
@asyncio_only("asyncio's Task.cancel() of a task whose wake-up is already scheduled")
async def test_a_waiter_cancelled_right_after_being_granted_passes_the_lock_on() -> None:
    """The release hands the lock to B, but B is cancelled before it runs again."""
    order: list[str] = []
    with agency.test_context():
        async with lock("x"):
            b = asyncio.ensure_future(with_lock("x", lambda: order.append("B")))
            await settled()
            assert waiters("x") == 1
            c = asyncio.ensure_future(with_lock("x", lambda: order.append("C")))
            await settled()
            assert waiters("x") == 2
        assert holder("x") is not None  # granted to B, which has not run yet
        b.cancel()
        await asyncio.wait([b, c])
        assert b.cancelled()
        assert agency.ctx().get(_locks.RUN_LOCKS) in (None, {})
    assert order == ["C"]


async def test_runs_do_not_share_run_scoped_locks() -> None:
    store = MemoryStore()
    inside = anyio.Event()
    release = anyio.Event()

    async def first() -> str:
        async with lock("x"):
            inside.set()
            await release.wait()
        return "first"

    async def second() -> str:
        return await with_lock("x", lambda: "second", timeout=0)

    results: list[Any] = []

    async def run(entry: Callable[[], Awaitable[str]]) -> None:
        results.append((await agency.run(entry, store=store)).unwrap())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, first)
        await inside.wait()
        await run(second)
        release.set()
    assert results == ["second", "first"]


async def test_outside_a_frame_names_the_member() -> None:
    with pytest.raises(OutsideFrameError, match=r"agency\.with_lock\(\)"):
        await with_lock("x", lambda: None)
    with pytest.raises(OutsideFrameError, match=r"agency\.lock\(\)"):
        lock("x")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": ""}, "lock name"),
        ({"name": "   "}, "lock name"),
        ({"name": 3}, "lock name"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"timeout": "1"}, "timeout"),
        ({"warn_after": "soon"}, "warn_after"),
        ({"scope": "process"}, "scope"),
        ({"owner_id": ""}, "owner_id"),
        ({"store": "memory://"}, "store= is only used by scope='global'"),
    ],
)
async def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    arguments: dict[str, Any] = {"name": "x", **kwargs}
    name = arguments.pop("name")
    with agency.test_context():
        with pytest.raises(InvalidArgumentError, match=match):
            await with_lock(name, lambda: None, **arguments)
        with pytest.raises(InvalidArgumentError, match=match):
            lock(name, **arguments)


async def test_non_callable_fn_is_a_bad_argument() -> None:
    with agency.test_context(), pytest.raises(InvalidArgumentError, match="callable"):
        await with_lock("x", 42)  # type: ignore[call-overload]


# -- scope="global": the store methods (every backend: the shared ``store`` fixture) -----------


async def test_store_tickets_are_served_in_order(store: Store) -> None:
    a = await store.enqueue_lock("n", "a", 30)
    b = await store.enqueue_lock("n", "b", 30)
    other = await store.enqueue_lock("m", "c", 30)
    assert a < b < other
    assert await store.lock_turn("n", a, "a", 30)
    assert not await store.lock_turn("n", b, "b", 30)
    assert await store.lock_turn("m", other, "c", 30)  # another name has its own queue
    assert not await store.lock_turn("n", a, "someone-else", 30)  # a ticket is its owner's
    await store.release_lock("n", a)
    await store.release_lock("n", a)  # idempotent
    assert not await store.lock_turn("n", a, "a", 30)  # a released ticket never holds
    assert await store.lock_turn("n", b, "b", 30)
    await store.release_lock("n", b)
    c = await store.enqueue_lock("n", "a", 30)
    assert c > other  # tickets are never reused
    assert await store.lock_turn("n", c, "a", 30)


async def test_store_drops_tickets_whose_lease_expired(
    make_store: Callable[..., Store], fake_clock: FakeClock
) -> None:
    store = make_store(clock=fake_clock)
    dead = await store.enqueue_lock("n", "dead", 0.05)
    alive = await store.enqueue_lock("n", "alive", 30)
    assert not await store.lock_turn("n", alive, "alive", 30)
    fake_clock.advance(0.04)
    assert not await store.lock_turn("n", alive, "alive", 30)  # not yet
    fake_clock.advance(0.04)
    assert await store.lock_turn("n", alive, "alive", 30)
    assert not await store.lock_turn("n", dead, "dead", 30)  # dropped: cannot come back


async def test_store_renewal_keeps_a_ticket_alive(
    make_store: Callable[..., Store], fake_clock: FakeClock
) -> None:
    store = make_store(clock=fake_clock)
    first = await store.enqueue_lock("n", "first", 0.1)
    second = await store.enqueue_lock("n", "second", 30)
    for _ in range(4):  # 0.16 s in all: longer than the lease, renewed every 0.04 s
        fake_clock.advance(0.04)
        assert await store.lock_turn("n", first, "first", 0.1)
        assert not await store.lock_turn("n", second, "second", 30)
    fake_clock.advance(0.11)  # no renewal for longer than the lease: the ticket is dropped
    assert await store.lock_turn("n", second, "second", 30)
    assert not await store.lock_turn("n", first, "first", 0.1)


# -- scope="global": the runtime side -----------------------------------------------------------


@pytest.fixture
def short_lease(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(_locks, "GLOBAL_LOCK_LEASE_SECONDS", 0.15)
    return 0.15


async def test_global_lock_serializes_two_runs_in_one_process(store: Store) -> None:
    log: list[str] = []

    async def turn(who: str) -> str:
        for _ in range(3):

            async def body() -> None:
                log.append(f"enter {who}")
                await anyio.lowlevel.checkpoint()  # the other run gets to try here
                log.append(f"exit {who}")

            await with_lock("conversation", body, scope="global")
        return who

    results: list[Any] = []

    async def run(who: str) -> None:
        results.append((await agency.run(turn, who, store=store)).unwrap())

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "a")
        tg.start_soon(run, "b")
    assert sorted(results) == ["a", "b"]
    assert len(log) == 12
    for k in range(0, len(log), 2):
        who = log[k].split()[1]
        assert log[k : k + 2] == [f"enter {who}", f"exit {who}"]


async def test_global_lock_outside_a_run_needs_a_store(store: Store) -> None:
    with agency.test_context():
        with pytest.raises(AgencyError, match="needs a run with a store"):
            await with_lock("x", lambda: None, scope="global")
        async with lock("x", scope="global", store=store) as held:
            assert held.scope == "global"
            assert held.owner == f"{_leases.host()}:{os.getpid()}:{anyio.get_current_task().id}"
        assert await with_lock("x", lambda: 7, scope="global", store="memory://locks") == 7


async def test_a_global_lock_on_a_store_needs_no_frame(store: Store) -> None:
    """A server process (a webhook, a poller) holds store-wide locks outside any run."""
    async with lock("served", scope="global", store=store, lease=5) as held:
        assert (held.scope, held.lost.is_set()) == ("global", False)
        with pytest.raises(LockTimeoutError):
            await with_lock(
                "served", lambda: None, scope="global", store=store, timeout=0, owner_id="other"
            )
    assert await with_lock("served", lambda: "free", scope="global", store=store) == "free"
    with pytest.raises(OutsideFrameError):
        await with_lock("x", lambda: None)  # a run-scoped lock still needs a run
    for bad in (0, -1, float("inf"), "5"):
        with pytest.raises(InvalidArgumentError, match="lease"):
            lock("x", scope="global", store=store, lease=bad)  # type: ignore[arg-type]
    with agency.test_context(), pytest.raises(InvalidArgumentError, match="lease"):
        lock("x", lease=5)


async def test_a_global_lock_whose_lease_ran_out_says_it_is_lost() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    with agency.test_context(ctx=RuntimeContext(clock=clock)):
        async with lock("leader", scope="global", store=store, lease=3) as held:
            await anyio.wait_all_tasks_blocked()  # the renewal sleeps until t = 1
            clock.advance(3.5)  # it wakes too late: the ticket expired at t = 3 ...
            other = await store.enqueue_lock("leader", "other", 30)
            assert await store.lock_turn("leader", other, "other", 30)  # ... and was dropped
            with anyio.fail_after(5):
                await held.lost.wait()
            assert await store.lock_holder("leader") == (other, "other")


# The next two count the memory store's tickets in its own table: they are memory-only.


def _tickets(store: MemoryStore, name: str | None = None) -> int:
    """How many lock tickets ``store`` holds (of lock ``name``, or of every lock)."""
    with store._lock:
        assert store._conn is not None
        where, params = ("", ()) if name is None else (" WHERE name = ?", (name,))
        return int(store._conn.execute(f"SELECT count(*) FROM locks{where}", params).fetchone()[0])


async def test_global_release_on_exception_and_on_cancellation() -> None:
    store = MemoryStore()

    def boom() -> None:
        raise ValueError("boom")

    with agency.test_context():
        with pytest.raises(ValueError, match="boom"):  # the error itself, not a group
            await with_lock("x", boom, scope="global", store=store)
        assert _tickets(store) == 0
        with pytest.raises(KeyError):
            async with lock("x", scope="global", store=store):
                raise KeyError("k")
        assert _tickets(store) == 0
        with anyio.CancelScope() as cancelled:
            async with lock("x", scope="global", store=store):
                cancelled.cancel()
                await anyio.sleep_forever()  # cancelled while it holds the lock
        assert cancelled.cancelled_caught
        assert _tickets(store) == 0
        assert (
            await with_lock("x", lambda: "free", scope="global", store=store, timeout=0) == "free"
        )


async def test_global_reentry_and_shared_owner(tmp_path: Path) -> None:
    store = MemoryStore()
    with agency.test_context():
        async with lock("x", scope="global", store=store):
            with pytest.raises(LockReentryError, match="already holds lock 'x'"):
                await with_lock("x", lambda: None, scope="global", store=store)
        async with lock("y", scope="global", store=store, owner_id="shared"):
            errors: list[BaseException] = []

            async def second() -> None:
                try:
                    await with_lock(
                        "y", lambda: None, scope="global", store=store, owner_id="shared"
                    )
                except LockReentryError as exc:
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(second)
            assert "Owner 'shared' already holds lock 'y'" in str(errors[0])
        # A run-scoped and a global lock of the same name are different locks.
        async with lock("z", scope="global", store=store), lock("z"):
            pass


async def test_global_timeout_and_cancellation_free_the_ticket(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")
    store = MemoryStore()
    order: list[str] = []
    with agency.test_context():
        async with anyio.create_task_group() as tg:
            release = anyio.Event()
            held = anyio.Event()

            async def hold() -> None:
                async with lock("x", scope="global", store=store, owner_id="holder"):
                    held.set()
                    await release.wait()
                order.append("A")

            tg.start_soon(hold)
            await held.wait()
            # timeout and warn_after run on the event loop's clock: real time, by design.
            with pytest.raises(
                LockTimeoutError, match=r"Timed out waiting for lock 'x' after 0\.05s"
            ):
                await with_lock(
                    "x", lambda: None, scope="global", store=store, timeout=0.05, warn_after=0.02
                )

            async def cancel_once_queued(scope: anyio.CancelScope) -> None:
                await wait_for(lambda: _tickets(store, "x") == 2)
                scope.cancel()

            with anyio.CancelScope() as waiting:
                tg.start_soon(cancel_once_queued, waiting)
                await with_lock("x", lambda: None, scope="global", store=store)
            assert waiting.cancelled_caught
            assert _tickets(store, "x") == 1  # only the holder's ticket is left
            tg.start_soon(
                partial(with_lock, "x", lambda: order.append("C"), scope="global", store=store)
            )
            release.set()
    assert order == ["A", "C"]
    assert _tickets(store) == 0
    messages = [r.getMessage() for r in caplog.records if r.name == "agency_runtime.locks"]
    assert messages == [
        "Still waiting for lock 'x' after 0.02s (waiter "
        f"{_leases.host()}:{os.getpid()}:{anyio.get_current_task().id}, current owner holder)"
    ]


async def test_global_lock_lease_is_renewed_while_held(
    short_lease: float, make_store: Callable[..., Store]
) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)  # the leases, and their renewal, run on the fake clock
    entered = anyio.Event()
    release = anyio.Event()

    async def body() -> None:
        entered.set()
        await release.wait()

    with agency.test_context(ctx=RuntimeContext(clock=clock)):
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(with_lock, "x", body, scope="global", store=store))
            await entered.wait()
            await settled()  # the renewal waits for its turn
            for _ in range(9):  # three leases in all, one renewal period at a time
                clock.advance(short_lease / 3)
                await settled()  # the renewal ran
            # Still held, far past its first lease: another owner cannot take it.
            with pytest.raises(LockTimeoutError):
                await with_lock("x", lambda: None, scope="global", store=store, timeout=0)
            release.set()
        assert await with_lock("x", lambda: "b", scope="global", store=store, timeout=0) == "b"


class FailingRelease(MemoryStore):
    async def release_lock(self, name: str, ticket: int) -> None:
        raise StoreError("the store is down")


async def test_a_failed_release_never_masks_the_outcome(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")
    store = FailingRelease()
    with agency.test_context():
        assert await with_lock("x", lambda: "done", scope="global", store=store) == "done"
        with pytest.raises(ValueError, match="body"):
            async with lock("y", scope="global", store=store):
                raise ValueError("body")
    messages = [r.getMessage() for r in caplog.records if r.name == "agency_runtime.locks"]
    assert len(messages) == 2
    assert "Could not release lock 'x'" in messages[0]
    assert "the store is down" in messages[0]


async def test_a_lost_lease_is_logged(
    short_lease: float, make_store: Callable[..., Store], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")
    clock = FakeClock()
    store = make_store(clock=clock)
    with agency.test_context(ctx=RuntimeContext(clock=clock)):
        async with lock("x", scope="global", store=store):
            held = await store.lock_holder("x")
            assert held is not None
            await store.release_lock("x", held[0])  # as if another process dropped it
            await settled()  # the renewal waits for its turn
            clock.advance(short_lease / 3)
            await settled()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "Lost lock 'x'" in errors[0].getMessage()


# -- scope="global": across processes --------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys
    import anyio
    from agency_runtime import agency, _locks

    mode, db, log, arg = sys.argv[1:5]

    def line(text):
        # One append per line: the file's order is the order the lines were written in.
        with open(log, "a") as f:
            f.write(f"{text} {os.getpid()}\\n")

    async def serial():
        print("ready", flush=True)
        sys.stdin.readline()  # "go": both children are up
        for _ in range(int(arg)):
            async def body():
                line("enter")
                await anyio.sleep(0.02)  # real work inside the lock: the other process waits
                line("exit")
            await _locks.with_lock("shared", body, scope="global")

    async def hold():
        async with _locks.lock("shared", scope="global"):
            print("held", flush=True)
            await anyio.sleep_forever()  # until killed

    if mode == "hold":
        _locks.GLOBAL_LOCK_LEASE_SECONDS = float(arg)
    agency.run_sync(serial if mode == "serial" else hold, store=f"sqlite:///{db}").unwrap()
    """
)


class Child:
    """A child process of ``CHILD``, followed through its pipes (nothing polls a file)."""

    def __init__(self, process: anyio.abc.Process, errors: Path) -> None:
        self.process = process
        self.errors = errors
        assert process.stdout is not None
        self._stdout = BufferedByteReceiveStream(process.stdout)

    @classmethod
    async def start(cls, tmp_path: Path, mode: str, arg: str, index: int) -> Child:
        script = tmp_path / "child.py"
        if not script.exists():
            script.write_text(CHILD)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        errors = tmp_path / f"child-{index}.err"
        with errors.open("wb") as stderr:
            process = await anyio.open_process(
                [sys.executable, str(script), mode, str(tmp_path / "locks.db"),
                 str(tmp_path / "log.txt"), arg],
                cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=stderr,
            )  # fmt: skip
        return cls(process, errors)

    async def says(self, word: str) -> None:
        """Wait (at most 20 s) for the line ``word`` on the child's stdout."""
        with anyio.fail_after(20):
            got = await self._stdout.receive_until(b"\n", 1024)
        assert got.decode().strip() == word, self.errors.read_text()

    async def tell(self, word: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(f"{word}\n".encode())

    async def exits_cleanly(self) -> None:
        with anyio.fail_after(20):
            await self.process.wait()
        assert self.process.returncode == 0, self.errors.read_text()

    async def close(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
        with anyio.CancelScope(shield=True):
            await self.process.aclose()


@pytest.mark.slow
@asyncio_only("once, not per backend: the subject is the two child processes; this test only pipes")
async def test_two_processes_serialize_on_one_global_lock(tmp_path: Path) -> None:
    children = [await Child.start(tmp_path, "serial", "4", i) for i in range(2)]
    try:
        for child in children:
            await child.says("ready")
        for child in children:
            await child.tell("go")
        for child in children:
            await child.exits_cleanly()
    finally:
        for child in children:
            await child.close()
    lines = [line.split() for line in (tmp_path / "log.txt").read_text().splitlines()]
    assert len(lines) == 16
    assert {pid for _, pid in lines} == {str(c.process.pid) for c in children}
    for k in range(0, len(lines), 2):  # in the order written: never two holders at once
        (enter, pid_in), (leave, pid_out) = lines[k], lines[k + 1]
        assert (enter, leave) == ("enter", "exit")
        assert pid_in == pid_out


@pytest.mark.slow
async def test_a_killed_holder_blocks_others_no_longer_than_its_lease(tmp_path: Path) -> None:
    lease = 0.4  # the child's leases run on its system clock: real seconds
    child = await Child.start(tmp_path, "hold", str(lease), 0)
    try:
        await child.says("held")
        store = SqliteStore(tmp_path / "locks.db")
        with agency.test_context():
            # Held, and kept held past its lease by renewal while the holder lives.
            with pytest.raises(LockTimeoutError):
                await with_lock(
                    "shared", lambda: None, scope="global", store=store, timeout=lease * 1.5
                )
            os.kill(child.process.pid, signal.SIGKILL)
            with anyio.fail_after(20):
                await child.process.wait()
            # Once it is dead, the lock is free within its lease (and a poll's slack).
            got = await with_lock(
                "shared", lambda: "mine", scope="global", store=store, timeout=lease + 0.5
            )
        assert got == "mine"
        store.close()
    finally:
        await child.close()
