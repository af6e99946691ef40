"""The run inspector over a store with a damaged run row (DESIGN §11.1): ``/runs`` lists it
marked damaged beside the others, its page says what is damaged (never a 500)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from agency_runtime import SqliteStore, agency
from agency_runtime._ui import create_app

BASE = "http://127.0.0.1:8765"


def adds(a: int, b: int) -> int:
    return a + b


@pytest.fixture
def damaged(tmp_path: Path) -> Iterator[TestClient]:
    """An inspector over a SQLite store with run ``good`` and run ``bad``, whose status was
    set to ``bogus`` behind the runtime's back."""
    store = SqliteStore(tmp_path / "runs.db")
    agency.run_sync(adds, 1, 2, run_id="good", store=store)
    agency.run_sync(adds, 3, 4, run_id="bad", store=store)
    with closing(sqlite3.connect(store.path)) as conn, conn:
        conn.execute("UPDATE runs SET status = 'bogus' WHERE run_id = 'bad'")
    with TestClient(create_app(store), base_url=BASE, raise_server_exceptions=False) as http:
        yield http
    store.close()


def test_the_runs_page_lists_a_damaged_run_and_the_others(damaged: TestClient) -> None:
    page = damaged.get("/runs")
    assert page.status_code == 200
    assert 'href="/run?id=good"' in page.text
    assert 'href="/run?id=bad"' in page.text
    assert '<span class="badge status-damaged">damaged</span>' in page.text
    assert "is not a run status" in page.text  # what is wrong, on the row
    assert '<span class="badge status-completed">completed</span>' in page.text
    searched = damaged.get("/runs", params={"q": "ba"})
    assert searched.status_code == 200
    assert "status-damaged" in searched.text


def test_the_page_of_a_damaged_run_says_what_is_damaged(damaged: TestClient) -> None:
    page = damaged.get("/run", params={"id": "bad"})
    assert page.status_code == 422
    assert "stored row is damaged" in page.text
    assert "status: &#39;bogus&#39; is not a run status" in page.text
    download = damaged.get("/run/download", params={"id": "bad", "what": "value"})
    assert download.status_code == 422
    assert damaged.get("/run", params={"id": "good"}).status_code == 200


def test_a_damaged_child_is_listed_damaged_on_its_parents_page(damaged: TestClient) -> None:
    store = damaged.app.state.store  # type: ignore[attr-defined]
    with closing(sqlite3.connect(store.path)) as conn, conn:
        conn.execute("UPDATE runs SET parent_id = 'good', root_id = 'good', depth = 1")
        conn.execute("UPDATE runs SET parent_id = NULL, root_id = NULL, depth = 0 "
                     "WHERE run_id = 'good'")  # fmt: skip
    page = damaged.get("/run", params={"id": "good"})
    assert page.status_code == 200
    children = page.text[page.text.index('id="children"') :]
    assert 'href="/run?id=bad"' in children
    assert '<span class="badge status-damaged">damaged</span>' in children
    assert "is not a run status" in children
