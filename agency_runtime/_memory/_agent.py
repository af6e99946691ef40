"""``agency.memory``: long-term agent memory as a knowledge graph.

Facts are extracted by an LLM call into *entities* (a name and a type), their *observations*
(one short fact each) and *relations* between entities. Forgetting is soft: an observation
or relation gets a ``valid_to`` time and is never shown again, but stays in the graph.

Memory is switched on per run with :meth:`MemoryNamespace.enable` (a stack of enabled
frames; the top one applies) and partitioned by a memory id (:meth:`MemoryNamespace.set_id`,
default ``"default"``). The graph lives in the run's store (documents
``agency-memory:<id>`` / ``graph`` and ``embeddings``), or with ``dir=`` in plain files
``<dir>/<id>/graph.json`` and ``embeddings.json``.

``recall(query)`` finds entities by keyword (the store's full-text index: FTS5 ranked by
bm25 in SQLite; names matched as whole words, types exactly), then optionally by embedding
similarity, falls back to the whole graph when it is small, lets an LLM filter the
candidates (failing open) and renders the top ten as ``"Name (type):"`` followed by
``"  - fact"`` lines.

Every model call goes through ``agency.llm`` on a hidden thread of its own, so it is billed
to the run and its guards and never adds messages to the conversation. Each ``remember``,
``recall`` and ``forget`` is journaled as one unit (at ``memory#N``, its model calls under
it): a resumed run gets the recorded outcome back without reading the graph or calling the
model again. Graph updates hold a store-backed lock, so concurrent runs sharing a memory
do not lose each other's facts.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .._core._branches import qualify
from .._core._context import RuntimeContext, Slot
from .._core._frame import (
    Frame,
    Position,
    current_frame,
    current_frame_maybe,
    position_of,
    use_frame,
)
from .._durable._effect import journaled
from .._durable._journal import journal_of
from .._errors import (
    AgencyError,
    InvalidArgumentError,
    LLMCallError,
    StoreError,
    StructuredOutputError,
)
from .._guards import charge
from .._llm._chat import DEFAULT_TIMEOUT, _spend, llm
from .._llm._litellm import load_litellm
from .._locks import lock as named_lock
from .._store import MemoryStore, Store
from .._store._base import query_terms
from .._types import MemoryRecord

__all__ = [
    "DEFAULT_MEMORY_ID",
    "EmbeddingEntry",
    "EmbeddingIndex",
    "Entity",
    "Expiration",
    "ExtractedEntity",
    "ExtractedRelation",
    "Extraction",
    "ForgetPlan",
    "Graph",
    "MemoryConfig",
    "MemoryFrame",
    "MemoryNamespace",
    "MemoryState",
    "Observation",
    "RecallFilter",
    "Relation",
    "embed",
]

logger = logging.getLogger("agency_runtime.memory")

T = TypeVar("T", bound=BaseModel)

DEFAULT_MEMORY_ID = "default"
"""The memory id in use until :meth:`MemoryNamespace.set_id` picks another."""

RECALL_K = 10
"""How many entities ``recall`` renders at most (also the embedding tier's ``k``)."""

EMBEDDING_THRESHOLD = 0.3
"""The least cosine similarity for an entity to count as an embedding match."""

FALLBACK_LIMIT = 50
"""When nothing matches, a graph of at most this many entities is offered whole."""

FILTER_LIMIT = 50
"""At most this many candidates are shown to the LLM filter (and to ``forget``'s planner)."""

CONTEXT_LIMIT = 50
"""At most this many known entities are shown to the extraction call of ``remember``."""

KEYWORD_FETCH = 200
"""How many full-text hits ``recall`` asks the store for."""

EMBED_BATCH = 128
"""Texts per embedding request."""

MIN_NAME_WORD = 3
"""Query words shorter than this never match entity names."""

RRF_K = 60
"""The constant of reciprocal-rank fusion, which merges the keyword and embedding rankings."""

THREAD_LABEL = "agency.memory"
"""The label of the hidden threads memory's model calls run on."""

_MEMORY_ID = re.compile(r"[A-Za-z0-9._-]+")

STOP_WORDS: frozenset[str] = frozenset(
    {
        "a", "about", "all", "an", "and", "any", "anything", "are", "as", "at", "be", "been",
        "but", "by", "can", "could", "did", "do", "does", "for", "forget", "from", "had",
        "has", "have", "he", "her", "here", "him", "his", "how", "i", "if", "in", "into",
        "is", "it", "its", "know", "me", "my", "no", "not", "of", "on", "or", "our",
        "please", "recall", "remember", "she", "so", "something", "tell", "than", "that",
        "the", "their", "them", "then", "there", "these", "they", "this", "those", "to",
        "too", "us", "was", "we", "were", "what", "when", "where", "which", "who", "whom",
        "why", "will", "with", "would", "you", "your",
    }
)  # fmt: skip
"""Query words that never select entities (a small English list plus memory filler)."""


# -- configuration --------------------------------------------------------------------------------


class MemoryConfig(BaseModel):
    """How ``agency.memory.enable`` stores and searches memory.

    * ``dir``: keep the graph in plain files ``<dir>/<memory id>/graph.json`` (and
      ``embeddings.json``) instead of the run's store. ``~`` is expanded, the path is
      resolved against the working directory and created; its real path identifies the
      memory frame.
    * ``model``: the model for memory's own LLM calls (default: the run's model).
    * ``embeddings_model``: when set, ``recall`` also ranks entities by the cosine
      similarity of ``litellm.aembedding`` vectors (cached per entity).
    * ``llm_filter``: let an LLM call pick the relevant candidates in ``recall``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dir: str | None = None
    model: str | None = None
    embeddings_model: str | None = None
    llm_filter: bool = True

    @field_validator("dir", mode="before")
    @classmethod
    def _path_to_str(cls, value: object) -> object:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        return value

    @field_validator("dir", "model", "embeddings_model")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a non-empty string when given")
        return value


# -- the graph ------------------------------------------------------------------------------------


class Observation(BaseModel):
    """One fact about an entity; live while ``valid_to`` is ``None``."""

    model_config = ConfigDict()

    id: str
    content: str
    valid_from: str
    valid_to: str | None = None

    @property
    def live(self) -> bool:
        """Whether the observation has not been expired."""
        return self.valid_to is None


class Entity(BaseModel):
    """Something memory knows about: a name, a type and observations."""

    model_config = ConfigDict()

    id: str
    name: str
    type: str
    source: str
    created_at: str
    observations: list[Observation] = Field(default_factory=list)

    def live_observations(self) -> list[Observation]:
        """The observations that have not been expired, oldest first."""
        return [o for o in self.observations if o.valid_to is None]


class Relation(BaseModel):
    """A typed, directed link between two entities; live while ``valid_to`` is ``None``."""

    model_config = ConfigDict()

    id: str
    from_id: str
    to_id: str
    type: str
    source: str
    valid_from: str
    valid_to: str | None = None


class Graph(BaseModel):
    """A memory's entities and relations. Ids ``entity-N``, ``obs-N`` and ``rel-N`` come
    from one counter, ``next_id``. Times are ISO 8601 strings in UTC."""

    model_config = ConfigDict()

    entities: list[Entity] = Field(default_factory=list)
    relations: list[Relation] = Field(default_factory=list)
    next_id: int = 1

    def new_id(self, prefix: str) -> str:
        """Draw the next id from the graph's counter: ``f"{prefix}-{n}"``."""
        value = f"{prefix}-{self.next_id}"
        self.next_id += 1
        return value

    def entity(self, entity_id: str) -> Entity | None:
        """The entity with this id, or ``None``."""
        return next((e for e in self.entities if e.id == entity_id), None)

    def named(self, name: str) -> list[Entity]:
        """Every entity with this name (case-insensitive)."""
        key = _fold(name)
        return [e for e in self.entities if _fold(e.name) == key]

    def live_relations(self) -> list[Relation]:
        """Relations not expired whose two ends exist."""
        ids = {e.id for e in self.entities}
        return [
            r for r in self.relations if r.valid_to is None and r.from_id in ids and r.to_id in ids
        ]


class EmbeddingEntry(BaseModel):
    """The cached vector of one entity, with a digest of the text it was computed from."""

    model_config = ConfigDict()

    id: str
    digest: str
    vector: list[float]


class EmbeddingIndex(BaseModel):
    """The ``embeddings`` document of a memory: one vector per entity, for one model."""

    model_config = ConfigDict()

    format_version: int = 1
    model: str | None = None
    entries: list[EmbeddingEntry] = Field(default_factory=list)


# -- what the model is asked for ------------------------------------------------------------------


class ExtractedEntity(BaseModel):
    """An entity named in the remembered content, with new facts about it."""

    name: str
    type: str
    observations: list[str] = Field(default_factory=list)


class ExtractedRelation(BaseModel):
    """A relation between two entities, by name."""

    from_name: str
    to_name: str
    type: str


class Expiration(BaseModel):
    """A remembered fact that no longer holds: the entity's name and the fact's text."""

    entity: str
    observation: str


class Extraction(BaseModel):
    """What ``remember`` asks the model to extract from the content."""

    entities: list[ExtractedEntity] = Field(default_factory=list)
    relations: list[ExtractedRelation] = Field(default_factory=list)
    expirations: list[Expiration] = Field(default_factory=list)


class RecallFilter(BaseModel):
    """The answer of ``recall``'s LLM filter: the ids of the relevant entities."""

    ids: list[str] = Field(default_factory=list)


class ForgetPlan(BaseModel):
    """What ``forget`` asks the model for: the facts (and relations) to expire."""

    expirations: list[Expiration] = Field(default_factory=list)
    relations: list[ExtractedRelation] = Field(default_factory=list)


# -- per-run state --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryFrame:
    """One ``enable`` call: its configuration and identity (the real path of ``dir``)."""

    config: MemoryConfig
    identity: str
    root: Path | None


_STORE_IDENTITY = "<run store>"


class MemoryState:
    """The ``agency.memory`` state of one run, kept on ``RuntimeContext.memory``."""

    __slots__ = ("_lock", "_store", "execution", "frames", "memory_id")

    def __init__(self) -> None:
        self.frames: list[MemoryFrame] = []
        self.memory_id = DEFAULT_MEMORY_ID
        self.execution: int | None = None
        self._store: MemoryStore | None = None
        self._lock: anyio.Lock | None = None

    @property
    def enabled(self) -> bool:
        """Whether a memory frame is active."""
        return bool(self.frames)

    def fallback_store(self) -> MemoryStore:
        """The in-process store used when the frame belongs to no run (unit tests)."""
        if self._store is None:
            self._store = MemoryStore()
        return self._store

    def lock(self) -> anyio.Lock:
        """Serializes this run's graph updates when no store can hold a shared lock."""
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock


MEMORY_STATE: Slot[MemoryState] = Slot("memory")
"""The run's ``agency.memory`` state (made on its first use)."""


def _state(ctx: RuntimeContext) -> MemoryState:
    state = ctx.ensure(MEMORY_STATE, MemoryState)
    # A restore runs the entry again from its start in the same context: the entry enables
    # memory again, so the frames start over.
    execution = journal_of(ctx).execution
    if state.execution != execution:
        if state.execution is not None:
            state.frames.clear()
            state.memory_id = DEFAULT_MEMORY_ID
        state.execution = execution
    return state


def _check_memory_id(memory_id: object) -> str:
    if (
        not isinstance(memory_id, str)
        or not _MEMORY_ID.fullmatch(memory_id)
        or memory_id in (".", "..")
    ):
        raise InvalidArgumentError(
            "agency.memory.set_id: a memory id is letters, digits, '.', '_' and '-' "
            f"(^[A-Za-z0-9._-]+$, not '.' or '..'), got {memory_id!r}"
        )
    return memory_id


def _check_text(value: object, member: str, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(
            f"agency.memory.{member}: {what} must be a string, got {type(value).__name__}"
        )
    return value


def _config_of(config: MemoryConfig | dict[str, Any] | None) -> MemoryConfig:
    if config is None:
        return MemoryConfig()
    if isinstance(config, MemoryConfig):
        return config
    if isinstance(config, dict):
        try:
            return MemoryConfig.model_validate(config)
        except ValidationError as exc:
            raise InvalidArgumentError(f"agency.memory.enable: invalid config: {exc}") from exc
    raise InvalidArgumentError(
        f"agency.memory.enable takes a MemoryConfig, a dict or None, got {type(config).__name__}"
    )


def _frame_for(config: MemoryConfig) -> MemoryFrame:
    if config.dir is None:
        return MemoryFrame(config, _STORE_IDENTITY, None)
    path = Path(config.dir).expanduser()
    try:
        path = path.resolve()
        path.mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(path))
    except OSError as exc:
        raise InvalidArgumentError(
            f"agency.memory.enable: cannot create the memory dir {config.dir!r}: {exc}"
        ) from exc
    return MemoryFrame(config, str(real), real)


# -- where a memory lives -------------------------------------------------------------------------


def _read_file(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


@dataclass(slots=True)
class _Place:
    """The memory in use: its id, configuration, and where its documents are kept."""

    memory_id: str
    config: MemoryConfig
    state: MemoryState
    folder: Path | None = None
    store: Store | None = None
    run_store: Store | None = None
    namespace: str = field(init=False)

    def __post_init__(self) -> None:
        self.namespace = f"agency-memory:{self.memory_id}"

    def writing(self) -> AbstractAsyncContextManager[Any]:
        """Held while the graph is read, merged and written back.

        A store-backed lock (``agency.lock(..., scope="global")``) when a store is at hand,
        so concurrent runs and processes sharing the memory do not lose each other's
        updates; otherwise a lock private to the run.
        """
        store = self.store or self.run_store
        if store is None:
            return self.state.lock()
        where = self.namespace if self.folder is None else f"agency-memory-dir:{self.folder}"
        return named_lock(where, scope="global", store=store)

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
    run_store = journal_of(frame.ctx).store
    if top.root is not None:
        folder = top.root / state.memory_id
        return _Place(state.memory_id, top.config, state, folder=folder, run_store=run_store)
    store = run_store or state.fallback_store()
    return _Place(state.memory_id, top.config, state, store=store, run_store=run_store)


# -- small helpers --------------------------------------------------------------------------------


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


def _iso(epoch: float) -> str:
    return (
        datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


def _relation_lines(graph: Graph, entity: Entity) -> list[str]:
    names = {e.id: e.name for e in graph.entities}
    lines: list[str] = []
    relations = graph.live_relations()
    for relation in relations:
        if relation.from_id == entity.id:
            lines.append(f"{relation.type} → {names[relation.to_id]}")
    for relation in relations:
        if relation.to_id == entity.id and relation.from_id != entity.id:
            lines.append(f"{names[relation.from_id]} {relation.type} → {entity.name}")
    return lines


def _facts(graph: Graph, entity: Entity) -> list[str]:
    """What is shown about an entity: its live observations, then its live relations."""
    return [o.content for o in entity.live_observations()] + _relation_lines(graph, entity)


def _block(graph: Graph, entity: Entity) -> str:
    lines = [f"{entity.name} ({entity.type}):"]
    lines.extend(f"  - {fact}" for fact in _facts(graph, entity))
    return "\n".join(lines)


def _render(graph: Graph, ids: Sequence[str]) -> str:
    blocks: list[str] = []
    for entity_id in ids:
        entity = graph.entity(entity_id)
        if entity is None or not _facts(graph, entity):
            continue
        blocks.append(_block(graph, entity))
        if len(blocks) == RECALL_K:
            break
    return "\n\n".join(blocks)


def _entity_text(entity: Entity) -> str:
    facts = "; ".join(o.content for o in entity.live_observations())
    return f"{entity.name} ({entity.type}): {facts}" if facts else f"{entity.name} ({entity.type})"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b) or not a:
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def _fuse(*rankings: list[str]) -> list[str]:
    """Merge rankings by reciprocal-rank fusion; ties keep the earlier ranking's order."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking):
            scores[key] = scores.get(key, 0.0) + 1.0 / (RRF_K + rank + 1)
    order = {key: i for i, key in enumerate(k for ranking in rankings for k in ranking)}
    return sorted(scores, key=lambda key: (-scores[key], order[key]))


def _fails_open(exc: Exception) -> bool:
    """Whether a failed optional step (filter, embeddings) is skipped rather than raised.

    Provider and output failures are; guard trips, cancellation and every other runtime
    error (store, journal, arguments) propagate.
    """
    return isinstance(exc, LLMCallError | StructuredOutputError) or not isinstance(exc, AgencyError)


# -- embeddings -----------------------------------------------------------------------------------


async def embed(texts: list[str], model: str) -> list[list[float]]:
    """Embed ``texts`` with ``litellm.aembedding`` (one vector per text, in order).

    The call's cost and tokens are billed to the current run and its guards (a cost guard
    now over its budget raises :class:`GuardExceededError`). Provider failures raise
    :class:`LLMCallError`. Tests replace this function to fake embeddings.
    """
    litellm = await load_litellm()
    try:
        response = await litellm.aembedding(model=model, input=texts, timeout=DEFAULT_TIMEOUT)
    except (AgencyError, anyio.get_cancelled_exc_class()):
        raise
    except Exception as exc:
        raise LLMCallError(
            f"the embedding call to {model!r} failed: {type(exc).__name__}: {exc}",
            model=model,
            attempts=1,
        ) from exc
    items = list(getattr(response, "data", None) or [])

    def position(item: Any) -> int:
        index = item.get("index") if isinstance(item, dict) else getattr(item, "index", 0)
        return int(index or 0)

    vectors: list[list[float]] = []
    for item in sorted(items, key=position):
        vector: Any = item.get("embedding") if isinstance(item, dict) else item.embedding
        vectors.append([float(x) for x in vector or []])
    frame = current_frame_maybe()
    if frame is not None:
        pico, tokens = await _spend(response, model)
        charge(frame, pico=pico, tokens=tokens)
    return vectors


# -- merging --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Outcome:
    added: list[tuple[Entity, Observation]] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    changed: bool = False


def _expire_facts(
    graph: Graph,
    name: str,
    text: str,
    when: str,
    keep: dict[str, set[str]] | None = None,
) -> list[str]:
    """Soft-expire the live observations of the entities named ``name`` matching ``text``.

    An exact (case-insensitive) match wins; otherwise every observation containing ``text``
    expires. Facts listed in ``keep`` (per entity id) are never expired.
    """
    needle = _fold(text)
    if not needle:
        return []
    expired: list[str] = []
    for entity in graph.named(name):
        kept = keep.get(entity.id, set()) if keep else set()
        live = [o for o in entity.live_observations() if _fold(o.content) not in kept]
        exact = [o for o in live if _fold(o.content) == needle]
        for observation in exact or [o for o in live if needle in _fold(o.content)]:
            observation.valid_to = when
            expired.append(observation.id)
    return expired


def _expire_relations(graph: Graph, wanted: list[ExtractedRelation], when: str) -> bool:
    changed = False
    for item in wanted:
        sources = {e.id for e in graph.named(item.from_name)}
        targets = {e.id for e in graph.named(item.to_name)}
        kind = _fold(item.type)
        for relation in graph.relations:
            if (
                relation.valid_to is None
                and relation.from_id in sources
                and relation.to_id in targets
                and kind in _fold(relation.type)
            ):
                relation.valid_to = when
                changed = True
    return changed


def _apply_extraction(graph: Graph, extraction: Extraction, source: str, now: float) -> _Outcome:
    """Merge an extraction into ``graph`` (idempotent: applying it twice changes nothing)."""
    when = _iso(now)
    outcome = _Outcome()
    # What this extraction asserts is never expired by it, so a replay stays a no-op.
    asserted: dict[str, set[str]] = {}
    for item in extraction.entities:
        for match in graph.named(item.name):
            if _fold(match.type) == _fold(item.type):
                asserted.setdefault(match.id, set()).update(_fold(o) for o in item.observations)
    for expiration in extraction.expirations:
        outcome.expired += _expire_facts(
            graph, expiration.entity, expiration.observation, when, asserted
        )
    touched: dict[str, Entity] = {}
    for item in extraction.entities:
        name, kind = " ".join(item.name.split()), " ".join(item.type.split()) or "thing"
        if not name:
            continue
        entity = next((e for e in graph.named(name) if _fold(e.type) == _fold(kind)), None)
        if entity is None:
            entity = Entity(
                id=graph.new_id("entity"), name=name, type=kind, source=source, created_at=when
            )
            graph.entities.append(entity)
            outcome.changed = True
        touched[_fold(name)] = entity
        live = {_fold(o.content) for o in entity.live_observations()}
        for text in item.observations:
            content = " ".join(text.split())
            if not content or _fold(content) in live:
                continue
            observation = Observation(id=graph.new_id("obs"), content=content, valid_from=when)
            entity.observations.append(observation)
            live.add(_fold(content))
            outcome.added.append((entity, observation))
    for link in extraction.relations:
        start = touched.get(_fold(link.from_name)) or next(iter(graph.named(link.from_name)), None)
        end = touched.get(_fold(link.to_name)) or next(iter(graph.named(link.to_name)), None)
        kind = " ".join(link.type.split())
        if start is None or end is None or not kind:
            continue
        if any(
            r.valid_to is None
            and r.from_id == start.id
            and r.to_id == end.id
            and _fold(r.type) == _fold(kind)
            for r in graph.relations
        ):
            continue
        graph.relations.append(
            Relation(
                id=graph.new_id("rel"),
                from_id=start.id,
                to_id=end.id,
                type=kind,
                source=source,
                valid_from=when,
            )
        )
        outcome.changed = True
    outcome.changed = outcome.changed or bool(outcome.added or outcome.expired)
    return outcome


# -- prompts --------------------------------------------------------------------------------------


def _summary_line(graph: Graph, entity: Entity) -> str:
    facts = "; ".join(_facts(graph, entity))
    return f"- {entity.name} ({entity.type})" + (f": {facts}" if facts else "")


def _extraction_prompt(graph: Graph, known: list[Entity], content: str) -> str:
    listing = "\n".join(_summary_line(graph, e) for e in known) or "(none yet)"
    return (
        "You maintain a long-term memory: a knowledge graph of entities, facts about them "
        "(observations) and relations between them. Extract what is worth remembering from "
        "the new information below.\n\n"
        "Rules:\n"
        "- When the information is about a known entity, reuse its exact name and type.\n"
        "- A type is a short lowercase label such as person, place, organization, project, "
        "preference, event.\n"
        "- Each observation is one short, self-contained fact in plain words. Skip "
        "small talk and anything not worth remembering.\n"
        "- A relation links two entity names with a short snake_case type "
        "(works_at, lives_in, owns).\n"
        "- When the new information contradicts or replaces a known fact, list that fact "
        "under expirations, with the entity's name and the fact's text exactly as shown.\n"
        "- Return empty lists when there is nothing to remember.\n\n"
        f"Known entities:\n{listing}\n\n"
        f"New information:\n{content}"
    )


def _filter_prompt(graph: Graph, candidates: list[Entity], query: str) -> str:
    listing = "\n".join(
        f"{e.id}: {e.name} ({e.type}) — {'; '.join(_facts(graph, e)) or 'no facts'}"
        for e in candidates
    )
    return (
        "Select the remembered entities that are relevant to the query. Answer with their "
        "ids, exactly as listed, most relevant first; answer with an empty list when none "
        "is relevant.\n\n"
        f"Query: {query}\n\n"
        f"Candidates:\n{listing}"
    )


def _forget_prompt(graph: Graph, candidates: list[Entity], request: str) -> str:
    listing = "\n\n".join(_block(graph, e) for e in candidates)
    return (
        "The user asks the memory to forget something. From the remembered facts below, "
        "choose the observations (and relations, shown with →) that the request refers to; "
        "leave everything else alone. Give each observation's entity name and its text "
        "exactly as shown; give relations as from_name, to_name and type. Answer with empty "
        "lists when nothing matches.\n\n"
        f"Request: {request}\n\n"
        f"Remembered facts:\n{listing}"
    )


# -- candidates -----------------------------------------------------------------------------------


def _visible(graph: Graph, entity: Entity) -> bool:
    return bool(_facts(graph, entity))


async def _keyword_ranking(place: _Place, graph: Graph, text: str) -> list[str]:
    """Entity ids matching ``text`` by keyword, best first.

    Observations are searched in the store's full-text index (or scanned, for a ``dir``
    memory); names match whole query words of at least three letters that are not stop
    words, types match a query word exactly. Scores: 3 per name word, 2 for the type, 1 per
    query word found in the entity's live text.
    """
    words = query_terms(text)
    terms = [w for w in words if w not in STOP_WORDS]
    wanted = set(terms)
    hits: set[str] | None = None
    if place.store is not None:
        hits = set()
        if terms:
            records = await place.store.recall_memory(
                namespace=place.namespace,
                query=" ".join(terms),
                tags=[],
                scope=None,
                limit=KEYWORD_FETCH,
                now=time.time(),
            )
            for record in records:
                # With no full-text match the store answers its newest items: skip those.
                if record.tags and wanted.intersection(query_terms(record.content)):
                    hits.add(record.tags[0])
    spoken, phrase = set(words), " ".join(words)
    scored: list[tuple[int, int, str]] = []
    for position, entity in enumerate(graph.entities):
        if not _visible(graph, entity):
            continue
        name_words = set(query_terms(entity.name))
        score = 3 * sum(1 for t in terms if len(t) >= MIN_NAME_WORD and t in name_words)
        kind = _fold(entity.type)
        if kind in spoken or (phrase and kind == phrase):
            score += 2
        if hits is None or entity.id in hits:
            live_text = " ".join(
                [entity.name, entity.type, *(o.content for o in entity.live_observations())]
            )
            score += len(wanted.intersection(query_terms(live_text)))
        if score:
            scored.append((-score, position, entity.id))
    return [entity_id for _, _, entity_id in sorted(scored)]


async def _embedding_ranking(place: _Place, graph: Graph, query: str) -> list[str]:
    """Up to ``RECALL_K`` entity ids whose vectors are within the threshold, best first."""
    model = place.config.embeddings_model
    assert model is not None
    index = await place.load_embeddings()
    if index.model != model:
        index = EmbeddingIndex(model=model)
    cached = {entry.id: entry for entry in index.entries}
    texts = {e.id: _entity_text(e) for e in graph.entities if _visible(graph, e)}
    if not texts:
        return []
    stale = [key for key, text in texts.items() if key not in cached or
             cached[key].digest != _digest(text)]  # fmt: skip
    inputs = [query, *(texts[key] for key in stale)]
    vectors: list[list[float]] = []
    for start in range(0, len(inputs), EMBED_BATCH):
        batch = inputs[start : start + EMBED_BATCH]
        got = await embed(batch, model)
        if len(got) != len(batch):
            raise LLMCallError(
                f"the embedding model {model!r} returned {len(got)} vectors for {len(batch)} texts",
                model=model,
                attempts=1,
            )
        vectors.extend(got)
    for key, vector in zip(stale, vectors[1:], strict=True):
        cached[key] = EmbeddingEntry(id=key, digest=_digest(texts[key]), vector=vector)
    if stale or set(cached) - set(texts):
        entries = [cached[key] for key in texts]
        await place.save_embeddings(EmbeddingIndex(model=model, entries=entries))
    order = {key: i for i, key in enumerate(texts)}
    similar = [
        (score, key)
        for key in texts
        if (score := _cosine(vectors[0], cached[key].vector)) >= EMBEDDING_THRESHOLD
    ]
    similar.sort(key=lambda pair: (-pair[0], order[pair[1]]))
    return [key for _, key in similar[:RECALL_K]]


async def _candidates(place: _Place, graph: Graph, query: str) -> list[Entity]:
    """Recall's candidates, best first: keyword, then embeddings, else a small whole graph."""
    ranked = await _keyword_ranking(place, graph, query)
    similar: list[str] = []
    if place.config.embeddings_model:
        try:
            similar = await _embedding_ranking(place, graph, query)
        except Exception as exc:
            if not _fails_open(exc):
                raise
            logger.warning("agency.memory: the embedding search failed and was skipped: %s", exc)
    ids = _fuse(ranked, similar)
    if not ids and len(graph.entities) <= FALLBACK_LIMIT:
        ids = [e.id for e in graph.entities if _visible(graph, e)]
    found = [graph.entity(key) for key in ids]
    return [e for e in found if e is not None]


