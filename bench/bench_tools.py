"""The tool loop's overhead per round, over a raw litellm tool round trip, side by side.

    python3 bench/bench_tools.py [--rounds N]

A fake model (offline) calls one tool per round for ``N`` rounds, then answers; it decides
from the conversation (how many tool results it has seen), as a real model would.

* raw: ``litellm.acompletion(model, messages, tools=[...])`` through litellm's real code
  (``FakeModel(..., via_litellm=True)``), then the tool called by hand and the assistant's
  call and the tool's result appended to the messages: one round trip per round;
* agency.llm(tools=[...]) inside ``agency.run`` on a SqliteStore, through litellm too (so
  the ratio compares like with like): each round's answer and each tool run journaled, the
  thread kept, the spend billed;
* for scale, the same on the fake provider at the seam (no litellm at all).

Time per round, medians of 5 repetitions, raw and agency interleaved so drift hits both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from agency_runtime import SqliteStore, agency
from agency_runtime._llm._litellm import load_litellm
from agency_runtime.testing import FakeModel, FakeRequest, FakeToolCall

ROUNDS = 50
REPEAT = 5


def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


SPEC = agency.tool(lookup).spec.to_openai()


def planner(rounds: int) -> Any:
    def next_move(request: FakeRequest) -> Any:
        done = sum(1 for m in request.messages if m.get("role") == "tool")
        return "done" if done >= rounds else FakeToolCall("lookup", {"key": f"k{done}"})

    return next_move


async def raw_rounds(litellm: Any, model: str, rounds: int) -> float:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look things up"}]
    start = time.perf_counter()
    while True:
        response = await litellm.acompletion(
            model=model, messages=messages, tools=[SPEC], timeout=60, num_retries=0
        )
        message = response.choices[0].message
        calls = message.tool_calls or []
        if not calls:
            break
        messages.append(
            {
                "role": "assistant",
                "content": message.content or "",
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in calls
                ],
            }
        )
        for call in calls:
            result = lookup(**json.loads(call.function.arguments))
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": "lookup", "content": result}
            )
    return (time.perf_counter() - start) / rounds


async def agency_rounds(store: SqliteStore, model: str, rounds: int) -> float:
    async def entry() -> str:
        return str(
            await agency.llm("look things up", model=model, tools=[lookup], max_tool_rounds=rounds)
        )

    start = time.perf_counter()
    result = await agency.run(entry, store=store)
    elapsed = time.perf_counter() - start
    if result.value != "done":
        raise RuntimeError(f"unexpected outcome: {result!r}")
    return elapsed / rounds


async def main(rounds: int) -> None:
    litellm = await load_litellm()
    via = FakeModel("bench-tools-litellm", function=planner(rounds), via_litellm=True).register()
    seam = FakeModel("bench-tools-seam", function=planner(rounds)).register()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        await raw_rounds(litellm, via.model, rounds)  # warm both paths up
        await agency_rounds(store, via.model, rounds)
        raws, ours, seams = [], [], []
        for _ in range(REPEAT):
            raws.append(await raw_rounds(litellm, via.model, rounds))
            ours.append(await agency_rounds(store, via.model, rounds))
            seams.append(await agency_rounds(store, seam.model, rounds))
        store.close()
    raw, our, at_seam = (statistics.median(v) for v in (raws, ours, seams))
    rows = [
        ("raw litellm tool round trip (fake via litellm)", f"{raw * 1e3:.2f} ms", ""),
        (
            "agency.llm(tools=) per round, journaled on SQLite, via litellm",
            f"{our * 1e3:.2f} ms",
            f"{our / raw:.2f}x raw (+{(our - raw) * 1e3:.2f} ms)",
        ),
        ("the same at the provider seam (no litellm)", f"{at_seam * 1e3:.2f} ms", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{rounds} rounds of one tool call each, medians of {REPEAT}")
    for label, value, ratio in rows:
        print(f"{label.ljust(width)}  {value:>9}  {ratio}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    ns = parser.parse_args()
    anyio.run(main, ns.rounds)
    sys.exit(0)
