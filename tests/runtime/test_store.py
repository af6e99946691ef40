"""Stores: URL selection, the claim/lease protocol, SQLite durability and damage."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agency_runtime import (
    ErrorInfo,
    InvalidArgumentError,
    MemoryStore,
    RunRecord,
    SqliteStore,
    Store,
    StoreError,
    StoreSchemaError,
    StoreUnavailableError,
    open_store,
)
from agency_runtime._core._money import pico_to_usd
from agency_runtime._store import SCHEMA_VERSION, resolve_store
from agency_runtime._types import JournalEntry, RunStatus

pytestmark = pytest.mark.anyio


def record(run_id: str = "r1", **changes: object) -> RunRecord:
    fields: dict[str, object] = {"status": "running", "entry": "m:f", "arguments": "{}"}
    return RunRecord(run_id=run_id, **{**fields, **changes})  # type: ignore[arg-type]


# -- URLs ----------------------------------------------------------------------------------


def test_memory_urls_name_one_store_per_process_and_name() -> None:
    assert open_store("memory://") is open_store("memory://")
    assert open_store("memory://a") is open_store("memory://a")
    assert open_store("memory://a") is not open_store("memory://b")
    assert open_store("memory://a").url == "memory://a"


def test_sqlite_urls_relative_and_absolute(tmp_path: Path) -> None:
    relative = open_store("sqlite:///data/agency.db")
    assert isinstance(relative, SqliteStore)
    assert Path(relative.path) == tmp_path / "data" / "agency.db"
    assert (tmp_path / "data" / "agency.db").exists()
    absolute = open_store(f"sqlite:///{tmp_path}/data/agency.db")  # four slashes: absolute
    assert absolute is relative  # same file, same store object
    assert open_store("sqlite:///./data/agency.db") is relative


async def test_a_sqlite_url_opens_the_file_at_its_path_now(tmp_path: Path) -> None:
    """A store file deleted, or replaced by another, under a process that opened its URL:
    the URL opens the file there now, never the old store serving the old file's rows (the
    old object, whoever holds it, still refuses to write)."""
    url = f"sqlite:///{tmp_path}/data/swapped.db"
    first = open_store(url)
    assert isinstance(first, SqliteStore)
    await first.claim_run(record("old"), owner="w", lease_seconds=60)
    assert not first.file_gone()
    assert open_store(url) is first

    os.remove(first.path)  # deleted: a new, empty store there
    assert first.file_gone()
    with pytest.raises(StoreUnavailableError, match="was deleted"):
        await first.claim_run(record("late"), owner="w", lease_seconds=60)
    fresh = open_store(url)
    assert fresh is not first
    assert isinstance(fresh, SqliteStore)
    assert await fresh.get_run("old") is None
    assert open_store(url) is fresh
    with pytest.raises(StoreUnavailableError, match="replaced by another file"):
        await first.claim_run(record("late"), owner="w", lease_seconds=60)

    shutil.rmtree(tmp_path / "data")  # the directory cleaned up, a new file made there
    other = SqliteStore(fresh.path)
    await other.claim_run(record("theirs"), owner="w", lease_seconds=60)
    other.close()
    assert fresh.file_gone()
    moved = open_store(url)
    assert moved is not fresh
    assert isinstance(moved, SqliteStore)
    stored = await moved.get_run("theirs")
    assert stored is not None
    assert await moved.get_run("old") is None
    for store in (first, fresh, moved):
        store.close()
    assert not SqliteStore(":memory:").file_gone()


def test_sqlite_url_options(tmp_path: Path) -> None:
    store = open_store("sqlite:///full.db?synchronous=FULL&busy_timeout=2")
    assert isinstance(store, SqliteStore)
    conn = store._conn
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2000


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty"),
        ("   ", "non-empty"),
        ("ftp://example/x", "unknown store URL scheme ftp://"),
        ("agency.db", "unknown store URL scheme"),
        ("sqlite:/x.db", "three slashes"),
        ("sqlite://host/x.db", "three slashes"),
        ("sqlite:///", "names no file"),
        ("sqlite:///dir/", "names no file"),
        ("sqlite:///x.db?synchronous=SOMETIMES", "synchronous='SOMETIMES'"),
        ("sqlite:///x.db?busy_timeout=soon", "busy_timeout='soon'"),
        ("sqlite:///x.db?busy_timeout=-1", "0 or more"),
        ("sqlite:///x.db?cache=big", "unknown option"),
        ("memory://x?y=1", "no options"),
    ],
)
def test_malformed_store_urls_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        open_store(url)
    assert (
        "sqlite:///" in str(caught.value)
        or "synchronous" in str(caught.value)
        or ("busy_timeout" in str(caught.value) or "option" in str(caught.value))
    )


def test_an_unreachable_postgres_server_is_unavailable_without_leaking_secrets() -> None:
    with pytest.raises(StoreUnavailableError, match="PostgreSQL") as caught:
        open_store("postgresql://user:secret@db.example/agency?connect_timeout=2")
    assert "secret" not in str(caught.value)
    assert "db.example" in str(caught.value)  # it says which server


def test_resolve_store_prefers_the_argument_then_agency_store_then_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = MemoryStore()
    assert resolve_store(mine) is mine
    monkeypatch.setenv("AGENCY_STORE", "memory://from-env")
    assert resolve_store(None) is open_store("memory://from-env")
    monkeypatch.delenv("AGENCY_STORE")
    default = resolve_store(None)
    assert isinstance(default, SqliteStore)
    assert Path(default.path) == tmp_path / ".agency" / "agency.db"
    with pytest.raises(InvalidArgumentError, match="URL string"):
        resolve_store(42)  # type: ignore[arg-type]


# -- opening SQLite files ------------------------------------------------------------------


def test_sqlite_store_uses_wal_and_creates_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "a.db"
    store = SqliteStore(path)
    try:
        check = sqlite3.connect(path)
        assert check.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert check.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        check.close()
    finally:
        store.close()


async def test_a_failed_step_commit_names_the_step_and_the_run(tmp_path: Path) -> None:
    # The commit's label is built only when it fails: it still says what failed.
    store = SqliteStore(tmp_path / "a.db")
    try:
        await store.claim_run(record("r"), owner="o", lease_seconds=30)
        conn = store._conn
        assert conn is not None
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON steps BEGIN SELECT RAISE(ABORT, 'nope'); END"
        )
        entry = JournalEntry(run_id="r", seq=1, path="s/0", name="n", result="1")
        with pytest.raises(StoreError, match=r"failed to commit step 's/0' of run 'r': nope"):
            await store.commit_step(entry, owner="o")
        # The store's one cursor goes on after a failed statement.
        conn.execute("DROP TRIGGER refuse")
        assert await store.commit_step(entry, owner="o")
        journal = await store.load_journal("r")
        assert [e.path for e in journal.entries] == ["s/0"]
    finally:
        store.close()


def test_an_unwritable_location_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailableError, match="AGENCY_STORE=sqlite:///") as caught:
        SqliteStore(blocker / "sub" / "agency.db")
    assert str(blocker) in str(caught.value)
    with pytest.raises(StoreUnavailableError, match="cannot"):
        SqliteStore(tmp_path)  # a directory, not a file


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreUnavailableError, match=r"junk\.db"):
        SqliteStore(path)


def test_a_store_from_a_newer_schema_is_refused_with_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(StoreSchemaError) as caught:
        SqliteStore(path)
    assert str(SCHEMA_VERSION + 5) in str(caught.value)
    assert f"up to {SCHEMA_VERSION}" in str(caught.value)


async def test_records_survive_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "keep.db"
    first = SqliteStore(path)
    claim = await first.claim_run(record("keep"), owner="o", lease_seconds=30)
    done = claim.record.model_copy(
        update={
            "status": "completed",
            "value": '{"a":1}',
            "cost_pico": 5,
            "tokens": 2,
            "finished_at": time.time(),
        }
    )
    assert await first.finish_run(done, owner="o")
    first.close()
    first.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        await first.get_run("keep")
    second = SqliteStore(path)
    try:
        again = await second.get_run("keep")
        assert again is not None
        assert (again.status, again.value, again.cost_pico, again.tokens) == (
            "completed",
            '{"a":1}',
            5,
            2,
        )
        assert again.lease_owner is None
    finally:
        second.close()


async def test_a_damaged_row_is_an_error_naming_the_run(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "d.db")
    try:
        await store.claim_run(record("broken"), owner="o", lease_seconds=30)
        store._conn.execute("UPDATE runs SET error = '{not json' WHERE run_id = 'broken'")
        with pytest.raises(StoreError, match="'broken' is damaged"):
            await store.get_run("broken")
    finally:
        store.close()


# -- the claim / lease protocol (every store) ----------------------------------------------


async def test_claiming_a_new_run_inserts_it_as_running(store: Store) -> None:
    claim = await store.claim_run(record(), owner="me", lease_seconds=30)
    assert claim.acquired
    assert claim.created
    assert claim.record.status == "running"
    assert claim.record.lease_owner == "me"
    assert claim.record.attempts == 1
    stored = await store.get_run("r1")
    assert stored == claim.record


async def test_a_live_lease_refuses_other_claimants(store: Store) -> None:
    await store.claim_run(record(), owner="me", lease_seconds=30)
    other = await store.claim_run(record(), owner="you", lease_seconds=30)
    assert not other.acquired
    assert other.record.lease_owner == "me"


async def test_an_expired_lease_is_taken_over(store: Store) -> None:
    await store.claim_run(record(), owner="dead", lease_seconds=0.0)
    taken = await store.claim_run(record(), owner="alive", lease_seconds=30)
    assert taken.acquired
    assert not taken.created
    assert taken.record.lease_owner == "alive"
    assert taken.record.attempts == 2
    assert not await store.renew_lease("r1", owner="dead", lease_seconds=30)
    assert await store.renew_lease("r1", owner="alive", lease_seconds=30)


@pytest.mark.parametrize("status", ["failed", "paused"])
async def test_failed_and_paused_runs_can_be_claimed_again(store: Store, status: str) -> None:
    first = await store.claim_run(record(), owner="a", lease_seconds=30)
    await store.finish_run(first.record.model_copy(update={"status": status}), owner="a")
    again = await store.claim_run(record(), owner="b", lease_seconds=30)
    assert again.acquired
    assert again.record.status == "running"


@pytest.mark.parametrize("status", ["completed", "cancelled"])
async def test_final_runs_are_never_claimed_again(store: Store, status: str) -> None:
    first = await store.claim_run(record(), owner="a", lease_seconds=30)
    finished = first.record.model_copy(
        update={
            "status": status,
            "error": ErrorInfo(type="X", message="m") if status == "cancelled" else None,
        }
    )
    assert await store.finish_run(finished, owner="a")
    again = await store.claim_run(record(), owner="b", lease_seconds=30)
    assert not again.acquired
    assert again.record.status == status
    assert again.record.lease_owner is None


async def test_only_the_lease_holder_can_finish_a_run(store: Store) -> None:
    first = await store.claim_run(record(), owner="a", lease_seconds=30)
    done = first.record.model_copy(update={"status": "completed"})
    assert not await store.finish_run(done, owner="intruder")
    assert (await store.get_run("r1")).status == "running"  # type: ignore[union-attr]
    assert await store.finish_run(done, owner="a")
    assert not await store.finish_run(done, owner="a")  # the lease is released


async def test_steps_committed_together_are_fenced_each_by_its_own_lease(store: Store) -> None:
    """``commit_steps`` (the PostgreSQL store's group commit) writes, in one statement, each
    step whose owner holds its run's lease, and says which, in order."""
    from agency_runtime._store._core import StoreCore

    assert isinstance(store, StoreCore)
    await store.claim_run(record("ra"), owner="a", lease_seconds=30)
    await store.claim_run(record("rb"), owner="b", lease_seconds=30)
    paused = await store.claim_run(record("rp"), owner="a", lease_seconds=30)
    await store.finish_run(paused.record.model_copy(update={"status": "paused"}), owner="a")

    def step(run_id: str, path: str, seq: int, **more: Any) -> JournalEntry:
        return JournalEntry(run_id=run_id, path=path, seq=seq, name="n", callsite="f.py:1",
                            result=f'"{path}"', created_at=1234.5678901234, **more)  # fmt: skip

    written = await store.commit_steps(
        [
            (step("ra", "one", 1, cost_pico=10**15, tokens=7, locals='{"k": 1}'), "a"),
            (step("rb", "one", 1), "a"),  # rb is b's
            (step("ra", "two", 2, error='{"type": "X"}'), "a"),
            (step("rp", "one", 1), "a"),  # paused: nobody holds it
            (step("rb", "mine", 1), "b"),
        ]
    )
    assert written == [True, False, True, False, True]
    entries = (await store.load_journal("ra")).entries
    assert [(e.path, e.seq, e.result) for e in entries] == [
        ("one", 1, '"one"'),
        ("two", 2, '"two"'),
    ]
    first, second = entries
    assert (first.cost_pico, first.tokens, first.locals) == (10**15, 7, '{"k": 1}')
    assert first.error is None
    assert first.created_at == 1234.5678901234  # exactly: a float through JSON and back
    assert second.error == '{"type": "X"}'
    assert second.locals is None
    assert [e.path for e in (await store.load_journal("rb")).entries] == ["mine"]
    assert (await store.load_journal("rp")).entries == []


async def test_outcomes_stored_together_are_what_each_stored_alone_would_be(store: Store) -> None:
    """``finish_runs`` (the PostgreSQL store's grouped outcomes) stores, in one statement,
    each outcome whose owner holds its run's lease, exactly as ``finish_run`` would, and says
    which, in order."""
    from agency_runtime._store._core import StoreCore

    assert isinstance(store, StoreCore)
    endings: list[tuple[str, dict[str, Any], tuple[int, int]]] = [
        ("done", {"status": "completed", "value": '{"a": [1, "x"]}', "cost_pico": 10**15,
                  "tokens": 9, "finished_at": 1234.5678901234}, (7, 3)),
        ("broke", {"status": "failed", "error": ErrorInfo(type="Boom", message="it broke"),
                   "finished_at": 99.5}, (0, 0)),
        ("back", {"status": "queued"}, (0, 0)),
        ("nap", {"status": "waiting", "wake_at": 5000.25}, (1, 0)),
    ]  # fmt: skip
    for prefix in ("alone-", "group-"):
        for name, _, _ in endings:
            await store.claim_run(record(prefix + name), owner="w", lease_seconds=30)
    await store.claim_run(record("theirs"), owner="x", lease_seconds=30)

    def ending(prefix: str, name: str, fields: dict[str, Any]) -> RunRecord:
        return record(prefix + name).model_copy(update=fields)

    for name, fields, unjournaled in endings:
        assert await store.finish_run(
            ending("alone-", name, fields), owner="w", unjournaled=unjournaled
        )
    written = await store.finish_runs(
        [
            (ending("group-", name, fields), "w", unjournaled)
            for name, fields, unjournaled in endings
        ]
        + [(ending("", "theirs", {"status": "completed"}), "w", (0, 0))]
    )
    assert written == [True, True, True, True, False]
    same = {"run_id", "created_at", "started_at", "updated_at", "seq"}  # the claims' times
    for name, _, _ in endings:
        alone = await store.get_run("alone-" + name)
        grouped = await store.get_run("group-" + name)
        assert alone is not None
        assert grouped is not None
        assert grouped.model_dump(exclude=same) == alone.model_dump(exclude=same)
        assert grouped.lease_owner is None
    theirs = await store.get_run("theirs")
    assert theirs is not None
    assert (theirs.status, theirs.lease_owner) == ("running", "x")


async def test_list_runs_newest_first_with_a_status_filter(store: Store) -> None:
    for index, status in enumerate(["completed", "failed", "completed"]):
        claim = await store.claim_run(
            record(f"r{index}", created_at=1000.0 + index), owner="o", lease_seconds=30
        )
        await store.finish_run(claim.record.model_copy(update={"status": status}), owner="o")
    assert [r.run_id for r in await store.list_runs()] == ["r2", "r1", "r0"]
    assert [r.run_id for r in await store.list_runs(status="completed")] == ["r2", "r0"]
    assert [r.run_id for r in await store.list_runs(limit=1)] == ["r2"]
    assert await store.get_run("nope") is None


# -- child runs ----------------------------------------------------------------------------


def child(run_id: str, parent: str, root: str, depth: int, **changes: object) -> RunRecord:
    return record(run_id, parent_id=parent, root_id=root, depth=depth, **changes)


def test_a_record_is_a_top_level_run_unless_told_and_its_own_cost_excludes_descendants() -> None:
    top = record("t", cost_pico=3 * 10**12)
    assert (top.parent_id, top.root_id, top.depth, top.descendants_pico) == (None, None, 0, 0)
    assert (top.own_cost_pico, top.own_cost, top.cost) == (3 * 10**12, 3.0, 3.0)
    kid = child("k", "t", "t", 1, cost_pico=5 * 10**11, descendants_pico=2 * 10**11)
    assert kid.own_cost_pico == 3 * 10**11
    assert kid.own_cost == pico_to_usd(kid.own_cost_pico) == 0.3
    assert kid.cost == pico_to_usd(kid.cost_pico) == 0.5
    for bad in ({"depth": -1}, {"descendants_pico": -1}):
        with pytest.raises(ValidationError, match="greater than or equal to 0"):
            record("bad", **bad)


def test_a_fork_is_a_new_top_level_run() -> None:
    kid = child("k", "p", "root", 2, cost_pico=10, descendants_pico=6)
    forked = kid.fork_as("k2", cost_pico=4)
    assert (forked.parent_id, forked.root_id, forked.depth) == (None, None, 0)
    assert (forked.cost_pico, forked.descendants_pico, forked.own_cost_pico) == (4, 0, 4)
    assert (kid.parent_id, kid.depth, kid.descendants_pico) == ("p", 2, 6)  # a copy


async def _tree(store: Store) -> None:
    """root ─ a ─ a1, root ─ b (queued), other ─ x; created in that order."""
    runs = [
        record("root", created_at=1000.0),
        child("a", "root", "root", 1, created_at=1001.0),
        child("a1", "a", "root", 2, created_at=1002.0),
        record("other", created_at=1003.0),
        child("x", "other", "other", 1, created_at=1004.0),
    ]
    for run in runs:
        claim = await store.claim_run(run, owner="o", lease_seconds=30)
        assert claim.created
        await store.finish_run(claim.record.model_copy(update={"status": "completed"}), owner="o")
    queued = await store.enqueue_run(
        child("b", "root", "root", 1, status="queued", queue="q", created_at=1005.0)
    )
    assert queued.created


async def test_a_child_run_keeps_its_parent_root_and_depth(store: Store) -> None:
    await _tree(store)
    a1 = await store.get_run("a1")
    assert a1 is not None
    assert (a1.parent_id, a1.root_id, a1.depth) == ("a", "root", 2)
    b = await store.get_run("b")  # queued: stored by enqueue_run
    assert b is not None
    assert (b.status, b.parent_id, b.root_id, b.depth) == ("queued", "root", "root", 1)
    top = await store.get_run("root")
    assert top is not None
    assert (top.parent_id, top.root_id, top.depth, top.descendants_pico) == (None, None, 0, 0)
    claimed = await store.claim_queued(queues=["q"], owner="w", lease_seconds=30, limit=1)
    assert [(r.run_id, r.parent_id, r.depth) for r in claimed] == [("b", "root", 1)]


async def test_list_runs_of_a_parent_lists_its_direct_children_newest_first(
    store: Store,
) -> None:
    await _tree(store)
    assert [r.run_id for r in await store.list_runs(parent="root")] == ["b", "a"]
    assert [r.run_id for r in await store.list_runs(parent="a")] == ["a1"]
    assert [r.run_id for r in await store.list_runs(parent="a1")] == []
    assert [r.run_id for r in await store.list_runs(parent="nope")] == []
    assert [r.run_id for r in await store.list_runs(parent="root", limit=1)] == ["b"]
    assert [r.run_id for r in await store.list_runs(parent="root", offset=1)] == ["a"]
    assert [r.run_id for r in await store.list_runs(parent="root", limit=-1)] == ["b", "a"]
    queued = await store.list_runs(parent="root", status="queued")
    assert [r.run_id for r in queued] == ["b"]
    assert await store.list_runs(parent="other", status="queued") == []
    everything = [r.run_id for r in await store.list_runs()]  # parent=None: every run
    assert everything == ["b", "x", "other", "a1", "a", "root"]


async def test_children_created_at_one_time_list_in_insertion_order(store: Store) -> None:
    await store.claim_run(record("p", created_at=1000.0), owner="o", lease_seconds=30)
    for index in range(5):
        await store.enqueue_run(
            child(f"c{index}", "p", "p", 1, status="queued", queue="q", created_at=1001.0)
        )
    listed = [r.run_id for r in await store.list_runs(parent="p")]
    assert listed == ["c4", "c3", "c2", "c1", "c0"]
    pages = [await store.list_runs(parent="p", limit=2, offset=n) for n in (0, 2, 4)]
    assert [r.run_id for page in pages for r in page] == listed


async def test_an_outcome_stores_the_descendants_spend(store: Store) -> None:
    claim = await store.claim_run(record("p"), owner="o", lease_seconds=30)
    done = claim.record.model_copy(
        update={"status": "completed", "cost_pico": 7_000, "descendants_pico": 5_000}
    )
    assert await store.finish_run(done, owner="o")
    stored = await store.get_run("p")
    assert stored is not None
    spend = (stored.cost_pico, stored.descendants_pico, stored.own_cost_pico)
    assert spend == (7_000, 5_000, 2_000)
    assert stored.own_cost == 2e-9
    assert stored.cost == 7e-9
    # A takeover keeps what the run's tree spent (the claim changes only the lease).
    again = await store.claim_run(record("p"), owner="o2", lease_seconds=30)
    assert not again.acquired  # completed: final
    assert again.record.descendants_pico == 5_000


async def test_a_fork_of_a_child_run_is_a_top_level_run(store: Store) -> None:
    claim = await store.claim_run(
        child("kid", "p", "root", 3, descendants_pico=4), owner="o", lease_seconds=30
    )
    assert claim.record.depth == 3
    await store.commit_step(
        JournalEntry(run_id="kid", seq=1, path="s/0", name="s", result="1", cost_pico=9),
        owner="o",
    )
    await store.finish_run(
        claim.record.model_copy(update={"status": "completed", "cost_pico": 13}), owner="o"
    )
    forked = await store.fork_run("kid", "kid-fork", 1)
    stored = await store.get_run("kid-fork")
    assert stored is not None
    for run in (forked, stored):
        assert (run.parent_id, run.root_id, run.depth, run.descendants_pico) == (None, None, 0, 0)
        assert run.cost_pico == 9
    assert [r.run_id for r in await store.list_runs(parent="p")] == ["kid"]


async def test_errors_and_interrupts_round_trip(store: Store) -> None:
    from agency_runtime import Interrupt

    claim = await store.claim_run(record(), owner="o", lease_seconds=30)
    paused = claim.record.model_copy(
        update={
            "status": "paused",
            "interrupts": [Interrupt(interrupt_id="i1", effect="approve", data={"amount": 3})],
            "error": ErrorInfo(type="ValueError", message="bad", module="builtins"),
        }
    )
    await store.finish_run(paused, owner="o")
    stored = await store.get_run("r1")
    assert stored is not None
    assert stored.interrupts == paused.interrupts
    assert stored.error == paused.error


async def _wal_around_an_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: RunStatus
) -> tuple[int, int]:
    """The WAL's size before and after a run holding 20 kB ends with ``status``, with any
    WAL over 1 KiB to be folded back at a run's end."""
    from agency_runtime._store import _sqlite

    monkeypatch.setattr(_sqlite, "WAL_TRIM_BYTES", 1024)
    store = SqliteStore(tmp_path / "w.db")
    try:
        claim = await store.claim_run(
            record("big", arguments='"' + "x" * 20000 + '"'), owner="o", lease_seconds=30
        )
        wal = tmp_path / "w.db-wal"
        before = wal.stat().st_size
        await store.finish_run(claim.record.model_copy(update={"status": status}), owner="o")
        return before, wal.stat().st_size
    finally:
        store.close()


