"""The embedded default store: one SQLite file in WAL mode, on the store core.

Every operation is the core's (:mod:`._core`); this module is the SQLite dialect
(:class:`SqliteDialect`) and the executor: programs run inline on the calling thread, under
one lock, on one connection — a WAL commit with ``synchronous=NORMAL`` takes tens of
microseconds, less than one hop to a worker thread. A transaction is ``BEGIN IMMEDIATE``: it
holds the database's one write lock from its first statement, so the core's row locks are not
needed here. Several processes may share one file; ``busy_timeout`` makes a writer wait for
another instead of failing. Needs SQLite 3.35 or later (``RETURNING``).
"""

from __future__ import annotations

import functools
import operator
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic_core import to_json

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import InvalidArgumentError, StoreError, StoreUnavailableError
from .._types import MemoryRecord
from ._core import (
    Check,
    Dialect,
    Op,
    RecallQuery,
    Result,
    Sql,
    StoreCore,
    drive,
)
from ._migrations import SCHEMA_VERSION, migrate
from ._wakeups import Wakeups

__all__ = ["SCHEMA_VERSION", "SqliteDialect", "SqliteStore"]

T = TypeVar("T")

WAL_LIMIT_BYTES = 1024 * 1024
"""The WAL's cap while runs write: SQLite checkpoints it once it holds this much
(``wal_autocheckpoint``) and truncates it back to this size (``journal_size_limit``). It can
grow past the cap only while another connection's read keeps a checkpoint from finishing."""

WAL_TRIM_BYTES = 2 * WAL_LIMIT_BYTES
"""When a run ends and the WAL file is larger than this, it is checkpointed and truncated:
a WAL that grew past its cap (a long read held checkpoints back). Within the cap it is left
as it is: the truncating checkpoint syncs the database and the next commit a new WAL header,
which cost a run's end (an interrupt's answer, say) 1 to 15 ms of wall time here, 3 to 5
times the rest of an answer after 1,000 steps."""

PAGE_SIZE = 1024
"""The page size of a new database file, in bytes.

Smaller than SQLite's 4 KiB default: a journal row of a few kilobytes (an LLM call's prompt
and answer) then wastes at most a small page on its overflow chain instead of most of a 4 KiB
one, and each of the ~40 tables and indexes of an empty store starts with one small page.
"""

FILE_CHECK_SECONDS = 0.05
"""How often (at most) a step commit checks that the database file is still the one opened."""

MIN_SQLITE = (3, 35, 0)
"""The oldest SQLite the store runs on (``RETURNING``, ``UPDATE … FROM``, ``json_each``)."""

Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

_NAMED = re.compile(r"%\((\w+)\)s")


Picker = Callable[[Mapping[str, Any]], Sequence[Any]]
"""The values of a statement's parameters, in the order of its numbered placeholders."""


def _no_values(params: Mapping[str, Any]) -> Sequence[Any]:
    return ()


@functools.lru_cache(maxsize=1024)
def _sqlite_sql(query: str) -> tuple[str, Picker]:
    """The core's ``%(name)s`` placeholders as SQLite's numbered ``?N`` (a name used twice
    is one number), and what picks the parameters' values in that order.

    Bound by position, not by name: sqlite3 binds a named parameter by building a string of
    its name and looking it up in the mapping, and a step's commit has fifteen of them (a
    fifth of the commit's instructions); ``itemgetter`` picks them in C."""
    numbers: dict[str, int] = {}

    def numbered(match: re.Match[str]) -> str:
        return f"?{numbers.setdefault(match[1], len(numbers) + 1)}"

    sql = _NAMED.sub(numbered, query)
    names = tuple(numbers)
    if not names:
        return sql, _no_values
    if len(names) == 1:  # itemgetter of one name gives the value, not a 1-tuple
        (name,) = names
        return sql, lambda params: (params[name],)
    return sql, operator.itemgetter(*names)


