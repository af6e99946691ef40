"""Big runs in the inspector: the journal is read a page at a time, never whole.

A 100,000-step run's pages each come from one paged read of the store (the test forbids the
whole-journal read), load in well under a second, and load side by side; an LLM call whose
rounds straddle a page boundary is shown whole on one page and not again on the next.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.testclient import TestClient

from agency_runtime import ResumableScope, SqliteStore, agency
from agency_runtime._store._rows import STEP_COLUMNS
from agency_runtime._ui import create_app
from agency_runtime.testing import FakeModel, FakeToolCall

# One xdist worker builds the 100,000-step store file (~1.5 s of CPU) for the module's three
# tests that read it, rather than each worker that got one of them.
pytestmark = pytest.mark.xdist_group("big_runs")

BASE = "http://127.0.0.1:8765"
BIG = 100_000
PAGE_SECONDS = 1.0


@agency.entry
async def ticks(n: int) -> int:
    async def body(s: ResumableScope) -> int:
        for index in range(n):
            await s.step(lambda i=index: i, name="tick")  # type: ignore[misc]
        return n

    return await agency.with_resumable_scope("loop", body)


def forecast(city: str) -> str:
    """Tomorrow's weather.

    Args:
        city: The city.
    """
    return f"sunny in {city}"


@agency.entry
async def ticks_then_tools(n: int) -> str:
    await ticks(n)
    return str(await agency.llm("weather in Oslo?", model="fake/pager", tools=[forecast]))


@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store file holding run ``big``: 100,000 steps (two journaled, the rest copies of the
    second row written straight into the file, which is what the inspector reads)."""
    path = tmp_path_factory.mktemp("big") / "big.db"
    store = SqliteStore(path)
    try:
        assert agency.run_sync(ticks, 2, run_id="big", store=store).status == "completed"
    finally:
        store.close()
    columns = ", ".join(STEP_COLUMNS)
    with sqlite3.connect(path) as conn:
        stored = conn.execute(f"SELECT {columns} FROM steps WHERE run_id = 'big' ORDER BY seq")
        row = dict(zip(STEP_COLUMNS, stored.fetchall()[-1], strict=True))
        first = int(row["seq"]) + 1
        rows = [
            tuple({**row, "seq": seq, "path": f"loop/{seq}"}[c] for c in STEP_COLUMNS)
            for seq in range(first, first + BIG - 2)
        ]
        marks = ", ".join("?" for _ in STEP_COLUMNS)
        conn.executemany(f"INSERT INTO steps ({columns}) VALUES ({marks})", rows)
    return path


@pytest.fixture
def big(big_db: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SqliteStore]:
    """The big run's store, which refuses to read a whole journal."""
    store = SqliteStore(big_db)

    async def whole(run_id: str) -> Any:
        raise AssertionError(f"the inspector read the whole journal of {run_id!r}")

    monkeypatch.setattr(store, "load_journal", whole)
    yield store
    store.close()


def _items(text: str) -> int:
    return text.count('<li class="item')


def test_each_page_of_a_100k_step_run_is_one_paged_read_well_under_a_second(
    big: SqliteStore,
) -> None:
    store = big
    with TestClient(create_app(store), base_url=BASE) as http:
        for page, first, last in ((1, "loop/0", "loop/199"), (250, None, None), (500, None, None)):
            took = []
            for _ in range(2):  # the better of two: one hiccup of a busy machine is not a page
                started = time.perf_counter()
                shown = http.get("/run", params={"id": "big", "page": page})
                took.append(time.perf_counter() - started)
            assert shown.status_code == 200
            assert min(took) < PAGE_SECONDS, (page, took)
            assert f"page {page} of 500" in shown.text
            assert f"{BIG} journaled steps" in shown.text
            assert _items(shown.text) == 200
            if first is not None:
                assert first in shown.text
                assert last in shown.text
        beyond = http.get("/run", params={"id": "big", "page": 9999})  # clamped to the last
        assert "page 500 of 500" in beyond.text


@pytest.mark.anyio
async def test_pages_of_a_big_run_load_side_by_side(big: SqliteStore) -> None:
    app = create_app(big)
    transport = httpx.ASGITransport(app=app)
    done: dict[str, int] = {}
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:

        async def load(name: str, url: str, params: dict[str, Any]) -> None:
            done[name] = (await client.get(url, params=params)).status_code

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(load, "first", "/run", {"id": "big", "page": 1})
                group.start_soon(load, "middle", "/run", {"id": "big", "page": 250})
                group.start_soon(load, "static", "/static/app.css", {})
                group.start_soon(load, "list", "/runs", {})
    assert done == {"first": 200, "middle": 200, "static": 200, "list": 200}


def test_an_llm_call_across_a_page_boundary_is_shown_whole_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "tools.db")
    replies: list[Any] = [FakeToolCall("forecast", {"city": "Oslo"}), "Sunny in Oslo."]
    with FakeModel("pager", replies=replies):
        done = agency.run_sync(ticks_then_tools, 198, run_id="tools", store=store)
    assert done.status == "completed"
    entries = anyio.run(lambda: agency.runs.journal("tools", store=store))
    names = [e.name for e in entries]
    call = names.index("agency.llm")
    first_round = names.index("agency.llm:round")
    assert first_round < 200 <= call  # the call's rounds start on page 1, the call on page 2
    with TestClient(create_app(store), base_url=BASE) as http:
        one = http.get("/run", params={"id": "tools", "page": 1}).text
        two = http.get("/run", params={"id": "tools", "page": 2}).text
    call_path = entries[call].path
    assert f'title="journal path">{call_path}</span>' in one  # the call, whole, on page 1
    assert "sunny in Oslo" in one  # with its tool's result under it
    assert f'title="journal path">{call_path}</span>' not in two  # and not again
    assert "sunny in Oslo" not in two
    store.close()
