"""Embeddings through the provider seam: :func:`embed`.

The model (a string, a registered model's name, or an :class:`~._model.Model`, whose
``api_base``, ``api_key``, ``options`` and input price apply) picks the provider as for
chat (``fake/...`` is answered offline by bag-of-words hash vectors, without litellm;
everything else goes to ``litellm.aembedding``).
Transient provider errors are retried with the same capped backoff as ``agency.llm``; a
permanent one raises :class:`~agency_runtime.LLMCallError`; inside a frame the branch's
abort signal (``ctx.cancel()``, time guards) stops the call, and its cost and tokens are
billed to the run and every guard in scope.
"""

from __future__ import annotations

from .._bounds import check_seconds
from .._core._frame import current_frame_maybe
from .._errors import InvalidArgumentError, LLMCallError
from .._guards import charge
from ._billing import bill
from ._model import Model, resolve_model
from ._provider import DEFAULT_TIMEOUT, EmbedRequest
from ._registry import provider_for
from ._retries import with_transient_retries

__all__ = ["embed"]


async def embed(
    model: str | Model, texts: list[str], *, timeout: float | None = None
) -> list[list[float]]:
    """Embed ``texts`` with ``model``: one vector per text, in order.

    ``model`` is a provider model string, the name of a registered :class:`Model`, or a
    ``Model`` (its ``api_base``, ``api_key`` and ``options`` go with the request; its
    ``input_cost_per_token`` prices it).

    ``timeout`` bounds each request (seconds; default 120). Inside a frame the call's cost
    and tokens are billed to the current run and its guards (a cost guard now over its
    budget raises :class:`~agency_runtime.GuardExceededError`). Provider failures raise
    :class:`~agency_runtime.LLMCallError` (transient ones after retries).
    """
    if not isinstance(model, Model) and (not isinstance(model, str) or not model.strip()):
        raise InvalidArgumentError(
            f"model must be a non-empty string or an agency.Model(...), got {model!r:.80}"
        )
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise InvalidArgumentError("texts must be a list of strings")
    if timeout is not None:
        check_seconds(timeout, "timeout", positive=True)  # finite, at most 100 years
    if not texts:
        return []
    chosen = resolve_model(model)
    name = chosen.name
    provider = provider_for(chosen.model)
    request = EmbedRequest(
        model=chosen.model,
        texts=list(texts),
        timeout=DEFAULT_TIMEOUT if timeout is None else float(timeout),
        api_base=chosen.api_base,
        api_key=chosen.api_key,
        params=dict(chosen.options),
    )
    frame = current_frame_maybe()
    response = await with_transient_retries(
        lambda: provider.embed(request),
        model=name,
        signal=None if frame is None else frame.stack.abort_signal,
        what="embedding call",
        secret=chosen.api_key,
    )
    if frame is not None:
        pico, tokens = bill(response.cost, response.usage, chosen, frame)
        charge(frame, pico=pico, tokens=tokens)
    if len(response.vectors) != len(texts):
        raise LLMCallError(
            f"the embedding call to {name!r} returned {len(response.vectors)} vectors "
            f"for {len(texts)} texts",
            model=name,
            attempts=1,
        )
    return response.vectors