async def test_a_large_wal_is_truncated_when_a_run_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, after = await _wal_around_an_end(tmp_path, monkeypatch, "completed")
    assert before > 1024
    assert after == 0


async def test_a_pause_leaves_the_wal_for_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A paused run's answer usually follows: truncating the WAL at the pause would make the
    # answer's first commit sync a new WAL header. It stays, within its cap.
    before, after = await _wal_around_an_end(tmp_path, monkeypatch, "paused")
    assert before > 1024
    assert after >= before


async def test_a_new_file_has_small_pages_and_a_capped_wal(tmp_path: Path) -> None:
    from agency_runtime._store import _sqlite

    store = SqliteStore(tmp_path / "new.db")
    try:
        conn = store._conn
        assert conn is not None
        assert conn.execute("PRAGMA page_size").fetchone()[0] == _sqlite.PAGE_SIZE == 1024
        limit = _sqlite.WAL_LIMIT_BYTES
        assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == limit
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == limit // 1024
        # 3 MiB of writes in one run: the WAL is checkpointed and cut back as it goes
        claim = await store.claim_run(record("big"), owner="o", lease_seconds=30)
        wal = tmp_path / "new.db-wal"
        largest = 0
        for i in range(300):
            entry = JournalEntry(
                run_id="big",
                seq=i,
                path=f"s/{i}",
                name="n",
                callsite="",
                result='"' + "y" * 10_000 + '"',
                created_at=0.0,
            )
            assert await store.commit_step(entry, owner="o")
            largest = max(largest, wal.stat().st_size)
        assert largest < limit + 64 * 1024  # the cap and one commit's pages
        await store.finish_run(claim.record.model_copy(update={"status": "completed"}), owner="o")
    finally:
        store.close()


