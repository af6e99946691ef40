"""New Python processes without paying for a new interpreter each time: a fork server.

Tests of crashes, of resuming in "another process" and of the CLI start dozens of short
Python processes, and each spends most of its life starting up and importing the runtime.
:class:`ForkServer` is one helper process (per pytest process, started on first use) that
imports the modules it is given once (by default the runtime's dependencies and
``agency_runtime``), then forks a child per request. The child is a real, separate process —
its own pid, environment, working directory, ``sys.argv``, ``sys.path`` and ``__main__`` — set
up the way ``python script.py``, ``python -c CODE`` and ``python -m MODULE`` set themselves up
(``sys.path[0]``, then ``PYTHONPATH``), and it exits through the interpreter's normal shutdown
with the program's exit status. It can be killed like any process.

A child is asked for in one of two ways:

* by the test itself — :meth:`ForkServer.run` answers like :func:`subprocess.run`
  (``capture_output=True, text=True``), :meth:`ForkServer.start` gives a :class:`ForkedProcess`
  with the parts of :class:`subprocess.Popen` the tests use. The child's stdin is
  ``/dev/null`` and its output goes to files.
* by a program that starts a process itself (the MCP client of ``agency.mcp.stdio``, which
  talks to its server over the server's stdin and stdout): :meth:`ForkServer.command` is a
  command line for it. The command is a small stdlib-only launcher (``tests/forked_shim.py``,
  on an isolated interpreter without ``site``) that hands its own stdin, stdout and stderr,
  its ``argv``, environment and working directory over a UNIX socket to the server
  (``SCM_RIGHTS``); the child runs on those very descriptors, and the launcher waits and exits
  as the child did (killed by a signal: by the same signal). SIGTERM, SIGINT and SIGHUP sent to
  the launcher reach the child; a launcher that dies otherwise (SIGKILL, say a killed process
  group) takes its child along (the server SIGKILLs it), and so does the server's own end.

What a fork does not redo is the interpreter's start: modules the server imported are already
imported (the program's own imports still run), and start-up-only environment variables
(``PYTHONHASHSEED``, ``PYTHONWARNINGS`` and the like) are the server's. Tests that are about
interpreter start-up — import side effects, the console script, ``python -m agency_runtime``
itself, the examples as a user runs them — use real interpreters.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SHIM = Path(__file__).resolve().with_name("forked_shim.py")
"""The launcher :meth:`ForkServer.command` runs (stdlib only)."""

RUNTIME_IMPORTS = (
    "anyio",
    "anyio._backends._asyncio",
    "asyncio",
    "httpx",
    "pydantic",
    "queue",
    "sqlite3",
    "subprocess",
    "argparse",
    # the runtime itself: ``import agency_runtime`` is a shell that loads each public name's
    # module on first read, and the facade (``agency``) loads nearly all of them
    "agency_runtime._facade",
    "agency_runtime._store._sqlite",
    "agency_runtime._llm._provider",
    "agency_runtime.cli",
    # httpx's transport, imported by its first client (~80 ms), and the Telegram SDK (~70 ms)
    "httpcore",
    "telegram",
) + (("psycopg", "psycopg_pool") if importlib.util.find_spec("psycopg_pool") else ())
"""The imports every program of the crash, process and CLI tests pays for: nearly every one
runs an event loop (asyncio: anyio's backend for it is imported by the first ``anyio.run``,
~18 ms a child), opens a store (the SQLite store and the store core, imported on first use)
and calls a model, half of them through the CLI; several start processes of their own; the
postgres ones import psycopg (~80 ms each). The ~40 children of a suite that make an HTTP
client (the Telegram bots among them) each imported httpcore and the Telegram SDK anew: ~5 s
of CPU in all, against ~0.15 s for each fork server that imports them once."""

SERVER = r"""
import atexit, builtins, ctypes, importlib, json, os, runpy, selectors, signal, socket, sys
import threading, types

# argv: the listening UNIX socket's descriptor, then the modules to import once, here.
listener = socket.socket(fileno=int(sys.argv[1]))
for name in sys.argv[2:]:
    importlib.import_module(name)
# fork() copies only the calling thread: the imports must not have started any.
assert threading.active_count() == 1, threading.enumerate()
# Move what is imported out of the collector's reach: a child's garbage collections then never
# walk (and so never copy, page by page) the heap it shares with this process — ~25 ms of CPU
# for each child that runs a full collection (as multiprocessing's forkserver advises).
import gc
gc.freeze()

requests_in, replies = sys.stdin, sys.stdout
SERVER_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
BASE_PATH = sys.path[1 + len(SERVER_PYTHONPATH):]  # what site and the stdlib put on sys.path
PR_SET_PDEATHSIG = 1


def reply(message):
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def files(request):
    '''A request of the test's own: stdin from /dev/null, stdout and stderr to its files.'''
    return [
        os.open(os.devnull, os.O_RDONLY),
        os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
        os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    ]


def become(request, stdio):
    '''In the child: set the process up as `python <how> <target> <args>` would be, on the
    descriptors `stdio` as its stdin, stdout and stderr, then run.'''
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, opened in enumerate(stdio):
        os.dup2(opened, fd)
    for opened in set(stdio) - {0, 1, 2}:
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


