"""The PostgreSQL store: runs shared by many processes and machines (``postgresql://…``).

Every operation is written once, as a *program*: a generator that yields its statements
(:class:`_Sql`, the SQL and its parameters) and is sent back each one's rows (:class:`_Result`),
so the same SQL and logic run on either of two paths. On asyncio, an operation outside a
transaction (a step's commit, a lease renewal, most outcomes and reads) runs on psycopg's async
API: a connection of an :class:`~._pg_pool.AsyncPool`, waited on by the event loop itself, no
thread. Transactions and other operations of several statements (a claim, loading a journal),
and everything on trio (psycopg's async API is asyncio-only), run on a connection of a psycopg
3 ``ConnectionPool`` in a worker thread (``anyio.to_thread``): there the statements go back to
back, while on the loop each would wait for the task's next turn, so on a busy loop a claim
would hold its row locks, and keep a worker's slots empty, several times longer.

Connections are in autocommit mode, and a statement a connection has run
:data:`PREPARE_THRESHOLD` times is prepared on the server (psycopg's default), which spares
PostgreSQL parsing and planning it again: most of the cost of the short statements a step
makes. Poolers in transaction mode that cannot keep prepared statements (PgBouncer before
1.21, or with ``max_prepared_statements = 0``) need ``prepare=False`` (``?prepare=false`` in
the URL): then nothing is prepared. psycopg is imported when a store is built, never by
``import agency_runtime``.

The semantics are the SQLite store's (:mod:`._sqlite`), with the guarantees a shared server
needs: runs are held by leases that expire (never session locks); a write made for a lease
holder (a step, a checkpoint, a pause, an outcome) checks the lease in the same statement or
transaction and locks the run's row while it does, so a worker that lost its lease cannot
commit; queued runs are claimed with ``FOR UPDATE SKIP LOCKED`` under a lock on each limited
queue's row; and whatever makes a run queued or ends it sends ``NOTIFY`` in the same
transaction, so another process's :meth:`PostgresStore.wait_for_runs` wakes only after the
commit. Times come from the store's ``clock`` when it was given one, else from the database
server's clock.
"""

from __future__ import annotations

import functools
import math
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, TypeVar, cast

import anyio.lowlevel
import anyio.to_thread
from pydantic_core import from_json, to_json

from .._clock import Clock
from .._errors import (
    InvalidArgumentError,
    RunFinishedError,
    RunNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from .._secrets import mask
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
from ._pg_pool import AsyncPool
from ._pg_schema import SCHEMA_VERSION, channel, migrate, quoted
from ._redact import is_secret_parameter, redact
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
    waiting_from,
    waiting_json,
)
from ._rows import STEP_COLUMNS as _STEP_COLUMNS
from ._rules import (
    Bm25,
    claim_decision,
    pick_claims,
    query_terms,
    queued_record,
    text_tokens,
)
from ._wakeups import Wakeups

try:
    from sniffio import current_async_library as _current_async_library
except ImportError:  # then trio is not installed either (it needs sniffio): asyncio it is

    def _current_async_library() -> str:
        return "asyncio"


if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

    Conn = psycopg.Connection[tuple[Any, ...]]
    AConn = psycopg.AsyncConnection[tuple[Any, ...]]

__all__ = ["PG_SCHEMA_VERSION", "PostgresStore"]

PG_SCHEMA_VERSION = SCHEMA_VERSION
"""The PostgreSQL schema version this agency-runtime writes."""

INSTALL_HINT = "pip install 'agency-runtime[postgres]'"

_COLUMNS = (
    "run_id", "status", "entry", "arguments", "model", "overrides", "value", "error",
    "interrupts", "cost_pico", "tokens", "unjournaled_pico", "unjournaled_tokens", "attempts",
    "version", "queue", "priority", "lease_owner", "lease_expires_at", "created_at",
    "started_at", "finished_at", "updated_at", "wake_at", "waiting_for",
)  # fmt: skip
_COLS = ", ".join(_COLUMNS)
_VALUES = ", ".join(f"%({c})s" for c in _COLUMNS)
_EVENT_COLUMNS = ("event_id", "run_id", "name", "payload", "sent_at", "taken_by")
_EVENT_COLS = ", ".join(_EVENT_COLUMNS)
_SCHEDULE_COLS = ", ".join(SCHEDULE_COLUMNS)
_MEMORY_COLUMNS = "m.id, m.namespace, m.content, m.tags, m.scope, m.created_at, m.expires_at, m.seq"
_NOW = "COALESCE(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)"
"""The time a statement uses: the store's clock (passed as ``now``), else the server's."""
_RETRIES = 4
"""Attempts of one operation when PostgreSQL aborts it for a deadlock or serialization."""
_ROLLED_BACK = frozenset({"40000", "40001", "40P01"})
"""SQLSTATEs of a transaction PostgreSQL rolled back, worth trying again: transaction
rollback, serialization failure, deadlock. (psycopg's ``SerializationFailure`` and
``DeadlockDetected`` are not subclasses of its ``TransactionRollback``.)"""

PREPARE_THRESHOLD = 5
"""Executions of one statement on one connection after which it is prepared (psycopg's
default), unless the store was opened with ``prepare=False``."""

CHECK_IDLE_SECONDS = 5.0
"""A pooled connection idle longer than this is checked (one round trip) before use."""

T = TypeVar("T")


class _Sql(NamedTuple):
    """One statement of a program: its SQL and parameters (``%s`` or ``%(name)s``)."""

    query: str
    params: Sequence[Any] | dict[str, Any] | None = None