def _context_entities(graph: Graph, text: str) -> list[Entity]:
    """The known entities shown to the extraction call: all of a small graph, else the
    ones the content mentions."""
    visible = [e for e in graph.entities if _visible(graph, e)]
    if len(visible) <= CONTEXT_LIMIT:
        return visible
    words = set(query_terms(text)) - STOP_WORDS
    mentioned = [
        e
        for e in visible
        if words.intersection(w for w in query_terms(e.name) if len(w) >= MIN_NAME_WORD)
    ]
    return mentioned[:CONTEXT_LIMIT]


# -- the namespace --------------------------------------------------------------------------------


async def _ask(frame: Frame, place: _Place, prompt: str, schema: type[T]) -> T:
    """One model call on a fresh hidden thread (billed, journaled, guarded)."""
    threads = frame.threads
    thread = threads.get(threads.create(label=THREAD_LABEL, hidden=True))
    answer = await llm(prompt, model=place.config.model, schema=schema, thread=thread)
    if not isinstance(answer, schema):
        raise StructuredOutputError(
            f"the memory call expected {schema.__name__}, got {type(answer).__name__}",
            raw=str(answer),
            errors=[],
        )
    return answer


class MemoryNamespace:
    """``agency.memory``: remember facts, recall them, forget them.

    ``enable`` / ``disable`` / ``set_id`` / ``enabled`` are synchronous and change or read
    the current run's memory state; ``remember`` / ``recall`` / ``forget`` are
    asynchronous. All of them raise :class:`OutsideFrameError` outside an execution frame.
    While memory is off, ``remember`` and ``forget`` do nothing and ``recall`` returns ``""``.
    """

    def enable(self, config: MemoryConfig | dict[str, Any] | None = None) -> None:
        """Turn memory on with ``config`` (pushed as a frame; the top frame applies).

        Enabling the memory already on top of the stack (the same ``dir`` real path, or the
        run's store again) does nothing.
        """
        frame = current_frame("memory.enable()")
        memory_frame = _frame_for(_config_of(config))
        state = _state(frame.ctx)
        if state.frames and state.frames[-1].identity == memory_frame.identity:
            return
        state.frames.append(memory_frame)

    def disable(self) -> None:
        """Pop the top memory frame (nothing happens when memory is off)."""
        state = _state(current_frame("memory.disable()").ctx)
        if state.frames:
            state.frames.pop()

    def enabled(self) -> bool:
        """Whether memory is on (some frame is enabled)."""
        return _state(current_frame("memory.enabled()").ctx).enabled

    def set_id(self, memory_id: str) -> None:
        """Use the memory ``memory_id`` (``^[A-Za-z0-9._-]+$``) from now on.

        Ignored while memory is off (as in agency-lang); a malformed id always raises
        :class:`InvalidArgumentError`.
        """
        frame = current_frame("memory.set_id()")
        checked = _check_memory_id(memory_id)
        state = _state(frame.ctx)
        if state.frames:
            state.memory_id = checked

    async def remember(self, content: str) -> None:
        """Extract facts from ``content`` with one model call and merge them into memory.

        Entities with the same name and type are reused, duplicate facts skipped, and facts
        the content contradicts soft-expired. An answer that does not match the extraction
        schema is logged and changes nothing.
        """
        frame = current_frame("memory.remember()")
        _check_text(content, "remember()", "content")
        place = _place(frame)
        if place is None or not content.strip():
            return
        await _journaled(frame, "remember", lambda inner: _remember(inner, place, content))

    async def recall(self, query: str) -> str:
        """What memory knows about ``query``, rendered for a prompt (``""`` when nothing).

        Up to ten entities, each as ``"Name (type):"`` followed by ``"  - fact"`` lines
        (live observations, then live relations), separated by blank lines.
        """
        frame = current_frame("memory.recall()")
        _check_text(query, "recall()", "query")
        place = _place(frame)
        if place is None or not query.strip():
            return ""
        found = await _journaled(frame, "recall", lambda inner: _recall(inner, place, query))
        return str(found or "")

    async def forget(self, query: str) -> None:
        """Soft-expire what ``query`` asks to forget, as planned by one model call.

        The model sees the candidate entities' live facts and names the ones to expire;
        they are matched by text (exact, else substring) and stop being recalled.
        """
        frame = current_frame("memory.forget()")
        _check_text(query, "forget()", "query")
        place = _place(frame)
        if place is None or not query.strip():
            return
        await _journaled(frame, "forget", lambda inner: _forget(inner, place, query))


