"""The PostgreSQL store: runs shared by many processes and machines (``postgresql://…``).

Every operation is the core's (:mod:`._core`): a program that yields its statements; this
module is the PostgreSQL dialect (:class:`PostgresDialect`) and the executors that run a
program on one of two paths. On asyncio, an operation outside a transaction (a step's commit,
a lease renewal, most outcomes and reads) runs on psycopg's async API: a connection of an
:class:`~._pg_pool.AsyncPool`, waited on by the event loop itself, no thread. Transactions
and other operations of several statements (a claim, loading a journal), and everything on
trio (psycopg's async API is asyncio-only), run on a connection of a psycopg 3
``ConnectionPool`` in a worker thread (``anyio.to_thread``): there the statements go back to
back, while on the loop each would wait for the task's next turn, so on a busy loop a claim
would hold its row locks, and keep a worker's slots empty, several times longer. On
asyncio, steps that tasks of one loop commit in the same turn of the loop, or while another
of theirs is in flight, go together in one statement (:mod:`._pg_group`); so do runs'
outcomes.

Connections are in autocommit mode, and a statement a connection runs a second time is
prepared on the server (:data:`PREPARE_THRESHOLD`), which spares PostgreSQL parsing it again
and, once its first few executions were planned for their parameters, planning it: most of
the cost of the short statements a step makes. Poolers in transaction mode that cannot
keep prepared statements (PgBouncer before 1.21, or with ``max_prepared_statements = 0``)
need ``prepare=False`` (``?prepare=false`` in the URL): then nothing is prepared. psycopg is
imported when a store is built, never by ``import agency_runtime``.

The semantics are the core's, with the guarantees a shared server needs: runs are held by
leases that expire, and a worker's process says it lives with a session advisory lock its
listener's direct connection holds (the key is written on the runs it claims, column
``lease_session``): when the process dies the server closes its connections, the lock goes,
and another claimer takes its runs at once instead of after the lease. The lease stays the
fence (a write of a holder whose run was taken fails) and the fallback (a hung process whose
connection lives; a store opened with ``liveness=False``, as one behind a pooler in
transaction mode must be, since its sessions are not the process's). A write made for a
lease holder (a step, a
checkpoint, a pause, an outcome) checks the lease in the same statement or transaction and
locks the run's row while it does, so a worker that lost its lease cannot commit; queued runs
are claimed with ``FOR UPDATE SKIP LOCKED`` under a lock on each limited queue's row; and
whatever makes a run queued or ends it sends ``NOTIFY`` in the same transaction, so another
process's :meth:`PostgresStore.wait_for_runs` wakes only after the commit. Times come from
the store's ``clock`` when it was given one, else from the database server's clock.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import threading
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.lowlevel
import anyio.to_thread
from pydantic_core import to_json

from .._clock import Clock
from .._errors import InvalidArgumentError, StoreError, StoreUnavailableError
from .._secrets import mask
from .._types import JournalEntry, MemoryRecord, RunRecord
from ._core import (
    Check,
    Dialect,
    Op,
    RecallQuery,
    Result,
    Sql,
    StoreCore,
    drive,
    parks_for_events,
)
from ._pg_group import GroupCommit
from ._pg_pool import AsyncPool
from ._pg_schema import LIVENESS_CLASS, SCHEMA_VERSION, channel, migrate, quoted
from ._protocols import ClaimedRun
from ._redact import is_secret_parameter, redact
from ._rules import Bm25, text_tokens
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
    ACursor = psycopg.AsyncCursor[tuple[Any, ...]]

__all__ = ["PG_SCHEMA_VERSION", "PostgresDialect", "PostgresStore"]

PG_SCHEMA_VERSION = SCHEMA_VERSION
"""The PostgreSQL schema version this agency-runtime writes."""

INSTALL_HINT = "pip install 'agency-runtime[postgres]'"

_RETRIES = 4
"""Attempts of one operation when PostgreSQL aborts it for a deadlock or serialization."""
_ROLLED_BACK = frozenset({"40000", "40001", "40P01"})
"""SQLSTATEs of a transaction PostgreSQL rolled back, worth trying again: transaction
rollback, serialization failure, deadlock. (psycopg's ``SerializationFailure`` and
``DeadlockDetected`` are not subclasses of its ``TransactionRollback``.)"""

PREPARE_THRESHOLD = 1
"""Executions of one statement on one connection after which it is prepared, unless the
store was opened with ``prepare=False``. Not psycopg's default (5): PostgreSQL plans a
prepared statement's first five executions for their parameters anyway (then settles on a
generic plan), so with 5 each connection parsed and planned every statement ten times
before it ran unplanned, a large share of a short-lived worker's statements (a claim's
plan costs more than its execution). 1, not 0: a statement run once per connection (a
migration's script) is never prepared."""

CHECK_IDLE_SECONDS = 5.0
"""A pooled connection idle longer than this is checked (one round trip) before use."""

_SESSION_WAIT_SECONDS = 2.0
"""How long a first claim waits for the listener to hold this process's liveness session
(then it claims without one: those runs fall back to their lease)."""

T = TypeVar("T")


def _execute(conn: Conn, program: Op[T]) -> T:
    """Run ``program``'s statements on ``conn`` in turn; its value."""

    def one(sql: Sql) -> Result:
        cur = conn.execute(sql.query, sql.params)
        return Result(cur.fetchall() if cur.description is not None else [], cur.rowcount)

    return drive(program, one)


_TUPLES_OK = 2
"""libpq's ``PGRES_TUPLES_OK`` (``psycopg.pq.ExecStatus.TUPLES_OK``): a result with rows."""


async def _aexecute(cur: ACursor, program: Op[T]) -> T:
    """:func:`_execute` on a cursor of an ``AsyncConnection`` (its connection's own: one
    cursor per connection, reused, rather than a new one per statement)."""
    try:
        sql = next(program)
        while True:
            await cur.execute(sql.query, sql.params)
            result = cur.pgresult
            rows = await cur.fetchall() if result and result.status == _TUPLES_OK else []
            sql = program.send(Result(rows, cur.rowcount))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class PostgresDialect(Dialect):
    """PostgreSQL's fragments: tables in ``schema``, row locks, lists as ``text[]``, rows
    as JSON, ``NOTIFY`` on ``channel`` with the commit, the server's clock when the store has
    none, and memory search on word arrays ranked by :class:`~._rules.Bm25` in Python."""

    seq = "seq"
    for_update = " FOR UPDATE"
    for_share = " FOR SHARE"
    skip_locked = " FOR UPDATE SKIP LOCKED"
    bytewise = ' COLLATE "C"'
    unindexed = ""
    no_limit = None
    now = "COALESCE(CAST(%(now)s AS float8), extract(epoch FROM clock_timestamp())::float8)"
    server_now = "SELECT extract(epoch FROM clock_timestamp())::float8"
    # A holder's session is gone when its liveness lock can be taken: a shared try-lock on
    # the key (never waits; held to the end of the statement's transaction) fails while the
    # holder's session keeps its exclusive lock. One lock-table probe per running run
    # looked at, where reading pg_locks copied the whole lock table on every claim (a few
    # hundred microseconds of server CPU each, under load). A key no session can hold (a
    # damaged row) is never gone: that run waits for its lease.
    session_gone = (
        "(CASE WHEN lease_session BETWEEN 1 AND 2147483647 THEN "
        f"pg_try_advisory_xact_lock_shared({LIVENESS_CLASS}, lease_session::int4) "
        "ELSE false END)"
    )
    session_set = ", lease_session = %(session)s"
    folds = True

    def __init__(self, schema: str) -> None:
        self.t = f"{quoted(schema)}."  # checks the name
        self._schema = schema
        self._channel = channel(schema)

    def among(self, param: str, *, negated: bool = False) -> str:
        return f" {'<> ALL' if negated else '= ANY'}(CAST(%({param})s AS text[]))"

    def array(self, values: Sequence[str]) -> Any:
        return list(values)

    def rows_of(self, param: str, columns: Sequence[tuple[str, str]]) -> str:
        typed = ", ".join(f"{name} {kind}" for name, kind in columns)
        return f"json_to_recordset(CAST(%({param})s AS json)) AS x({typed})"

    def notifying(self, statement: str, returning: str) -> str:
        key = returning.split(",", 1)[0].strip()
        return (
            f"WITH n AS ({statement} RETURNING {returning}) "
            f"SELECT n.*, pg_notify('{self._channel}', left(n.{key}::text, 200)) IS NULL FROM n"
        )

    def serialized(self, *keys: str) -> Op[None]:
        for key in keys:
            yield Sql(
                "SELECT pg_advisory_xact_lock(hashtext(%(schema)s), hashtext(%(key)s))",
                {"schema": self._schema, "key": key},
            )

    def save_memory(self, record: MemoryRecord) -> Op[bool]:
        t = self.t
        words = text_tokens(record.content)
        values = {
            "id": record.id, "namespace": record.namespace, "content": record.content,
            "tags": to_json(record.tags).decode(), "tag_set": list(dict.fromkeys(record.tags)),
            "scope": record.scope, "words": words, "created_at": record.created_at,
            "expires_at": record.expires_at, "length": len(words),
        }  # fmt: skip
        # One statement: the item, and the corpus counts bm25 needs (when it was new).
        row = (
            yield Sql(
                f"WITH saved AS (INSERT INTO {t}memory_items (id, namespace, content, tags, "
                "tag_set, scope, words, created_at, expires_at) VALUES (%(id)s, %(namespace)s, "
                "%(content)s, %(tags)s, %(tag_set)s::text[], %(scope)s, %(words)s::text[], "
                "%(created_at)s, %(expires_at)s) ON CONFLICT (id) DO NOTHING RETURNING 1), "
                f"counted AS (UPDATE {t}memory_corpus SET "
                "documents = documents + (SELECT count(*) FROM saved), "
                "length = length + (SELECT count(*) FROM saved) * %(length)s) "
                "SELECT count(*) FROM saved",
                values,
            )
        ).one()
        return row is not None and row[0] == 1

    def memory_filter(self, query: RecallQuery) -> tuple[str, dict[str, Any]]:
        where = "m.namespace = %(ns)s AND (m.expires_at IS NULL OR m.expires_at > %(now)s)"
        if query.scope is not None:
            where += " AND m.scope = %(scope)s"
        if query.tags:
            where += " AND m.tag_set @> %(tags)s::text[]"
        return where, {"ns": query.namespace, "now": query.now, "scope": query.scope,
                       "tags": query.tags}  # fmt: skip

    def search_memory(
        self, query: RecallQuery, where: str, params: dict[str, Any]
    ) -> Op[list[tuple[Any, ...]]]:
        t = self.t
        # The matching items and, in the same snapshot, what bm25 counts over the whole
        # corpus (as FTS5 does): documents, words, and documents per term.
        matched = yield Sql(
            f"WITH stats AS (SELECT c.documents, c.length, ARRAY(SELECT (SELECT "
            f"count(*) FROM {t}memory_items h WHERE h.words @> ARRAY[u.term]) "
            "FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS u(term, n) "
            f"ORDER BY u.n) AS holding FROM {t}memory_corpus c) "
            f"SELECT {self.memory_columns}, m.words, s.documents, s.length, s.holding "
            f"FROM {t}memory_items m CROSS JOIN stats s "
            f"WHERE m.words && %(terms)s::text[] AND {where}",
            {**params, "terms": query.terms},
        )
        return _best(matched.rows, query.terms, query.limit) if matched.rows else []

    def purge_memory(self, now: float) -> Op[int]:
        t = self.t
        row = (
            yield Sql(
                f"WITH gone AS (DELETE FROM {t}memory_items WHERE expires_at IS NOT NULL "
                "AND expires_at <= %(now)s RETURNING cardinality(words) AS n), "
                f"counted AS (UPDATE {t}memory_corpus SET "
                "documents = documents - (SELECT count(*) FROM gone), "
                "length = length - (SELECT COALESCE(SUM(n), 0) FROM gone)) "
                "SELECT count(*) FROM gone",
                {"now": now},
            )
        ).one()
        return 0 if row is None else int(row[0])


def _import_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        raise StoreUnavailableError(
            f"the PostgreSQL store needs psycopg 3 with its pool ({exc}); install it with "
            f"{INSTALL_HINT}"
        ) from exc


class PostgresStore(StoreCore):
    """Runs in a PostgreSQL database, shared by every process that opens the same schema.

    ``dsn`` is a libpq URL (``postgresql://user:pass@host:5432/db``) or conninfo string;
    ``schema`` the PostgreSQL schema holding the tables (created and migrated on open).
    ``min_size``/``max_size`` bound the connection pool; ``connect_timeout`` (seconds) bounds
    opening a connection and waiting for a free one. ``prepare=False`` makes no server-side
    prepared statements (for a pooler that cannot keep them: PgBouncer before 1.21 in
    transaction mode). ``liveness=False`` (``?liveness=false``) holds no liveness session:
    takeover of this process's runs then waits for their leases (required behind a pooler in
    transaction mode, where a session is not this process's). ``clock`` stamps leases and
    times (default: the server's clock);
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
        liveness: bool = True,
        clock: Clock | None = None,
        url: str | None = None,
    ) -> None:
        _import_psycopg()
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
        from psycopg_pool import ConnectionPool

        self._d = PostgresDialect(schema)  # checks the name
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
        self._session_key: int | None = None
        self._liveness = liveness
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
        # The asyncio path's connections: opened as tasks need them, none yet; each with the
        # cursor its statements run on (made once: a cursor costs more than a statement's
        # own Python work on psycopg's side).
        self._cursors: weakref.WeakKeyDictionary[AConn, ACursor] = weakref.WeakKeyDictionary()
        # Each event loop's step commits and outcomes (their groups: one loop's tasks wait on
        # each other).
        self._groups: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, GroupCommit[tuple[JournalEntry, str]]
        ] = weakref.WeakKeyDictionary()
        self._outcome_groups: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, GroupCommit[tuple[RunRecord, str, tuple[int, int]]]
        ] = weakref.WeakKeyDictionary()
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

    async def _run(
        self,
        what: str,
        work: Callable[[], Op[T]],
        *,
        tx: bool = False,
        several: bool = False,
        check: Check = None,
    ) -> T:
        """Run the program ``work()`` (``tx``: in one transaction), retried as a whole with a
        fresh program when PostgreSQL aborted it; ``what`` names it in errors. ``several``:
        it always sends more than one statement (so it takes a worker thread, as a
        transaction does; see the module's docstring). ``check`` has nothing to check here:
        a server's database is not a file that can be deleted under the store."""
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
                        cur = self._cursors.get(conn)
                        if cur is None:
                            cur = self._cursors[conn] = conn.cursor()
                        return await _aexecute(cur, work())
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

    # -- steps -------------------------------------------------------------------------------

    async def commit_step(self, entry: JournalEntry, *, owner: str) -> bool:
        """The core's commit, on asyncio through this loop's :class:`~._pg_group.GroupCommit`:
        alone when no other commit of the loop's is about and no other task is ready to run,
        else with the others of the same turn, or those that wait for the one in flight, in
        one statement (:meth:`commit_steps`)."""
        if _current_async_library() != "asyncio":
            return await super().commit_step(entry, owner=owner)
        group = _loops_group(self._groups, self._commit_alone, self.commit_steps)
        return await group.commit((entry, owner))

    async def _commit_alone(self, commit: tuple[JournalEntry, str]) -> bool:
        return await super().commit_step(commit[0], owner=commit[1])

    async def finish_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        unjournaled: tuple[int, int] = (0, 0),
        forget: Sequence[str] = (),
    ) -> bool:
        """The core's outcome, grouped on asyncio as steps are (:meth:`commit_step`), unless
        it needs a transaction of its own (``forget``; a run parking to wait for events)."""
        if forget or parks_for_events(record) or _current_async_library() != "asyncio":
            return await super().finish_run(
                record, owner=owner, unjournaled=unjournaled, forget=forget
            )
        group = _loops_group(self._outcome_groups, self._finish_alone, self.finish_runs)
        return await group.commit((record, owner, unjournaled))

    async def _finish_alone(self, outcome: tuple[RunRecord, str, tuple[int, int]]) -> bool:
        record, owner, unjournaled = outcome
        return await super().finish_run(record, owner=owner, unjournaled=unjournaled)

    # -- wake-ups ---------------------------------------------------------------------------

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
                    if self._liveness:
                        self._session_key = self._hold_session(conn, self._session_key)
                    self._listening.set()
                    self._wakeups.ring()  # notifications may have been missed until now
                    delay = 0.1
                    while not self._stopping.is_set():
                        for _ in conn.notifies(timeout=0.2):
                            self._wakeups.ring()
            except Exception:  # dropped or refused: waiters poll by timeout meanwhile
                self._listening.clear()  # (the key is kept: taken again on reconnecting)
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)
        self._listening.clear()

    @staticmethod
    def _hold_session(conn: Any, previous: int | None) -> int | None:
        """Take a liveness lock on ``conn`` (the listener's direct connection): under
        ``previous``, the key of the runs this store claimed before its connection was cut
        (so they live again), else under a fresh random key."""
        for attempt in range(8):
            key = previous if attempt == 0 and previous else 1 + secrets.randbelow(2**31 - 2)
            row = conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (LIVENESS_CLASS, key)
            ).fetchone()
            if row is not None and row[0]:
                return key
        return None  # every key taken (never, in practice): claims fall back to the lease

    def _session(self) -> int | None:
        """The key of the liveness lock the listener holds, while it holds it."""
        return self._session_key if self._listening.is_set() else None

    async def claim_queued_runs(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[ClaimedRun]:
        """The core's claim, under this process's liveness session: the listener (started
        here if it is not yet) holds it, so a worker's first claims already carry it."""
        listening = self._listen()
        if not listening.is_set() and limit > 0:
            await anyio.to_thread.run_sync(listening.wait, _SESSION_WAIT_SECONDS)
        return await super().claim_queued_runs(
            queues=queues, owner=owner, lease_seconds=lease_seconds, limit=limit,
            exclude=exclude,
        )  # fmt: skip

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


G = TypeVar("G")


def _loops_group(
    groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit[G]],
    alone: Callable[[G], Awaitable[bool]],
    together: Callable[[list[G]], Awaitable[list[bool]]],
) -> GroupCommit[G]:
    """The running asyncio loop's :class:`GroupCommit` in ``groups`` (made on its first use:
    a store serves one loop after another, or several in threads)."""
    loop = asyncio.get_running_loop()
    group = groups.get(loop)
    if group is None:
        group = groups[loop] = GroupCommit(alone, together)
    return group


def _best(rows: list[tuple[Any, ...]], terms: list[str], limit: int) -> list[tuple[Any, ...]]:
    """The ``limit`` best bm25 matches of ``rows`` (FTS5's ranking, by ``_rules.Bm25``).

    Each row ends with the item's words, then the corpus's documents, total length and
    documents holding each term; the same arithmetic as FTS5's ``bm25()``, so every
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
