"""Agent memory's configuration: :class:`MemoryConfig`, memory ids and the limits.

Also the rule for optional steps (the LLM filter, the embedding search): which failures
are skipped and which propagate.
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import ConfigDict, ValidationError, field_validator

from .._bounds import shown
from .._errors import (
    AgencyError,
    InvalidArgumentError,
    LLMCallError,
    StructuredOutputError,
)
from .._types import DeferredModel

__all__ = [
    "CONTEXT_LIMIT",
    "DEFAULT_MEMORY_ID",
    "EMBEDDING_THRESHOLD",
    "EMBED_BATCH",
    "FALLBACK_LIMIT",
    "FILTER_LIMIT",
    "KEYWORD_FETCH",
    "MIN_NAME_WORD",
    "RECALL_K",
    "RRF_K",
    "STOP_WORDS",
    "THREAD_LABEL",
    "MemoryConfig",
]


# -- memory ids and limits ------------------------------------------------------------------------


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
MAX_MEMORY_ID = 200
"""The longest memory id, in characters: it names a folder (a file system takes 255 bytes)
and a store namespace."""

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


class MemoryConfig(DeferredModel):
    """How ``agency.memory.enable`` stores and searches memory.

    * ``dir``: keep the graph in plain files ``<dir>/<memory id>/graph.json`` (and
      ``embeddings.json``) instead of the run's store. ``~`` is expanded, the path is
      resolved against the working directory and created; its real path identifies the
      memory frame.
    * ``model``: the model for memory's own LLM calls (default: the run's model).
    * ``embeddings_model``: when set, ``recall`` also ranks entities by the cosine
      similarity of embedding vectors from the model's provider (cached per entity).
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


def _check_memory_id(memory_id: object) -> str:
    if (
        not isinstance(memory_id, str)
        or not _MEMORY_ID.fullmatch(memory_id)
        or memory_id in (".", "..")
        or len(memory_id) > MAX_MEMORY_ID
    ):
        raise InvalidArgumentError(
            "agency.memory.set_id: a memory id is 1 to "
            f"{MAX_MEMORY_ID} letters, digits, '.', '_' and '-' "
            f"(^[A-Za-z0-9._-]+$, not '.' or '..'), got {shown(memory_id)}"
            + (f" ({len(memory_id)} characters)" if isinstance(memory_id, str) else "")
        )
    return memory_id


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


# -- failing open ---------------------------------------------------------------------------------


def _fails_open(exc: Exception) -> bool:
    """Whether a failed optional step (filter, embeddings) is skipped rather than raised.

    Provider and output failures are; guard trips, cancellation and every other runtime
    error (store, journal, arguments) propagate.
    """
    return isinstance(exc, LLMCallError | StructuredOutputError) or not isinstance(exc, AgencyError)
