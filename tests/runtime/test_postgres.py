"""What only the PostgreSQL store has to show: several processes on one database.

Fencing of a lost lease inside the step's own statement, two store objects (two
"processes") on one schema, ``FOR UPDATE SKIP LOCKED`` claims from many threads, queue limits
across stores, LISTEN/NOTIFY wake-ups, a server that is down, concurrent migrations, exact
money and recall ranking equal to SQLite's. The generic store tests run on postgres too (the
``postgres`` entry of ``STORE_BACKENDS``); these use the same server (``AGENCY_TEST_POSTGRES``).
"""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg.sql import Literal as sql_literal

from agency_runtime import (
    ResumableScope,
    Store,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    Worker,
    agency,
    open_store,
)
from agency_runtime._clock import Clock, FakeClock
from agency_runtime._errors import InvalidArgumentError
from agency_runtime._store import PostgresStore, SqliteStore
from agency_runtime._store._core import Op, Sql
from agency_runtime._store._pg_schema import MIGRATIONS as PG_MIGRATIONS
from agency_runtime._store._pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from agency_runtime._store._postgres import PREPARE_THRESHOLD
from agency_runtime._types import JournalEntry, RunRecord
from tests import pg_cluster
from tests.runtime.test_store_contract import _recall_all
from tests.support import wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
def store_backend() -> str:
    """Every store ``make_store`` makes here is a PostgreSQL one (a schema of its own)."""
    return "postgres"


@pytest.fixture
def make_store(make_store: Callable[..., Store]) -> Iterator[Callable[..., PostgresStore]]:
    """Plain PostgresStores, each on a fresh schema: the real thread hop, so these tests see
    concurrent commits block and wait as they do in production (the shared fixture's stores
    commit inline, see tests/conftest.py)."""
    made: list[PostgresStore] = []

    def make(*, clock: Clock | None = None) -> PostgresStore:
        fresh = make_store(clock=clock)
        assert isinstance(fresh, PostgresStore)
        real = PostgresStore(os.environ["AGENCY_TEST_POSTGRES"], schema=fresh.schema, clock=clock)
        made.append(real)
        return real

    yield make
    for store in made:
        store.close()


@pytest.fixture
def dsn(make_store: Callable[..., PostgresStore]) -> str:
    found = os.environ.get("AGENCY_TEST_POSTGRES")
    if not found:
        make_store()  # fails, saying why there is no server
    assert found
    return found


def _run(run_id: str, **fields: object) -> RunRecord:
    values: dict[str, object] = {"status": "running", "entry": "m:f", "arguments": "{}"}
    return RunRecord.model_validate({**values, **fields, "run_id": run_id})


def _step(run_id: str, path: str, seq: int, cost_pico: int = 0) -> JournalEntry:
    return JournalEntry(
        run_id=run_id, path=path, seq=seq, name="s", callsite="c", result="null",
        cost_pico=cost_pico, tokens=1, created_at=1.0,
    )  # fmt: skip


def _groups_sent(store: PostgresStore, together: str) -> list[list[str]]:
    """The run ids of each group the store sends with its method ``together``
    (``commit_steps``, ``finish_runs``), sorted, in the order sent (filled as they go)."""
    sent: list[list[str]] = []
    send = getattr(store, together)

    async def counted(items: list[tuple[Any, ...]]) -> list[bool]:
        sent.append(sorted(item[0].run_id for item in items))
        return list(await send(items))

    setattr(store, together, counted)
    return sent


