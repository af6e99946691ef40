"""Journal benchmarks, measured side by side in one run (ratios against goals).

    python3 bench/bench_journal.py

(a) journaled step overhead: ``agency.run`` of one scope of 2000 trivial steps on a
    SqliteStore (WAL), time per step, over a raw sqlite3 WAL (synchronous=NORMAL)
    INSERT-in-autocommit loop of as many rows of the same size and key shape (goal <= 2x);
(a') the same with a dict result and a lambda step: each step is
    ``s.step(lambda: {"i": i, "ok": True})`` (named after what the lambda calls, its result
    round-tripped through JSON), over the raw loop with rows of its size (goal <= 2x);
(b) answering an interrupt after 1000 completed steps: a run of 1000 steps then
    ``agency.interrupt`` pauses; T is that original run's time. Answering it with
    ``agency.respond_to_interrupts`` (which replays the 1000 steps and completes the run) is
    timed in the same process (goal <= 5% of T) and in a fresh process that opens the same
    store file (timed inside that process around the call only; goal <= 10% of T);
(c) idempotent re-call of a completed run: microseconds per ``agency.run`` (goal <= 1 ms);
(d) storage: 200 LLM turns (``agency.llm`` with a 1 KB prompt, a fake model answering 1 KB)
    in one run, in a fresh process on a new SQLite file: the files on disk after that process
    exits over the message text bytes (goal <= 2x, issue 17); (d') the same with each call
    inside a step, ``s.step(lambda: agency.llm(...))`` (goal <= 2x: each text stored once,
    issue 30); and the largest the database
    and its WAL were together while the run wrote, over the same (goal <= 2x + the WAL cap,
    ``_sqlite.WAL_LIMIT_BYTES``).

(e) resume scaling: a run paused after 1k / 10k / 100k steps is answered in a fresh process,
    which first reads the run's journal alone (``store.load_journal``) and then answers it;
    per completed step, the answer must not grow faster than the read (issue 17).

(a), (a') and (b) are medians of five repetitions, (c) a mean over 2000 calls. The workflows live
in a module written to the temporary directory, so the fresh process of (b) can import the
run's entry. The diagnostic row under (b) is a second answer (to another paused run) in the
same fresh process: the cold first answer minus it is the one-time cost of a new process.
"""

from __future__ import annotations

import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio

from agency_runtime import SqliteStore, agency, approve
from agency_runtime._store._sqlite import WAL_LIMIT_BYTES

STEPS = 2000
PAUSE_AFTER = 1000
MESSAGES = 200
MESSAGE_SIZE = 1024
REPEAT = 5
RECALLS = 2000

FLOWS_MODULE = "bench_journal_flows"
FLOWS = '''
"""Workflows of bench/bench_journal.py (written here so a fresh process can import them)."""

from agency_runtime import agency


def trivial():
    return 1


async def many_steps(n):
    async def body(s):
        total = 0
        for _ in range(n):
            total += await s.step(trivial)
        return total

    return await agency.with_resumable_scope("steps", body)


async def dict_steps(n):
    async def body(s):
        total = 0
        for i in range(n):
            total += (await s.step(lambda: {"i": i, "ok": True}))["i"]
        return total

    return await agency.with_resumable_scope("steps", body)


@agency.entry
async def steps_then_interrupt(n):
    async def body(s):
        for _ in range(n):
            await s.step(trivial)
        answer = await agency.interrupt("continue", "go on?")
        return answer.approved

    return await agency.with_resumable_scope("steps", body)


def message_text(i, size):
    text = f"message {i:04d}: " + "the quick brown fox jumps over the lazy dog. " * (size // 40 + 1)
    return text[:size]


def file_bytes(db):
    import os

    return sum(os.path.getsize(p) for p in (db, db + "-wal", db + "-shm") if os.path.exists(p))


async def llm_turns(n, size, model, db, in_steps=False):
    largest = 0

    async def body(s):
        nonlocal largest
        for i in range(n):
            if in_steps:  # each turn a step of its own around the call
                await s.step(lambda i=i: agency.llm(message_text(i, size), model=model))
            else:
                await agency.llm(message_text(i, size), model=model)
            largest = max(largest, file_bytes(db))
        return largest

    return await agency.with_resumable_scope("turns", body)
'''

