"""The run boundary: results, failures, idempotent run ids, conflicts, leases, cancellation.

Runs use the shared ``store`` fixture (every backend). Leases run on a fake clock the tests
advance; nothing sleeps to wait.
"""

from __future__ import annotations

import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from agency_runtime import (
    EventLoopRunningError,
    InvalidArgumentError,
    MemoryStore,
    ResultSerializationError,
    RunConflictError,
    RunFailedError,
    RunNotFoundError,
    RunRecord,
    RunResult,
    SqliteStore,
    Store,
    agency,
)
from agency_runtime._boundary import _run as run_module
from agency_runtime._store import Claim
from agency_runtime.testing import FakeClock
from tests.forked import ForkServer

pytestmark = pytest.mark.anyio


class Order(BaseModel):
    item: str
    quantity: int


calls: list[str] = []


async def make_order(item: str, quantity: int = 1) -> Order:
    calls.append(item)
    return Order(item=item, quantity=quantity)


def pair() -> tuple[int, int]:
    return (1, 2)


def untyped_pair():  # type: ignore[no-untyped-def]
    return (1, 2)


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


# -- completing, failing -------------------------------------------------------------------


async def test_an_async_entry_runs_in_a_frame_of_its_own(store: Store) -> None:
    seen: dict[str, object] = {}

    async def entry(name: str) -> str:
        seen["run_id"] = agency.ctx().run_id
        seen["active"] = agency.thread.store().active_id()
        agency.thread.user(f"hello {name}")
        agency.add_cost(0.1)
        agency.add_cost(0.2)
        agency.add_tokens(12)
        return f"hi {name}"

    result = await agency.run(entry, "ada", store=store)
    assert result.status == "completed"
    assert result.ok
    assert result.value == "hi ada"
    assert result.unwrap() == "hi ada"
    assert seen["run_id"] == result.run_id
    assert seen["active"] == "0"
    assert (result.cost, result.tokens) == (0.3, 12)
    assert result.error is None
    assert not result.replayed
    assert result.duration is not None
    assert result.started_at is not None
    assert result.finished_at is not None
    assert result.started_at <= result.finished_at
    assert agency.ctx_maybe() is None
    stored = await agency.runs.get(result.run_id, store=store)
    assert stored.status == "completed"
    assert stored.value == '"hi ada"'
    assert stored.cost_pico == 300_000_000_000
    assert stored.tokens == 12


async def test_a_sync_entry_runs_too(store: Store) -> None:
    result = await agency.run(lambda a, b: a + b, 2, b=3, store=store)
    assert result.value == 5


def test_run_sync_runs_a_script_entry(tmp_path: Path) -> None:
    result = agency.run_sync(pair, run_id="sync-1", store=f"sqlite:///{tmp_path}/s.db")
    assert result.value == (1, 2)
    assert result.run_id == "sync-1"


async def test_run_sync_inside_an_event_loop_is_a_clear_error() -> None:
    with pytest.raises(EventLoopRunningError, match=r"await agency\.run"):
        agency.run_sync(pair, store=MemoryStore())


