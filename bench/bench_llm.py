"""agency.llm overhead and import cost, measured side by side in one run.

    python3 bench/bench_llm.py [--calls N]

* raw: ``litellm.acompletion`` on the offline fake model (fake/echo), with the same
  messages agency.llm would send;
* agency.llm: the same call inside ``agency.run`` on a SqliteStore, so thread handling,
  billing and journaling are all included;
* import: ``import agency_runtime, turn_kit`` in a fresh interpreter, over a bare one, and
  ``import litellm`` for scale.

Goals (issue 4): agency.llm adds at most 10 % over the raw call; the import adds at most
250 ms over a bare interpreter.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

import agency_runtime.testing  # noqa: F401 - registers the fake provider
from agency_runtime import SqliteStore, agency
from agency_runtime._llm._litellm import load_litellm

MODEL = "fake/echo"
ROUNDS = 9


async def raw_calls(litellm: Any, n: int) -> float:
    messages: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i in range(n):
        messages.append({"role": "user", "content": f"question {i}"})
        response = await litellm.acompletion(
            model=MODEL, messages=list(messages), timeout=120.0, num_retries=0
        )
        messages.append({"role": "assistant", "content": response.choices[0].message.content})
    return (time.perf_counter() - started) / n


async def agency_calls(n: int) -> float:
    async def entry() -> int:
        for i in range(n):
            await agency.llm(f"question {i}")
        return n

    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "llm.db")
        started = time.perf_counter()
        result = await agency.run(entry, store=store, model=MODEL)
        elapsed = time.perf_counter() - started
        store.close()
    if result.status != "completed":
        raise RuntimeError(f"the measured run did not complete: {result!r}")
    return elapsed / n


def import_seconds(statement: str, repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def main(n: int) -> None:
    litellm = await load_litellm()
    await raw_calls(litellm, 20)  # warm up both paths
    await agency_calls(20)
    raws, ours, ratios = [], [], []
    for round_ in range(ROUNDS):  # paired rounds, alternating which goes first
        if round_ % 2:
            mine_s, raw_s = await agency_calls(n), await raw_calls(litellm, n)
        else:
            raw_s, mine_s = await raw_calls(litellm, n), await agency_calls(n)
        raws.append(raw_s)
        ours.append(mine_s)
        ratios.append(mine_s / raw_s)
    raw, mine = statistics.median(raws), statistics.median(ours)
    bare = import_seconds("pass")
    ours_import = import_seconds("import agency_runtime, turn_kit")
    heavy = import_seconds("import litellm", repeat=1)
    overhead = statistics.median(ratios) - 1
    rows = [
        ("raw litellm.acompletion (fake/echo)", f"{raw * 1e3:.2f} ms", "", ""),
        ("agency.llm in a run (journaled)", f"{mine * 1e3:.2f} ms", "", ""),
        (
            "agency.llm overhead (median of paired rounds)",
            f"{overhead:+.1%}",
            "<= 10%",
            _verdict(overhead <= 0.10),
        ),
        (
            "import agency_runtime, turn_kit (over bare)",
            f"{(ours_import - bare) * 1e3:.0f} ms",
            "<= 250 ms",
            _verdict(ours_import - bare <= 0.25),
        ),
        ("import litellm (over bare), for scale", f"{(heavy - bare) * 1e3:.0f} ms", "", ""),
    ]
    print(f"{'measure':<46}{'value':>12}  {'goal':<10}{'result':<6}")
    for label, value, goal, verdict in rows:
        print(f"{label:<46}{value:>12}  {goal:<10}{verdict:<6}")


def _verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    anyio.run(main, parser.parse_args().calls)