def _lock_waits(dsn: str, schema: str | None = None) -> int:
    """How many statements on the server wait for a lock now (of those naming ``schema``,
    when given: tests in other processes share the server)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if schema is None:
            row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
        else:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND strpos(query, %s) > 0",
                (f'"{schema}".',),
            ).fetchone()
    return int(row[0]) if row else 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_step_commit_waits_for_a_takeover_then_writes_nothing(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    store = make_store()
    assert (await store.claim_run(_run("r"), owner="a", lease_seconds=60)).acquired
    assert await store.commit_step(_step("r", "one", 1), owner="a")
    other = psycopg.connect(dsn, autocommit=True)
    try:
        other.execute("BEGIN")
        other.execute(
            f'UPDATE "{store.schema}".runs SET lease_owner = %s WHERE run_id = %s', ("b", "r")
        )
        outcome: list[bool] = []

        async def commit() -> None:
            outcome.append(await store.commit_step(_step("r", "two", 2), owner="a"))

        async with anyio.create_task_group() as group:
            group.start_soon(commit)
            await wait_for(lambda: _lock_waits(dsn) > 0, timeout=10)
            assert outcome == []  # blocked on the run's row until the takeover commits
            await anyio.to_thread.run_sync(other.execute, "COMMIT")
        assert outcome == [False]
    finally:
        other.close()
    journal = await store.load_journal("r")
    assert [entry.path for entry in journal.entries] == ["one"]
    assert not await store.commit_step(_step("r", "three", 3), owner="a")


async def test_a_commit_under_way_finishes_though_its_caller_is_cancelled(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    """Cancelled while its statement waits on the server, an operation still runs to its end
    (on a worker thread as on asyncio's own path), so the caller never leaves a write whose
    fate it cannot know; a caller cancelled before it starts sends nothing."""
    store = make_store()
    assert (await store.claim_run(_run("r"), owner="a", lease_seconds=60)).acquired
    other = psycopg.connect(dsn, autocommit=True)
    try:
        other.execute("BEGIN")
        other.execute(f'SELECT 1 FROM "{store.schema}".runs WHERE run_id = %s FOR UPDATE', ("r",))
        done: list[bool] = []
        caller = anyio.CancelScope()

        async def commit() -> None:
            with caller:
                done.append(await store.commit_step(_step("r", "one", 1), owner="a"))

        async with anyio.create_task_group() as group:
            group.start_soon(commit)
            await wait_for(lambda: _lock_waits(dsn, store.schema) > 0, timeout=10)
            caller.cancel()
            await anyio.wait_all_tasks_blocked()  # the cancellation was delivered, if it can be
            await anyio.to_thread.run_sync(other.execute, "COMMIT")
        assert done == [True]
    finally:
        other.close()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.commit_step(_step("r", "two", 2), owner="a")
    assert [entry.path for entry in (await store.load_journal("r")).entries] == ["one"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_steps_of_runs_that_go_on_together_are_committed_together(
    make_store: Callable[..., PostgresStore],
) -> None:
    """On asyncio, the commits that a loop's tasks make in the same turn, or while one of
    theirs is on its way, go together in one statement: eight runs started together make
    their 40 commits in six statements, and every step lands, in its run, in order."""
    store = make_store()
    groups = _groups_sent(store, "commit_steps")
    runs = [f"r{i}" for i in range(8)]
    for run_id in runs:
        assert (await store.claim_run(_run(run_id), owner="w", lease_seconds=60)).acquired

    async def steps(run_id: str) -> None:
        for seq in range(1, 6):
            assert await store.commit_step(_step(run_id, f"s{seq}", seq), owner="w")

    async with anyio.create_task_group() as tasks:
        for run_id in runs:
            tasks.start_soon(steps, run_id)
    alone = 8 * 5 - sum(len(group) for group in groups)
    # The first commit goes alone at once and the others gather behind it; from then on
    # the runs go on together, and each round of their commits is one statement.
    assert len(groups) + alone <= 6, groups
    for run_id in runs:
        journal = await store.load_journal(run_id)
        assert [(e.path, e.seq) for e in journal.entries] == [(f"s{n}", n) for n in range(1, 6)]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_outcomes_stored_while_one_is_in_flight_go_together(
    make_store: Callable[..., PostgresStore],
) -> None:
    """Runs' outcomes are grouped as steps are; an outcome that needs a transaction of its
    own (forgetting steps) goes alone, and one whose lease is another's is refused."""
    store = make_store()
    groups = _groups_sent(store, "finish_runs")
    runs = [f"r{i}" for i in range(8)]
    for run_id in [*runs, "forgets"]:
        assert (await store.claim_run(_run(run_id), owner="w", lease_seconds=60)).acquired
    assert (await store.claim_run(_run("theirs"), owner="x", lease_seconds=60)).acquired
    assert await store.commit_step(_step("forgets", "gone", 1), owner="w")
    out: dict[str, bool] = {}

    async def finish(run_id: str, **more: Any) -> None:
        done = _run(run_id, status="completed", value=f'"{run_id}"')
        out[run_id] = await store.finish_run(done, owner="w", **more)

    async with anyio.create_task_group() as tasks:
        for run_id in runs:
            tasks.start_soon(finish, run_id)
        tasks.start_soon(functools.partial(finish, "forgets", forget=["gone"]))
        tasks.start_soon(finish, "theirs")
    assert out == {**dict.fromkeys(runs, True), "forgets": True, "theirs": False}
    assert groups  # some went together
    assert all("forgets" not in group for group in groups)
    for run_id in runs:
        stored = await store.get_run(run_id)
        assert stored is not None
        assert (stored.status, stored.value, stored.lease_owner) == (
            "completed",
            f'"{run_id}"',
            None,
        )
    assert (await store.load_journal("forgets")).entries == []


def _plus_one(k: int) -> int:
    return k + 1


@agency.entry(name="test_postgres.three_steps")
async def three_steps(n: int) -> int:
    async def body(s: ResumableScope) -> int:
        k = n
        for i in range(3):
            k = await s.step(functools.partial(_plus_one, k), name=f"s{i}")
        return k

    return await agency.with_resumable_scope("three", body)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_workers_runs_go_on_in_step(make_store: Callable[..., PostgresStore]) -> None:
    """A worker's runs, claimed together, commit each round of their steps in one statement
    and their outcomes in another, and the next claim fills the freed slots together: 16
    runs of 3 steps on 8 slots take two waves of 3 step statements and 1 outcome statement
    (a run one step apart from the rest would double them)."""
    store = make_store()
    steps, outcomes = _groups_sent(store, "commit_steps"), _groups_sent(store, "finish_runs")
    ids = [await agency.enqueue(three_steps, n, run_id=f"w{n}", store=store) for n in range(16)]
    worker = Worker(store, concurrency=8, poll=0.05)
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run)
        results = [await agency.runs.wait(run_id, store=store, timeout=60) for run_id in ids]
        await worker.drain()
    assert [(r.status, r.value) for r in results] == [("completed", n + 3) for n in range(16)]
    step_statements = len(steps) + 16 * 3 - sum(len(group) for group in steps)
    outcome_statements = len(outcomes) + 16 - sum(len(group) for group in outcomes)
    # Two waves: 3 step statements and 1 outcome statement each, here (6, 2); the old way
    # of sending a lone commit at once took (14, 8). A little room for a wave split once
    # (a run whose end the worker sees a turn later) on a loaded machine.
    assert step_statements <= 2 * 3 + 2, steps
    assert outcome_statements <= 2 + 1, outcomes