# -- the operations -------------------------------------------------------------------------------


async def _journaled(
    frame: Frame, kind: str, operation: Callable[[Frame], Awaitable[str | None]]
) -> str | None:
    """Run one memory operation once per run, like a journaled step.

    The operation runs at its own address (``memory#N`` under the caller's), so the model
    calls inside it are numbered apart from the caller's. When it completes, its result and
    what it did to the threads and guards are journaled; a resumed run replays them instead
    of running it again, so it neither reads a graph that later calls changed nor pays
    twice.
    """
    journal = journal_of(frame.ctx)
    position = position_of(frame)
    branch, ordinal = journal.count(position.address, "memory")
    segment = qualify(branch, f"memory#{ordinal}")
    path = f"{position.address}/{segment}" if position.address else segment
    inner = frame.evolve(position=Position(position.scope, path))

    async def run() -> str | None:
        with use_frame(inner):
            return await operation(inner)

    return await journaled(
        frame,
        path,
        f"agency.memory.{kind}",
        run,
        encode=lambda result: result,
        decode=lambda recorded: None if recorded is None else str(recorded),
    )


async def _remember(frame: Frame, place: _Place, content: str) -> None:
    graph = await place.load_graph()
    prompt = _extraction_prompt(graph, _context_entities(graph, content), content)
    try:
        extraction = await _ask(frame, place, prompt, Extraction)
    except StructuredOutputError as exc:
        logger.warning("agency.memory.remember: unusable extraction, nothing saved: %s", exc)
        return
    async with place.writing():
        graph = await place.load_graph()  # fresh: the model call may have taken a while
        now = time.time()
        outcome = _apply_extraction(graph, extraction, frame.ctx.run_id or "local", now)
        if not outcome.changed:
            return
        await place.save_graph(graph)
        await place.index(outcome.added, now)
        await place.unindex(outcome.expired, now)


