"""Takeover in about a second on PostgreSQL: a dead worker's runs move on when its session goes.

A worker's process holds a liveness session (a session advisory lock on its listener's direct
connection) and writes its key on the runs it claims. When the process dies the server closes
its connections and the lock goes, so another claimer takes the runs at once, not after the
lease. The lease stays the fence and the fallback: a store opened with ``liveness=False``
holds no session, and its runs wait for their lease.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from agency_runtime import RunRecord, Store, agency, open_store
from tests.forked import ForkedProcess, ForkServer
from tests.pg_cluster import liveness_sessions
from tests.support import app_module

pytestmark = [
    pytest.mark.parametrize("store_url", ["postgres"], indirect=True),
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL"),
]

RUNS = 3
DEADLINE = 60.0
LEASE = 30.0  # the default: the takeover must not wait for it

APP = """
import os, time
import anyio
from agency_runtime import agency

LEDGER = os.environ["LEDGER"]


async def _start():
    with open(LEDGER, "a") as ledger:
        ledger.write(f"{agency.ctx().run_id} {os.getpid()} {time.time()!r}\\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    if os.environ.get("HANG"):
        await anyio.sleep(3600)  # the victim holds the run until it is killed
    return 1


@agency.entry
async def hold(n: int) -> int:
    return await agency.with_resumable_scope("hold", lambda s: s.step(_start, name="start"))
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    yield from app_module(tmp_path, monkeypatch, "holds", APP)


def _worker(server: ForkServer, tmp_path: Path, url: str, name: str, **env: str) -> ForkedProcess:
    # Default lease (30 s) and poll (1 s): the takeover is measured as a user would see it.
    return server.start(
        "module", "agency_runtime", "worker", "--store", url, "--import", "holds",
        "--concurrency", "4",
        env={**os.environ, **env}, cwd=tmp_path, output=tmp_path / name,
    )  # fmt: skip


def _ledger(tmp_path: Path) -> list[tuple[str, int, float]]:
    lines = (tmp_path / "ledger.txt").read_text().splitlines()
    return [(run, int(pid), float(at)) for run, pid, at in (line.split() for line in lines)]


def _wait(condition: Any, what: str, *procs: ForkedProcess) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"a worker exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no progress: {what}"
        time.sleep(0.005)  # a short, bounded poll of other processes' file


def test_a_killed_workers_runs_are_taken_over_long_before_the_lease(
    tmp_path: Path, fork_server: ForkServer, app: ModuleType, store_url: tuple[str, Store]
) -> None:
    url, store = store_url

    async def enqueue() -> list[str]:
        return [await agency.enqueue(app.hold, n, store=store) for n in range(RUNS)]

    ids = anyio.run(enqueue)
    victim = _worker(fork_server, tmp_path, url, "victim", HANG="1")
    _wait(lambda: len(_ledger(tmp_path)) == RUNS, "the victim starts every run", victim)
    # The other worker starts while the victim lives and leaves its runs alone.
    rescuer = _worker(fork_server, tmp_path, url, "rescuer")
    try:
        dsn = url.split("?", 1)[0]
        _wait(lambda: liveness_sessions(dsn) == 2, "the rescuer's session", victim, rescuer)
        killed_at = time.time()
        victim.kill()
        assert victim.wait(timeout=DEADLINE) == -signal.SIGKILL

        async def wait_all() -> list[RunRecord]:
            return [await agency.runs.wait(i, store=store, timeout=DEADLINE) for i in ids]

        records = anyio.run(wait_all)
    finally:
        os.kill(rescuer.pid, signal.SIGTERM)
        rescuer.communicate(timeout=DEADLINE)
    assert [r.status for r in records] == ["completed"] * RUNS
    taken = [at - killed_at for _, pid, at in _ledger(tmp_path) if pid == rescuer.pid]
    assert len(taken) == RUNS
    assert min(taken) >= 0  # nothing taken from the victim while it lived
    # Each run moved on at the rescuer's next poll after the kill, not after the 30 s lease.
    assert statistics.median(taken) < LEASE / 6, taken


def _claim(store: Store, owner: str) -> list[RunRecord]:
    async def claim() -> list[RunRecord]:
        return await store.claim_queued(
            queues=["default"], owner=owner, lease_seconds=LEASE, limit=10
        )

    return anyio.run(claim)


def _end_sessions_of(store: Store, dsn: str) -> None:
    """End the store's listener connection from the server's side, as a crash does."""
    import psycopg

    from agency_runtime._store._pg_schema import LIVENESS_CLASS

    key = store._session()  # type: ignore[attr-defined]
    assert key is not None, "the claimer holds no liveness session"
    with psycopg.connect(dsn, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 2",
            (LIVENESS_CLASS, key),
        ).fetchall()
    assert ended == [(True,)]
    # pg_terminate_backend only signals the backend: wait until it is gone with its lock.
    deadline = time.monotonic() + DEADLINE
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 2",
            (LIVENESS_CLASS, key),
        ).fetchone():
            assert time.monotonic() < deadline, "the ended session still holds its lock"
            time.sleep(0.005)


@pytest.mark.parametrize("liveness", [True, False])
def test_a_claimers_runs_are_free_once_its_session_is_gone_and_only_with_liveness(
    app: ModuleType, store_url: tuple[str, Store], liveness: bool
) -> None:
    url, store = store_url
    dsn = url.split("?", 1)[0]
    holder = open_store(f"{url}&liveness={'true' if liveness else 'false'}")
    try:

        async def enqueue() -> None:
            for n in range(2):
                await agency.enqueue(app.hold, n, store=store)

        anyio.run(enqueue)
        held = _claim(holder, "holder-owner")
        assert len(held) == 2
        assert _claim(store, "other-owner") == []  # a live holder's runs are its own
        if liveness:
            _end_sessions_of(holder, dsn)
            taken = _claim(store, "other-owner")
            assert sorted(r.run_id for r in taken) == sorted(r.run_id for r in held)
            assert all(r.attempts == 2 for r in taken)
        else:
            assert holder._session() is None  # type: ignore[attr-defined]
            assert _claim(store, "other-owner") == []  # the lease alone tells: 30 s to go
    finally:
        holder.close()
