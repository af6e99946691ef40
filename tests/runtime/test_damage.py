"""A damaged row damages only itself (DESIGN §11.1): on every SQL backend, a run or schedule
row edited behind the runtime's back (an unknown status, JSON that does not parse, a time past
any date) is listed marked damaged while the other rows read as usual; opening it is one clear
StoreError saying what is wrong. (The memory store keeps validated models in the process:
nothing outside can damage them; its bounds on what is stored are in test_inputs.py.)"""

from __future__ import annotations

import math
import os
import sqlite3
from contextlib import closing
from typing import Any

import pytest

from agency_runtime import SqliteStore, StoreError, agency
from agency_runtime._store import PostgresStore, Store

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("store_backend", ["sqlite", "postgres"], indirect=True),
]


@agency.entry
def adds(a: int, b: int) -> int:
    return a + b


def damage(store: Store, table: str, key: str, value: str, **columns: Any) -> None:
    """Set ``columns`` of the row of ``table`` whose key column ``key`` is ``value``, with
    the database's own client, as anyone with access to it could."""
    sets = ", ".join(f"{name} = ?" for name in columns)
    if isinstance(store, SqliteStore):
        with closing(sqlite3.connect(store.path)) as conn, conn:
            conn.execute(f"UPDATE {table} SET {sets} WHERE {key} = ?", (*columns.values(), value))
        return
    assert isinstance(store, PostgresStore)
    import psycopg

    with psycopg.connect(os.environ["AGENCY_TEST_POSTGRES"], autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{store.schema}".{table} SET {sets.replace("?", "%s")} WHERE {key} = %s',
            (*columns.values(), value),
        )


async def two_runs(store: Store) -> None:
    assert (await agency.run(adds, 1, 2, run_id="good", store=store)).status == "completed"
    assert (await agency.run(adds, 3, 4, run_id="bad", store=store)).status == "completed"


@pytest.mark.parametrize(
    ("columns", "what"),
    [
        ({"status": "bogus"}, "status: 'bogus' is not a run status"),
        ({"status": "damaged"}, "status: 'damaged' is not a run status"),  # never stored
        ({"error": "{not json"}, "error: Invalid JSON"),
        ({"interrupts": '[{"effect": 3}]'}, "interrupts: 0.interrupt_id: Field required"),
        ({"created_at": math.inf}, "created_at: Input should be a finite number"),
        ({"finished_at": 1e308}, "finished_at: Input should be less than or equal to"),
        ({"depth": -1}, "depth: Input should be greater than or equal to 0"),
        ({"descendants_pico": -5}, "descendants_pico: Input should be greater than or equal"),
    ],
)
async def test_a_damaged_run_row_is_listed_damaged_and_the_others_read(
    store: Store, columns: dict[str, Any], what: str
) -> None:
    await two_runs(store)
    damage(store, "runs", "run_id", "bad", **columns)

    listed = {r.run_id: r for r in await agency.runs.list(store=store)}
    assert set(listed) == {"good", "bad"}
    assert listed["good"].status == "completed"
    assert listed["good"].damaged is None
    bad = listed["bad"]
    assert bad.status == "damaged"
    assert bad.damaged is not None
    assert what in bad.damaged
    assert "\n" not in bad.damaged
    assert bad.entry.endswith(":adds")  # what could be read is kept
    completed = await store.list_runs(status="completed")  # by the stored status
    assert "good" in [r.run_id for r in completed]
    assert {r.status for r in completed} <= {"completed", "damaged"}

    with pytest.raises(StoreError) as caught:
        await agency.runs.get("bad", store=store)
    message = str(caught.value)
    assert "the stored row of run 'bad' is damaged" in message
    assert what in message
    assert "\n" not in message
    assert (await agency.runs.get("good", store=store)).value == "3"


async def test_a_damaged_record_is_never_stored(store: Store) -> None:
    await two_runs(store)
    damage(store, "runs", "run_id", "bad", status="bogus")
    (bad,) = [r for r in await store.list_runs() if r.run_id == "bad"]
    with pytest.raises(StoreError, match="read damaged; it cannot be stored"):
        await store.enqueue_run(bad.model_copy(update={"run_id": "copy", "queue": "q"}))


async def test_a_damaged_schedule_is_listed_damaged_and_never_fired(store: Store) -> None:
    await agency.schedules.add("ok", adds, every=60, args=[1, 2], store=store)
    await agency.schedules.add("far", adds, every=60, args=[1, 2], store=store)
    damage(store, "schedules", "name", "far", next_at=1e308, every=1e300)

    listed = {s.name: s for s in await agency.schedules.list(store=store)}
    assert listed["ok"].damaged is None
    far = listed["far"]
    assert far.damaged is not None
    assert "next_at: Input should be less than or equal to" in far.damaged
    assert "every: Input should be less than or equal to" in far.damaged
    far.next_time  # noqa: B018 - a damaged schedule still shows a date (its placeholder)

    with pytest.raises(StoreError, match=r"the stored schedule 'far' is damaged: .*Remove it"):
        await store.get_schedule("far")
    damage(store, "schedules", "name", "far", next_at=0.0)  # due now, every still absurd
    due = await store.due_schedules(["default"], now=10**10)
    assert [s.name for s in due] == ["ok"]
    assert await store.remove_schedule("far")  # the way out of a damaged schedule
    assert [s.name for s in await agency.schedules.list(store=store)] == ["ok"]
