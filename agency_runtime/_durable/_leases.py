"""Who holds a lease: owner ids of the form ``host:pid:nonce``, and spotting dead holders.

Run leases and global-lock tickets carry such owners, so a process that finds a lease held
by a process of *this* machine that no longer exists can take over at once instead of
waiting for the lease to expire. Holders on other machines can only expire.
"""

from __future__ import annotations

import functools
import os

__all__ = ["holder_is_dead", "host", "owner_id"]


@functools.cache
def host() -> str:
    """This machine's host name, as owner ids carry it (read once; socket loads on first use)."""
    import socket

    return socket.gethostname()


def owner_id(nonce: str) -> str:
    """An owner id for this process: ``host:pid:nonce``."""
    return f"{host()}:{os.getpid()}:{nonce}"


def holder_is_dead(owner: str | None) -> bool:
    """Whether ``owner`` is a process of this machine that no longer runs.

    Only a process of this host can be checked. A process that was killed but not yet
    reaped by its parent (a zombie) still answers ``kill(pid, 0)``, yet will never renew its
    lease: it counts as dead. A reused pid makes a dead holder look alive, which is safe:
    the caller then waits for the lease as it would anyway.
    """
    if owner is None:
        return False
    host_name, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host_name != host() or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists but belongs to someone else, or cannot be signalled here
        return _is_zombie(pid)
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (Linux ``/proc``; else ``False``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return False
    return bool(fields) and fields[0] in (b"Z", b"X")