LLM_TURNS_PROCESS = """
import sys
sys.path.insert(0, sys.argv[1])
import anyio
from agency_runtime import agency
from agency_runtime.testing import FakeModel
from bench_journal_flows import llm_turns, message_text

n, size, db, in_steps = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
replies = [message_text(i, size).replace("message", "answer ") for i in range(n)]
fake = FakeModel("bench-turns", replies=replies).register()

async def main():
    result = await agency.run(
        llm_turns, n, size, fake.model, db, in_steps, run_id="turns", store="sqlite:///" + db
    )
    assert result.status == "completed", result
    print(result.value)

anyio.run(main)
"""

FRESH_PROCESS = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import anyio
from agency_runtime import agency, approve

async def main():
    reports = []
    for interrupts in json.loads(sys.argv[3]):  # the first answer is the measure
        started = time.perf_counter()
        result = await agency.respond_to_interrupts(interrupts, [approve()], store=sys.argv[2])
        seconds = time.perf_counter() - started
        reports.append({"seconds": seconds, "status": result.status, "value": result.value})
    print(json.dumps(reports))

anyio.run(main)
"""


SCALE_PROCESS = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import anyio
from agency_runtime import SqliteStore, agency, approve

async def main():
    store = SqliteStore(sys.argv[2])
    interrupts = json.loads(sys.argv[3])
    started = time.perf_counter()
    await store.load_journal(interrupts[0]["run_id"])
    read = time.perf_counter() - started
    started = time.perf_counter()
    result = await agency.respond_to_interrupts(interrupts, [approve()], store=store)
    answer = time.perf_counter() - started
    print(json.dumps({"read": read, "answer": answer, "status": result.status}))

anyio.run(main)
"""

SCALES = (1_000, 10_000, 100_000)


def expect(ok: bool, what: object) -> None:
    """Stop the benchmark when a measured run did not do what it should (asserts may be off)."""
    if not ok:
        raise RuntimeError(f"unexpected outcome: {what!r}")


def url(path: Path) -> str:
    return f"sqlite:///{path}"  # an absolute path gives the four-slash form


# -- (a) journaled step overhead -----------------------------------------------------------


