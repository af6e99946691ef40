"""Memory: agent memory (``agency.memory``) and turn_kit's conversation memory.

``agency.memory``: long-term agent memory as a knowledge graph.

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

:class:`ConversationMemory` (``_conversation``) is turn_kit's ``ctx.memory``: tagged,
expiring, keyword-ranked items in the same store. It shares nothing with agent memory.

One concept per module; a module imports only the ones listed before it (each arrow points
at what a module imports)::

    _config        MemoryConfig, memory ids, the limits, the fail-open rule
    _graph         Entity / Observation / Relation / Graph, rendering      → _config
    _prompts       the extraction, filter and forget prompts, their schemas → _graph
    _merge         applying an extraction, expiring facts and relations    → _graph, _prompts
    _state         per-run state: MemoryFrame, MemoryState, MEMORY_STATE   → _config
    _persistence   _Place: documents, dir= files, keyword index; EmbeddingIndex
                                                                → _config, _graph, _state
    _embeddings    embed (through the LLM provider seam); _ranking calls it as
                   ``_embeddings.embed``, so tests replace it there   (nothing in the package)
    _ranking       keyword / embedding candidates, fusion, fallback
                                         → _config, _graph, _persistence, _embeddings
    _operations    remember / recall / forget, each journaled as one unit
                  → _config, _graph, _merge, _persistence, _prompts, _ranking
    _namespace     MemoryNamespace (agency.memory)
                                  → _config, _operations, _persistence, _state
    _conversation  ConversationMemory, MemoryItem, SaveReceipt   (nothing in the package)
    __init__       re-exports                                            → all of them
"""

from ._config import DEFAULT_MEMORY_ID, MemoryConfig
from ._conversation import ConversationMemory, MemoryItem, SaveReceipt
from ._graph import Entity, Graph, Observation, Relation
from ._namespace import MemoryNamespace
from ._persistence import EmbeddingEntry, EmbeddingIndex
from ._prompts import (
    Expiration,
    ExtractedEntity,
    ExtractedRelation,
    Extraction,
    ForgetPlan,
    RecallFilter,
)
from ._state import MEMORY_STATE, MemoryFrame, MemoryState

__all__ = [
    "DEFAULT_MEMORY_ID",
    "MEMORY_STATE",
    "ConversationMemory",
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
    "MemoryItem",
    "MemoryNamespace",
    "MemoryState",
    "Observation",
    "RecallFilter",
    "Relation",
    "SaveReceipt",
]
