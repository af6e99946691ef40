"""The CLI's views of child runs: ``runs list --parent ID``, ``runs tree ID`` and the parent,
depth and children lines of ``runs show``."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agency_runtime import RunRecord, open_store
from agency_runtime._boundary import _admin
from agency_runtime.cli import main

PICO = 10**12
LONG_CHILD = "coordinator-2026/llm#0/round#1/call#0/a-long-researcher-child-run-id-that-stays"


def _run(
    run_id: str,
    at: float,
    *,
    parent: RunRecord | None = None,
    entry: str = "app.agents:coordinator",
    cost: float = 0.0,
    below: float = 0.0,
) -> RunRecord:
    """A run created at ``at`` (a child of ``parent``), which spent ``cost`` dollars, ``below``
    of them in its descendants."""
    tree = {}
    if parent is not None:
        tree = {
            "parent_id": parent.run_id,
            "root_id": parent.root_id or parent.run_id,
            "depth": parent.depth + 1,
        }
    return RunRecord.model_validate(
        {"run_id": run_id, "status": "running", "entry": entry, "arguments": "{}",
         "created_at": at, "cost_pico": int(cost * PICO),
         "descendants_pico": int(below * PICO), **tree}
    )  # fmt: skip


@pytest.fixture
def url(tmp_path: Path) -> str:
    """root ─┬─ LONG_CHILD ── grandchild
             └─ writer (failed)
    and an unrelated run ``solo``."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = open_store(url)
    root = _run("root", 1000.0, cost=0.006, below=0.005)
    research = _run(
        LONG_CHILD, 1001.0, parent=root, entry="app.agents:researcher", cost=0.003, below=0.001
    )
    grandchild = _run("grandchild", 1002.0, parent=research, entry="app.agents:search", cost=0.001)
    writer = _run("writer", 1003.0, parent=root, entry="app.agents:writer", cost=0.002)
    solo = _run("solo", 1004.0)

    async def store_all() -> None:
        for run in (root, research, grandchild, writer, solo):
            claim = await store.claim_run(run, owner="o", lease_seconds=30)
            status = "failed" if run is writer else "completed"
            done = claim.record.model_copy(update={"status": status})
            assert await store.finish_run(done, owner="o")

    anyio.run(store_all)
    return url


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_list_parent_lists_the_direct_children_newest_first(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "runs", "list", "--parent", "root", "--store", url)
    assert code == 0
    rows = out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["writer", LONG_CHILD]  # never cut
    assert "failed" in rows[0]

    code, out, _ = _cli(capsys, "runs", "list", "--parent", "root", "--status", "failed",
                        "--store", url, "--json")  # fmt: skip
    assert code == 0
    (listed,) = json.loads(out)
    assert (listed["run_id"], listed["parent_id"], listed["root_id"]) == ("writer", "root", "root")
    assert listed["depth"] == 1

    code, out, _ = _cli(capsys, "runs", "list", "--parent", "grandchild", "--store", url)
    assert code == 0
    assert out == "run grandchild has no child runs\n"
    code, out, _ = _cli(
        capsys, "runs", "list", "--parent", "root", "--status", "paused", "--store", url
    )
    assert out == "run root has no child paused runs\n"


