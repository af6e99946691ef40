"""``agency.runs``' views of child runs: ``list(parent=...)`` and ``tree(run_id)``."""

from __future__ import annotations

import pytest

from agency_runtime import (
    InvalidArgumentError,
    ResumableScope,
    RunNotFoundError,
    RunRecord,
    Store,
    agency,
    approve,
)
from agency_runtime._boundary import _admin
from agency_runtime._types import store_of

pytestmark = pytest.mark.anyio


def _run(run_id: str, at: float, parent: RunRecord | None = None) -> RunRecord:
    """A finished run created at ``at``: top-level, or a child of ``parent``."""
    tree = {}
    if parent is not None:
        tree = {
            "parent_id": parent.run_id,
            "root_id": parent.root_id or parent.run_id,
            "depth": parent.depth + 1,
        }
    return RunRecord.model_validate(
        {"run_id": run_id, "status": "running", "entry": "m:f", "arguments": "{}",
         "created_at": at, **tree}
    )  # fmt: skip


async def _store_all(store: Store, runs: list[RunRecord]) -> None:
    for run in runs:
        claim = await store.claim_run(run, owner="o", lease_seconds=30)
        done = claim.record.model_copy(update={"status": "completed"})
        assert await store.finish_run(done, owner="o")


async def _family(store: Store) -> None:
    """root ─┬─ a ─┬─ a1          (created in the order of the letters and numbers,
             │     └─ a2 ── a2x    except that b is older than a2)
             └─ b
    and an unrelated top-level run ``other`` with a child."""
    root = _run("root", 1000.0)
    a = _run("a", 1001.0, root)
    a1 = _run("a1", 1002.0, a)
    b = _run("b", 1003.0, root)
    a2 = _run("a2", 1004.0, a)
    a2x = _run("a2x", 1005.0, a2)
    other = _run("other", 1006.0)
    await _store_all(store, [root, a, a1, b, a2, a2x, other, _run("ox", 1007.0, other)])


async def test_list_with_a_parent_lists_its_direct_children_newest_first(store: Store) -> None:
    await _family(store)
    listed = await agency.runs.list(store=store, parent="root")
    assert [r.run_id for r in listed] == ["b", "a"]
    assert all(store_of(r) is store for r in listed)
    assert [r.run_id for r in await agency.runs.list(store=store, parent="a")] == ["a2", "a1"]
    pages = [await agency.runs.list(store=store, parent="a", limit=1, offset=n) for n in (0, 1)]
    assert [r.run_id for page in pages for r in page] == ["a2", "a1"]
    assert await agency.runs.list(store=store, parent="a1") == []
    assert await agency.runs.list(store=store, parent="nope") == []
    assert await agency.runs.list(store=store, parent="root", status="failed") == []
    assert len(await agency.runs.list(store=store)) == 8  # no parent: every run


@pytest.mark.parametrize("parent", ["", 3, ["root"]])
async def test_a_parent_that_is_no_run_id_is_refused(store: Store, parent: object) -> None:
    with pytest.raises(InvalidArgumentError, match="parent must be a run id"):
        await agency.runs.list(store=store, parent=parent)  # type: ignore[arg-type]


async def test_tree_is_the_run_and_its_descendants_depth_first_in_creation_order(
    store: Store,
) -> None:
    await _family(store)
    tree = await agency.runs.tree("root", store=store)
    assert [(r.run_id, r.depth) for r in tree] == [
        ("root", 0),
        ("a", 1),
        ("a1", 2),
        ("a2", 2),
        ("a2x", 3),
        ("b", 1),
    ]
    assert {r.root_id for r in tree[1:]} == {"root"}
    assert all(store_of(r) is store for r in tree)
    assert [r.run_id for r in await agency.runs.tree("a2", store=store)] == ["a2", "a2x"]
    assert [r.run_id for r in await agency.runs.tree("b", store=store)] == ["b"]


