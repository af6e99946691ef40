"""Workers killed with SIGKILL: ``agency worker`` processes on one store, one of them killed
mid-run; another worker finishes every run, no committed step runs again, and SIGTERM drains.

The application (``APP`` below, written to ``tmp_path`` as ``jobs.py``) declares one entry:
``job(n)`` runs ``STEPS`` journaled steps; each step appends ``<run id> <step> <pid>`` to a
ledger file (flushed and fsynced) and does a little work, so a kill from outside lands inside
some run. Workers are real processes (forked by the fork server, ``tests/forked.py``) running
``python -m agency_runtime worker --import jobs``; the kill is a real SIGKILL.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from agency_runtime import Store, agency
from tests.forked import ForkedProcess, ForkServer
from tests.support import app_module

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL"),
]

STEPS = 6
RUNS = 12
DEADLINE = 60.0

APP = f"""
import os, time
from agency_runtime import agency

LEDGER = os.environ["LEDGER"]


def _step(run_id, index):
    def body():
        with open(LEDGER, "a") as ledger:
            ledger.write(f"{{run_id}} {{index}} {{os.getpid()}}\\n")
            ledger.flush()
            os.fsync(ledger.fileno())
        time.sleep(0.01)  # a little work: a kill from outside lands inside a run
        return index
    return body


@agency.entry
async def job(n: int) -> int:
    run_id = agency.ctx().run_id

    async def body(s):
        total = 0
        for index in range({STEPS}):
            total += await s.step(_step(run_id, index), name=f"step-{{index}}")
        return total * n

    return await agency.with_resumable_scope("job", body)
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``jobs.py`` in ``tmp_path``, imported here too (so this process can enqueue it)."""
    yield from app_module(tmp_path, monkeypatch, "jobs", APP)


def _worker(server: ForkServer, tmp_path: Path, url: str, name: str) -> ForkedProcess:
    return server.start(
        "module",
        "agency_runtime",
        "worker",
        "--store",
        url,
        "--import",
        "jobs",
        "--concurrency",
        "4",
        "--lease",
        "1",
        "--poll",
        "0.05",
        env=dict(os.environ),
        cwd=tmp_path,
        output=tmp_path / name,
    )


def _ledger(tmp_path: Path) -> list[tuple[str, int, int]]:
    lines = (tmp_path / "ledger.txt").read_text().splitlines()
    return [(run, int(step), int(pid)) for run, step, pid in (line.split() for line in lines)]


def _wait_for_lines(tmp_path: Path, proc: ForkedProcess, count: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while len(_ledger(tmp_path)) < count:
        assert proc.poll() is None, f"the worker exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, "the worker made no progress"
        time.sleep(0.005)  # a short, bounded poll of another process's file


def _enqueue_jobs(app: ModuleType, store: Store) -> list[str]:
    """Queue ``RUNS`` jobs (``job-0`` …); their run ids."""

    async def enqueue_all() -> list[str]:
        return [
            await agency.enqueue(app.job, n, run_id=f"job-{n}", store=store) for n in range(RUNS)
        ]

    return anyio.run(enqueue_all)


def _values_when_done(ids: list[str], store: Store) -> list[object]:
    """The runs' values, once each has an outcome (bounded by ``DEADLINE``)."""

    async def wait_all() -> list[object]:
        return [(await agency.runs.wait(i, store=store, timeout=DEADLINE)).value for i in ids]

    return anyio.run(wait_all)


def test_a_killed_workers_runs_are_finished_by_another_exactly_once(
    tmp_path: Path, fork_server: ForkServer, app: ModuleType, store_url: tuple[str, Store]
) -> None:
    url, store = store_url
    ids = _enqueue_jobs(app, store)
    first = _worker(fork_server, tmp_path, url, "first")
    _wait_for_lines(tmp_path, first, 10)
    first.kill()
    assert first.wait(timeout=DEADLINE) == -signal.SIGKILL
    killed = {pid for _, _, pid in _ledger(tmp_path)}
    assert len(killed) == 1

    second = _worker(fork_server, tmp_path, url, "second")
    try:
        values = _values_when_done(ids, store)
    finally:
        os.kill(second.pid, signal.SIGTERM)
    _, err = second.communicate(timeout=DEADLINE)
    assert second.returncode == 0, err
    assert "drained" in err
    assert values == [sum(range(STEPS)) * n for n in range(RUNS)]

    executions = Counter((run, step) for run, step, _ in _ledger(tmp_path))
    assert set(executions) == {(i, s) for i in ids for s in range(STEPS)}
    again = {key: count for key, count in executions.items() if count > 1}
    # Only a step in flight at the kill runs again: at most one per run the dead worker held.
    assert len(again) <= 4
    assert all(count == 2 for count in again.values())
    assert len({run for run, _ in again}) == len(again)

    async def check_journals() -> None:
        for run_id in ids:
            record = await agency.runs.get(run_id, store=store)
            assert (record.status, record.lease_owner) == ("completed", None)
            steps = (await store.load_journal(run_id)).entries
            assert [e.name for e in steps] == [f"step-{s}" for s in range(STEPS)]

    anyio.run(check_journals)


