"""agency.llm overhead and import cost, measured side by side in one run.

    python3 bench/bench_llm.py [--calls N]

* raw: ``litellm.acompletion`` on an offline fake model registered with litellm
  (``FakeModel("bench", via_litellm=True)``), with the same messages agency.llm would send;
* agency.llm: the same model inside ``agency.run`` on a SqliteStore, so thread handling,
  billing and journaling are all included — it goes through litellm too (``via_litellm``),
  so the ratio compares like with like;
* for scale, agency.llm on the fake provider at the seam (``fake/echo``: no litellm at all);
* a fake-model run in a fresh interpreter (import, run, answer: what the demo's first
  answer waits for), and whether that run imported litellm;
* import: ``import agency_runtime, turn_kit`` in a fresh interpreter, over a bare one, and as
  a ratio to what its required dependencies cost, ``import pydantic, anyio`` over a bare one;
  and a first use, ``from agency_runtime import agency; from turn_kit import
  create_turn_runner``: the import is a shell (each public name loads its module when first
  read, as pydantic's own ``__init__`` does), so this is what a program pays, over ``import
  pydantic, anyio`` with one model defined (the five interleaved, 11 of each, bytecode cached:
  the best and the medians); ``import litellm`` for scale.

Goals: agency.llm adds at most 5 % over the raw call (issue 17; it was 10 %, issue 4); the
import adds at most 120 ms over a bare interpreter, best of 11 (issue 17; it was 250 ms), and
at most twice what ``import pydantic, anyio`` adds, medians (issue 30; it was 3.5 to 6.7 times).
That yardstick is pydantic's lazy shell: defining one model loads the rest of pydantic
(~130 ms here, more than the shell), which every package with a model class pays, so the
table also gives a first use's ratio to ``import pydantic, anyio`` with one model defined —
what this package's own code (36 deferred models, 73 dataclasses) adds beyond that, and what a
program pays whichever way the import is counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio

from agency_runtime import SqliteStore, agency
from agency_runtime._llm._litellm import load_litellm
from agency_runtime.testing import FakeModel

THROUGH_LITELLM = FakeModel("bench", via_litellm=True)  # echoes; litellm serves it
MODEL = THROUGH_LITELLM.model
SEAM_MODEL = "fake/echo"  # answered at the provider seam, without litellm
ROUNDS = 9

FIRST_ANSWER = textwrap.dedent(
    """
    import sys, anyio
    from agency_runtime import agency

    async def entry() -> str:
        return str(await agency.llm("hello"))

    async def main() -> object:
        return await agency.run(entry, store="memory://", model="fake/echo")

    result = anyio.run(main)
    assert result.value == "hello", result
    print("litellm" in sys.modules)
    """
)


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


async def agency_calls(n: int, model: str = MODEL) -> float:
    async def entry() -> int:
        for i in range(n):
            await agency.llm(f"question {i}")
        return n

    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "llm.db")
        started = time.perf_counter()
        result = await agency.run(entry, store=store, model=model)
        elapsed = time.perf_counter() - started
        store.close()
    if result.status != "completed":
        raise RuntimeError(f"the measured run did not complete: {result!r}")
    return elapsed / n


IMPORTS = {
    "bare": "pass",
    "deps": "import pydantic, anyio",
    "deps_model": "import pydantic, anyio\nclass M(pydantic.BaseModel):\n    a: int",
    "ours": "import agency_runtime, turn_kit",
    "first_use": "from agency_runtime import agency\nfrom turn_kit import create_turn_runner",
}
"""The interpreters :func:`import_samples` starts: a bare one, the required dependencies (the
yardstick of the ratio), the same with one one-field model defined (``import pydantic`` loads
a lazy shell: the first model class loads pydantic's machinery, which any package that defines
a model pays), the packages' import (a shell too: each public name loads its module when first
read), and what a program's first use of the runtime and the kit loads."""


def import_samples(statements: dict[str, str], repeat: int = 11) -> dict[str, list[float]]:
    """Seconds a fresh interpreter running each of ``statements`` takes, ``repeat`` of each.

    They are started in turn (bare, deps, ours, ..., bare, ...), so a drift in the machine's
    speed moves all alike. Bytecode is cached, as for any installed package: one unmeasured
    run of each writes it first, even where the environment says not to write it.
    """
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    for code in statements.values():
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
    samples: dict[str, list[float]] = {name: [] for name in statements}
    for _ in range(repeat):
        for name, code in statements.items():
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, env=env)
            samples[name].append(time.perf_counter() - started)
    return samples


