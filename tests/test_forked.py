"""The fork server of ``tests/forked.py`` sets a process up as a new interpreter would.

Crash, "another process", CLI and MCP tests run their processes through it, so what a program
can see of its start — ``sys.argv``, ``sys.path`` (its first entry, then ``PYTHONPATH``),
``__main__``, the working directory, the environment and, through the launcher, its stdin —
and its exit status are compared here with a real ``python`` for each way of starting one. A
launched child stands behind its launcher: signals pass on, and it does not outlive it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
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
@pytest.mark.parametrize("launched", [False, True], ids=["run", "launched"])
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
    launched: bool,
) -> None:
    work, env = layout
    # Through the launcher, the child reads the launcher's stdin; run()'s read /dev/null.
    given = "the input" if launched else ""

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, env=env, cwd=work, input=given, capture_output=True, text=True, timeout=60
        )

    real = run([sys.executable, *([flag] if flag else []), target, "an-argument"])
    if launched:
        forked = run(fork_server.command(how, target, "an-argument"))
    else:
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


def test_a_child_killed_as_soon_as_it_started_still_has_its_output_files(
    fork_server: ForkServer,
) -> None:
    # The server opens them before it forks: a test that kills a worker the moment it has
    # its pid (its runs were already done) reads empty output, not a missing file.
    for _ in range(20):
        child = fork_server.start("code", "import time; time.sleep(60)")
        child.kill()
        assert child.communicate(timeout=30) == ("", "")


def test_two_children_that_end_at_once_are_both_seen(fork_server: ForkServer) -> None:
    first = fork_server.start("code", "import time; time.sleep(0.2)")
    second = fork_server.start("code", "import time; time.sleep(0.2)")
    assert first.wait(timeout=10) == 0
    assert second.wait(timeout=10) == 0


WAITER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))  # SIGINT: KeyboardInterrupt
print(os.getpid(), os.getppid(), flush=True)
print("on stderr", file=sys.stderr, flush=True)
while True:
    time.sleep(1)
"""
"""A child that says who it and its parent are, then waits for a signal.

Not ``signal.pause()``: a signal that arrives after the prints but before ``pause()`` starts
has been handled at the C level already, and ``pause()`` waits for another (the SIGINT test
hung so, once, on a busy machine). A sleep is cut short by the signal, and a signal it missed
is acted on when it returns."""


class Launched:
    """A launcher started with ``subprocess.Popen`` and the child it stands for."""

    def __init__(self, command: list[str]) -> None:
        self.launcher = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.launcher.stdout is not None
        self.pid, self.parent = map(int, self.launcher.stdout.readline().split())
        self._pidfd = os.pidfd_open(self.pid)  # the child is waiting: its pid is its own

    def ended(self, timeout: float = 30) -> bool:
        """Whether the child has ended, waiting at most ``timeout`` s (``0``: just look)."""
        readable, _, _ = select.select([self._pidfd], [], [], timeout)
        return bool(readable)

    def close(self) -> None:
        if self.launcher.poll() is None:
            self.launcher.kill()
        self.launcher.wait(timeout=30)
        for stream in (self.launcher.stdout, self.launcher.stderr):
            if stream is not None:
                stream.close()
        os.close(self._pidfd)


Launch = Callable[[list[str]], Launched]


@pytest.fixture
def launch() -> Iterator[Launch]:
    """``launch(command)`` → a :class:`Launched`; its launcher is ended after the test."""
    started: list[Launched] = []

    def start(command: list[str]) -> Launched:
        started.append(Launched(command))
        return started[-1]

    yield start
    for launched in started:
        launched.close()


@pytest.mark.parametrize(
    ("signum", "returncode"), [(signal.SIGTERM, 5), (signal.SIGINT, -signal.SIGINT)]
)
def test_a_launcher_passes_signals_on_and_exits_as_its_child_did(
    fork_server: ForkServer, launch: Launch, signum: int, returncode: int
) -> None:
    child = launch(fork_server.command("code", WAITER))
    assert child.parent == fork_server._process.pid  # a fork, not a new interpreter
    assert child.launcher.stderr is not None
    assert child.launcher.stderr.readline() == "on stderr\n"  # its stderr is the launcher's
    child.launcher.send_signal(signum)
    assert child.launcher.wait(timeout=30) == returncode
    assert child.ended(timeout=0)  # reaped before the launcher heard of it


def test_a_child_hears_signals_its_server_was_started_with_blocked(launch: Launch) -> None:
    """A thread's blocked signals pass to the processes it starts, a fork server among them:
    its children must still start, as new interpreters do, with none blocked."""
    servers: list[ForkServer] = []

    def start_blocked() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        servers.append(ForkServer(preload=()))

    starter = threading.Thread(target=start_blocked)
    starter.start()
    starter.join()
    with servers[0] as server:
        for signum, returncode in ((signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, 5)):
            child = launch(server.command("code", WAITER))  # its handlers are in place
            os.kill(child.pid, signum)
            assert child.launcher.wait(timeout=30) == returncode


def test_a_launcher_dies_of_the_signal_that_killed_its_child(
    fork_server: ForkServer, launch: Launch
) -> None:
    child = launch(fork_server.command("code", WAITER))
    os.kill(child.pid, signal.SIGKILL)
    assert child.launcher.wait(timeout=30) == -signal.SIGKILL


def test_a_killed_launcher_takes_its_child_along(fork_server: ForkServer, launch: Launch) -> None:
    """SIGKILL, as to an MCP server's process group: the child cannot be told, the fork
    server sees the launcher's connection end and kills it."""
    child = launch(fork_server.command("code", WAITER))
    child.launcher.kill()
    assert child.launcher.wait(timeout=30) == -signal.SIGKILL
    assert child.ended(timeout=30)


def test_each_server_has_its_own_children_and_they_end_with_it(launch: Launch) -> None:
    """Two servers side by side, as under xdist (a fork server per worker): each launcher
    reaches its own; a server that ends (a worker gone) ends its launched children."""
    servers = [ForkServer(preload=()), ForkServer(preload=())]
    try:
        first, second = (launch(s.command("code", WAITER)) for s in servers)
        assert [first.parent, second.parent] == [s._process.pid for s in servers]
        servers[0].close()
        assert first.ended(timeout=30)
        assert first.launcher.wait(timeout=30) == 1
        assert not second.ended(timeout=0)
    finally:
        for server in servers:
            server.close()
    assert second.ended(timeout=30)
