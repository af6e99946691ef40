"""The PostgreSQL store's schema, as numbered migrations, and the migration procedure.

Every table lives in one PostgreSQL schema (``agency`` unless the URL says ``?schema=NAME``),
whose ``schema_version`` table records the last migration it ran. Opening a store runs every
later one, in order, in one transaction under a transaction-scoped advisory lock keyed by the
schema's name: concurrent openers wait for the first, then find nothing left to do. A schema
written by a newer version of agency-runtime (a higher number than :data:`SCHEMA_VERSION`) is
refused with :class:`~agency_runtime.StoreSchemaError`.

Scripts name their tables ``{s}.table``; ``{s}`` is the quoted schema. Add a migration by
appending ``(N + 1, script)`` to :data:`MIGRATIONS`; never edit one that has shipped.

Columns mirror the SQLite store's (:mod:`._migrations`): JSON is stored as ``TEXT`` exactly as
pydantic wrote it, money as ``BIGINT`` pico-dollars, times as ``DOUBLE PRECISION`` seconds.
``seq`` columns of ``runs`` and ``memory_items`` are the insertion order (SQLite's ``rowid``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .._errors import InvalidArgumentError, StoreSchemaError

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "LIVENESS_CLASS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "channel",
    "check_schema_name",
    "migrate",
    "quoted",
]

SCHEMA_VERSION = 6
"""The schema this version writes; a schema with a higher recorded version is refused."""

_LOCK_CLASS = 0x6167_656E  # "agen": the advisory-lock class of agency-runtime's migrations
LIVENESS_CLASS = 0x6167_6C76  # "aglv": the class of the session locks that say a process lives

_SCHEMA_1 = """
CREATE TABLE {s}.runs (
    seq                BIGSERIAL UNIQUE,
    run_id             TEXT PRIMARY KEY,
    status             TEXT NOT NULL,
    entry              TEXT NOT NULL,
    arguments          TEXT NOT NULL,
    model              TEXT,
    overrides          TEXT,
    value              TEXT,
    error              TEXT,
    interrupts         TEXT,
    cost_pico          BIGINT NOT NULL DEFAULT 0,
    tokens             BIGINT NOT NULL DEFAULT 0,
    unjournaled_pico   BIGINT NOT NULL DEFAULT 0,
    unjournaled_tokens BIGINT NOT NULL DEFAULT 0,
    attempts           BIGINT NOT NULL DEFAULT 0,
    version            BIGINT NOT NULL DEFAULT 0,
    queue              TEXT,
    priority           BIGINT NOT NULL DEFAULT 0,
    lease_owner        TEXT,
    lease_expires_at   DOUBLE PRECISION,
    created_at         DOUBLE PRECISION NOT NULL,
    started_at         DOUBLE PRECISION,
    finished_at        DOUBLE PRECISION,
    updated_at         DOUBLE PRECISION NOT NULL
);
CREATE INDEX runs_by_created ON {s}.runs (created_at DESC, seq DESC);
CREATE INDEX runs_by_status ON {s}.runs (status, created_at DESC, seq DESC);
CREATE INDEX runs_runnable ON {s}.runs (queue, priority DESC, created_at, seq)
    WHERE queue IS NOT NULL AND status IN ('queued', 'running');
