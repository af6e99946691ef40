"""The order workflow, Telegram bot and research helper examples run as a user would run them.

The examples are copied into the test's directory, which is the working directory of every
command, as in the README: ``python3 examples/order_workflow.py start order-1``, then
``python3 -m agency_runtime runs respond order-1 --approve`` from the same directory (the CLI
imports a recorded script only from under the working directory, and runs only declared
entries).

Each command is a new process, forked by the fork server of ``tests/forked.py`` and set up as
``python3 ...`` would be (argv, environment, working directory, ``sys.path``, ``__main__``),
without a new interpreter's start-up each time. ``test_examples.py`` runs the quickstart, and
``test_cli.py`` runs ``python -m agency_runtime`` and the console script, in real interpreters.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.forked import ForkServer, python_args

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLI = ROOT / "agency_runtime" / "cli.py"


@pytest.fixture(autouse=True)
def _examples_here(tmp_path: Path, fork_server: ForkServer) -> None:
    """A copy of ``examples/`` in the test's directory, as in a checkout of the project."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "AGENCY_STORE": f"sqlite:///{tmp_path}/ex.db"}
    for name in ("AGENCY_MODEL", "TELEGRAM_BOT_TOKEN", "TELEGRAM_CHAT", "OPEN_TASKS_FILE",
                 "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"):  # fmt: skip
        env.pop(name, None)  # offline: the fake models, no real Bot or Web API
    return env