async def test_a_claim_of_one_queue_is_planned_once_not_at_every_execution(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    """The folded claim of one queue writes its scan's bound in the statement, so PostgreSQL
    keeps a generic plan for it after its first executions, and on a table of many runs
    that plan scans the queue's index in claim order (no sort of every queued run); a bound
    and a list as parameters made it plan the claim anew at every execution (~0.6 ms of
    server time a claim)."""
    store = make_store()
    for i in range(40):
        await store.enqueue_run(_run(f"q{i:02d}", status="queued", queue="work"))
    assert store._claim_folded_sql(True, 5) is store._claim_folded_sql(True, 8)  # bound 8
    assert store._claim_folded_sql(True, 9) != store._claim_folded_sql(True, 8)
    sql = store._claim_folded_sql(True, 4)
    params = {"queue": "work", "skip": [], "n": 4, "owner": "w", "lease": 30.0, "now": None,
              "session": None}  # fmt: skip
    claimed: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {store.schema}")
        # A store's worth of finished runs beside the queue, as a server holds (on a table
        # of a few rows a scan of the whole table is the better plan, and is chosen).
        conn.execute(
            "INSERT INTO runs (run_id, status, entry, arguments, created_at, updated_at, "
            "queue, finished_at) SELECT 'done' || g, 'completed', 'm:f', '{}', g, g, 'work', "
            "g FROM generate_series(1, 20000) AS g"
        )
        conn.execute("ANALYZE runs")
        with conn.transaction(force_rollback=True):
            for _ in range(8):
                rows = conn.execute(sql, params, prepare=True).fetchall()
                claimed += [str(row[0]) for row in rows]
            plans = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE 'WITH t AS%'"
            ).fetchall()
            plan = [
                row[0] for row in conn.execute("EXPLAIN EXECUTE " + _prepared(conn, sql, params))
            ]
    assert claimed == [f"q{i:02d}" for i in range(32)]  # 4 at a time, in claim order
    ((generic, custom),) = plans
    assert generic >= 1, (generic, custom)
    assert custom <= 5
    # The queued runs come off the queue's index in claim order (only the few due parked
    # runs, off runs_waking, are sorted): no sort of every queued run.
    assert any("Index Scan using runs_runnable" in line for line in plan), plan
    assert not any("Sort Key: r.priority" in line for line in plan), plan


