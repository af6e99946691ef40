"""Crash tests: a real worker process is killed with SIGKILL, then the run is resumed.

The worker (``WORKER`` below, written to ``tmp_path``) runs ``agency.run_sync(workflow,
run_id="crash", store="sqlite:///<db>")``. ``workflow`` has one resumable scope of ``N``
sequential steps; step ``i`` appends ``start i`` and then ``end i`` to a ledger file (open,
append, flush, ``os.fsync`` per line) and returns ``i``; the workflow returns the sum.

Two kinds of kill:

* self-kills: ``KILL_PHASE`` / ``KILL_AT`` make the worker ``os.kill(getpid(), SIGKILL)``
  at one exact place (inside step ``i`` before its ``start`` line, after ``start``, after
  ``end`` but before the step returns, in the scope body right after step ``i`` returned,
  before the scope, after the scope). The place "between two steps, after the commit" is
  the next step's body before its ``start`` line, or the scope body after ``s.step``
  returned: no sleep positions a self-kill.
* external kills: the test polls the ledger (bounded by a deadline) until a chosen line
  shows up and then sends SIGKILL from outside, so the kill lands wherever the worker is.
  Only these runs give the steps from the chosen one on a little work (``STEP_DELAY``,
  between a step's two lines), so that the worker is still running when the signal arrives.

After each kill the test reads the committed steps straight from the database file
(read-only), then runs the worker again to completion in a new process. The ledger is cut
into one segment per process; the invariants checked are those of DESIGN.md §4: no completed
step lost, no committed step executed again, at most the one step in flight at the kill runs
again, and the final result is ``sum(range(N))``.

The run keeps its default 30 s lease: the next process sees that the holder's pid on this
machine is gone and takes the run over at once, which is the path a restarted worker takes.

Workers are forked by a fork server (``tests/forked.py``) that imported the runtime once: each
is still a process of its own (its own pid, killed by a real SIGKILL), without paying for a
new interpreter and its imports every time.

Waiting is bounded and never positions a kill by time alone: a self-kill is placed by code;
an external kill polls the ledger (a short, bounded poll of another process's file).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.forked import ForkedProcess, ForkServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL"),
]

N = 30
TOTAL = sum(range(N))
RUN_ID = "crash"
DEADLINE = 20.0
"""Upper bound (seconds) on any wait for a worker: a hang fails the test instead of pytest."""

WORKER = r"""
import json
import os
import signal
import sys
import time

from agency_runtime import agency

LEDGER = os.environ["LEDGER"]
N = int(os.environ["STEPS"])
KILL_PHASE = os.environ.get("KILL_PHASE", "")
KILL_AT = int(os.environ.get("KILL_AT", "-1"))
STEP_DELAY = float(os.environ.get("STEP_DELAY", "0"))
SLOW_FROM = int(os.environ.get("SLOW_FROM", "0"))


def note(line):
    with open(LEDGER, "a") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def die(phase, i=-1):
    if phase == KILL_PHASE and i == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def make_step(i):
    def step():
        die("before_start", i)
        note(f"start {i}")
        die("after_start", i)
        if STEP_DELAY and i >= SLOW_FROM:
            # A little work, so the worker still runs when killed; the last step waits for
            # the kill (bounded), however late a busy machine lets the test see its line.
            time.sleep(STEP_DELAY if i < N - 1 else 120)
        note(f"end {i}")
        die("after_end", i)
        return i

    return step


async def body(s):
    total = 0
    for i in range(N):
        total += await s.step(make_step(i), name=f"step-{i}")
        die("after_return", i)
    return total


async def workflow():
    die("before_scope")
    total = await agency.with_resumable_scope("crash", body)
    die("after_scope")
    return total


if __name__ == "__main__":
    result = agency.run_sync(workflow, run_id="crash", store="sqlite:///" + os.environ["DB"])
    error = None if result.error is None else result.error.model_dump(mode="json")
    print(json.dumps({"status": result.status, "value": result.value, "error": error}))
    sys.exit(0 if result.status == "completed" else 3)
