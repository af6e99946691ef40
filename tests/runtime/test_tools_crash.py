"""A tool loop under SIGKILL: a process is killed in the middle of a tool round, and the run
resumed in a new process runs no finished tool again and at most the one in flight.

The app (``APP``, written to ``tmp_path``) runs ``agency.run_sync(agent, run_id="tools")`` on
a SQLite file with a fake model that decides from the conversation (as a real model does):
three rounds, each calling ``work(n)``, then an answer. ``work`` appends ``start n`` and
``end n`` to a ledger (fsynced) with a little work between them, so the external SIGKILL
lands inside a tool, after its side effect began and before its journal commit. Processes
come from the fork server (``tests/forked.py``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.forked import ForkServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL"),
]

DEADLINE = 20.0

APP = r"""
import os, sys, time
from agency_runtime import agency
from agency_runtime.testing import FakeModel, FakeToolCall

LEDGER = os.environ["LEDGER"]


def next_move(request):
    # like a real model: what it does next depends on the conversation so far
    done = sum(1 for m in request.messages if m.get("role") == "tool")
    return "all done" if done == 3 else [FakeToolCall("work", {"n": done})]


FakeModel("tool-crash", function=next_move).register()


def note(line):
    with open(LEDGER, "a") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())


def work(n: int) -> str:
    '''Do step n.'''
    note(f"start {n}")
    time.sleep(0.3)  # the kill lands here: the side effect began, nothing is committed
    note(f"end {n}")
    return f"did {n}"


async def agent() -> str:
    return await agency.llm("do the work", model="fake/tool-crash", tools=[work])


result = agency.run_sync(agent, run_id="tools", store=os.environ["STORE"])
print(result.status, result.value)
"""


def _ledger(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_kill_mid_round_reruns_only_the_tool_in_flight(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(APP)
    ledger = tmp_path / "ledger.txt"
    env = {**os.environ, "LEDGER": str(ledger), "STORE": f"sqlite:///{tmp_path / 'runs.db'}"}
    first = fork_server.start("script", script, env=env, cwd=tmp_path)
    deadline = time.monotonic() + DEADLINE
    while "start 1" not in _ledger(ledger):  # the second tool has begun its side effect
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the tool loop made no progress"
        time.sleep(0.005)  # a bounded poll of another process's file
    first.kill()
    assert first.wait(timeout=DEADLINE) == -signal.SIGKILL
    assert _ledger(ledger) == ["start 0", "end 0", "start 1"]

    done = fork_server.run("script", script, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed all done"
    # tool 0 finished and was journaled: never again; tool 1 was in flight: once more
    assert _ledger(ledger) == [
        "start 0", "end 0", "start 1",
        "start 1", "end 1", "start 2", "end 2",
    ]  # fmt: skip