def test_sigterm_drains_a_worker_and_another_continues_its_runs(
    tmp_path: Path, fork_server: ForkServer, app: ModuleType, store_url: tuple[str, Store]
) -> None:
    url, store = store_url
    ids = _enqueue_jobs(app, store)
    first = _worker(fork_server, tmp_path, url, "first")
    _wait_for_lines(tmp_path, first, 6)
    os.kill(first.pid, signal.SIGTERM)
    _, err = first.communicate(timeout=DEADLINE)
    assert first.returncode == 0, err
    assert "SIGTERM: draining" in err

    async def nothing_held() -> list[str]:
        records = await agency.runs.list(store=store)
        return [r.run_id for r in records if r.lease_owner is not None or r.status == "running"]

    assert anyio.run(nothing_held) == []  # every lease released at once
    second = _worker(fork_server, tmp_path, url, "second")
    try:
        values = _values_when_done(ids, store)
    finally:
        os.kill(second.pid, signal.SIGTERM)
        second.communicate(timeout=DEADLINE)
    assert values == [sum(range(STEPS)) * n for n in range(RUNS)]
    executions = Counter((run, step) for run, step, _ in _ledger(tmp_path))
    assert set(executions.values()) == {1}  # a drain re-runs nothing


def test_a_worker_with_a_bad_store_url_says_so(tmp_path: Path, fork_server: ForkServer) -> None:
    done = fork_server.run(
        "module", "agency_runtime", "worker", "--store", "nosuch://x", cwd=tmp_path
    )
    assert done.returncode == 1
    assert "unknown store URL scheme" in done.stderr
    bad = fork_server.run("module", "agency_runtime", "worker", "--concurrency", "0", cwd=tmp_path)
    assert bad.returncode == 2
    assert "--concurrency" in bad.stderr


TEAM = """
import os, signal
from agency_runtime import agency

LEDGER = os.environ["LEDGER"]
MARK = LEDGER + ".killed"


def note(line):
    with open(LEDGER, "a") as ledger:
        ledger.write(line + "\\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def _step(index):
    def body():
        note(f"child {index} {os.getpid()}")
        if index == 2 and not os.path.exists(MARK):
            open(MARK, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies inside the child's step 2
        return index
    return body


@agency.entry
async def member() -> int:
    async def body(s):
        total = 0
        for index in range(5):
            total += await s.step(_step(index), name=f"c{index}")
        return total

    return await agency.with_resumable_scope("member", body)


@agency.entry
async def lead() -> int:
    child = await agency.run(member, queue="default")
    note(f"lead after child {os.getpid()}")
    return int(child.value) * 10
"""


def test_a_worker_killed_mid_child_leaves_parent_and_child_to_another_once(
    tmp_path: Path,
    fork_server: ForkServer,
    store_url: tuple[str, Store],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker runs a parent and its queued child; it dies (SIGKILL) inside the child's
    third step. Another worker takes both over: the child continues from its journal (its
    committed steps never run again), the parent gets its value, and there is one child."""
    url, store = store_url
    team = next(app_module(tmp_path, monkeypatch, "team", TEAM))

    async def start() -> None:
        await agency.enqueue(team.lead, run_id="lead", store=store)

    anyio.run(start)
    first = _team_worker(fork_server, tmp_path, url, "first")
    assert first.wait(timeout=DEADLINE) == -signal.SIGKILL
    second = _team_worker(fork_server, tmp_path, url, "second")
    try:

        async def outcome() -> tuple[str, object, list[str]]:
            done = await agency.runs.wait("lead", store=store, timeout=DEADLINE)
            children = [r.run_id for r in await store.list_runs(parent="lead")]
            return done.status, done.value, children

        status, value, children = anyio.run(outcome)
    finally:
        os.kill(second.pid, signal.SIGTERM)
        second.communicate(timeout=DEADLINE)
    assert (status, value, children) == ("completed", 100, ["lead/run#0"])
    lines = [line.rsplit(" ", 1) for line in (tmp_path / "ledger.txt").read_text().splitlines()]
    steps = [text for text, _ in lines]
    # Steps 0 and 1 committed before the kill: never again; step 2 was in flight: once more.
    assert steps == ["child 0", "child 1", "child 2", "child 2", "child 3", "child 4",
                     "lead after child"]  # fmt: skip
    pids = [int(pid) for _, pid in lines]
    assert pids[:3] == [first.pid] * 3
    assert set(pids[3:]) == {second.pid}


def _team_worker(server: ForkServer, tmp_path: Path, url: str, name: str) -> ForkedProcess:
    return server.start(
        "module", "agency_runtime", "worker", "--store", url, "--import", "team",
        "--concurrency", "4", "--lease", "1", "--poll", "0.05", "--park-after", "0.2",
        env=dict(os.environ), cwd=tmp_path, output=tmp_path / name,
    )  # fmt: skip
