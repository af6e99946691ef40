"""PostgreSQL store benchmarks, measured side by side in one run (ratios against goals).

    python3 bench/bench_postgres.py [--no-cli]

The server is ``AGENCY_BENCH_POSTGRES`` (a DSN) when set; else an ephemeral cluster is started
with ``tests/pg_cluster.py`` (fsync off, synchronous_commit off: the same for both sides of
every ratio) and stopped at the end. Every measure uses PostgreSQL schemas of its own
(``?schema=bench_…``), dropped at the end.

(1) journaled step overhead: ``agency.run`` of one scope of 2000 trivial steps (each result a
    ~100 B string) on the PostgreSQL store, time per step, over a raw psycopg (sync,
    autocommit, psycopg's defaults) INSERT loop of as many rows of the same size and key
    shape into a scratch table on the same server (goal <= 2x). Medians of five
    repetitions, raw and journaled interleaved so drift hits both alike. On asyncio (the
    goal's measure) the store runs its SQL on psycopg's async API in the task; a second row
    runs the same steps on trio, where it runs it on worker threads (so do the raw INSERTs
    it is compared with). A diagnostic row times the same raw INSERTs each through the trio
    path's plumbing (a connection taken from a psycopg_pool ConnectionPool with
    ``check=check_connection``, in ``anyio.to_thread``), and another the same without
    ``check=``.
(2) claim throughput: 1000 runs queued (a trivial entry of one step), then drained by 4
    ``agency.Worker`` in this process (concurrency 8 each, one shared store), and by 4
    worker processes (``python3 -m agency_runtime worker``, concurrency 8 each); and 1000
    runs of five journaled steps each drained by 4 worker processes (x 8: the goal's
    measure, >= 1000 runs/s). Runs/s from the first claim (the earliest ``started_at``) to
    the last completion (the latest ``finished_at``), both the server's clock. Beside the
    goal's measure, a reference on this machine: the same 4 processes x 8 connections
    sending, with raw psycopg (async, autocommit, no runtime), one round trip per durable
    write of such a run (a claim, five step commits and the outcome: 7 INSERTs of ~100 B
    rows): the ceiling of a design that commits each write alone. (The runtime's workers
    commit the steps of their concurrent runs in groups, fewer statements than that.) Checked:
    every run completed, with the right value, one attempt, its journaled steps, and each
    step executed exactly once (a counter in this process; a ledger file, one O_APPEND line
    per execution, for the processes).
(3) queued -> started latency: a Worker in this process, idle and waiting with poll=1.0 (so
    only a wake-up can start a run early), and runs enqueued through *another* store
    object on the same schema (so the wake-up must come from PostgreSQL's NOTIFY, not from
    this process's own ring); latency = the entry's first statement (a perf_counter stamp)
    minus the return of ``agency.enqueue``; median and p90 of 100 runs (goal <= 5 ms median
    on loopback). For comparison: the same enqueued on the worker's own store object (the
    in-process wake-up), and a SQLite file store (no notifications: its workers poll), with
    poll=0.05 and poll=1.0 (fewer runs, with a random pause before each so the enqueue falls
    anywhere in the poll period).

Runs in well under two minutes on 2 cores; the machine is noisy, so expect spread between runs.
``--only steps|claims|latency`` runs one of (1), (2), (3).
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psycopg

from agency_runtime import SqliteStore, Worker, agency, open_store
from agency_runtime._store._pg_schema import channel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.pg_cluster import liveness_sessions, start, stop  # noqa: E402  (beside bench/)

STEPS = 2000
RESULT_SIZE = 100
REPEAT = 5
QUEUED = 1000
WORKERS = 4
WORKER_CONCURRENCY = 8
LATENCY_RUNS = 100
SQLITE_SLOW_RUNS = 15
FIVE = 5  # journaled steps per run of the goal's throughput measure

FLOWS_MODULE = "bench_postgres_flows"
FLOWS = '''
"""Workflows of bench/bench_postgres.py (written here so worker processes can import them)."""

import functools
import os
import time
from collections import Counter

import anyio
import anyio.to_thread

from agency_runtime import agency

RESULT = "r" * 100
EXECUTED = Counter()  # run argument -> executions of the entry body in this process
STAMPS = {}  # run argument -> perf_counter at the entry's first statement
STARTED = {}  # run argument -> anyio.Event set with the stamp


def trivial():
    return RESULT


async def many_steps(n):
    async def body(s):
        for _ in range(n):
            await s.step(trivial)
        return n

    return await agency.with_resumable_scope("steps", body)


def executed(i, ledger):
    """Count an execution of run ``i``'s step: in EXECUTED, and with ``ledger`` (worker
    processes) as one O_APPEND line."""
    if ledger is not None:
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{i} {os.getpid()}\\n".encode())
        finally:
            os.close(fd)
    EXECUTED[i] += 1


@agency.entry
async def one_step(i, ledger=None):
    def inc():
        executed(i, ledger)
        return i + 1

    async def body(s):
        return await s.step(inc, name="inc")

    return await agency.with_resumable_scope("one", body)


@agency.entry
async def five_steps(i, ledger=None):
    def inc(k):
        executed(i, ledger)
        return k + 1

    async def body(s):
        k = i
        for n in range(5):
            k = await s.step(functools.partial(inc, k), name=f"inc{n}")
        return k

    return await agency.with_resumable_scope("five", body)


@agency.entry
async def stamped(i):
    STAMPS[i] = time.perf_counter()
    event = STARTED.get(i)
    if event is not None:
        event.set()
    return i
'''


def expect(ok: bool, what: object) -> None:
    """Stop the benchmark when a measured run did not do what it should (asserts may be off)."""
    if not ok:
        raise RuntimeError(f"unexpected outcome: {what!r}")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@contextmanager
def postgres() -> Iterator[tuple[str, bool]]:
    """The server's DSN, and whether it is an ephemeral cluster started here."""
    dsn = os.environ.get("AGENCY_BENCH_POSTGRES")
    if dsn:
        yield dsn, False
        return
    cluster = start()
    try:
        yield cluster.dsn, True
    finally:
        stop(cluster.directory)


