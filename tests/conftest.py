"""Shared fixtures: the anyio backends, the store backends, a fake clock, an isolated env.

* ``anyio_backend`` — every async test runs on asyncio and on trio. A test that truly needs
  asyncio (litellm, asyncio-only libraries) says so where it is defined, with
  ``tests.support.asyncio_only(reason)`` (or an ``anyio_backend`` fixture of its module or
  class returning ``"asyncio"``, with a comment saying why).
* ``workdir`` (autouse) — the test's own working directory, without AGENCY_STORE/AGENCY_MODEL.
* ``store`` — a fresh store of every backend in :data:`STORE_BACKENDS` (ids ``memory``,
  ``sqlite``); ``make_store(clock=...)`` makes more of the same backend (closed after the
  test). A test that is about one backend builds that backend itself, under another name.
* ``fake_clock`` — a :class:`FakeClock` that runs started in the test read (the system clock
  is back afterwards); stores that should follow it are built with ``make_store(clock=...)``.
* ``fork_server`` — starts the short-lived Python processes of crash and "another process"
  tests as forks of one process that imported the runtime once (``tests/forked.py``).
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agency_runtime import MemoryStore, SqliteStore, Store
from agency_runtime._boundary._runtime import RUNTIME
from agency_runtime._clock import SYSTEM_CLOCK, Clock, FakeClock
from tests.forked import ForkServer

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


STORE_BACKENDS: dict[str, StoreFactory] = {
    "memory": _memory_store,
    "sqlite": _sqlite_store,
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
        store.close()


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    """A fresh store of every backend (``[memory]``, ``[sqlite]``)."""
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
    server = ForkServer()
    try:
        yield server
    finally:
        server.close()