class SqliteDialect(Dialect):
    """SQLite's fragments: bare table names, ``rowid`` order, no row locks (a write
    transaction holds the whole file), lists and rows as JSON, notifications in-process only,
    and memory search on an FTS5 index."""

    t = ""
    seq = "rowid"
    for_update = ""
    for_share = ""
    skip_locked = ""
    bytewise = ""
    unindexed = "+"
    no_limit = -1
    now = "%(now)s"
    server_now = None

    def among(self, param: str, *, negated: bool = False) -> str:
        return f" {'NOT IN' if negated else 'IN'} (SELECT value FROM json_each(%({param})s))"

    def array(self, values: Sequence[str]) -> Any:
        return to_json(list(values)).decode()

    def rows_of(self, param: str, columns: Sequence[tuple[str, str]]) -> str:
        picked = ", ".join(f"json_extract(value, '$.{name}') AS {name}" for name, _ in columns)
        return f"(SELECT {picked} FROM json_each(%({param})s)) AS x"

    def notifying(self, statement: str, returning: str) -> str:
        # Other processes poll; this one's waiters are woken by the store after the commit.
        return f"{statement} RETURNING {returning}, NULL"

    def serialized(self, *keys: str) -> Op[None]:
        return  # BEGIN IMMEDIATE: the write transaction is the only one
        yield  # a generator

    def save_memory(self, record: MemoryRecord) -> Op[bool]:
        values = {
            "id": record.id, "ns": record.namespace, "content": record.content,
            "tags": to_json(record.tags).decode(), "scope": record.scope,
            "created": record.created_at, "expires": record.expires_at,
        }  # fmt: skip
        saved = (
            yield Sql(
                "INSERT INTO memory_items (id, namespace, content, tags, scope, created_at, "
                "expires_at) VALUES (%(id)s, %(ns)s, %(content)s, %(tags)s, %(scope)s, "
                "%(created)s, %(expires)s) ON CONFLICT (id) DO NOTHING RETURNING rowid",
                values,
            )
        ).one()
        if saved is None:
            return False  # saved before under this id: an idempotent repeat
        params = {"item": saved[0], "content": record.content, "tags": self.array(record.tags)}
        yield Sql("INSERT INTO memory_fts (rowid, content) VALUES (%(item)s, %(content)s)", params)
        yield Sql(
            "INSERT INTO memory_tags (tag, item) SELECT DISTINCT value, %(item)s "
            "FROM json_each(%(tags)s) WHERE true ON CONFLICT DO NOTHING",
            params,
        )
        return True

    def memory_filter(self, query: RecallQuery) -> tuple[str, dict[str, Any]]:
        # "+m.namespace": never drive the search from the namespace index; a conversation's
        # tag (when given) narrows far better, so a new or quiet conversation costs little.
        where = ["+m.namespace = %(ns)s", "(m.expires_at IS NULL OR m.expires_at > %(now)s)"]
        params: dict[str, Any] = {"ns": query.namespace, "now": query.now, "scope": query.scope}
        if query.scope is not None:
            where.append("m.scope = %(scope)s")
        for index, tag in enumerate(query.tags):
            params[f"tag{index}"] = tag
            if index == 0:
                where.append("m.rowid IN (SELECT item FROM memory_tags WHERE tag = %(tag0)s)")
            else:
                where.append(
                    f"EXISTS (SELECT 1 FROM memory_tags t WHERE t.tag = %(tag{index})s "
                    "AND t.item = m.rowid)"
                )
        return " AND ".join(where), params

    def search_memory(
        self, query: RecallQuery, where: str, params: dict[str, Any]
    ) -> Op[list[tuple[Any, ...]]]:
        match = " OR ".join('"' + term.replace('"', '""') + '"' for term in query.terms)
        matched = yield Sql(
            f"SELECT {self.memory_columns} FROM memory_fts f JOIN memory_items m "
            f"ON m.rowid = f.rowid WHERE memory_fts MATCH %(match)s AND {where} "
            "ORDER BY bm25(memory_fts), m.created_at DESC, m.rowid DESC LIMIT %(limit)s",
            {**params, "match": match, "limit": query.limit},
        )
        return matched.rows

    def purge_memory(self, now: float) -> Op[int]:
        expired = (
            "SELECT rowid FROM memory_items WHERE expires_at IS NOT NULL AND expires_at <= %(now)s"
        )
        params = {"now": now}
        yield Sql(f"DELETE FROM memory_fts WHERE rowid IN ({expired})", params)
        yield Sql(f"DELETE FROM memory_tags WHERE item IN ({expired})", params)
        gone = yield Sql(f"DELETE FROM memory_items WHERE rowid IN ({expired})", params)
        return gone.rowcount