def _prepared(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> str:
    """``EXECUTE`` of the statement psycopg prepared for ``sql``, with ``params`` written as
    literals in the order of its placeholders."""
    row = conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'WITH t AS%'"
    ).fetchone()
    assert row is not None
    order = dict.fromkeys(re.findall(r"%\((\w+)\)s", sql))
    values = ", ".join(sql_literal(params[name]).as_string(conn) for name in order)
    return f"{row[0]}({values})"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_group_the_server_refuses_is_answered_step_by_step(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    """A step already journaled fails its group's statement; each member is then committed
    alone: that one gets the error it gets alone, the others are written or fenced."""
    store = make_store()
    groups = _groups_sent(store, "commit_steps")
    for run_id in ("blocker", "r1", "r2"):
        assert (await store.claim_run(_run(run_id), owner="w", lease_seconds=60)).acquired
    assert (await store.claim_run(_run("theirs"), owner="x", lease_seconds=60)).acquired
    assert await store.commit_step(_step("r2", "done", 1), owner="w")
    other = psycopg.connect(dsn, autocommit=True)
    out: dict[str, object] = {}

    async def commit(key: str, entry: JournalEntry) -> None:
        try:
            out[key] = await store.commit_step(entry, owner="w")
        except StoreError as exc:
            out[key] = exc

    try:
        other.execute("BEGIN")  # holds the blocker's commit in flight: the others gather
        other.execute(
            f'SELECT 1 FROM "{store.schema}".runs WHERE run_id = %s FOR UPDATE', ("blocker",)
        )
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(commit, "blocker", _step("blocker", "b", 1))
            await wait_for(lambda: _lock_waits(dsn, store.schema) > 0, timeout=10)
            tasks.start_soon(commit, "new", _step("r1", "one", 1))
            tasks.start_soon(commit, "again", _step("r2", "done", 2))
            tasks.start_soon(commit, "fenced", _step("theirs", "t", 1))
            await anyio.wait_all_tasks_blocked()
            await anyio.to_thread.run_sync(other.execute, "COMMIT")
    finally:
        other.close()
    assert groups == [["r1", "r2", "theirs"]]  # tried together once, then each alone
    assert out["blocker"] is True
    assert out["new"] is True
    assert out["fenced"] is False
    assert isinstance(out["again"], StoreError)
    assert "commit step 'done' of run 'r2'" in str(out["again"])
    assert "already exists" in str(out["again"])
    assert [e.path for e in (await store.load_journal("r1")).entries] == ["one"]
    assert [e.path for e in (await store.load_journal("r2")).entries] == ["done"]
    assert (await store.load_journal("theirs")).entries == []


async def test_on_asyncio_single_statements_run_on_the_event_loop_the_rest_on_threads(
    make_store: Callable[..., PostgresStore], anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On asyncio an operation of one statement outside a transaction (a step's commit, a
    lease renewal, an outcome, a read, a journal read as one statement) goes through
    psycopg's async API on the loop's own thread: no thread hop. A transaction (a claim of
    one run) runs on a worker thread, its statements back to back; on trio, whose tasks
    psycopg's async API cannot serve, everything does."""
    store = make_store()
    seen: list[tuple[str, int]] = []
    # The asyncio path runs its statements on a cursor it keeps per connection.
    blocking, awaited = psycopg.Connection.execute, psycopg.AsyncCursor.execute

    def blocking_spy(self: psycopg.Connection[Any], *args: Any, **kwargs: Any) -> Any:
        seen.append(("blocking", threading.get_ident()))
        return blocking(self, *args, **kwargs)

    async def awaited_spy(self: psycopg.AsyncCursor[Any], *args: Any, **kwargs: Any) -> Any:
        seen.append(("async", threading.get_ident()))
        return await awaited(self, *args, **kwargs)

    def taken() -> tuple[set[str], set[int]]:
        kinds, threads = {kind for kind, _ in seen}, {thread for _, thread in seen}
        seen.clear()
        return kinds, threads

    monkeypatch.setattr(psycopg.Connection, "execute", blocking_spy)
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", awaited_spy)
    loop_thread = threading.get_ident()
    assert (await store.claim_run(_run("r"), owner="a", lease_seconds=60)).acquired
    kinds, threads = taken()
    assert kinds == {"blocking"}
    assert loop_thread not in threads
    assert [e.path for e in (await store.load_journal("r")).entries] == []
    assert await store.commit_step(_step("r", "one", 1), owner="a")
    assert await store.renew_lease("r", owner="a", lease_seconds=60)
    done = _run("r", status="completed", value="1", finished_at=2.0)
    assert await store.finish_run(done, owner="a")
    stored = await store.get_run("r")
    assert stored is not None
    assert stored.status == "completed"
    kinds, threads = taken()
    if anyio_backend == "asyncio":
        assert (kinds, threads) == ({"async"}, {loop_thread})
    else:
        assert kinds == {"blocking"}
        assert loop_thread not in threads


async def test_tasks_beyond_max_size_wait_for_a_connection(
    dsn: str, make_store: Callable[..., PostgresStore]
) -> None:
    """Twenty concurrent operations on a store of one connection: each waits its turn, none
    fails, and no more connections are opened (one per path at most)."""
    schema = make_store().schema
    name = f"agency-max-size-{os.getpid()}"
    store = PostgresStore(f"{dsn}?application_name={name}", schema=schema, max_size=1)
    try:
        assert (await store.claim_run(_run("r"), owner="a", lease_seconds=60)).acquired

        async def commit(index: int) -> None:
            assert await store.commit_step(_step("r", f"p{index}", index), owner="a")

        async with anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon(commit, index)
        assert len((await store.load_journal("r")).entries) == 20
        with psycopg.connect(dsn, autocommit=True) as admin:
            row = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
        assert row is not None
        assert row[0] <= 2
    finally:
        store.close()


def test_one_store_serves_one_event_loop_after_another(
    make_store: Callable[..., PostgresStore],
) -> None:
    """A store outlives event loops (``open_store`` caches it per process): asyncio, trio,
    then asyncio again, on connections the first loop left idle."""
    store = make_store()

    async def step(index: int) -> None:
        if index == 0:
            assert (await store.claim_run(_run("r"), owner="a", lease_seconds=60)).acquired
        assert await store.commit_step(_step("r", f"p{index}", index), owner="a")

    for index, backend in enumerate(("asyncio", "trio", "asyncio", "asyncio")):
        anyio.run(step, index, backend=backend)
    journal = anyio.run(store.load_journal, "r")
    assert [e.path for e in journal.entries] == ["p0", "p1", "p2", "p3"]


async def test_a_retried_outcome_counts_the_forgotten_steps_spend_once(
    make_store: Callable[..., PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outcome that forgets steps moves their spend to the run's unjournaled totals; when
    PostgreSQL aborts the first attempt (a serialization failure) the retry counts it once."""
    store = make_store()
    assert (await store.claim_run(_run("r"), owner="a", lease_seconds=60)).acquired
    assert await store.commit_step(_step("r", "gone", 1, cost_pico=7), owner="a")
    real = store._drop_steps
    attempts: list[int] = []

    def flaky(run_id: str, where: str, params: dict[str, Any]) -> Op[tuple[int, int]]:
        # The first attempt drops the steps and counts their spend, then PostgreSQL aborts
        # it before the outcome's UPDATE is sent.
        spent = yield from real(run_id, where, params)
        attempts.append(1)
        if len(attempts) == 1:
            raise psycopg.errors.SerializationFailure("injected: the first attempt is aborted")
        return spent

    monkeypatch.setattr(store, "_drop_steps", flaky)
    done = _run("r", status="completed", value="1", finished_at=2.0, cost_pico=7)
    assert await store.finish_run(done, owner="a", unjournaled=(3, 0), forget=["gone"])
    assert len(attempts) == 2
    stored = await store.get_run("r")
    assert stored is not None
    assert stored.unjournaled_pico == 3 + 7


async def test_two_store_objects_on_one_schema_see_each_others_runs(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    first = make_store()
    second = PostgresStore(dsn, schema=first.schema)
    try:
        assert (await first.claim_run(_run("shared"), owner="a", lease_seconds=60)).acquired
        refused = await second.claim_run(_run("shared"), owner="b", lease_seconds=60)
        assert not refused.acquired
        assert refused.record.lease_owner == "a"
        assert await first.commit_step(_step("shared", "p", 1), owner="a")
        assert [e.path for e in (await second.load_journal("shared")).entries] == ["p"]
        assert [r.run_id for r in await second.list_runs()] == ["shared"]
    finally:
        second.close()


async def test_many_threads_never_claim_one_queued_run_twice(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    store = make_store()
    for index in range(200):
        await store.enqueue_run(_run(f"q{index:03}", status="queued", priority=index % 3))
    claimed: list[str] = []
    lock = threading.Lock()

    async def worker(name: str) -> None:
        while True:
            got = await store.claim_queued(queues=["default"], owner=name, lease_seconds=60,
                                           limit=7)  # fmt: skip
            if not got:
                return
            with lock:
                claimed.extend(r.run_id for r in got)

    async with anyio.create_task_group() as group:
        for number in range(4):
            group.start_soon(worker, f"w{number}")
    assert len(claimed) == 200
    assert len(set(claimed)) == 200
    # every claim is running under exactly one owner, attempts counted once
    runs = await store.list_runs(limit=1000)
    assert {r.status for r in runs} == {"running"}
    assert {r.attempts for r in runs} == {1}


async def test_concurrent_prunes_delete_each_run_once_without_deadlocks(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    clock = FakeClock()
    store = make_store(clock=clock)
    for index in range(60):
        top = _run(f"t{index:02}")
        assert (await store.claim_run(top, owner="o", lease_seconds=60)).acquired
        child = _run(f"t{index:02}/c", parent_id=top.run_id, root_id=top.run_id, depth=1)
        assert (await store.claim_run(child, owner="o", lease_seconds=60)).acquired
        for run in (child, top):
            ended = run.model_copy(update={"status": ("completed", "failed")[index % 2]})
            assert await store.finish_run(ended, owner="o")
    clock.advance(3600)
    counts: list[int] = []

    async def prune() -> None:
        counts.append(await store.prune_runs(older_than=60, batch=7))

    async with anyio.create_task_group() as group:  # four at once, on the pool's threads
        for _ in range(4):
            group.start_soon(prune)
    assert sum(counts) == 120
    assert await store.list_runs() == []


async def test_a_queue_limit_holds_across_two_stores(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    first = make_store()
    second = PostgresStore(dsn, schema=first.schema)
    try:
        await first.configure_queue("slow", concurrency=3)
        assert await second.queue_concurrency("slow") == 3
        for index in range(20):
            await first.enqueue_run(_run(f"s{index}", status="queued", queue="slow"))
        counts: list[int] = []

        async def claim(store: PostgresStore, owner: str) -> None:
            got = await store.claim_queued(queues=["slow"], owner=owner, lease_seconds=60,
                                           limit=10)  # fmt: skip
            counts.append(len(got))

        async with anyio.create_task_group() as group:
            for number in range(3):
                group.start_soon(claim, first, f"a{number}")
                group.start_soon(claim, second, f"b{number}")
        assert sum(counts) == 3
        # a finished run frees its place for the next claimant, whichever store asks
        running = list(await second.list_runs(status="running"))
        done = running[0].model_copy(update={"status": "completed", "finished_at": 1.0})
        assert await first.finish_run(done, owner=running[0].lease_owner or "")
        got = await second.claim_queued(queues=["slow"], owner="c", lease_seconds=60, limit=10)
        assert len(got) == 1
    finally:
        second.close()


async def test_notify_wakes_a_waiter_of_another_store_object(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    producer = make_store()
    waiter = PostgresStore(dsn, schema=producer.schema)
    try:
        assert waiter._listen().wait(10), "the listener never started LISTENing"
        await waiter.wait_for_runs(0.2)  # takes the ring sent when LISTEN began
        woke: list[float] = []

        async def wait() -> None:
            start = time.monotonic()
            await waiter.wait_for_runs(10)
            woke.append(time.monotonic() - start)

        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            await anyio.wait_all_tasks_blocked()  # the waiter waits for a ring
            await producer.enqueue_run(_run("wake", status="queued"))
        assert woke
        assert woke[0] < 2.0
    finally:
        waiter.close()
    assert not waiter._listener or not waiter._listener.is_alive()  # close() stops it


async def test_a_server_that_is_down_is_unavailable_quickly_without_the_password() -> None:
    url = f"postgresql://agent:hunter2@127.0.0.1:{_free_port()}/agent"
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        PostgresStore(url, connect_timeout=2)
    assert time.monotonic() - start < 10
    assert isinstance(caught.value.__cause__, psycopg.Error)
    assert "hunter2" not in str(caught.value)
    assert "agent:***@127.0.0.1" in str(caught.value)


async def test_a_wrong_database_is_unavailable(dsn: str) -> None:
    wrong = dsn.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(StoreUnavailableError, match="no_such_database") as caught:
        PostgresStore(wrong, connect_timeout=2)
    assert isinstance(caught.value.__cause__, psycopg.OperationalError)


async def test_concurrent_openers_migrate_once_and_a_newer_schema_is_refused(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    schema = make_store().schema + "_m"
    opened: list[PostgresStore] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(PostgresStore(dsn, schema=schema))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert len(opened) == 4
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(f'SELECT version FROM "{schema}".schema_version').fetchall()
            assert rows == [(PG_SCHEMA_VERSION,)]
            conn.execute(f'UPDATE "{schema}".schema_version SET version = 99')
        with pytest.raises(StoreSchemaError, match="99"):
            PostgresStore(dsn, schema=schema)
    finally:
        for store in opened:
            store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def test_a_version_2_schema_migrates_its_runs_to_top_level_runs(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    schema = make_store().schema + "_v2"
    quoted = f'"{schema}"'
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {quoted}")
        conn.execute(f"CREATE TABLE {quoted}.schema_version (version INTEGER NOT NULL)")
        for _number, script in PG_MIGRATIONS[:2]:
            for statement in script.format(s=quoted).split(";"):
                if statement.strip():
                    conn.execute(statement)
        conn.execute(f"INSERT INTO {quoted}.schema_version (version) VALUES (2)")
        conn.execute(
            f"INSERT INTO {quoted}.runs (run_id, status, entry, arguments, cost_pico, "
            "created_at, updated_at) VALUES ('old', 'completed', 'm:f', '{}', 5, 1, 1)"
        )
    store = PostgresStore(dsn, schema=schema)
    try:
        old = await store.get_run("old")
        assert old is not None
        assert (old.parent_id, old.root_id, old.depth, old.descendants_pico) == (None, None, 0, 0)
        assert old.own_cost_pico == 5
        claim = await store.claim_run(
            _run("kid", parent_id="old", root_id="old", depth=1), owner="a", lease_seconds=60
        )
        assert claim.created
        assert [r.run_id for r in await store.list_runs(parent="old")] == ["kid"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(f"SELECT version FROM {quoted}.schema_version").fetchall()
            assert rows == [(PG_SCHEMA_VERSION,)]
            index = conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = %s "
                "AND indexname = 'runs_by_parent'",
                (schema,),
            ).fetchone()
            assert index is not None
            assert "parent_id" in index[0]
    finally:
        store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {quoted} CASCADE")


async def test_money_stays_exact_integers(make_store: Callable[..., PostgresStore]) -> None:
    store = make_store()
    big = 2**62 + 12345  # pico-dollars: far beyond what a float holds exactly
    assert (await store.claim_run(_run("m"), owner="a", lease_seconds=60)).acquired
    assert await store.commit_step(_step("m", "p", 1, cost_pico=big), owner="a")
    assert (await store.load_journal("m")).entries[0].cost_pico == big
    done = _run("m", status="completed", cost_pico=big + 1, finished_at=2.0)
    assert await store.finish_run(done, owner="a", unjournaled=(big, 0))
    stored = await store.get_run("m")
    assert stored is not None
    assert (stored.cost_pico, stored.unjournaled_pico) == (big + 1, big)
    assert isinstance(stored.cost_pico, int)
    with pytest.raises(InvalidArgumentError, match="too large"):
        await store.enqueue_run(_run("huge", status="queued", cost_pico=2**64))


async def test_recall_picks_what_sqlite_picks(
    make_store: Callable[..., PostgresStore], tmp_path: Path
) -> None:
    sqlite = SqliteStore(tmp_path / "ref.db")
    try:
        assert await _recall_all(make_store()) == await _recall_all(sqlite)
    finally:
        sqlite.close()


async def test_urls_open_a_postgres_store_in_the_named_schema(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    schema = make_store().schema
    base = dsn.replace("postgresql://", "postgres://", 1)
    store = open_store(f"{base}?schema={schema}")
    assert isinstance(store, PostgresStore)
    assert store.schema == schema
    assert store is open_store(f"{dsn}?schema={schema}")  # both schemes name one store
    with pytest.raises(InvalidArgumentError, match="schema name"):
        open_store(f"{dsn}?schema=bad-name")
    with pytest.raises(StoreError):
        open_store(f"{dsn}?schema={schema}&no_such_libpq_option=1")


async def _prepared_statements(store: PostgresStore) -> int:
    """How many statements the session of the store's next connection has prepared."""

    def probe() -> Op[int]:
        row = (yield Sql("SELECT count(*) FROM pg_prepared_statements")).one()
        assert row is not None
        return int(row[0])

    return await store._run("count prepared statements", probe)


async def test_statements_are_prepared_unless_the_store_says_prepare_false(
    make_store: Callable[..., PostgresStore], dsn: str
) -> None:
    """A step's statement is prepared after a few executions (parsing and planning it again
    is most of its cost); ``?prepare=false`` prepares none, for poolers that cannot keep
    prepared statements."""
    schema = make_store().schema
    prepared = PostgresStore(dsn, schema=schema, max_size=1)
    plain = open_store(f"{dsn}?schema={schema}&prepare=false")
    assert isinstance(plain, PostgresStore)
    try:
        for store, run_id in ((prepared, "p"), (plain, "n")):
            assert (await store.claim_run(_run(run_id), owner="a", lease_seconds=60)).acquired
            for seq in range(PREPARE_THRESHOLD + 2):
                assert await store.commit_step(_step(run_id, f"s{seq}", seq), owner="a")
        assert await _prepared_statements(prepared) > 0
        assert await _prepared_statements(plain) == 0
    finally:
        prepared.close()
    with pytest.raises(InvalidArgumentError, match="prepare"):
        open_store(f"{dsn}?schema={schema}&prepare=maybe")


def test_importing_the_runtime_does_not_import_psycopg() -> None:
    code = "import sys, agency_runtime; print('psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


RESTART_GATE: dict[str, threading.Event] = {}


@agency.entry(name="test_postgres.across_a_restart")
async def across_a_restart(n: int) -> int:
    async def body(s: ResumableScope) -> int:
        first = await s.step(lambda: n, name="before")
        await anyio.to_thread.run_sync(RESTART_GATE["go"].wait, 30)  # the server restarts here
        return first + await s.step(lambda: 1, name="after")

    return await agency.with_resumable_scope("work", body)


@pytest.mark.slow
async def test_a_server_restart_mid_run_loses_nothing_and_strands_nothing() -> None:
    """A worker's server restarts (every connection cut) while runs are in flight: each run
    is handed back or retried, and every run completes once the server is back."""
    RESTART_GATE["go"] = threading.Event()
    cluster = await anyio.to_thread.run_sync(pg_cluster.start)
    store = PostgresStore(cluster.dsn, schema="restart", connect_timeout=5)
    try:
        ids = [
            await agency.enqueue(across_a_restart, n, run_id=f"r{n}", store=store) for n in range(3)
        ]
        worker = Worker(store, concurrency=3, poll=0.05, lease=2)
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run)
            await wait_for(lambda: len(worker.running) == 3, timeout=30)
            await anyio.to_thread.run_sync(pg_cluster.restart, cluster)
            RESTART_GATE["go"].set()  # the runs go on: their next commit meets the restart
            results = [await agency.runs.wait(i, store=store, timeout=60) for i in ids]
            await worker.drain()
        assert [(r.status, r.value) for r in results] == [("completed", n + 1) for n in range(3)]
        for run_id in ids:
            record = await store.get_run(run_id)
            assert record is not None
            assert (record.status, record.lease_owner) == ("completed", None)
            steps = [e.name for e in (await store.load_journal(run_id)).entries]
            assert steps == ["before", "after"]
    finally:
        store.close()
        await anyio.to_thread.run_sync(pg_cluster.stop, cluster.directory)
