"""``agency demo``: the main job, offline in one command.

1. The demo parts other packages register under the entry-point group
   ``agency_runtime.demos`` (this distribution's turn_kit registers a Telegram assistant:
   turn_kit + ``agency.llm`` + conversation memory + a context provider answer a scripted
   conversation through a Bot API served on loopback; a redelivered update gets no second
   reply). The runtime never imports them by name: they plug in.
2. A refund workflow of journaled steps pauses for a human's approval, is answered, and
   completes without running its completed steps again.
3. A summary: cost, tokens, timings, the store — and a second refund run left paused, with
   the exact command that answers it from a shell.

It can run any number of times in one directory: each session has its own conversation
namespace, so the runs of an earlier session are kept, never replayed.

The model is ``AGENCY_MODEL`` when set (with its provider's key), else an offline fake model;
the store is ``--store`` / ``AGENCY_STORE``, else ``sqlite:///./.agency/agency.db``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
import uuid
from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from typing import Any

import anyio

from ._facade import agency
from ._interrupts import approve
from ._llm._litellm import add_import_notice
from ._scope import ResumableScope
from ._store import DEFAULT_STORE_URL

__all__ = ["DEMOS_GROUP", "DemoPart", "demo_parts", "main"]

DEMOS_GROUP = "agency_runtime.demos"
"""The entry-point group demo parts are registered under."""

DemoPart = Callable[[str, str | None, str], Awaitable[bool]]
"""A demo part: ``await part(store_url, model_or_None, session)`` prints its story and says
whether all went as it should; the first line of its docstring is its heading."""


def demo_parts() -> list[tuple[str, DemoPart]]:
    """The registered demo parts, by entry-point name."""
    parts: list[tuple[str, DemoPart]] = []
    for point in sorted(entry_points(group=DEMOS_GROUP), key=lambda p: p.name):
        parts.append((point.name, point.load()))
    return parts


STEP_RUNS: dict[str, int] = {}


@agency.entry
async def _refund_workflow(customer: str, amount: float) -> dict[str, Any]:
    async def body(s: ResumableScope) -> dict[str, Any]:
        def check() -> dict[str, Any]:
            STEP_RUNS["check"] = STEP_RUNS.get("check", 0) + 1
            return {"eligible": amount <= 100}

        verdict = await s.step(check, name="check")
        answer = await agency.interrupt(
            "approve_refund", f"Refund ${amount:.2f} to {customer}?", data=verdict
        )

        def pay() -> dict[str, Any]:
            STEP_RUNS["pay"] = STEP_RUNS.get("pay", 0) + 1
            agency.add_cost(0.0008)
            return {"refunded": amount if answer.approved else 0.0, "by": answer.value}

        return await s.step(pay, name="pay")

    return await agency.with_resumable_scope("refund", body)


async def _workflow_part(store: str, session: str) -> float:
    run_id = f"demo-refund-{session}"
    paused = await agency.run(_refund_workflow, "ada", 42.0, run_id=run_id, store=store)
    print(f"  {run_id}: {paused.status}, asks “{paused.interrupts[0].message}”")
    done = await agency.respond_to_interrupts(run_id, [approve("Sam")], store=store)
    print(f"  answered by a human (agency.respond_to_interrupts) → {done.status}: {done.value}")
    journal = await agency.runs.journal(run_id, store=store)
    print(f"  journal: {' → '.join(entry.name for entry in journal)}; step runs: {STEP_RUNS}")
    return done.cost


async def _leave_one_paused(store: str, session: str) -> str:
    """A second refund run, left paused: the reader answers it from a shell."""
    run_id = f"demo-refund-{session}-yours"
    await agency.run(_refund_workflow, "grace", 17.5, run_id=run_id, store=store)
    return run_id


async def _main(store: str) -> int:
    model = os.environ.get("AGENCY_MODEL") or None
    if model and not model.startswith("fake/"):
        agency.preload()  # a real model goes through litellm: import it while we set up
    session = uuid.uuid4().hex[:6]
    started = time.perf_counter()
    print(f"agency demo — store {store}, model {model or 'offline fake model'}\n")
    add_import_notice(lambda notice: print(f"  ({notice})", flush=True))
    ok = True
    number = 0
    for number, (_name, part) in enumerate(demo_parts(), 1):
        heading = (part.__doc__ or "").strip().splitlines()[0] if part.__doc__ else _name
        print(f"{number}. {heading}")
        ok = await part(store, model, session) and ok
        print()
    print(f"{number + 1}. A refund workflow that pauses for a human:")
    cost = await _workflow_part(store, session)
    yours = await _leave_one_paused(store, session)
    runs = await agency.runs.list(store=store, limit=1000)
    spent = sum(r.cost_pico for r in runs) / 10**12
    tokens = sum(r.tokens for r in runs)
    elapsed = time.perf_counter() - started
    print(
        f"\n{number + 2}. Summary: {len(runs)} runs in the store, ${spent:.6f} and {tokens} "
        f"tokens spent (the workflow: ${cost:.6f}), {elapsed:.1f} s."
    )
    where = "" if store == DEFAULT_STORE_URL else f" --store {shlex.quote(store)}"
    print(f"   Look at them: python3 -m agency_runtime runs list{where}")
    print(f"   One refund waits for you ({yours}); answer it from a shell:")
    print(f"     python3 -m agency_runtime runs respond {yours} --approve{where}")
    ok = ok and STEP_RUNS == {"check": 2, "pay": 1}
    print("\nDone." if ok else "\nSomething went wrong.")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="agency demo", description=__doc__.splitlines()[0])
    parser.add_argument("--store", default=os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL)
    options = parser.parse_args(argv)
    return anyio.run(_main, options.store)