def _run(
    server: ForkServer, tmp_path: Path, *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python3 ARGS`` in a new process."""
    how, target, rest = python_args(args)
    return server.run(how, target, *rest, timeout=timeout, env=_env(tmp_path), cwd=cwd or tmp_path)


ORDER = "examples/order_workflow.py"
RESEARCH = "examples/research_helper.py"


def _start_order(server: ForkServer, tmp_path: Path, order_id: str) -> None:
    done = _run(server, tmp_path, ORDER, "start", order_id)
    assert done.returncode == 0, done.stderr
    assert f"order {order_id}: paused, asks: Charge $9.00 for 2 x tea?" in done.stdout
    assert f"python3 -m agency_runtime runs respond {order_id} --approve" in done.stdout


def _assert_completed_once(server: ForkServer, tmp_path: Path, order_id: str) -> None:
    done = _run(server, tmp_path, ORDER, "status", order_id)
    assert done.returncode == 0, done.stderr
    assert f"order {order_id}: completed" in done.stdout
    assert '"status": "charged"' in done.stdout
    ledger = (tmp_path / "order-ledger.txt").read_text(encoding="utf-8").splitlines()
    assert ledger == [
        f"ran reserve ({order_id})",
        f"ran price ({order_id})",
        f"ran charge ({order_id})",
    ]


def test_order_workflow_pauses_then_the_cli_answer_completes_it(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    _start_order(fork_server, tmp_path, "order-7")
    status = _run(fork_server, tmp_path, ORDER, "status", "order-7")
    assert "order order-7: paused" in status.stdout
    assert "waiting for an answer: Charge $9.00 for 2 x tea?" in status.stdout
    if not CLI.exists():
        pytest.skip("agency_runtime/cli.py (agency runs respond) is not written yet")
    url = f"sqlite:///{tmp_path}/ex.db"
    answered = _run(
        fork_server,
        tmp_path,
        "-m",
        "agency_runtime",
        "runs",
        "respond",
        "order-7",
        "--approve",
        "--store",
        url,
    )
    assert answered.returncode == 0, answered.stdout + answered.stderr
    _assert_completed_once(fork_server, tmp_path, "order-7")


def test_order_workflow_answered_from_another_directory_needs_import(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    """Outside the directory that holds the script, the CLI imports it only when told to."""
    _start_order(fork_server, tmp_path, "order-9")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    respond = ("-m", "agency_runtime", "runs", "respond", "order-9", "--approve")
    refused = _run(fork_server, tmp_path, *respond, cwd=elsewhere)
    assert refused.returncode == 1
    assert "the script is not under the working directory" in refused.stderr
    assert "--import MODULE" in refused.stderr
    assert "Traceback" not in refused.stderr
    status = _run(fork_server, tmp_path, ORDER, "status", "order-9")
    assert "order order-9: paused" in status.stdout  # nothing ran, no answer was stored

    answered = _run(fork_server, tmp_path, *respond, "--import", f"../{ORDER}", cwd=elsewhere)
    assert answered.returncode == 0, answered.stdout + answered.stderr
    _assert_completed_once(fork_server, tmp_path, "order-9")


def test_order_workflow_is_answered_from_another_process(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    """Without the CLI: a fresh process imports the entry by script path and finishes it."""
    _start_order(fork_server, tmp_path, "order-8")
    code = (
        "import anyio\n"
        "from agency_runtime import agency, approve\n"
        "async def main():\n"
        "    record = await agency.runs.get('order-8')\n"
        "    done = await agency.respond_to_interrupts(record.interrupts, [approve('sam')])\n"
        "    print(done.status)\n"
        "anyio.run(main)\n"
    )
    answered = _run(fork_server, tmp_path, "-c", code)
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip() == "completed"
    _assert_completed_once(fork_server, tmp_path, "order-8")


def test_telegram_bot_offline_prints_the_transcript(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    done = _run(fork_server, tmp_path, "examples/telegram_bot.py", "--offline")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "you ▸ Hi! My name is Ada." in lines
    assert "bot ◂ Nice to meet you, Ada! I'll remember that." in lines
    assert "bot ◂ Your open tasks: call Mom; renew passport; book the dentist." in lines
    assert "bot ◂ You're Ada." in lines  # recalled from the conversation's memory
    assert "3 replies for 3 messages" in done.stdout


def test_telegram_bot_needs_a_token_without_offline(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    done = _run(fork_server, tmp_path, "examples/telegram_bot.py", "8587")
    assert done.returncode == 2
    assert "TELEGRAM_BOT_TOKEN" in done.stderr


def test_slack_bot_offline_answers_each_message_once_in_its_thread(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    done = _run(fork_server, tmp_path, "examples/slack_bot.py", "--offline")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Slack → app (a bot's message): skipped bot message" in out
    assert "3 turns for 5 accepted events." in out  # the retry and app_mention: same turn
    lines = [line.strip() for line in out.splitlines()]
    thread = lines.index(next(line for line in lines if line.startswith("Thread C0GENERAL/")))
    assert lines[thread + 1 : thread + 3] == [
        "bot: Nice to meet you, Ada! I'll remember that.",
        "bot: You're Ada.",  # recalled from the thread's memory
    ]
    assert "👀 on 3 messages; 3 posts, 3 edits." in out  # one message per reply, streamed


def test_slack_bot_needs_a_token_and_secret_without_offline(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    done = _run(fork_server, tmp_path, "examples/slack_bot.py")
    assert done.returncode == 1
    assert "SLACK_BOT_TOKEN" in done.stderr
    assert "SLACK_SIGNING_SECRET" in done.stderr


def test_research_helper_asks_for_budget_and_completes(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    done = _run(fork_server, tmp_path, RESEARCH)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"run research-\w+: paused", out)
    assert 'interrupt std::guard: guard "research" exceeded its cost budget' in out
    assert 'approving {"max_cost": 0.01} more budget' in out
    assert re.search(r"run research-\w+: completed", out)
    assert "  = In short:" in out
    cost = re.search(r"cost: \$(\d+\.\d+)", out)
    assert cost is not None
    assert 0.003 < float(cost.group(1)) < 0.013


def test_research_helper_ask_prints_the_cli_command_that_completes_it(
    tmp_path: Path, fork_server: ForkServer
) -> None:
    done = _run(fork_server, tmp_path, RESEARCH, "--ask")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "interrupt std::guard" in done.stdout
    command = re.search(
        r"python3 -m agency_runtime runs respond (research-\w+) "
        r"--approve '(\{\"max_cost\": 0.01\})'",
        done.stdout,
    )
    assert command is not None
    assert "cost:" not in done.stdout
    if not CLI.exists():
        pytest.skip("agency_runtime/cli.py (agency runs respond) is not written yet")
    run_id, value = command.groups()
    answered = _run(
        fork_server, tmp_path, "-m", "agency_runtime", "runs", "respond", run_id, "--approve", value
    )
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert f"run {run_id}: completed" in answered.stdout
