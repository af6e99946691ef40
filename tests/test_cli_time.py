"""The ``agency`` command line for durable time and events: ``runs send``, ``schedules
list|add|remove``, ``worker --park-after`` and how ``runs show`` tells of a parked run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agency_runtime import RunRecord, SqliteStore, agency
from agency_runtime.cli import build_parser, main


@agency.entry(name="cli-time-waiter")
async def waiter() -> Any:
    return await agency.wait_for_event("go")


@agency.entry(name="cli-time-tick")
def tick() -> str:
    return "tick"


@pytest.fixture(autouse=True)
def _path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the cwd to sys.path


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_runs_send_delivers_an_event_the_run_takes(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    anyio.run(lambda: agency.enqueue(waiter, run_id="w", queue="nobody", store=url))
    code, out, _ = run_cli(
        capsys, "runs", "send", "w", "go", "--payload", '{"n": 1}', "--store", url
    )
    assert (code, out.strip()) == (0, "sent 'go' to run w (event 1)")
    code, out, _ = run_cli(capsys, "runs", "send", "w", "go", "--store", url, "--json")
    assert code == 0
    assert json.loads(out)["payload"] == "null"
    result = agency.run_sync(waiter, run_id="w", store=url)
    assert result.value == {"n": 1}  # the oldest first


def test_runs_send_says_what_is_wrong(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    done = agency.run_sync(tick, store=url)
    code, _, err = run_cli(capsys, "runs", "send", "ghost", "go", "--store", url)
    assert code == 1
    assert "no run with id 'ghost'" in err
    code, _, err = run_cli(capsys, "runs", "send", done.run_id, "go", "--store", url)
    assert code == 1
    assert "the run is completed" in err
    code, _, err = run_cli(
        capsys, "runs", "send", done.run_id, "go", "--payload", "{", "--store", url
    )
    assert code == 2
    assert "--payload is not JSON" in err


def test_schedules_add_list_remove(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "schedules", "add", "digest", "cli-time-tick", "--cron", "0 9 * * *", "--store", url
    )
    assert code == 0
    assert "schedule digest: next run" in out
    code, out, _ = run_cli(
        capsys, "schedules", "add", "often", "cli-time-tick", "--every", "60", "--queue", "q",
        "--store", url,
    )  # fmt: skip
    assert code == 0
    code, out, _ = run_cli(capsys, "schedules", "list", "--store", url)
    header, *rows = out.splitlines()
    assert header.split() == ["name", "when", "entry", "queue", "next"]
    assert rows[0].split()[:6] == ["digest", "0", "9", "*", "*", "*"]
    assert rows[1].split()[:5] == ["often", "every", "60s", "cli-time-tick", "q"]
    code, out, _ = run_cli(capsys, "schedules", "list", "--store", url, "--json")
    listed = json.loads(out)
    assert [s["name"] for s in listed] == ["digest", "often"]
    assert listed[0]["next_at"].endswith("09:00:00Z")
    code, out, _ = run_cli(capsys, "schedules", "remove", "digest", "--store", url)
    assert (code, out.strip()) == (0, "schedule digest removed")
    code, _, err = run_cli(capsys, "schedules", "remove", "digest", "--store", url)
    assert code == 1
    assert "no schedule named 'digest'" in err
    code, out, _ = run_cli(capsys, "schedules", "list", "--store", url)
    assert "digest" not in out


def test_schedules_add_refuses_bad_plans(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys, "schedules", "add", "x", "cli-time-tick", "--cron", "61 * * * *", "--store", url
    )
    assert code == 1
    assert "malformed cron expression" in err
    code, _, err = run_cli(capsys, "schedules", "add", "x", "cli-time-tick", "--store", url)
    assert code == 2
    assert "--cron" in err
    code, _, err = run_cli(
        capsys, "schedules", "add", "x", "no-such-entry", "--every", "60", "--store", url
    )
    assert code == 1
    assert "no-such-entry" in err
    code, out, _ = run_cli(capsys, "schedules", "list", "--store", url)
    assert "no schedules" in out


def test_runs_show_tells_when_a_parked_run_wakes(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SqliteStore(tmp_path / "runs.db")
    try:

        async def park() -> None:
            await agency.enqueue(waiter, run_id="parked", store=store)
            (claimed,) = await store.claim_queued(
                queues=["default"], owner="w", lease_seconds=30, limit=1
            )
            parked: RunRecord = claimed.model_copy(
                update={"status": "waiting", "wake_at": 1_800_000_000.0, "waiting_for": ["go"]}
            )
            assert await store.finish_run(parked, owner="w")

        anyio.run(park)
    finally:
        store.close()
    code, out, _ = run_cli(capsys, "runs", "show", "parked", "--store", url)
    assert code == 0
    assert "status     waiting" in out
    assert "wakes      2027-01-15 08:00:00" in out
    assert "waits for  go" in out
    code, out, _ = run_cli(capsys, "runs", "list", "--store", url, "--status", "waiting")
    assert "parked" in out


def test_worker_park_after_is_parsed() -> None:
    ns = build_parser().parse_args(["worker", "--park-after", "0"])
    assert ns.park_after == 0.0
    assert build_parser().parse_args(["worker"]).park_after == 30.0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--park-after", "-1"])
