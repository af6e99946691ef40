"""Shared fixtures: the anyio backends, the store backends, a fake clock, an isolated env.

* ``anyio_backend`` — every async test runs on asyncio and on trio. A test that truly needs
  asyncio (litellm, asyncio-only libraries) says so where it is defined, with
  ``tests.support.asyncio_only(reason)`` (or an ``anyio_backend`` fixture of its module or
  class returning ``"asyncio"``, with a comment saying why).
* ``workdir`` (autouse) — the test's own working directory, without AGENCY_STORE/AGENCY_MODEL.
* ``store`` — a fresh store of every backend in :data:`STORE_BACKENDS` (ids ``memory``,
  ``sqlite``, ``postgres``); ``make_store(clock=...)`` makes more of the same backend (closed
  after the test). A test that is about one backend builds that backend itself, under another
  name.
* PostgreSQL — ``AGENCY_TEST_POSTGRES`` (a DSN) names the server; when it is not set, the
  session (the xdist controller, before it starts its workers, which inherit the variable)
  starts an ephemeral cluster (``tests/pg_cluster.py``) and stops it at the end. Each
  postgres store gets a new PostgreSQL schema of its own, so stores never see each other's
  rows. No server: the postgres tests fail, saying why (never a skip).
* ``fake_clock`` — a :class:`FakeClock` that runs started in the test read (the system clock
  is back afterwards); stores that should follow it are built with ``make_store(clock=...)``.
* ``fork_server`` — starts the short-lived Python processes of crash and "another process"
  tests as forks of one process that imported the runtime once (``tests/forked.py``).
"""

from __future__ import annotations

import atexit
import functools
import gc
import itertools
import os
import secrets
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agency_runtime import MemoryStore, SqliteStore, Store
from agency_runtime._boundary._runtime import RUNTIME
from agency_runtime._clock import SYSTEM_CLOCK, Clock, FakeClock
from agency_runtime._store import PostgresStore
from agency_runtime._store._core import Check
from tests import pg_cluster
from tests.forked import ForkServer


