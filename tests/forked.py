"""New Python processes without paying for a new interpreter each time: a fork server.

Tests of crashes, of resuming in "another process" and of the CLI start dozens of short
Python processes, and each spends most of its life starting up and importing the runtime.
:class:`ForkServer` is one helper process (per pytest process, started on first use) that
imports the runtime's dependencies and ``agency_runtime`` once, then forks a child per
request. The child is a real, separate process — its own pid, environment, working directory,
``sys.argv``, ``sys.path`` and ``__main__``, its stdin from ``/dev/null`` and its output in files
— set up the way ``python script.py``, ``python -c CODE`` and ``python -m MODULE`` set
themselves up (``sys.path[0]``, then ``PYTHONPATH``), and it exits through the interpreter's
normal shutdown with the program's exit status. It can be killed like any process.

What a fork does not redo is the interpreter's start: modules the server imported are already
imported (the program's own imports still run), and start-up-only environment variables
(``PYTHONHASHSEED``, ``PYTHONWARNINGS`` and the like) are the server's. Tests that are about
interpreter start-up — import side effects, the console script, ``python -m agency_runtime``
itself, the examples as a user runs them — use real interpreters.

:meth:`ForkServer.run` answers like :func:`subprocess.run` (``capture_output=True,
text=True``); :meth:`ForkServer.start` gives a :class:`ForkedProcess` with the parts of
:class:`subprocess.Popen` the tests use.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SERVER = r"""
import atexit, builtins, json, os, runpy, selectors, signal, sys, threading, types

# The imports every program of these tests pays for, paid once here.
import anyio, httpx, pydantic, sqlite3  # noqa: F401
import agency_runtime  # noqa: F401

requests_in, replies = sys.stdin, sys.stdout
SERVER_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
BASE_PATH = sys.path[1 + len(SERVER_PYTHONPATH):]  # what site and the stdlib put on sys.path


