"""Durable storage: seven narrow protocols, their union :class:`Store`, and the backends.

* :mod:`._protocols` — :class:`RunLog`, :class:`RunQueue`, :class:`EventLog`,
  :class:`ScheduleTable`, :class:`LockTable`, :class:`MemoryIndex`, :class:`DocumentStore`,
  and :class:`Store` (all seven);
* :mod:`._rows` — what a stored row means, shared by the SQL stores;
* :mod:`._wakeups` — wake-ups for whoever waits on runs (workers, ``runs.wait``);
* :mod:`._rules` — the semantics every backend shares (claims, query words, recall ranking);
* :mod:`._sqlite` (with its numbered migrations in :mod:`._migrations`) and :mod:`._memory`;
* :mod:`._url` — store URLs and the process's open stores.
"""

from .._types import Claim, RunRecord
from ._memory import MemoryStore
from ._postgres import PostgresStore
from ._protocols import (
    DocumentStore,
    EventLog,
    LockTable,
    MemoryIndex,
    RunLog,
    RunQueue,
    ScheduleTable,
    Store,
)
from ._sqlite import SCHEMA_VERSION, SqliteStore
from ._url import DEFAULT_STORE_URL, open_store, resolve_store

__all__ = [
    "DEFAULT_STORE_URL",
    "SCHEMA_VERSION",
    "Claim",
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
