"""Promises a durable runtime lives on, off the straight path (DESIGN §10.2).

Failures are results; spend is counted once; the journal's determinism check covers what
users write (lambdas); what cannot be stored faithfully is refused when it is stored; a
failed LLM call is journaled like an answer; a store that vanished or a holder that died is
noticed; malformed input gets a clear error, never a traceback from deep inside.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from agency_runtime import (
    InterruptAnswerError,
    InvalidArgumentError,
    JournalCorruptError,
    MemoryStore,
    NondeterminismError,
    ResumableScope,
    SqliteStore,
    StepResultError,
    StoreError,
    StoreUnavailableError,
    StructuredOutputError,
    agency,
    approve,
    open_store,
)
from agency_runtime._scope import step_name
from agency_runtime.testing import FakeModel

pytestmark = pytest.mark.anyio


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    """For the tests that edit the database file itself (``store`` is every backend)."""
    made = SqliteStore(tmp_path / "trust.db")
    yield made
    made.close()


# -- failures are results --------------------------------------------------------------------


class Order(BaseModel):
    id: int
    total: float


async def test_a_value_that_does_not_fit_the_return_annotation_fails_the_run(store: Any) -> None:
    async def entry() -> Order:
        return {"id": "not a number", "total": 1.0}  # type: ignore[return-value]

    result = await agency.run(entry, run_id="shape", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "EntryResultError"
    assert "id" in result.error.message
    record = await agency.runs.get("shape", store=store)
    assert record.status == "failed"
    assert record.lease_owner is None  # released
    assert record.value is None


async def test_a_cancelled_caller_leaves_no_run_running(store: Any) -> None:
    async def entry() -> None:
        await anyio.sleep_forever()

    with anyio.move_on_after(0.05):
        await agency.run(entry, run_id="abandoned", store=store)
    record = await agency.runs.get("abandoned", store=store)
    assert record.status == "failed"
    assert record.lease_owner is None
    assert record.error is not None
    assert "interrupted" in record.error.message


# -- spend is counted once -------------------------------------------------------------------


async def test_a_step_records_its_own_spend_not_the_runs_total(store: Any) -> None:
    async def entry() -> None:
        agency.add_cost(0.5)  # outside any step

        async def body(s: ResumableScope) -> None:
            await s.step(lambda: agency.add_cost(1.0), name="one")
            await s.step(lambda: agency.add_cost(2.0), name="two")

        await agency.with_resumable_scope("spend", body)

    result = await agency.run(entry, run_id="spend", store=store)
    assert result.cost == 3.5
    steps = await agency.runs.journal("spend", store=store)
    assert [(e.path, e.cost_pico) for e in steps] == [
        ("spend/0", 10**12),
        ("spend/1", 2 * 10**12),
    ]
    record = await agency.runs.get("spend", store=store)
    assert record.unjournaled_pico == 5 * 10**11  # the root spend, held by no step


async def test_an_llm_call_inside_a_step_is_billed_once(store: Any) -> None:
    attempts = {"n": 0}

    async def entry() -> str:
        attempts["n"] += 1

        async def body(s: ResumableScope) -> str:
            async def ask() -> str:
                reply = str(await agency.llm("hello there"))
                if attempts["n"] == 1:
                    raise RuntimeError("the step fails after its LLM call was journaled")
                return reply

            return str(await s.step(ask, name="ask"))

        return await agency.with_resumable_scope("nested", body)

    with FakeModel("once", replies=["hi"]) as fake:
        first = await agency.run(entry, run_id="nested", store=store, model=fake.model)
        assert first.status == "failed"
        second = await agency.run(entry, run_id="nested", store=store, model=fake.model)
    assert second.status == "completed"
    assert len(fake.calls) == 1
    assert second.cost == first.cost > 0  # the replayed call costs nothing more


async def test_a_fork_of_a_completed_run_reports_only_what_it_ran(store: Any) -> None:
    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            for index in range(3):
                await s.step(lambda: agency.add_cost(1.0), name=f"step-{index}")

        await agency.with_resumable_scope("fork", body)

    agency.register_entry(entry)
    assert (await agency.run(entry, run_id="source", store=store)).cost == 3.0
    fork_id = await agency.runs.fork("source", "fork/0", new_run_id="forked", store=store)
    assert (await agency.runs.get(fork_id, store=store)).cost_pico == 10**12
    resumed = await agency.resume(fork_id, store=store)
    assert resumed.status == "completed"
    assert resumed.cost == 3.0  # the kept step once, the two re-run steps once each


# -- determinism covers what users write -------------------------------------------------------


def reserve(item: str) -> str:
    return f"reserved {item}"


def charge(item: str) -> str:
    return f"charged {item}"


def test_a_lambdas_default_name_says_what_it_calls() -> None:
    item = "tea"
    assert step_name(lambda: reserve(item)).endswith("<lambda:reserve>")
    assert step_name(lambda: agency.llm(item)).endswith("<lambda:agency.llm>")
    assert step_name(lambda: item.upper()).endswith("<lambda:upper>")

    def local_helper() -> int:
        return 1

    assert step_name(lambda: local_helper()).endswith("<lambda:local_helper>")
    assert step_name(lambda: 42).endswith("<lambda>")


async def test_swapping_what_an_unnamed_lambda_calls_fails_the_determinism_check(
    store: Any,
) -> None:
    swapped = {"now": False}

    async def entry(item: str) -> str:
        async def body(s: ResumableScope) -> str:
            if swapped["now"]:
                first = await s.step(lambda: charge(item))
            else:
                first = await s.step(lambda: reserve(item))
            await agency.interrupt("approve", "go on?")
            return str(first)

        return await agency.with_resumable_scope("order", body)

    paused = await agency.run(entry, "tea", run_id="swap", store=store)
    assert paused.status == "paused"
    swapped["now"] = True  # a deploy changed the code under the in-flight run
    done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.status == "failed"
    assert isinstance(done.exception, NondeterminismError)
    assert "<lambda:reserve>" in str(done.exception)
    assert "<lambda:charge>" in str(done.exception)


async def test_a_journal_of_unnamed_lambdas_from_before_still_replays(sqlite_store: Any) -> None:
    """Runs in flight across the upgrade recorded lambdas as ``…<lambda>``."""
    calls = {"n": 0}

    def count() -> int:
        calls["n"] += 1
        return calls["n"]

    async def entry() -> int:
        async def body(s: ResumableScope) -> int:
            value = int(await s.step(lambda: count()))
            await agency.interrupt("approve", "go on?")
            return value

        return await agency.with_resumable_scope("legacy", body)

    await agency.run(entry, run_id="legacy", store=sqlite_store)
    conn = sqlite3.connect(sqlite_store.path)
    conn.execute("UPDATE steps SET name = replace(name, '<lambda:count>', '<lambda>')")
    conn.commit()
    conn.close()
    paused_record = await agency.runs.get("legacy", store=sqlite_store)
    done = await agency.respond_to_interrupts(paused_record, [approve()], store=sqlite_store)
    assert done.status == "completed", done.error
    assert done.value == 1
    assert calls["n"] == 1


# -- values JSON cannot hold faithfully are refused when stored --------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({1, 2}, "set"),
        (b"raw", "bytes"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        ({1: "one"}, "int key"),
        ({"nested": [{"deep": {2: "x"}}]}, "int key 2"),
        (object(), "object"),
    ],
)
async def test_a_step_result_json_cannot_hold_raises_at_step_time(value: Any, says: str) -> None:
    async def body(s: ResumableScope) -> None:
        await s.step(lambda: value, name="bad")

    with agency.test_context(), pytest.raises(StepResultError) as caught:
        await agency.with_resumable_scope("values", body)
    assert says.split()[0] in str(caught.value).lower()
    assert "'values/0'" in str(caught.value)


async def test_documented_round_trips_are_revived_when_annotated() -> None:
    when = dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.UTC)
    key = uuid.UUID(int=7)

    async def body(s: ResumableScope) -> list[Any]:
        plain = await s.step(lambda: ((1, 2), when, key), name="plain")
        typed = await s.step(
            lambda: ((1, 2), when, key), returns=tuple[tuple[int, int], dt.datetime, uuid.UUID]
        )
        return [plain, typed]

    with agency.test_context():
        plain, typed = await agency.with_resumable_scope("trips", body)
    assert plain == [[1, 2], "2026-12-01T09:30:00Z", str(key)]
    assert typed == ((1, 2), when, key)


async def test_arguments_json_cannot_hold_are_refused_before_anything_runs(store: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="set"):
        await agency.run(lambda tags: None, {"a", "b"}, store=store)
    deep: Any = "leaf"
    for _ in range(300):
        deep = [deep]
    with pytest.raises(InvalidArgumentError, match="nested more than"):
        await agency.run(lambda value: None, deep, store=store)
    assert await agency.runs.list(store=store) == []


# -- a failed LLM call is journaled like an answer -----------------------------------------------


class City(BaseModel):
    city: str


async def test_a_caught_structured_output_failure_replays_without_calling_again(
    store: Any,
) -> None:
    async def entry() -> str:
        try:
            await agency.llm("where?", schema=City, retries=0)
        except StructuredOutputError:
            pass  # caught: the run goes on without the answer
        answer = await agency.interrupt("approve", "fallback?")
        return "fallback" if answer.approved else "none"

    with FakeModel("unparseable", replies=["not json at all", '{"city": "Paris"}']) as fake:
        paused = await agency.run(entry, run_id="caught", store=store, model=fake.model)
        assert paused.status == "paused"
        done = await agency.respond_to_interrupts(paused, [approve()], store=store)
    assert done.status == "completed"
    assert done.value == "fallback"  # the replay took the same path: the failure again
    assert len(fake.calls) == 1  # and never asked (or billed) the provider again
    assert done.cost == paused.cost


async def test_an_uncaught_llm_failure_runs_again_when_the_failed_run_is_retried(
    store: Any,
) -> None:
    async def entry() -> str:
        return str((await agency.llm("where?", schema=City, retries=0)).city)

    with FakeModel("flaky-format", replies=["nope", '{"city": "Paris"}']) as fake:
        first = await agency.run(entry, run_id="retried", store=store, model=fake.model)
        assert first.status == "failed"
        assert first.error is not None
        assert first.error.type == "StructuredOutputError"
        assert await agency.runs.journal("retried", store=store) == []  # forgotten
        second = await agency.run(entry, run_id="retried", store=store, model=fake.model)
    assert second.status == "completed"
    assert second.value == "Paris"
    assert len(fake.calls) == 2
    assert second.cost > first.cost  # the failed call's spend is kept, never given back


# -- answering in one line -----------------------------------------------------------------------


async def test_respond_to_interrupts_takes_a_run_id_or_a_record(store: Any) -> None:
    async def entry() -> list[Any]:
        first = await agency.interrupt("approve", "one?")
        second = await agency.interrupt("approve", "two?")
        return [first.value, second.value]

    await agency.run(entry, run_id="by-id", store=store)
    step = await agency.respond_to_interrupts("by-id", [approve(1)], store=store)
    assert step.status == "paused"
    record = await agency.runs.get("by-id", store=store)
    done = await agency.respond_to_interrupts(record, [approve(2)], store=store)
    assert done.value == [1, 2]
    with pytest.raises(InterruptAnswerError, match="completed, not paused"):
        await agency.respond_to_interrupts("by-id", [approve()], store=store)


# -- the store noticed gone, a dead holder noticed dead ------------------------------------------


async def test_a_deleted_store_file_fails_the_run_instead_of_completing_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "doomed.db"
    doomed = SqliteStore(path)

    async def entry() -> str:
        async def body(s: ResumableScope) -> str:
            await s.step(lambda: "before", name="before")
            os.remove(path)  # someone cleans up the directory under the running process
            return str(await s.step(lambda: "after", name="after"))

        return await agency.with_resumable_scope("gone", body)

    result = await agency.run(entry, run_id="gone", store=doomed)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "StoreUnavailableError"
    assert "was deleted" in result.error.message
    with pytest.raises(StoreUnavailableError, match="was deleted"):
        await agency.run(entry, run_id="gone", store=doomed)
    doomed.close()


async def test_a_step_commit_looks_at_the_store_file_only_once_a_look_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "looked.db")
    identity = store._file_identity
    looks: list[str] = []

    def looking() -> tuple[int, int]:
        looks.append("stat")
        return identity()

    monkeypatch.setattr(store, "_file_identity", looking)
    seen: list[int] = []

    def due(when: float) -> int:
        seen.append(len(looks))
        store._check_due = when
        return len(looks)

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            await s.step(lambda: due(0.0), name="due")  # its commit looks
            await s.step(lambda: due(math.inf), name="not-due")  # its commit does not
            await s.step(lambda: due(math.inf), name="after")

        await agency.with_resumable_scope("looks", body)

    result = await agency.run(entry, run_id="looks", store=store)
    assert result.status == "completed", result
    assert seen[1] - seen[0] == 1
    assert seen[2] - seen[1] == 0
    store.close()


HOLDER = r"""
import os, sys, time, anyio
from agency_runtime import agency
from agency_runtime.testing import FakeClock