class _Result(NamedTuple):
    """What a statement gave back: its rows (none for one without a result) and rowcount."""

    rows: list[tuple[Any, ...]]
    rowcount: int

    def one(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


Op: TypeAlias = Generator[_Sql, _Result, T]
"""A program: the statements of one store operation, yielded one at a time, each sent back
its :class:`_Result`; it returns the operation's value. The one place an operation's SQL is
written, run by :func:`_execute` (blocking, on a worker thread) or :func:`_aexecute`
(asyncio)."""


def _execute(conn: Conn, program: Op[T]) -> T:
    """Run ``program``'s statements on ``conn`` in turn; its value."""
    try:
        sql = next(program)
        while True:
            cur = conn.execute(sql.query, sql.params)
            rows = cur.fetchall() if cur.description is not None else []
            sql = program.send(_Result(rows, cur.rowcount))
    except StopIteration as done:
        return cast(T, done.value)


async def _aexecute(conn: AConn, program: Op[T]) -> T:
    """:func:`_execute` on an ``AsyncConnection``."""
    try:
        sql = next(program)
        while True:
            cur = await conn.execute(sql.query, sql.params)
            rows = await cur.fetchall() if cur.description is not None else []
            sql = program.send(_Result(rows, cur.rowcount))
    except StopIteration as done:
        return cast(T, done.value)


def _changed_one(query: str, params: Sequence[Any] | dict[str, Any]) -> Op[bool]:
    """A one-statement program: whether ``query`` changed exactly one row."""
    return (yield _Sql(query, params)).rowcount == 1


def _import_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise StoreUnavailableError(
            f"the PostgreSQL store needs psycopg 3 with its pool ({exc}); install it with "
            f"{INSTALL_HINT}"
        ) from exc


class _Refused(Exception):
    """Internal: aborts a transaction that must leave nothing behind."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys


class PostgresStore:
    """Runs in a PostgreSQL database, shared by every process that opens the same schema.

    ``dsn`` is a libpq URL (``postgresql://user:pass@host:5432/db``) or conninfo string;
    ``schema`` the PostgreSQL schema holding the tables (created and migrated on open).
    ``min_size``/``max_size`` bound the connection pool; ``connect_timeout`` (seconds) bounds
    opening a connection and waiting for a free one. ``prepare=False`` makes no server-side
    prepared statements (for a pooler that cannot keep them: PgBouncer before 1.21 in
    transaction mode). ``clock`` stamps leases and times (default: the server's clock);
    ``url`` is what :attr:`url` shows (its secrets redacted).
    A server that cannot be reached raises :class:`~agency_runtime.StoreUnavailableError`.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "agency",
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: float = 5.0,
        prepare: bool = True,
        clock: Clock | None = None,
        url: str | None = None,
    ) -> None:
        _import_psycopg()
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
        from psycopg_pool import ConnectionPool

        self._t = quoted(schema)  # checks the name
        self._schema = schema
        self._channel = channel(schema)
        self._clock = clock
        self._url = redact(url or dsn)
        self._where = f"{self._url} (schema {schema!r})"
        self._secrets: tuple[str, ...] = ()
        try:
            settings = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise StoreUnavailableError(
                f"malformed PostgreSQL URL {self._url}: {self._scrub(str(exc))}; write "
                "postgresql://user:password@host:5432/database"
            ) from None
        self._secrets = tuple(
            str(value) for name, value in settings.items() if value and is_secret_parameter(name)
        )
        self._dsn = dsn
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": PREPARE_THRESHOLD if prepare else None,
            "connect_timeout": max(1, math.ceil(connect_timeout)),
        }
        self._wakeups = Wakeups()
        self._stopping = threading.Event()
        self._listening = threading.Event()
        self._listener: threading.Thread | None = None
        self._listener_lock = threading.Lock()
        try:
            with psycopg.connect(dsn, **self._connect_kwargs) as conn:
                migrate(conn, schema, self._where)
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(
                f"cannot connect to the PostgreSQL store {self._url}: "
                f"{self._scrub(str(exc).strip())}. Check that the server is running and "
                "that the URL's host, port, database, user and password are right"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot prepare the PostgreSQL store {self._where}: "
                f"{self._scrub(str(exc).strip())}. Check that the user may create "
                "the schema and its tables"
            ) from exc
        self._last_used: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()
        self._pool: ConnectionPool[Conn] | None = ConnectionPool(
            dsn,
            kwargs=self._connect_kwargs,
            min_size=min_size,
            max_size=max(min_size, max_size),
            timeout=max(3 * connect_timeout, 15.0),
            check=self._check_if_idle,
            open=False,
            name=f"agency-{schema}",
        )
        try:
            self._pool.open(wait=True, timeout=max(connect_timeout, 1.0))
        except psycopg.Error as exc:
            self._pool.close()
            raise StoreUnavailableError(
                f"cannot open connections to the PostgreSQL store {self._url}: "
                f"{self._scrub(str(exc))}"
            ) from exc
        # The asyncio path's connections: opened as tasks need them, none yet.
        self._apool = AsyncPool(
            self._aconnect,
            max_size=max(min_size, max_size),
            timeout=max(3 * connect_timeout, 15.0),
            check_after=CHECK_IDLE_SECONDS,
            name=f"agency-{schema}-async",
        )

    # -- plumbing --------------------------------------------------------------------------

    def _check_if_idle(self, conn: Conn) -> None:
        """The thread path pool's health check on checkout (the asyncio path's pool does the
        same): a round trip only for a connection idle longer than :data:`CHECK_IDLE_SECONDS`
        (a server restart, a pooler or a firewall that dropped it), so a busy store pays no
        extra round trip per operation. A connection that breaks while in use is discarded
        by the pool when it comes back."""
        from psycopg_pool import ConnectionPool

        used = self._last_used.get(conn)
        if used is None or time.monotonic() - used > CHECK_IDLE_SECONDS:
            ConnectionPool.check_connection(conn)

    async def _aconnect(self) -> AConn:
        import psycopg

        return await psycopg.AsyncConnection.connect(self._dsn, **self._connect_kwargs)

    @property
    def url(self) -> str:
        """The URL this store was opened from, its secrets replaced by ``***``."""
        return self._url

    @property
    def schema(self) -> str:
        """The PostgreSQL schema holding this store's tables."""
        return self._schema

    def _scrub(self, text: str) -> str:
        """``text`` without the password, the SSL key's password or another secret setting,
        in any case (a server's message may quote the DSN)."""
        return mask(text, *self._secrets, shown="***")

    def _now_param(self) -> float | None:
        return None if self._clock is None else self._clock.time()

    def _now(self) -> Op[float]:
        if self._clock is not None:
            return self._clock.time()
        row = (yield _Sql("SELECT extract(epoch FROM clock_timestamp())::float8")).one()
        assert row is not None
        return float(row[0])

    async def _run(
        self, what: str, work: Callable[[], Op[T]], *, tx: bool = False, several: bool = False
    ) -> T:
        """Run the program ``work()`` (``tx``: in one transaction), retried as a whole with a
        fresh program when PostgreSQL aborted it; ``what`` names it in errors. ``several``:
        it always sends more than one statement (so it takes a worker thread, as a
        transaction does; see the module's docstring)."""
        if not (tx or several) and _current_async_library() == "asyncio":
            return await self._acall(what, work)
        return await anyio.to_thread.run_sync(self._call, what, work, tx)

    def _call(self, what: str, work: Callable[[], Op[T]], tx: bool) -> T:
        """:meth:`_run` on the calling thread, blocking (a worker thread's)."""
        import psycopg

        pool = self._pool
        if pool is None:
            raise StoreError(f"the PostgreSQL store {self._where} is closed")
        for attempt in range(_RETRIES):
            try:
                with pool.connection() as conn:
                    try:
                        if not tx:
                            return _execute(conn, work())
                        with conn.transaction():
                            return _execute(conn, work())
                    finally:
                        self._last_used[conn] = time.monotonic()
            except (psycopg.Error, UnicodeEncodeError) as exc:
                time.sleep(self._pause_before_retry(what, exc, attempt))
        raise AssertionError("unreachable")

    async def _acall(self, what: str, work: Callable[[], Op[T]]) -> T:
        """:meth:`_run` on asyncio, outside a transaction: psycopg's async API on this task,
        no thread. As on the thread path, a cancelled caller is refused before the first
        statement, and once one is sent the operation runs to its end (shielded)."""
        import psycopg

        pool = self._apool
        if self._pool is None:
            raise StoreError(f"the PostgreSQL store {self._where} is closed")
        await anyio.lowlevel.checkpoint_if_cancelled()
        with anyio.CancelScope(shield=True):
            for attempt in range(_RETRIES):
                try:
                    conn = await pool.get()
                    try:
                        return await _aexecute(conn, work())
                    finally:
                        pool.put(conn)
                except (psycopg.Error, UnicodeEncodeError) as exc:
                    await anyio.sleep(self._pause_before_retry(what, exc, attempt))
        raise AssertionError("unreachable")

    def _pause_before_retry(self, what: str, exc: Exception, attempt: int) -> float:
        """Seconds to wait before trying ``what`` again after ``exc`` ended its attempt
        ``attempt`` (from 0); raises the store's error for ``exc`` when it must not be tried
        again."""
        import psycopg

        if isinstance(exc, psycopg.Error) and exc.sqlstate in _ROLLED_BACK:
            if attempt + 1 == _RETRIES:
                raise StoreError(
                    f"the PostgreSQL store {self._where} could not {what}: "
                    f"{self._scrub(str(exc).strip())} (after {_RETRIES} attempts)"
                ) from exc
            return 0.005 * 2.0**attempt
        if isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow):
            # The server ended this connection (a restart, a failover) before the statement
            # ran, or is starting up: nothing was written, so try again on another
            # connection (the pool drops the broken one).
            if attempt + 1 == _RETRIES:
                raise self._mapped(what, exc) from exc
            return 0.05 * 2.0**attempt
        if isinstance(exc, UnicodeEncodeError):
            bad = exc.object[exc.start : exc.end]
            raise InvalidArgumentError(
                f"cannot {what}: a text holds a lone surrogate ({bad!r} at position "
                f"{exc.start}), which is not valid UTF-8"
            ) from exc
        raise self._mapped(what, exc) from exc

    def _mapped(self, what: str, exc: Exception) -> Exception:
        import psycopg

        text = self._scrub(str(exc).strip())
        if isinstance(exc, psycopg.errors.NumericValueOutOfRange):
            return InvalidArgumentError(
                f"cannot {what}: a number is too large for the store ({text})"
            )
        if isinstance(exc, psycopg.DataError) and "NUL" in text:
            return InvalidArgumentError(
                f"cannot {what}: a text holds a NUL character, which PostgreSQL cannot store"
            )
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return StoreUnavailableError(
                f"the PostgreSQL store {self._url} is unavailable (while trying to {what}): "
                f"{text}. Check that the server is running and reachable"
            )
        return StoreError(f"the PostgreSQL store {self._where} failed to {what}: {text}")

    def _select(self) -> str:
        return f"SELECT {_COLS} FROM {self._t}.runs"

    def _fetch(self, run_id: str, *, lock: bool = False) -> Op[RunRecord | None]:
        suffix = " FOR UPDATE" if lock else ""
        row = (yield _Sql(f"{self._select()} WHERE run_id = %s{suffix}", (run_id,))).one()
        return None if row is None else _record(row)

    def _holds_sql(self, lock: str = "FOR SHARE") -> str:
        """The lease check: a row when ``owner`` holds ``run``'s lease, locked against takeover."""
        return (
            f"SELECT 1 FROM {self._t}.runs WHERE run_id = %(run)s AND lease_owner = %(owner)s "
            f"AND status = 'running' {lock}"
        )

    def _notify_sql(self, source: str, column: str = "run_id") -> str:
        return f"pg_notify('{self._channel}', left({source}.{column}, 200))"

    # -- runs ------------------------------------------------------------------------------

    async def claim_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        lease_seconds: float,
        steal_from: str | None = None,
    ) -> Claim:
        t = self._t

        def work() -> Op[Claim]:
            while True:
                existing = yield from self._fetch(record.run_id, lock=True)
                now = yield from self._now()
                decision = claim_decision(existing, now, steal_from)
                if decision == "refuse":
                    assert existing is not None
                    return Claim(acquired=False, created=False, record=existing)
                lease = {"lease_owner": owner, "lease_expires_at": now + lease_seconds}
                if decision == "insert":
                    stored = record.model_copy(
                        update={"status": "running", "attempts": 1, "version": 1,
                                "started_at": now, "updated_at": now, **lease}
                    )  # fmt: skip
                    inserted = (
                        yield _Sql(
                            f"INSERT INTO {t}.runs ({_COLS}) VALUES ({_VALUES}) "
                            "ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
                            _row(stored),
                        )
                    ).one()
                    if inserted is None:
                        continue  # another claimant inserted it first: decide again
                    return Claim(acquired=True, created=True, record=stored)
                row = (
                    yield _Sql(
                        f"UPDATE {t}.runs SET status = 'running', attempts = attempts + 1, "
                        "version = version + 1, started_at = %(now)s, updated_at = %(now)s, "
                        "lease_owner = %(lease_owner)s, "
                        "lease_expires_at = %(lease_expires_at)s, wake_at = NULL, "
                        f"waiting_for = NULL WHERE run_id = %(run)s RETURNING {_COLS}",
                        {"now": now, "run": record.run_id, **lease},
                    )
                ).one()
                assert row is not None
                return Claim(acquired=True, created=False, record=_record(row))

        return await self._run(f"claim run {record.run_id!r}", work, tx=True)

    async def renew_lease(self, run_id: str, *, owner: str, lease_seconds: float) -> bool:
        def work() -> Op[bool]:
            renewed = yield _Sql(
                f"UPDATE {self._t}.runs SET lease_expires_at = {_NOW} + %(lease)s "
                "WHERE run_id = %(run)s AND lease_owner = %(owner)s AND status = 'running'",
                {"now": self._now_param(), "lease": lease_seconds, "run": run_id,
                 "owner": owner},
            )  # fmt: skip
            return renewed.rowcount == 1

        return await self._run(f"renew the lease of run {run_id!r}", work)

    async def finish_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        unjournaled: tuple[int, int] = (0, 0),
        forget: Sequence[str] = (),
    ) -> bool:
        t = self._t
        params: dict[str, Any] = {
            "run": record.run_id, "owner": owner, "status": record.status,
            "value": record.value, "error": error_json(record.error),
            "interrupts": interrupts_json(record.interrupts), "cost": record.cost_pico,
            "tokens": record.tokens, "upico": unjournaled[0], "utokens": unjournaled[1],
            "finished": record.finished_at, "now": self._now_param(), "forget": list(forget),
            "wake_at": record.wake_at, "waiting_for": waiting_json(record.waiting_for),
            "names": list(record.waiting_for),
        }  # fmt: skip
        # A run parking to wait for events needs a transaction: see the check below.
        parks = record.status == "waiting" and bool(record.waiting_for)

        def work() -> Op[bool]:
            if forget:
                if (yield _Sql(self._holds_sql("FOR UPDATE"), params)).one() is None:
                    return False
                pico, tokens = yield from self._drop_steps(
                    record.run_id, "path = ANY(%s::text[])", list(forget)
                )
                # Added to this attempt's own totals: a retried attempt starts again from
                # ``unjournaled``, not from what the rolled-back one had added.
                params["upico"] = unjournaled[0] + pico
                params["utokens"] = unjournaled[1] + tokens
            # One guarded UPDATE, and the notification that whoever waits on runs looks again.
            done = yield _Sql(
                f"WITH done AS (UPDATE {t}.runs SET status = %(status)s, value = %(value)s, "
                "error = %(error)s, interrupts = %(interrupts)s, cost_pico = %(cost)s, "
                "tokens = %(tokens)s, unjournaled_pico = unjournaled_pico + %(upico)s, "
                "unjournaled_tokens = unjournaled_tokens + %(utokens)s, "
                f"finished_at = %(finished)s, updated_at = {_NOW}, version = version + 1, "
                "queue = CASE WHEN %(status)s = 'queued' THEN COALESCE(queue, 'default') "
                "ELSE queue END, lease_owner = NULL, lease_expires_at = NULL, "
                "wake_at = %(wake_at)s, waiting_for = %(waiting_for)s "
                "WHERE run_id = %(run)s AND lease_owner = %(owner)s AND status = 'running' "
                f"RETURNING run_id) SELECT {self._notify_sql('done')} FROM done",
                params,
            )
            if len(done.rows) != 1:
                return False
            if parks:
                # An event it waits for may be buffered already (sent while it still ran):
                # then it is due now. This statement's snapshot is newer than the UPDATE's
                # row lock, and send_event locks the run's row before it inserts, so an
                # event committed before that lock is seen here, and one sent later finds
                # the run waiting and wakes it itself.
                yield _Sql(
                    f"UPDATE {t}.runs r SET wake_at = {_NOW} WHERE r.run_id = %(run)s "
                    "AND r.status = 'waiting' AND EXISTS (SELECT 1 FROM "
                    f"{t}.events e WHERE e.run_id = r.run_id AND e.taken_by IS NULL "
                    "AND e.name = ANY(%(names)s::text[]))",
                    params,
                )
            return True

        finished = await self._run(
            f"store the outcome of run {record.run_id!r}", work, tx=bool(forget) or parks
        )
        if finished:
            self._wakeups.ring()
        return finished

    def _drop_steps(self, run_id: str, where: str, param: Any) -> Op[tuple[int, int]]:
        """Delete the run's steps matching ``where`` (one ``%s``); return the spend they held."""
        row = (
            yield _Sql(
                f"WITH gone AS (DELETE FROM {self._t}.steps WHERE run_id = %s AND {where} "
                "RETURNING cost_pico, tokens) "
                "SELECT COALESCE(SUM(cost_pico), 0), COALESCE(SUM(tokens), 0) FROM gone",
                (run_id, param),
            )
        ).one()
        assert row is not None
        return int(row[0]), int(row[1])

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._run(f"read run {run_id!r}", lambda: self._fetch(run_id))

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100, offset: int = 0
    ) -> list[RunRecord]:
        where = "" if status is None else "WHERE status = %(status)s "
        query = (
            f"{self._select()} {where}ORDER BY created_at DESC, seq DESC "
            "LIMIT %(limit)s OFFSET %(offset)s"
        )
        params = {"status": status, "limit": None if limit < 0 else limit,
                  "offset": max(0, offset)}  # fmt: skip

        def work() -> Op[list[RunRecord]]:
            return [_listed(row) for row in (yield _Sql(query, params)).rows]

        return await self._run("list runs", work)

    # -- the journal -----------------------------------------------------------------------

    async def load_journal(self, run_id: str) -> Journal:
        t = self._t

        def work() -> Op[Journal]:
            steps = yield _Sql(
                f"SELECT {', '.join(_STEP_COLUMNS)} FROM {t}.steps WHERE run_id = %s ORDER BY seq",
                (run_id,),
            )
            answers = yield _Sql(
                f"SELECT seq, interrupt, response, answered_at FROM {t}.interrupts "
                "WHERE run_id = %s ORDER BY seq",
                (run_id,),
            )
            checkpoints = yield _Sql(
                f"SELECT body FROM {t}.checkpoints WHERE run_id = %s ORDER BY seq", (run_id,)
            )
            return journal_from_rows(run_id, steps.rows, answers.rows, checkpoints.rows)

        # No transaction: at READ COMMITTED (the store's level) each SELECT would take its own
        # snapshot inside one anyway, so BEGIN and COMMIT would only add two round trips.
        return await self._run(f"load the journal of run {run_id!r}", work, several=True)

    @functools.cached_property
    def _commit_step_sql(self) -> str:
        # One statement: the lease check locks the run's row (FOR SHARE), so a claimant taking
        # the run over waits for this commit, or this insert sees the lease gone and writes
        # nothing. (Built once: it is every step's statement.)
        return (
            f"WITH lease AS ({self._holds_sql()}) INSERT INTO {self._t}.steps "
            f"({', '.join(_STEP_COLUMNS)}) SELECT "
            f"{', '.join(f'%({c})s' for c in _STEP_COLUMNS)} FROM lease"
        )

    async def commit_step(self, entry: JournalEntry, *, owner: str) -> bool:
        params = {column: getattr(entry, column) for column in _STEP_COLUMNS}
        params.update(run=entry.run_id, owner=owner)
        query = self._commit_step_sql
        what = f"commit step {entry.path!r} of run {entry.run_id!r}"
        return await self._run(what, lambda: _changed_one(query, params))

    async def record_interrupts(self, answers: list[InterruptAnswer], *, owner: str) -> bool:
        if not answers:
            return True
        run_id = answers[0].run_id
        latest = {(a.run_id, a.interrupt.interrupt_id): a for a in answers}  # the last one wins
        params = {
            "run": run_id, "owner": owner,
            "runs": [a.run_id for a in latest.values()],
            "ids": [a.interrupt.interrupt_id for a in latest.values()],
            "seqs": [a.seq for a in latest.values()],
            "bodies": [a.interrupt.model_dump_json() for a in latest.values()],
        }  # fmt: skip
        query = (
            f"WITH lease AS ({self._holds_sql()}), saved AS (INSERT INTO {self._t}.interrupts "
            "(run_id, interrupt_id, seq, interrupt, response, answered_at) "
            "SELECT x.r, x.i, x.s, x.b, NULL, NULL FROM lease, unnest(%(runs)s::text[], "
            "%(ids)s::text[], %(seqs)s::bigint[], %(bodies)s::text[]) AS x(r, i, s, b) "
            "ON CONFLICT (run_id, interrupt_id) DO UPDATE SET seq = EXCLUDED.seq, "
            "interrupt = EXCLUDED.interrupt, response = NULL, answered_at = NULL RETURNING 1) "
            "SELECT (SELECT count(*) FROM lease), (SELECT count(*) FROM saved)"
        )

        def work() -> Op[bool]:
            row = (yield _Sql(query, params)).one()
            return row is not None and row[0] == 1

        return await self._run(f"record the interrupts of run {run_id!r}", work)

    async def answer_interrupts(
        self, run_id: str, responses: dict[str, InterruptResponse], *, enqueue: bool = False
    ) -> list[str]:
        t = self._t
        keys = list(responses)
        params = {
            "run": run_id, "now": self._now_param(), "ids": keys, "enqueue": enqueue,
            "bodies": [responses[key].model_dump_json() for key in keys],
        }  # fmt: skip

        def work() -> Op[list[str]]:
            updated = yield _Sql(
                f"UPDATE {t}.interrupts i SET response = x.b, answered_at = {_NOW} "
                "FROM unnest(%(ids)s::text[], %(bodies)s::text[]) AS x(k, b) "
                "WHERE i.run_id = %(run)s AND i.interrupt_id = x.k AND i.response IS NULL "
                "RETURNING i.interrupt_id",
                params,
            )
            answered = {key for (key,) in updated.rows}
            refused = [key for key in keys if key not in answered]
            if refused:
                raise _Refused(refused)  # rolls the whole transaction back
            yield _Sql(
                f"WITH bumped AS (UPDATE {t}.runs SET version = version + 1, "
                f"updated_at = {_NOW}, "
                "status = CASE WHEN %(enqueue)s AND status = 'paused' THEN 'queued' "
                "ELSE status END, "
                "queue = CASE WHEN %(enqueue)s AND status = 'paused' "
                "THEN COALESCE(queue, 'default') ELSE queue END "
                "WHERE run_id = %(run)s RETURNING run_id, status) "
                f"SELECT {self._notify_sql('bumped')} FROM bumped WHERE %(enqueue)s",
                params,
            )
            return []

        try:
            refused = await self._run(
                f"answer the interrupts of run {run_id!r}", work, tx=bool(keys)
            )
        except _Refused as refusal:
            return refusal.keys
        if enqueue and not refused:
            self._wakeups.ring()
        return refused

    async def save_checkpoint(self, checkpoint: Checkpoint, *, owner: str) -> bool:
        run_id = checkpoint.run_id or ""
        params = {"run": run_id, "owner": owner, "id": checkpoint.checkpoint_id,
                  "seq": checkpoint.seq, "body": checkpoint.model_dump_json()}  # fmt: skip
        query = (
            f"WITH lease AS ({self._holds_sql()}) INSERT INTO {self._t}.checkpoints "
            "(run_id, checkpoint_id, seq, body) SELECT %(run)s, %(id)s, %(seq)s, %(body)s "
            "FROM lease ON CONFLICT (run_id, checkpoint_id) DO UPDATE SET seq = EXCLUDED.seq, "
            "body = EXCLUDED.body"
        )
        what = f"save checkpoint {checkpoint.checkpoint_id!r}"
        return await self._run(what, lambda: _changed_one(query, params))

    async def rewind(
        self,
        run_id: str,
        seq: int,
        *,
        owner: str,
        overrides: str | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        t = self._t

        def work() -> Op[bool]:
            held = {"run": run_id, "owner": owner}
            if (yield _Sql(self._holds_sql("FOR UPDATE"), held)).one() is None:
                return False
            pico, tokens = yield from self._drop_steps(run_id, "seq > %s", seq)
            yield _Sql(
                f"UPDATE {t}.runs SET overrides = COALESCE(%s, overrides), "
                "unjournaled_pico = unjournaled_pico + %s, "
                "unjournaled_tokens = unjournaled_tokens + %s WHERE run_id = %s",
                (overrides, pico, tokens, run_id),
            )
            for table in ("interrupts", "checkpoints"):
                yield _Sql(f"DELETE FROM {t}.{table} WHERE run_id = %s AND seq > %s",
                           (run_id, seq))  # fmt: skip
            if checkpoint is not None:
                yield _Sql(
                    f"INSERT INTO {t}.checkpoints (run_id, checkpoint_id, seq, body) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT (run_id, checkpoint_id) DO UPDATE "
                    "SET seq = EXCLUDED.seq, body = EXCLUDED.body",
                    (run_id, checkpoint.checkpoint_id, checkpoint.seq,
                     checkpoint.model_dump_json()),
                )  # fmt: skip
            return True

        return await self._run(f"rewind run {run_id!r}", work, tx=True)

    # -- administration -------------------------------------------------------------------

    async def cancel_run(self, run_id: str) -> RunRecord | None:
        t = self._t

        def work() -> Op[tuple[RunRecord | None, bool]]:
            row = (
                yield _Sql(
                    f"WITH gone AS (UPDATE {t}.runs SET status = 'cancelled', "
                    "lease_owner = NULL, lease_expires_at = NULL, version = version + 1, "
                    f"finished_at = {_NOW}, updated_at = {_NOW} WHERE run_id = %(run)s "
                    f"AND status NOT IN ('completed', 'cancelled') RETURNING {_COLS}) "
                    f"SELECT {_COLS}, {self._notify_sql('gone')} IS NULL FROM gone",
                    {"run": run_id, "now": self._now_param()},
                )
            ).one()
            if row is not None:
                return _record(row[:-1]), True
            return (yield from self._fetch(run_id)), False

        stored, changed = await self._run(f"cancel run {run_id!r}", work)
        if changed:
            self._wakeups.ring()
        return stored

    async def fork_run(self, run_id: str, new_run_id: str, upto_seq: int) -> RunRecord:
        t = self._t

        def work() -> Op[RunRecord]:
            source = yield from self._fetch(run_id)
            if source is None:
                raise RunNotFoundError(run_id, self.url)
            row = (
                yield _Sql(
                    "SELECT COALESCE(SUM(cost_pico), 0), COALESCE(SUM(tokens), 0) "
                    f"FROM {t}.steps WHERE run_id = %s AND seq <= %s",
                    (run_id, upto_seq),
                )
            ).one()
            assert row is not None
            forked = source.fork_as(new_run_id, cost_pico=int(row[0]), tokens=int(row[1]))
            yield _Sql(f"INSERT INTO {t}.runs ({_COLS}) VALUES ({_VALUES})", _row(forked))
            others = ", ".join(_STEP_COLUMNS[1:])
            yield _Sql(
                f"INSERT INTO {t}.steps ({', '.join(_STEP_COLUMNS)}) SELECT %s, {others} "
                f"FROM {t}.steps WHERE run_id = %s AND seq <= %s",
                (new_run_id, run_id, upto_seq),
            )
            # Answers are not copied: interrupt ids derive from the run id.
            kept = yield _Sql(
                f"SELECT checkpoint_id, seq, body FROM {t}.checkpoints "
                "WHERE run_id = %s AND seq <= %s",
                (run_id, upto_seq),
            )
            for cid, seq, body in kept.rows:
                moved = Checkpoint.model_validate_json(body).model_copy(
                    update={"run_id": new_run_id}
                )
                yield _Sql(
                    f"INSERT INTO {t}.checkpoints (run_id, checkpoint_id, seq, body) "
                    "VALUES (%s, %s, %s, %s)",
                    (new_run_id, cid, seq, moved.model_dump_json()),
                )
            return forked

        return await self._run(f"fork run {run_id!r}", work, tx=True)

    # -- queues ----------------------------------------------------------------------------

    async def enqueue_run(self, record: RunRecord) -> Claim:
        t = self._t

        def work() -> Op[Claim]:
            stored = record.model_copy(
                update={"status": "queued", "queue": record.queue or "default",
                        "lease_owner": None, "lease_expires_at": None,
                        "updated_at": (yield from self._now())}
            )  # fmt: skip
            created = yield _Sql(
                f"WITH made AS (INSERT INTO {t}.runs ({_COLS}) VALUES ({_VALUES}) "
                "ON CONFLICT (run_id) DO NOTHING RETURNING run_id) "
                f"SELECT {self._notify_sql('made')} IS NULL FROM made",
                _row(stored),
            )
            if created.rows:
                return Claim(acquired=False, created=True, record=stored)
            existing = yield from self._fetch(record.run_id)
            if existing is None:  # deleted in between: cannot happen (runs are never deleted)
                raise StoreError(f"run {record.run_id!r} vanished while being queued")
            return Claim(acquired=False, created=False, record=existing)

        claim = await self._run(f"queue run {record.run_id!r}", work)
        if claim.created:
            self._wakeups.ring()
        return claim

    async def claim_queued(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[RunRecord]:
        names = list(dict.fromkeys(queues))
        if limit <= 0 or not names:
            return []
        t = self._t

        def work() -> Op[list[RunRecord]]:
            now = yield from self._now()
            # Limited queues: their rows are locked for the rest of this transaction, so no
            # other claimant counts their running runs until these claims are committed.
            capped = yield _Sql(
                f"SELECT name, concurrency FROM {t}.queues WHERE name = ANY(%s::text[]) "
                "AND concurrency IS NOT NULL ORDER BY name FOR UPDATE",
                (names,),
            )
            limits = {str(name): int(cap) for name, cap in capped.rows}
            room: dict[str, int] = {}
            if limits:
                running = yield _Sql(
                    f"SELECT queue, count(*) FROM {t}.runs WHERE queue = ANY(%s::text[]) "
                    "AND status = 'running' AND lease_expires_at > %s GROUP BY queue",
                    (list(limits), now),
                )
                busy = {str(queue): int(count) for queue, count in running.rows}
                room = {name: max(0, cap - int(busy.get(name, 0))) for name, cap in limits.items()}
            open_queues = [name for name in names if room.get(name, 1) > 0]
            skip, taken = list(exclude), list[str]()
            while open_queues and len(taken) < limit:
                due = yield _Sql(
                    f"SELECT run_id, queue FROM {t}.runs WHERE queue = ANY(%(queues)s::text[]) "
                    "AND (status = 'queued' OR (status = 'running' AND (lease_expires_at IS NULL "
                    "OR lease_expires_at <= %(now)s)) OR (status = 'waiting' "
                    "AND wake_at <= %(now)s)) "
                    "AND run_id <> ALL(%(skip)s::text[]) "
                    "ORDER BY priority DESC, created_at, seq LIMIT %(n)s FOR UPDATE SKIP LOCKED",
                    {"queues": open_queues, "now": now, "skip": skip, "n": limit - len(taken)},
                )
                rows = due.rows
                if not rows:
                    break
                skip.extend(run_id for run_id, _ in rows)
                taken += pick_claims(rows, room, limit - len(taken))
                open_queues = [name for name in open_queues if room.get(name, 1) > 0]
            if not taken:
                return []
            updated = yield _Sql(
                f"UPDATE {t}.runs SET status = 'running', attempts = attempts + 1, "
                "version = version + 1, started_at = COALESCE(started_at, %(now)s), "
                "updated_at = %(now)s, lease_owner = %(owner)s, "
                "lease_expires_at = %(expires)s, wake_at = NULL, waiting_for = NULL "
                "WHERE run_id = ANY(%(ids)s::text[]) "
                f"RETURNING {_COLS}",
                {"now": now, "owner": owner, "expires": now + lease_seconds, "ids": taken},
            )
            claimed = {record.run_id: record for record in map(_record, updated.rows)}
            return [claimed[run_id] for run_id in taken]

        return await self._run(f"claim queued runs of {names}", work, tx=True)

    async def configure_queue(self, name: str, *, concurrency: int | None) -> None:
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 0):
            raise InvalidArgumentError(
                f"the concurrency of queue {name!r} must be a whole number, 0 or more, or "
                f"None (no limit); got {concurrency!r}"
            )

        def work() -> Op[None]:
            yield _Sql(
                f"INSERT INTO {self._t}.queues (name, concurrency) VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET concurrency = EXCLUDED.concurrency",
                (name, concurrency),
            )

        await self._run(f"configure queue {name!r}", work)

    async def queue_concurrency(self, name: str) -> int | None:
        def work() -> Op[int | None]:
            row = (
                yield _Sql(f"SELECT concurrency FROM {self._t}.queues WHERE name = %s", (name,))
            ).one()
            return None if row is None or row[0] is None else int(row[0])

        return await self._run(f"read the limit of queue {name!r}", work)

    async def next_wake(self, queues: Sequence[str], *, after: float | None = None) -> float | None:
        names = list(dict.fromkeys(queues))
        if not names:
            return None
        t = self._t

        def work() -> Op[float | None]:
            row = (
                yield _Sql(
                    f"SELECT LEAST((SELECT min(wake_at) FROM {t}.runs WHERE status = 'waiting' "
                    "AND queue = ANY(%(queues)s::text[]) AND wake_at > %(after)s), (SELECT "
                    f"min(next_at) FROM {t}.schedules WHERE queue = ANY(%(queues)s::text[]) "
                    "AND next_at > %(after)s))",
                    {"queues": names, "after": -math.inf if after is None else after},
                )
            ).one()
            return None if row is None or row[0] is None else float(row[0])

        return await self._run("read when runs fall due", work)

    async def wait_for_runs(self, timeout: float) -> None:
        """Return when any process queued, answered for a worker, handed back or ended a run
        (LISTEN/NOTIFY), or after ``timeout`` seconds; spurious returns are allowed."""
        self._listen()
        await self._wakeups.wait(timeout)

    def _listen(self) -> threading.Event:
        """Start the listener thread once; the event is set while it is LISTENing."""
        with self._listener_lock:
            if self._listener is None and not self._stopping.is_set():
                self._listener = threading.Thread(
                    target=self._listen_loop, name=f"agency-pg-listen-{self._schema}", daemon=True
                )
                self._listener.start()
        return self._listening

    def _listen_loop(self) -> None:
        import psycopg

        delay = 0.1
        while not self._stopping.is_set():
            try:
                with psycopg.connect(self._dsn, **self._connect_kwargs) as conn:
                    conn.execute(f'LISTEN "{self._channel}"')
                    self._listening.set()
                    self._wakeups.ring()  # notifications may have been missed until now
                    delay = 0.1
                    while not self._stopping.is_set():
                        for _ in conn.notifies(timeout=0.2):
                            self._wakeups.ring()
            except Exception:  # dropped or refused: waiters poll by timeout meanwhile
                self._listening.clear()
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)
        self._listening.clear()

    # -- events ----------------------------------------------------------------------------

    async def send_event(self, run_id: str, name: str, payload: str) -> RunEvent:
        t = self._t
        params = {"run": run_id, "name": name, "payload": payload, "now": self._now_param()}

        def work() -> Op[RunEvent]:
            # The run's row first, locked: a finish_run parking it either committed before
            # (then its wait is seen here) or waits for this commit (then it sees the event).
            row = (
                yield _Sql(
                    f"SELECT status, waiting_for FROM {t}.runs WHERE run_id = %s FOR UPDATE",
                    (run_id,),
                )
            ).one()
            if row is None:
                raise RunNotFoundError(run_id, self.url)
            status, waiting = str(row[0]), row[1]
            if status in ("completed", "cancelled"):
                raise RunFinishedError(run_id, status, name)
            params["wakes"] = status == "waiting" and name in waiting_from(run_id, waiting)
            # The event, the wake-up (at the event's own time) and the notification.
            sent = (
                yield _Sql(
                    f"WITH sent AS (INSERT INTO {t}.events (run_id, name, payload, sent_at) "
                    f"VALUES (%(run)s, %(name)s, %(payload)s, {_NOW}) RETURNING event_id, "
                    f"run_id, sent_at), woken AS (UPDATE {t}.runs r SET wake_at = "
                    "sent.sent_at, updated_at = sent.sent_at FROM sent WHERE %(wakes)s "
                    "AND r.run_id = sent.run_id) "
                    f"SELECT event_id, sent_at, {self._notify_sql('sent')} IS NULL FROM sent",
                    params,
                )
            ).one()
            assert sent is not None
            return RunEvent(
                event_id=int(sent[0]), run_id=run_id, name=name, payload=payload,
                sent_at=float(sent[1]),
            )  # fmt: skip

        event = await self._run(f"send event {name!r} to run {run_id!r}", work, tx=True)
        self._wakeups.ring()
        return event

    async def take_event(self, run_id: str, name: str, taker: str) -> RunEvent | None:
        t = self._t
        # One statement: the event ``taker`` took already, else the oldest untaken one, taken
        # now (rows another taker is taking at this moment are skipped, never waited for).
        query = (
            f"WITH mine AS (SELECT {_EVENT_COLS} FROM {t}.events WHERE run_id = %(run)s "
            "AND taken_by = %(taker)s AND name = %(name)s), "
            f"took AS (UPDATE {t}.events SET taken_by = %(taker)s WHERE event_id = "
            f"(SELECT event_id FROM {t}.events WHERE run_id = %(run)s AND name = %(name)s "
            "AND taken_by IS NULL AND NOT EXISTS (SELECT 1 FROM mine) ORDER BY event_id "
            f"LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING {_EVENT_COLS}) "
            "SELECT * FROM mine UNION ALL SELECT * FROM took LIMIT 1"
        )
        params = {"run": run_id, "name": name, "taker": taker}

        def work() -> Op[RunEvent | None]:
            row = (yield _Sql(query, params)).one()
            return None if row is None else RunEvent(**dict(zip(_EVENT_COLUMNS, row, strict=True)))

        return await self._run(f"take event {name!r} of run {run_id!r}", work)

    # -- schedules -------------------------------------------------------------------------

    async def put_schedule(self, schedule: Schedule) -> None:
        t = self._t
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in SCHEDULE_COLUMNS[1:])
        query = (
            f"WITH put AS (INSERT INTO {t}.schedules ({_SCHEDULE_COLS}) VALUES "
            f"({', '.join(['%s'] * len(SCHEDULE_COLUMNS))}) ON CONFLICT (name) DO UPDATE SET "
            f"{updates} RETURNING name) SELECT {self._notify_sql('put', 'name')} FROM put"
        )

        def work() -> Op[None]:
            yield _Sql(query, schedule_values(schedule))

        await self._run(f"store schedule {schedule.name!r}", work)
        self._wakeups.ring()

    async def get_schedule(self, name: str) -> Schedule | None:
        def work() -> Op[Schedule | None]:
            row = (
                yield _Sql(
                    f"SELECT {_SCHEDULE_COLS} FROM {self._t}.schedules WHERE name = %s", (name,)
                )
            ).one()
            return None if row is None else schedule_from(row)

        return await self._run(f"read schedule {name!r}", work)

    async def list_schedules(self) -> list[Schedule]:
        def work() -> Op[list[Schedule]]:
            rows = yield _Sql(
                f'SELECT {_SCHEDULE_COLS} FROM {self._t}.schedules ORDER BY name COLLATE "C"'
            )
            return [listed_schedule(row) for row in rows.rows]

        return await self._run("list schedules", work)

    async def remove_schedule(self, name: str) -> bool:
        query = f"DELETE FROM {self._t}.schedules WHERE name = %s"
        return await self._run(f"remove schedule {name!r}", lambda: _changed_one(query, (name,)))

    async def due_schedules(self, queues: Sequence[str], now: float) -> list[Schedule]:
        names = list(dict.fromkeys(queues))
        if not names:
            return []

        def work() -> Op[list[Schedule]]:
            rows = yield _Sql(
                f"SELECT {_SCHEDULE_COLS} FROM {self._t}.schedules "
                "WHERE queue = ANY(%s::text[]) AND next_at <= %s "
                'ORDER BY next_at, name COLLATE "C"',
                (names, now),
            )
            return readable_schedules(rows.rows)

        return await self._run("read due schedules", work)

    async def fire_schedule(self, name: str, *, due: float, next_at: float, run: RunRecord) -> bool:
        t = self._t

        def work() -> Op[bool]:
            now = yield from self._now()
            # Only while its next_at is still ``due``: a second worker firing the same
            # occurrence waits for this row lock, then finds next_at moved and does nothing.
            moved = yield _Sql(
                f"WITH moved AS (UPDATE {t}.schedules SET next_at = %s, updated_at = %s "
                "WHERE name = %s AND next_at = %s RETURNING name) "
                f"SELECT {self._notify_sql('moved', 'name')} IS NULL FROM moved",
                (next_at, now, name, due),
            )
            if not moved.rows:
                return False
            yield _Sql(
                f"INSERT INTO {t}.runs ({_COLS}) VALUES ({_VALUES}) "
                "ON CONFLICT (run_id) DO NOTHING",
                _row(queued_record(run, now)),
            )
            return True

        fired = await self._run(f"fire schedule {name!r}", work, tx=True)
        if fired:
            self._wakeups.ring()
        return fired

    # -- memory ----------------------------------------------------------------------------

    async def save_memory(self, record: MemoryRecord) -> bool:
        t = self._t
        words = text_tokens(record.content)
        params = {
            "id": record.id, "namespace": record.namespace, "content": record.content,
            "tags": to_json(record.tags).decode(), "tag_set": list(dict.fromkeys(record.tags)),
            "scope": record.scope, "words": words, "created_at": record.created_at,
            "expires_at": record.expires_at, "length": len(words),
        }  # fmt: skip
        # One statement: the item, and the corpus counts bm25 needs (when it was new).
        query = (
            f"WITH saved AS (INSERT INTO {t}.memory_items (id, namespace, content, tags, "
            "tag_set, scope, words, created_at, expires_at) VALUES (%(id)s, %(namespace)s, "
            "%(content)s, %(tags)s, %(tag_set)s::text[], %(scope)s, %(words)s::text[], "
            "%(created_at)s, %(expires_at)s) ON CONFLICT (id) DO NOTHING RETURNING 1), "
            f"counted AS (UPDATE {t}.memory_corpus SET "
            "documents = documents + (SELECT count(*) FROM saved), "
            "length = length + (SELECT count(*) FROM saved) * %(length)s) "
            "SELECT count(*) FROM saved"
        )

        def work() -> Op[bool]:
            row = (yield _Sql(query, params)).one()
            return row is not None and row[0] == 1

        return await self._run(f"save memory {record.id!r}", work)

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
        t = self._t
        terms = query_terms(query)
        where = "m.namespace = %(ns)s AND (m.expires_at IS NULL OR m.expires_at > %(now)s)"
        if scope is not None:
            where += " AND m.scope = %(scope)s"
        if tags:
            where += " AND m.tag_set @> %(tags)s::text[]"
        params = {"ns": namespace, "now": now, "scope": scope, "tags": list(dict.fromkeys(tags)),
                  "terms": terms, "limit": None if limit < 0 else limit}  # fmt: skip

        def work() -> Op[list[tuple[Any, ...]]]:
            if terms:
                # The matching items and, in the same snapshot, what bm25 counts over the
                # whole corpus (as FTS5 does): documents, words, and documents per term.
                matched = yield _Sql(
                    f"WITH stats AS (SELECT c.documents, c.length, ARRAY(SELECT (SELECT "
                    f"count(*) FROM {t}.memory_items h WHERE h.words @> ARRAY[u.term]) "
                    "FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS u(term, n) "
                    f"ORDER BY u.n) AS holding FROM {t}.memory_corpus c) "
                    f"SELECT {_MEMORY_COLUMNS}, m.words, s.documents, s.length, s.holding "
                    f"FROM {t}.memory_items m CROSS JOIN stats s "
                    f"WHERE m.words && %(terms)s::text[] AND {where}",
                    params,
                )
                if matched.rows:
                    return _best(matched.rows, terms, limit)
            latest = yield _Sql(
                f"SELECT {_MEMORY_COLUMNS} FROM {t}.memory_items m WHERE {where} "
                "ORDER BY m.created_at DESC, m.seq DESC LIMIT %(limit)s",
                params,
            )
            return latest.rows

        rows = await self._run("recall memory", work)
        rows.sort(key=lambda row: (row[5], row[7]), reverse=True)  # newest first, ties by save
        return [
            MemoryRecord(
                id=row[0], namespace=row[1], content=row[2], tags=from_json(row[3]),
                scope=row[4], created_at=row[5], expires_at=row[6],
            )
            for row in rows
        ]  # fmt: skip

    async def expire_memory(self, namespace: str, ids: list[str], *, at: float) -> int:
        def work() -> Op[int]:
            expired = yield _Sql(
                f"UPDATE {self._t}.memory_items SET expires_at = %s "
                "WHERE namespace = %s AND id = ANY(%s::text[]) RETURNING id",
                (at, namespace, list(ids)),
            )
            hit = {item for (item,) in expired.rows}
            return sum(1 for item in ids if item in hit)  # as many as ids named (SQLite's count)

        return await self._run("expire memory", work)

    async def purge_memory(self, *, now: float) -> int:
        t = self._t
        query = (
            f"WITH gone AS (DELETE FROM {t}.memory_items WHERE expires_at IS NOT NULL "
            "AND expires_at <= %s RETURNING cardinality(words) AS n), "
            f"counted AS (UPDATE {t}.memory_corpus SET "
            "documents = documents - (SELECT count(*) FROM gone), "
            "length = length - (SELECT COALESCE(SUM(n), 0) FROM gone)) "
            "SELECT count(*) FROM gone"
        )

        def work() -> Op[int]:
            row = (yield _Sql(query, (now,))).one()
            return 0 if row is None else int(row[0])

        return await self._run("purge expired memory", work)

    async def get_document(self, namespace: str, key: str) -> str | None:
        def work() -> Op[str | None]:
            row = (
                yield _Sql(
                    f"SELECT body FROM {self._t}.documents WHERE namespace = %s AND key = %s",
                    (namespace, key),
                )
            ).one()
            return None if row is None else str(row[0])

        return await self._run(f"read document {namespace}/{key}", work)

    async def put_document(self, namespace: str, key: str, body: str) -> None:
        def work() -> Op[None]:
            yield _Sql(
                f"INSERT INTO {self._t}.documents (namespace, key, body) VALUES (%s, %s, %s) "
                "ON CONFLICT (namespace, key) DO UPDATE SET body = EXCLUDED.body",
                (namespace, key, body),
            )

        await self._run(f"write document {namespace}/{key}", work)

    # -- global locks ------------------------------------------------------------------------

    async def enqueue_lock(self, name: str, owner: str, lease_seconds: float) -> int:
        t = self._t

        def work() -> Op[int]:
            # Tickets of one name are handed out one transaction at a time, so a ticket is
            # visible before any later one is (ticket order is arrival order).
            yield _Sql(
                "SELECT pg_advisory_xact_lock(hashtext(%s), hashtext(%s))", (self._schema, name)
            )
            now = yield from self._now()
            yield _Sql(f"DELETE FROM {t}.locks WHERE name = %s AND expires_at <= %s",
                       (name, now))  # fmt: skip
            row = (
                yield _Sql(
                    f"INSERT INTO {t}.locks (name, owner, expires_at) VALUES (%s, %s, %s) "
                    "RETURNING ticket",
                    (name, owner, now + lease_seconds),
                )
            ).one()
            assert row is not None
            return int(row[0])

        return await self._run(f"queue for lock {name!r}", work, tx=True)

    async def lock_holder(self, name: str) -> tuple[int, str] | None:
        def work() -> Op[tuple[int, str] | None]:
            row = (
                yield _Sql(
                    f"SELECT ticket, owner FROM {self._t}.locks WHERE name = %(name)s "
                    f"AND expires_at > {_NOW} ORDER BY ticket LIMIT 1",
                    {"name": name, "now": self._now_param()},
                )
            ).one()
            return None if row is None else (int(row[0]), str(row[1]))

        return await self._run(f"read the holder of lock {name!r}", work)

    async def lock_turn(self, name: str, ticket: int, owner: str, lease_seconds: float) -> bool:
        t = self._t

        def work() -> Op[bool]:
            now = yield from self._now()
            renewed = yield _Sql(
                f"UPDATE {t}.locks SET expires_at = %s WHERE ticket = %s AND name = %s "
                "AND owner = %s",
                (now + lease_seconds, ticket, name, owner),
            )
            yield _Sql(f"DELETE FROM {t}.locks WHERE name = %s AND expires_at <= %s",
                       (name, now))  # fmt: skip
            first = (
                yield _Sql(f"SELECT min(ticket) FROM {t}.locks WHERE name = %s", (name,))
            ).one()
            return renewed.rowcount == 1 and first is not None and first[0] == ticket

        return await self._run(f"take a turn at lock {name!r}", work, tx=True)

    async def release_lock(self, name: str, ticket: int) -> None:
        def work() -> Op[None]:
            yield _Sql(
                f"DELETE FROM {self._t}.locks WHERE ticket = %s AND name = %s", (ticket, name)
            )

        await self._run(f"release lock {name!r}", work)

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the listener and close the pool's connections (idempotent); the data stays."""
        self._stopping.set()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        self._apool.close()
        listener = self._listener
        if listener is not None and listener is not threading.current_thread():
            listener.join(timeout=2.0)

    def __repr__(self) -> str:
        return f"<PostgresStore {self._url} schema={self._schema!r}>"


