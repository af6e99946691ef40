"""Wake-up lateness of parked sleeps: PostgreSQL's NOTIFY against SQLite's polling.

    python3 bench/bench_wakeups.py [--runs N]

Each run journals its target time (a step: now + d) and then ``agency.sleep(d)``s, with d
uniform in [0.6, 1.6] s; its value is how late it woke: the time after the sleep minus the
target. Two ``agency.Worker`` s serve the queue (``park_after=0``, so every sleep parks and
frees its slot), each on **its own store object**, as two processes would be: a park by one
rings the other only through the database (PostgreSQL's NOTIFY) or at its next poll.

* "both serving": both workers run throughout; whichever parked a run wakes it (its loop
  sleeps until the next ``wake_at`` the store knows).
* "hand-off": runs are queued through A's store object (so A, rung at once, claims and parks
  nearly all of them), then A drains (as in a deploy); worker B, idle from the start, must
  wake them all. With NOTIFY, B hears each park at once and sleeps until the next wake-up;
  without, B learns of them at its next poll (``poll`` seconds) — runs due before it are late.

The PostgreSQL server is ``AGENCY_BENCH_POSTGRES`` when set, else an ephemeral cluster
(``tests/pg_cluster.py``), as in ``bench_postgres.py``. Median and p99 lateness per scenario.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio

from agency_runtime import SqliteStore, Store, Worker, agency, open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import Schemas, postgres, quantile

RUNS = 40
SLEEP = (0.6, 1.6)
FLOWS_MODULE = "bench_wakeups_flows"
FLOWS = """
import time
from agency_runtime import agency


def target_of(seconds):
    def body():
        return time.time() + seconds
    return body


@agency.entry
async def napper(seconds):
    async def body(s):
        return await s.step(target_of(seconds), name="target")

    target = await agency.with_resumable_scope("nap", body)
    await agency.sleep(seconds)
    return time.time() - target
"""


async def _all_parked(store: Store, ids: list[str]) -> None:
    with anyio.fail_after(60):
        while True:
            records = [await store.get_run(i) for i in ids]
            if all(r is not None and r.status == "waiting" for r in records):
                return
            await anyio.sleep(0.01)


async def scenario(open_: Any, flows: Any, *, handoff: bool, poll: float, runs: int) -> list[float]:
    """Lateness (seconds) of ``runs`` parked sleeps, two workers on separate store objects."""
    a, b = open_(), open_()
    try:
        delays = [random.uniform(*SLEEP) for _ in range(runs)]
        first = Worker(a, park_after=0, poll=poll, concurrency=runs)
        second = Worker(b, park_after=0, poll=poll, concurrency=runs)
        async with anyio.create_task_group() as group:
            group.start_soon(second.run)
            group.start_soon(first.run)
            await anyio.sleep(0.2)  # both idle in their waits
            ids = [await agency.enqueue(flows.napper, d, store=a) for d in delays]
            if handoff:
                await _all_parked(a, ids)
                await first.drain()  # B must wake every run A parked
            results = [await agency.runs.wait(i, store=a, timeout=60) for i in ids]
            await first.drain()
            await second.drain()
        bad = [r for r in results if r.status != "completed"]
        if bad:
            raise RuntimeError(f"runs did not complete: {bad[:3]}")
        return [float(r.value) for r in results]
    finally:
        a.close()
        b.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=RUNS, help=f"runs per scenario ({RUNS})")
    ns = parser.parse_args()
    begun = time.perf_counter()
    rows: list[tuple[str, list[float]]] = []
    with postgres() as (dsn, ephemeral), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / f"{FLOWS_MODULE}.py").write_text(textwrap.dedent(FLOWS))
        sys.path.insert(0, str(tmp))
        flows = __import__(FLOWS_MODULE)
        schemas = Schemas(dsn)
        try:
            for handoff in (False, True):
                url = schemas.url(schemas.new("handoff" if handoff else "both"))
                label = "hand-off" if handoff else "both serving"
                rows.append(
                    (
                        f"PostgreSQL, NOTIFY, poll=1.0, {label}",
                        anyio.run(
                            lambda u=url, h=handoff: scenario(
                                lambda: open_store(u), flows, handoff=h, poll=1.0, runs=ns.runs
                            )
                        ),
                    )
                )
            for handoff, poll in ((False, 1.0), (True, 1.0), (True, 0.1)):
                path = tmp / f"wake-{handoff}-{poll}.db"
                label = "hand-off" if handoff else "both serving"
                rows.append(
                    (
                        f"SQLite, polling, poll={poll}, {label}",
                        anyio.run(
                            lambda p=path, h=handoff, q=poll: scenario(
                                lambda: SqliteStore(p), flows, handoff=h, poll=q, runs=ns.runs
                            )
                        ),
                    )
                )
        finally:
            if not ephemeral:
                schemas.drop()
    width = max(len(label) for label, _ in rows)
    print(f"{'scenario'.ljust(width)}  runs  median      p99         max")
    for label, late in rows:
        print(
            f"{label.ljust(width)}  {len(late):>4}  {statistics.median(late) * 1e3:7.1f} ms  "
            f"{quantile(late, 0.99) * 1e3:7.1f} ms  {max(late) * 1e3:7.1f} ms"
        )
    early = [v for _, late in rows for v in late if v < 0]
    print(f"\n(no run woke early: {not early}; total {time.perf_counter() - begun:.1f} s)")
    return 1 if early else 0


if __name__ == "__main__":
    sys.exit(main())