class Schemas:
    """Fresh PostgreSQL schema names for this run, dropped at the end (a kept server)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.prefix = f"bench_{secrets.token_hex(3)}_"
        self.made: list[str] = []

    def new(self, what: str) -> str:
        name = f"{self.prefix}{what}"
        self.made.append(name)
        return name

    def url(self, schema: str) -> str:
        sep = "&" if "?" in self.dsn else "?"
        return f"{self.dsn}{sep}schema={schema}"

    def drop(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            for name in self.made:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


# -- (1) journaled step overhead -----------------------------------------------------------


def step_row_bytes(dsn: str, schema: str, run_id: str) -> tuple[int, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT avg(length(run_id) + length(path) + length(name) + length(callsite) "
            "+ length(result) + coalesce(length(locals), 0) + coalesce(length(scopes), 0) "
            "+ coalesce(length(deltas), 0) + coalesce(length(error), 0)), min(path) "
            f'FROM "{schema}".steps WHERE run_id = %s',
            (run_id,),
        ).fetchone()
    assert row is not None
    return round(row[0]), str(row[1])


def raw_inserts(dsn: str, schema: str, k: int, n: int, row_bytes: int, path_like: str) -> float:
    """Seconds per INSERT (autocommit) of a row shaped like a journaled step."""
    table = f'"{schema}".steps_{k}'
    prefix = path_like.rsplit("/", 1)[0] if "/" in path_like else "steps"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {table} (run_id TEXT NOT NULL, path TEXT NOT NULL, seq BIGINT NOT "
            "NULL, body TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, "
            "PRIMARY KEY (run_id, path))"
        )
        run_id = f"raw-run-{k}"
        query = f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s)"
        started = time.perf_counter()
        for i in range(n):
            path = f"{prefix}/{i}"
            body = "x" * max(1, row_bytes - len(run_id) - len(path))
            conn.execute(query, (run_id, path, i, body, time.time()))
        elapsed = time.perf_counter() - started
    return elapsed / n


async def raw_inserts_plumbed(
    dsn: str, schema: str, k: int, n: int, row_bytes: int, path_like: str, *, check: bool
) -> float:
    """The same INSERTs, each through what the store does around its SQL: a connection of a
    psycopg_pool ``ConnectionPool`` (``check=check_connection``) taken in a worker thread
    (``anyio.to_thread``). A diagnostic: the plumbing's share of a journaled step."""
    from psycopg_pool import ConnectionPool

    table = f'"{schema}".plumbed_{k}_{int(check)}'
    prefix = path_like.rsplit("/", 1)[0] if "/" in path_like else "steps"
    kwargs = {"autocommit": True, "prepare_threshold": None}
    with ConnectionPool(
        dsn,
        kwargs=kwargs,
        min_size=1,
        max_size=4,
        check=ConnectionPool.check_connection if check else None,
    ) as pool:
        with pool.connection() as conn:
            conn.execute(
                f"CREATE TABLE {table} (run_id TEXT NOT NULL, path TEXT NOT NULL, seq BIGINT "
                "NOT NULL, body TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, "
                "PRIMARY KEY (run_id, path))"
            )
        run_id = f"raw-run-{k}"
        query = f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s)"

        def insert(i: int) -> None:
            path = f"{prefix}/{i}"
            body = "x" * max(1, row_bytes - len(run_id) - len(path))
            with pool.connection() as conn:
                conn.execute(query, (run_id, path, i, body, time.time()))

        started = time.perf_counter()
        for i in range(n):
            await anyio.to_thread.run_sync(insert, i)
        elapsed = time.perf_counter() - started
    return elapsed / n


