"""The knowledge graph of one memory, and how it is shown.

*Entities* (a name and a type) carry *observations* (one short fact each); *relations*
link two entities. Forgetting is soft: an observation or relation gets a ``valid_to`` time
and is never shown again, but stays in the graph.

An entity is rendered as ``"Name (type):"`` followed by ``"  - fact"`` lines: its live
observations, then its live relations (shown with ``→``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import ConfigDict, Field

from .._types import DeferredModel
from ._config import RECALL_K

__all__ = ["Entity", "Graph", "Observation", "Relation"]


class Observation(DeferredModel):
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


class Entity(DeferredModel):
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


class Relation(DeferredModel):
    """A typed, directed link between two entities; live while ``valid_to`` is ``None``."""

    model_config = ConfigDict()

    id: str
    from_id: str
    to_id: str
    type: str
    source: str
    valid_from: str
    valid_to: str | None = None


class Graph(DeferredModel):
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


# -- small helpers --------------------------------------------------------------------------------


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


def _iso(epoch: float) -> str:
    return (
        datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


# -- rendering ------------------------------------------------------------------------------------


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
