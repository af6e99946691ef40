"""Durable storage: four narrow protocols, their union :class:`Store`, and the backends.

* :mod:`._protocols` — :class:`RunLog`, :class:`LockTable`, :class:`MemoryIndex`,
  :class:`DocumentStore`, and :class:`Store` (all four);
* :mod:`._rules` — the semantics every backend shares (claims, query words, recall ranking);
* :mod:`._sqlite` (with its numbered migrations in :mod:`._migrations`) and :mod:`._memory`;
* :mod:`._url` — store URLs and the process's open stores.
"""

from .._types import Claim, RunRecord
from ._memory import MemoryStore
from ._protocols import DocumentStore, LockTable, MemoryIndex, RunLog, Store
from ._sqlite import SCHEMA_VERSION, SqliteStore
from ._url import DEFAULT_STORE_URL, open_store, resolve_store

__all__ = [
    "DEFAULT_STORE_URL",
    "SCHEMA_VERSION",
    "Claim",
    "DocumentStore",
    "LockTable",
    "MemoryIndex",
    "MemoryStore",
    "RunLog",
    "RunRecord",
    "SqliteStore",
    "Store",
    "open_store",
    "resolve_store",
]
