"""Crash tests of what must hold off the straight path: real workers killed with SIGKILL.

Each scenario runs a worker script (``SCENARIOS`` below, written to ``tmp_path``) that kills
itself at one exact place (no sleeps position a kill), then runs the same script again in a
new process to completion, and checks what the store holds:

* ``sibling``: a step commits while its sibling step is in flight and has already spent
  money; the kill lands there. The committed step holds only its own spend, so the resumed
  run bills the sibling once, when it runs again (not twice).
* ``memory``: turn_kit's save step stores the turn in conversation memory and the process
  dies before the step commits. The save is idempotent by an id derived from the run and the
  step's path: the turn is remembered once.
* ``restore``: a restore with a ``globals=`` override, killed right after the rewind took
  effect. The rewind, the restore count and the override are one transaction: the resumed
  run does not restore again.

Workers are forked by the fork server of ``tests/forked.py`` (real processes of their own, that
do not pay for a new interpreter and its imports each time).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.forked import ForkServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL"),
]

DEADLINE = 60.0

COMMON = r"""
import json
import os
import signal
import sys

import anyio

from agency_runtime import agency

DB = os.environ["DB"]
STORE = "sqlite:///" + DB
KILL = os.environ.get("KILL") == "1"
LEDGER = os.environ["LEDGER"]


def note(line):
    with open(LEDGER, "a") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def die():
    if KILL:
        os.kill(os.getpid(), signal.SIGKILL)


def report(result):
    error = None if result.error is None else result.error.model_dump(mode="json")
    print(json.dumps({"status": result.status, "value": result.value, "cost": result.cost,
                      "error": error}))
"""

SIBLING = r"""
async def body(s):
    first_done = anyio.Event()

    def first():
        agency.add_cost(1.0)
        note("first ran")
        return "first"

    async def second():
        agency.add_cost(10.0)
        note("second ran")
        await first_done.wait()   # the first step has committed by now
        die()
        return "second"

    results = {}

    async def run_first():
        results["first"] = await s.step(first, name="first")
        first_done.set()

    async def run_second():
        results["second"] = await s.step(second, name="second")

    async with anyio.create_task_group() as group:
        group.start_soon(run_first)
        group.start_soon(run_second)
    return results


async def workflow():
    return await agency.with_resumable_scope("pair", body)


report(agency.run_sync(workflow, run_id="sibling", store=STORE))
"""

MEMORY = r"""
from agency_runtime._store import SqliteStore
from turn_kit import agency_ctx, create_turn_runner

saving = SqliteStore.save_memory


async def save_then_die(self, record):
    saved = await saving(self, record)
    note(f"saved {record.id}")
    die()   # after the memory item is stored, before the save step commits
    return saved


SqliteStore.save_memory = save_then_die


async def main():
    runner = create_turn_runner(namespace="crash-bot", store=STORE)
    result = await runner.run(
        agency_ctx(STORE),
        conversation={"transport": "test", "id": "chat-1"},
        input="remember me",
        respond=lambda turn: "I will.",
        deliver=lambda reply: {"ok": True},
        message_id="m-1",
    )
    print(json.dumps({"status": "completed", "value": result.memory_saved, "cost": 0,
                      "error": None}))


anyio.run(main)
"""

RESTORE = r"""
async def workflow():
    checkpoint = await agency.checkpoint("start")
    fixed = agency.global_("fixed")
    note(f"executing fixed={fixed}")
    if not fixed:
        await agency.restore(checkpoint, globals={"fixed": True})
    die()   # the restore took effect: the entry runs again with fixed=True
    return "done"


report(agency.run_sync(workflow, run_id="restore", store=STORE))
"""

SCENARIOS = {"sibling": SIBLING, "memory": MEMORY, "restore": RESTORE}


class Worker:
    def __init__(self, tmp_path: Path, scenario: str, server: ForkServer) -> None:
        self.server = server
        self.runs = 0
        self.script = tmp_path / f"{scenario}.py"
        self.script.write_text(COMMON + SCENARIOS[scenario])
        self.db = tmp_path / "runs.db"
        self.ledger = tmp_path / "ledger.txt"
        self.ledger.touch()

    def run(self, *, kill: bool) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DB": str(self.db), "LEDGER": str(self.ledger)}
        env["KILL"] = "1" if kill else "0"
        self.runs += 1
        process = self.server.start(
            "script",
            self.script,
            env=env,
            cwd=self.script.parent,
            output=self.script.parent / f"worker-{self.runs}",
        )
        try:
            out, err = process.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return subprocess.CompletedProcess(process.pid, process.returncode or 0, out, err)

    def killed(self) -> None:
        done = self.run(kill=True)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)

    def finished(self) -> dict[str, object]:
        done = self.run(kill=False)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    def lines(self) -> list[str]:
        return self.ledger.read_text().splitlines()

    def query(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()


def test_a_kill_while_a_sibling_step_is_in_flight_bills_it_once(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    worker = Worker(tmp_path, "sibling", fork_server)
    worker.killed()
    assert worker.lines() == ["first ran", "second ran"]
    # The committed step holds its own spend, not the run's total with the sibling's in it.
    assert worker.query("SELECT path, cost_pico FROM steps") == [("pair/0.0:0", 10**12)]
    outcome = worker.finished()
    assert outcome["status"] == "completed"
    assert outcome["value"] == {"first": "first", "second": "second"}
    assert worker.lines() == ["first ran", "second ran", "second ran"]  # only the sibling
    assert outcome["cost"] == 11.0  # $1 once, $10 once: the killed attempt's $10 never stuck
    assert worker.query("SELECT cost_pico FROM runs") == [(11 * 10**12,)]


def test_a_kill_between_a_memory_save_and_its_step_commit_saves_once(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    worker = Worker(tmp_path, "memory", fork_server)
    worker.killed()
    assert len([line for line in worker.lines() if line.startswith("saved")]) == 1
    outcome = worker.finished()
    assert outcome["value"] is True
    saves = [line for line in worker.lines() if line.startswith("saved")]
    assert len(saves) == 2
    assert saves[0] == saves[1]  # the same id both times
    assert worker.query("SELECT COUNT(*) FROM memory_items") == [(1,)]


def test_a_kill_right_after_a_restore_does_not_restore_again(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    worker = Worker(tmp_path, "restore", fork_server)
    worker.killed()
    assert worker.lines() == ["executing fixed=None", "executing fixed=True"]
    outcome = worker.finished()
    assert outcome["status"] == "completed"
    assert outcome["value"] == "done"
    # The resumed run starts with the restored globals: no second restore.
    assert worker.lines() == [
        "executing fixed=None",
        "executing fixed=True",
        "executing fixed=True",
    ]
    (body,) = worker.query("SELECT body FROM checkpoints WHERE run_id = 'restore'")[0]
    assert json.loads(str(body))["restores"] == 1