def reply(message):
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def become(request):
    '''In the child: set the process up as `python <how> <target> <args>` would be, then run.'''
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for path, fd, flags in (
        (os.devnull, 0, os.O_RDONLY),
        (request["stdout"], 1, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (request["stderr"], 2, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    how, target, args = request["how"], request["target"], request["args"]
    cwd = os.getcwd()
    pythonpath = [p or cwd for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    pythonpath = pythonpath if os.environ.get("PYTHONPATH") else []
    if how == "module":
        first = cwd
    elif how == "code":
        first = ""
    else:
        first = os.path.dirname(os.path.realpath(target))
    sys.path[:] = [first, *pythonpath, *BASE_PATH]
    if how == "module":
        sys.argv = ["-m", *args]
        runpy._run_module_as_main(target, alter_argv=True)
        return
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    if how == "code":
        sys.argv = ["-c", *args]
        source, filename = target, "<string>"
    else:
        sys.argv = [target, *args]
        filename = os.path.join(cwd, target)  # as given, made absolute, not normalised
        main.__file__ = filename
        with open(filename, "rb") as file:
            source = file.read()
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), main.__dict__)


def run(request):
    '''Run the program; its exit status, as the interpreter would compute it.'''
    try:
        become(request)
    except SystemExit as exit:
        if exit.code is None or isinstance(exit.code, int):
            return exit.code or 0
        print(exit.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        return -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def finish(code):
    '''The interpreter's exit, short of tearing every module down (as multiprocessing's
    children exit): wait for non-daemon threads, run atexit functions, flush, exit.'''
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


selector = selectors.DefaultSelector()
selector.register(requests_in, selectors.EVENT_READ)
pidfds = set()
while True:
    for key, _ in selector.select():
        if key.fileobj is requests_in:
            line = requests_in.readline()
            if not line:
                raise SystemExit(0)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                selector.close()
                for fd in pidfds:
                    os.close(fd)
                finish(run(request))
            pidfd = os.pidfd_open(pid)
            pidfds.add(pidfd)
            selector.register(pidfd, selectors.EVENT_READ, pid)
            reply({"id": request["id"], "pid": pid})
        else:
            selector.unregister(key.fileobj)
            pidfds.discard(key.fileobj)
            os.close(key.fileobj)
            _, status = os.waitpid(key.data, 0)
            reply({"pid": key.data, "returncode": os.waitstatus_to_exitcode(status)})
"""


class ForkServer:
    """One helper process that forks new Python processes on request."""

    def __init__(self) -> None:
        self._outputs = Path(tempfile.mkdtemp(prefix="forked-"))
        self._process = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        # Replies are read with os.read (see _next), never through the text wrapper.
        self._requests = 0
        self._pending = b""
        self._exits: dict[int, int] = {}
        self._children: list[ForkedProcess] = []

    def start(
        self,
        how: str,
        target: str | os.PathLike[str],
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        output: Path | None = None,
    ) -> ForkedProcess:
        """Start ``python <target> <args>`` (``how="script"``), ``python -c <target>``
        (``"code"``) or ``python -m <target>`` (``"module"``) in a new process; its stdout and
        stderr go to ``output`` with the suffixes ``.out`` and ``.err`` (by default, files of
        the server's own temporary directory)."""
        assert how in ("script", "code", "module"), how
        self._requests += 1
        if output is None:
            output = self._outputs / str(self._requests)
        stdout, stderr = (
            output.with_name(output.name + ".out"),
            output.with_name(output.name + ".err"),
        )
        request = {
            "id": self._requests,
            "how": how,
            "target": str(target),
            "args": [str(a) for a in args],
            "env": dict(os.environ if env is None else env),
            "cwd": str(Path.cwd() if cwd is None else cwd),
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        while True:
            reply = self._next(timeout=30)
            if reply is None:
                raise RuntimeError("the fork server did not answer")
            if reply.get("id") == request["id"]:
                break
        child = ForkedProcess(self, int(reply["pid"]), stdout, stderr)
        self._children.append(child)
        return child

    def run(
        self,
        how: str,
        target: str | os.PathLike[str],
        *args: str,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        output: Path | None = None,
        timeout: float = 60,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Like ``subprocess.run([python, ...], capture_output=True, text=True, ...)``."""
        child = self.start(how, target, *args, env=env, cwd=cwd, output=output)
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        argv = [sys.executable, {"script": "", "code": "-c", "module": "-m"}[how], str(target)]
        done = subprocess.CompletedProcess(
            [a for a in argv if a] + list(args), child.returncode or 0, out, err
        )
        if check:
            done.check_returncode()
        return done

    def _next(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next line (exits are noted), or ``None`` after ``timeout`` seconds.

        Reads the pipe unbuffered into a buffer of our own: two children that exit at once
        write two lines in one read, and a buffered ``readline`` would leave the second where
        ``select`` cannot see it.
        """
        out = self._process.stdout
        assert out is not None
        while b"\n" not in self._pending:
            ready, _, _ = select.select([out], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the fork server died ({self._process.poll()})")
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        message = dict(json.loads(line))
        if "returncode" in message:
            self._exits[int(message["pid"])] = int(message["returncode"])
        return message

    def _exit_of(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit status, waiting at most ``timeout`` s (``0``: just look)."""
        while pid not in self._exits:
            if self._next(timeout) is None:
                return None
        return self._exits[pid]

    def close(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)
        for stream in (self._process.stdin, self._process.stdout):
            if stream is not None:
                stream.close()
        self._process.wait(timeout=30)
        shutil.rmtree(self._outputs, ignore_errors=True)


class ForkedProcess:
    """A child of the :class:`ForkServer`: the parts of ``Popen`` the tests use."""

    def __init__(self, server: ForkServer, pid: int, stdout: Path, stderr: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._server = server
        self._stdout = stdout
        self._stderr = stderr

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server._exit_of(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server._exit_of(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"process {self.pid}", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # it just ended; the server reaps it
                pass

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the process to end (at most ``timeout`` s); its stdout and stderr."""
        self.wait(timeout)
        return self._stdout.read_text(), self._stderr.read_text()


def python_args(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """``[-c CODE | -m MODULE | SCRIPT] ARGS...`` (as after ``python``) → (how, target, args)."""
    if argv[0] == "-c":
        return "code", argv[1], list(argv[2:])
    if argv[0] == "-m":
        return "module", argv[1], list(argv[2:])
    return "script", argv[0], list(argv[1:])
