"""The SQLite store's schema, as numbered migrations.

A database file records the last migration it ran in ``PRAGMA user_version``; opening it
runs every later one, in order, in one transaction (another process opening the file at the
same time waits, then finds nothing left to do). A file written by a newer version of
agency-runtime (a higher number than :data:`SCHEMA_VERSION`) is refused, naming both.

Add a migration by appending ``(N + 1, script)`` to :data:`MIGRATIONS`; never edit one that
has shipped.
"""

from __future__ import annotations

import sqlite3

from .._errors import StoreSchemaError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

SCHEMA_VERSION = 8
"""The schema this version writes; a file with a higher ``user_version`` is refused."""

_SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS runs (
    run_id           TEXT PRIMARY KEY,
    status           TEXT NOT NULL,
    entry            TEXT NOT NULL,
    arguments        TEXT NOT NULL,
    model            TEXT,
    overrides        TEXT,
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
CREATE TABLE IF NOT EXISTS steps (
    run_id     TEXT NOT NULL,
    path       TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    name       TEXT NOT NULL,
    callsite   TEXT NOT NULL,
    result     TEXT NOT NULL,
    locals     TEXT,
    scopes     TEXT,
    deltas     TEXT,
    cost_pico  INTEGER NOT NULL,
    tokens     INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, path)
) STRICT;
CREATE TABLE IF NOT EXISTS interrupts (
    run_id       TEXT NOT NULL,
    interrupt_id TEXT NOT NULL,
    seq          INTEGER NOT NULL,
    interrupt    TEXT NOT NULL,
    response     TEXT,
    answered_at  REAL,
    PRIMARY KEY (run_id, interrupt_id)
) STRICT;
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id        TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    body          TEXT NOT NULL,
    PRIMARY KEY (run_id, checkpoint_id)
) STRICT;
CREATE TABLE IF NOT EXISTS locks (
    name       TEXT NOT NULL,
    ticket     INTEGER PRIMARY KEY AUTOINCREMENT,
    owner      TEXT NOT NULL,
    expires_at REAL NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS locks_by_name ON locks (name, ticket);
CREATE TABLE IF NOT EXISTS memory_items (
    id         TEXT NOT NULL UNIQUE,
    namespace  TEXT NOT NULL,
    content    TEXT NOT NULL,
    tags       TEXT NOT NULL,
    scope      TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL
) STRICT;
CREATE INDEX IF NOT EXISTS memory_items_by_time ON memory_items (namespace, created_at);
CREATE INDEX IF NOT EXISTS memory_items_by_expiry ON memory_items (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS memory_tags (
    tag     TEXT NOT NULL,
    item    INTEGER NOT NULL,
    PRIMARY KEY (tag, item)
) STRICT, WITHOUT ROWID;
CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5 (content);
CREATE TABLE IF NOT EXISTS documents (
    namespace TEXT NOT NULL,
    key       TEXT NOT NULL,
    body      TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
) STRICT;
"""

# Version 2: a step records the spend it made itself (not the run's running total, which
# counted siblings still in flight), a recorded failure, and the run the spend no committed
# step holds (outside steps, rewound or forgotten steps); runs are listed by status by index.
_SCHEMA_2 = """
ALTER TABLE steps ADD COLUMN error TEXT;
ALTER TABLE runs ADD COLUMN unjournaled_pico INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN unjournaled_tokens INTEGER NOT NULL DEFAULT 0;
CREATE TEMP TABLE step_spend AS
    SELECT run_id, path,
        MAX(0, cost_pico - COALESCE(MAX(cost_pico) OVER earlier, 0)) AS pico,
        MAX(0, tokens - COALESCE(MAX(tokens) OVER earlier, 0)) AS tokens
    FROM steps
    WINDOW earlier AS (PARTITION BY run_id ORDER BY seq
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING);
UPDATE steps SET
    cost_pico = (SELECT pico FROM step_spend s
                 WHERE s.run_id = steps.run_id AND s.path = steps.path),
    tokens = (SELECT tokens FROM step_spend s
              WHERE s.run_id = steps.run_id AND s.path = steps.path);
DROP TABLE step_spend;
UPDATE runs SET
    unjournaled_pico = MAX(0, cost_pico - COALESCE(
        (SELECT SUM(cost_pico) FROM steps WHERE steps.run_id = runs.run_id), 0)),
    unjournaled_tokens = MAX(0, tokens - COALESCE(
        (SELECT SUM(tokens) FROM steps WHERE steps.run_id = runs.run_id), 0));
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, created_at);
"""

# Version 3: queues. A run may belong to a queue (workers claim runnable runs of theirs,
# highest priority first, then the oldest); a queue may limit how many of its runs run at once.
_SCHEMA_3 = """
ALTER TABLE runs ADD COLUMN queue TEXT;
ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS runs_runnable ON runs (queue, status, priority DESC, created_at)
    WHERE queue IS NOT NULL;
CREATE TABLE IF NOT EXISTS queues (
    name        TEXT PRIMARY KEY,
    concurrency INTEGER
) STRICT;
"""

# Version 4: durable time and events. A worker parks a run in a long wait as ``waiting``
# (until ``wake_at``, or an event of ``waiting_for``, a JSON list of names); events sent to a
# run are buffered until a wait takes each one; schedules start runs at their occurrences.
_SCHEMA_4 = """
ALTER TABLE runs ADD COLUMN wake_at REAL;
ALTER TABLE runs ADD COLUMN waiting_for TEXT;
CREATE INDEX IF NOT EXISTS runs_waking ON runs (queue, wake_at) WHERE status = 'waiting';
CREATE TABLE IF NOT EXISTS events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id   TEXT NOT NULL,
    name     TEXT NOT NULL,
    payload  TEXT NOT NULL,
    sent_at  REAL NOT NULL,
    taken_by TEXT
) STRICT;
CREATE INDEX IF NOT EXISTS events_untaken ON events (run_id, name, event_id)
    WHERE taken_by IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS events_taken ON events (run_id, taken_by)
    WHERE taken_by IS NOT NULL;
