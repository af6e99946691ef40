"""The main job: ``agency demo`` runs offline, end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from agency_runtime import demo


def test_the_demo_runs_offline_and_says_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--store", f"sqlite:///{tmp_path}/demo.db"]) == 0
    out = capsys.readouterr().out
    assert "bot  ◂ Nice to meet you, Ada! I'll remember that." in out
    assert "bot  ◂ You're Ada." in out  # remembered through conversation memory
    assert "3 replies in all, not 4" in out  # the redelivered update got no second reply
    assert "journal: check → pay" in out
    assert out.rstrip().endswith("Done.")
