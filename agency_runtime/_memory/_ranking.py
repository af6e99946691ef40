"""Which entities a query is about: recall's (and forget's) candidates, best first.

Keyword matches (the store's full-text index, names as whole words, types exactly), then,
with an ``embeddings_model``, entities by the cosine similarity of their vectors, merged by
reciprocal-rank fusion; when nothing matches, a small graph is offered whole. Also the
known entities shown to ``remember``'s extraction call.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Sequence

from .._errors import LLMCallError
from .._store._rules import query_terms
from . import _embeddings
from ._config import (
    CONTEXT_LIMIT,
    EMBED_BATCH,
    EMBEDDING_THRESHOLD,
    FALLBACK_LIMIT,
    KEYWORD_FETCH,
    MIN_NAME_WORD,
    RECALL_K,
    RRF_K,
    STOP_WORDS,
    _fails_open,
)
from ._graph import Entity, Graph, _facts, _fold
from ._persistence import EmbeddingEntry, EmbeddingIndex, _Place

logger = logging.getLogger("agency_runtime.memory")


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
        got = await _embeddings.embed(batch, model)
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


# -- similarity -----------------------------------------------------------------------------------


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