async def _recall(frame: Frame, place: _Place, query: str) -> str:
    graph = await place.load_graph()
    if not graph.entities:
        return ""
    candidates = await _candidates(place, graph, query)
    if not candidates:
        return ""
    ids = [e.id for e in candidates]
    if place.config.llm_filter:
        ids = await _filter(frame, place, graph, candidates[:FILTER_LIMIT], query)
    return _render(graph, ids)


async def _filter(
    frame: Frame, place: _Place, graph: Graph, candidates: list[Entity], query: str
) -> list[str]:
    """The candidates the model calls relevant, in its order (all of them if it fails)."""
    offered = [e.id for e in candidates]
    try:
        answer = await _ask(frame, place, _filter_prompt(graph, candidates, query), RecallFilter)
    except Exception as exc:
        if not _fails_open(exc):
            raise
        logger.warning("agency.memory.recall: the LLM filter failed, kept candidates: %s", exc)
        return offered
    by_name = {_fold(e.name): e.id for e in reversed(candidates)}
    chosen: list[str] = []
    for item in answer.ids:
        key = item.strip() if item.strip() in offered else by_name.get(_fold(item))
        if key is not None and key not in chosen:
            chosen.append(key)
    return chosen


async def _forget(frame: Frame, place: _Place, query: str) -> None:
    graph = await place.load_graph()
    if not graph.entities:
        return
    candidates = (await _candidates(place, graph, query))[:FILTER_LIMIT]
    if not candidates:
        return
    try:
        plan = await _ask(frame, place, _forget_prompt(graph, candidates, query), ForgetPlan)
    except StructuredOutputError as exc:
        logger.warning("agency.memory.forget: unusable plan, nothing forgotten: %s", exc)
        return
    async with place.writing():
        graph = await place.load_graph()
        now = time.time()
        when = _iso(now)
        expired: list[str] = []
        for item in plan.expirations:
            expired += _expire_facts(graph, item.entity, item.observation, when)
        dropped = _expire_relations(graph, plan.relations, when)
        if not expired and not dropped:
            return
        await place.save_graph(graph)
        await place.unindex(expired, now)
