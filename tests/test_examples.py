"""Every example runs to completion as a user would start it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


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
