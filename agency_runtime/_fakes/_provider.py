"""The fake provider at the seam: ``fake/...`` models answered in-process, without litellm.

The registry (:mod:`agency_runtime._llm._registry`) routes every ``fake/<name>`` model to
:data:`PROVIDER`, a :class:`~agency_runtime._llm._provider.ChatProvider` like any other,
which answers with no network and **without importing litellm**. A failure is a
:class:`~agency_runtime._llm._provider.ProviderError` whose ``kind`` is the ``failure``
asked for (``rate_limit``, ``timeout``, ``server`` and ``connection`` are transient;
``bad_request`` is not). A scripted exception is raised as it is (a ``ProviderError`` keeps
its ``transient``; a litellm exception is classified as litellm's would be; a
``TimeoutError`` or ``ConnectionError`` is transient; anything else is permanent).
:class:`~._models.FakeModelExhausted` is permanent. A model registered with
``via_litellm=True`` is handed to the litellm provider instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.lowlevel

from .._errors import AgencyError
from .._llm._litellm import LITELLM_PROVIDER, litellm_error
from .._llm._provider import (
    ChatProvider,
    ChatRequest,
    ChatResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorKind,
    ProviderError,
    StreamEnd,
    StreamEvent,
    TextDelta,
    json_schema_format,
)
from ._models import (
    FAKE_PROVIDER,
    FakeModel,
    FakeModelExhausted,
    failure_message,
    lookup,
    name_of,
    not_found_message,
)
from ._replies import FakeAnswer, FakeRequest
from ._usage import chat_usage, embed_usage

__all__ = ["PROVIDER", "FakeProvider"]


class _SeamErrors:
    """Failures at the seam: :class:`ProviderError` and plain :class:`FakeModelExhausted`."""

    def failure(self, model: FakeModel, index: int) -> BaseException:
        kind: ErrorKind = model.failure
        return ProviderError(
            failure_message(model, index), kind=kind, model=model.model, provider=FAKE_PROVIDER
        )

    def exhausted(self, model: FakeModel, message: str) -> BaseException:
        return FakeModelExhausted(message)


_SEAM_ERRORS = _SeamErrors()


def _as_provider_error(exc: Exception, model: str) -> ProviderError:
    """A scripted exception (or a reply function's) as the seam sees it."""
    mapped = litellm_error(exc, model)
    if mapped is not None:
        return mapped
    kind: ErrorKind = "other"
    if isinstance(exc, TimeoutError):
        kind = "timeout"
    elif isinstance(exc, ConnectionError):
        kind = "connection"
    elif isinstance(exc, FakeModelExhausted):
        kind = "bad_request"
    return ProviderError(str(exc), kind=kind, model=model, provider=FAKE_PROVIDER)


def _find(model: str) -> FakeModel:
    name = name_of(model)
    found = lookup(name)
    if found is None:
        raise ProviderError(
            not_found_message(name),
            kind="not_found",
            model=f"{FAKE_PROVIDER}/{name}",
            provider=FAKE_PROVIDER,
        )
    return found


def _seam_request(fake: FakeModel, request: ChatRequest) -> FakeRequest:
    output = request.response_format
    return FakeRequest(
        model=fake.model,
        messages=[dict(m) for m in request.messages],
        response_format=None if output is None else json_schema_format(output),
        max_tokens=request.max_tokens,
        timeout=request.timeout,
        tools=[tool.to_openai() for tool in request.tools],
        tool_choice=request.chosen_tool_choice,
        params=dict(request.params),
        api_base=request.api_base,
        api_key=request.api_key,
    )


class FakeProvider:
    """The ``ChatProvider`` of ``fake/...`` models (no litellm, no network).

    A model registered with ``via_litellm=True`` is handed to the litellm provider instead.
    """

    @property
    def name(self) -> str:
        """``"fake"``."""
        return FAKE_PROVIDER

    async def _answer(
        self, fake: FakeModel, request: ChatRequest
    ) -> tuple[FakeRequest, FakeAnswer]:
        seen = _seam_request(fake, request)
        try:
            return seen, await fake.answer(seen, _SEAM_ERRORS)
        except AgencyError:
            raise
        except Exception as exc:
            raise _as_provider_error(exc, fake.model) from exc

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """The fake model's answer, with its deterministic usage and cost."""
        fake = _find(request.model)
        if fake.via_litellm:
            return await _litellm_provider().complete(request)
        seen, answer = await self._answer(fake, request)
        usage = chat_usage(seen.messages, answer.text, answer.tool_calls)
        return ChatResponse(
            text=answer.text,
            usage=usage,
            cost=fake.cost(usage),
            model=fake.model,
            tool_calls=answer.tool_calls,
            response_id=_response_id(fake),
            finish_reasons=_finish(answer.tool_calls),
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """The answer word by word (after the model's latency), then usage and cost.

        A :class:`FakeStream` reply streams its own chunks, ``delay`` seconds apart; a
        tool-call reply streams no text and ends with the calls.
        """
        fake = _find(request.model)
        if fake.via_litellm:
            async for event in _litellm_provider().stream(request):
                yield event
            return
        seen, answer = await self._answer(fake, request)
        for n, piece in enumerate(answer.pieces()):
            if n and answer.delay:
                await anyio.sleep(answer.delay)
            yield TextDelta(piece)
            await anyio.lowlevel.checkpoint()
        usage = chat_usage(seen.messages, answer.text, answer.tool_calls)
        yield StreamEnd(
            text=answer.text,
            usage=usage,
            cost=fake.cost(usage),
            tool_calls=answer.tool_calls,
            model=fake.model,
            response_id=_response_id(fake),
            finish_reasons=_finish(answer.tool_calls),
        )

    async def embed(self, request: EmbedRequest) -> EmbedResponse:
        """Bag-of-words hash vectors (:func:`fake_embedding`), priced per input token."""
        fake = _find(request.model)
        if fake.via_litellm:
            return await _litellm_provider().embed(request)
        vectors = await fake.embed_texts(list(request.texts), _SEAM_ERRORS)
        usage = embed_usage(request.texts)
        return EmbedResponse(vectors=vectors, usage=usage, cost=fake.cost(usage))

    async def supports_schema(self, model: str) -> bool:
        """Always: a fake model answers JSON-schema requests with valid documents."""
        return True

    def __repr__(self) -> str:
        return "FakeProvider()"


def _litellm_provider() -> ChatProvider:
    return LITELLM_PROVIDER


PROVIDER = FakeProvider()
"""The fake provider instance the registry routes ``fake/...`` models to."""


def _response_id(fake: FakeModel) -> str:
    """A fake response's id: the model's name and how many requests it has answered."""
    return f"fake-{fake.name}-{len(fake.calls)}"


def _finish(tool_calls: Sequence[object]) -> tuple[str, ...]:
    """Why a fake answer ended: it called tools, or it stopped."""
    return ("tool_calls",) if tool_calls else ("stop",)