def test_an_existing_file_keeps_its_page_size(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    store = SqliteStore(path)
    try:
        assert store._conn is not None
        assert store._conn.execute("PRAGMA page_size").fetchone()[0] == 4096
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 256
    finally:
        store.close()


# -- memory items and documents (every store) ------------------------------------------------


def memory(item_id: str, content: str, tags: list[str], at: float, **extra: object) -> Any:
    from agency_runtime._types import MemoryRecord

    return MemoryRecord(
        id=item_id, namespace="ns", content=content, tags=tags, created_at=at, **extra
    )  # type: ignore[arg-type]


async def test_memory_recall_matches_every_tag_ranks_by_keywords_and_lists_newest_first(
    store: Store,
) -> None:
    await store.save_memory(memory("a", "the invoice for March", ["c1"], 1.0))
    await store.save_memory(memory("b", "weather talk", ["c1"], 2.0))
    await store.save_memory(memory("c", "invoice again, invoice", ["c1", "vip"], 3.0))
    await store.save_memory(memory("d", "invoice of another chat", ["c2"], 4.0))
    found = await store.recall_memory(
        namespace="ns", query="invoice", tags=["c1"], scope=None, limit=2, now=10.0
    )
    assert [m.id for m in found] == ["c", "a"]  # the two keyword matches, newest first
    recent = await store.recall_memory(
        namespace="ns", query="nothing matches", tags=["c1"], scope=None, limit=2, now=10.0
    )
    assert [m.id for m in recent] == ["c", "b"]  # no match: the most recent ones
    both = await store.recall_memory(
        namespace="ns", query="", tags=["c1", "vip"], scope=None, limit=8, now=10.0
    )
    assert [m.id for m in both] == ["c"]
    assert (
        await store.recall_memory(
            namespace="other", query="", tags=[], scope=None, limit=8, now=10.0
        )
        == []
    )


async def test_expired_memory_never_returns_and_is_purged(store: Store) -> None:
    await store.save_memory(memory("old", "short lived", ["t"], 1.0, expires_at=5.0))
    await store.save_memory(memory("new", "long lived", ["t"], 2.0, scope="session"))
    live = await store.recall_memory(
        namespace="ns", query="lived", tags=["t"], scope=None, limit=8, now=6.0
    )
    assert [m.id for m in live] == ["new"]
    assert await store.recall_memory(
        namespace="ns", query="", tags=["t"], scope="workspace", limit=8, now=1.5
    ) == [memory("old", "short lived", ["t"], 1.0, expires_at=5.0)]
    assert await store.purge_memory(now=6.0) == 1
    assert await store.purge_memory(now=6.0) == 0


async def test_documents_are_stored_and_replaced(store: Store) -> None:
    assert await store.get_document("memory:default", "graph") is None
    await store.put_document("memory:default", "graph", '{"v": 1}')
    await store.put_document("memory:default", "graph", '{"v": 2}')
    assert await store.get_document("memory:default", "graph") == '{"v": 2}'


async def test_expiring_memory_soft_deletes_it(store: Store) -> None:
    await store.save_memory(memory("x", "a fact", ["t"], 1.0))
    assert await store.expire_memory("ns", ["x", "missing"], at=3.0) == 1
    assert await store.expire_memory("other", ["x"], at=3.0) == 0
    before = await store.recall_memory(
        namespace="ns", query="fact", tags=[], scope=None, limit=8, now=2.0
    )
    assert [m.id for m in before] == ["x"]
    assert (
        await store.recall_memory(
            namespace="ns", query="fact", tags=[], scope=None, limit=8, now=3.0
        )
        == []
    )