def _best(rows: list[tuple[Any, ...]], terms: list[str], limit: int) -> list[tuple[Any, ...]]:
    """The ``limit`` best bm25 matches of ``rows`` (FTS5's ranking, as ``_rules.Corpus``).

    Each row ends with the item's words, then the corpus's documents, total length and
    documents holding each term; the same arithmetic as :meth:`Corpus.scores`, so every
    backend picks the same items. Ties: the newest first (created, then saved).
    """
    total, length, holding = int(rows[0][-3]), int(rows[0][-2]), list(rows[0][-1])
    ranking = Bm25(total, length, dict(zip(terms, holding, strict=True)))
    scored: list[tuple[float, float, int, tuple[Any, ...]]] = []
    for row in rows:
        score = ranking.score(Counter(row[8]))
        scored.append((score, -row[5], -row[7], row[:8]))
    scored.sort(key=lambda item: item[:3])
    chosen = scored if limit < 0 else scored[:limit]
    return [item[3] for item in chosen]


def _row(record: RunRecord) -> dict[str, Any]:
    values = run_values(record)
    return {column: values[column] for column in _COLUMNS}


def _record(row: Sequence[Any]) -> RunRecord:
    return record_from(dict(zip(_COLUMNS, row, strict=True)))


def _listed(row: Sequence[Any]) -> RunRecord:
    """A listed run: a damaged row is listed marked damaged (``_rows.run_from``)."""
    return run_from(dict(zip(_COLUMNS, row, strict=True)))
