"""Run-boundary benchmarks, measured side by side in one process (ratios, not absolutes).

    python3 bench/bench_runs.py [--runs N]

* raw commit: one INSERT + COMMIT into a WAL SQLite file (synchronous=NORMAL), the floor;
* a whole run: ``agency.run`` of a trivial entry on a SqliteStore (claim, frame, lease
  renewal task, outcome commit);
* idempotent re-call: ``agency.run`` with the id of a completed run (one read, no execution);

The import cost is measured by bench_llm.py.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from agency_runtime import SqliteStore, agency


def trivial(i: int) -> int:
    return i + 1


def raw_commits(path: Path, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT)")
    started = time.perf_counter()
    for i in range(n):
        conn.execute("INSERT INTO t VALUES (?, ?)", (f"row-{i}", '{"value": 1}'))
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed / n


async def timed(n: int, call: Callable[[int], Awaitable[object]]) -> float:
    started = time.perf_counter()
    for i in range(n):
        await call(i)
    return (time.perf_counter() - started) / n


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_commits(Path(tmp) / "raw.db", n)
        store = SqliteStore(Path(tmp) / "runs.db")
        whole = await timed(n, lambda i: agency.run(trivial, i, run_id=f"r{i}", store=store))
        recall = await timed(n, lambda i: agency.run(trivial, i, run_id=f"r{i}", store=store))
        store.close()

    print(f"{'measure':<44}{'per op':>12}{'ratio':>12}")
    for label, seconds in [
        ("raw WAL insert+commit", raw),
        ("agency.run of a trivial entry", whole),
        ("idempotent re-call of a completed run", recall),
    ]:
        print(f"{label:<44}{seconds * 1e6:>10.1f}µs{seconds / raw:>11.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    anyio.run(main, parser.parse_args().runs)
