"""Durable time under SIGKILL: ``agency worker`` processes killed around sleeps, wake-ups,
event sends and schedule fires, on SQLite and PostgreSQL.

The application (``APP``, written to ``tmp_path`` as ``timed.py``) notes every step it
runs in a ledger file (``<run id> <label> <time> <pid>``, fsynced), so the test sees what ran,
when, and how often. Workers are real processes (``tests/forked.py``) and the kills are real
SIGKILLs; time is real but short (sleeps of a second or two). A killed worker's runs are
taken over at once (its liveness session is gone on PostgreSQL, its process on SQLite), so
the leases can be three seconds: long enough that a live worker starved of CPU on a busy
machine keeps them, which the counts of steps run again rely on.
"""

from __future__ import annotations

import calendar
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from pydantic_core import from_json

from agency_runtime import Store, agency
from tests.forked import ForkedProcess, ForkServer
from tests.support import app_module

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL"),
]

DEADLINE = 60.0
NAP = 3.0
"""The sleep of the run killed mid-sleep (seconds)."""

APP = """
import os, time
from agency_runtime import agency

LEDGER = os.environ["LEDGER"]


def note(run_id, label):
    with open(LEDGER, "a") as ledger:
        ledger.write(f"{run_id} {label} {time.time()!r} {os.getpid()}\\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def _step(label):
    run_id = agency.ctx().run_id

    def body():
        note(run_id, label)
        return label

    async def scope(s):
        return await s.step(body, name=label)

    return agency.with_resumable_scope(label, scope)


@agency.entry
async def napper(seconds: float) -> str:
    await _step("before")
    await agency.sleep(seconds)
    await _step("after")
    return "done"


@agency.entry
async def noted_napper(seconds: float) -> str:
    note(agency.ctx().run_id, "attempt")  # every attempt starts here, a takeover's too
    await _step("before")
    await agency.sleep(seconds)
    await _step("after")
    return "done"


@agency.entry
async def collector(count: int) -> list:
    return [await agency.wait_for_event("item") for _ in range(count)]


@agency.entry
def tick() -> str:
    note(agency.ctx().run_id, "tick")
    return "ok"
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``timed.py`` in ``tmp_path``, imported here too (so this process can enqueue it)."""
    yield from app_module(tmp_path, monkeypatch, "timed", APP)


def _worker(
    server: ForkServer, tmp_path: Path, url: str, name: str, *, park_after: float
) -> ForkedProcess:
    return server.start(
        "module",
        "agency_runtime",
        "worker",
        "--store",
        url,
        "--import",
        "timed",
        "--lease",
        "3",
        "--poll",
        "0.05",
        "--park-after",
        str(park_after),
        env=dict(os.environ),
        cwd=tmp_path,
        output=tmp_path / name,
    )


def _kill(proc: ForkedProcess) -> None:
    proc.kill()
    assert proc.wait(timeout=DEADLINE) == -signal.SIGKILL


def _stop(proc: ForkedProcess) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=DEADLINE)


def _ledger(tmp_path: Path) -> list[tuple[str, str, float, int]]:
    """Each step run so far: its run id, label, time and the pid of the worker that ran it."""
    lines = (tmp_path / "ledger.txt").read_text().splitlines()
    return [
        (run, label, float(at), int(pid))
        for run, label, at, pid in (line.split() for line in lines)
    ]


def _first(tmp_path: Path, run_id: str, label: str) -> float:
    return min(at for run, what, at, _ in _ledger(tmp_path) if (run, what) == (run_id, label))


def _enqueue(app: ModuleType, store: Store, entry: str, *args: object, run_id: str) -> None:
    anyio.run(lambda: agency.enqueue(getattr(app, entry), *args, run_id=run_id, store=store))


def _wake_at(store: Store, run_id: str) -> float | None:
    """The wake-up time journaled by the run's sleep (``None`` before it slept)."""

    async def read() -> float | None:
        entries = (await store.load_journal(run_id)).entries
        found = [from_json(e.result) for e in entries if e.name == "agency.sleep"]
        assert len(found) <= 1
        return float(found[0]) if found else None

    return anyio.run(read)


def _until(what: str, check: object) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # a bounded poll of other processes' progress


def _results(store: Store, ids: list[str]) -> list[object]:
    async def wait_all() -> list[object]:
        results = [await agency.runs.wait(i, store=store, timeout=DEADLINE) for i in ids]
        assert [r.status for r in results] == ["completed"] * len(ids), [r.error for r in results]
        return [r.value for r in results]

    return anyio.run(wait_all)


