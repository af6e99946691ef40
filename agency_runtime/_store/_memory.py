"""An in-process store for tests and throwaway runs (``memory://`` or ``memory://NAME``).

A :class:`MemoryStore` is the SQLite store on a private in-memory database: the same core,
the same SQL, so what passes on ``memory://`` passes on a file. Nothing survives the process.
A new one is a copy of an empty, migrated database made once per process (SQLite's online
backup: a fraction of a millisecond, where running the migrations again would take several).
"""

from __future__ import annotations

import sqlite3
import threading
from typing import ClassVar

from .._clock import Clock
from ._migrations import migrate
from ._sqlite import PAGE_SIZE, SqliteStore

__all__ = ["MemoryStore"]


class MemoryStore(SqliteStore):
    """Runs kept in memory, for as long as the process lives.

    ``MemoryStore.named(name)`` returns one shared store per name and process, which is what
    the ``memory://NAME`` URL opens; ``MemoryStore()`` is a private, anonymous one.
    """

    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str | None = None, *, clock: Clock | None = None) -> None:
        self._name = name
        super().__init__(":memory:", clock=clock, url=self._url_for(name))

    def _url_for(self, name: str | None) -> str:
        return f"memory://<anonymous {id(self):#x}>" if name is None else f"memory://{name}"

    @classmethod
    def named(cls, name: str = "", *, clock: Clock | None = None) -> MemoryStore:
        """The process-wide store called ``name`` (created on first use, with ``clock``)."""
        with cls._named_lock:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = cls(name, clock=clock)
            return store

    def _configure(self, conn: sqlite3.Connection, synchronous: str, busy_timeout: float) -> None:
        """Fill the new in-memory database from the empty template (see the module)."""
        with _template_lock:
            if not _template:
                made = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
                made.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                migrate(made, ":memory:")
                _template.append(made)
            _template[0].backup(conn)

    def close(self) -> None:
        """Nothing to release: a memory store lives as long as the process."""

    def __repr__(self) -> str:
        return f"<MemoryStore {self.url}>"


_template: list[sqlite3.Connection] = []
"""The empty, migrated database every new memory store copies (made on first use)."""
_template_lock = threading.Lock()
