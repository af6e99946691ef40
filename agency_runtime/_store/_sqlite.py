"""The embedded default store: one SQLite file in WAL mode.

Writes commit inline on the calling thread: a WAL commit with ``synchronous=NORMAL`` takes
tens of microseconds, less than one hop to a worker thread. Several processes may share one
file; ``busy_timeout`` makes a writer wait for another instead of failing.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic_core import from_json, to_json

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import (
    InvalidArgumentError,
    RunFinishedError,
    RunNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from .._types import (
    Checkpoint,
    Claim,
    InterruptAnswer,
    InterruptResponse,
    Journal,
    JournalEntry,
    MemoryRecord,
    RunEvent,
    RunRecord,
    RunStatus,
    Schedule,
)
from ._migrations import SCHEMA_VERSION, migrate
from ._rows import (
    SCHEDULE_COLUMNS,
    error_json,
    interrupts_json,
    journal_from_rows,
    listed_schedule,
    readable_schedules,
    record_from,
    run_from,
    run_values,
    schedule_from,
    schedule_values,
    waiting_json,
)
from ._rows import STEP_COLUMNS as _STEP_COLUMNS
from ._rules import DEFAULT_QUEUE, claim_decision, pick_claims, query_terms, queued_record
from ._wakeups import Wakeups

__all__ = ["SCHEMA_VERSION", "SqliteStore"]

WAL_LIMIT_BYTES = 1024 * 1024
"""The WAL's cap while runs write: SQLite checkpoints it once it holds this much
(``wal_autocheckpoint``) and truncates it back to this size (``journal_size_limit``). It can
grow past the cap only while another connection's read keeps a checkpoint from finishing."""

WAL_TRIM_BYTES = 256 * 1024
"""When a run ends and the WAL file is larger than this, it is checkpointed and truncated."""

PAGE_SIZE = 1024
"""The page size of a new database file, in bytes.

Smaller than SQLite's 4 KiB default: a journal row of a few kilobytes (an LLM call's prompt
and answer) then wastes at most a small page on its overflow chain instead of most of a 4 KiB
one, and each of the ~40 tables and indexes of an empty store starts with one small page.
"""

FILE_CHECK_SECONDS = 0.05
"""How often (at most) a step commit checks that the database file is still the one opened."""