if os.environ["MODE"] == "take":
    # This process's clock stands still: its only way in is to see the holder is dead.
    agency.configure(clock=FakeClock(start=time.time()))

async def hold():
    if os.environ["MODE"] == "hold":
        print("holding", flush=True)
        await anyio.sleep_forever()
    return "mine"

print(agency.run_sync(hold, run_id="held", store="sqlite:///" + os.environ["DB"]).status)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_a_killed_but_unreaped_holder_is_taken_over_at_once(tmp_path: Path) -> None:
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    db = tmp_path / "held.db"
    env = {**os.environ, "DB": str(db)}
    holder = subprocess.Popen(
        [sys.executable, str(script)],
        env={**env, "MODE": "hold"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        os.kill(holder.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10  # a bounded poll of another process's state
        while Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the killed holder never became a zombie"
            time.sleep(0.001)
        taker = subprocess.run(  # its clock is frozen: waiting out the lease would hang
            [sys.executable, str(script)],
            env={**env, "MODE": "take"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert taker.stdout.strip() == "completed"
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


# -- malformed input: a clear error, never a traceback from deep inside --------------------------


async def test_lone_surrogates_are_refused_where_they_enter(store: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        await agency.run(lambda: None, run_id="bad\ud800id", store=store)
    with agency.test_context(), pytest.raises(InvalidArgumentError, match="lone surrogate"):
        agency.thread.user("hello \udc00")

    async def asks() -> None:
        await agency.interrupt("approve", "ok \ud83d?")

    result = await agency.run(asks, run_id="surrogate-message", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert "lone surrogate" in result.error.message


async def test_a_step_commit_sqlite_refuses_names_the_step(sqlite_store: Any) -> None:
    async def entry() -> int:
        async def body(s: ResumableScope) -> int:
            return int(await s.step(lambda: 1, name="bad\ud800name"))

        return await agency.with_resumable_scope("named", body)

    result = await agency.run(entry, run_id="refused", store=sqlite_store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "InvalidArgumentError"
    assert "cannot commit step 'named/0' of run 'refused'" in result.error.message
    assert await agency.runs.journal("refused", store=sqlite_store) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqlite:///bad%00name.db", "NUL"),
        ("sqlite:///x.db?busy_timeout=nan", "busy_timeout"),
        ("sqlite:///x.db?busy_timeout=inf", "busy_timeout"),
        ("sqlite:///x.db?busy_timeout=-1", "busy_timeout"),
    ],
)
def test_malformed_store_urls_are_invalid_arguments(url: str, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        open_store(url)


async def test_tampered_rows_give_clear_errors(sqlite_store: Any) -> None:
    async def entry(item: str) -> str:
        await agency.interrupt("approve", "go?")
        return item

    agency.register_entry(entry)
    await agency.run(entry, "tea", run_id="tampered", store=sqlite_store)
    conn = sqlite3.connect(sqlite_store.path)
    conn.execute("UPDATE runs SET arguments = '{not json' WHERE run_id = 'tampered'")
    conn.commit()
    with pytest.raises(JournalCorruptError, match="stored arguments"):
        await agency.run(entry, "tea", run_id="tampered", store=sqlite_store)
    with pytest.raises(StoreError, match="stored arguments"):
        await agency.resume("tampered", store=sqlite_store)

    done = await agency.run(lambda: {"ok": True}, run_id="value", store=sqlite_store)
    assert done.status == "completed"
    conn.execute("UPDATE runs SET value = '[[[' WHERE run_id = 'value'")
    conn.commit()
    conn.close()
    with pytest.raises(JournalCorruptError, match="stored value"):
        await agency.run(lambda: {"ok": True}, run_id="value", store=sqlite_store)


async def test_a_memory_store_counts_the_same_way(tmp_path: Path) -> None:
    """The same spend rules on the in-memory store."""
    memory = MemoryStore()

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            await s.step(lambda: agency.add_cost(1.0), name="one")

        await agency.with_resumable_scope("m", body)

    assert (await agency.run(entry, run_id="m", store=memory)).cost == 1.0
    assert [e.cost_pico for e in await agency.runs.journal("m", store=memory)] == [10**12]
