"""The embedded default store: one SQLite file in WAL mode.

Writes commit inline on the calling thread: a WAL commit with ``synchronous=NORMAL`` takes
tens of microseconds, less than one hop to a worker thread. Several processes may share one
file; ``busy_timeout`` makes a writer wait for another instead of failing.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter

from .._errors import StoreError, StoreSchemaError, StoreUnavailableError
from .._results import ErrorInfo, Interrupt, RunStatus
from ._base import Claim, RunRecord, claim_decision

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

SCHEMA_VERSION = 1
"""The schema this version writes; a file with a higher ``user_version`` is refused."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id           TEXT PRIMARY KEY,
    status           TEXT NOT NULL,
    entry            TEXT NOT NULL,
    arguments        TEXT NOT NULL,
    model            TEXT,
    value            TEXT,
    error            TEXT,
    interrupts       TEXT,
    cost_pico        INTEGER NOT NULL DEFAULT 0,
    tokens           INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    version          INTEGER NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at REAL,
    created_at       REAL NOT NULL,
    started_at       REAL,
    finished_at      REAL,
    updated_at       REAL NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created_at);
"""

_COLUMNS = (
    "run_id",
    "status",
    "entry",
    "arguments",
    "model",
    "value",
    "error",
    "interrupts",
    "cost_pico",
    "tokens",
    "attempts",
    "version",
    "lease_owner",
    "lease_expires_at",
    "created_at",
    "started_at",
    "finished_at",
    "updated_at",
)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM runs"
_INTERRUPTS = TypeAdapter(list[Interrupt])

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]


class SqliteStore:
    """Runs in one SQLite file (WAL journal), shareable by several processes.

    ``path`` may be ``":memory:"`` for a private in-memory database. ``synchronous``
    trades durability on power loss for speed: ``"NORMAL"`` (default) never corrupts and
    loses at most the last commits on an OS crash; ``"FULL"`` loses nothing.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 10.0,
        url: str | None = None,
    ) -> None:
        self._path = str(path)
        self._url = url or f"sqlite:///{self._path}"
        self._lock = threading.Lock()
        self._conn = self._open(synchronous, busy_timeout)

    # -- opening ---------------------------------------------------------------------------

    def _open(self, synchronous: str, busy_timeout: float) -> sqlite3.Connection:
        where = self._path
        if where != ":memory:":
            try:
                Path(where).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailableError(
                    f"cannot create the directory for the SQLite store {where!r}: {exc}. "
                    "Choose a writable location with AGENCY_STORE=sqlite:///path/to/agency.db"
                ) from exc
        try:
            conn = sqlite3.connect(
                where, isolation_level=None, check_same_thread=False, timeout=busy_timeout
            )
        except sqlite3.Error as exc:
            raise StoreUnavailableError(
                f"cannot open the SQLite store {where!r}: {exc}. Check that the path is a "
                "writable file location, or choose another with "
                "AGENCY_STORE=sqlite:///path/to/agency.db"
            ) from exc
        try:
            self._configure_with_retry(conn, synchronous, busy_timeout)
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailableError(
                f"cannot use the SQLite store {where!r}: {exc}. Check that the file is a "
                "writable SQLite database, or choose another with "
                "AGENCY_STORE=sqlite:///path/to/agency.db"
            ) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _configure_with_retry(
        self, conn: sqlite3.Connection, synchronous: str, busy_timeout: float
    ) -> None:
        """Set the pragmas and migrate, retrying while another process holds the file.

        Switching to WAL and the first schema write can report "database is locked" without
        consulting the busy handler when several processes open a new file at once.
        """
        deadline = time.monotonic() + busy_timeout
        delay = 0.005
        while True:
            try:
                self._configure(conn, synchronous, busy_timeout)
                return
            except sqlite3.OperationalError as exc:
                text = str(exc).lower()
                if ("locked" not in text and "busy" not in text) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    def _configure(self, conn: sqlite3.Connection, synchronous: str, busy_timeout: float) -> None:
        where = self._path
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        if where != ":memory:":
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreUnavailableError(
                    f"the SQLite store {where!r} could not switch to WAL mode (got {mode!r}); "
                    "it may be on a file system without shared-memory support"
                )
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        self._migrate(conn)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"the SQLite store {self._path!r} was written with schema version {version}, "
                f"but this agency-runtime understands versions up to {SCHEMA_VERSION}; "
                "upgrade agency-runtime (pip install -U agency-runtime) to use it"
            )
        if version < SCHEMA_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                    for statement in _SCHEMA.split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    # -- plumbing --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def path(self) -> str:
        """The database file (or ``":memory:"``)."""
        return self._path

    @contextmanager
    def _db(self, what: str, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError(f"the SQLite store {self._path!r} is closed")
            try:
                if write:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield conn
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
                else:
                    yield conn
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite store {self._path!r} failed to {what}: {exc}") from exc

    def _fetch(self, conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
        row = conn.execute(f"{_SELECT} WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else _record(row)

    # -- the Store protocol ----------------------------------------------------------------

    async def claim_run(self, record: RunRecord, *, owner: str, lease_seconds: float) -> Claim:
        now = time.time()
        with self._db(f"claim run {record.run_id!r}", write=True) as conn:
            existing = self._fetch(conn, record.run_id)
            decision = claim_decision(existing, now)
            if decision == "refuse":
                assert existing is not None
                return Claim(acquired=False, created=False, record=existing)
            if decision == "insert":
                stored = record.model_copy(
                    update={
                        "status": "running",
                        "attempts": 1,
                        "version": 1,
                        "started_at": now,
                        "updated_at": now,
                        "lease_owner": owner,
                        "lease_expires_at": now + lease_seconds,
                    }
                )
                conn.execute(
                    f"INSERT INTO runs ({', '.join(_COLUMNS)}) "
                    f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                    _row(stored),
                )
                return Claim(acquired=True, created=True, record=stored)
            assert existing is not None
            conn.execute(
                "UPDATE runs SET status = 'running', attempts = attempts + 1, "
                "version = version + 1, started_at = ?, updated_at = ?, lease_owner = ?, "
                "lease_expires_at = ? WHERE run_id = ?",
                (now, now, owner, now + lease_seconds, record.run_id),
            )
            taken = self._fetch(conn, record.run_id)
            assert taken is not None
            return Claim(acquired=True, created=False, record=taken)

    async def renew_lease(self, run_id: str, *, owner: str, lease_seconds: float) -> bool:
        with self._db(f"renew the lease of run {run_id!r}") as conn:
            cursor = conn.execute(
                "UPDATE runs SET lease_expires_at = ? "
                "WHERE run_id = ? AND lease_owner = ? AND status = 'running'",
                (time.time() + lease_seconds, run_id, owner),
            )
            return cursor.rowcount == 1

    async def finish_run(self, record: RunRecord, *, owner: str) -> bool:
        with self._db(f"store the outcome of run {record.run_id!r}") as conn:
            cursor = conn.execute(
                "UPDATE runs SET status = ?, value = ?, error = ?, interrupts = ?, "
                "cost_pico = ?, tokens = ?, finished_at = ?, updated_at = ?, "
                "version = version + 1, lease_owner = NULL, lease_expires_at = NULL "
                "WHERE run_id = ? AND lease_owner = ? AND status = 'running'",
                (
                    record.status,
                    record.value,
                    _error_json(record.error),
                    _interrupts_json(record.interrupts),
                    record.cost_pico,
                    record.tokens,
                    record.finished_at,
                    time.time(),
                    record.run_id,
                    owner,
                ),
            )
            return cursor.rowcount == 1

    async def get_run(self, run_id: str) -> RunRecord | None:
        with self._db(f"read run {run_id!r}") as conn:
            return self._fetch(conn, run_id)

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord]:
        query, params = _SELECT, ()  # type: tuple[str, tuple[Any, ...]]
        if status is not None:
            query, params = f"{_SELECT} WHERE status = ?", (status,)
        with self._db("list runs") as conn:
            rows = conn.execute(
                f"{query} ORDER BY created_at DESC, rowid DESC LIMIT ?", (*params, limit)
            ).fetchall()
        return [_record(row) for row in rows]

    def close(self) -> None:
        """Close the connection (idempotent); the file stays."""
        with self._lock:
            conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            conn.close()

    def __repr__(self) -> str:
        return f"<SqliteStore {self._path!r}>"


def _error_json(error: ErrorInfo | None) -> str | None:
    return None if error is None else error.model_dump_json()


def _interrupts_json(interrupts: list[Interrupt]) -> str | None:
    return _INTERRUPTS.dump_json(interrupts).decode() if interrupts else None


def _row(record: RunRecord) -> tuple[Any, ...]:
    values = record.model_dump()
    values["error"] = _error_json(record.error)
    values["interrupts"] = _interrupts_json(record.interrupts)
    return tuple(values[column] for column in _COLUMNS)


def _record(row: tuple[Any, ...]) -> RunRecord:
    values = dict(zip(_COLUMNS, row, strict=True))
    run_id = values["run_id"]
    try:
        values["error"] = (
            None if values["error"] is None else ErrorInfo.model_validate_json(values["error"])
        )
        values["interrupts"] = (
            [] if values["interrupts"] is None else _INTERRUPTS.validate_json(values["interrupts"])
        )
        return RunRecord.model_validate(values)
    except ValueError as exc:
        raise StoreError(f"the stored row of run {run_id!r} is damaged: {exc}") from exc
