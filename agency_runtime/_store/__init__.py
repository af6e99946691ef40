"""Durable storage: seven narrow protocols, their union :class:`Store`, and the backends.

* :mod:`._protocols` — :class:`RunLog`, :class:`RunQueue`, :class:`EventLog`,
  :class:`ScheduleTable`, :class:`LockTable`, :class:`MemoryIndex`, :class:`DocumentStore`,
  :class:`AgentMemoryStore` (documents and the index) and :class:`Store` (all seven);
* :mod:`._core` — every store operation, written once as a program over a dialect;
* :mod:`._sqlite` (with its numbered migrations in :mod:`._migrations`) and :mod:`._postgres`
  (with :mod:`._pg_schema`): a dialect and an executor each; :mod:`._memory`, SQLite in memory;
* :mod:`._rows` — what a stored row means, shared by the SQL stores;
* :mod:`._wakeups` — wake-ups for whoever waits on runs (workers, ``runs.wait``);
* :mod:`._rules` — the semantics every backend shares (claims, query words, recall ranking);
* :mod:`._url` — store URLs and the process's open stores.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_names
from .._types import Claim, RunRecord
from ._protocols import (
    AgentMemoryStore,
    ClaimedRun,
    DocumentStore,
    EventLog,
    LockTable,
    MemoryIndex,
    RunLog,
    RunQueue,
    ScheduleTable,
    Store,
)
from ._url import DEFAULT_STORE_URL, open_store, resolve_store

if TYPE_CHECKING:
    from ._memory import MemoryStore
    from ._postgres import PostgresStore
    from ._sqlite import SCHEMA_VERSION, SqliteStore

_BACKENDS = {
    "MemoryStore": "._memory",
    "PostgresStore": "._postgres",
    "SCHEMA_VERSION": "._sqlite",
    "SqliteStore": "._sqlite",
}
"""The backends, imported when first named (a store URL names one, or code does): a process
that only uses SQLite never loads the PostgreSQL store, and ``import agency_runtime`` none."""


__getattr__, __dir__ = lazy_names(__name__, globals(), _BACKENDS)


__all__ = [
    "DEFAULT_STORE_URL",
    "SCHEMA_VERSION",
    "AgentMemoryStore",
    "Claim",
    "ClaimedRun",
    "DocumentStore",
    "EventLog",
    "LockTable",
    "MemoryIndex",
    "MemoryStore",
    "PostgresStore",
    "RunLog",
    "RunQueue",
    "RunRecord",
    "ScheduleTable",
    "SqliteStore",
    "Store",
    "open_store",
    "resolve_store",
]
