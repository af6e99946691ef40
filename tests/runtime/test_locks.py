"""Named locks: ``with_lock`` / ``lock`` with ``scope="run"`` and ``scope="global"``.

Covers DESIGN.md §4 "Locks", §8 (the ``scope`` keyword) and the spec's §8 (withLock) with
its "checkpoint/lock" cases: same-name calls run in sequence, re-entry gives /already holds
lock/, a timeout frees the slot for later waiters, the warning names the waiter and the
owner. Global locks are checked across tasks, across processes, and against a holder killed
with SIGKILL. The store methods behind global locks are checked on both stores.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agency_runtime import (
    AgencyError,
    InvalidArgumentError,
    LockReentryError,
    LockTimeoutError,
    MemoryStore,
    OutsideFrameError,
    SqliteStore,
    Store,
    StoreError,
    _locks,
    agency,
)
from agency_runtime._durable import _leases
from agency_runtime._locks import lock, with_lock

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


async def wait_until(predicate: Callable[[], bool], limit: float = 5.0) -> None:
    """Yield to the event loop until ``predicate()`` holds."""
    with anyio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - polls state nobody signals
            await anyio.sleep(0.001)


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
        await anyio.sleep(0.01)
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
        await anyio.sleep(0.01)
        log.append(f"end {i}")

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(body, i)
    assert log[:2] == ["start 0", "start 1"]


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

    async def impatient() -> None:
        try:
            await with_lock("x", lambda: order.append("B"), timeout=0.05)
        except LockTimeoutError as exc:
            timed_out.append(exc)

    async def patient() -> None:
        await with_lock("x", lambda: order.append("C"))

    with agency.test_context():
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder_task)
            await wait_until(lambda: holder("x") is not None)
            tg.start_soon(impatient)
            await wait_until(lambda: waiters("x") == 1)
            tg.start_soon(patient)  # queued behind B
            await wait_until(lambda: waiters("x") == 2)
            await wait_until(lambda: bool(timed_out))
            assert waiters("x") == 1  # B's slot is gone at once, not when A exits
            release.set()
        assert agency.ctx().get(_locks.RUN_LOCKS) in (None, {})
    assert order == ["A", "C"]
    assert str(timed_out[0]) == "Timed out waiting for lock 'x' after 0.05s"
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
            await wait_until(lambda: holder("x") is not None)
            with pytest.raises(LockTimeoutError, match="after 0s"):
                await with_lock("x", lambda: None, timeout=0)
            release.set()


async def test_the_warning_names_the_waiter_and_the_owner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")
    with agency.test_context():
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                async with lock("x", owner_id="holder-1"):
                    await anyio.sleep(0.15)

            tg.start_soon(hold)
            await wait_until(lambda: holder("x") is not None)
            await with_lock("x", lambda: None, owner_id="waiter-2", warn_after=0.02)
    messages = [r.getMessage() for r in caplog.records if r.name == "agency_runtime.locks"]
    assert messages == [
        "Still waiting for lock 'x' after 0.02s (waiter waiter-2, current owner holder-1)"
    ]
    assert caplog.records[0].levelno == logging.WARNING


@pytest.mark.parametrize("warn_after", [0, -1.0])
async def test_warn_after_zero_or_less_disables_the_warning(
    caplog: pytest.LogCaptureFixture, warn_after: float
) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")
    with agency.test_context():
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                async with lock("x"):
                    await anyio.sleep(0.05)

            tg.start_soon(hold)
            await wait_until(lambda: holder("x") is not None)
            await with_lock("x", lambda: None, warn_after=warn_after)
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
            await wait_until(lambda: holder("x") is not None)
            for i in range(5):
                tg.start_soon(waiter, i)
                await wait_until(lambda i=i: waiters("x") == i + 1)  # type: ignore[misc]
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

    with agency.test_context():
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await wait_until(lambda: holder("x") is not None)
            with anyio.move_on_after(0.05):
                await with_lock("x", lambda: order.append("cancelled"))
            assert waiters("x") == 0
            tg.start_soon(with_lock, "x", lambda: order.append("C"))
            await wait_until(lambda: waiters("x") == 1)
            release.set()
        assert agency.ctx().get(_locks.RUN_LOCKS) in (None, {})
    assert order == ["A", "C"]


async def test_a_waiter_cancelled_right_after_being_granted_passes_the_lock_on() -> None:
    """The release hands the lock to B, but B is cancelled before it runs again."""
    order: list[str] = []
    with agency.test_context():
        async with lock("x"):
            b = asyncio.ensure_future(with_lock("x", lambda: order.append("B")))
            await wait_until(lambda: waiters("x") == 1)
            c = asyncio.ensure_future(with_lock("x", lambda: order.append("C")))
            await wait_until(lambda: waiters("x") == 2)
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


# -- scope="global": the store methods ---------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "s.db")
    yield made
    made.close()


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


async def test_store_drops_tickets_whose_lease_expired(store: Store) -> None:
    dead = await store.enqueue_lock("n", "dead", 0.05)
    alive = await store.enqueue_lock("n", "alive", 30)
    assert not await store.lock_turn("n", alive, "alive", 30)
    await anyio.sleep(0.08)
    assert await store.lock_turn("n", alive, "alive", 30)
    assert not await store.lock_turn("n", dead, "dead", 30)  # dropped: cannot come back


async def test_store_renewal_keeps_a_ticket_alive(store: Store) -> None:
    first = await store.enqueue_lock("n", "first", 0.1)
    second = await store.enqueue_lock("n", "second", 30)
    for _ in range(4):
        await anyio.sleep(0.04)
        assert await store.lock_turn("n", first, "first", 0.1)
        assert not await store.lock_turn("n", second, "second", 30)


# -- scope="global": the runtime side -----------------------------------------------------------


@pytest.fixture
def short_lease(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(_locks, "GLOBAL_LOCK_LEASE_SECONDS", 0.15)
    return 0.15


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_global_lock_serializes_two_runs_in_one_process(kind: str, tmp_path: Path) -> None:
    store: Store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "g.db")
    log: list[str] = []

    async def turn(who: str) -> str:
        for _ in range(3):

            async def body() -> None:
                log.append(f"enter {who}")
                await anyio.sleep(0.01)
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
    store.close()


async def test_global_lock_outside_a_run_needs_a_store(tmp_path: Path) -> None:
    with agency.test_context():
        with pytest.raises(AgencyError, match="needs a run with a store"):
            await with_lock("x", lambda: None, scope="global")
        store = SqliteStore(tmp_path / "g.db")
        async with lock("x", scope="global", store=store) as held:
            assert held.scope == "global"
            assert held.owner == f"{_leases.HOST}:{os.getpid()}:{anyio.get_current_task().id}"
        assert await with_lock("x", lambda: 7, scope="global", store="memory://locks") == 7
        store.close()


async def test_global_release_on_exception_and_on_cancellation() -> None:
    store = MemoryStore()

    def boom() -> None:
        raise ValueError("boom")

    with agency.test_context():
        with pytest.raises(ValueError, match="boom"):  # the error itself, not a group
            await with_lock("x", boom, scope="global", store=store)
        assert not store._lock_queues
        with pytest.raises(KeyError):
            async with lock("x", scope="global", store=store):
                raise KeyError("k")
        assert not store._lock_queues
        with anyio.move_on_after(0.02) as cancelled:
            async with lock("x", scope="global", store=store):
                await anyio.sleep(5)
        assert cancelled.cancelled_caught
        assert not store._lock_queues
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
            with pytest.raises(
                LockTimeoutError, match=r"Timed out waiting for lock 'x' after 0\.05s"
            ):
                await with_lock(
                    "x", lambda: None, scope="global", store=store, timeout=0.05, warn_after=0.02
                )
            with anyio.move_on_after(0.05):
                await with_lock("x", lambda: None, scope="global", store=store)
            assert store._lock_queues is not None
            assert len(store._lock_queues["x"]) == 1  # only the holder's ticket is left
            tg.start_soon(
                partial(with_lock, "x", lambda: order.append("C"), scope="global", store=store)
            )
            release.set()
    assert order == ["A", "C"]
    assert not store._lock_queues
    messages = [r.getMessage() for r in caplog.records if r.name == "agency_runtime.locks"]
    assert messages == [
        "Still waiting for lock 'x' after 0.02s (waiter "
        f"{_leases.HOST}:{os.getpid()}:{anyio.get_current_task().id}, current owner holder)"
    ]


async def test_global_lock_lease_is_renewed_while_held(short_lease: float, tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "g.db")
    log: list[str] = []

    async def body(who: str) -> None:
        log.append(f"enter {who}")
        await anyio.sleep(short_lease * 3)  # far longer than one lease
        log.append(f"exit {who}")

    with agency.test_context():
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(with_lock, "x", lambda: body("a"), scope="global", store=store))
            await wait_until(lambda: bool(log))
            tg.start_soon(partial(with_lock, "x", lambda: body("b"), scope="global", store=store))
    assert log == ["enter a", "exit a", "enter b", "exit b"]
    store.close()


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


async def test_a_lost_lease_is_logged(short_lease: float, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="agency_runtime.locks")
    store = MemoryStore()
    with agency.test_context():
        async with lock("x", scope="global", store=store):
            assert store._lock_queues is not None
            (ticket,) = store._lock_queues["x"]
            await store.release_lock("x", ticket)  # as if another process dropped it
            await anyio.sleep(short_lease)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "Lost lock 'x'" in errors[0].getMessage()


# -- scope="global": across processes --------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys, time
    import anyio
    from agency_runtime import agency, _locks

    mode, db, log, arg, workdir = sys.argv[1:6]

    def line(text):
        with open(log, "a") as f:
            f.write(f"{text} {os.getpid()} {time.time():.6f}\\n")

    async def serial():
        open(os.path.join(workdir, f"ready-{os.getpid()}"), "w").close()
        while not os.path.exists(os.path.join(workdir, "go")):
            await anyio.sleep(0.005)
        for _ in range(int(arg)):
            async def body():
                line("enter")
                await anyio.sleep(0.02)
                line("exit")
            await _locks.with_lock("shared", body, scope="global")

    async def hold():
        async with _locks.lock("shared", scope="global"):
            line("held")
            await anyio.sleep(60)

    if mode == "hold":
        _locks.GLOBAL_LOCK_LEASE_SECONDS = float(arg)
    agency.run_sync(serial if mode == "serial" else hold, store=f"sqlite:///{db}").unwrap()
    """
)


