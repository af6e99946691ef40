"""Fixtures of the runtime's process tests: a store several real processes share."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agency_runtime import SqliteStore, Store, open_store


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Store]]:
    """``(url, store)``: a store that worker processes and this test share — a SQLite file,
    or a schema of the test PostgreSQL server (failing, never skipping, when there is none)."""
    if request.param == "sqlite":
        store: Store = SqliteStore(tmp_path / "runs.db")
        url = f"sqlite:///{tmp_path / 'runs.db'}"
    else:
        dsn = os.environ.get("AGENCY_TEST_POSTGRES")
        if not dsn:
            pytest.fail("no PostgreSQL server for the process tests (see tests/conftest.py)")
        schema = f"crash{os.getpid()}_{uuid.uuid4().hex[:8]}"
        url = f"{dsn}?schema={schema}"
        store = open_store(url)
    yield url, store
    store.close()
    if request.param == "postgres":
        import psycopg

        with psycopg.connect(str(dsn), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
