"""Sub-agents: a coordinator that asks a researcher and a writer, each a durable child run.

    python3 examples/sub_agents.py

``coordinator`` calls ``agency.run(researcher, topic)`` and ``agency.run(writer, notes)``
inside its own run: each is a **child run** in the coordinator's store, with its own journal
and record (``parent_id``, ``depth``), and its call is journaled in the coordinator, so a
replay returns the child's outcome without running it again. The writer asks a human before
it publishes (``agency.interrupt``): nobody in the coordinator decides that question, so the
coordinator pauses too, reporting the writer's question. Answering it
(``agency.respond_to_interrupts`` on the coordinator) stores the answer in the writer's run,
continues the writer, then the coordinator: the researcher does not run again.

The store is ``AGENCY_STORE`` when set, else a new SQLite file in a temporary directory. The
model is ``AGENCY_MODEL`` when set, else an offline fake model (``agency_runtime.testing``).
The cost of each run is its own spend plus its children's: the tree printed at the end shows
both.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import anyio

from agency_runtime import RunResult, agency, approve
from agency_runtime.testing import FakeModel, FakeRequest

ASKED: dict[str, int] = {}
"""How many times the offline model was asked for notes and for a draft (once each: a
resumed run replays its recorded calls instead of asking again)."""


def offline_model(request: FakeRequest) -> str:
    """The offline stand-in for a real model: notes for a researcher, a draft for a writer."""
    prompt = str(request.messages[-1]["content"])
    kind = "notes" if prompt.startswith("Research") else "draft"
    ASKED[kind] = ASKED.get(kind, 0) + 1
    if kind == "notes":
        return "three facts: it grows on hills; it is picked by hand; it is dried in the sun"
    return "Tea, hand-picked on sunny hills, is the quiet hero of the morning."


MODEL = (
    os.environ.get("AGENCY_MODEL")
    or FakeModel("sub-agents", function=offline_model).register().model
)


async def researcher(topic: str) -> str:
    """Gather notes on ``topic``."""
    return await agency.llm(f"Research {topic} in one line.", model=MODEL)


async def writer(notes: str) -> str:
    """Write a one-line post from ``notes``, and ask a human before publishing it."""
    draft = await agency.llm(f"Write one line from these notes: {notes}", model=MODEL)
    answer = await agency.interrupt("std::approve", f"Publish this post? {draft!r}")
    return draft if answer.type == "approve" else f"(not published) {draft}"


async def coordinator(topic: str) -> str:
    """Ask the researcher, then the writer; both are child runs of this run."""
    notes: RunResult[str] = await agency.run(researcher, topic)
    post: RunResult[str] = await agency.run(writer, notes.unwrap())
    return post.unwrap()


async def main() -> None:
    store = os.environ.get("AGENCY_STORE") or (
        f"sqlite:///{Path(tempfile.mkdtemp()) / 'sub-agents.db'}"
    )
    paused = await agency.run(coordinator, "tea", store=store)
    print(f"coordinator {paused.run_id}: {paused.status}")
    for asked in paused.interrupts:
        print(f"  the writer ({asked.run_id}) asks: {asked.message}")
    done = await agency.respond_to_interrupts(paused, [approve()])
    print(f"coordinator {done.run_id}: {done.status}: {done.value}")
    for run in await agency.runs.tree(done.run_id, store=store):
        print(
            f"  {'  ' * run.depth}{run.run_id}  {run.status}  "
            f"cost ${run.cost:.6f} (own ${run.own_cost:.6f})"
        )
    if ASKED:
        print(f"the offline model was asked: {dict(sorted(ASKED.items()))}")
    print("Done.")


if __name__ == "__main__":
    anyio.run(main)
