"""Durable storage of runs: the :class:`Store` protocol and its implementations."""

from ._base import Claim, RunRecord, Store
from ._memory import MemoryStore
from ._sqlite import SCHEMA_VERSION, SqliteStore
from ._url import DEFAULT_STORE_URL, open_store, resolve_store

__all__ = [
    "DEFAULT_STORE_URL",
    "SCHEMA_VERSION",
    "Claim",
    "MemoryStore",
    "RunRecord",
    "SqliteStore",
    "Store",
    "open_store",
    "resolve_store",
]
