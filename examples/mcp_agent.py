"""An agent whose tools come from a local MCP server, durable across a pause.

    pip install 'agency-runtime[mcp]'
    python3 examples/mcp_agent.py

``agency.mcp.stdio(...)`` starts ``examples/mcp_notes_server.py`` (an MCP server written
with the official SDK) as a subprocess on the first call that lists its tools, and offers
them to the model beside a plain function. Each MCP call is a journaled step named
``tool:notes.<tool>``; ``write_note`` asks a human first (``needs_approval``), so the run
pauses there. Answering resumes it: the rounds and calls before the pause replay from the
journal, so the server's own log shows every call exactly once.

The model is ``AGENCY_MODEL`` when set, else an offline fake model that calls the tools in
a fixed order (``agency_runtime.testing.FakeModel``). The store is ``AGENCY_STORE`` when set,
else a new SQLite file in a temporary directory, removed with the notes at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import anyio

from agency_runtime import agency, approve
from agency_runtime.testing import FakeModel, FakeToolCall

HERE = Path(__file__).resolve().parent
WORK = Path(tempfile.mkdtemp())
NOTES_FILE = WORK / "notes.json"
NOTES_FILE.write_text('{"tea": "Green tea wants water at 80 C, not boiling."}')

notes = agency.mcp.stdio(
    sys.executable,
    [str(HERE / "mcp_notes_server.py")],
    env={"NOTES_FILE": str(NOTES_FILE)},
    name="notes",
    needs_approval={"write_note"},
)


def today() -> str:
    """The date of today's note (fixed, so the offline model's script fits it every day)."""
    return "2026-12-04"


MODEL = (
    os.environ.get("AGENCY_MODEL")
    or FakeModel(
        "mcp-agent",
        replies=[
            [FakeToolCall("list_notes", {}), FakeToolCall("today", {})],
            [FakeToolCall("read_note", {"title": "tea"})],
            [FakeToolCall("write_note", {"title": "2026-12-04", "text": "Tea at 80 C."})],
            "I read your tea note and saved today's summary: Tea at 80 C.",
        ],
    )
    .register()
    .model
)


async def librarian() -> str:
    """Summarise the notes into a note for today, with the notes server's tools."""
    return str(
        await agency.llm(
            "Read my notes and write a one-line summary as today's note.",
            model=MODEL,
            tools=[notes, today],
        )
    )


async def main() -> None:
    store = os.environ.get("AGENCY_STORE") or f"sqlite:///{WORK / 'mcp-agent.db'}"
    paused = await agency.run(librarian, store=store)
    print(f"run {paused.run_id}: {paused.status}")
    for asked in paused.interrupts:
        print(f"  asks: {asked.message}")
    done = await agency.respond_to_interrupts(paused, [approve()])
    print(f"run {done.run_id}: {done.status}: {done.value}")
    steps = [e.name for e in await agency.runs.journal(done.run_id, store=store)]
    print("tool steps:", ", ".join(s for s in steps if s.startswith("tool:")))


if __name__ == "__main__":
    try:
        anyio.run(main)
        log = Path(f"{NOTES_FILE}.log").read_text().splitlines()
        print("the server ran:", ", ".join(log))
    finally:
        shutil.rmtree(WORK, ignore_errors=True)  # the notes, their log and the default store
    print("Done.")
