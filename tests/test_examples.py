"""Every example runs to completion as a user would start it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each example runs in a fresh interpreter

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(script: str, tmp_path: Path, store: str) -> subprocess.CompletedProcess[str]:
    """Run ``examples/<script>`` as a user would: a fresh store in ``tmp_path``, the offline
    model (``AGENCY_MODEL`` unset); it must exit 0."""
    env = {**os.environ, "AGENCY_STORE": f"sqlite:///{tmp_path}/{store}"}
    env.pop("AGENCY_MODEL", None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_quickstart_runs_on_a_fresh_sqlite_store(tmp_path: Path) -> None:
    env = {**os.environ, "AGENCY_STORE": f"sqlite:///{tmp_path}/quick.db"}
    for attempt in ("first", "second"):  # a second start on the same store works too
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "quickstart.py")],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, f"{attempt}: {done.stderr}"
        assert "from the store" in done.stdout
        assert "ConnectionError: the ticket system timed out (simulated)" in done.stdout
        assert "asks: Refund $42.00 to ada?" in done.stdout
        assert "each step ran once: {'check': 1, 'pay': 1}" in done.stdout
        assert done.stdout.rstrip().endswith("Done.")
    assert (tmp_path / "quick.db").exists()


def test_the_sub_agents_example_pauses_on_the_writer_and_finishes(tmp_path: Path) -> None:
    done = _example("sub_agents.py", tmp_path, "agents.db")
    lines = done.stdout.splitlines()
    assert lines[0].endswith(": paused")
    assert "/run#1) asks: Publish this post?" in lines[1]
    assert lines[2].endswith("is the quiet hero of the morning.")
    assert ": completed: " in lines[2]
    tree = [line.split() for line in lines[3:6]]
    assert [row[1] for row in tree] == ["completed"] * 3
    assert tree[1][0].endswith("/run#0")
    assert tree[2][0].endswith("/run#1")
    assert "the offline model was asked: {'draft': 1, 'notes': 1}" in done.stdout
    assert done.stdout.rstrip().endswith("Done.")


def test_the_mcp_agent_calls_its_local_server_once_per_call_across_a_pause(
    tmp_path: Path,
) -> None:
    done = _example("mcp_agent.py", tmp_path, "mcp.db")
    lines = done.stdout.splitlines()
    assert lines[0].endswith(": paused")
    assert "asks: The model wants to call write_note(" in lines[1]
    assert lines[2].endswith("saved today's summary: Tea at 80 C.")
    assert (
        "tool steps: tool:notes.list_notes, tool:today, tool:notes.read_note, tool:notes.write_note"
    ) in done.stdout
    assert "the server ran: list_notes, read_note tea, write_note 2026-12-04" in done.stdout
    assert done.stdout.rstrip().endswith("Done.")