async def test_an_entry_that_raises_gives_a_failed_result(store: Store) -> None:
    def entry() -> None:
        agency.add_cost(0.5)
        raise ValueError("the order is empty")

    result = await agency.run(entry, run_id="bad", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert (result.error.type, result.error.message) == ("ValueError", "the order is empty")
    assert isinstance(result.exception, ValueError)
    assert result.cost == 0.5  # money spent before the failure is still billed
    with pytest.raises(RunFailedError, match="the order is empty") as caught:
        result.unwrap()
    assert caught.value.__cause__ is result.exception
    assert "exception" not in result.model_dump()
    stored = await agency.runs.get("bad", store=store)
    assert stored.status == "failed"
    assert stored.error == result.error


def charge_card(amount: int) -> int:
    if amount > 100:
        raise ValueError(f"declined: {amount} over the limit (key sk-test-secret-0042)")
    return amount


async def test_a_failed_run_names_its_failing_step_and_keeps_its_traceback_scrubbed(
    store: Store,
) -> None:
    agency.register_model(agency.Model("fake/echo", name="billing", api_key="sk-test-secret-0042"))

    async def entry() -> int:
        async def body(s: Any) -> int:
            first = await s.step(lambda: charge_card(5), name="small")
            return first + await s.step(lambda: charge_card(500), name="charge")

        return await agency.with_resumable_scope("pay", body)

    try:
        result = await agency.run(entry, run_id="declined", store=store)
    finally:
        agency.unregister_model("billing")
    assert result.error is not None
    assert result.error.step == "charge at pay/1"  # the unit the error came out of
    trace = result.error.traceback
    assert trace is not None
    assert "in charge_card" in trace
    assert 'raise ValueError(f"declined: {amount} over the limit' in trace
    assert trace.rstrip().endswith("ValueError: declined: 500 over the limit (key **********)")
    assert "sk-test-secret-0042" not in trace + result.error.message  # a model's key, masked
    stored = await agency.runs.get("declined", store=store)
    assert stored.error == result.error  # kept by the store


async def test_an_error_raised_outside_any_step_names_no_step(store: Store) -> None:
    def entry() -> None:
        raise KeyError("nope")

    result = await agency.run(entry, store=store)
    assert result.error is not None
    assert result.error.step is None
    assert result.error.traceback is not None
    assert "KeyError: 'nope'" in result.error.traceback


async def test_a_failed_run_runs_again_and_its_spend_accumulates(store: Store) -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        agency.add_cost(1.0)
        if len(attempts) == 1:
            raise ConnectionError("transient")
        return "ok"

    first = await agency.run(flaky, run_id="flaky", store=store)
    assert first.status == "failed"
    second = await agency.run(flaky, run_id="flaky", store=store)
    assert second.status == "completed"
    assert second.value == "ok"
    assert second.cost == 2.0
    assert (await agency.runs.get("flaky", store=store)).attempts == 2


async def test_a_value_that_cannot_be_stored_fails_the_run_clearly(store: Store) -> None:
    result = await agency.run(lambda: object(), store=store)
    assert result.status == "failed"
    assert isinstance(result.exception, ResultSerializationError)
    assert result.error is not None
    assert "cannot be stored as JSON" in result.error.message
    assert result.value is None


async def test_results_are_round_tripped_through_json_like_a_replay(store: Store) -> None:
    typed = await agency.run(pair, store=store)
    assert typed.value == (1, 2)  # the return annotation revives the tuple
    untyped = await agency.run(untyped_pair, store=store)
    assert untyped.value == [1, 2]  # no annotation: JSON data, the same as on replay


# -- bad input -----------------------------------------------------------------------------


async def test_a_non_callable_entry_is_a_clear_error(store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="callable entry"):
        await agency.run("main", store=store)  # type: ignore[arg-type]


@pytest.mark.parametrize("run_id", ["", "   ", 7, "x" * 600, "line\nbreak"])
async def test_bad_run_ids_are_clear_errors(store: Store, run_id: object) -> None:
    with pytest.raises(InvalidArgumentError, match="run_id"):
        await agency.run(pair, run_id=run_id, store=store)  # type: ignore[arg-type]


async def test_arguments_that_cannot_be_stored_are_refused_before_anything_runs(
    store: Store,
) -> None:
    with pytest.raises(InvalidArgumentError, match="keyword argument 'when'"):
        await agency.run(make_order, "tea", when=object(), store=store)
    assert calls == []
    assert await store.list_runs() == []


async def test_a_bad_store_argument_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown store URL scheme"):
        await agency.run(pair, store="mysql://x")


async def test_a_bad_model_is_a_clear_error(store: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="model"):
        await agency.run(pair, model="  ", store=store)


# -- idempotent run ids --------------------------------------------------------------------


async def test_a_completed_run_id_returns_the_stored_result_without_running(
    store: Store,
) -> None:
    first = await agency.run(make_order, "tea", quantity=2, run_id="order-1", store=store)
    again = await agency.run(make_order, "tea", quantity=2, run_id="order-1", store=store)
    assert calls == ["tea"]
    assert again.replayed
    assert again.value == Order(item="tea", quantity=2)  # revived into the return type
    assert isinstance(again.value, Order)
    assert (again.status, again.run_id) == ("completed", "order-1")
    assert again.created_at == first.created_at


async def test_reusing_a_run_id_with_other_arguments_says_what_differs(store: Store) -> None:
    await agency.run(make_order, "tea", quantity=2, run_id="order-1", store=store)
    with pytest.raises(RunConflictError) as caught:
        await agency.run(make_order, "coffee", quantity=3, run_id="order-1", store=store)
    message = str(caught.value)
    assert 'positional argument 0: stored "tea", given "coffee"' in message
    assert "keyword argument 'quantity': stored 2, given 3" in message
    with pytest.raises(RunConflictError, match="not given"):
        await agency.run(make_order, "tea", run_id="order-1", store=store)
    with pytest.raises(RunConflictError, match="entry: stored"):
        await agency.run(pair, run_id="order-1", store=store)
    assert calls == ["tea"]


def test_run_ids_are_idempotent_across_processes(tmp_path: Path, fork_server: ForkServer) -> None:
    module = tmp_path / "order_entry.py"
    module.write_text(
        textwrap.dedent(
            """
        import pathlib
        from agency_runtime import agency

        def place(item: str) -> dict:
            ledger = pathlib.Path(__file__).with_name("ledger.txt")
            with ledger.open("a") as f:
                f.write(item + "\\n")
            agency.add_cost(0.25)
            return {"item": item}
        """
        )
    )
    url = f"sqlite:///{tmp_path}/shared.db"
    script = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import order_entry; "
        "from agency_runtime import agency; "
        f"r = agency.run_sync(order_entry.place, 'tea', run_id='x1', store={url!r}); "
        "print(r.status, r.replayed)"
    )
    for expected in ("completed False", "completed True"):  # two new processes
        done = fork_server.run("code", script, check=True, timeout=60)
        assert done.stdout.strip() == expected
    assert (tmp_path / "ledger.txt").read_text() == "tea\n"
    sys.path.insert(0, str(tmp_path))
    try:
        import order_entry  # type: ignore[import-not-found]

        here = agency.run_sync(order_entry.place, "tea", run_id="x1", store=url)
    finally:
        sys.path.remove(str(tmp_path))
    assert here.replayed
    assert (here.value, here.cost) == ({"item": "tea"}, 0.25)
    assert (tmp_path / "ledger.txt").read_text() == "tea\n"


