"""The ``agency`` command line, called in-process (and once as ``python -m agency_runtime``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agency_runtime import ResumableScope, agency
from agency_runtime.cli import main

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
    assert "tests.test_cli:adds" in done
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
    assert json.loads(out)["value"] == "5"


def test_journal(url: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "runs", "journal", "paused-1", "--store", url)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["seq", "path", "name", "result", "run", "cost"]
    assert len(rows) == 1
    assert rows[0].split()[:4] == ["1", "order/0", "reserve", '"reserve"']

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
    assert json.loads(json.loads(out)["value"])["status"] == "bought"


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
        ("{not json", 2, "--answers is not valid JSON"),
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