def test_a_worker_killed_mid_sleep_leaves_only_the_remaining_time(
    tmp_path: Path, fork_server: ForkServer, app: ModuleType, store_url: tuple[str, Store]
) -> None:
    url, store = store_url
    _enqueue(app, store, "noted_napper", NAP, run_id="nap")
    first = _worker(fork_server, tmp_path, url, "first", park_after=100)  # waits in process
    _until("the sleep to be journaled", lambda: _wake_at(store, "nap") is not None)
    wake_at = _wake_at(store, "nap")
    assert wake_at is not None
    _kill(first)
    second = _worker(fork_server, tmp_path, url, "second", park_after=100)
    try:
        assert _results(store, ["nap"]) == ["done"]
    finally:
        _stop(second)
    woke = _first(tmp_path, "nap", "after")
    taken_over = max(at for _, label, at, _ in _ledger(tmp_path) if label == "attempt")
    # Not before the journaled time, and not a whole new sleep after the takeover: that
    # would end NAP seconds after the second attempt began. (Bounded by that attempt's
    # start, not by the kill: a busy machine may start the second worker late.)
    assert wake_at <= woke < taken_over + NAP, (woke, wake_at, taken_over)
    labels = Counter(label for run, label, _, _ in _ledger(tmp_path))
    assert labels == {"attempt": 2, "before": 1, "after": 1}


def test_kills_around_parking_and_waking_lose_no_run_and_wake_none_early(
    tmp_path: Path, fork_server: ForkServer, app: ModuleType, store_url: tuple[str, Store]
) -> None:
    url, store = store_url
    ids = [f"nap-{n}" for n in range(6)]
    for n, run_id in enumerate(ids):
        _enqueue(app, store, "napper", 0.3 + 0.2 * n, run_id=run_id)
    steady = _worker(fork_server, tmp_path, url, "steady", park_after=0)
    victim = _worker(fork_server, tmp_path, url, "victim-0", park_after=0)
    killed: set[int] = set()
    try:
        for round_ in range(1, 4):  # kill one worker at three instants: parking, waking, ...
            time.sleep(0.35)
            _kill(victim)
            killed.add(victim.pid)
            victim = _worker(fork_server, tmp_path, url, f"victim-{round_}", park_after=0)
        assert _results(store, ids) == ["done"] * len(ids)
    finally:
        _stop(victim)
        _stop(steady)
    ledger = _ledger(tmp_path)
    runs = Counter((run, label) for run, label, _, _ in ledger)
    for run_id in ids:
        wake_at = _wake_at(store, run_id)
        assert wake_at is not None
        assert _first(tmp_path, run_id, "after") >= wake_at  # never woken early
        assert 1 <= runs[(run_id, "before")] <= 2
        assert 1 <= runs[(run_id, "after")] <= 2
    # Only a step in flight at a kill runs again: every execution of a step but its last ran
    # in a worker that was then killed. (One kill may catch several: the steps of a worker's
    # concurrent runs commit together, in one statement on PostgreSQL.)
    executions: dict[tuple[str, str], list[int]] = {}
    for run, label, _, pid in ledger:
        executions.setdefault((run, label), []).append(pid)
    for step, pids in executions.items():
        assert set(pids[:-1]) <= killed, (step, pids, killed)


def test_events_sent_across_kills_are_each_taken_exactly_once(
    tmp_path: Path, fork_server: ForkServer, app: ModuleType, store_url: tuple[str, Store]
) -> None:
    url, store = store_url
    _enqueue(app, store, "collector", 8, run_id="inbox")
    worker = _worker(fork_server, tmp_path, url, "w-0", park_after=0)
    try:
        for n in range(8):
            anyio.run(lambda n=n: agency.runs.send("inbox", "item", n, store=store))
            time.sleep(0.05)
            if n in (2, 5):  # a kill right after a send, while the run takes it
                _kill(worker)
                worker = _worker(fork_server, tmp_path, url, f"w-{n}", park_after=0)
        assert _results(store, ["inbox"]) == [list(range(8))]
    finally:
        _stop(worker)


def test_two_workers_start_each_occurrence_once_while_one_is_killed(
    tmp_path: Path, fork_server: ForkServer, app: ModuleType, store_url: tuple[str, Store]
) -> None:
    url, store = store_url
    anyio.run(lambda: agency.schedules.add("tick", app.tick, every=1, store=store))

    async def fired() -> dict[str, str]:
        return {r.run_id: r.status for r in await agency.runs.list(store=store)}

    def done() -> int:
        return sum(status == "completed" for status in anyio.run(fired).values())

    first = _worker(fork_server, tmp_path, url, "first", park_after=30)
    second = _worker(fork_server, tmp_path, url, "second", park_after=30)
    try:  # progress, not fixed times: a busy machine starts workers late
        _until("two occurrences", lambda: done() >= 2)
        _kill(first)
        before = done()
        _until("two more occurrences after the kill", lambda: done() >= before + 2)
    finally:
        _stop(second)
        _stop(first)

    runs = anyio.run(fired)
    ids = sorted(runs)
    seconds = [calendar.timegm(time.strptime(i[5:], "%Y-%m-%dT%H:%M:%SZ")) for i in ids]
    assert len(ids) >= 4
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds)))  # no gap, no double
    # the last ones may still be queued: the drain stopped every worker
    assert set(runs.values()) <= {"completed", "queued"}
    completed = {run_id for run_id, status in runs.items() if status == "completed"}
    ticks = Counter(run for run, label, _, _ in _ledger(tmp_path) if label == "tick")
    assert completed <= set(ticks) <= set(ids)
    assert sum(ticks.values()) - len(ticks) <= 1  # only a tick in flight at the kill re-ran
