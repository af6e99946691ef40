"""The SQLite store's numbered migrations: an old file opens and keeps its meaning."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agency_runtime import SqliteStore, StoreSchemaError, agency
from agency_runtime._store._migrations import MIGRATIONS, SCHEMA_VERSION

pytestmark = pytest.mark.anyio

PICO = 10**12


def _version_1_file(path: Path) -> None:
    """A file as version 1 wrote it: steps held the run's running total."""
    conn = sqlite3.connect(path)
    for statement in dict(MIGRATIONS)[1].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO runs (run_id, status, entry, arguments, cost_pico, tokens, created_at, "
        "updated_at) VALUES ('old', 'paused', 'm:f', '{\"args\":[],\"kwargs\":{}}', ?, 9, 1, 1)",
        (7 * PICO,),
    )
    # Totals 1, 3, 3 then 2 (a sibling's commit with an older total): deltas 1, 2, 0, 0.
    for seq, (path_, total) in enumerate([("s/0", 1), ("s/1", 3), ("s/2", 3), ("s/3", 2)], 1):
        conn.execute(
            "INSERT INTO steps (run_id, path, seq, name, callsite, result, cost_pico, tokens, "
            "created_at) VALUES ('old', ?, ?, 'n', '', '1', ?, ?, 1)",
            (path_, seq, total * PICO, total),
        )
    conn.commit()
    conn.close()


async def test_a_version_1_file_migrates_to_steps_own_spend(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _version_1_file(path)
    store = SqliteStore(path)
    try:
        entries = (await store.load_journal("old")).entries
        assert [(e.path, e.cost_pico // PICO, e.tokens) for e in entries] == [
            ("s/0", 1, 1),
            ("s/1", 2, 2),
            ("s/2", 0, 0),
            ("s/3", 0, 0),
        ]
        record = await agency.runs.get("old", store=store)
        # The run had spent $7 in all: $3 in its steps, the rest outside them.
        assert record.unjournaled_pico == 4 * PICO
        assert record.unjournaled_tokens == 6
        assert sum(e.cost_pico for e in entries) + record.unjournaled_pico == record.cost_pico
    finally:
        store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute(
        "SELECT name FROM sqlite_master WHERE name = 'runs_by_status'"
    ).fetchone() == ("runs_by_status",)
    # Version 5 rebuilt the steps in their key's order, keeping every row (read above).
    (steps_sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'steps'").fetchone()
    assert "WITHOUT ROWID" in steps_sql
    assert "steps_5" not in steps_sql
    conn.close()


def _file_at(path: Path, version: int) -> None:
    """A file as ``version`` wrote it (its migrations run by hand), with a finished run."""
    conn = sqlite3.connect(path)
    for _number, script in MIGRATIONS[:version]:
        for statement in script.split(";"):
            if statement.strip():
                conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {version}")
    conn.execute(
        "INSERT INTO runs (run_id, status, entry, arguments, cost_pico, tokens, created_at, "
        "updated_at) VALUES ('old', 'completed', 'm:f', '{\"args\":[],\"kwargs\":{}}', ?, 9, "
        "1, 1)",
        (2 * PICO,),
    )
    conn.commit()
    conn.close()


async def test_a_version_5_file_migrates_its_runs_to_top_level_runs(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    _file_at(path, 5)
    store = SqliteStore(path)
    try:
        old = await agency.runs.get("old", store=store)
        assert (old.parent_id, old.root_id, old.depth, old.descendants_pico) == (None, None, 0, 0)
        assert old.own_cost_pico == old.cost_pico == 2 * PICO
        assert await store.list_runs(parent="old") == []
    finally:
        store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE parent_id = 'old' "
        "ORDER BY created_at DESC, rowid DESC"
    ).fetchall()
    assert any("runs_by_parent" in str(row) for row in plan), plan  # by index, not a scan
    conn.close()


def test_migrations_are_numbered_one_by_one() -> None:
    assert [number for number, _ in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


def test_a_file_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreSchemaError, match=f"schema version {SCHEMA_VERSION + 1}"):
        SqliteStore(path)