async def test_tree_of_an_unknown_run_is_not_found(store: Store) -> None:
    with pytest.raises(RunNotFoundError, match="nope"):
        await agency.runs.tree("nope", store=store)
    with pytest.raises(InvalidArgumentError, match="run_id must be a non-empty string"):
        await agency.runs.tree("", store=store)


async def test_a_tree_beyond_the_bound_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _family(store)
    monkeypatch.setattr(_admin, "MAX_TREE_RUNS", 6)
    assert len(await agency.runs.tree("root", store=store)) == 6  # exactly the bound
    monkeypatch.setattr(_admin, "MAX_TREE_RUNS", 5)
    with pytest.raises(InvalidArgumentError, match=r"more than 5 runs in its tree.*parent="):
        await agency.runs.tree("root", store=store)


async def test_a_parent_cycle_in_a_damaged_store_ends(store: Store) -> None:
    # "x" names its own child as its parent: a store edited by hand.
    x = _run("x", 1000.0).model_copy(update={"parent_id": "y", "root_id": "y", "depth": 1})
    y = _run("y", 1001.0, x)
    await _store_all(store, [x, y])
    assert [r.run_id for r in await agency.runs.tree("x", store=store)] == ["x", "y"]
    assert [r.run_id for r in await agency.runs.tree("y", store=store)] == ["y", "x"]


# -- a big run's journal, a page at a time --------------------------------------------------


@agency.entry
async def steps_and_questions(n: int) -> int:
    async def body(s: ResumableScope) -> int:
        for index in range(n):
            await s.step(lambda i=index: i, name=f"s{index}")  # type: ignore[misc]
            if index == 2:
                await agency.checkpoint("mid")
        answer = await agency.interrupt("approve", "go on?")
        await s.step(lambda: 99, name="after")
        return n if answer.approved else -1

    return await agency.with_resumable_scope("job", body)


async def test_the_journal_reads_a_page_at_a_time_with_what_happened_among_its_steps(
    store: Store,
) -> None:
    paused = await agency.run(steps_and_questions, 5, run_id="paged", store=store)
    assert paused.status == "paused"
    done = await agency.respond_to_interrupts(paused, [approve()])
    assert done.value == 5
    whole = await store.load_journal("paged")
    seqs = [e.seq for e in whole.entries]
    assert len(seqs) == 6
    pages, after = [], None
    while True:
        page = await store.load_journal_page("paged", after_seq=after, limit=2)
        assert page.size == 6
        pages.append(page)
        if page.next_after is None:
            break
        assert page.next_after == page.entries[-1].seq
        after = page.next_after
    assert [e.seq for p in pages for e in p.entries] == seqs  # every step once, in order
    assert [len(p.entries) for p in pages] == [2, 2, 2]
    # The checkpoint and the interrupt come with the page whose window holds them, once.
    assert [c.seq for p in pages for c in p.checkpoints] == [c.seq for c in whole.checkpoints]
    assert [a.seq for p in pages for a in p.answers] == [a.seq for a in whole.answers]
    assert await store.journal_position("paged", 0) == seqs[0]
    assert await store.journal_position("paged", 5) == seqs[5]
    assert await store.journal_position("paged", 6) is None


async def test_runs_journal_pages_with_after_seq_and_limit(store: Store) -> None:
    await agency.run(steps_and_questions, 5, run_id="paged-api", store=store)
    everything = await agency.runs.journal("paged-api", store=store)
    first = await agency.runs.journal("paged-api", limit=3, store=store)
    rest = await agency.runs.journal("paged-api", after_seq=first[-1].seq, store=store)
    assert first + rest == everything
    with pytest.raises(InvalidArgumentError, match="limit"):
        await agency.runs.journal("paged-api", limit=0, store=store)
    with pytest.raises(InvalidArgumentError, match="after_seq"):
        await agency.runs.journal("paged-api", after_seq=-1, store=store)