# -- concurrency and leases ----------------------------------------------------------------


async def test_concurrent_calls_with_one_run_id_execute_once(store: Store) -> None:
    release = anyio.Event()
    executions: list[int] = []

    async def slow() -> str:
        executions.append(1)
        await release.wait()
        return "done"

    results: list[RunResult] = []

    async def call() -> None:
        results.append(await agency.run(slow, run_id="once", store=store))

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(call)
        await anyio.wait_all_tasks_blocked()  # one executes, two wait for it
        assert executions == [1]
        release.set()
    assert executions == [1]
    assert [r.value for r in results] == ["done"] * 3
    assert sorted(r.replayed for r in results) == [False, True, True]


async def test_a_waiter_returns_the_holders_failure_instead_of_running_again(
    store: Store,
) -> None:
    release = anyio.Event()
    executions: list[int] = []

    async def fails() -> None:
        executions.append(1)
        await release.wait()
        raise RuntimeError("boom")

    results: list[RunResult] = []

    async def call() -> None:
        results.append(await agency.run(fails, run_id="f", store=store))

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        group.start_soon(call)
        await anyio.wait_all_tasks_blocked()  # one executes, one waits for it
        assert executions == [1]
        release.set()
    assert executions == [1]
    assert [r.status for r in results] == ["failed", "failed"]