async def journaled_steps(store: Any, flows: Any, run_id: str) -> float:
    started = time.perf_counter()
    result = await agency.run(flows.many_steps, STEPS, run_id=run_id, store=store)
    elapsed = time.perf_counter() - started
    expect(result.status == "completed" and result.value == STEPS, result)
    return elapsed / STEPS


async def trio_steps(schemas: Schemas, flows: Any) -> dict[str, float]:
    """Journaled steps on trio (the store's worker-thread path), raw INSERTs interleaved."""
    schema, raw_schema = schemas.new("trio_steps"), schemas.new("trio_raw")
    with psycopg.connect(schemas.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{raw_schema}"')
    store = open_store(schemas.url(schema))
    await journaled_steps(store, flows, "warm-up")
    row_bytes, path_like = step_row_bytes(schemas.dsn, schema, "warm-up")
    raw, ours = [], []
    for k in range(REPEAT):
        raw.append(raw_inserts(schemas.dsn, raw_schema, k, STEPS, row_bytes, path_like))
        ours.append(await journaled_steps(store, flows, f"steps-{k}"))
    return {"raw": statistics.median(raw), "ours": statistics.median(ours)}


async def step_overhead(schemas: Schemas, flows: Any) -> dict[str, Any]:
    schema, raw_schema = schemas.new("steps"), schemas.new("raw")
    with psycopg.connect(schemas.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{raw_schema}"')
    store = open_store(schemas.url(schema))
    await journaled_steps(store, flows, "warm-up")
    row_bytes, path_like = step_row_bytes(schemas.dsn, schema, "warm-up")
    raw_inserts(schemas.dsn, raw_schema, 99, 200, row_bytes, path_like)  # warm the server
    raw, ours, plumbed, unchecked = [], [], [], []
    shape = (STEPS, row_bytes, path_like)
    for k in range(REPEAT):
        raw.append(raw_inserts(schemas.dsn, raw_schema, k, *shape))
        ours.append(await journaled_steps(store, flows, f"steps-{k}"))
        plumbed.append(await raw_inserts_plumbed(schemas.dsn, raw_schema, k, *shape, check=True))
        unchecked.append(await raw_inserts_plumbed(schemas.dsn, raw_schema, k, *shape, check=False))
    return {
        "raw": statistics.median(raw),
        "ours": statistics.median(ours),
        "plumbed": statistics.median(plumbed),
        "unchecked": statistics.median(unchecked),
        "bytes": row_bytes,
    }


# -- (2) claim throughput ------------------------------------------------------------------


async def enqueue_all(
    entry: Any, url: str, queue: str, ledger: str | None
) -> tuple[list[str], float]:
    started = time.perf_counter()
    ids = [
        await agency.enqueue(entry, i, ledger, run_id=f"{queue}-{i}", queue=queue, store=url)
        for i in range(QUEUED)
    ]
    return ids, (time.perf_counter() - started) / QUEUED


async def check_runs(ids: list[str], url: str, steps: int = 1) -> tuple[float, list[str]]:
    """Runs/s from the first claim to the last completion; the problems found (each run
    ``i`` returns ``i + steps`` after ``steps`` journaled steps)."""
    problems: list[str] = []
    starts, ends = [], []
    for i, run_id in enumerate(ids):
        record = await agency.runs.get(run_id, store=url)
        if record.status != "completed" or record.value != str(i + steps) or record.attempts != 1:
            problems.append(
                f"{run_id}: {record.status}, value {record.value}, {record.attempts} attempt(s)"
            )
        if record.lease_owner is not None:
            problems.append(f"{run_id}: still leased by {record.lease_owner}")
        entries = await agency.runs.journal(run_id, store=url)
        if len(entries) != steps:
            problems.append(f"{run_id}: {len(entries)} journaled steps")
        expect(record.started_at is not None and record.finished_at is not None, record)
        assert record.started_at is not None
        assert record.finished_at is not None
        starts.append(record.started_at)
        ends.append(record.finished_at)
    return len(ids) / (max(ends) - min(starts)), problems


async def drain_in_process(schemas: Schemas, flows: Any) -> dict[str, Any]:
    url = schemas.url(schemas.new("claims"))
    ids, enqueue_s = await enqueue_all(flows.one_step, url, "inproc", None)
    flows.EXECUTED.clear()
    workers = [
        Worker(url, queues=("inproc",), concurrency=WORKER_CONCURRENCY, poll=1.0)
        for _ in range(WORKERS)
    ]
    async with anyio.create_task_group() as group:
        for worker in workers:
            group.start_soon(worker.run)
        with anyio.fail_after(120):  # watch the counter: waiting on the store would compete
            while sum(flows.EXECUTED.values()) < QUEUED:  # noqa: ASYNC110
                await anyio.sleep(0.05)
            for run_id in ids:
                await agency.runs.wait(run_id, store=url)
        for worker in workers:
            await worker.drain()
    rate, problems = await check_runs(ids, url)
    executed = [flows.EXECUTED[i] for i in range(QUEUED)]
    if executed != [1] * QUEUED:
        problems.append(f"entry executions per run: {sorted(set(executed))}")
    return {"rate": rate, "enqueue": enqueue_s, "problems": problems}


def drain_processes(schemas: Schemas, flows: Any, tmp: Path, steps: int = 1) -> dict[str, Any]:
    """Drain 1000 queued runs of ``steps`` journaled steps (``one_step`` or ``five_steps``)
    with worker processes, started as the reference's clients are: the runs wait in a queue no
    worker serves until every worker is up (imported, its store open, holding its liveness
    session), then one transaction moves them all to the workers' queue and notifies them.
    A worker still importing while the others drain (~0.4 s of CPU each) would otherwise be
    counted against the drain."""
    tag = "cli" if steps == 1 else f"cli{steps}"
    entry = flows.one_step if steps == 1 else flows.five_steps
    schema = schemas.new(tag)
    url = schemas.url(schema)
    ledger = tmp / f"ledger-{tag}.txt"
    ids, enqueue_s = anyio.run(enqueue_all, entry, url, f"{tag}-held", str(ledger))
    sessions = liveness_sessions(schemas.dsn)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp)])}
    env.pop("AGENCY_STORE", None)
    command = [
        sys.executable,
        "-m",
        "agency_runtime",
        "worker",
        "--store",
        url,
        "--queue",
        tag,
        "--concurrency",
        str(WORKER_CONCURRENCY),
        "--poll",
        "1.0",
        "--import",
        FLOWS_MODULE,
    ]
    procs = [
        subprocess.Popen(
            command, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for _ in range(WORKERS)
    ]
    try:
        deadline = time.monotonic() + 120
        with psycopg.connect(schemas.dsn, autocommit=True) as conn:
            while liveness_sessions(schemas.dsn) < sessions + WORKERS:
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.05)
            with conn.transaction():  # go
                conn.execute(
                    f'UPDATE "{schema}".runs SET queue = %s WHERE queue = %s', (tag, f"{tag}-held")
                )
                conn.execute("SELECT pg_notify(%s, 'go')", (channel(schema),))
            while time.monotonic() < deadline:
                row = conn.execute(
                    f"SELECT count(*) FROM \"{schema}\".runs WHERE status = 'completed'"
                ).fetchone()
                if row is not None and row[0] == QUEUED:
                    break
                if any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes, errors = [], []
        for p in procs:
            try:
                _, err = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                _, err = p.communicate()
            codes.append(p.returncode)
            errors.append(err)
    rate, problems = anyio.run(check_runs, ids, url, steps)
    if codes != [0] * WORKERS:
        bad = next(i for i, code in enumerate(codes) if code != 0)
        problems.append(f"worker exit codes {codes}: {errors[bad][-800:]}")
    lines = ledger.read_text().split() if ledger.exists() else []
    seen = [0] * QUEUED
    pids = set()
    for i in range(0, len(lines), 2):
        seen[int(lines[i])] += 1
        pids.add(lines[i + 1])
    if seen != [steps] * QUEUED:
        problems.append(f"ledger step executions per run: {sorted(set(seen))}")
    return {"rate": rate, "enqueue": enqueue_s, "problems": problems, "pids": len(pids)}


