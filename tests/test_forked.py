"""The fork server of ``tests/forked.py`` sets a process up as a new interpreter would.

Crash, "another process" and CLI tests run their processes through it, so what a program can
see of its start — ``sys.argv``, ``sys.path`` (its first entry, then ``PYTHONPATH``),
``__main__``, the working directory and the environment — and its exit status are compared
here with a real ``python`` for each way of starting one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forked import ForkServer

PROBE = """
import json, os, sys
main = sys.modules["__main__"]
spec = getattr(main, "__spec__", None)
print(json.dumps({
    "argv": sys.argv,
    "path": sys.path[:3],
    "file": getattr(main, "__file__", None),
    "name": __name__,
    "spec": getattr(spec, "name", None),
    "cwd": os.getcwd(),
    "env": os.environ.get("PROBE_VALUE"),
    "stdin": sys.stdin.read(),
}))
raise SystemExit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A library folder on PYTHONPATH (a script and a package), a working folder beside it."""
    library, work = tmp_path / "lib", tmp_path / "work"
    (library / "probe_pkg").mkdir(parents=True)
    work.mkdir()
    (library / "probe.py").write_text(PROBE)
    (library / "probe_pkg" / "__init__.py").write_text("")
    (library / "probe_pkg" / "__main__.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(library), "PROBE_VALUE": "seen", "PROBE_EXIT": "3"}
    return work, env


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "target", "flag"),
    [("code", PROBE, "-c"), ("script", "../lib/probe.py", None), ("module", "probe_pkg", "-m")],
    ids=["code", "script", "module"],
)
def test_a_forked_process_starts_as_a_new_interpreter_would(
    fork_server: ForkServer,
    layout: tuple[Path, dict[str, str]],
    how: str,
    target: str,
    flag: str | None,
) -> None:
    work, env = layout
    command = [sys.executable, *([flag] if flag else []), target, "an-argument"]
    real = subprocess.run(
        command,
        env=env,
        cwd=work,
        stdin=subprocess.DEVNULL,  # as the fork server's children have it
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    forked = fork_server.run(how, target, "an-argument", env=env, cwd=work, timeout=60)
    assert (forked.returncode, real.returncode) == (3, 3), forked.stderr + real.stderr
    seen, expected = json.loads(forked.stdout), json.loads(real.stdout)
    if how == "script":  # the same file: a real interpreter does not normalise the path
        assert Path(seen.pop("file")).resolve() == Path(expected.pop("file")).resolve()
    assert seen == expected


def test_a_forked_process_reports_failures_and_signals(fork_server: ForkServer) -> None:
    failed = fork_server.run("code", "raise ValueError('boom')")
    assert failed.returncode == 1
    assert failed.stderr.rstrip().endswith("ValueError: boom")
    killed = fork_server.run("code", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -signal.SIGKILL
    waiting = fork_server.start("code", "import signal; signal.pause()")  # until killed
    assert waiting.poll() is None
    waiting.kill()
    assert waiting.wait(timeout=30) == -signal.SIGKILL


def test_two_children_that_end_at_once_are_both_seen(fork_server: ForkServer) -> None:
    first = fork_server.start("code", "import time; time.sleep(0.2)")
    second = fork_server.start("code", "import time; time.sleep(0.2)")
    assert first.wait(timeout=10) == 0
    assert second.wait(timeout=10) == 0
