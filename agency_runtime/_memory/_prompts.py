"""What memory asks the model: the extraction, filter and forget prompts, and the schemas
of their answers (:class:`Extraction`, :class:`RecallFilter`, :class:`ForgetPlan`)."""

from __future__ import annotations

from pydantic import Field

from .._types import DeferredModel
from ._graph import Entity, Graph, _block, _facts

__all__ = [
    "Expiration",
    "ExtractedEntity",
    "ExtractedRelation",
    "Extraction",
    "ForgetPlan",
    "RecallFilter",
]


# -- what the model is asked for ------------------------------------------------------------------


class ExtractedEntity(DeferredModel):
    """An entity named in the remembered content, with new facts about it."""

    name: str
    type: str
    observations: list[str] = Field(default_factory=list)


class ExtractedRelation(DeferredModel):
    """A relation between two entities, by name."""

    from_name: str
    to_name: str
    type: str


class Expiration(DeferredModel):
    """A remembered fact that no longer holds: the entity's name and the fact's text."""

    entity: str
    observation: str


class Extraction(DeferredModel):
    """What ``remember`` asks the model to extract from the content."""

    entities: list[ExtractedEntity] = Field(default_factory=list)
    relations: list[ExtractedRelation] = Field(default_factory=list)
    expirations: list[Expiration] = Field(default_factory=list)


class RecallFilter(DeferredModel):
    """The answer of ``recall``'s LLM filter: the ids of the relevant entities."""

    ids: list[str] = Field(default_factory=list)


class ForgetPlan(DeferredModel):
    """What ``forget`` asks the model for: the facts (and relations) to expire."""

    expirations: list[Expiration] = Field(default_factory=list)
    relations: list[ExtractedRelation] = Field(default_factory=list)


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