def _cache_bytecode() -> None:
    """Let this session and the processes it starts cache bytecode, where the environment says
    not to write any (``PYTHONDONTWRITEBYTECODE``, as some containers set).

    Without a cache every pytest process compiles the runtime and the tests, and rewrites the
    asserts of each test module and plugin package, anew — ~2.5 s of CPU per xdist worker
    here, every run — and every interpreter a test starts compiles the runtime again. The
    bytecode goes where Python puts it by default, ``__pycache__`` beside the sources (ignored
    by git); not under a ``PYTHONPYCACHEPREFIX``, which would also make every process compile
    the standard library and the installed packages again instead of reading their installed
    bytecode. The xdist workers and the tests' subprocesses inherit the environment set here
    (as ``bench/bench_llm.py`` does for its interpreters). Bytecode is checked against its
    source, so nothing stale runs.
    """
    if not (sys.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


_cache_bytecode()


MEMORY_TMPDIR = Path("/dev/shm")
"""Where the tests' temporary files go when the machine has it as a tmpfs with room."""
MEMORY_TMPDIR_ROOM = 2 << 30
"""The free space it must have (bytes): a session writes ~120 MB at most, its PostgreSQL
cluster included."""


def _temporary_files_in_memory() -> None:
    """Put this session's temporary files — its tests' directories, their SQLite stores, the
    PostgreSQL cluster it starts, its processes' files — on a RAM-backed file system, unless
    ``TMPDIR`` says where they go.

    Every test makes a directory and most make a store: on this machine's disk (ext4) the
    suite spent ~10 s of its wall time creating, syncing and removing files, against a
    tmpfs. Nothing a test asserts depends on the medium: crash tests kill processes, and a
    file's data written before a kill survives it on either (what a tmpfs loses is what a
    power cut would, which no test simulates). Only where ``/dev/shm`` is a tmpfs with at
    least :data:`MEMORY_TMPDIR_ROOM` free (a container's default of 64 MB is not); otherwise
    the system's temporary directory, as before. Set here, in the session's first process:
    the xdist workers and the tests' subprocesses inherit it.
    """
    if os.environ.get("TMPDIR"):
        return
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            tmpfs = any(
                fields[1:3] == [str(MEMORY_TMPDIR), "tmpfs"]
                for fields in (line.split() for line in mounts)
            )
        room = os.statvfs(MEMORY_TMPDIR)
    except OSError:
        return
    roomy = room.f_bavail * room.f_frsize >= MEMORY_TMPDIR_ROOM
    if tmpfs and roomy and os.access(MEMORY_TMPDIR, os.W_OK | os.X_OK):
        os.environ["TMPDIR"] = str(MEMORY_TMPDIR)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again


_temporary_files_in_memory()

# Never let a test reach a network or a stray .env if litellm is imported somewhere.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def workdir(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test runs in its own directory with no AGENCY_STORE / AGENCY_MODEL set.

    The directory is ``tmp_path`` when the test uses it; otherwise a private temporary
    directory, removed afterwards (cheaper than a ``tmp_path`` for each of thousands of tests).
    """
    monkeypatch.delenv("AGENCY_STORE", raising=False)
    monkeypatch.delenv("AGENCY_MODEL", raising=False)
    if "tmp_path" in request.fixturenames:
        here: Path = request.getfixturevalue("tmp_path")
        monkeypatch.chdir(here)
        yield here
        return
    here = Path(tempfile.mkdtemp(prefix="agency-test-"))
    monkeypatch.chdir(here)
    try:
        yield here
    finally:
        monkeypatch.undo()  # leave the directory before removing it
        shutil.rmtree(here, ignore_errors=True)


# -- store backends ----------------------------------------------------------------------------

T = TypeVar("T")

StoreFactory = Callable[[Path, Clock | None], Store]
"""Makes a fresh, empty store: ``factory(a path this store may use, its clock or None)``."""


def _memory_store(path: Path, clock: Clock | None) -> Store:
    return MemoryStore(clock=clock)


def _sqlite_store(path: Path, clock: Clock | None) -> Store:
    file = path.with_suffix(".db")
    shutil.copyfile(_empty_sqlite_store(), file)  # a copy of an empty, migrated store file
    return SqliteStore(file, clock=clock)


@functools.cache
def _empty_sqlite_store() -> Path:
    """One empty SQLite store file per process: copying it is cheaper than migrating anew."""
    folder = Path(tempfile.mkdtemp(prefix="agency-empty-store-"))
    atexit.register(shutil.rmtree, folder, True)
    SqliteStore(folder / "empty.db").close()
    return folder / "empty.db"


POSTGRES_ENV = "AGENCY_TEST_POSTGRES"
"""The DSN of the PostgreSQL server the postgres tests use (set by the session if absent)."""
_POSTGRES_ERROR_ENV = "AGENCY_TEST_POSTGRES_ERROR"
_EPHEMERAL_ENV = "AGENCY_TEST_POSTGRES_EPHEMERAL"
"""Set (to 1) when the server is thrown away after the run: its schemas need no dropping."""
_CLUSTER = pytest.StashKey[pg_cluster.Cluster]()
_SCHEMA_PREFIX = f"t{secrets.token_hex(3)}_"  # this process's schemas: new on every run
_schema_numbers = itertools.count()
_schemas_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Start an ephemeral PostgreSQL cluster once per session, before xdist starts workers."""
    if hasattr(config, "workerinput") or os.environ.get(POSTGRES_ENV):
        return
    try:
        cluster = pg_cluster.start()
    except pg_cluster.ClusterError as exc:
        os.environ[_POSTGRES_ERROR_ENV] = str(exc)
        return
    config.stash[_CLUSTER] = cluster
    os.environ[POSTGRES_ENV] = cluster.dsn
    os.environ[_EPHEMERAL_ENV] = "1"


def pytest_unconfigure(config: pytest.Config) -> None:
    while _idle_stores:
        _idle_stores.pop().close()
    while _admin:  # the connection that empties reused test schemas
        _admin.pop().close()
    cluster = config.stash.get(_CLUSTER, None)
    if cluster is not None:
        del config.stash[_CLUSTER]
        os.environ.pop(POSTGRES_ENV, None)
        os.environ.pop(_EPHEMERAL_ENV, None)
        pg_cluster.stop(cluster.directory)


class _SettlingPostgresStore(PostgresStore):
    """A PostgresStore whose calls run their SQL inline, on the calling thread.

    Tests synchronise with ``anyio.wait_all_tasks_blocked()`` ("the code under test waits for
    the clock or another task"), which holds for the in-process stores: they commit inline.
    A task parked on a worker thread counts as blocked, so with the real store the test would
    move the fake clock, or look at the store, in the middle of a commit. Here each call
    commits before the caller goes on, as SQLite's do; the SQL, its pool and its error
    mapping are the store's. The real paths (on asyncio, psycopg's async API on the loop for
    single statements; worker threads for the rest, and for everything on trio) are tested
    by ``test_postgres.py``'s plain ``PostgresStore`` objects, the crash tests and the
    benches.
    """

    async def _run(
        self,
        what: str,
        work: Callable[..., T],
        *,
        tx: bool = False,
        several: bool = False,
        check: Check = None,
    ) -> T:
        return self._call(what, work, tx)

    # What decides whether a later test may have this store (see ``_idle_stores``).
    closed = False
    listened = False

    def close(self) -> None:
        """Close for good (a test that closes its store): never offered to a later test."""
        self.closed = True
        super().close()

    def _listen(self) -> threading.Event:
        self.listened = True  # the listener holds a liveness session from here on
        return super()._listen()


def _postgres_store(path: Path, clock: Clock | None) -> Store:
    dsn = os.environ.get(POSTGRES_ENV)
    if not dsn:
        reason = os.environ.get(_POSTGRES_ERROR_ENV, "no reason recorded")
        pytest.fail(
            f"no PostgreSQL server for the postgres store tests: {POSTGRES_ENV} is not set and "
            f"an ephemeral cluster could not be started ({reason}). Install PostgreSQL 15 "
            f"(apt-get install -y postgresql) or set {POSTGRES_ENV}=postgresql://…",
            pytrace=False,
        )
    if _idle_stores:  # an earlier test's store, still open: emptied, cheaper than a new one
        store = _idle_stores.pop()
        _empty_schema(dsn, store.schema)
        store._clock = clock
        return store
    if _free_schemas:  # a schema an earlier test closed its store on: emptied
        schema = _free_schemas.pop()
        _empty_schema(dsn, schema)
    else:
        schema = f"{_SCHEMA_PREFIX}{next(_schema_numbers)}"
        if not _schemas_made and not os.environ.get(_EPHEMERAL_ENV):
            atexit.register(_drop_schemas, dsn)
        _schemas_made.append(schema)
    return _SettlingPostgresStore(dsn, schema=schema, clock=clock, max_size=4, connect_timeout=10)


_idle_stores: list[_SettlingPostgresStore] = []
"""Postgres test stores left open by their tests: the next test store is one of them.

Opening a PostgresStore costs two new server connections (each a new server process, whose
caches start cold) and a migration check, and closing it waits for its pool's threads: ~30 ms
of CPU a test (two thirds of it the server's) and ~80 ms of wall time, against ~1 ms to empty
its schema; the suite opens ~600. What a store object keeps besides its rows — its
connections and their prepared statements — is what a long-lived store keeps; its clock is
set anew (``make_store(clock=...)``). A store a test closed is not offered again (only its
schema is), nor one whose listener ran (its liveness session would outlive the test, and
tests count sessions)."""
_free_schemas: list[str] = []
"""Schemas of postgres test stores that were closed: the next test store reuses one."""
_admin: list[Any] = []
_TABLES = ("runs", "queues", "steps", "interrupts", "checkpoints", "locks", "memory_items",
           "documents", "events", "schedules")  # fmt: skip
_sequences: list[str] = []
"""The names of a test schema's sequences (the same in every schema: one migration)."""


def _empty_schema(dsn: str, schema: str) -> None:
    """Make ``schema`` as a fresh migration leaves it: every table empty, counters reset."""
    import psycopg

    if not _admin:
        _admin.append(psycopg.connect(dsn, autocommit=True, connect_timeout=10))
    conn = _admin[0]
    if not _sequences:
        query = "SELECT sequence_name FROM information_schema.sequences WHERE sequence_schema = %s"
        _sequences.extend(sorted(name for (name,) in conn.execute(query, (schema,)).fetchall()))
    # DELETE, not TRUNCATE: a test leaves a few rows, and TRUNCATE makes new files for every
    # table and index (~25 ms a test here, against ~3 ms). One round trip: statements without
    # parameters go in one message.
    statements = [f'DELETE FROM "{schema}".{table}' for table in _TABLES]
    statements += [f'ALTER SEQUENCE "{schema}"."{sequence}" RESTART' for sequence in _sequences]
    statements.append(f'UPDATE "{schema}".memory_corpus SET documents = 0, length = 0')
    with conn.transaction():
        conn.execute("; ".join(statements))


def _retire(store: Store) -> None:
    """After a test: keep its postgres store for the next test if it is open and never
    started its listener (else close it, and offer its schema); close any other store."""
    if isinstance(store, _SettlingPostgresStore) and not (store.closed or store.listened):
        _idle_stores.append(store)
        return
    store.close()
    if isinstance(store, _SettlingPostgresStore):
        _free_schemas.append(store.schema)


def _drop_schemas(dsn: str) -> None:
    """Drop this process's schemas (a server kept across runs stays small)."""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            for start in range(0, len(_schemas_made), 100):
                names = ", ".join(f'"{n}"' for n in _schemas_made[start : start + 100])
                conn.execute(f"DROP SCHEMA IF EXISTS {names} CASCADE")
    except psycopg.Error:
        pass


STORE_BACKENDS: dict[str, StoreFactory] = {
    "memory": _memory_store,
    "sqlite": _sqlite_store,
    "postgres": _postgres_store,
}
"""Every backend the ``store`` fixture runs on, by test id. A new backend is one more entry
(one that needs a server fails in its factory when none is reachable: never a silent skip)."""


@pytest.fixture(params=list(STORE_BACKENDS))
def store_backend(request: pytest.FixtureRequest) -> str:
    """The id of the store backend this test runs on."""
    return str(request.param)


@pytest.fixture
def make_store(store_backend: str, workdir: Path) -> Iterator[Callable[..., Store]]:
    """``make_store(clock=None)`` → a fresh store of this test's backend, closed afterwards."""
    made: list[Store] = []

    def make(*, clock: Clock | None = None) -> Store:
        store = STORE_BACKENDS[store_backend](workdir / f"store-{len(made)}", clock)
        made.append(store)
        return store

    yield make
    for store in made:
        _retire(store)


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    """A fresh store of every backend (``[memory]``, ``[sqlite]``, ``[postgres]``)."""
    return make_store()


# -- time --------------------------------------------------------------------------------------


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    """A fake clock for runs started in this test; the system clock is back afterwards."""
    clock = FakeClock()
    RUNTIME.configure(clock=clock)
    try:
        yield clock
    finally:
        RUNTIME.configure(clock=SYSTEM_CLOCK)


# -- processes ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fork_server() -> Iterator[ForkServer]:
    """New Python processes, forked from one that imported the runtime once (per worker)."""
    with ForkServer() as server:
        yield server


@pytest.hookimpl(wrapper=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> Iterator[int]:
    """``-n auto`` runs two xdist workers more than the machine has cores.

    The suite waits for much of its time — on real processes it starts and kills, servers,
    PostgreSQL, a browser — rather than computing: with one worker per core, the suite used
    about half of a 2-core machine. There, three workers took it from 134-139 s to 111 s.
    Once its CPU was cut (issue 30), four did better than three on a quiet 2-core machine:
    86 s and 94 s against 97 s and 99 s, run in turn. A number given with ``-n``, or by
    ``PYTEST_XDIST_AUTO_NUM_WORKERS``, is used as it is.
    """
    count: int = yield
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return count
    return count + 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the shared-fixture tests on PostgreSQL under asyncio only (deselected, and counted
    as such in the summary, under trio).

    The store is the same code under both event loops (one program per operation), and what
    differs by backend — which path runs its SQL (psycopg's async API on asyncio, worker
    threads on trio) and the wake-ups rung from the listener thread — is tested on both by
    ``tests/runtime/test_postgres.py`` and on trio by every memory and SQLite test. Running
    every store test a fourth time would cost the suite ~15 s for no path not already covered.
    """
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        params = getattr(item, "callspec", None)
        ids = params.params if params is not None else {}
        if (
            ids.get("anyio_backend") == "trio"
            and ids.get("store_backend") == "postgres"
            and item.path.name != "test_postgres.py"
        ):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    items.sort(key=_runs_long, reverse=True)  # stable: otherwise in the order collected


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what the session has built so far out of the cyclic garbage collector's view.

    By the end of collection a process holds the runtime, its dependencies and every test
    module — long-lived objects that each full collection during the run would walk again
    (and pytest's five at the end, to flush unraisable exceptions: ~1 s a process here). What
    is garbage by then is collected first; what the tests make later is collected as before.
    """
    gc.collect()
    gc.freeze()


def _runs_long(item: pytest.Item) -> bool:
    """Whether ``item`` is one of the suite's long tests, which xdist is given first.

    pytest-xdist hands tests out in the order of ``items``; a long test handed out last keeps
    its worker busy while the others have finished (the Slack kill soak, ~15 s, used to start
    near the end). The long ones are those marked ``slow`` (real processes) and the
    property-based ones (hundreds of examples each); the rest, short, fill in around them.
    """
    return item.get_closest_marker("slow") is not None or bool(
        getattr(getattr(item, "obj", None), "is_hypothesis_test", False)
    )
