"""An in-process store for tests and throwaway runs (``memory://`` or ``memory://NAME``)."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

from .._results import RunStatus
from ._base import Claim, RunRecord, claim_decision

__all__ = ["MemoryStore"]


class MemoryStore:
    """Runs kept in a dict. Nothing survives the process.

    ``MemoryStore.named(name)`` returns one shared store per name and process, which is what
    the ``memory://NAME`` URL opens; ``MemoryStore()`` is a private, anonymous one.
    """

    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str | None = None) -> None:
        self._name = name
        self._runs: dict[str, RunRecord] = {}
        self._lock = threading.Lock()

    @classmethod
    def named(cls, name: str = "") -> MemoryStore:
        """The process-wide store called ``name`` (created on first use)."""
        with cls._named_lock:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = cls(name)
            return store

    @property
    def url(self) -> str:
        """``memory://NAME`` for a named store, ``memory://`` plus an address otherwise."""
        if self._name is None:
            return f"memory://<anonymous {id(self):#x}>"
        return f"memory://{self._name}"

    async def claim_run(self, record: RunRecord, *, owner: str, lease_seconds: float) -> Claim:
        now = time.time()
        lease = {"lease_owner": owner, "lease_expires_at": now + lease_seconds}
        with self._lock:
            existing = self._runs.get(record.run_id)
            decision = claim_decision(existing, now)
            if decision == "refuse":
                assert existing is not None
                return Claim(acquired=False, created=False, record=existing.model_copy(deep=True))
            if decision == "insert":
                stored = record.model_copy(
                    update={
                        **lease,
                        "status": "running",
                        "attempts": 1,
                        "version": 1,
                        "started_at": now,
                        "updated_at": now,
                    },
                    deep=True,
                )
            else:
                assert existing is not None
                stored = existing.model_copy(
                    update={
                        **lease,
                        "status": "running",
                        "attempts": existing.attempts + 1,
                        "version": existing.version + 1,
                        "started_at": now,
                        "updated_at": now,
                    },
                    deep=True,
                )
            self._runs[record.run_id] = stored
            return Claim(
                acquired=True, created=decision == "insert", record=stored.model_copy(deep=True)
            )

    async def renew_lease(self, run_id: str, *, owner: str, lease_seconds: float) -> bool:
        with self._lock:
            stored = self._runs.get(run_id)
            if stored is None or stored.lease_owner != owner or stored.status != "running":
                return False
            stored.lease_expires_at = time.time() + lease_seconds
            return True

    async def finish_run(self, record: RunRecord, *, owner: str) -> bool:
        with self._lock:
            stored = self._runs.get(record.run_id)
            if stored is None or stored.lease_owner != owner or stored.status != "running":
                return False
            self._runs[record.run_id] = record.model_copy(
                update={
                    "lease_owner": None,
                    "lease_expires_at": None,
                    "version": stored.version + 1,
                    "updated_at": time.time(),
                },
                deep=True,
            )
            return True

    async def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            stored = self._runs.get(run_id)
            return None if stored is None else stored.model_copy(deep=True)

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord]:
        with self._lock:
            records = [r for r in self._runs.values() if status is None or r.status == status]
        records.sort(key=lambda r: r.created_at, reverse=True)
        return [r.model_copy(deep=True) for r in records[:limit]]

    def close(self) -> None:
        """Nothing to release: a memory store lives as long as the process."""

    def __repr__(self) -> str:
        return f"<MemoryStore {self.url} runs={len(self._runs)}>"
