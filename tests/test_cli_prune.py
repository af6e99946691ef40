"""The ``agency`` command line for retention: ``runs prune`` and ``worker --prune-after``."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from agency_runtime import agency
from agency_runtime.cli import build_parser, main
from agency_runtime.testing import FakeClock
from tests.forked import ForkServer

DAY = 86_400.0


def adds(a: int, b: int) -> int:
    return a + b


def fails(item: str) -> str:
    raise ValueError(f"no {item}")


async def asks() -> str:
    answer = await agency.interrupt("approve", "go on?")
    return "yes" if answer.approved else "no"


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


def _ids(url: str) -> set[str]:
    async def read() -> set[str]:
        return {r.run_id for r in await agency.runs.list(store=url, limit=10_000)}

    return anyio.run(read)


def test_runs_prune_deletes_the_old_runs_that_ended_and_says_how_many(
    url: str, fake_clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agency.run_sync(adds, 1, 2, run_id="done", store=url).status == "completed"
    assert agency.run_sync(fails, "tea", run_id="failed", store=url).status == "failed"
    assert agency.run_sync(asks, run_id="paused", store=url).status == "paused"
    fake_clock.advance(31 * DAY)
    assert agency.run_sync(adds, 3, 4, run_id="recent", store=url).status == "completed"

    code, out, _ = run_cli(
        capsys, "runs", "prune", "--older-than", "30d", "--status", "failed", "--store", url
    )
    assert (code, out) == (0, "deleted 1 run(s) that ended over 30d ago (failed)\n")
    assert _ids(url) == {"done", "paused", "recent"}

    code, out, _ = run_cli(capsys, "runs", "prune", "--older-than", "30d", "--store", url)
    assert (code, out) == (
        0,
        "deleted 1 run(s) that ended over 30d ago (completed, failed, cancelled)\n",
    )
    assert _ids(url) == {"paused", "recent"}  # a paused run is never pruned

    code, out, _ = run_cli(
        capsys, "--json", "runs", "prune", "--older-than", "12h", "--store", url,
        "--status", "completed, cancelled",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out) == {
        "deleted": 0,
        "older_than_seconds": 43_200.0,
        "statuses": ["completed", "cancelled"],
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--older-than", "3w"], "--older-than must be a duration like '30d', '12h', '90m'"),
        (["--older-than", "-1"], "--older-than must be a duration like"),
        (["--older-than", "1d", "--status", "paused"], "status 'paused' cannot be pruned"),
        (["--older-than", "1d", "--status", "completed,"], "status must be one of completed"),
        ([], "the following arguments are required: --older-than"),
    ],
)
def test_runs_prune_refuses_bad_options_saying_why(
    url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    agency.run_sync(adds, 1, 2, run_id="done", store=url)
    code, _, err = run_cli(capsys, "runs", "prune", *argv, "--store", url)
    assert code == 2
    assert message in err
    assert _ids(url) == {"done"}


def test_worker_prune_after_is_parsed() -> None:
    ns = build_parser().parse_args(["worker", "--prune-after", "30d"])
    assert ns.prune_after == 30 * DAY
    assert build_parser().parse_args(["worker"]).prune_after is None
    for bad in ("soon", "-2d", "1e300"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["worker", "--prune-after", bad])


def test_a_worker_with_prune_after_prunes_in_the_background(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    path = tmp_path / "runs.db"
    url = f"sqlite:///{path}"
    assert agency.run_sync(adds, 1, 2, run_id="old", store=url).status == "completed"
    assert agency.run_sync(asks, run_id="old-paused", store=url).status == "paused"
    assert agency.run_sync(adds, 3, 4, run_id="new", store=url).status == "completed"
    with closing(sqlite3.connect(path)) as conn, conn:  # two of them ended 40 days ago
        conn.execute(
            "UPDATE runs SET updated_at = updated_at - ? WHERE run_id LIKE 'old%'", (40 * DAY,)
        )
    proc = fork_server.start(
        "module", "agency_runtime", "worker", "--store", url, "--poll", "0.05",
        "--prune-after", "30d", env=dict(os.environ), cwd=tmp_path, output=tmp_path / "worker",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "old" in _ids(url):  # another process's progress, looked at for 30 s at most
            assert proc.poll() is None, (tmp_path / "worker.err").read_text()
            assert time.monotonic() < deadline, "the worker pruned nothing in 30 s"
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=30)
    assert _ids(url) == {"old-paused", "new"}
    err = (tmp_path / "worker.err").read_text()
    assert "pruning runs that ended over 30d ago, now and every 3600s" in err
    assert proc.returncode == 0, err