class SqliteStore(StoreCore):
    """Runs in one SQLite file (WAL journal), shareable by several processes.

    ``path`` may be ``":memory:"`` for a private in-memory database. ``synchronous``
    trades durability on power loss for speed: ``"NORMAL"`` (default) never corrupts and
    loses at most the last commits on an OS crash; ``"FULL"`` loses nothing.
    """

    _d = SqliteDialect()

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 10.0,
        url: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise StoreUnavailableError(
                f"the SQLite store needs SQLite {'.'.join(map(str, MIN_SQLITE))} or later; "
                f"this Python's sqlite3 module has {sqlite3.sqlite_version}. Use a newer "
                "Python build, or a PostgreSQL store (AGENCY_STORE=postgresql://…)"
            )
        self._clock = clock if clock is not None else SYSTEM_CLOCK
        self._path = str(path)
        self._url = url or f"sqlite:///{self._path}"
        self._lock = threading.Lock()
        self._wakeups = Wakeups()
        self._busy_ms = int(busy_timeout * 1000)
        self._conn: sqlite3.Connection | None = self._open(synchronous, busy_timeout)
        self._cursor: sqlite3.Cursor | None = self._conn.cursor()
        """The cursor every statement runs on (one at a time, under the lock): not a new one
        per statement, as ``conn.execute`` makes (a tenth of a step commit's instructions)."""
        self._identity = self._file_identity()
        self._check_due = time.monotonic() + FILE_CHECK_SECONDS
        """When a step commit looks at the file next (see :meth:`_check_file`)."""

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

    def file_gone(self) -> bool:
        """Whether the database file this store opened was deleted or replaced since (its
        writes are then refused; ``open_store`` with its URL opens the file there now).
        Always ``False`` for ``:memory:``."""
        return self._identity is not None and self._file_identity() != self._identity

    def _check_file(self) -> None:
        """Refuse to write when the file this store opened was deleted or replaced.

        SQLite keeps writing to an unlinked file, so without this a deleted store would take
        every commit and report runs completed that no one can ever read back. Step commits
        look when :attr:`_check_due` has come, :data:`FILE_CHECK_SECONDS` after the last
        look (a ``stat`` costs as much as a tenth of a commit); claims, pauses, rewinds and
        every run's outcome always look.
        """
        if self._identity is None:
            return
        self._check_due = time.monotonic() + FILE_CHECK_SECONDS
        now = self._file_identity()
        if now != self._identity:
            what = "deleted" if now == (-1, -1) else "replaced by another file"
            raise StoreUnavailableError(
                f"the SQLite store file {self._path!r} was {what} while this process had it "
                "open; nothing written since then can be read back. Restore the file, or "
                "open the store again (its URL, or a new SqliteStore) to start a new one "
                "there (its runs start over)"
            )

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

    # -- the executor ----------------------------------------------------------------------

    async def _run(
        self,
        what: str,
        work: Callable[[], Op[T]],
        *,
        tx: bool = False,
        several: bool = False,
        check: Check = None,
    ) -> T:
        """Run the program ``work()`` inline, under the store's lock (``tx``: in one
        ``BEGIN IMMEDIATE`` transaction, rolled back when it raises)."""
        with self._lock:
            cursor = self._usable(check)
            try:
                if not tx:
                    return drive(work(), functools.partial(_execute, cursor))
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    value = drive(work(), functools.partial(_execute, cursor))
                except BaseException:
                    cursor.execute("ROLLBACK")
                    raise
                cursor.execute("COMMIT")
                return value
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                raise self._mapped(what, exc) from exc

    def _usable(self, check: Check) -> sqlite3.Cursor:
        """The connection's cursor, under the lock: refused when the store is closed, or
        (``check``) when its file was deleted or replaced."""
        cursor = self._cursor
        if cursor is None:
            raise StoreError(f"the SQLite store {self._path!r} is closed")
        # A step commit (throttled) tests the time here, not in a call to _check_file.
        if check is not None and (check != "throttled" or time.monotonic() >= self._check_due):
            self._check_file()
        return cursor

    async def _one(self, what: Callable[[], str], sql: Sql, *, check: Check = None) -> Result:
        """:meth:`_run` of one statement, without a program around it; ``what()`` is called
        only to name a failure."""
        with self._lock:
            cursor = self._usable(check)
            try:
                return _execute(cursor, sql)
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                raise self._mapped(what(), exc) from exc

    def _write_now(
        self, what: Callable[[], str], query: str, params: Mapping[str, Any], *, check: Check
    ) -> int:
        with self._lock:
            cursor = self._usable(check)
            try:
                return _changed(cursor, query, params)
            except (sqlite3.Error, UnicodeEncodeError, OverflowError) as exc:
                raise self._mapped(what(), exc) from exc

    def _finished(self, status: str) -> None:
        """Fold a large WAL back into the database at a run's end, so the file stays small.

        Not at a pause: an answer usually follows, and the first commit after a truncated WAL
        syncs the new WAL's header (0.25 to 1.6 ms here, in the answer's time). A paused run's
        WAL stays within the cap (``journal_size_limit``) until a run ends or the file
        closes."""
        if self._path == ":memory:" or status == "paused":
            return
        try:
            size = os.path.getsize(self._path + "-wal")
        except OSError:
            return
        if size > WAL_TRIM_BYTES:
            with self._lock:
                conn = self._conn
                if conn is None:
                    return
                # Without waiting: while another process reads or writes the file the
                # checkpoint gives up at once (the next run's end tries again) instead of
                # holding this run's end for up to busy_timeout.
                try:
                    conn.execute("PRAGMA busy_timeout = 0")
                    try:
                        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                    finally:
                        conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
                except sqlite3.Error as exc:
                    raise self._mapped("checkpoint the WAL", exc) from exc

    def close(self) -> None:
        """Close the connection (idempotent); the file stays."""
        with self._lock:
            conn, self._conn, self._cursor = self._conn, None, None
        if conn is not None:
            conn.close()

    def __repr__(self) -> str:
        return f"<SqliteStore {self._path!r}>"


def _execute(cursor: sqlite3.Cursor, sql: Sql) -> Result:
    """One statement of a program on the store's ``cursor``."""
    conn = cursor.connection
    before = conn.total_changes
    query, values = _sqlite_sql(sql.query)
    cursor.execute(query, values(sql.params or _NO_PARAMS))
    if cursor.description is None:
        # The rows it changed, counted by SQLite itself: ``cursor.rowcount`` is -1 for a
        # statement that starts with WITH, as the core's guarded inserts do.
        return Result([], conn.total_changes - before)
    rows = cursor.fetchall()
    return Result(rows, conn.total_changes - before)


def _changed(cursor: sqlite3.Cursor, query: str, params: Mapping[str, Any]) -> int:
    """:func:`_execute` of a statement that returns no rows: how many rows it changed."""
    conn = cursor.connection
    before = conn.total_changes
    numbered, values = _sqlite_sql(query)
    cursor.execute(numbered, values(params))
    return conn.total_changes - before


_NO_PARAMS: Mapping[str, Any] = {}
