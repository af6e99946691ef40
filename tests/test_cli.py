"""The ``agency`` command line (in-process, and as ``python -m agency_runtime``), and the trust
model of the store it relies on: a stored run is continued only with a declared entry."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import types
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import (
    EntryImportError,
    EntryNotAllowedError,
    InvalidArgumentError,
    MemoryStore,
    ResumableScope,
    RunRecord,
    SqliteStore,
    Store,
    agency,
    approve,
)
from agency_runtime._boundary._runtime import RUNTIME
from agency_runtime.cli import main
from tests.forked import ForkServer

# -- module-level entries (importable by module:qualname) ------------------------------------

STEPS: Counter[str] = Counter()
FLAKY = {"fail": True}


def _work(name: str) -> str:
    STEPS[name] += 1
    return name


async def ordering(item: str) -> dict[str, Any]:
    """Reserve (a step), ask a human, then charge (a step)."""

    async def body(s: ResumableScope) -> dict[str, Any]:
        stock = await s.step(lambda: _work("reserve"), name="reserve")
        answer = await agency.interrupt("approve", f"Buy {item}?", data={"stock": 3})
        if not answer.approved:
            return {"status": "rejected", "why": answer.value}
        charged = await s.step(lambda: _work("charge"), name="charge")
        return {"status": "bought", "stock": stock, "charged": charged, "note": answer.value}

    return await agency.with_resumable_scope("order", body)


async def three_steps(item: str) -> list[str]:
    """Three counted steps, for forks."""

    async def body(s: ResumableScope) -> list[str]:
        return [
            await s.step(lambda: _work("a"), name="a"),
            await s.step(lambda: _work("b"), name="b"),
            await s.step(lambda: _work("c"), name="c"),
        ]

    return await agency.with_resumable_scope("three", body)


def adds(a: int, b: int) -> int:
    """A run that completes at once."""
    agency.add_cost(0.0012)
    return a + b


def flaky(item: str) -> str:
    """Fails while FLAKY["fail"] is set."""
    if FLAKY["fail"]:
        raise ValueError(f"no stock for {item}")
    return f"shipped {item}"


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch) -> None:
    STEPS.clear()
    FLAKY["fail"] = True
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the cwd to sys.path


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def runs(url: str) -> dict[str, str]:
    """A completed, a failed and a paused run in the store; their ids by kind."""
    assert agency.run_sync(adds, 2, 3, run_id="done-1", store=url).status == "completed"
    assert agency.run_sync(flaky, "tea", run_id="failed-1", store=url).status == "failed"
    paused = agency.run_sync(ordering, "tea", run_id="paused-1", store=url)
    assert paused.status == "paused"
    assert STEPS == {"reserve": 1}
    return {"done": "done-1", "failed": "failed-1", "paused": "paused-1"}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- reading ---------------------------------------------------------------------------------


def test_list_table_and_json(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "runs", "list", "--store", url)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == [
        "run",
        "id",
        "status",
        "entry",
        "attempts",
        "cost",
        "tokens",
        "created",
    ]
    assert len(rows) == 3
    done = next(r for r in rows if r.startswith("done-1"))
    assert "completed" in done
    assert " adds " in done  # the entry by name; `runs show` has the whole reference
    assert "$0.001200" in done

    code, out, _ = run_cli(capsys, "--json", "runs", "list", "--store", url, "--status", "paused")
    assert code == 0
    listed = json.loads(out)
    assert [r["run_id"] for r in listed] == ["paused-1"]
    assert listed[0]["interrupts"][0]["effect"] == "approve"

    code, out, _ = run_cli(capsys, "runs", "list", "--store", url, "--json", "--limit", "1")
    assert code == 0
    assert len(json.loads(out)) == 1


def test_list_of_an_empty_store(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    agency.run_sync(adds, 1, 1, run_id="only", store=url)
    code, out, _ = run_cli(capsys, "runs", "list", "--store", url, "--status", "failed")
    assert code == 0
    assert "no failed runs" in out


def test_show(url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "runs", "show", "paused-1", "--store", url)
    assert code == 0
    assert "status     paused" in out
    assert '"tea"' in out
    assert "pending interrupts (1):" in out
    assert "intr_" in out
    assert "Buy tea?" in out
    assert '"stock":3' in out

    code, out, _ = run_cli(capsys, "runs", "show", "done-1", "--store", url)
    assert code == 0
    assert "value" in out
    assert "5" in out
    assert "$0.001200" in out

    code, out, _ = run_cli(capsys, "runs", "show", "failed-1", "--store", url)
    assert "ValueError: no stock for tea" in out

    code, out, _ = run_cli(capsys, "runs", "show", "done-1", "--store", url, "--json")
    assert json.loads(out)["value"] == 5


def test_journal(url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "runs", "journal", "paused-1", "--store", url)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["seq", "path", "name", "result", "run", "cost"]
    assert len(rows) == 2  # the step, then the interrupt the run paused on
    assert rows[0].split()[:4] == ["1", "order/0", "reserve", '"reserve"']
    assert rows[1].split()[0] == "2"
    assert rows[1].split()[2:5] == ["interrupt", "approve", "pending"]

    code, out, _ = run_cli(capsys, "runs", "journal", "paused-1", "--store", url, "--json")
    assert [e["name"] for e in json.loads(out)] == ["reserve"]


def test_journal_previews_long_results(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def long(s: ResumableScope) -> str:
        return await s.step(lambda: "x" * 500, name="long")

    async def entry() -> str:
        return await agency.with_resumable_scope("s", long)

    agency.run_sync(entry, run_id="long-1", store=url)
    _, out, _ = run_cli(capsys, "runs", "journal", "long-1", "--store", url)
    preview = out.splitlines()[1].split()[3]
    assert len(preview) == 60
    assert preview.endswith("…")


def test_journal_pages_with_after_and_limit(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    async def five(s: ResumableScope) -> int:
        for index in range(5):
            await s.step(lambda i=index: i, name=f"n{index}")  # type: ignore[misc]
        return 5

    async def entry() -> int:
        return await agency.with_resumable_scope("five", five)

    agency.run_sync(entry, run_id="five-1", store=url)
    code, out, err = run_cli(capsys, "runs", "journal", "five-1", "--limit", "2", "--store", url)
    assert code == 0
    assert [row.split()[2] for row in out.splitlines()[1:]] == ["n0", "n1"]
    assert "(more steps: agency runs journal five-1 --after 2 --limit 2)" in err
    code, out, err = run_cli(
        capsys, "runs", "journal", "five-1", "--after", "2", "--limit", "2", "--store", url
    )
    assert [row.split()[2] for row in out.splitlines()[1:]] == ["n2", "n3"]
    code, out, err = run_cli(capsys, "runs", "journal", "five-1", "--after", "4", "--store", url)
    assert [row.split()[2] for row in out.splitlines()[1:]] == ["n4"]
    assert "more steps" not in err
    code, _, err = run_cli(capsys, "runs", "journal", "five-1", "--limit", "0", "--store", url)
    assert code == 2
    assert "--limit" in err


# -- answering and resuming ------------------------------------------------------------------


def test_respond_approve_continues_without_rerunning_steps(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "runs", "respond", "paused-1", "--approve", '{"by": "sam"}', "--store", url
    )
    assert code == 0, err
    assert "resuming paused-1…" in err
    assert "run paused-1: completed" in out
    assert '"note":{"by":"sam"}' in out
    assert STEPS == {"reserve": 1, "charge": 1}  # reserve did not run again

    _, out, _ = run_cli(capsys, "runs", "show", "paused-1", "--store", url, "--json")
    assert json.loads(out)["value"]["status"] == "bought"


def test_respond_reject_with_a_string_value(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        capsys, "runs", "respond", "paused-1", "--reject", "too pricey", "--store", url, "--json"
    )
    assert code == 0
    result = json.loads(out)
    assert result["status"] == "completed"
    assert result["value"] == {"status": "rejected", "why": "too pricey"}
    assert STEPS == {"reserve": 1}


def test_respond_with_answers_json(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    record = agency.run_sync(ordering, "tea", run_id="paused-1", store=url)
    (pending,) = record.interrupts
    answers = json.dumps({pending.interrupt_id: {"type": "approve", "value": 3}})
    code, out, err = run_cli(
        capsys,
        "runs",
        "respond",
        "paused-1",
        "--answers",
        answers,
        "--interrupt",
        pending.interrupt_id,
        "--store",
        url,
    )
    assert code == 0, err
    assert '"note":3' in out


def test_respond_to_a_run_that_is_not_paused(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "runs", "respond", "done-1", "--approve", "--store", url)
    assert code == 1
    assert out == ""
    assert err == "agency: error: run 'done-1' is completed, not paused, so it has no " + (
        "interrupts to answer\n"
    )


@pytest.mark.parametrize(
    ("answers", "code", "message"),
    [
        ("{not json", 2, "--answers is not JSON"),
        ("[1, 2]", 2, "--answers must be a JSON object"),
        ('{"intr_nope": {"type": "approve"}}', 1, "has no pending interrupt 'intr_nope'"),
        ('{"intr_x": {"type": "maybe"}}', 1, "the answer for intr_x"),
    ],
)
def test_respond_with_bad_answers(
    url: str,
    runs: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    answers: str,
    code: int,
    message: str,
) -> None:
    got, _, err = run_cli(
        capsys, "runs", "respond", "paused-1", "--answers", answers, "--store", url
    )
    assert got == code
    assert message in err
    assert "Traceback" not in err
    assert agency.run_sync(ordering, "tea", run_id="paused-1", store=url).status == "paused"


def test_respond_to_an_unknown_interrupt(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "runs", "respond", "paused-1", "--approve", "--interrupt", "intr_0", "--store", url
    )
    assert code == 1
    assert "has no pending interrupt 'intr_0'; pending: intr_" in err


def test_respond_needs_an_answer(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "runs", "respond", "paused-1", "--store", url)
    assert code == 2
    assert "one of the arguments --approve --reject --answers is required" in err


@agency.entry
async def fails_in_a_step(item: str) -> str:
    async def body(s: ResumableScope) -> str:
        return await s.step(lambda: flaky(item), name="pick")

    return await agency.with_resumable_scope("stock", body)


def test_show_names_the_step_a_failed_run_failed_in(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agency.run_sync(fails_in_a_step, "tea", run_id="f-2", store=url).status == "failed"
    code, out, _ = run_cli(capsys, "runs", "show", "f-2", "--store", url)
    assert code == 0
    assert "ValueError: no stock for tea" in out
    assert "pick at stock/0" in out


def test_resume_a_failed_run_whose_entry_now_succeeds(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "runs", "resume", "failed-1", "--store", url)
    assert code == 1  # it failed again
    assert "resuming failed-1…" in err
    assert "run failed-1: failed" in out
    assert "error: ValueError: no stock for tea" in out

    FLAKY["fail"] = False
    code, out, err = run_cli(capsys, "runs", "resume", "failed-1", "--store", url)
    assert code == 0, err
    assert "run failed-1: completed" in out
    assert 'value: "shipped tea"' in out


def test_resume_a_paused_run_says_how_to_answer(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "runs", "resume", "paused-1", "--store", url)
    assert code == 0
    assert "run paused-1: paused on 1 interrupt(s)" in out
    assert "agency runs respond paused-1 --approve" in out
    assert STEPS == {"reserve": 1}


def test_cancel(url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "runs", "cancel", "paused-1", "--store", url)
    assert code == 0
    assert out == "run paused-1 cancelled\n"
    code, out, _ = run_cli(capsys, "runs", "cancel", "done-1", "--store", url)
    assert code == 0
    assert "completed already" in out
    code, _, err = run_cli(capsys, "runs", "respond", "paused-1", "--approve", "--store", url)
    assert code == 1
    assert "is cancelled, not paused" in err


def test_fork_and_resume_the_fork(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    agency.run_sync(three_steps, "tea", run_id="three-1", store=url)
    assert STEPS == {"a": 1, "b": 1, "c": 1}
    code, out, _ = run_cli(
        capsys, "runs", "fork", "three-1", "three/0", "--new-id", "three-2", "--store", url
    )
    assert code == 0
    assert out == "three-2\n"
    code, out, err = run_cli(capsys, "runs", "resume", "three-2", "--store", url)
    assert code == 0, err
    assert "run three-2: completed" in out
    assert STEPS == {"a": 1, "b": 2, "c": 2}  # the steps after the fork point ran again

    code, out, _ = run_cli(capsys, "runs", "fork", "three-1", "three/1", "--store", url, "--json")
    assert json.loads(out)["run_id"].startswith("three-1-fork-")
    code, _, err = run_cli(capsys, "runs", "fork", "three-1", "nowhere/9", "--store", url)
    assert code == 1
    assert "has no completed step 'nowhere/9'" in err


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["runs", "show", "ghost"],
        ["runs", "journal", "ghost"],
        ["runs", "resume", "ghost"],
        ["runs", "respond", "ghost", "--approve"],
        ["runs", "cancel", "ghost"],
        ["runs", "fork", "ghost", "a/0"],
    ],
)
def test_unknown_run(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run_cli(capsys, *argv, "--store", url)
    assert code == 1
    assert out == ""
    assert err.startswith("agency: error: no run with id 'ghost'")
    assert err.count("\n") == 1


def test_store_from_the_environment_and_missing_stores(
    url: str,
    runs: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, _, err = run_cli(capsys, "runs", "list")
    assert code == 1
    assert "no store at" in err
    assert not Path(".agency").exists()  # not created by looking
    code, _, err = run_cli(capsys, "runs", "list", "--store", "mysql://x")
    assert code == 1
    assert "unknown store URL scheme" in err
    monkeypatch.setenv("AGENCY_STORE", url)
    code, out, _ = run_cli(capsys, "runs", "list")
    assert code == 0
    assert "paused-1" in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(capsys, "runs", "list", "--limit", "0")[0] == 2
    assert run_cli(capsys, "runs", "list", "--status", "sleeping")[0] == 2
    assert run_cli(capsys, "runs", "explode")[0] == 2
    assert run_cli(capsys)[0] == 2
    code, out, _ = run_cli(capsys, "runs", "--help")
    assert code == 0
    assert "respond" in out


def test_keyboard_interrupt_exits_130(
    url: str,
    runs: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(agency, "resume", interrupted)
    code, _, err = run_cli(capsys, "runs", "resume", "failed-1", "--store", url)
    assert code == 130
    assert "interrupted" in err


# -- JSON output -----------------------------------------------------------------------------


def _assert_plain(value: Any, where: str = "$") -> None:
    """No JSON text hides inside the JSON output: every container is a real one."""
    if isinstance(value, dict):
        for key, item in value.items():
            _assert_plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _assert_plain(item, f"{where}[{index}]")
    elif isinstance(value, str) and value.strip()[:1] in ("{", "[", '"'):
        try:
            json.loads(value)
        except ValueError:
            return
        raise AssertionError(f"{where} is a JSON text inside the JSON output: {value[:80]!r}")


async def _noted(s: ResumableScope) -> dict[str, Any]:
    s.set_local("seen", ["tea", 2])

    def note() -> dict[str, Any]:
        agency.thread.user("a note for the thread")
        return {"noted": True, "items": [1, 2]}

    return await s.step(note, name="note")


async def noting() -> dict[str, Any]:
    """One step with locals and a thread message (so the journal has every JSON field)."""
    return await agency.with_resumable_scope("noting", _noted)


def test_json_output_is_plain_nested_json(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    agency.run_sync(noting, run_id="noted-1", store=url)
    outputs: dict[str, Any] = {}
    for name, argv in {
        "list": ["runs", "list"],
        "show": ["runs", "show", "done-1"],
        "journal": ["runs", "journal", "noted-1"],
        "resume": ["runs", "resume", "failed-1"],
        "cancel": ["runs", "cancel", "paused-1"],
    }.items():
        _code, out, _ = run_cli(capsys, *argv, "--store", url, "--json")
        outputs[name] = json.loads(out)
        _assert_plain(outputs[name], name)

    shown = outputs["show"]
    assert shown["arguments"] == {"args": [2, 3], "kwargs": {}}
    assert shown["value"] == 5
    assert shown["cost_usd"] == 0.0012
    assert "cost_pico" not in shown
    assert shown["created_at"].endswith("Z")  # ISO 8601, UTC
    (step,) = outputs["journal"]
    assert step["result"] == {"noted": True, "items": [1, 2]}
    assert step["locals"] == {"seen": ["tea", 2]}
    assert isinstance(step["deltas"], list)
    assert step["deltas"]
    assert isinstance(step["cost_usd"], float)
    assert outputs["resume"]["status"] == "failed"
    assert "cost_usd" in outputs["resume"]
    assert "cost" not in outputs["resume"]
    assert outputs["cancel"]["status"] == "cancelled"
    assert {r["run_id"] for r in outputs["list"]} == {"done-1", "failed-1", "paused-1", "noted-1"}


def test_errors_are_json_in_json_mode(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "runs", "show", "ghost", "--store", url, "--json")
    assert code == 1
    assert err == ""
    error = json.loads(out)["error"]
    assert error["type"] == "RunNotFoundError"
    assert error["message"].startswith("no run with id 'ghost'")

    code, out, _ = run_cli(capsys, "--json", "runs", "list", "--store", "sqlite:///nowhere/x.db")
    assert code == 1
    assert json.loads(out)["error"]["type"] == "StoreUnavailableError"

    code, out, _ = run_cli(
        capsys, "runs", "respond", "paused-1", "--answers", "{nope", "--store", url, "--json"
    )
    assert code == 2
    assert json.loads(out)["error"]["type"] == "UsageError"


# -- tables ----------------------------------------------------------------------------------


def test_tables_shorten_cells_but_never_an_id(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    def long_named(n: int) -> int:
        return n

    long_named.__qualname__ = "an_entry_whose_qualified_name_goes_on_" + "and_on_" * 12
    long_id = "conversation-" + "x" * 150 + "-message-42"
    agency.run_sync(long_named, 1, run_id=long_id, store=url)

    async def deep(s: ResumableScope) -> str:
        return await s.step(lambda: "y" * 300, name="a_step_with_a_very_long_name_" * 4)

    async def nested() -> str:
        return await agency.with_resumable_scope("outer_scope_with_a_long_name_" * 3, deep)

    agency.run_sync(nested, run_id="nested-1", store=url)

    code, out, err = run_cli(capsys, "runs", "list", "--store", url)
    assert code == 0
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("conversa"))
    assert row.split()[0] == long_id  # whole: it is what the other commands take
    entry = row.split()[2]
    assert entry.startswith("…")  # the entry's name, shortened
    assert len(entry) == 40
    assert "--json shows all" in err
    short = next(line for line in lines if line.startswith("nested-1"))
    assert len(short) <= 100 + len(long_id)  # only the ids make a table wider

    code, out, _ = run_cli(capsys, "runs", "journal", "nested-1", "--store", url)
    assert code == 0
    path = "outer_scope_with_a_long_name_" * 3 + "/0"
    assert out.splitlines()[1].split()[1] == path  # a step path is never cut either
    assert max(len(line) for line in out.splitlines()) <= 100 + len(path)
    assert "…" in out

    code, out, _ = run_cli(capsys, "runs", "show", long_id, "--store", url)
    assert code == 0
    shown = [line for line in out.splitlines() if not line.startswith(("run ", "entry "))]
    assert max(len(line) for line in shown) <= 100  # the identity lines are shown in full


# -- pages -----------------------------------------------------------------------------------


def test_list_pages_with_offset_and_limit(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    for index in range(5):
        agency.run_sync(adds, index, 0, run_id=f"p{index}", store=url)
    agency.run_sync(flaky, "tea", run_id="f0", store=url)

    def page(*argv: str) -> list[str]:
        code, out, _ = run_cli(capsys, "runs", "list", "--store", url, "--json", *argv)
        assert code == 0
        return [r["run_id"] for r in json.loads(out)]

    assert page("--limit", "2", "--offset", "1") == ["p4", "p3"]
    pages = [page("--limit", "2", "--offset", str(start)) for start in (0, 2, 4, 6)]
    assert pages == [["f0", "p4"], ["p3", "p2"], ["p1", "p0"], []]
    assert page("--status", "completed", "--offset", "3") == ["p1", "p0"]
    code, out, err = run_cli(capsys, "runs", "list", "--store", url, "--limit", "2")
    assert code == 0
    assert "the next: --offset 2" in err
    code, out, _ = run_cli(capsys, "runs", "list", "--store", url, "--offset", "9")
    assert "no runs after the first 9" in out


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_pages_are_stable_for_runs_created_at_the_same_instant(
    kind: str, tmp_path: Path
) -> None:
    store: Store = MemoryStore() if kind == "memory" else SqliteStore(tmp_path / "same.db")
    try:
        for index in range(7):
            record = RunRecord(
                run_id=f"r{index}", status="running", entry="m:f", arguments="{}", created_at=1e9
            )
            await store.claim_run(record, owner="o", lease_seconds=30)
        seen = [
            r.run_id
            for start in range(0, 7, 3)
            for r in await agency.runs.list(store=store, limit=3, offset=start)
        ]
    finally:
        if isinstance(store, SqliteStore):
            store.close()
    assert seen == [f"r{index}" for index in reversed(range(7))]  # newest first, no overlap


@pytest.mark.parametrize(
    "argv",
    [
        ["--limit", "0"],
        ["--limit", "1" + "0" * 29],
        ["--limit", "ten"],
        ["--offset", "-1"],
        ["--offset", "9" * 30],
    ],
)
def test_bad_page_values_are_usage_errors(
    url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, out, err = run_cli(capsys, "runs", "list", "--store", url, *argv)
    assert code == 2
    assert out == ""
    assert f"argument {argv[0]}" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "options",
    [
        {"limit": 0},
        {"limit": 10**30},
        {"limit": True},
        {"limit": 2.5},
        {"offset": -1},
        {"offset": 10**30},
        {"status": "sleeping"},
    ],
)
@pytest.mark.anyio
async def test_bad_page_values_are_invalid_arguments(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        await agency.runs.list(store=MemoryStore(), **options)


# -- a closed pipe ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(url: str, runs: dict[str, str]) -> None:
    async def many() -> None:
        for index in range(150):
            await agency.run(adds, index, 1, run_id=f"many-{index:03}", store=url)

    anyio.run(many)
    command = [sys.executable, "-m", "agency_runtime", "runs", "list", "--store", url]
    for extra in ([], ["--json", "--limit", "1000"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte is written
        try:
            done = subprocess.run(
                [*command, *extra],
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
                check=False,
            )
        finally:
            os.close(write)
        assert done.returncode in (0, 141), done.stderr
        assert "Traceback" not in done.stderr
        assert "Exception ignored" not in done.stderr

    piped = subprocess.run(
        f"{_quote(command)} --json --limit 1000 | head -c 100",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert len(piped.stdout) == 100
    assert "Traceback" not in piped.stderr
    assert "Exception ignored" not in piped.stderr


def _quote(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


# -- the store is data, never code -----------------------------------------------------------


def _edit_row(url: str, run_id: str, **columns: str) -> None:
    """Change a stored run behind the runtime's back, as anyone with the file could."""
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn, conn:
        sets = ", ".join(f"{name} = ?" for name in columns)
        conn.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", (*columns.values(), run_id))


