"""The CLI reads cleanly (issue 24): ids are never cut, an entry shows its name, notes on
stderr come after the table and once, ``runs journal`` shows the interrupts a run asked in
journal order, and a paused run has no "finished" time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agency_runtime import agency, approve
from agency_runtime.cli import main

ROOT = Path(__file__).resolve().parents[1]
LONG_ID = "order-2026-12-03-customer-0042-refund-requested-by-phone"


@agency.entry
async def a_rather_long_entry_name_for_billing(item: str) -> str:
    async def body(s: agency.ResumableScope) -> str:  # type: ignore[name-defined]
        return str(await s.step(lambda: f"reserved {item}", name="reserve"))

    reserved = await agency.with_resumable_scope("order", body)
    first = await agency.interrupt("confirm", f"ship {item}?")
    second = await agency.interrupt("invoice", "send the invoice?")
    return f"{reserved} / {first.type} / {second.type}"


@pytest.fixture
def url(tmp_path: Path) -> str:
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    entry = a_rather_long_entry_name_for_billing
    paused = agency.run_sync(entry, "tea", run_id=LONG_ID, store=store)
    assert paused.status == "paused"
    agency.run_sync(entry, "tea" * 40, run_id="short", store=store)
    return store


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_list_never_cuts_an_id_and_shows_the_entry_by_name(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "runs", "list", "--store", url)
    assert code == 0
    rows = out.splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["short", LONG_ID]
    assert all("a_rather_long_entry_name_for_billing" in row for row in rows), out
    assert "tests.test_cli_reads" not in out  # the module is in `runs show`


def test_runs_journal_shows_the_interrupts_in_journal_order(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record = anyio.run(lambda: agency.runs.get(LONG_ID, store=url))
    (pending,) = record.interrupts
    done = anyio.run(
        lambda: agency.respond_to_interrupts(record, {pending.interrupt_id: approve()})
    )
    assert done.status == "paused"
    code, out, _ = _cli(capsys, "runs", "journal", LONG_ID, "--store", url)
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [int(row[0]) for row in rows] == list(range(1, len(rows) + 1))  # no gaps
    asked = [pending.interrupt_id, done.interrupts[0].interrupt_id]
    assert [row[1] for row in rows] == ["order/0", *asked]
    assert rows[1][2:5] == ["interrupt", "confirm", "approve"]
    assert rows[2][2:5] == ["interrupt", "invoice", "pending"]


def test_a_paused_run_has_no_finished_time(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "runs", "show", LONG_ID, "--store", url)
    assert code == 0
    labels = [line.split()[0] for line in out.splitlines() if line and not line[0].isspace()]
    assert "paused" in labels
    assert "finished" not in labels
    assert "duration" not in labels


def test_the_shortened_note_comes_after_the_table_on_its_own_line_once(url: str) -> None:
    """Both streams into one pipe, as a user's `2>&1 | less` or a CI log has them."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "agency_runtime", "runs", "journal", "short", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    note = "(long cells are shortened; --json shows all)"
    assert lines[-1] == note, done.stdout
    assert done.stdout.count("shortened") == 1
