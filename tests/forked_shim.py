"""The launcher of :meth:`tests.forked.ForkServer.command`: a process whose program is forked.

    python -I -S forked_shim.py SOCKET (script|code|module) TARGET [ARGS...]

It asks the fork server listening on ``SOCKET`` for a child running ``TARGET ARGS...`` (as
``python TARGET``, ``python -c TARGET`` or ``python -m TARGET``), handing over its own stdin,
stdout and stderr (``SCM_RIGHTS``), environment and working directory, and then stands for the
child: SIGTERM, SIGINT and SIGHUP are passed on to it, and the launcher exits with the child's
status, or dies of the signal that killed it. Were the launcher killed outright, the server
sees its connection end and kills the child.

Standard library only, and cheap to start (``-I -S``: no ``site``, no user paths): it is what
a test's client starts instead of a whole interpreter that imports its program's libraries.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from types import FrameType

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def main(argv: list[str]) -> int:
    """Run the child; its exit status (a negative one is the signal that killed it)."""
    path, how, target, *args = argv
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.connect(path)
    request = {"how": how, "target": target, "args": args, "env": dict(os.environ)}
    request["cwd"] = os.getcwd()
    data = json.dumps(request).encode() + b"\n"

    def forward(signum: int, frame: FrameType | None) -> None:
        try:
            server.sendall(f"{signum}\n".encode())
        except OSError:  # the child has just ended: its status is on the way
            pass

    # Held back until the request is out: a signal's line must come after it.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    for signum in FORWARDED:
        signal.signal(signum, forward)
    sent = socket.send_fds(server, [data], [0, 1, 2])
    server.sendall(data[sent:])
    # The child has stdin and stdout now: a reader sees the end of its output when the child
    # ends, and a writer cannot fill a pipe nobody reads.
    nothing = os.open(os.devnull, os.O_RDWR)
    os.dup2(nothing, 0)
    os.dup2(nothing, 1)
    os.close(nothing)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    answer = b""
    while not answer.endswith(b"\n"):
        more = server.recv(64)
        if not more:
            print("forked_shim: the fork server ended before the child", file=sys.stderr)
            return 1
        answer += more
    return int(answer)


def exit_as(code: int) -> None:
    """Exit with ``code``, or die of the signal ``-code`` as the child did."""
    if code < 0:
        if -code in (*FORWARDED, signal.SIGPIPE):  # the signals Python or main() handle
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal whose default is not to end a process: as a shell says
    sys.exit(code)


if __name__ == "__main__":
    exit_as(main(sys.argv[1:]))
