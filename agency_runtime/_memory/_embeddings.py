"""Embedding vectors for ``recall``'s similarity search: :func:`embed`."""

from __future__ import annotations

from .._llm._embed import embed as embed_through_seam

__all__ = ["embed"]


async def embed(texts: list[str], model: str) -> list[list[float]]:
    """Embed ``texts`` with ``model`` through the LLM provider seam (one vector per text, in order).

    ``fake/...`` models answer offline (bag-of-words hash vectors, no litellm); other models
    go to ``litellm.aembedding``. Transient provider errors are retried like ``agency.llm``'s.
    The call's cost and tokens are billed to the current run and its guards (a cost guard
    now over its budget raises :class:`GuardExceededError`). Provider failures raise
    :class:`LLMCallError`. Tests replace this function to fake embeddings.
    """
    return await embed_through_seam(model, texts)
