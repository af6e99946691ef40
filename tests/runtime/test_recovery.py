"""Continuing runs: resume (same process, new process, scripts), the runs admin view, schemas."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import textwrap
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from pydantic import BaseModel

from agency_runtime import (
    EntryImportError,
    InterruptAnswerError,
    InvalidArgumentError,
    ResumableScope,
    RunNotFoundError,
    RunRecord,
    RunResult,
    SqliteStore,
    Store,
    StoreSchemaError,
    agency,
    approve,
)
from agency_runtime._store import SCHEMA_VERSION
from tests.forked import ForkServer, python_args

pytestmark = pytest.mark.anyio


# -- module-level entries (importable by module:qualname) ------------------------------------


class Receipt(BaseModel):
    item: str
    steps: int


FORK_CALLS: Counter[str] = Counter()
DONE_CALLS: Counter[str] = Counter()


async def forkable(item: str) -> Receipt:
    """Three journaled steps, each counted."""

    def work(name: str) -> str:
        FORK_CALLS[name] += 1
        return name

    async def body(s: ResumableScope) -> Receipt:
        done = [
            await s.step(lambda: work("reserve"), name="reserve"),
            await s.step(lambda: work("charge"), name="charge"),
            await s.step(lambda: work("ship"), name="ship"),
        ]
        return Receipt(item=item, steps=len(done))

    return await agency.with_resumable_scope("order", body)


async def finishes(item: str) -> Receipt:
    DONE_CALLS[item] += 1
    return Receipt(item=item, steps=0)


@pytest.fixture(autouse=True)
def _reset_counters() -> None:
    FORK_CALLS.clear()
    DONE_CALLS.clear()


# -- subprocess helpers ----------------------------------------------------------------------


def _env(db: Path, *, pythonpath: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["AGENCY_STORE"] = f"sqlite:///{db}"
    env.pop("AGENCY_MODEL", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(pythonpath), env.get("PYTHONPATH", "")) if p
        )
    return env


def _python(
    server: ForkServer, args: list[str], *, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a new process (forked by the fork server: see tests/forked.py)."""
    how, target, rest = python_args(args)
    done = server.run(how, target, *rest, env=env, cwd=cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def sqlite_at(tmp_path: Path) -> Iterator[SqliteStore]:
    """The test process's own handle on the SQLite file the subprocesses share."""
    opened = SqliteStore(tmp_path / "s.db")
    try:
        yield opened
    finally:
        opened.close()


# -- resume in the same process --------------------------------------------------------------


async def test_resume_continues_a_failed_run_with_its_remembered_closure(
    store: Store,
) -> None:
    counts: Counter[str] = Counter()
    fail = [True]

    def make_entry(prefix: str):  # type: ignore[no-untyped-def]
        async def entry(n: int) -> str:
            async def body(s: ResumableScope) -> str:
                def work(name: str) -> str:
                    counts[name] += 1
                    if name == "two" and fail:
                        fail.pop()
                        raise RuntimeError("flaky downstream")
                    return name

                parts = [
                    await s.step(lambda: work("one"), name="one"),
                    await s.step(lambda: work("two"), name="two"),
                    await s.step(lambda: work("three"), name="three"),
                ]
                return f"{prefix}{n}:" + ",".join(parts)

            return await agency.with_resumable_scope("job", body)

        return entry

    first = await agency.run(make_entry("p"), 7, run_id="closure-run", store=store)
    assert first.status == "failed"
    assert first.error is not None
    assert first.error.type == "RuntimeError"
    assert counts == {"one": 1, "two": 1}

    resumed = await agency.resume("closure-run", store=store)
    assert resumed.status == "completed", resumed.error
    assert resumed.value == "p7:one,two,three"
    assert not resumed.replayed
    assert counts == {"one": 1, "two": 2, "three": 1}
    stored = await agency.runs.get("closure-run", store=store)
    assert (stored.status, stored.attempts) == ("completed", 2)


async def test_resume_of_an_unknown_run_is_run_not_found(store: Store) -> None:
    with pytest.raises(RunNotFoundError, match="nope"):
        await agency.resume("nope", store=store)


async def test_resume_of_a_completed_run_returns_the_stored_result(store: Store) -> None:
    first = await agency.run(finishes, "tea", run_id="done", store=store)
    assert first.status == "completed"
    again = await agency.resume("done", store=store)
    assert again.replayed
    assert again.status == "completed"
    assert again.value == Receipt(item="tea", steps=0)  # revived into the return type
    assert isinstance(again.value, Receipt)
    assert DONE_CALLS == {"tea": 1}


# -- resume in a new process -----------------------------------------------------------------

_ORDERS_MODULE = """
import pathlib

from pydantic import BaseModel

from agency_runtime import agency

HERE = pathlib.Path(__file__).parent
LEDGER = HERE / "ledger.txt"
MARKER = HERE / "failed-once"


class Order(BaseModel):
    item: str
    quantity: int


def record(name: str) -> str:
    with LEDGER.open("a") as f:
        f.write(name + "\\n")
    return name


def charge() -> str:
    if not MARKER.exists():
        MARKER.write_text("x")
        raise RuntimeError("card network down")
    return record("charge")


@agency.entry
async def place(order: Order) -> dict:
    assert isinstance(order, Order), f"got a {type(order).__name__}, not an Order"

    async def body(s):
        await s.step(lambda: record("reserve"), name="reserve")
        await s.step(charge)
        await s.step(lambda: record("ship"), name="ship")
        return {"item": order.item, "quantity": order.quantity}

    return await agency.with_resumable_scope("order", body)
"""


@pytest.mark.slow
async def test_a_new_process_resumes_a_failed_run_by_importing_its_entry(
    tmp_path: Path, sqlite_at: SqliteStore, fork_server: ForkServer
) -> None:
    modules = tmp_path / "mods"
    modules.mkdir()
    (modules / "orders_mod.py").write_text(_ORDERS_MODULE)
    env = _env(tmp_path / "s.db", pythonpath=modules)
    first = _python(
        fork_server,
        [
            "-c",
            "import orders_mod; from agency_runtime import agency; "
            "r = agency.run_sync(orders_mod.place, orders_mod.Order(item='tea', quantity=2), "
            "run_id='o1'); print(r.status, r.error.type)",
        ],
        env=env,
        cwd=tmp_path,
    )
    assert first.stdout.split() == ["failed", "RuntimeError"]
    assert (modules / "ledger.txt").read_text() == "reserve\n"

    second = _python(
        fork_server,
        [
            "-c",
            "import anyio; from agency_runtime import agency; "
            "r = anyio.run(agency.resume, 'o1'); print(r.status, r.value, r.error)",
        ],
        env=env,
        cwd=tmp_path,
    )
    assert second.stdout.strip() == "completed {'item': 'tea', 'quantity': 2} None"
    assert (modules / "ledger.txt").read_text() == "reserve\ncharge\nship\n"

    stored = await agency.runs.get("o1", store=sqlite_at)
    assert (stored.status, stored.entry, stored.attempts) == ("completed", "orders_mod:place", 2)
    journal = await agency.runs.journal("o1", store=sqlite_at)
    assert [e.name for e in journal] == ["reserve", "charge", "ship"]


_SCRIPT = """
import pathlib

from agency_runtime import agency

HERE = pathlib.Path(__file__).parent
LEDGER = HERE / "script-ledger.txt"
MARKER = HERE / "script-failed-once"


def record(name: str) -> str:
    with LEDGER.open("a") as f:
        f.write(name + "\\n")
    return name


@agency.entry
async def main(n: int) -> int:
    async def body(s):
        await s.step(lambda: record("one"), name="one")
        if not MARKER.exists():
            MARKER.write_text("x")
            raise RuntimeError("first attempt fails")
        await s.step(lambda: record("two"), name="two")
        return n * 2

    return await agency.with_resumable_scope("job", body)


if __name__ == "__main__":
    result = agency.run_sync(main, 21, run_id="script-1")
    print(result.status)
"""


@pytest.mark.slow
async def test_an_entry_defined_in_a_script_resumes_from_another_process_by_its_path(
    tmp_path: Path, sqlite_at: SqliteStore, fork_server: ForkServer
) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    script = scripts / "job_script.py"
    script.write_text(_SCRIPT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(tmp_path / "s.db")
    env.pop("PYTHONPATH", None)

    first = _python(fork_server, ["job_script.py"], env=env, cwd=scripts)  # run by a relative path
    assert first.stdout.strip() == "failed"
    stored = await agency.runs.get("script-1", store=sqlite_at)
    assert stored.entry == f"{script}:main"

    # From a directory the script is not under, it is imported only when named as the
    # application's (the store is data, never code: DESIGN §10.2).
    second = _python(
        fork_server,
        [
            "-c",
            "import anyio; from agency_runtime import agency; "
            "r = anyio.run(agency.resume, 'script-1'); print(r.status, r.value)",
        ],
        env={**env, "AGENCY_IMPORTS": str(script)},
        cwd=elsewhere,
    )
    assert second.stdout.strip() == "completed 42"
    # the script's `if __name__ == "__main__"` block did not run again on import
    assert (scripts / "script-ledger.txt").read_text() == "one\ntwo\n"


@pytest.mark.slow
async def test_a_closure_or_lambda_entry_cannot_be_resumed_in_another_process(
    tmp_path: Path, sqlite_at: SqliteStore, fork_server: ForkServer
) -> None:
    env = _env(tmp_path / "s.db")
    _python(
        fork_server,
        [
            "-c",
            textwrap.dedent(
                """
                from agency_runtime import agency

                def make():
                    def entry():
                        raise RuntimeError("boom")
                    return entry

                print(agency.run_sync(make(), run_id="closure-x").status)
                print(agency.run_sync(lambda: 1 / 0, run_id="lambda-x").status)
                """
            ),
        ],
        env=env,
        cwd=tmp_path,
    )
    for run_id, qualname in (("closure-x", "make.<locals>.entry"), ("lambda-x", "<lambda>")):
        assert (await agency.runs.get(run_id, store=sqlite_at)).status == "failed"
        with pytest.raises(EntryImportError, match="cannot import") as caught:
            await agency.resume(run_id, store=sqlite_at)
        assert qualname in str(caught.value)  # the message names the entry
        assert (await agency.runs.get(run_id, store=sqlite_at)).status == "failed"


# -- the runs admin view ---------------------------------------------------------------------


async def test_journal_lists_the_completed_steps_in_order(store: Store) -> None:
    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            await s.step(lambda: 1, name="first")

            async def nested() -> int:
                async def inner(t: ResumableScope) -> int:
                    return await t.step(lambda: 2, name="deep")

                return await agency.with_resumable_scope("inner", inner)

            await s.step(nested, name="middle")
            await s.step(lambda: 3, name="last")

        await agency.with_resumable_scope("job", body)

    result = await agency.run(entry, run_id="j", store=store)
    assert result.status == "completed", result.error
    journal = await agency.runs.journal("j", store=store)
    assert [(e.path, e.name) for e in journal] == [
        ("job/0", "first"),
        ("job/1/inner/0", "deep"),
        ("job/1", "middle"),
        ("job/2", "last"),
    ]
    assert [e.seq for e in journal] == sorted(e.seq for e in journal)
    assert [e.result for e in journal] == ["1", "2", "2", "3"]
    with pytest.raises(RunNotFoundError):
        await agency.runs.journal("missing", store=store)


@pytest.mark.parametrize("how", ["failed", "paused"])
async def test_cancel_makes_a_failed_or_paused_run_final(store: Store, how: str) -> None:
    executions: list[int] = []

    async def entry() -> str:
        executions.append(1)
        if how == "failed":
            raise RuntimeError("broken")
        await agency.interrupt(message="may I?")
        return "went on"

    first = await agency.run(entry, run_id="c1", store=store)
    assert first.status == how
    record = await agency.runs.cancel("c1", store=store)
    assert isinstance(record, RunRecord)
    assert (record.run_id, record.status) == ("c1", "cancelled")
    assert (await agency.runs.get("c1", store=store)).status == "cancelled"

    again = await agency.run(entry, run_id="c1", store=store)
    assert again.status == "cancelled"
    assert again.replayed
    assert len(executions) == 1
    resumed = await agency.resume("c1", store=store)
    assert (resumed.status, resumed.replayed) == ("cancelled", True)
    assert len(executions) == 1
    if how == "paused":
        with pytest.raises(InterruptAnswerError, match="cancelled"):
            await agency.respond_to_interrupts(first, [approve()], store=store)
        assert len(executions) == 1


async def test_cancel_leaves_a_completed_run_alone_and_unknown_runs_are_not_found(
    store: Store,
) -> None:
    await agency.run(finishes, "tea", run_id="fin", store=store)
    record = await agency.runs.cancel("fin", store=store)
    assert record.status == "completed"
    assert (await agency.run(finishes, "tea", run_id="fin", store=store)).status == "completed"
    with pytest.raises(RunNotFoundError):
        await agency.runs.cancel("ghost", store=store)


async def test_cancelling_an_executing_run_stops_it_at_its_next_step(store: Store) -> None:
    ran: list[str] = []
    first_done = anyio.Event()
    gate = anyio.Event()

    async def entry() -> str:
        async def body(s: ResumableScope) -> str:
            await s.step(lambda: ran.append("one"), name="one")
            first_done.set()
            await gate.wait()
            await s.step(lambda: ran.append("two"), name="two")
            await s.step(lambda: ran.append("three"), name="three")
            return "finished"

        return await agency.with_resumable_scope("job", body)

    results: list[RunResult] = []

    async def go() -> None:
        results.append(await agency.run(entry, run_id="live", store=store))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(go)
            await first_done.wait()
            record = await agency.runs.cancel("live", store=store)
            assert record.status == "cancelled"
            gate.set()

    (result,) = results
    assert result.status == "cancelled"
    assert result.value is None
    assert "three" not in ran
    assert [e.name for e in await agency.runs.journal("live", store=store)] == ["one"]
    assert (await agency.runs.get("live", store=store)).status == "cancelled"


async def test_fork_copies_the_journal_up_to_a_step_and_resume_reruns_the_rest(
    store: Store,
) -> None:
    original = await agency.run(forkable, "tea", run_id="src", store=store)
    assert original.status == "completed", original.error
    assert FORK_CALLS == {"reserve": 1, "charge": 1, "ship": 1}

    new_id = await agency.runs.fork("src", "order/0", store=store)
    assert isinstance(new_id, str)
    assert new_id != "src"
    forked = await agency.runs.get(new_id, store=store)
    assert forked.status == "paused"
    assert [(e.path, e.name) for e in await agency.runs.journal(new_id, store=store)] == [
        ("order/0", "reserve")
    ]

    resumed = await agency.resume(new_id, store=store)
    assert resumed.status == "completed", resumed.error
    assert resumed.value == Receipt(item="tea", steps=3)
    assert FORK_CALLS == {"reserve": 1, "charge": 2, "ship": 2}
    assert [e.name for e in await agency.runs.journal(new_id, store=store)] == [
        "reserve",
        "charge",
        "ship",
    ]
    # the source run is untouched
    assert (await agency.runs.get("src", store=store)).status == "completed"
    assert len(await agency.runs.journal("src", store=store)) == 3


async def test_fork_to_a_chosen_id_and_through_the_last_step(store: Store) -> None:
    await agency.run(forkable, "tea", run_id="src2", store=store)
    new_id = await agency.runs.fork("src2", "order/2", new_run_id="src2-copy", store=store)
    assert new_id == "src2-copy"
    resumed = await agency.resume(new_id, store=store)
    assert resumed.status == "completed"
    assert FORK_CALLS == {"reserve": 1, "charge": 1, "ship": 1}  # nothing ran again
    with pytest.raises(InvalidArgumentError, match="exists already"):
        await agency.runs.fork("src2", "order/0", new_run_id="src2-copy", store=store)


async def test_fork_with_an_unknown_step_path_is_an_invalid_argument(store: Store) -> None:
    await agency.run(forkable, "tea", run_id="src3", store=store)
    with pytest.raises(InvalidArgumentError, match="order/9"):
        await agency.runs.fork("src3", "order/9", store=store)
    with pytest.raises(RunNotFoundError):
        await agency.runs.fork("ghost", "order/0", store=store)
    assert [r.run_id for r in await agency.runs.list(store=store)] == ["src3"]


async def test_a_fork_of_a_closure_run_resumes_in_the_same_process(store: Store) -> None:
    counts: Counter[str] = Counter()

    async def entry() -> int:
        async def body(s: ResumableScope) -> int:
            await s.step(lambda: counts.update(["a"]), name="a")
            await s.step(lambda: counts.update(["b"]), name="b")
            return 1

        return await agency.with_resumable_scope("job", body)

    await agency.run(entry, run_id="closure-src", store=store)
    new_id = await agency.runs.fork("closure-src", "job/0", store=store)
    resumed = await agency.resume(new_id, store=store)
    assert resumed.status == "completed"
    assert counts == {"a": 1, "b": 2}


# -- store schema ------------------------------------------------------------------------------


async def test_a_store_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    newer = SCHEMA_VERSION + 1
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA user_version = {newer}")
        conn.commit()
    finally:
        conn.close()

    with pytest.raises(StoreSchemaError) as caught:
        SqliteStore(path)
    message = str(caught.value)
    assert f"schema version {newer}" in message
    assert f"up to {SCHEMA_VERSION}" in message

    with pytest.raises(StoreSchemaError):
        await agency.run(finishes, "tea", store=f"sqlite:///{path}")
    assert DONE_CALLS == {}
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == newer
    finally:
        conn.close()