def import_seconds(statement: str, repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", statement], check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def first_answer(repeat: int = 3) -> tuple[float, bool]:
    """Seconds from a bare interpreter to a fake-model run's answer; did it import litellm?"""
    samples, imported = [], False
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", FIRST_ANSWER],
                check=True,
                capture_output=True,
                text=True,
                cwd=tmp,
            )
            samples.append(time.perf_counter() - started)
            imported = imported or done.stdout.strip() == "True"
    return statistics.median(samples), imported


async def main(n: int) -> None:
    THROUGH_LITELLM.register()
    litellm = await load_litellm()
    await raw_calls(litellm, 20)  # warm up every path
    await agency_calls(20)
    await agency_calls(20, SEAM_MODEL)
    raws, ours, seams, ratios = [], [], [], []
    for round_ in range(ROUNDS):  # paired rounds, alternating which goes first
        if round_ % 2:
            mine_s, raw_s = await agency_calls(n), await raw_calls(litellm, n)
        else:
            raw_s, mine_s = await raw_calls(litellm, n), await agency_calls(n)
        raws.append(raw_s)
        ours.append(mine_s)
        ratios.append(mine_s / raw_s)
    for _ in range(ROUNDS):  # apart from the paired rounds, so it never disturbs them
        seams.append(await agency_calls(n, SEAM_MODEL))
    raw, mine, seam = statistics.median(raws), statistics.median(ours), statistics.median(seams)
    bare = import_seconds("pass")
    imports = import_samples(IMPORTS)
    medians = {name: statistics.median(samples) for name, samples in imports.items()}
    import_best = min(imports["ours"]) - min(imports["bare"])
    import_median = medians["ours"] - medians["bare"]
    deps_median = medians["deps"] - medians["bare"]
    import_ratio = import_median / deps_median
    model_median = medians["deps_model"] - medians["bare"]
    first_use_median = medians["first_use"] - medians["bare"]
    model_ratio = first_use_median / model_median
    heavy = import_seconds("import litellm", repeat=1)
    first, first_imported = first_answer()
    overhead = statistics.median(ratios) - 1
    rows = [
        ("raw litellm.acompletion (fake via litellm)", f"{raw * 1e3:.2f} ms", "", ""),
        ("agency.llm in a run (journaled, via litellm)", f"{mine * 1e3:.2f} ms", "", ""),
        (
            "agency.llm overhead (median of paired rounds)",
            f"{overhead:+.1%}",
            "<= 5%",
            _verdict(overhead <= 0.05),
        ),
        (
            "agency.llm on the fake provider at the seam (no litellm)",
            f"{seam * 1e3:.2f} ms",
            "",
            "",
        ),
        (
            "fresh process: fake-model run answered (over bare)",
            f"{(first - bare) * 1e3:.0f} ms",
            "no litellm",
            _verdict(not first_imported),
        ),
        (
            "import agency_runtime, turn_kit (over bare, best of 11)",
            f"{import_best * 1e3:.0f} ms",
            "<= 120 ms",
            _verdict(import_best <= 0.120),
        ),
        (
            "import agency_runtime, turn_kit (over bare, median)",
            f"{import_median * 1e3:.0f} ms",
            "",
            "",
        ),
        ("import pydantic, anyio (over bare, median)", f"{deps_median * 1e3:.0f} ms", "", ""),
        (
            "import agency_runtime, turn_kit / import pydantic, anyio",
            f"{import_ratio:.2f}x",
            "<= 2x",
            _verdict(import_ratio <= 2),
        ),
        (
            "import pydantic, anyio + one BaseModel defined (over bare, median)",
            f"{model_median * 1e3:.0f} ms",
            "",
            "",
        ),
        (
            "first use: from agency_runtime import agency; from turn_kit import "
            "create_turn_runner (over bare, median)",
            f"{first_use_median * 1e3:.0f} ms",
            "",
            "",
        ),
        (
            "first use / import pydantic, anyio + one model",
            f"{model_ratio:.2f}x",
            "<= 2x",
            _verdict(model_ratio <= 2),
        ),
        ("import litellm (over bare), for scale", f"{(heavy - bare) * 1e3:.0f} ms", "", ""),
    ]
    width = max(len(row[0]) for row in rows) + 2
    print(f"{'measure':<{width}}{'value':>12}  {'goal':<11}{'result':<6}")
    for label, value, goal, verdict in rows:
        print(f"{label:<{width}}{value:>12}  {goal:<11}{verdict:<6}")


def _verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    anyio.run(main, parser.parse_args().calls)