CREATE TABLE IF NOT EXISTS schedules (
    name       TEXT PRIMARY KEY,
    entry      TEXT NOT NULL,
    arguments  TEXT NOT NULL,
    cron       TEXT,
    every      REAL,
    timezone   TEXT NOT NULL,
    queue      TEXT NOT NULL,
    next_at    REAL NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS schedules_due ON schedules (queue, next_at);
"""

# Version 5: steps are stored in their primary key's order (WITHOUT ROWID), so a step's
# commit writes one B-tree instead of the table and its key's index (~1.4x a plain insert
# before, ~1.0x after), and loading a run's journal reads its rows side by side.
_STEP_COLUMNS_5 = (
    "run_id, path, seq, name, callsite, result, locals, scopes, deltas, error, cost_pico, "
    "tokens, created_at"
)
_SCHEMA_5 = f"""
CREATE TABLE steps_5 (
    run_id     TEXT NOT NULL,
    path       TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    name       TEXT NOT NULL,
    callsite   TEXT NOT NULL,
    result     TEXT NOT NULL,
    locals     TEXT,
    scopes     TEXT,
    deltas     TEXT,
    error      TEXT,
    cost_pico  INTEGER NOT NULL,
    tokens     INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, path)
) STRICT, WITHOUT ROWID;
INSERT INTO steps_5 ({_STEP_COLUMNS_5}) SELECT {_STEP_COLUMNS_5} FROM steps;
DROP TABLE steps;
ALTER TABLE steps_5 RENAME TO steps
"""

# Version 6: child runs. A run started by another run (a nested agency.run) names its
# parent and the top-level run of its tree, and its depth in the tree; a run's cost_pico keeps
# its descendants' spend, and descendants_pico says how much of it that is. Existing runs are
# top-level runs (NULL, NULL, 0, 0). Children are listed by parent, newest first.
_SCHEMA_6 = """
ALTER TABLE runs ADD COLUMN parent_id TEXT;
ALTER TABLE runs ADD COLUMN root_id TEXT;
ALTER TABLE runs ADD COLUMN depth INTEGER NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN descendants_pico INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS runs_by_parent ON runs (parent_id, created_at)
    WHERE parent_id IS NOT NULL
"""

# Version 7: trace links. A traced execution of a run notes its span's context (a W3C
# traceparent), so the run's next execution links its span to it; a queued child run's row
# starts with its parent's call span. NULL: never traced.
_SCHEMA_7 = """
ALTER TABLE runs ADD COLUMN trace_context TEXT
"""

# Version 8: the journal's format, no table changes. A unit that ran committed units inside
# it (a step calling agency.llm) stores one ["unit", path] change for each of them instead of a
# copy of their changes, and a result that is a message its changes hold as ["same", index]
# with the result "null" (each text stored once). An older agency-runtime would read those as
# a damaged journal, so it refuses the file instead (it understands versions up to 7).
_SCHEMA_8 = ""

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, _SCHEMA_1),
    (2, _SCHEMA_2),
    (3, _SCHEMA_3),
    (4, _SCHEMA_4),
    (5, _SCHEMA_5),
    (6, _SCHEMA_6),
    (7, _SCHEMA_7),
    (8, _SCHEMA_8),
)
"""Numbered migrations: a file at ``user_version`` N runs every script numbered above N."""


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the database on ``conn`` (the file ``path``) to :data:`SCHEMA_VERSION`."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreSchemaError(
            f"the SQLite store {path!r} was written with schema version {version}, "
            f"but this agency-runtime understands versions up to {SCHEMA_VERSION}; "
            "upgrade agency-runtime (pip install -U agency-runtime) to use it"
        )
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        for number, script in MIGRATIONS:
            if number <= version:
                continue
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