def _as_os_system(url: str, run_id: str, marker: Path) -> None:
    command = json.dumps({"args": [f"touch {marker}"], "kwargs": {}})
    _edit_row(url, run_id, entry="os:system", arguments=command)


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENCY_")}
    env.pop("PYTHONPATH", None)
    return {**env, **extra}


# A new process for each command: forked by the fork server (tests/forked.py), set up as
# ``python -m agency_runtime ...`` / ``python -c ...`` would be. ``python -m agency_runtime``
# and the console script themselves are run as real interpreters below.


def _agency(
    server: ForkServer, *argv: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return server.run(
        "module",
        "agency_runtime",
        *argv,
        timeout=120,
        cwd=cwd,
        env=env if env is not None else _child_env(),
    )


def _python(
    server: ForkServer, code: str, *, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    done = server.run("code", code, timeout=120, cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.anyio
async def test_resume_refuses_a_stored_os_system_entry(
    url: str, runs: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    _as_os_system(url, "failed-1", marker)
    with pytest.raises(EntryNotAllowedError, match="not importing 'os'") as caught:
        await agency.resume("failed-1", store=url)
    assert "'os:system'" in str(caught.value)
    assert "standard-library" in str(caught.value)

    _as_os_system(url, "paused-1", marker)
    record = await agency.runs.get("paused-1", store=url)
    with pytest.raises(EntryNotAllowedError):
        await agency.respond_to_interrupts(record.interrupts, [approve()], store=url)
    assert not marker.exists()
    assert (await agency.runs.get("failed-1", store=url)).status == "failed"


@pytest.mark.parametrize(
    "ref",
    [
        "os:system",
        "subprocess:call",
        "shutil:rmtree",
        "pydantic_core:from_json",
        "agency_runtime._durable._entries:location_ref",  # our own module, not a declared entry
        "/nonexistent-app/evil.py:main",  # a script outside the working directory
        "tests.test_cli:_edit_row",  # never run here, never declared
    ],
)
def test_only_declared_entries_are_taken_from_the_store(ref: str) -> None:
    with pytest.raises(EntryNotAllowedError) as caught:
        RUNTIME.entries.find(f"stored-{ref}", ref)
    assert ref in str(caught.value)


def test_an_entry_this_process_ran_is_found_without_importing(url: str) -> None:
    agency.run_sync(flaky, "tea", run_id="mine-1", store=url)
    assert RUNTIME.entries.find("another-run", "tests.test_cli:flaky") is flaky


_FINAL_APP = """
import pathlib
pathlib.Path(__file__).with_name("imported-final-app").write_text("imported")

def finish(a, b):
    return a + b
"""


def test_a_final_runs_resume_imports_nothing(
    url: str,
    runs: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "trust_final_app.py").write_text(_FINAL_APP)
    monkeypatch.syspath_prepend(str(tmp_path))  # importable, and under the working directory
    run_cli(capsys, "runs", "cancel", "paused-1", "--store", url)
    for run_id in ("done-1", "paused-1"):
        _edit_row(url, run_id, entry="trust_final_app:finish")

    done = anyio.run(lambda: agency.resume("done-1", store=url))
    assert (done.status, done.value, done.replayed) == ("completed", 5, True)
    cancelled = anyio.run(lambda: agency.resume("paused-1", store=url))
    assert cancelled.status == "cancelled"
    for run_id in ("done-1", "paused-1"):
        code, out, err = run_cli(capsys, "runs", "resume", run_id, "--store", url)
        assert code == 0, err
        assert f"run {run_id}: " in out
    assert not (tmp_path / "imported-final-app").exists()
    assert "trust_final_app" not in sys.modules


@pytest.mark.slow
def test_the_cli_refuses_a_stored_os_system_entry_in_a_new_process(
    url: str, runs: dict[str, str], tmp_path: Path, fork_server: ForkServer
) -> None:
    if shutil.which("touch") is None:
        pytest.skip("needs the touch command")
    marker = tmp_path / "pwned"
    _as_os_system(url, "paused-1", marker)
    _as_os_system(url, "failed-1", marker)

    answered = _agency(
        fork_server, "runs", "respond", "paused-1", "--approve", "--store", url, cwd=tmp_path
    )
    assert answered.returncode == 1, answered.stdout + answered.stderr
    assert answered.stderr.startswith("agency: error: not importing 'os'")
    assert "Traceback" not in answered.stderr
    resumed = _agency(
        fork_server, "runs", "resume", "failed-1", "--store", url, "--json", cwd=tmp_path
    )
    assert resumed.returncode == 1
    assert json.loads(resumed.stdout)["error"]["type"] == "EntryNotAllowedError"
    assert not marker.exists()

    async def stored() -> tuple[str, list[Any]]:
        record = await agency.runs.get("paused-1", store=url)
        opened = SqliteStore(url.removeprefix("sqlite:///"))
        try:
            journal = await opened.load_journal("paused-1")
        finally:
            opened.close()
        return record.status, [a.response for a in journal.answers]

    assert anyio.run(stored) == ("paused", [None])  # the refused answer was not stored


_TRUST_APP = """
import pathlib

from agency_runtime import agency

HERE = pathlib.Path(__file__).parent


def _once(name):
    marker = HERE / f"{name}.failed-once"
    if not marker.exists():
        marker.write_text("x")
        raise RuntimeError(f"{name}: the first attempt fails")


def plain(n: int) -> int:
    _once("plain")
    return n + 1


@agency.entry
def declared(n: int) -> int:
    _once("declared")
    return n + 2


def registered(n: int) -> int:
    _once("registered")
    return n + 3


agency.register_entry(registered)


@agency.entry(name="trust-refund")
def named(n: int) -> int:
    _once("named")
    return n + 4
"""

_TRUST_MOVED = """
from agency_runtime import agency


@agency.entry(name="trust-refund")
def refund_moved_here(n: int) -> int:
    return n + 40
"""


@pytest.mark.slow
def test_only_declared_entries_resume_in_a_new_process(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    (tmp_path / "trust_app.py").write_text(_TRUST_APP)
    (tmp_path / "trust_moved.py").write_text(_TRUST_MOVED)
    url = f"sqlite:///{tmp_path / 'app.db'}"
    env = _child_env(AGENCY_STORE=url)
    started = _python(
        fork_server,
        "import trust_app\n"
        "from agency_runtime import agency\n"
        "for name in ('plain', 'declared', 'registered', 'named'):\n"
        "    print(agency.run_sync(getattr(trust_app, name), 1, run_id=name).status)\n",
        cwd=tmp_path,
        env=env,
    )
    assert started.stdout.split() == ["failed"] * 4
    stored = {r.run_id: r.entry for r in anyio.run(lambda: agency.runs.list(store=url))}
    assert stored["named"] == "trust-refund"  # a named entry is recorded by its name
    assert stored["declared"] == "trust_app:declared"

    refused = _agency(fork_server, "runs", "resume", "plain", cwd=tmp_path, env=env)
    assert refused.returncode == 1
    message = refused.stderr
    assert message.startswith("agency: error: the stored entry 'trust_app:plain' is not declared")
    for how in ("@agency.entry", "agency.register_entry", "--import MODULE", "AGENCY_IMPORTS"):
        assert how in message
    for name, value in (("declared", 3), ("registered", 4)):
        done = _agency(fork_server, "runs", "resume", name, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert f"run {name}: completed" in done.stdout
        assert f"value: {value}" in done.stdout

    unnamed = _agency(fork_server, "runs", "resume", "named", cwd=tmp_path, env=env)
    assert unnamed.returncode == 1
    assert "named 'trust-refund'" in unnamed.stderr
    assert "--import MODULE" in unnamed.stderr
    moved = _agency(
        fork_server, "runs", "resume", "named", "--import", "trust_moved", cwd=tmp_path, env=env
    )
    assert moved.returncode == 0, moved.stderr
    assert "value: 41" in moved.stdout  # the name found the function where it lives now


def _runs_on_import(marker: Path) -> str:
    """A top-level line of a module that leaves ``marker`` behind when the module is imported."""
    return f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"


@pytest.mark.slow
def test_a_tampered_entry_under_the_working_directory_is_refused_before_its_module_runs(
    url: str, runs: dict[str, str], tmp_path: Path, fork_server: ForkServer
) -> None:
    """Naming an undeclared function of a file under the working directory makes the CLI run
    nothing of that file: a script with side effects at import is never imported."""
    (tmp_path / "trust_side_effect.py").write_text(
        _runs_on_import(tmp_path / "module.ran") + "def undeclared(item):\n    return item\n"
    )
    (tmp_path / "trust_pkg").mkdir()
    (tmp_path / "trust_pkg" / "__init__.py").write_text(_runs_on_import(tmp_path / "pkg.ran"))
    (tmp_path / "trust_pkg" / "tools.py").write_text(
        _runs_on_import(tmp_path / "tools.ran") + "def wipe(item):\n    return item\n"
    )
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "cleanup.py").write_text(
        _runs_on_import(tmp_path / "script.ran") + "def main(item):\n    return item\n"
    )

    _edit_row(url, "paused-1", entry="trust_side_effect:undeclared")
    answered = _agency(
        fork_server, "runs", "respond", "paused-1", "--approve", "--store", url, cwd=tmp_path
    )
    assert answered.returncode == 1, answered.stdout + answered.stderr
    message = answered.stderr
    assert message.startswith(
        "agency: error: the stored entry 'trust_side_effect:undeclared' is not declared as an "
        f"entry in {tmp_path / 'trust_side_effect.py'}"
    )
    assert "the module was not imported and nothing ran" in message
    for how in ("@agency.entry", "agency.register_entry(fn)", "--import MODULE", "AGENCY_IMPORTS"):
        assert how in message
    assert "Traceback" not in message
    for ref in ("trust_pkg.tools:wipe", f"{tmp_path / 'scripts' / 'cleanup.py'}:main"):
        _edit_row(url, "failed-1", entry=ref)
        resumed = _agency(
            fork_server, "runs", "resume", "failed-1", "--store", url, "--json", cwd=tmp_path
        )
        assert resumed.returncode == 1, resumed.stderr
        error = json.loads(resumed.stdout)["error"]
        assert error["type"] == "EntryNotAllowedError"
        assert f"the stored entry {ref!r} is not declared" in error["message"]
    assert sorted(tmp_path.glob("*.ran")) == []  # not a module, a package or a script ran
    assert anyio.run(lambda: agency.runs.get("paused-1", store=url)).status == "paused"


_SCANNED_APP = """
from agency_runtime import agency


def helper(item: str) -> str:
    return f"helped {item}"


class Shipping:
    @staticmethod
    @agency.entry
    def ship(item: str) -> str:
        return f"shipped {item} from the scanned module"
"""


@pytest.mark.slow
def test_a_module_whose_source_declares_the_entry_is_imported_to_continue_the_run(
    url: str, runs: dict[str, str], tmp_path: Path, fork_server: ForkServer
) -> None:
    """The module is read first: imported for an entry it declares (its top-level code then
    runs, the documented residual risk), not for another function of it."""
    marker = tmp_path / "scanned.ran"
    (tmp_path / "trust_scanned.py").write_text(_runs_on_import(marker) + _SCANNED_APP)

    _edit_row(url, "failed-1", entry="trust_scanned:helper")
    refused = _agency(fork_server, "runs", "resume", "failed-1", "--store", url, cwd=tmp_path)
    assert refused.returncode == 1
    assert "'trust_scanned:helper' is not declared as an entry in" in refused.stderr
    assert not marker.exists()

    _edit_row(url, "failed-1", entry="trust_scanned:Shipping.ship")
    done = _agency(fork_server, "runs", "resume", "failed-1", "--store", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "run failed-1: completed" in done.stdout
    assert 'value: "shipped tea from the scanned module"' in done.stdout
    assert marker.exists()


@pytest.mark.parametrize(
    ("source", "qualname", "declared"),
    [
        ("@agency.entry\ndef job(): ...", "job", True),
        ("@agency.entry(name='refund')\nasync def job(): ...", "job", True),
        ("@entry\ndef job(): ...", "job", True),
        ("def job(): ...\nagency.register_entry(job)", "job", True),
        ("def job(): ...\nregister_entry(job, name='refund')", "job", True),
        ("def job(): ...\njob = agency.entry(job)", "job", True),
        ("class Jobs:\n    @agency.entry\n    def run(self): ...", "Jobs.run", True),
        (
            "try:\n    import x\nexcept ImportError:\n    @agency.entry\n    def job(): ...",
            "job",
            True,
        ),
        ("def job(): ...", "job", False),
        ("@agency.entry\ndef job(): ...\ndef other(): ...", "other", False),
        ("@agency.entry\ndef job(): ...\ndef job(): ...", "job", False),  # redefined plain
        (
            "def job(): ...\nif __name__ == '__main__':\n    agency.register_entry(job)",
            "job",
            False,
        ),
        ("def job(): ...\ndef setup():\n    agency.register_entry(job)", "job", False),
        ("class Jobs:\n    @agency.entry\n    def run(self): ...", "run", False),
        ("@agency.entry\ndef run(): ...", "Jobs.run", False),
    ],
)
def test_the_source_says_whether_a_module_declares_an_entry(
    tmp_path: Path, source: str, qualname: str, declared: bool
) -> None:
    from agency_runtime._durable._entry_source import declares

    path = tmp_path / "app.py"
    path.write_text(source + "\n")  # read, never run: no imports needed
    assert declares(path, qualname) is declared


_OUTSIDE_APP = """
import pathlib

from agency_runtime import agency

HERE = pathlib.Path(__file__).parent


@agency.entry
def job(run: str) -> str:
    marker = HERE / f"{run}.failed-once"
    if not marker.exists():
        marker.write_text("x")
        raise RuntimeError("the first attempt fails")
    return f"{run} done"
"""


@pytest.mark.slow
def test_import_and_agency_imports_name_a_module_outside_the_working_directory(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    library, work = tmp_path / "lib", tmp_path / "work"
    library.mkdir()
    work.mkdir()
    (library / "outside_app.py").write_text(_OUTSIDE_APP)
    url = f"sqlite:///{tmp_path / 'out.db'}"
    env = _child_env(AGENCY_STORE=url, PYTHONPATH=str(library))
    started = _python(
        fork_server,
        "from outside_app import job\n"
        "from agency_runtime import agency\n"
        "for run in ('o-1', 'o-2'):\n"
        "    print(agency.run_sync(job, run, run_id=run).status)\n",
        cwd=work,
        env=env,
    )
    assert started.stdout.split() == ["failed", "failed"]

    refused = _agency(fork_server, "runs", "resume", "o-1", cwd=work, env=env)
    assert refused.returncode == 1
    assert "not importing 'outside_app'" in refused.stderr
    assert "not under the working directory" in refused.stderr
    done = _agency(
        fork_server, "runs", "resume", "o-1", "--import", "outside_app", cwd=work, env=env
    )
    assert done.returncode == 0, done.stderr
    assert 'value: "o-1 done"' in done.stdout

    resume = (
        "import anyio\nfrom agency_runtime import agency\nprint(anyio.run(agency.resume, 'o-2'))"
    )
    with pytest.raises(AssertionError, match="EntryNotAllowedError"):
        _python(fork_server, resume, cwd=work, env=env)
    resumed = _python(
        fork_server, resume, cwd=work, env={**env, "AGENCY_IMPORTS": "json, outside_app"}
    )
    assert "status='completed'" in resumed.stdout
    assert "value='o-2 done'" in resumed.stdout


def test_declaring_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    def refund_a(n: int) -> int:
        return n

    def refund_b(n: int) -> int:
        return n

    assert agency.entry(refund_a) is refund_a  # returned unchanged
    assert agency.entry(name="test-cli-refund")(refund_a) is refund_a
    assert agency.register_entry(refund_a, name="test-cli-refund") is refund_a
    with pytest.raises(InvalidArgumentError, match="declared already"):
        agency.register_entry(refund_b, name="test-cli-refund")
    with pytest.raises(InvalidArgumentError, match="an entry has one name"):
        agency.register_entry(refund_a, name="test-cli-other")
    for bad in ("", "has:colon", "has space", "-dash-first"):
        with pytest.raises(InvalidArgumentError, match="an entry name"):
            agency.register_entry(refund_b, name=bad)
    with pytest.raises(InvalidArgumentError, match="declare a function"):
        agency.entry("refund")  # type: ignore[call-overload]
    assert RUNTIME.entries.find("any-run", "test-cli-refund") is refund_a
    with pytest.raises(EntryNotAllowedError, match="named 'no-such-name'"):
        RUNTIME.entries.find("any-run", "no-such-name")
    monkeypatch.setenv("AGENCY_IMPORTS", "no_such_module_here")
    with pytest.raises(EntryImportError, match="AGENCY_IMPORTS"):
        RUNTIME.entries.find("any-run", "also-no-such-name")


# -- the demo --------------------------------------------------------------------------------


def test_demo_delegates(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str] | None] = []

    def fake_main(argv: list[str] | None = None) -> int:
        seen.append(argv)
        return 3

    fake = types.ModuleType("agency_runtime.demo")
    fake.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agency_runtime.demo", fake)
    assert main(["demo", "--fast", "x"]) == 3
    assert main(["--json", "demo"]) == 3
    assert seen == [["--fast", "x"], []]


def test_demo_missing(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agency_runtime.demo", None)
    code, _, err = run_cli(capsys, "demo")
    assert code == 2
    assert err == (
        "agency: error: the demo is not available in this installation "
        "(the module agency_runtime.demo is missing)\n"
    )


# -- as a program ----------------------------------------------------------------------------


@pytest.mark.slow
def test_python_m_agency_runtime(url: str, runs: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agency_runtime", "runs", "list", "--store", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "paused-1" in done.stdout
    assert "done-1" in done.stdout


@pytest.mark.slow
def test_console_script(url: str, runs: dict[str, str]) -> None:
    script = shutil.which("agency")
    if script is None:
        pytest.skip("the agency console script is not installed (pip install -e .)")
    done = subprocess.run(
        [script, "runs", "show", "done-1", "--store", url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