@pytest.mark.parametrize("store_backend", ["postgres"])
async def test_a_runtime_clock_ahead_of_the_servers_never_takes_a_live_lease(
    make_store: Callable[..., Store], fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL store leases on the server's clock. A waiter whose runtime clock runs a
    year ahead reads the holder's lease as expired, asks the store for the run, and is refused:
    the store judges the lease on its own clock, so the run still executes once."""
    store = make_store()  # no clock: the server's
    fake_clock.advance(365 * 86400.0)
    release = anyio.Event()
    executions: list[int] = []
    refused: list[str] = []
    tried_thrice = anyio.Event()  # the waiter tried to take the lease, again and again
    claim = store.claim_run

    async def counted(record: RunRecord, **kwargs: Any) -> Claim:
        taken = await claim(record, **kwargs)
        if not taken.acquired:
            refused.append(record.run_id)
            if len(refused) >= 3:
                tried_thrice.set()
        return taken

    monkeypatch.setattr(store, "claim_run", counted)

    async def slow() -> str:
        executions.append(1)
        await release.wait()
        return "done"

    results: list[RunResult] = []

    async def call() -> None:
        results.append(await agency.run(slow, run_id="ahead", store=store))

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        group.start_soon(call)
        with anyio.fail_after(30):
            await tried_thrice.wait()
        assert executions == [1]
        release.set()
    assert executions == [1]
    assert sorted(r.replayed for r in results) == [False, True]


async def test_a_dead_holder_is_taken_over_when_its_lease_expires(
    make_store: Callable[..., Store], fake_clock: FakeClock
) -> None:
    store = make_store(clock=fake_clock)
    ghost = RunRecord(
        run_id="orphan",
        status="running",
        entry=run_module.RUNTIME.entries.entry_ref(make_order),
        arguments=run_module.encode_arguments(("tea",), {}),
    )
    claim = await store.claim_run(ghost, owner="ghost", lease_seconds=0.2)
    assert claim.acquired
    results: list[RunResult] = []

    async def call() -> None:
        results.append(await agency.run(make_order, "tea", run_id="orphan", store=store))

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        await anyio.wait_all_tasks_blocked()
        fake_clock.advance(0.19)
        await anyio.wait_all_tasks_blocked()
        assert (results, calls) == ([], [])  # it waits while the lease is alive
        fake_clock.advance(0.01)  # the lease expires: the waiter takes the run over
    (result,) = results
    assert result.status == "completed"
    assert calls == ["tea"]
    assert (await agency.runs.get("orphan", store=store)).attempts == 2


async def test_the_holder_renews_its_lease_while_it_runs(
    make_store: Callable[..., Store], fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "LEASE_SECONDS", 0.15)
    store = make_store(clock=fake_clock)
    renewed: list[float] = []
    results: list[RunResult] = []

    async def long() -> str:
        for _ in range(6):
            await agency.ctx().clock.sleep(0.05)  # work that takes 0.05 s of the run's clock
            record = await store.get_run("long")
            assert record is not None
            assert record.lease_expires_at is not None
            renewed.append(record.lease_expires_at)
        return "ok"

    async def call() -> None:
        results.append(await agency.run(long, run_id="long", store=store))

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        for _ in range(6):  # 0.3 s of fake time: two lease periods
            await anyio.wait_all_tasks_blocked()
            fake_clock.advance(0.05)
    assert results[0].value == "ok"
    assert len(renewed) == 6
    assert renewed[-1] > renewed[0]  # still leased after more than one lease period
    assert renewed[-1] > fake_clock.time() - 0.05  # renewed within the last period
    assert (await store.get_run("long")).lease_owner is None  # type: ignore[union-attr]


async def test_on_the_system_clock_the_holder_renews_and_its_end_stops_the_renewals(
    make_store: Callable[..., Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewals wait on the machine's clock (renewed every third of the lease), and a
    run's end stops them at once: the run does not wait out a renewal period."""
    monkeypatch.setattr(run_module, "LEASE_SECONDS", 0.3)  # renewed after 0.1 s
    store = make_store()
    renewed = anyio.Event()
    renew = store.renew_lease

    async def renewing(run_id: str, **kwargs: Any) -> bool:
        done = await renew(run_id, **kwargs)
        renewed.set()
        return done

    monkeypatch.setattr(store, "renew_lease", renewing)

    async def expiry() -> float:
        record = await store.get_run("renewed")
        assert record is not None
        assert record.lease_expires_at is not None
        return record.lease_expires_at

    async def long() -> str:
        first = await expiry()
        with anyio.fail_after(30):
            await renewed.wait()
        assert await expiry() > first  # the renewal moved the lease on
        return "ok"

    result = await agency.run(long, run_id="renewed", store=store)
    assert result.value == "ok"
    assert (await store.get_run("renewed")).lease_owner is None  # type: ignore[union-attr]

    monkeypatch.setattr(run_module, "LEASE_SECONDS", 60.0)  # a renewal due in 20 s
    began = time.monotonic()
    quick = await agency.run(lambda: "done", run_id="quick", store=store)
    assert quick.value == "done"
    assert time.monotonic() - began < 10  # its end stopped the renewals: no 20 s wait


def test_two_processes_write_runs_to_one_sqlite_file(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    url = f"sqlite:///{tmp_path}/busy.db"
    script = textwrap.dedent(
        f"""
        import sys
        from agency_runtime import agency
        def step(i: int) -> int:
            agency.add_cost(0.01)
            return i * 2
        for i in range(40):
            r = agency.run_sync(step, i, run_id=f"{{sys.argv[1]}}-{{i}}", store={url!r})
            assert r.status == "completed" and r.value == i * 2, r
        print("ok")
        """
    )
    workers = [fork_server.start("code", script, name) for name in ("a", "b")]  # at once
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        assert out.strip() == "ok"
    store = SqliteStore(tmp_path / "busy.db")
    try:
        runs = anyio.run(lambda: store.list_runs(limit=1000))
        assert len(runs) == 80
        assert {r.status for r in runs} == {"completed"}
    finally:
        store.close()


# -- cancellation --------------------------------------------------------------------------


async def test_ctx_cancel_stops_the_run_and_is_final(store: Store) -> None:
    reached: list[str] = []

    async def entry() -> str:
        agency.ctx().cancel("enough")
        await anyio.lowlevel.checkpoint()  # the next await is cancelled
        reached.append("after")
        return "never"

    result = await agency.run(entry, run_id="c", store=store)
    assert result.status == "cancelled"
    assert reached == []
    assert result.error is not None
    assert result.error.type == "AgencyCancelledError"
    assert "enough" in result.error.message
    with pytest.raises(RunFailedError, match="cancelled"):
        result.unwrap()
    again = await agency.run(entry, run_id="c", store=store)
    assert again.status == "cancelled"
    assert again.replayed


async def test_raising_a_cancellation_error_cancels_the_run(store: Store) -> None:
    def entry() -> None:
        agency.ctx().cancel()
        agency.abort_signal().raise_if_aborted()

    result = await agency.run(entry, store=store)
    assert result.status == "cancelled"


# -- options -------------------------------------------------------------------------------


async def test_the_model_comes_from_the_argument_else_agency_model(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def model() -> str | None:
        return agency.ctx().model

    assert (await agency.run(model, model="fake/echo", store=store)).value == "fake/echo"
    assert (await agency.run(model, store=store)).value is None
    monkeypatch.setenv("AGENCY_MODEL", "fake/env")
    assert (await agency.run(model, store=store)).value == "fake/env"


async def test_agency_store_selects_the_default_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = await agency.run(pair, run_id="default-store")
    assert (tmp_path / ".agency" / "agency.db").exists()
    assert (await agency.runs.get("default-store")).run_id == result.run_id
    monkeypatch.setenv("AGENCY_STORE", "memory://env-store")
    await agency.run(pair, run_id="env-run")
    assert (await agency.runs.get("env-run", store="memory://env-store")).status == "completed"


async def test_runs_admin_view(store: Store) -> None:
    await agency.run(pair, run_id="a", store=store)
    await agency.run(lambda: 1 / 0, run_id="b", store=store)
    assert {r.run_id for r in await agency.runs.list(store=store)} == {"a", "b"}
    assert [r.run_id for r in await agency.runs.list(store=store, status="failed")] == ["b"]
    with pytest.raises(RunNotFoundError, match="'zzz'"):
        await agency.runs.get("zzz", store=store)
    with pytest.raises(InvalidArgumentError):
        await agency.runs.list(store=store, limit=0)


def test_a_crashed_holder_on_this_machine_is_taken_over_without_waiting_for_its_lease(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    module = tmp_path / "crashy.py"
    module.write_text(
        textwrap.dedent(
            """
            import os, signal, pathlib
            from agency_runtime import agency

            def job() -> str:
                marker = pathlib.Path(__file__).with_name("crashed-once")
                if not marker.exists():
                    marker.write_text("x")
                    os.kill(os.getpid(), signal.SIGKILL)  # die holding the run's lease
                return "done"
            """
        )
    )
    url = f"sqlite:///{tmp_path}/crash.db"
    script = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import crashy; "
        "from agency_runtime import agency; "
        f"print(agency.run_sync(crashy.job, run_id='c1', store={url!r}).value)"
    )
    first = fork_server.run("code", script, timeout=60)
    assert first.returncode == -9  # killed while running, with a 30 s lease left
    # The second process's clock stands still: were it to wait for the lease to run out, it
    # would wait forever (the timeout fails it). It must see that the holder's pid is gone.
    frozen = (
        "from agency_runtime import agency; from agency_runtime.testing import FakeClock; "
        "import time; agency.configure(clock=FakeClock(start=time.time())); "
    )
    second = fork_server.run("code", frozen + script, timeout=60, check=True)
    assert second.stdout.strip() == "done"
    assert run_module.LEASE_SECONDS >= 30