def step_row_bytes(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        (size,) = conn.execute(
            "SELECT avg(length(run_id) + length(path) + length(name) + length(callsite) "
            "+ length(result) + ifnull(length(locals), 0) + ifnull(length(scopes), 0) "
            "+ ifnull(length(deltas), 0)) FROM steps"
        ).fetchone()
    finally:
        conn.close()
    return round(float(size))


def raw_inserts(db: Path, n: int, row_bytes: int) -> float:
    """Seconds per INSERT (autocommit) of a row shaped like a journaled step."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE steps (run_id TEXT NOT NULL, path TEXT NOT NULL, seq INTEGER NOT NULL, "
        "body TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (run_id, path)) "
        "STRICT, WITHOUT ROWID"
    )
    run_id = "raw-run"
    started = time.perf_counter()
    for i in range(n):
        path = f"steps/{i}"
        body = "x" * max(1, row_bytes - len(run_id) - len(path))
        conn.execute(
            "INSERT INTO steps VALUES (?, ?, ?, ?, ?)", (run_id, path, i, body, time.time())
        )
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed / n


async def journaled_steps(store: SqliteStore, flows: Any, run_id: str) -> float:
    started = time.perf_counter()
    result = await agency.run(flows.many_steps, STEPS, run_id=run_id, store=store)
    elapsed = time.perf_counter() - started
    expect(result.status == "completed" and result.value == STEPS, result)
    return elapsed / STEPS


async def journaled_dict_steps(store: SqliteStore, flows: Any, run_id: str) -> float:
    started = time.perf_counter()
    result = await agency.run(flows.dict_steps, STEPS, run_id=run_id, store=store)
    elapsed = time.perf_counter() - started
    expect(result.status == "completed" and result.value == STEPS * (STEPS - 1) // 2, result)
    return elapsed / STEPS


async def step_overhead(tmp: Path, name: str, steps: Any, flows: Any) -> tuple[float, float, int]:
    """(seconds per journaled step, per raw insert, the rows' bytes): a warm-up run, then
    raw and journaled alternating, so drift hits both alike (medians)."""
    db = tmp / f"{name}.db"
    store = SqliteStore(db)
    await steps(store, flows, "warm-up")
    row_bytes = step_row_bytes(db)
    raw, ours = [], []
    for k in range(REPEAT):
        raw.append(raw_inserts(tmp / f"raw-{name}-{k}.db", STEPS, row_bytes))
        ours.append(await steps(store, flows, f"{name}-{k}"))
    store.close()
    return statistics.median(ours), statistics.median(raw), row_bytes


# -- (b) answering an interrupt --------------------------------------------------------------


async def paused_run(store: SqliteStore, flows: Any, run_id: str) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await agency.run(flows.steps_then_interrupt, PAUSE_AFTER, run_id=run_id, store=store)
    elapsed = time.perf_counter() - started
    expect(result.status == "paused" and len(result.interrupts) == 1, result)
    return elapsed, result


async def answer_here(store: SqliteStore, paused: Any) -> float:
    started = time.perf_counter()
    result = await agency.respond_to_interrupts(paused, [approve()], store=store)
    elapsed = time.perf_counter() - started
    expect(result.status == "completed" and result.value is True, result)
    return elapsed


def in_fresh_process(script: str, *args: object, timeout: float = 120) -> Any:
    """Run ``script`` in a new interpreter (the app's module allowed); its last line's JSON."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        env={**os.environ, "AGENCY_IMPORTS": FLOWS_MODULE},  # the app's module (trust model)
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the fresh process failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def answer_in_fresh_process(tmp: Path, db: Path, *paused: Any) -> list[float]:
    """Seconds per answer, in order, all in one new process (the first one is cold)."""
    interrupts = json.dumps([[i.model_dump(mode="json") for i in p.interrupts] for p in paused])
    reports = in_fresh_process(FRESH_PROCESS, tmp, url(db), interrupts)
    for report in reports:
        expect(report["status"] == "completed" and report["value"] is True, report)
    return [float(report["seconds"]) for report in reports]


async def pause_scaled(tmp: Path, flows: Any) -> list[tuple[int, Any]]:
    """Runs paused after each of :data:`SCALES` steps, in ``scale.db``."""
    store = SqliteStore(tmp / "scale.db")
    paused = [(n, await paused_run_of(store, flows, f"scale-{n}", n)) for n in SCALES]
    store.close()
    return paused


def answer_scaled(tmp: Path, paused: list[tuple[int, Any]]) -> list[tuple[int, float, float]]:
    """(steps, seconds to read the journal, seconds to answer), a fresh process per run."""
    reports = []
    for n, result in paused:
        interrupts = json.dumps([i.model_dump(mode="json") for i in result.interrupts])
        report = in_fresh_process(SCALE_PROCESS, tmp, tmp / "scale.db", interrupts, timeout=300)
        expect(report["status"] == "completed", report)
        reports.append((n, float(report["read"]), float(report["answer"])))
    return reports


async def paused_run_of(store: SqliteStore, flows: Any, run_id: str, n: int) -> Any:
    result = await agency.run(flows.steps_then_interrupt, n, run_id=run_id, store=store)
    expect(result.status == "paused", result)
    return result


# -- (d) storage ---------------------------------------------------------------------------


def storage(tmp: Path, flows: Any, *, in_steps: bool = False) -> tuple[int, int, int]:
    """(bytes on disk after the process exited, the most while it ran, the messages' text);
    ``in_steps``: each call inside ``s.step(lambda: agency.llm(...))``."""
    name = "turns-in-steps" if in_steps else "turns"
    db = tmp / f"{name}.db"
    args = (tmp, MESSAGES, MESSAGE_SIZE, db, int(in_steps))
    largest = int(in_fresh_process(LLM_TURNS_PROCESS, *args))
    after = sum(p.stat().st_size for p in tmp.glob(f"{name}.db*"))
    prompts = sum(len(flows.message_text(i, MESSAGE_SIZE).encode()) for i in range(MESSAGES))
    return after, largest, 2 * prompts  # the answers are as long as the prompts


# -- the table -------------------------------------------------------------------------------


def row(measure: str, value: str, goal: str, ok: bool) -> tuple[str, str, str, str]:
    return measure, value, goal, "pass" if ok else "FAIL"


async def main() -> None:
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / f"{FLOWS_MODULE}.py").write_text(textwrap.dedent(FLOWS))
        sys.path.insert(0, str(tmp))
        flows = __import__(FLOWS_MODULE)

        # (a) and (a')
        ours_s, raw_s, row_bytes = await step_overhead(tmp, "journal", journaled_steps, flows)
        dict_s, dict_raw_s, dict_bytes = await step_overhead(
            tmp, "dict-journal", journaled_dict_steps, flows
        )

        # (c) idempotent re-call of a completed 2000-step run
        store = SqliteStore(tmp / "journal.db")
        started = time.perf_counter()
        for _ in range(RECALLS):
            again = await agency.run(flows.many_steps, STEPS, run_id="journal-0", store=store)
        recall_s = (time.perf_counter() - started) / RECALLS
        expect(again.status == "completed" and again.value == STEPS, again)
        store.close()

        # (b) pause after 1000 steps; answer in this process and in a fresh one
        db_b = tmp / "interrupts.db"
        store_b = SqliteStore(db_b)
        await paused_run(store_b, flows, "warm-up")  # build lazy schemas before timing
        originals, here, fresh, warm = [], [], [], []
        for k in range(REPEAT):
            t_here, paused_here = await paused_run(store_b, flows, f"here-{k}")
            here.append(await answer_here(store_b, paused_here) / t_here)
            originals.append(t_here)
            t_fresh, paused_fresh = await paused_run(store_b, flows, f"fresh-{k}")
            t_warm, paused_warm = await paused_run(store_b, flows, f"fresh-warm-{k}")
            originals += [t_fresh, t_warm]
            cold_s, warm_s = answer_in_fresh_process(tmp, db_b, paused_fresh, paused_warm)
            fresh.append(cold_s / t_fresh)
            warm.append(warm_s / t_warm)
        store_b.close()
        t_original = statistics.median(originals)
        here_ratio, fresh_ratio = statistics.median(here), statistics.median(fresh)
        warm_ratio = statistics.median(warm)

        # (d)
        size, largest, text = storage(tmp, flows)
        stepped, _, _ = storage(tmp, flows, in_steps=True)
        # (e)
        scaling = answer_scaled(tmp, await pause_scaled(tmp, flows))
        sys.path.remove(str(tmp))

    step_ratio, dict_ratio = ours_s / raw_s, dict_s / dict_raw_s
    cap = WAL_LIMIT_BYTES
    rows = [
        row(
            f"(a) journaled step / raw WAL insert ({STEPS} steps, ~{row_bytes} B rows)",
            f"{step_ratio:.2f}x ({ours_s * 1e6:.1f} µs vs {raw_s * 1e6:.1f} µs)",
            "<= 2x",
            step_ratio <= 2,
        ),
        row(
            f"(a') the same, a dict result and a lambda step (~{dict_bytes} B rows)",
            f"{dict_ratio:.2f}x ({dict_s * 1e6:.1f} µs vs {dict_raw_s * 1e6:.1f} µs)",
            "<= 2x",
            dict_ratio <= 2,
        ),
        row(
            f"(b) answer interrupt after {PAUSE_AFTER} steps, same process / T",
            f"{here_ratio:.1%} (T = {t_original * 1e3:.1f} ms)",
            "<= 5%",
            here_ratio <= 0.05,
        ),
        row(
            f"(b) answer interrupt after {PAUSE_AFTER} steps, fresh process / T",
            f"{fresh_ratio:.1%} (T = {t_original * 1e3:.1f} ms)",
            "<= 10%",
            fresh_ratio <= 0.10,
        ),
        (
            "    (diagnostic) a 2nd answer in that process, another run / T",
            f"{warm_ratio:.1%}",
            "-",
            "-",
        ),
        row(
            "(c) idempotent re-call of a completed run",
            f"{recall_s * 1e6:.1f} µs",
            "<= 1000 µs",
            recall_s <= 1e-3,
        ),
        row(
            f"(d) on disk after exit / text ({MESSAGES} LLM turns, {MESSAGE_SIZE} B each way)",
            f"{size / text:.2f}x ({size / 1024:.0f} KiB for {text / 1024:.0f} KiB)",
            "<= 2x",
            size / text <= 2,
        ),
        row(
            "(d') the same, each call in s.step(lambda: agency.llm(...)) / text",
            f"{stepped / text:.2f}x ({stepped / 1024:.0f} KiB for {text / 1024:.0f} KiB)",
            "<= 2x",
            stepped / text <= 2,
        ),
        row(
            "(d) the most on disk while running (db + WAL) / text",
            f"{largest / text:.2f}x ({largest / 1024:.0f} KiB; WAL cap {cap / 1024:.0f} KiB)",
            "<= 2x + cap",
            largest <= 2 * text + cap,
        ),
    ]
    base_read, base_answer = scaling[0][1] / scaling[0][0], scaling[0][2] / scaling[0][0]
    for n, read, answer in scaling:
        grew = (answer / n) / base_answer <= max(1.0, (read / n) / base_read) * 1.25
        rows.append(
            row(
                f"(e) fresh answer after {n:,} steps: read / answer per step",
                f"{read / n * 1e6:.2f} / {answer / n * 1e6:.2f} µs ({answer * 1e3:.0f} ms)",
                "answer grows no faster than read",
                grew,
            )
        )
    header = ("measure", "value", "goal", "result")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print(f"\n(total {time.perf_counter() - begun:.1f} s)")


if __name__ == "__main__":
    anyio.run(main)