_COLUMNS = (
    "run_id",
    "status",
    "entry",
    "arguments",
    "model",
    "overrides",
    "value",
    "error",
    "interrupts",
    "cost_pico",
    "tokens",
    "unjournaled_pico",
    "unjournaled_tokens",
    "attempts",
    "version",
    "lease_owner",
    "lease_expires_at",
    "created_at",
    "started_at",
    "finished_at",
    "updated_at",
    "queue",
    "priority",
    "wake_at",
    "waiting_for",
)
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM runs"
_HOLDS = "EXISTS (SELECT 1 FROM runs WHERE run_id = ? AND lease_owner = ? AND status = 'running')"
_INSERT_STEP = (
    f"INSERT INTO steps ({', '.join(_STEP_COLUMNS)}) "
    f"SELECT {', '.join('?' * len(_STEP_COLUMNS))} WHERE {_HOLDS}"
)

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
        clock: Clock | None = None,
    ) -> None:
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._path = str(path)
        self._url = url or f"sqlite:///{self._path}"
        self._lock = threading.Lock()
        self._wakeups = Wakeups()
        self._busy_ms = int(busy_timeout * 1000)
        self._conn = self._open(synchronous, busy_timeout)
        self._identity = self._file_identity()
        self._checked_at = time.monotonic()

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
        # A new file only (an existing one keeps its page size): must precede the switch to WAL.
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        if where != ":memory:":
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreUnavailableError(
                    f"the SQLite store {where!r} could not switch to WAL mode (got {mode!r}); "
                    "it may be on a file system without shared-memory support"
                )
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        conn.execute(f"PRAGMA wal_autocheckpoint = {max(1, WAL_LIMIT_BYTES // page_size)}")
        migrate(conn, self._path)

    # -- plumbing --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self._url

    @property
    def path(self) -> str:
        """The database file (or ``":memory:"``)."""
        return self._path

    def _file_identity(self) -> tuple[int, int] | None:
        """The (device, inode) of the database file now, ``None`` for ``:memory:``."""
        if self._path == ":memory:":
            return None
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            return (-1, -1)
        return (stat.st_dev, stat.st_ino)

    def _check_file(self, *, throttled: bool = False) -> None:
        """Refuse to write when the file this store opened was deleted or replaced.

        SQLite keeps writing to an unlinked file, so without this a deleted store would take
        every commit and report runs completed that no one can ever read back. Step commits
        look at most every :data:`FILE_CHECK_SECONDS` (a ``stat`` costs as much as a tenth of
        a commit); claims, pauses, rewinds and every run's outcome always look.
        """
        if self._identity is None:
            return
        if throttled:
            clock = time.monotonic()
            if clock - self._checked_at < FILE_CHECK_SECONDS:
                return
            self._checked_at = clock
        now = self._file_identity()
        if now != self._identity:
            what = "deleted" if now == (-1, -1) else "replaced by another file"
            raise StoreUnavailableError(
                f"the SQLite store file {self._path!r} was {what} while this process had it "
                "open; nothing written since then can be read back. Restore the file, or "
                "restart the process to open a new store (runs in it start over)"
            )

    @contextmanager
    def _db(
        self, what: str, *, write: bool = False, check: bool | Literal["throttled"] = False
    ) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._conn
            if conn is None:
                raise StoreError(f"the SQLite store {self._path!r} is closed")
            if check:
                self._check_file(throttled=check == "throttled")
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
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                raise self._mapped(what, exc) from exc

    def _mapped(self, what: str, exc: Exception) -> Exception:
        """Our error for ``exc``, raised by SQLite while trying to ``what``."""
        if isinstance(exc, UnicodeEncodeError):
            bad = exc.object[exc.start : exc.end]
            return InvalidArgumentError(
                f"cannot {what}: a text holds a lone surrogate ({bad!r} at position "
                f"{exc.start}), which is not valid UTF-8"
            )
        if isinstance(exc, OverflowError):
            return InvalidArgumentError(
                f"cannot {what}: a number is too large for the store ({exc})"
            )
        return StoreError(f"SQLite store {self._path!r} failed to {what}: {exc}")

    def _fetch(self, conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
        row = conn.execute(f"{_SELECT} WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else _record(row)

    # -- the Store protocol ----------------------------------------------------------------

    async def claim_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        lease_seconds: float,
        steal_from: str | None = None,
    ) -> Claim:
        now = self._clock.time()
        with self._db(f"claim run {record.run_id!r}", write=True, check=True) as conn:
            existing = self._fetch(conn, record.run_id)
            decision = claim_decision(existing, now, steal_from)
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
                "lease_expires_at = ?, wake_at = NULL, waiting_for = NULL WHERE run_id = ?",
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
                (self._clock.time() + lease_seconds, run_id, owner),
            )
            return cursor.rowcount == 1

    async def finish_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        unjournaled: tuple[int, int] = (0, 0),
        forget: Sequence[str] = (),
    ) -> bool:
        # One guarded UPDATE in autocommit (a transaction only when steps are forgotten).
        with self._db(
            f"store the outcome of run {record.run_id!r}", write=bool(forget), check=True
        ) as conn:
            pico, tokens = unjournaled
            if forget:
                if conn.execute(f"SELECT {_HOLDS}", (record.run_id, owner)).fetchone()[0] != 1:
                    return False
                dropped = _drop_steps(
                    conn, record.run_id, f"path IN ({', '.join('?' * len(forget))})", forget
                )
                pico, tokens = pico + dropped[0], tokens + dropped[1]
            now = self._clock.time()
            waiting = waiting_json(record.waiting_for)
            # A parked run wakes at once when an event it waits for is buffered already: one
            # statement, and SQLite has one writer, so a send racing the park is never missed.
            cursor = conn.execute(
                "UPDATE runs SET status = ?, value = ?, error = ?, interrupts = ?, "
                "cost_pico = ?, tokens = ?, unjournaled_pico = unjournaled_pico + ?, "
                "unjournaled_tokens = unjournaled_tokens + ?, finished_at = ?, "
                "updated_at = ?, version = version + 1, lease_owner = NULL, "
                "lease_expires_at = NULL, waiting_for = ?, wake_at = CASE WHEN ? IS NOT NULL "
                "AND EXISTS (SELECT 1 FROM events WHERE events.run_id = runs.run_id AND "
                "taken_by IS NULL AND name IN (SELECT value FROM json_each(?))) THEN ? "
                "ELSE ? END "
                "WHERE run_id = ? AND lease_owner = ? AND status = 'running'",
                (
                    record.status,
                    record.value,
                    error_json(record.error),
                    interrupts_json(record.interrupts),
                    record.cost_pico,
                    record.tokens,
                    pico,
                    tokens,
                    record.finished_at,
                    now,
                    waiting,
                    waiting,
                    waiting,
                    now,
                    record.wake_at,
                    record.run_id,
                    owner,
                ),
            )
            finished = cursor.rowcount == 1
        if finished:
            self._wakeups.ring()
        self._trim_wal()
        return finished

    def _trim_wal(self) -> None:
        """Fold a large WAL back into the database at a run's end, so the file stays small."""
        if self._path == ":memory:":
            return
        try:
            size = os.path.getsize(self._path + "-wal")
        except OSError:
            return
        if size > WAL_TRIM_BYTES:
            with self._db("checkpoint the WAL") as conn:
                # Without waiting: while another process reads or writes the file the
                # checkpoint gives up at once (the next run's end tries again) instead of
                # holding this run's end for up to busy_timeout.
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

    async def get_run(self, run_id: str) -> RunRecord | None:
        with self._db(f"read run {run_id!r}") as conn:
            return self._fetch(conn, run_id)

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100, offset: int = 0
    ) -> list[RunRecord]:
        query, params = _SELECT, ()  # type: tuple[str, tuple[Any, ...]]
        if status is not None:
            query, params = f"{_SELECT} WHERE status = ?", (status,)
        with self._db("list runs") as conn:
            rows = conn.execute(
                f"{query} ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?",
                (*params, limit, offset),
            ).fetchall()
        return [_listed(row) for row in rows]

    # -- the journal ---------------------------------------------------------------------

    async def load_journal(self, run_id: str) -> Journal:
        with self._db(f"load the journal of run {run_id!r}") as conn:
            steps = conn.execute(
                f"SELECT {', '.join(_STEP_COLUMNS)} FROM steps WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
            answers = conn.execute(
                "SELECT seq, interrupt, response, answered_at FROM interrupts "
                "WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
            checkpoints = conn.execute(
                "SELECT body FROM checkpoints WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
        return journal_from_rows(run_id, steps, answers, checkpoints)

    async def commit_step(self, entry: JournalEntry, *, owner: str) -> bool:
        values = (
            entry.run_id,
            entry.path,
            entry.seq,
            entry.name,
            entry.callsite,
            entry.result,
            entry.locals,
            entry.scopes,
            entry.deltas,
            entry.error,
            entry.cost_pico,
            entry.tokens,
            entry.created_at,
            entry.run_id,
            owner,
        )
        with self._lock:  # what _db does, inline: this runs once per step
            conn = self._conn
            if conn is None:
                raise StoreError(f"the SQLite store {self._path!r} is closed")
            self._check_file(throttled=True)
            try:
                return conn.execute(_INSERT_STEP, values).rowcount == 1
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                what = f"commit step {entry.path!r} of run {entry.run_id!r}"
                raise self._mapped(what, exc) from exc

    async def record_interrupts(self, answers: list[InterruptAnswer], *, owner: str) -> bool:
        if not answers:
            return True
        run_id = answers[0].run_id
        with self._db(f"record the interrupts of run {run_id!r}", write=True, check=True) as conn:
            if conn.execute(f"SELECT {_HOLDS}", (run_id, owner)).fetchone()[0] != 1:
                return False
            conn.executemany(
                "INSERT OR REPLACE INTO interrupts "
                "(run_id, interrupt_id, seq, interrupt, response, answered_at) "
                "VALUES (?, ?, ?, ?, NULL, NULL)",
                [
                    (a.run_id, a.interrupt.interrupt_id, a.seq, a.interrupt.model_dump_json())
                    for a in answers
                ],
            )
            return True

    async def answer_interrupts(
        self, run_id: str, responses: dict[str, InterruptResponse], *, enqueue: bool = False
    ) -> list[str]:
        now = self._clock.time()
        try:
            with self._db(f"answer the interrupts of run {run_id!r}", write=True) as conn:
                refused = [
                    key
                    for key, response in responses.items()
                    if conn.execute(
                        "UPDATE interrupts SET response = ?, answered_at = ? "
                        "WHERE run_id = ? AND interrupt_id = ? AND response IS NULL",
                        (response.model_dump_json(), now, run_id, key),
                    ).rowcount
                    != 1
                ]
                if refused:
                    raise _Refused(refused)  # rolls the whole transaction back
                conn.execute(
                    "UPDATE runs SET version = version + 1, updated_at = ? WHERE run_id = ?",
                    (now, run_id),
                )
                if enqueue:
                    conn.execute(
                        "UPDATE runs SET status = 'queued', queue = COALESCE(queue, ?) "
                        "WHERE run_id = ? AND status = 'paused'",
                        (DEFAULT_QUEUE, run_id),
                    )
        except _Refused as refusal:
            return refusal.keys
        if enqueue:
            self._wakeups.ring()
        return []

    async def save_checkpoint(self, checkpoint: Checkpoint, *, owner: str) -> bool:
        run_id = checkpoint.run_id or ""
        with self._db(f"save checkpoint {checkpoint.checkpoint_id!r}", check=True) as conn:
            cursor = conn.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, checkpoint_id, seq, body) "
                f"SELECT ?, ?, ?, ? WHERE {_HOLDS}",
                (
                    run_id,
                    checkpoint.checkpoint_id,
                    checkpoint.seq,
                    checkpoint.model_dump_json(),
                    run_id,
                    owner,
                ),
            )
            return cursor.rowcount == 1

    async def rewind(
        self,
        run_id: str,
        seq: int,
        *,
        owner: str,
        overrides: str | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        with self._db(f"rewind run {run_id!r}", write=True, check=True) as conn:
            if conn.execute(f"SELECT {_HOLDS}", (run_id, owner)).fetchone()[0] != 1:
                return False
            if overrides is not None:
                conn.execute("UPDATE runs SET overrides = ? WHERE run_id = ?", (overrides, run_id))
            pico, tokens = _drop_steps(conn, run_id, "seq > ?", (seq,))
            conn.execute(
                "UPDATE runs SET unjournaled_pico = unjournaled_pico + ?, "
                "unjournaled_tokens = unjournaled_tokens + ? WHERE run_id = ?",
                (pico, tokens, run_id),
            )
            for table in ("interrupts", "checkpoints"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ? AND seq > ?", (run_id, seq))
            if checkpoint is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO checkpoints (run_id, checkpoint_id, seq, body) "
                    "VALUES (?, ?, ?, ?)",
                    (run_id, checkpoint.checkpoint_id, checkpoint.seq,
                     checkpoint.model_dump_json()),
                )  # fmt: skip
            return True

    # -- administration -------------------------------------------------------------------

    async def cancel_run(self, run_id: str) -> RunRecord | None:
        now = self._clock.time()
        with self._db(f"cancel run {run_id!r}", write=True) as conn:
            conn.execute(
                "UPDATE runs SET status = 'cancelled', lease_owner = NULL, "
                "lease_expires_at = NULL, version = version + 1, finished_at = ?, "
                "updated_at = ? WHERE run_id = ? AND status NOT IN ('completed', 'cancelled')",
                (now, now, run_id),
            )
            cancelled = self._fetch(conn, run_id)
        self._wakeups.ring()
        return cancelled

    async def fork_run(self, run_id: str, new_run_id: str, upto_seq: int) -> RunRecord:
        with self._db(f"fork run {run_id!r}", write=True) as conn:
            source = self._fetch(conn, run_id)
            if source is None:
                raise RunNotFoundError(run_id, self.url)
            pico, tokens = conn.execute(
                "SELECT COALESCE(SUM(cost_pico), 0), COALESCE(SUM(tokens), 0) FROM steps "
                "WHERE run_id = ? AND seq <= ?",
                (run_id, upto_seq),
            ).fetchone()
            forked = source.fork_as(new_run_id, cost_pico=int(pico), tokens=int(tokens))
            conn.execute(
                f"INSERT INTO runs ({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                _row(forked),
            )
            others = ", ".join(_STEP_COLUMNS[1:])
            conn.execute(
                f"INSERT INTO steps ({', '.join(_STEP_COLUMNS)}) SELECT ?, {others} "
                "FROM steps WHERE run_id = ? AND seq <= ?",
                (new_run_id, run_id, upto_seq),
            )
            # Answers are not copied: interrupt ids derive from the run id.
            for cid, seq, body in conn.execute(
                "SELECT checkpoint_id, seq, body FROM checkpoints WHERE run_id = ? AND seq <= ?",
                (run_id, upto_seq),
            ).fetchall():
                moved = Checkpoint.model_validate_json(body).model_copy(
                    update={"run_id": new_run_id}
                )
                conn.execute(
                    "INSERT INTO checkpoints (run_id, checkpoint_id, seq, body) "
                    "VALUES (?, ?, ?, ?)",
                    (new_run_id, cid, seq, moved.model_dump_json()),
                )
            return forked

    # -- queues -------------------------------------------------------------------------------

    async def enqueue_run(self, record: RunRecord) -> Claim:
        now = self._clock.time()
        with self._db(f"queue run {record.run_id!r}", write=True, check=True) as conn:
            existing = self._fetch(conn, record.run_id)
            if existing is not None:
                return Claim(acquired=False, created=False, record=existing)
            stored = queued_record(record, now)
            conn.execute(
                f"INSERT INTO runs ({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                _row(stored),
            )
        self._wakeups.ring()
        return Claim(acquired=False, created=True, record=stored)

    async def claim_queued(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[RunRecord]:
        if limit <= 0 or not queues:
            return []
        now = self._clock.time()
        names = ", ".join("?" * len(queues))
        with self._db("claim queued runs", write=True, check="throttled") as conn:
            room = dict(
                conn.execute(
                    f"SELECT name, concurrency FROM queues WHERE name IN ({names}) "
                    "AND concurrency IS NOT NULL",
                    tuple(queues),
                ).fetchall()
            )
            for queue, running in conn.execute(
                f"SELECT queue, COUNT(*) FROM runs WHERE queue IN ({names}) "
                "AND status = 'running' AND lease_expires_at > ? GROUP BY queue",
                (*queues, now),
            ).fetchall():
                if queue in room:
                    room[queue] -= running
            skipped = ", ".join("?" * len(exclude))
            candidates = conn.execute(
                f"SELECT run_id, queue FROM runs WHERE queue IN ({names}) AND (status = 'queued' "
                "OR (status = 'running' AND COALESCE(lease_expires_at, 0) <= ?) "
                "OR (status = 'waiting' AND wake_at <= ?)) "
                + (f"AND run_id NOT IN ({skipped}) " if exclude else "")
                + "ORDER BY priority DESC, created_at, rowid",
                (*queues, now, now, *exclude),
            )
            claimed: list[RunRecord] = []
            for run_id in pick_claims(candidates, room, limit):
                conn.execute(
                    "UPDATE runs SET status = 'running', attempts = attempts + 1, "
                    "version = version + 1, started_at = COALESCE(started_at, ?), "
                    "updated_at = ?, lease_owner = ?, lease_expires_at = ?, wake_at = NULL, "
                    "waiting_for = NULL WHERE run_id = ?",
                    (now, now, owner, now + lease_seconds, run_id),
                )
                taken = self._fetch(conn, run_id)
                assert taken is not None
                claimed.append(taken)
            return claimed

    async def configure_queue(self, name: str, *, concurrency: int | None) -> None:
        with self._db(f"configure queue {name!r}", write=True) as conn:
            conn.execute(
                "INSERT INTO queues (name, concurrency) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency",
                (name, concurrency),
            )
        self._wakeups.ring()  # a raised limit may make runs claimable

    async def queue_concurrency(self, name: str) -> int | None:
        with self._db(f"read queue {name!r}") as conn:
            row = conn.execute("SELECT concurrency FROM queues WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]

    async def next_wake(self, queues: Sequence[str], *, after: float | None = None) -> float | None:
        if not queues:
            return None
        names = ", ".join("?" * len(queues))
        floor = -math.inf if after is None else after
        with self._db("read when runs fall due") as conn:
            (waking,) = conn.execute(
                f"SELECT MIN(wake_at) FROM runs WHERE queue IN ({names}) AND status = 'waiting' "
                "AND wake_at > ?",
                (*queues, floor),
            ).fetchone()
            (scheduled,) = conn.execute(
                f"SELECT MIN(next_at) FROM schedules WHERE queue IN ({names}) AND next_at > ?",
                (*queues, floor),
            ).fetchone()
        times = [t for t in (waking, scheduled) if t is not None]
        return min(times) if times else None

    async def wait_for_runs(self, timeout: float) -> None:
        await self._wakeups.wait(timeout)

    # -- events -------------------------------------------------------------------------------

    async def send_event(self, run_id: str, name: str, payload: str) -> RunEvent:
        now = self._clock.time()
        with self._db(f"send event {name!r} to run {run_id!r}", write=True, check=True) as conn:
            row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFoundError(run_id, self.url)
            if row[0] in ("completed", "cancelled"):
                raise RunFinishedError(run_id, row[0], name)
            event_id = conn.execute(
                "INSERT INTO events (run_id, name, payload, sent_at) VALUES (?, ?, ?, ?)",
                (run_id, name, payload, now),
            ).lastrowid
            conn.execute(
                "UPDATE runs SET wake_at = ?, updated_at = ? WHERE run_id = ? AND "
                "status = 'waiting' AND ? IN (SELECT value FROM json_each(waiting_for))",
                (now, now, run_id, name),
            )
        assert event_id is not None
        self._wakeups.ring()
        return RunEvent(event_id=event_id, run_id=run_id, name=name, payload=payload, sent_at=now)

    async def take_event(self, run_id: str, name: str, taker: str) -> RunEvent | None:
        columns = "event_id, run_id, name, payload, sent_at, taken_by"
        with self._db(f"take event {name!r} of run {run_id!r}", write=True) as conn:
            row = conn.execute(
                f"SELECT {columns} FROM events WHERE run_id = ? AND taken_by = ? AND name = ?",
                (run_id, taker, name),
            ).fetchone()
            if row is None:
                row = conn.execute(
                    f"SELECT {columns} FROM events WHERE run_id = ? AND name = ? "
                    "AND taken_by IS NULL ORDER BY event_id LIMIT 1",
                    (run_id, name),
                ).fetchone()
                if row is None:
                    return None
                conn.execute("UPDATE events SET taken_by = ? WHERE event_id = ?", (taker, row[0]))
                row = (*row[:5], taker)
        return RunEvent(**dict(zip(columns.split(", "), row, strict=True)))

    # -- schedules ----------------------------------------------------------------------------

    async def put_schedule(self, schedule: Schedule) -> None:
        with self._db(f"store schedule {schedule.name!r}", write=True, check=True) as conn:
            conn.execute(
                f"INSERT OR REPLACE INTO schedules ({', '.join(SCHEDULE_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(SCHEDULE_COLUMNS))})",
                schedule_values(schedule),
            )
        self._wakeups.ring()

    async def get_schedule(self, name: str) -> Schedule | None:
        with self._db(f"read schedule {name!r}") as conn:
            row = conn.execute(
                f"SELECT {', '.join(SCHEDULE_COLUMNS)} FROM schedules WHERE name = ?", (name,)
            ).fetchone()
        return None if row is None else schedule_from(row)

    async def list_schedules(self) -> list[Schedule]:
        with self._db("list schedules") as conn:
            rows = conn.execute(
                f"SELECT {', '.join(SCHEDULE_COLUMNS)} FROM schedules ORDER BY name"
            ).fetchall()
        return [listed_schedule(row) for row in rows]

    async def remove_schedule(self, name: str) -> bool:
        with self._db(f"remove schedule {name!r}", write=True) as conn:
            return conn.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount == 1

    async def due_schedules(self, queues: Sequence[str], now: float) -> list[Schedule]:
        if not queues:
            return []
        names = ", ".join("?" * len(queues))
        with self._db("read due schedules") as conn:
            rows = conn.execute(
                f"SELECT {', '.join(SCHEDULE_COLUMNS)} FROM schedules "
                f"WHERE queue IN ({names}) AND next_at <= ? ORDER BY next_at, name",
                (*queues, now),
            ).fetchall()
        return readable_schedules(rows)

    async def fire_schedule(self, name: str, *, due: float, next_at: float, run: RunRecord) -> bool:
        now = self._clock.time()
        with self._db(f"fire schedule {name!r}", write=True, check=True) as conn:
            moved = conn.execute(
                "UPDATE schedules SET next_at = ?, updated_at = ? WHERE name = ? AND next_at = ?",
                (next_at, now, name, due),
            ).rowcount
            if moved != 1:
                return False
            conn.execute(
                f"INSERT OR IGNORE INTO runs ({', '.join(_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_COLUMNS))})",
                _row(queued_record(run, now)),
            )
        self._wakeups.ring()
        return True

    # -- memory -------------------------------------------------------------------------------

    async def save_memory(self, record: MemoryRecord) -> bool:
        with self._db(f"save memory {record.id!r}", write=True) as conn:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO memory_items (id, namespace, content, tags, scope, "
                "created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    record.namespace,
                    record.content,
                    to_json(record.tags).decode(),
                    record.scope,
                    record.created_at,
                    record.expires_at,
                ),
            )
            if cursor.rowcount != 1:
                return False  # saved before under this id: an idempotent repeat
            rowid = cursor.lastrowid
            conn.execute(
                "INSERT INTO memory_fts (rowid, content) VALUES (?, ?)", (rowid, record.content)
            )
            conn.executemany(
                "INSERT OR IGNORE INTO memory_tags (tag, item) VALUES (?, ?)",
                [(tag, rowid) for tag in record.tags],
            )
            return True

    async def recall_memory(
        self,
        *,
        namespace: str,
        query: str,
        tags: list[str],
        scope: str | None,
        limit: int,
        now: float,
    ) -> list[MemoryRecord]:
        # "+m.namespace": never drive the search from the namespace index; a conversation's
        # tag (when given) narrows far better, so a new or quiet conversation costs little.
        where = ["+m.namespace = ?", "(m.expires_at IS NULL OR m.expires_at > ?)"]
        params: list[Any] = [namespace, now]
        if scope is not None:
            where.append("m.scope = ?")
            params.append(scope)
        for index, tag in enumerate(dict.fromkeys(tags)):
            if index == 0:
                where.append("m.rowid IN (SELECT item FROM memory_tags WHERE tag = ?)")
            else:
                where.append(
                    "EXISTS (SELECT 1 FROM memory_tags t WHERE t.tag = ? AND t.item = m.rowid)"
                )
            params.append(tag)
        columns = (
            "m.id, m.namespace, m.content, m.tags, m.scope, m.created_at, m.expires_at, m.rowid"
        )
        terms = query_terms(query)
        with self._db("recall memory") as conn:
            rows = []
            if terms:
                match = " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
                rows = conn.execute(
                    f"SELECT {columns} FROM memory_fts f JOIN memory_items m ON m.rowid = f.rowid "
                    f"WHERE memory_fts MATCH ? AND {' AND '.join(where)} "
                    "ORDER BY bm25(memory_fts), m.created_at DESC, m.rowid DESC LIMIT ?",
                    (match, *params, limit),
                ).fetchall()
            if not rows:
                rows = conn.execute(
                    f"SELECT {columns} FROM memory_items m WHERE {' AND '.join(where)} "
                    "ORDER BY m.created_at DESC, m.rowid DESC LIMIT ?",
                    (*params, limit),
                ).fetchall()
        rows.sort(key=lambda row: (row[5], row[7]), reverse=True)  # newest first, ties by save
        return [
            MemoryRecord(
                id=row[0], namespace=row[1], content=row[2], tags=from_json(row[3]),
                scope=row[4], created_at=row[5], expires_at=row[6],
            )
            for row in rows
        ]  # fmt: skip

    async def expire_memory(self, namespace: str, ids: list[str], *, at: float) -> int:
        with self._db("expire memory", write=True) as conn:
            return sum(
                conn.execute(
                    "UPDATE memory_items SET expires_at = ? WHERE namespace = ? AND id = ?",
                    (at, namespace, item),
                ).rowcount
                for item in ids
            )

    async def purge_memory(self, *, now: float) -> int:
        with self._db("purge expired memory", write=True) as conn:
            expired = [
                rowid
                for (rowid,) in conn.execute(
                    "SELECT rowid FROM memory_items "
                    "WHERE expires_at IS NOT NULL AND expires_at <= ?",
                    (now,),
                )
            ]
            for rowid in expired:
                conn.execute("DELETE FROM memory_fts WHERE rowid = ?", (rowid,))
                conn.execute("DELETE FROM memory_tags WHERE item = ?", (rowid,))
                conn.execute("DELETE FROM memory_items WHERE rowid = ?", (rowid,))
            return len(expired)

    async def get_document(self, namespace: str, key: str) -> str | None:
        with self._db(f"read document {namespace}/{key}") as conn:
            row = conn.execute(
                "SELECT body FROM documents WHERE namespace = ? AND key = ?", (namespace, key)
            ).fetchone()
        return None if row is None else str(row[0])

    async def put_document(self, namespace: str, key: str, body: str) -> None:
        with self._db(f"write document {namespace}/{key}") as conn:
            conn.execute(
                "INSERT OR REPLACE INTO documents (namespace, key, body) VALUES (?, ?, ?)",
                (namespace, key, body),
            )

    def close(self) -> None:
        """Close the connection (idempotent); the file stays."""
        with self._lock:
            conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is not None:
            conn.close()

    def __repr__(self) -> str:
        return f"<SqliteStore {self._path!r}>"

    # -- global locks ------------------------------------------------------------------------

    async def enqueue_lock(self, name: str, owner: str, lease_seconds: float) -> int:
        now = self._clock.time()
        with self._db(f"queue for lock {name!r}", write=True) as conn:
            conn.execute("DELETE FROM locks WHERE name = ? AND expires_at <= ?", (name, now))
            ticket = conn.execute(
                "INSERT INTO locks (name, owner, expires_at) VALUES (?, ?, ?)",
                (name, owner, now + lease_seconds),
            ).lastrowid
        assert ticket is not None
        return ticket

    async def lock_holder(self, name: str) -> tuple[int, str] | None:
        with self._db(f"read the holder of lock {name!r}") as conn:
            row = conn.execute(
                "SELECT ticket, owner FROM locks WHERE name = ? AND expires_at > ? "
                "ORDER BY ticket LIMIT 1",
                (name, self._clock.time()),
            ).fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    async def lock_turn(self, name: str, ticket: int, owner: str, lease_seconds: float) -> bool:
        now = self._clock.time()
        with self._db(f"take a turn at lock {name!r}", write=True) as conn:
            renewed = conn.execute(
                "UPDATE locks SET expires_at = ? WHERE ticket = ? AND name = ? AND owner = ?",
                (now + lease_seconds, ticket, name, owner),
            ).rowcount
            conn.execute("DELETE FROM locks WHERE name = ? AND expires_at <= ?", (name, now))
            first = conn.execute(
                "SELECT ticket FROM locks WHERE name = ? ORDER BY ticket LIMIT 1", (name,)
            ).fetchone()
        return renewed == 1 and first is not None and first[0] == ticket

    async def release_lock(self, name: str, ticket: int) -> None:
        with self._db(f"release lock {name!r}", write=True) as conn:
            conn.execute("DELETE FROM locks WHERE ticket = ? AND name = ?", (ticket, name))


def _drop_steps(
    conn: sqlite3.Connection, run_id: str, where: str, params: Sequence[Any]
) -> tuple[int, int]:
    """Delete the run's steps matching ``where``; return the spend they held.

    The spend stays the run's (money spent is never given back): callers add it to the
    run's unjournaled spend in the same transaction.
    """
    pico, tokens = conn.execute(
        "SELECT COALESCE(SUM(cost_pico), 0), COALESCE(SUM(tokens), 0) FROM steps "
        f"WHERE run_id = ? AND {where}",
        (run_id, *params),
    ).fetchone()
    conn.execute(f"DELETE FROM steps WHERE run_id = ? AND {where}", (run_id, *params))
    return int(pico), int(tokens)


class _Refused(Exception):
    """Internal: aborts a write transaction that must leave nothing behind."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys


def _row(record: RunRecord) -> tuple[Any, ...]:
    values = run_values(record)
    return tuple(values[column] for column in _COLUMNS)


def _record(row: tuple[Any, ...]) -> RunRecord:
    return record_from(dict(zip(_COLUMNS, row, strict=True)))


def _listed(row: tuple[Any, ...]) -> RunRecord:
    """A listed run: a damaged row is listed marked damaged (``_rows.run_from``)."""
    return run_from(dict(zip(_COLUMNS, row, strict=True)))
