"""An in-process store for tests and throwaway runs (``memory://`` or ``memory://NAME``).

A :class:`MemoryStore` is the SQLite store on a private in-memory database: the same core,
the same SQL, so what passes on ``memory://`` passes on a file. Nothing survives the process.
"""

from __future__ import annotations

import threading
from typing import ClassVar

from .._clock import Clock
from ._sqlite import SqliteStore

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

    def close(self) -> None:
        """Nothing to release: a memory store lives as long as the process."""

    def __repr__(self) -> str:
        return f"<MemoryStore {self.url}>"
