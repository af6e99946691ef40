"""Embedding vectors for ``recall``'s similarity search: :func:`embed`."""

from __future__ import annotations

from typing import Any

import anyio

from .._core._frame import current_frame_maybe
from .._errors import AgencyError, LLMCallError
from .._guards import charge
from .._llm._chat import DEFAULT_TIMEOUT, _spend
from .._llm._litellm import load_litellm

__all__ = ["embed"]


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