def start_child(tmp_path: Path, mode: str, arg: str, index: int) -> subprocess.Popen[bytes]:
    script = tmp_path / "child.py"
    if not script.exists():
        script.write_text(CHILD)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with (tmp_path / f"child-{index}.err").open("wb") as errors:
        return subprocess.Popen(
            [
                sys.executable,
                str(script),
                mode,
                str(tmp_path / "locks.db"),
                str(tmp_path / "log.txt"),
                arg,
                str(tmp_path),
            ],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=errors,
            stderr=errors,
        )


async def wait_for_exit(child: subprocess.Popen[bytes], tmp_path: Path, index: int) -> None:
    with anyio.fail_after(20):
        while child.poll() is None:  # noqa: ASYNC110 - a child process exiting
            await anyio.sleep(0.01)
    output = (tmp_path / f"child-{index}.err").read_text()
    assert child.returncode == 0, output


@pytest.mark.slow
async def test_two_processes_serialize_on_one_global_lock(tmp_path: Path) -> None:
    children = [start_child(tmp_path, "serial", "4", i) for i in range(2)]
    try:
        await wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 2, limit=20)
        (tmp_path / "go").touch()
        for i, child in enumerate(children):
            await wait_for_exit(child, tmp_path, i)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    lines = [line.split() for line in (tmp_path / "log.txt").read_text().splitlines()]
    assert len(lines) == 16
    assert {pid for _, pid, _ in lines} == {str(c.pid) for c in children}
    lines.sort(key=lambda parts: float(parts[2]))
    for k in range(0, len(lines), 2):
        (enter, pid_in, t_in), (leave, pid_out, t_out) = lines[k], lines[k + 1]
        assert (enter, leave) == ("enter", "exit")
        assert pid_in == pid_out
        assert float(t_in) <= float(t_out)


@pytest.mark.slow
async def test_a_killed_holder_blocks_others_no_longer_than_its_lease(tmp_path: Path) -> None:
    lease = 0.4
    child = start_child(tmp_path, "hold", str(lease), 0)
    log = tmp_path / "log.txt"
    try:
        await wait_until(lambda: log.exists() and "held" in log.read_text(), limit=20)
        store = SqliteStore(tmp_path / "locks.db")
        with agency.test_context():
            # Held, and kept held past its lease by renewal while the holder lives.
            with pytest.raises(LockTimeoutError):
                await with_lock(
                    "shared", lambda: None, scope="global", store=store, timeout=lease * 1.5
                )
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            started = time.monotonic()
            got = await with_lock("shared", lambda: "mine", scope="global", store=store, timeout=5)
            waited = time.monotonic() - started
        assert got == "mine"
        assert waited < lease + 0.5
        store.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