def run(request, stdio):
    '''Run the program; its exit status, as the interpreter would compute it.'''
    try:
        become(request, stdio)
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


def read_request(conn):
    '''A launcher's request: one JSON line, its stdin, stdout and stderr attached.'''
    conn.settimeout(30)  # it sends at once, having connected
    data, stdio, _, _ = socket.recv_fds(conn, 65536, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(65536)
        if not more:
            raise EOFError("the launcher went away before it asked")
        data += more
    conn.settimeout(None)
    if len(stdio) != 3:
        for fd in stdio:
            os.close(fd)
        raise ValueError(f"the launcher sent {len(stdio)} descriptors, not 3")
    return json.loads(data), stdio


selector = selectors.DefaultSelector()
selector.register(requests_in, selectors.EVENT_READ, "test")
selector.register(listener, selectors.EVENT_READ, "listener")
pidfds = {}  # a child's pidfd: its pid, and the launcher's connection when it has one
launchers = {}  # a launcher's connection: the pid of its child, until the child is reaped


def fork(request, stdio, conn=None):
    '''A child running `request` on `stdio`; with a launcher, dying with this server.'''
    pid = os.fork()
    if pid == 0:
        # A new interpreter starts with no signal blocked; this server may have inherited a
        # mask from the thread that started it, and a child that kept SIGINT blocked would
        # never hear it.
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        selector.close()
        for fd in pidfds:
            os.close(fd)
        for held in (listener, *launchers):
            held.close()
        if conn is not None:
            conn.close()
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != server_pid:  # the server ended before prctl
                os._exit(1)
        finish(run(request, stdio))
    pidfd = os.pidfd_open(pid)
    pidfds[pidfd] = (pid, conn)
    selector.register(pidfd, selectors.EVENT_READ, "child")
    return pid


server_pid = os.getpid()
while True:
    for key, _ in selector.select():
        if key.data == "test":
            line = requests_in.readline()
            if not line:
                raise SystemExit(0)  # the test's process has gone: children of launchers die
            request = json.loads(line)
            # Opened here, before the fork: the files exist once the test has the pid, even
            # if it kills the child before the child ran a line.
            stdio = files(request)
            try:
                reply({"id": request["id"], "pid": fork(request, stdio)})
            finally:
                for fd in stdio:
                    os.close(fd)
        elif key.data == "listener":
            conn, _ = listener.accept()
            try:
                request, stdio = read_request(conn)
            except (OSError, EOFError, ValueError) as why:
                print(f"fork server: a launcher's request failed: {why}", file=sys.stderr)
                conn.close()
                continue
            try:
                launchers[conn] = fork(request, stdio, conn)
            finally:
                for fd in stdio:  # the child has them; held here, a pipe would never end
                    os.close(fd)
            selector.register(conn, selectors.EVENT_READ, "launcher")
        elif key.data == "launcher":
            conn, pid = key.fileobj, launchers[key.fileobj]
            try:
                signals = conn.recv(4096)
            except OSError:
                signals = b""
            # A signal number on each line for the child; nothing: the launcher is gone.
            for number in signals.split() if signals else [signal.SIGKILL]:
                os.kill(pid, int(number))  # not yet reaped: it is this process's child
            if not signals:
                selector.unregister(conn)
                del launchers[conn]
                conn.close()
        else:
            pidfd = key.fileobj
            selector.unregister(pidfd)
            pid, conn = pidfds.pop(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            if conn is None:
                reply({"pid": pid, "returncode": code})
            elif conn in launchers:
                selector.unregister(conn)
                del launchers[conn]
                try:
                    conn.sendall(f"{code}\n".encode())
                except OSError:
                    pass
                conn.close()
"""


class ForkServer:
    """One helper process that forks new Python processes on request, having imported
    ``preload`` (module names) once."""

    def __init__(self, preload: Sequence[str] = RUNTIME_IMPORTS) -> None:
        self._outputs = Path(tempfile.mkdtemp(prefix="forked-"))
        # Bound here, before the server starts: a launcher may connect at once (the
        # connection waits in the backlog while the server is still importing).
        self._socket = self._outputs / "launch"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(self._socket))
            listener.listen(64)
            self._process = subprocess.Popen(
                [sys.executable, "-c", SERVER, str(listener.fileno()), *preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                pass_fds=[listener.fileno()],
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

    def command(self, how: str, target: str | os.PathLike[str], *args: str) -> list[str]:
        """A command line that starts ``python <target> <args>`` (``how`` as for
        :meth:`start`) as a child of this server, for a program that starts the process
        itself: the child has the launcher's stdin, stdout, stderr, environment and working
        directory, and the launcher ends as the child does (see the module's documentation).
        """
        assert how in ("script", "code", "module"), how
        launcher = [sys.executable, "-I", "-S", str(SHIM), str(self._socket)]
        return [*launcher, how, str(target), *(str(a) for a in args)]

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

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the children still running, end the server and remove their output files."""
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