@pytest.mark.parametrize(
    "argv",
    [["runs", "list", "--parent", "ghost"], ["runs", "tree", "ghost"]],
)
def test_an_unknown_parent_or_tree_is_not_found_in_one_line(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = _cli(capsys, *argv, "--store", url)
    assert code == 1
    assert out == ""
    assert err.startswith("agency: error: no run with id 'ghost'")
    assert "agency runs list --store" in err
    assert err.count("\n") == 1

    code, out, err = _cli(capsys, *argv, "--store", url, "--json")
    assert code == 1
    assert json.loads(out)["error"]["type"] == "RunNotFoundError"


def test_runs_tree_indents_each_run_under_its_parent_with_cost_and_own_cost(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(capsys, "runs", "tree", "root", "--store", url)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["run", "id", "status", "entry", "cost", "own", "cost"]
    assert [row.split()[0] for row in rows] == ["root", LONG_CHILD, "grandchild", "writer"]
    indents = [len(row) - len(row.lstrip()) for row in rows]
    assert indents == [0, 2, 4, 2]
    assert rows[0].split()[1:] == ["completed", "coordinator", "$0.006000", "$0.001000"]
    assert rows[1].split()[1:] == ["completed", "researcher", "$0.003000", "$0.002000"]
    assert rows[2].split()[1:] == ["completed", "search", "$0.001000", "$0.001000"]
    assert rows[3].split()[1:] == ["failed", "writer", "$0.002000", "$0.002000"]
    assert err == ""

    # A subtree: indented from its own top, whatever its depth.
    code, out, _ = _cli(capsys, "runs", "tree", LONG_CHILD, "--store", url)
    assert code == 0
    assert [row[:12] for row in out.splitlines()[1:]] == [LONG_CHILD[:12], "  grandchild"]
    code, out, _ = _cli(capsys, "runs", "tree", "solo", "--store", url)
    assert len(out.splitlines()) == 2


def test_runs_tree_json_is_the_records_in_tree_order(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "--json", "runs", "tree", "root", "--store", url)
    assert code == 0
    tree = json.loads(out)
    assert [(r["run_id"], r["depth"]) for r in tree] == [
        ("root", 0),
        (LONG_CHILD, 1),
        ("grandchild", 2),
        ("writer", 1),
    ]
    top = tree[0]
    assert (top["cost_usd"], top["descendants_usd"], top["own_cost_usd"]) == (0.006, 0.005, 0.001)
    assert tree[2]["root_id"] == "root"
    assert tree[2]["parent_id"] == LONG_CHILD
    assert not any(key.endswith("_pico") for r in tree for key in r)


def test_runs_tree_beyond_the_bound_is_one_line(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_admin, "MAX_TREE_RUNS", 3)
    code, out, err = _cli(capsys, "runs", "tree", "root", "--store", url)
    assert code == 1
    assert out == ""
    assert err.startswith("agency: error: run 'root' has more than")
    assert "agency runs list --parent ID" in err
    assert err.count("\n") == 1


def test_runs_show_says_parent_depth_children_and_own_cost_when_they_apply(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "runs", "show", LONG_CHILD, "--store", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[:5] == [
        f"run        {LONG_CHILD}",
        "status     completed",
        "parent     root",
        "depth      1",
        "children   1",
    ]
    assert "cost       $0.003000" in lines
    assert "own cost   $0.002000" in lines

    code, out, _ = _cli(capsys, "runs", "show", "root", "--store", url)
    assert "children   2" in out.splitlines()
    assert "parent" not in out
    assert "depth" not in out

    code, out, _ = _cli(capsys, "runs", "show", "solo", "--store", url)
    for absent in ("parent", "depth", "children", "own cost"):
        assert absent not in out

    code, out, _ = _cli(capsys, "runs", "show", "grandchild", "--store", url)
    lines = out.splitlines()
    assert f"parent     {LONG_CHILD}" in lines  # an id is never cut
    assert "depth      2" in lines
    assert "own cost" not in out  # nothing below it
    assert not any(line.startswith("children") for line in lines)


def test_runs_show_counts_many_children_up_to_a_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agency_runtime import cli

    url = f"sqlite:///{tmp_path / 'many.db'}"
    store = open_store(url)
    parent = _run("p", 1000.0)

    async def store_all() -> None:
        await store.claim_run(parent, owner="o", lease_seconds=30)
        for n in range(4):
            kid = _run(f"k{n}", 1001.0 + n, parent=parent).model_copy(
                update={"status": "queued", "queue": "q"}
            )
            await store.enqueue_run(kid)

    anyio.run(store_all)
    monkeypatch.setattr(cli, "SHOWN_CHILDREN", 3)
    _code, out, _ = _cli(capsys, "runs", "show", "p", "--store", url)
    assert "children   over 3" in out.splitlines()
    monkeypatch.setattr(cli, "SHOWN_CHILDREN", 4)
    _code, out, _ = _cli(capsys, "runs", "show", "p", "--store", url)
    assert "children   4" in out.splitlines()
