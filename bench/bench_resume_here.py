"""Answering an interrupt after 1,000 steps in the process that paused the run (issue 30).

    python3 bench/bench_resume_here.py [--processes N] [--warm N] [--profile FILE]

The same-process row of ``bench/peers.py``'s workload 2, on its own: each of N fresh
processes runs the peers' warm-up (a 50-step run), pauses a run of 1,000 steps (each a
lambda step returning a 100 B string, named ``work``) at ``agency.interrupt``, and times
``agency.respond_to_interrupts`` answering it (which replays the 1,000 steps and completes
the run): the *first* answer in the process. It then pauses and answers ``--warm`` more
runs the same way: the *warm* answers. Printed: the medians over the processes of the first
answer and of each process's median warm answer, wall and CPU time (the goal: LangGraph's
same-process answer, about 3.4 ms here). ``--profile FILE`` runs one process under
cProfile, profiling the warm answers only, and writes the stats to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from peers import PAUSE_AFTER, WARM_UP_STEPS, agency_flows

CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from bench_resume_here import child
print(json.dumps(child(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
"""


def child(db: str, warm: int, profile: str) -> dict[str, Any]:
    """One process: the first answer, then ``warm`` more (seconds each)."""
    import anyio

    from agency_runtime import SqliteStore, agency, approve

    flows = agency_flows()  # workload 2's flows, as bench/peers.py runs them
    many_steps, steps_then_interrupt = flows["many_steps"], flows["steps_then_interrupt"]

    async def answer(store: Any, run_id: str) -> float:
        paused = await agency.run(steps_then_interrupt, PAUSE_AFTER, run_id=run_id, store=store)
        if paused.status != "paused":
            raise RuntimeError(f"not paused: {paused!r}")
        started, cpu = time.perf_counter(), time.process_time()
        result = await agency.respond_to_interrupts(paused, [approve()], store=store)
        elapsed, cpus[run_id] = time.perf_counter() - started, time.process_time() - cpu
        if result.status != "completed" or result.value is not True:
            raise RuntimeError(f"not completed: {result!r}")
        return elapsed

    cpus: dict[str, float] = {}

    async def main() -> dict[str, Any]:
        store = SqliteStore(db)
        try:
            warmed = await agency.run(many_steps, WARM_UP_STEPS, run_id="w", store=store)
            if warmed.status != "completed":
                raise RuntimeError(f"warm-up: {warmed!r}")
            first = await answer(store, "first")
            if profile:
                import cProfile

                profiler = cProfile.Profile()
                times = []
                for k in range(warm):
                    paused = await agency.run(
                        steps_then_interrupt, PAUSE_AFTER, run_id=f"p{k}", store=store
                    )
                    profiler.enable()
                    started = time.perf_counter()
                    await agency.respond_to_interrupts(paused, [approve()], store=store)
                    times.append(time.perf_counter() - started)
                    profiler.disable()
                profiler.dump_stats(profile)
                return {"first": first, "warm": times, "first_cpu": cpus["first"], "warm_cpu": []}
            warms = [await answer(store, f"w{k}") for k in range(warm)]
            return {
                "first": first,
                "warm": warms,
                "first_cpu": cpus["first"],
                "warm_cpu": [cpus[f"w{k}"] for k in range(warm)],
            }
        finally:
            store.close()

    return anyio.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=9)
    parser.add_argument("--warm", type=int, default=9)
    parser.add_argument("--profile", default="")
    options = parser.parse_args()
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MODE": "PRODUCTION"}
    firsts, warms, first_cpus, warm_cpus = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(1 if options.profile else options.processes):
            db = str(Path(tmp) / f"{k}.db")
            command = [sys.executable, "-c", CHILD, str(Path(__file__).parent), db]
            done = subprocess.run(
                [*command, str(options.warm), options.profile],
                env=env, capture_output=True, text=True, check=False, timeout=300,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"the measuring process failed:\n{done.stderr}")
            report = json.loads(done.stdout.strip().splitlines()[-1])
            firsts.append(report["first"])
            warms.append(statistics.median(report["warm"]))
            first_cpus.append(report["first_cpu"])
            if report["warm_cpu"]:
                warm_cpus.append(statistics.median(report["warm_cpu"]))
    first, warm = statistics.median(firsts), statistics.median(warms)
    print(
        json.dumps(
            {
                "first_ms": round(first * 1e3, 3),
                "warm_ms": round(warm * 1e3, 3),
                "first_cpu_ms": round(statistics.median(first_cpus) * 1e3, 3),
                "warm_cpu_ms": round(statistics.median(warm_cpus) * 1e3, 3) if warm_cpus else None,
                "firsts_ms": [round(f * 1e3, 2) for f in firsts],
                "warms_ms": [round(w * 1e3, 2) for w in warms],
            }
        )
    )


if __name__ == "__main__":
    main()