CEILING = """
import asyncio, os, sys, time
import psycopg

DSN, TABLE, WHO, RUNS, CONNS, TRIPS = sys.argv[1:7]


async def main() -> None:
    conns = [await psycopg.AsyncConnection.connect(DSN, autocommit=True) for _ in range(int(CONNS))]
    print("ready", flush=True)
    sys.stdin.readline()
    query = f"INSERT INTO {TABLE} VALUES (%s, %s, %s)"

    async def runs(conn, lane) -> None:
        for r in range(lane, int(RUNS), int(CONNS)):
            for trip in range(int(TRIPS)):
                await conn.execute(query, (f"{WHO}-{r}", trip, "x" * 100))

    started = time.perf_counter()
    await asyncio.gather(*(runs(conn, lane) for lane, conn in enumerate(conns)))
    print(time.perf_counter() - started, flush=True)


asyncio.run(main())
"""


def raw_ceiling(schemas: Schemas, trips: int = FIVE + 2) -> float:
    """Runs/s of :data:`CEILING`: ``WORKERS`` processes x ``WORKER_CONCURRENCY`` connections
    sending ``trips`` raw INSERTs per run for ``QUEUED`` runs, started together."""
    table = f'"{schemas.new("ceiling")}".trips'
    with psycopg.connect(schemas.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {table.split('.')[0]}")
        conn.execute(
            f"CREATE TABLE {table} (run_id TEXT NOT NULL, trip INT NOT NULL, body TEXT NOT "
            "NULL, PRIMARY KEY (run_id, trip))"
        )
    share = QUEUED // WORKERS
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CEILING,
                schemas.dsn,
                table,
                f"p{k}",
                str(share),
                str(WORKER_CONCURRENCY),
                str(trips),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(WORKERS)
    ]
    try:
        for p in procs:
            said = p.stdout.readline().strip() if p.stdout is not None else ""
            expect(said == "ready", f"a ceiling client said {said!r}, not ready")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        took = [float(p.communicate(timeout=120)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return share * WORKERS / max(took)


# -- (3) queued -> started latency ---------------------------------------------------------


async def latencies(
    flows: Any,
    worker_store: Any,
    enqueue_store: Any,
    poll: float,
    runs: int,
    pause: float,
    tag: str,
) -> list[float]:
    """Seconds from ``agency.enqueue`` returning to the entry's first statement, per run."""
    worker = Worker(worker_store, queues=(tag,), concurrency=1, poll=poll)
    out: list[float] = []
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run)
        await agency.enqueue(
            flows.stamped, -1, run_id=f"{tag}-warm", queue=tag, store=enqueue_store
        )
        await agency.runs.wait(f"{tag}-warm", store=worker_store, timeout=30)
        for i in range(runs):
            await anyio.sleep(random.uniform(0.01, pause))  # the worker is idle, waiting
            flows.STARTED[i] = event = anyio.Event()
            run_id = await agency.enqueue(
                flows.stamped, i, run_id=f"{tag}-{i}", queue=tag, store=enqueue_store
            )
            returned = time.perf_counter()
            with anyio.fail_after(30):
                await event.wait()
            out.append(flows.STAMPS[i] - returned)
            result = await agency.runs.wait(run_id, store=worker_store, timeout=30)
            expect(result.status == "completed" and result.value == i, result)
        await worker.drain()
    flows.STARTED.clear()
    flows.STAMPS.clear()
    return out


async def latency_table(schemas: Schemas, flows: Any, tmp: Path) -> dict[str, list[float]]:
    schema = schemas.new("latency")
    worker_store = open_store(schemas.url(schema))
    # Another URL naming the same schema: another store object, with connections of its own.
    dsn_store = open_store(f"{schemas.url(schema)}&application_name=bench-enqueuer")
    expect(dsn_store is not worker_store, "one store object for both URLs")
    out = {
        "pg": await latencies(flows, worker_store, dsn_store, 1.0, LATENCY_RUNS, 0.05, "pg"),
        "pg-same": await latencies(
            flows, worker_store, worker_store, 1.0, LATENCY_RUNS, 0.05, "pgsame"
        ),
    }
    db = tmp / "latency.db"
    sqlite_worker, sqlite_enqueuer = SqliteStore(db), SqliteStore(db)
    out["sqlite-0.05"] = await latencies(
        flows, sqlite_worker, sqlite_enqueuer, 0.05, LATENCY_RUNS, 0.06, "sq005"
    )
    out["sqlite-1.0"] = await latencies(
        flows, sqlite_worker, sqlite_enqueuer, 1.0, SQLITE_SLOW_RUNS, 1.0, "sq1"
    )
    sqlite_worker.close()
    sqlite_enqueuer.close()
    return out


# -- the table -------------------------------------------------------------------------------


def row(measure: str, value: str, goal: str, ok: bool | None) -> tuple[str, str, str, str]:
    return measure, value, goal, "-" if ok is None else "pass" if ok else "FAIL"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-cli", action="store_true", help="skip the worker processes of (2)")
    parser.add_argument(
        "--only", choices=("steps", "claims", "latency"), help="run only (1), (2) or (3)"
    )
    ns = parser.parse_args()
    wanted = {ns.only} if ns.only else {"steps", "claims", "latency"}
    begun = time.perf_counter()
    with postgres() as (dsn, ephemeral), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / f"{FLOWS_MODULE}.py").write_text(textwrap.dedent(FLOWS))
        sys.path.insert(0, str(tmp))
        flows = __import__(FLOWS_MODULE)
        schemas = Schemas(dsn)
        try:
            steps = on_trio = inproc = cli = cli5 = ceiling = lat = None
            if "steps" in wanted:
                steps = anyio.run(step_overhead, schemas, flows)
                on_trio = anyio.run(trio_steps, schemas, flows, backend="trio")
            if "claims" in wanted:
                inproc = anyio.run(drain_in_process, schemas, flows)
                if not ns.no_cli:
                    cli = drain_processes(schemas, flows, tmp)
                    cli5 = drain_processes(schemas, flows, tmp, FIVE)
                    ceiling = raw_ceiling(schemas)
            if "latency" in wanted:
                lat = anyio.run(latency_table, schemas, flows, tmp)
        finally:
            if not ephemeral:
                schemas.drop()
        sys.path.remove(str(tmp))

    rows: list[tuple[str, str, str, str]] = []
    if steps is not None and on_trio is not None:
        ratio = steps["ours"] / steps["raw"]
        rows += [
            row(
                f"(1) journaled step / raw psycopg insert ({STEPS} steps, "
                f"~{steps['bytes']} B rows)",
                f"{ratio:.2f}x ({steps['ours'] * 1e6:.0f} µs vs {steps['raw'] * 1e6:.0f} µs)",
                "<= 2x",
                ratio <= 2,
            ),
            row(
                "    the same on trio (the store's worker-thread path) / raw",
                f"{on_trio['ours'] / on_trio['raw']:.2f}x ({on_trio['ours'] * 1e6:.0f} µs vs "
                f"{on_trio['raw'] * 1e6:.0f} µs)",
                "-",
                None,
            ),
            row(
                "    (diagnostic) the raw insert via a checked pool in a worker thread / raw",
                f"{steps['plumbed'] / steps['raw']:.2f}x ({steps['plumbed'] * 1e6:.0f} µs)",
                "-",
                None,
            ),
            row(
                "    (diagnostic) the same, the pool without check= / raw",
                f"{steps['unchecked'] / steps['raw']:.2f}x ({steps['unchecked'] * 1e6:.0f} µs)",
                "-",
                None,
            ),
        ]
    if inproc is not None:
        rows.append(
            row(
                f"(2) claim throughput, {WORKERS} Workers in one process x {WORKER_CONCURRENCY}",
                f"{inproc['rate']:.0f} runs/s ({QUEUED} runs; "
                f"enqueue {inproc['enqueue'] * 1e3:.2f} ms each)",
                "every run once",
                not inproc["problems"],
            )
        )
    if cli is not None:
        rows.append(
            row(
                f"(2) claim throughput, {WORKERS} worker processes x {WORKER_CONCURRENCY}",
                f"{cli['rate']:.0f} runs/s ({cli['pids']} processes ran runs)",
                "every run once",
                not cli["problems"],
            )
        )
    if cli5 is not None:
        rows.append(
            row(
                f"    the same, runs of {FIVE} journaled steps",
                f"{cli5['rate']:.0f} runs/s ({cli5['pids']} processes ran runs)",
                ">= 1000 runs/s, every step once",
                not cli5["problems"] and cli5["rate"] >= 1000,
            )
        )
    if cli5 is not None and ceiling is not None:
        rows.append(
            row(
                f"    reference: raw psycopg, the same processes x connections, "
                f"{FIVE + 2} INSERTs per run, each alone",
                f"{ceiling:.0f} runs/s (ours: {cli5['rate'] / ceiling:.0%} of it)",
                "-",
                None,
            )
        )
    labels = {
        "pg": ("(3) queued -> started, PostgreSQL NOTIFY (worker poll=1.0)", "<= 5 ms median"),
        "pg-same": ("    the same, enqueued on the worker's own store object", "-"),
        "sqlite-0.05": ("    SQLite file store, worker poll=0.05", "-"),
        "sqlite-1.0": ("    SQLite file store, worker poll=1.0", "-"),
    }
    for key, (label, goal) in labels.items():
        if lat is None:
            break
        values = lat[key]
        median = statistics.median(values)
        rows.append(
            row(
                f"{label} ({len(values)} runs)",
                f"median {ms(median)}, p90 {ms(quantile(values, 0.9))}, max {ms(max(values))}",
                goal,
                median <= 0.005 if key == "pg" else None,
            )
        )
    header = ("measure", "value", "goal", "result")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    problems = [p for r in (inproc, cli, cli5) if r is not None for p in r["problems"]]
    for problem in problems[:20]:
        print(f"  problem: {problem}")
    print(
        f"\n(server: {'ephemeral cluster, fsync off' if ephemeral else 'AGENCY_BENCH_POSTGRES'}; "
        f"total {time.perf_counter() - begun:.1f} s)"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
