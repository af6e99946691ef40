"""The command line's input errors and damaged rows (DESIGN §11.1): every bad input is one
error line (exit 2 for a usage error, 1 for the rest), never a traceback; numbers are bounded
before anything is stored; a damaged row damages only itself."""

from __future__ import annotations

import json
import sqlite3
import sys
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from agency_runtime import ResumableScope, Worker, agency
from agency_runtime.cli import main


@agency.entry
def adds(a: int, b: int) -> int:
    return a + b


async def one_step() -> str:
    async def body(s: ResumableScope) -> str:
        return await s.step(lambda: "x", name="a")

    return await agency.with_resumable_scope("scope", body)


@pytest.fixture(autouse=True)
def _own_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the cwd to sys.path


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture
def url(db: Path) -> str:
    agency.run_sync(adds, 1, 2, run_id="good", store=f"sqlite:///{db}")
    return f"sqlite:///{db}"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def one_error(err: str) -> str:
    """The one error line of ``err`` (argparse may print its usage lines above it)."""
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


def edit(db: Path, sql: str) -> None:
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(sql)


# -- damaged rows ----------------------------------------------------------------------------


def test_runs_list_shows_a_damaged_run_and_goes_on(
    db: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agency.run_sync(adds, 3, 4, run_id="bad", store=url)
    edit(db, "UPDATE runs SET status = 'bogus' WHERE run_id = 'bad'")
    code, out, err = cli(capsys, "runs", "list", "--store", url)
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["bad"][1] == "damaged"
    assert rows["good"][1] == "completed"
    assert "1 damaged run(s): bad" in err

    code, out, _ = cli(capsys, "--json", "runs", "list", "--store", url)
    assert code == 0
    listed = {r["run_id"]: r for r in json.loads(out)}
    assert listed["bad"]["status"] == "damaged"
    assert "is not a run status" in listed["bad"]["damaged"]
    assert listed["good"]["damaged"] is None

    code, out, err = cli(capsys, "runs", "show", "bad", "--store", url)
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("agency: error: the stored row of run 'bad' is damaged: status: 'bogus'")
    assert cli(capsys, "runs", "show", "good", "--store", url)[0] == 0


def test_schedules_list_survives_a_damaged_schedule(
    db: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    anyio.run(lambda: agency.schedules.add("ok", adds, every=60, args=[1, 2], store=url))
    edit(db, "UPDATE schedules SET next_at = 1e308")
    code, out, err = cli(capsys, "schedules", "list", "--store", url)
    assert code == 0
    assert out.splitlines()[1].split()[:2] == ["ok", "damaged"]
    assert "schedule ok is damaged: next_at" in err
    assert cli(capsys, "--json", "schedules", "list", "--store", url)[0] == 0


def test_journal_json_of_a_stored_lone_surrogate(
    db: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    agency.run_sync(one_step, run_id="j", store=url)
    edit(db, "UPDATE steps SET result = '\"\\ud800\"'")
    code, out, _ = cli(capsys, "--json", "runs", "journal", "j", "--store", url)
    assert code == 0
    assert json.loads(out)[0]["result"] == "\ud800"  # escaped: valid JSON, read back the same
    assert cli(capsys, "runs", "journal", "j", "--store", url)[0] == 0


# -- bounded numbers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["schedules", "add", "s", "tests.test_cli_inputs:adds", "--every", "1e308"],
        ["schedules", "add", "s", "tests.test_cli_inputs:adds", "--every", "nan"],
        ["schedules", "add", "s", "tests.test_cli_inputs:adds", "--every", "0.5"],
        ["runs", "list", "--limit", "100000000000000000000000"],
        ["runs", "list", "--offset", "-1"],
        ["runs", "wait", "good", "--timeout", "1e308"],
        ["runs", "wait", "good", "--timeout", "inf"],
        ["worker", "--lease", "1e308"],
        ["worker", "--poll", "nan"],
        ["worker", "--park-after", "1e300"],
        ["worker", "--park-after", "-1"],
        ["worker", "--concurrency", "1000000"],
    ],
)
def test_numbers_past_their_bounds_are_one_usage_error(
    url: str, argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def must_not_start(self: Worker) -> None:
        raise AssertionError("the worker started with a number past its bounds")

    monkeypatch.setattr(Worker, "run", must_not_start)
    code, _, err = cli(capsys, *argv, "--store", url)
    assert code == 2
    option = next(a for a in argv if a.startswith("--"))
    assert option in one_error(err)
    assert cli(capsys, "--json", "schedules", "list", "--store", url)[1].strip() == "[]"


def test_an_every_past_100_years_names_the_bound(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, err = cli(
        capsys, "schedules", "add", "s", "tests.test_cli_inputs:adds", "--every", "1e308",
        "--store", url,
    )  # fmt: skip
    assert "--every must be a number of seconds >= 1 and <= 3155760000 (100 years)" in err


# -- inputs that raised tracebacks -----------------------------------------------------------


def test_a_payload_nested_past_the_parser_is_one_usage_error(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for payload in ("[" * 60_000, "[" * 60_000 + "]" * 60_000):
        code, _, err = cli(
            capsys, "runs", "send", "good", "go", "--payload", payload, "--store", url
        )
        assert code == 2
        assert "--payload is nested too deeply to be read" in one_error(err)
    code, _, err = cli(
        capsys, "schedules", "add", "s", "tests.test_cli_inputs:adds", "--every", "60",
        "--args", "[" * 60_000, "--store", url,
    )  # fmt: skip
    assert code == 2
    assert "--args is nested too deeply" in one_error(err)


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("sqlite:///" + "a" * 5000, "is too long (5000 bytes"),
        ("sqlite:///" + "d/" * 2100 + "x.db", "a path may have at most 4095 bytes"),
        ("postgresql://u:p@[::1/agency", "malformed store URL (Invalid IPv6 URL)"),
        ("sqlite:///\udcff.db", "which is not a character (a lone surrogate"),
    ],
)
def test_unusable_store_urls_are_one_error_line(
    store: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "runs", "list", "--store", store)
    assert code == 1
    assert err.count("\n") == 1
    assert message in err
    assert (
        ":p@" not in err
    )  # a URL that does not parse is not shown: its password could not be masked
