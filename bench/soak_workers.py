"""A bounded soak of worker processes under random SIGKILLs; exits non-zero if a check fails.

    python3 bench/soak_workers.py [--runs 1000] [--steps 20] [--store URL] [--seed N]

The store is ``--store`` (``postgresql://…`` or ``sqlite:///path.db``, for comparison), else
the PostgreSQL server ``AGENCY_BENCH_POSTGRES`` names (a fresh schema of its own, dropped at
the end), else an ephemeral cluster (``tests/pg_cluster.py``) started and stopped here.

``--workers`` (4) processes ``python3 -m agency_runtime worker --store URL --concurrency 4
--lease 2 --poll 0.2 --import soak_app`` serve the store; ``soak_app.py`` is written to a
temporary directory, their cwd. ``--runs`` runs of ``--steps`` steps are queued; each step
appends the line ``run step pid`` to a ledger file (O_APPEND, one write per line) and spends
exactly ``agency.add_cost(0.000001)`` inside the step, then sleeps ``--step-sleep`` seconds
(so kills land inside steps too). While runs progress, every 0.5-2 s one random worker is
SIGKILLed and restarted at once. When every run has ended, the workers get SIGTERM (they
drain and must exit 0), and the checks run:

* every run ``completed`` (with the right value), none left ``running``, none leased;
* every run's journal holds exactly ``--steps`` steps, each path once;
* the ledger shows every step executed, and a step executed more than once only when each
  execution but the last was by a process that was SIGKILLed afterwards, as that process's
  last step of that run (the step in flight when it died): at most one duplicate per kill
  per run in flight, so no committed step ran again;
* costs exact: every run's ``cost_pico == steps * 1_000_000`` (1e-6 USD a step, in integer
  pico-dollars), nothing unjournaled.

Printed: wall time, kills, duplicates, throughput (runs/s and steps/s), attempts.
"""

from __future__ import annotations

import argparse
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from agency_runtime import agency

ROOT = Path(__file__).resolve().parent.parent
APP = "soak_app"
APP_SOURCE = '''
"""The soak's application (bench/soak_workers.py): one entry of STEPS steps."""

import os

import anyio

from agency_runtime import agency

LEDGER = os.environ["SOAK_LEDGER"]
STEP_SLEEP = float(os.environ.get("SOAK_STEP_SLEEP", "0"))
_fd = None


def _ledger(line):
    global _fd
    if _fd is None:
        _fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line.encode())  # one write per line: O_APPEND keeps lines whole
    if os.environ.get("SOAK_FSYNC"):
        os.fsync(_fd)


@agency.entry
async def soak(run, steps):
    async def work(k):
        _ledger(f"{run} {k} {os.getpid()}\\n")
        agency.add_cost(0.000001)
        if STEP_SLEEP:
            await anyio.sleep(STEP_SLEEP)
        return run * 1000 + k

    async def body(s):
        total = 0
        for k in range(steps):
            total += await s.step(lambda k=k: work(k), name="work")
        return total

    return await agency.with_resumable_scope("soak", body)
'''


def expected_value(run: int, steps: int) -> int:
    return steps * run * 1000 + steps * (steps - 1) // 2