"""


@dataclass
class Kill:
    """What one killed process left behind."""

    lines: int  # ledger lines when the process was dead
    committed: list[int]  # step ids whose commit is in the database file


class Crash:
    """A worker script, its ledger and database, and the history of kills."""

    def __init__(self, tmp_path: Path, server: ForkServer) -> None:
        self.server = server
        self.script = tmp_path / "worker.py"
        self.script.write_text(WORKER)
        self.ledger = tmp_path / "ledger.txt"
        self.ledger.touch()
        self.db = tmp_path / "runs.db"
        self.kills: list[Kill] = []
        self.started = 0

    # -- processes ----------------------------------------------------------------------

    def start(self, **env: str) -> ForkedProcess:
        full = {k: v for k, v in os.environ.items() if k not in ("KILL_PHASE", "KILL_AT")}
        full.update(LEDGER=str(self.ledger), DB=str(self.db), STEPS=str(N))
        full.update(env)
        self.started += 1
        return self.server.start(
            "script",
            self.script,
            env=full,
            cwd=self.script.parent,
            output=self.script.parent / f"worker-{self.started}",
        )

    def _reap_killed(self, proc: ForkedProcess) -> None:
        try:
            _, err = proc.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"the worker did not die within {DEADLINE}s")
        assert proc.returncode == -signal.SIGKILL, (
            f"the worker was to die by SIGKILL, but exited with {proc.returncode}: {err}"
        )
        self.kills.append(Kill(len(self.lines()), self.committed()))

    def self_kill(self, phase: str, at: int = -1) -> None:
        """Run a worker that SIGKILLs itself at ``phase`` of step ``at``."""
        self._reap_killed(self.start(KILL_PHASE=phase, KILL_AT=str(at)))

    def external_kill(self, line: str, *, after: float = 0.0, step_delay: float = 0.02) -> None:
        """Run a worker; SIGKILL it from outside ``after`` s after ``line`` is in the ledger.

        The steps from the one of ``line`` on take ``step_delay`` s each (the ones before it
        have no work to do), and the last one lasts until the kill: the worker is still
        running when the signal arrives.
        """
        proc = self.start(STEP_DELAY=str(step_delay), SLOW_FROM=line.split()[1])
        deadline = time.monotonic() + DEADLINE
        try:
            while line not in self.lines():
                if proc.poll() is not None:
                    pytest.fail(f"the worker exited ({proc.returncode}) before {line!r}")
                if time.monotonic() > deadline:
                    pytest.fail(f"the ledger did not reach {line!r} within {DEADLINE}s")
                time.sleep(0.001)  # a short poll of the worker's ledger file
            if after:
                time.sleep(after)  # lands the kill a little later inside the step
            os.kill(proc.pid, signal.SIGKILL)
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        self._reap_killed(proc)

    def finish(self) -> dict[str, object]:
        """Run a worker to completion; return what it printed."""
        proc = self.start()
        try:
            out, err = proc.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"the resumed worker hung (no result within {DEADLINE}s)")
        assert proc.returncode == 0, f"the resumed worker failed ({proc.returncode}): {out}{err}"
        return dict(json.loads(out.strip().splitlines()[-1]))

    # -- evidence -----------------------------------------------------------------------

    def lines(self) -> list[str]:
        return self.ledger.read_text().splitlines()

    def committed(self) -> list[int]:
        """The step ids of run ``crash`` in the database (read-only: no checkpoint, no repair)."""
        if not self.db.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT path, result FROM steps WHERE run_id = ? ORDER BY seq", (RUN_ID,)
            ).fetchall()
        except sqlite3.OperationalError:  # killed before the schema existed
            return []
        finally:
            conn.close()
        ids = [int(path.rpartition("/")[2]) for path, _ in rows]
        for path, result in rows:
            assert path.startswith("crash/"), path
            assert json.loads(result) == int(path.rpartition("/")[2]), (path, result)
        return ids

    def run_row(self) -> tuple[str, int]:
        conn = sqlite3.connect(self.db)
        try:
            status = conn.execute("SELECT status FROM runs WHERE run_id = ?", (RUN_ID,)).fetchone()
            count = conn.execute(
                "SELECT count(*) FROM steps WHERE run_id = ?", (RUN_ID,)
            ).fetchone()
        finally:
            conn.close()
        return status[0], count[0]

    # -- the invariants -----------------------------------------------------------------

    def check(self, result: dict[str, object]) -> list[int | None]:
        """Check every invariant over all kills; return the step re-run after each kill."""
        assert result["status"] == "completed", result
        assert result["value"] == TOTAL, result
        assert self.run_row() == ("completed", N)
        lines = self.lines()
        cuts = [0, *(k.lines for k in self.kills), len(lines)]
        segments = [_parse(lines[a:b]) for a, b in itertools.pairwise(cuts)]
        for number, segment in enumerate(segments):
            _check_segment(segment, final=number == len(segments) - 1)

        reexecuted: list[int | None] = []
        ended_twice: list[int] = []  # re-run steps whose 'end' was written before the kill
        last: tuple[str, int] | None = None  # the last ledger line before the kill
        for kill, before, after in zip(self.kills, segments, segments[1:], strict=False):
            if before:
                last = before[-1]
            c = len(kill.committed)
            # The journal holds exactly a prefix of the steps, none that did not end.
            assert kill.committed == list(range(c)), kill.committed
            ended = -1 if last is None else (last[1] if last[0] == "end" else last[1] - 1)
            assert c <= ended + 1, f"step {c - 1} committed but its 'end' is not in the ledger"
            if c == N:
                assert after == [], f"all steps were committed, yet {after} ran again"
                reexecuted.append(None)
                continue
            if not after:  # killed again before a line was written
                reexecuted.append(None)
                continue
            first = after[0][1]
            # The resumed process starts exactly at the first uncommitted step: no completed
            # step re-executed (first >= c), none lost or skipped (first <= c).
            assert first == c, (
                f"after the kill {c} steps were committed, but the next process started at "
                f"step {first} (last line before the kill: {last})"
            )
            if last is None:
                assert first == 0
                reexecuted.append(None)
            elif last[0] == "start":  # killed inside step last[1]: it must run again
                assert first == last[1], (last, first)
                reexecuted.append(first)
            else:  # killed after 'end j': j runs again only if its commit had not happened
                assert first in (last[1], last[1] + 1), (last, first)
                reexecuted.append(first if first == last[1] else None)
                if first == last[1]:
                    ended_twice.append(first)

        everything = _parse(lines)
        starts = [i for kind, i in everything if kind == "start"]
        ends = [i for kind, i in everything if kind == "end"]
        for i in range(N):
            assert starts.count(i) == 1 + reexecuted.count(i), f"step {i} started {starts}"
            assert ends.count(i) == 1 + ended_twice.count(i), f"step {i} ended {ends}"
        return reexecuted


def _parse(lines: list[str]) -> list[tuple[str, int]]:
    parsed = []
    for line in lines:
        kind, _, number = line.partition(" ")
        assert kind in ("start", "end"), f"bad ledger line {line!r}"
        assert number.isdigit(), f"bad ledger line {line!r}"
        parsed.append((kind, int(number)))
    return parsed


def _check_segment(segment: list[tuple[str, int]], *, final: bool) -> None:
    """One process: start a, end a, start a+1, end a+1, ... (a killed one may stop anywhere)."""
    if not segment:
        return
    first = segment[0][1]
    expected = [(kind, first + k // 2) for k, kind in enumerate(["start", "end"] * N)]
    assert segment == expected[: len(segment)], f"steps out of order: {segment}"
    if final:
        assert segment[-1] == ("end", N - 1), f"the final process stopped early: {segment}"


# -- self-kills: exact places ----------------------------------------------------------------

SELF_KILLS = [
    ("before_scope", -1),
    *[
        (phase, i)
        for phase in ("before_start", "after_start", "after_end", "after_return")
        for i in (0, 1, 15, 28, N - 1)
    ],
    ("after_scope", -1),
]


def _expected(phase: str, i: int) -> tuple[int, int | None]:
    """(steps committed at the kill, the step that must run again) for a self-kill."""
    return {
        "before_scope": (0, None),
        "before_start": (i, None),  # step i-1 committed, step i wrote nothing yet
        "after_start": (i, i),
        "after_end": (i, i),  # step i's function finished, its commit had not happened
        "after_return": (i + 1, None),  # step i committed, step i+1 not called yet
        "after_scope": (N, None),
    }[phase]


@pytest.mark.parametrize(("phase", "at"), SELF_KILLS, ids=[f"{p}-{i}" for p, i in SELF_KILLS])
def test_self_kill_at_an_exact_place_resumes_without_loss_or_repeat(
    tmp_path: Path, fork_server: ForkServer, phase: str, at: int
) -> None:
    crash = Crash(tmp_path, fork_server)
    crash.self_kill(phase, at)
    committed, rerun = _expected(phase, at)
    assert crash.kills[0].committed == list(range(committed))
    reexecuted = crash.check(crash.finish())
    assert reexecuted == [rerun]


# -- external kills: wherever the signal lands -----------------------------------------------

EXTERNAL_KILLS = [
    ("start 3", 0.0),
    ("end 10", 0.0),
    ("start 18", 0.004),
    ("end 24", 0.0),
    ("start 29", 0.0),
]


@pytest.mark.parametrize(
    ("line", "after"), EXTERNAL_KILLS, ids=[line.replace(" ", "-") for line, _ in EXTERNAL_KILLS]
)
def test_external_kill_resumes_without_loss_or_repeat(
    tmp_path: Path, fork_server: ForkServer, line: str, after: float
) -> None:
    crash = Crash(tmp_path, fork_server)
    crash.external_kill(line, after=after)
    reexecuted = crash.check(crash.finish())
    assert len(reexecuted) == 1


# -- killed again while resuming -------------------------------------------------------------


def test_two_kills_in_a_row_then_completion(tmp_path: Path, fork_server: ForkServer) -> None:
    crash = Crash(tmp_path, fork_server)
    crash.self_kill("after_start", 5)
    crash.self_kill("after_end", 17)
    reexecuted = crash.check(crash.finish())
    assert [k.committed for k in crash.kills] == [list(range(5)), list(range(17))]
    assert reexecuted == [5, 17]
    # A completed run is final: calling it again executes nothing and returns the value.
    lines = crash.lines()
    again = crash.finish()
    assert (again["status"], again["value"]) == ("completed", TOTAL)
    assert crash.lines() == lines


def test_two_external_kills_in_a_row_then_completion(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    crash = Crash(tmp_path, fork_server)
    crash.external_kill("start 5")
    crash.external_kill("end 17")
    reexecuted = crash.check(crash.finish())
    assert len(reexecuted) == 2