CREATE TABLE {s}.queues (
    name        TEXT PRIMARY KEY,
    concurrency BIGINT
);
CREATE TABLE {s}.steps (
    run_id     TEXT NOT NULL,
    path       TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    name       TEXT NOT NULL,
    callsite   TEXT NOT NULL,
    result     TEXT NOT NULL,
    locals     TEXT,
    scopes     TEXT,
    deltas     TEXT,
    error      TEXT,
    cost_pico  BIGINT NOT NULL,
    tokens     BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, path)
);
CREATE INDEX steps_by_seq ON {s}.steps (run_id, seq);
CREATE TABLE {s}.interrupts (
    run_id       TEXT NOT NULL,
    interrupt_id TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    interrupt    TEXT NOT NULL,
    response     TEXT,
    answered_at  DOUBLE PRECISION,
    PRIMARY KEY (run_id, interrupt_id)
);
CREATE TABLE {s}.checkpoints (
    run_id        TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    body          TEXT NOT NULL,
    PRIMARY KEY (run_id, checkpoint_id)
);
CREATE TABLE {s}.locks (
    ticket     BIGSERIAL PRIMARY KEY,
    name       TEXT NOT NULL,
    owner      TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX locks_by_name ON {s}.locks (name, ticket);
CREATE TABLE {s}.memory_items (
    seq        BIGSERIAL PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    namespace  TEXT NOT NULL,
    content    TEXT NOT NULL,
    tags       TEXT NOT NULL,
    tag_set    TEXT[] NOT NULL,
    scope      TEXT NOT NULL,
    words      TEXT[] NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION
);
CREATE INDEX memory_items_by_time ON {s}.memory_items (namespace, created_at);
CREATE INDEX memory_items_by_expiry ON {s}.memory_items (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX memory_items_by_word ON {s}.memory_items USING GIN (words);
CREATE INDEX memory_items_by_tag ON {s}.memory_items USING GIN (tag_set);
CREATE TABLE {s}.memory_corpus (
    singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    documents BIGINT NOT NULL,
    length    BIGINT NOT NULL
);
INSERT INTO {s}.memory_corpus (documents, length) VALUES (0, 0);
CREATE TABLE {s}.documents (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
)
"""

# Version 2: durable time and events (SQLite's version 4). A worker parks a run in a long wait
# as ``waiting`` (until ``wake_at``, or an event of ``waiting_for``, a JSON list of names);
# events sent to a run are buffered until a wait takes each one; schedules start runs at
# their occurrences.
_SCHEMA_2 = """
ALTER TABLE {s}.runs ADD COLUMN wake_at DOUBLE PRECISION;
ALTER TABLE {s}.runs ADD COLUMN waiting_for TEXT;
CREATE INDEX runs_waking ON {s}.runs (queue, wake_at) WHERE status = 'waiting';
CREATE TABLE {s}.events (
    event_id BIGSERIAL PRIMARY KEY,
    run_id   TEXT NOT NULL,
    name     TEXT NOT NULL,
    payload  TEXT NOT NULL,
    sent_at  DOUBLE PRECISION NOT NULL,
    taken_by TEXT
);
CREATE INDEX events_untaken ON {s}.events (run_id, name, event_id) WHERE taken_by IS NULL;
CREATE UNIQUE INDEX events_taken ON {s}.events (run_id, taken_by) WHERE taken_by IS NOT NULL;
CREATE TABLE {s}.schedules (
    name       TEXT PRIMARY KEY,
    entry      TEXT NOT NULL,
    arguments  TEXT NOT NULL,
    cron       TEXT,
    every      DOUBLE PRECISION,
    timezone   TEXT NOT NULL,
    queue      TEXT NOT NULL,
    next_at    DOUBLE PRECISION NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX schedules_due ON {s}.schedules (queue, next_at)
"""

# Version 3: child runs (SQLite's version 6). A run started by another run (a nested
# agency.run) names its parent and the top-level run of its tree, and its depth in the tree; a
# run's cost_pico keeps its descendants' spend, and descendants_pico says how much of it that
# is. Existing runs are top-level runs (NULL, NULL, 0, 0). Children are listed by parent,
# newest first.
_SCHEMA_3 = """
ALTER TABLE {s}.runs ADD COLUMN parent_id TEXT;
ALTER TABLE {s}.runs ADD COLUMN root_id TEXT;
ALTER TABLE {s}.runs ADD COLUMN depth BIGINT NOT NULL DEFAULT 0;
ALTER TABLE {s}.runs ADD COLUMN descendants_pico BIGINT NOT NULL DEFAULT 0;
CREATE INDEX runs_by_parent ON {s}.runs (parent_id, created_at DESC, seq DESC)
    WHERE parent_id IS NOT NULL
"""

# Version 4: takeover in about a second. A run claimed by a process that holds a liveness
# session (a session advisory lock of class LIVENESS_CLASS on a direct connection) names its
# key; a claimer takes a running run at once when no session holds that key any more (the
# process died: the server closed its connections), before its lease runs out. NULL: the
# lease alone tells (a run claimed without a session).
_SCHEMA_4 = """
ALTER TABLE {s}.runs ADD COLUMN lease_session BIGINT
"""

# Version 5: trace links (SQLite's version 7). A traced execution notes its span's context
# (a W3C traceparent) so the run's next execution links to it; a queued child run's row
# starts with its parent's call span.
_SCHEMA_5 = """
ALTER TABLE {s}.runs ADD COLUMN trace_context TEXT
"""

# Version 6: the journal's format, no table changes (SQLite's version 8): committed inner
# units stored once, as ["unit", path] changes, and a result a message already holds as
# ["same", index]. An older agency-runtime refuses the schema instead of misreading them.
_SCHEMA_6 = ""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, _SCHEMA_1), (2, _SCHEMA_2), (3, _SCHEMA_3), (4, _SCHEMA_4), (5, _SCHEMA_5),
    (6, _SCHEMA_6),
)  # fmt: skip
"""Numbered migrations: a schema at version N runs every script numbered above N."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,49}")


def check_schema_name(name: str) -> str:
    """``name`` if it is a plain identifier (letters, digits, ``_``; at most 50 characters)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"the PostgreSQL schema name {name!r} is not a plain identifier: use letters, "
            "digits and underscores (not starting with a digit), at most 50 characters"
        )
    return name


def quoted(schema: str) -> str:
    """The schema as a quoted SQL identifier (the name is checked to be plain)."""
    return '"' + check_schema_name(schema) + '"'


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of the stores of ``schema`` (``agency`` → ``agency_runs``)."""
    return f"{check_schema_name(schema)}_runs"


def _recorded(conn: psycopg.Connection[Any], schema: str) -> int | None:
    # pg_tables through the statement's own snapshot (to_regclass may use a catalog snapshot
    # older than the advisory lock just taken, missing another opener's commit).
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s "
        "AND tablename = 'schema_version')",
        (check_schema_name(schema),),
    ).fetchone()
    if row is None or not row[0]:
        return None
    found = conn.execute(f"SELECT max(version) FROM {quoted(schema)}.schema_version").fetchone()
    return None if found is None or found[0] is None else int(found[0])


def _refuse_newer(version: int | None, schema: str, where: str) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"the PostgreSQL schema {schema!r} at {where} was written with store schema "
            f"version {version}, but this agency-runtime understands versions up to "
            f"{SCHEMA_VERSION}; upgrade agency-runtime (pip install -U 'agency-runtime[postgres]') "
            "or choose another schema with ?schema=NAME"
        )


def migrate(conn: psycopg.Connection[Any], schema: str, where: str) -> None:
    """Bring ``schema`` on ``conn`` (an autocommit connection) to :data:`SCHEMA_VERSION`.

    ``where`` names the database in messages (the URL, password redacted).
    """
    version = _recorded(conn, schema)
    _refuse_newer(version, schema, where)
    if version == SCHEMA_VERSION:
        return
    s = quoted(schema)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_CLASS, schema))
        version = _recorded(conn, schema)  # another opener may have migrated meanwhile
        _refuse_newer(version, schema, where)
        if version is None:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
            conn.execute(f"CREATE TABLE {s}.schema_version (version INTEGER NOT NULL)")
            version = 0
        for number, script in MIGRATIONS:
            if number <= version:
                continue
            for statement in script.format(s=s).split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"DELETE FROM {s}.schema_version")
            conn.execute(f"INSERT INTO {s}.schema_version (version) VALUES (%s)", (number,))