@contextmanager
def store_url(given: str | None) -> Iterator[tuple[str, str]]:
    """The store URL to soak, and a description of it."""
    if given:
        yield given, given.split("@")[-1]
        return
    dsn = os.environ.get("AGENCY_BENCH_POSTGRES")
    cluster = None
    if not dsn:
        sys.path.insert(0, str(ROOT))
        from tests.pg_cluster import start

        cluster = start()
        dsn = cluster.dsn
    schema = f"soak_{secrets.token_hex(3)}"
    sep = "&" if "?" in dsn else "?"
    server = "ephemeral cluster" if cluster else "AGENCY_BENCH_POSTGRES"
    try:
        yield f"{dsn}{sep}schema={schema}", f"PostgreSQL schema {schema} ({server})"
    finally:
        if cluster is not None:
            from tests.pg_cluster import stop

            stop(cluster.directory)
        else:
            import psycopg

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@dataclass
class Fleet:
    """The worker processes: started, SIGKILLed and restarted, drained at the end."""

    command: list[str]
    cwd: Path
    env: dict[str, str]
    logs: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kills: list[tuple[int, float]] = field(default_factory=list)  # (pid, time)
    started: int = 0
    log_of: dict[int, Path] = field(default_factory=dict)

    def spawn(self) -> subprocess.Popen[bytes]:
        self.started += 1
        log = open(self.logs / f"worker-{self.started}.log", "wb")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                self.command, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        finally:
            log.close()
        self.log_of[proc.pid] = self.logs / f"worker-{self.started}.log"
        return proc

    def serving(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether the worker said it serves (its SIGTERM handler is in place by then)."""
        return "serving queue" in self.log_of[proc.pid].read_text(errors="replace")

    def start(self, n: int) -> None:
        self.procs = [self.spawn() for _ in range(n)]

    def kill_one(self, rng: random.Random) -> None:
        slot = rng.randrange(len(self.procs))
        victim = self.procs[slot]
        if victim.poll() is None:
            victim.send_signal(signal.SIGKILL)
            self.kills.append((victim.pid, time.time()))
        victim.wait()
        self.procs[slot] = self.spawn()

    def dead(self) -> list[int]:
        return [p.returncode for p in self.procs if p.poll() is not None]

    def drain(self, timeout: float) -> list[int | None]:
        deadline = time.monotonic() + timeout  # a worker just restarted may still be importing
        while time.monotonic() < deadline and not all(
            self.serving(p) for p in self.procs if p.poll() is None
        ):
            time.sleep(0.05)
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes


async def enqueue(url: str, app: object, runs: int, steps: int) -> list[str]:
    return [
        await agency.enqueue(app.soak, i, steps, run_id=f"soak-{i}", store=url)  # type: ignore[attr-defined]
        for i in range(runs)
    ]


async def unfinished(url: str) -> int:
    n = 0
    for status in ("queued", "running"):
        n += len(await agency.runs.list(store=url, status=status, limit=10_000))
    return n


async def inspect(
    url: str, ids: list[str], steps: int
) -> tuple[list[str], Counter[int], list[float]]:
    """Problems with the stored runs; attempts per run; each run's (started, finished)."""
    problems: list[str] = []
    attempts: Counter[int] = Counter()
    times: list[float] = []
    for i, run_id in enumerate(ids):
        record = await agency.runs.get(run_id, store=url)
        attempts[record.attempts] += 1
        if record.status != "completed":
            problems.append(f"{run_id}: status {record.status} ({record.error})")
        elif record.value != str(expected_value(i, steps)):
            problems.append(f"{run_id}: value {record.value}, not {expected_value(i, steps)}")
        if record.lease_owner is not None or record.lease_expires_at is not None:
            problems.append(f"{run_id}: still leased by {record.lease_owner}")
        if record.cost_pico != steps * 1_000_000 or record.unjournaled_pico != 0:
            problems.append(
                f"{run_id}: cost_pico {record.cost_pico} (unjournaled {record.unjournaled_pico}),"
                f" not {steps * 1_000_000}"
            )
        entries = await agency.runs.journal(run_id, store=url)
        paths = [e.path for e in entries]
        if len(entries) != steps or len(set(paths)) != steps:
            problems.append(f"{run_id}: {len(entries)} journaled steps ({len(set(paths))} paths)")
        if sum(e.cost_pico for e in entries) != steps * 1_000_000:
            problems.append(
                f"{run_id}: its steps' own spend is {sum(e.cost_pico for e in entries)}"
            )
        if record.started_at is not None and record.finished_at is not None:
            times += [record.started_at, record.finished_at]
    return problems, attempts, times


def check_ledger(
    ledger: Path, runs: int, steps: int, killed: set[int]
) -> tuple[list[str], int, Counter[int]]:
    """Problems in the ledger; how many duplicate executions; executions per pid."""
    executions: dict[tuple[int, int], list[int]] = defaultdict(list)
    last_of: dict[tuple[int, int], int] = {}  # (pid, run) -> that process's last step of it
    per_pid: Counter[int] = Counter()
    problems: list[str] = []
    for number, line in enumerate(ledger.read_text().splitlines()):
        try:
            run, step, pid = map(int, line.split())
        except ValueError:
            problems.append(f"ledger line {number + 1} is torn: {line!r}")
            continue
        executions[(run, step)].append(pid)
        last_of[(pid, run)] = step
        per_pid[pid] += 1
    duplicates = 0
    per_kill: Counter[tuple[int, int]] = Counter()  # (killed pid, run) -> duplicates
    for run in range(runs):
        for step in range(steps):
            pids = executions.get((run, step), [])
            if not pids:
                problems.append(f"run {run} step {step} never ran")
                continue
            for pid in pids[:-1]:  # every execution but the last must have died uncommitted
                duplicates += 1
                per_kill[(pid, run)] += 1
                if pid not in killed:
                    problems.append(
                        f"run {run} step {step} ran again after pid {pid}, which was not killed"
                    )
                elif last_of[(pid, run)] != step:
                    problems.append(
                        f"run {run} step {step} ran again, but pid {pid} went on to step "
                        f"{last_of[(pid, run)]} of that run before it was killed (committed)"
                    )
    for (pid, run), n in per_kill.items():
        if n > 1:
            problems.append(f"run {run}: {n} duplicates from one kill of pid {pid}")
    return problems, duplicates, per_pid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", help="postgresql://… or sqlite:///path.db (default: see above)")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--poll", type=float, default=0.2)
    parser.add_argument("--step-sleep", type=float, default=0.002, help="seconds inside a step")
    parser.add_argument(
        "--kill-every", type=float, nargs=2, default=(0.5, 2.0), metavar=("MIN", "MAX")
    )
    parser.add_argument("--fsync", action="store_true", help="fsync the ledger after each line")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after S seconds")
    ns = parser.parse_args()
    seed = ns.seed if ns.seed is not None else secrets.randbelow(2**32)
    rng = random.Random(seed)

    with store_url(ns.store) as (url, shown), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / f"{APP}.py").write_text(textwrap.dedent(APP_SOURCE))
        ledger = tmp / "ledger.txt"
        ledger.touch()
        env = {
            **os.environ,
            "SOAK_LEDGER": str(ledger),
            "SOAK_STEP_SLEEP": str(ns.step_sleep),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp)]),
        }
        env.pop("AGENCY_STORE", None)
        if ns.fsync:
            env["SOAK_FSYNC"] = "1"
        os.environ.update({"SOAK_LEDGER": str(ledger)})
        sys.path.insert(0, str(tmp))
        app = __import__(APP)

        print(
            f"soak: {ns.runs} runs x {ns.steps} steps, {ns.workers} workers x "
            f"{ns.concurrency}, lease {ns.lease} s, poll {ns.poll} s, on {shown}; seed {seed}",
            flush=True,
        )
        began = time.perf_counter()
        ids = anyio.run(enqueue, url, app, ns.runs, ns.steps)
        enqueued = time.perf_counter() - began
        command = [
            sys.executable,
            "-m",
            "agency_runtime",
            "worker",
            "--store",
            url,
            "--concurrency",
            str(ns.concurrency),
            "--lease",
            str(ns.lease),
            "--poll",
            str(ns.poll),
            "--import",
            APP,
        ]
        logs = tmp / "logs"
        logs.mkdir()
        fleet = Fleet(command, tmp, env, logs)
        started = time.perf_counter()
        fleet.start(ns.workers)
        problems: list[str] = []
        next_kill = time.perf_counter() + rng.uniform(*ns.kill_every)
        last_look = 0.0
        while True:
            now = time.perf_counter()
            if now - started > ns.timeout:
                problems.append(f"gave up after {ns.timeout:.0f} s with runs unfinished")
                break
            if now - last_look >= 0.25:
                last_look = now
                left = anyio.run(unfinished, url)
                if left == 0:
                    break
            if now >= next_kill:
                fleet.kill_one(rng)
                next_kill = time.perf_counter() + rng.uniform(*ns.kill_every)
            for code in fleet.dead():
                problems.append(f"a worker exited by itself with code {code}")
                fleet.procs = [p for p in fleet.procs if p.poll() is None]
                fleet.procs.append(fleet.spawn())
            time.sleep(0.02)
        wall = time.perf_counter() - started
        codes = fleet.drain(timeout=30)
        if any(code != 0 for code in codes):
            problems.append(f"drained workers exited with {codes} (0 expected)")

        killed = {pid for pid, _ in fleet.kills}
        stored, attempts, times = anyio.run(inspect, url, ids, ns.steps)
        problems += stored
        ledger_problems, duplicates, per_pid = check_ledger(ledger, ns.runs, ns.steps, killed)
        problems += ledger_problems
        executions = sum(per_pid.values())
        span = (max(times) - min(times)) if times else float("nan")
        errors = []
        for log in sorted(logs.iterdir()):
            errors += [
                line
                for line in log.read_text(errors="replace").splitlines()
                if "Traceback" in line or "ERROR" in line or "could not be run" in line
            ]
        sys.path.remove(str(tmp))

    steps_total = ns.runs * ns.steps
    print(
        f"wall time          {wall:.1f} s from the workers' start to the last run ended "
        f"(enqueue {enqueued:.1f} s before; first claim to last completion {span:.1f} s)"
    )
    print(
        f"kills              {len(fleet.kills)} SIGKILLs ({fleet.started} worker processes "
        f"started, {len(per_pid)} ran steps)"
    )
    print(
        f"duplicates         {duplicates} step executions again "
        f"({executions} executions for {steps_total} steps)"
    )
    print(f"throughput         {ns.runs / wall:.1f} runs/s, {steps_total / wall:.0f} steps/s")
    print(f"attempts per run   {dict(sorted(attempts.items()))}")
    if errors:
        print(f"worker log lines   {len(errors)} error line(s), e.g. {errors[0][:200]!r}")
    if problems:
        print(f"\nFAILED: {len(problems)} problem(s)")
        for problem in problems[:30]:
            print(f"  {problem}")
        return 1
    print(
        "\nall checks passed: every run completed once, journals whole, no committed step "
        "ran again, costs exact, nothing left running or leased"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
