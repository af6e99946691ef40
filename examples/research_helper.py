"""A research helper under a cost guard that asks for more budget through an interrupt.

Run it with::

    python3 examples/research_helper.py "Why is the sky blue?"

``research`` plans a few sub-questions, answers each with ``agency.llm`` and writes a
summary, all under ``agency.cost_guard(BUDGET)``. The offline model is priced high enough
that the third call crosses the budget: the call raises a ``std::guard`` interrupt and the
run pauses. The script prints the interrupt, answers it itself with
``approve({"max_cost": 0.01})`` (through ``agency.respond_to_interrupts``) and the run
completes without calling the model again for the answers it already has; then it prints
the cost. With ``--ask`` it prints the command that answers it instead, and exits::

    python3 examples/research_helper.py --ask "Why is the sky blue?"
    python3 -m agency_runtime runs respond RUN_ID --approve '{"max_cost": 0.01}'

The store is ``AGENCY_STORE`` when set, else ``sqlite:///./.agency/agency.db``. The model is
``AGENCY_MODEL`` when set (any litellm model, with its provider's key), else an offline fake
model (registered when this module is imported, so the process that answers the interrupt
has it too). ``research`` is declared with ``@agency.entry``, so that process may run it: the
store is data, never code, and only declared entries continue.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

import anyio

from agency_runtime import DEFAULT_STORE_URL, RunResult, agency, approve
from agency_runtime.testing import FakeModel, FakeRequest

BUDGET = 0.003  # US dollars: two offline calls fit, the third crosses it
EXTRA_BUDGET = {"max_cost": 0.01}


def offline_researcher(request: FakeRequest) -> str:
    """The offline stand-in for a model: plans, answers and summarizes by keywords."""
    prompt = str(request.messages[-1]["content"])
    if prompt.startswith("Plan"):
        return json.dumps(["What causes it?", "How is it measured?", "What is still unknown?"])
    if prompt.startswith("Summarize"):
        return "In short: three findings, each backed by a source; one question stays open."
    return f"A short finding about: {prompt.rsplit(':', 1)[-1].strip()}"


# Priced like a large model ($20 / $40 per million tokens), so the budget runs out quickly.
OFFLINE_MODEL = FakeModel(
    "researcher",
    function=offline_researcher,
    input_cost_per_token=2e-5,
    output_cost_per_token=4e-5,
).register()
MODEL = os.environ.get("AGENCY_MODEL") or OFFLINE_MODEL.model


@agency.entry
async def research(question: str) -> str:
    """Plan sub-questions, answer each, summarize: every call billed to one cost guard."""
    agency.thread.system("You are a careful research assistant. Be brief.")
    async with agency.cost_guard(BUDGET, label="research"):
        plan = await agency.llm(
            f"Plan three sub-questions (a JSON list of strings) for: {question}",
            schema=list[str],
        )
        findings = []
        for sub in plan[:3]:
            findings.append(await agency.llm(f"Answer in one sentence. {question}: {sub}"))
        summary = await agency.llm("Summarize the findings above in two sentences.")
    lines = "\n".join(f"  - {finding}" for finding in findings)
    return f"{question}\n{lines}\n  = {summary}"


def _report(result: RunResult) -> None:
    print(f"run {result.run_id}: {result.status} (${result.cost:.6f}, {result.tokens} tokens)")


async def _main(question: str, ask: bool, store: str) -> int:
    run_id = f"research-{uuid.uuid4().hex[:8]}"
    print(f"research helper — store {store}, model {MODEL}, budget ${BUDGET}\n")
    result = await agency.run(research, question, run_id=run_id, store=store, model=MODEL)
    _report(result)
    if result.status == "paused":
        for question_asked in result.interrupts:
            print(f"  interrupt {question_asked.effect}: {question_asked.message}")
            print(f"  data: {json.dumps(question_asked.data)}")
        if ask:
            print("\nanswer it with:")
            print(
                f"  python3 -m agency_runtime runs respond {run_id} "
                f"--approve '{json.dumps(EXTRA_BUDGET)}'"
            )
            return 0
        print(f"\napproving {json.dumps(EXTRA_BUDGET)} more budget")
        answers = [approve(EXTRA_BUDGET) for _ in result.interrupts]
        result = await agency.respond_to_interrupts(result, answers, store=store)
        _report(result)
    if not result.ok:
        error = result.error
        print(f"failed: {error.type}: {error.message}" if error else "did not complete")
        return 1
    print(f"\n{result.value}\n\ncost: ${result.cost:.6f} ({result.tokens} tokens)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the research helper; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="research_helper.py", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("question", nargs="?", default="Why is the sky blue?")
    parser.add_argument("--ask", action="store_true", help="print the CLI answer and exit")
    parser.add_argument("--store", default=os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL)
    options = parser.parse_args(argv)
    return anyio.run(_main, options.question, options.ask, options.store)


if __name__ == "__main__":
    sys.exit(main())
