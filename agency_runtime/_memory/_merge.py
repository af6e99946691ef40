"""Changing a graph: merging an extraction into it and soft-expiring facts and relations."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._graph import Entity, Graph, Observation, Relation, _fold, _iso
from ._prompts import ExtractedRelation, Extraction


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
