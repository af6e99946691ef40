"""Where a memory lives: its documents, their ``dir=`` files, and its keyword index.

In the run's store a memory is the documents ``agency-memory:<id>`` / ``graph`` and
``embeddings``, and one full-text record per live observation; with ``dir=`` it is the
plain files ``<dir>/<id>/graph.json`` and ``embeddings.json`` (and no keyword index).
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from pydantic import ConfigDict, Field, ValidationError

from .._core._frame import Frame
from .._errors import StoreError
from .._locks import lock as named_lock
from .._store import AgentMemoryStore, Store
from .._types import DeferredModel, MemoryRecord
from ._config import MemoryConfig
from ._graph import Entity, Graph, Observation
from ._state import MemoryState, _state

__all__ = ["EmbeddingEntry", "EmbeddingIndex"]

logger = logging.getLogger("agency_runtime.memory")


class EmbeddingEntry(DeferredModel):
    """The cached vector of one entity, with a digest of the text it was computed from."""

    model_config = ConfigDict()

    id: str
    digest: str
    vector: list[float]


class EmbeddingIndex(DeferredModel):
    """The ``embeddings`` document of a memory: one vector per entity, for one model."""

    model_config = ConfigDict()

    format_version: int = 1
    model: str | None = None
    entries: list[EmbeddingEntry] = Field(default_factory=list)


# -- where a memory lives -------------------------------------------------------------------------


def _read_file(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:  # the file system's refusal, said as the store's
        raise _file_error("read", path, exc) from exc


def _write_file(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        raise _file_error("write", path, exc) from exc


def _file_error(doing: str, path: Path, exc: OSError) -> StoreError:
    shown = str(path) if len(str(path)) <= 200 else str(path)[:100] + "…" + str(path)[-60:]
    return StoreError(
        f"cannot {doing} the memory file {shown}: {exc.strerror or exc}; check the memory "
        "dir (agency.memory.enable(dir=...)) and its permissions"
    )


@dataclass(slots=True)
class _Place:
    """The memory in use: its id, configuration, and where its documents are kept."""

    memory_id: str
    config: MemoryConfig
    state: MemoryState
    folder: Path | None = None
    store: AgentMemoryStore | None = None
    lock_store: Store | None = None
    namespace: str = field(init=False)

    def __post_init__(self) -> None:
        self.namespace = f"agency-memory:{self.memory_id}"

    def writing(self) -> AbstractAsyncContextManager[Any]:
        """Held while the graph is read, merged and written back.

        A store-backed lock (``agency.lock(..., scope="global")``) when a store is at hand,
        so concurrent runs and processes sharing the memory do not lose each other's
        updates; otherwise a lock private to the run.
        """
        if self.lock_store is None:
            return self.state.lock()
        where = self.namespace if self.folder is None else f"agency-memory-dir:{self.folder}"
        return named_lock(where, scope="global", store=self.lock_store)

    def describe(self, key: str) -> str:
        if self.folder is not None:
            return str(self.folder / f"{key}.json")
        return f"document {self.namespace}/{key}"

    async def _get(self, key: str) -> str | None:
        if self.folder is not None:
            return await anyio.to_thread.run_sync(_read_file, self.folder / f"{key}.json")
        assert self.store is not None
        return await self.store.get_document(self.namespace, key)

    async def _put(self, key: str, body: str) -> None:
        if self.folder is not None:
            await anyio.to_thread.run_sync(_write_file, self.folder / f"{key}.json", body)
            return
        assert self.store is not None
        await self.store.put_document(self.namespace, key, body)

    async def load_graph(self) -> Graph:
        body = await self._get("graph")
        if body is None:
            return Graph()
        try:
            return Graph.model_validate_json(body)
        except ValidationError as exc:
            raise StoreError(
                f"the memory graph {self.describe('graph')} is damaged and cannot be read: {exc}"
            ) from exc

    async def save_graph(self, graph: Graph) -> None:
        indent = 2 if self.folder is not None else None
        await self._put("graph", graph.model_dump_json(indent=indent))

    async def load_embeddings(self) -> EmbeddingIndex:
        body = await self._get("embeddings")
        if body is None:
            return EmbeddingIndex()
        try:
            return EmbeddingIndex.model_validate_json(body)
        except ValidationError:
            logger.warning(
                "%s is damaged; the embeddings are computed again", self.describe("embeddings")
            )
            return EmbeddingIndex()

    async def save_embeddings(self, index: EmbeddingIndex) -> None:
        await self._put("embeddings", index.model_dump_json())

    # The keyword index: one MemoryRecord per observation, in the run's store only.

    def record_id(self, observation_id: str) -> str:
        return f"{self.memory_id}/{observation_id}"

    async def index(self, added: list[tuple[Entity, Observation]], now: float) -> None:
        if self.store is None:
            return
        for entity, observation in added:
            await self.store.save_memory(
                MemoryRecord(
                    id=self.record_id(observation.id),
                    namespace=self.namespace,
                    content=f"{entity.name} {entity.type} {observation.content}",
                    tags=[entity.id],
                    created_at=now,
                )
            )

    async def unindex(self, expired: list[str], now: float) -> None:
        if self.store is None or not expired:
            return
        await self.store.expire_memory(
            self.namespace, [self.record_id(obs_id) for obs_id in expired], at=now
        )


def _place(frame: Frame) -> _Place | None:
    state = _state(frame.ctx)
    if not state.frames:
        return None
    top = state.frames[-1]
    run_store = frame.ctx.store
    if top.root is not None:
        folder = top.root / state.memory_id
        return _Place(state.memory_id, top.config, state, folder=folder, lock_store=run_store)
    store = run_store or state.fallback_store()
    return _Place(state.memory_id, top.config, state, store=store, lock_store=store)
