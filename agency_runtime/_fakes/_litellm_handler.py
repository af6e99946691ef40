"""The fake models inside litellm: ``fake`` as a litellm custom provider.

The package (:mod:`agency_runtime._fakes`) adds a litellm load hook that calls
:func:`install` the moment anything loads litellm (at once if it is loaded already). From
then on ``litellm.acompletion(model="fake/<name>", ...)``, ``litellm.completion``, streaming
and ``litellm.aembedding`` are answered by the same fake models as at the seam, priced with
``litellm.register_model`` (so ``response._hidden_params["response_cost"]`` and
``litellm.completion_cost`` give the same numbers), with litellm's own exceptions for
failures. This is what ``FakeModel(..., via_litellm=True)`` and tests of litellm's real code
path use.

litellm wraps any exception a provider raises that is not a litellm exception into
``litellm.APIConnectionError`` (the original is its ``__context__``). A
:class:`~._models.FakeModelExhausted` is raised as a ``litellm.BadRequestError`` that is also
a ``FakeModelExhausted``, so it reaches the caller unwrapped and is never mistaken for a
transient error.

A tool-call reply answers a ``ModelResponse`` whose ``choices[0].message.tool_calls`` hold
the calls (``finish_reason="tool_calls"``, ``content=None``). Streaming yields litellm
``GenericStreamingChunk`` dicts: one per text piece (a :class:`~._replies.FakeStream`'s
chunks, ``delay`` seconds apart), then one per tool call (its ``tool_use``), the last one
finished and carrying the usage; litellm turns them into ``delta.content`` and
``delta.tool_calls`` chunks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from types import ModuleType
from typing import Any

import anyio

from .._llm._litellm import litellm_module
from ._models import (
    FAKE_PROVIDER,
    FakeModel,
    FakeModelExhausted,
    failure_message,
    lookup,
    models,
    name_of,
    not_found_message,
    on_register,
)
from ._replies import FakeAnswer, FakeRequest
from ._usage import chat_usage, embed_usage

__all__ = ["install", "installed", "register_price"]

_lock = threading.Lock()
_installed = False
_exhausted_class: type[FakeModelExhausted] | None = None


def installed() -> bool:
    """Whether the ``fake`` provider has been installed into litellm."""
    return _installed


def _litellm() -> Any:
    module = litellm_module()
    if module is None:  # pragma: no cover - the handler only runs once litellm is loaded
        raise RuntimeError("litellm is not loaded")
    return module


# -- prices ---------------------------------------------------------------------------------------


def _price_entry(model: FakeModel) -> dict[str, Any]:
    return {
        "input_cost_per_token": model.input_cost_per_token,
        "output_cost_per_token": model.output_cost_per_token,
        # zero cache prices: stops litellm warning that they are missing
        "cache_creation_input_token_cost": 0.0,
        "cache_read_input_token_cost": 0.0,
        "litellm_provider": FAKE_PROVIDER,
        "mode": "chat",
        "max_tokens": 100_000,
        "max_input_tokens": 100_000,
        "max_output_tokens": 100_000,
    }


def register_price(litellm: ModuleType, model: FakeModel) -> None:
    """Price ``fake/<name>`` in litellm with ``model``'s per-token prices."""
    litellm.register_model({model.model: _price_entry(model)})


# -- litellm errors ------------------------------------------------------------------------------


class _LiteLLMErrors:
    """Failures through litellm: litellm's exception classes."""

    def failure(self, model: FakeModel, index: int) -> BaseException:
        litellm = _litellm()
        classes = {
            "rate_limit": litellm.RateLimitError,
            "timeout": litellm.Timeout,
            "server": litellm.InternalServerError,
            "connection": litellm.APIConnectionError,
            "bad_request": litellm.BadRequestError,
        }
        error: BaseException = classes[model.failure](
            message=failure_message(model, index), model=model.model, llm_provider=FAKE_PROVIDER
        )
        return error

    def exhausted(self, model: FakeModel, message: str) -> BaseException:
        cls = _exhausted_class
        if cls is None:  # pragma: no cover - set by install() before any request
            return FakeModelExhausted(message)
        return cls(message, model.model)


_ERRORS = _LiteLLMErrors()


def _make_exhausted_class(litellm: ModuleType) -> type[FakeModelExhausted]:
    class FakeModelExhaustedError(FakeModelExhausted, litellm.BadRequestError):  # type: ignore[misc,name-defined]
        """:class:`FakeModelExhausted` as a litellm ``BadRequestError`` (passes through litellm)."""

        def __init__(self, message: str, model: str) -> None:
            litellm.BadRequestError.__init__(
                self, message=message, model=model, llm_provider=FAKE_PROVIDER
            )

    # Reported under the public name (RunResult.error.type, tracebacks, logs).
    FakeModelExhaustedError.__module__ = FakeModelExhausted.__module__
    FakeModelExhaustedError.__name__ = FakeModelExhaustedError.__qualname__ = "FakeModelExhausted"
    return FakeModelExhaustedError


# -- the litellm custom provider ----------------------------------------------------------------


def _request(
    model_name: str,
    messages: Sequence[dict[str, Any]],
    optional_params: dict[str, Any] | None,
    timeout: object,
) -> FakeRequest:
    params = dict(optional_params or {})
    response_format = params.pop("response_format", None)
    max_tokens = params.pop("max_tokens", None)
    tools = params.pop("tools", None)
    tool_choice = params.pop("tool_choice", None)
    seconds: float | None
    if isinstance(timeout, int | float):
        seconds = float(timeout)
    else:
        read = getattr(timeout, "read", None)
        seconds = float(read) if isinstance(read, int | float) else None
    return FakeRequest(
        model=f"{FAKE_PROVIDER}/{model_name}",
        messages=[dict(m) for m in messages],
        response_format=response_format,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        timeout=seconds,
        extra=params,
        tools=[dict(tool) for tool in tools] if isinstance(tools, list | tuple) else [],
        tool_choice=tool_choice if isinstance(tool_choice, str | dict) else None,
    )


def _find(model: str) -> FakeModel:
    name = name_of(model)
    found = lookup(name)
    if found is None:
        raise _litellm().NotFoundError(
            message=not_found_message(name),
            model=f"{FAKE_PROVIDER}/{name}",
            llm_provider=FAKE_PROVIDER,
        )
    return found


def _usage(request: FakeRequest, answer: FakeAnswer) -> dict[str, int]:
    usage = chat_usage(request.messages, answer.text, answer.tool_calls)
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def _response(model: FakeModel, request: FakeRequest, answer: FakeAnswer) -> Any:
    litellm = _litellm()
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    finish_reason = "stop"
    if answer.tool_calls:
        message["content"] = answer.text or None
        message["tool_calls"] = [call.to_openai() for call in answer.tool_calls]
        finish_reason = "tool_calls"
    return litellm.ModelResponse(
        model=model.model,
        choices=[{"index": 0, "finish_reason": finish_reason, "message": message}],
        usage=litellm.Usage(**_usage(request, answer)),
    )


def _answer_sync(
    model: str, messages: Sequence[dict[str, Any]], optional_params: Any, timeout: object
) -> tuple[FakeRequest, FakeAnswer]:
    fake = _find(model)
    request = _request(fake.name, messages, optional_params, timeout)
    return request, fake.answer_sync(request, _ERRORS)


async def _answer_async(
    model: str, messages: Sequence[dict[str, Any]], optional_params: Any, request_timeout: object
) -> tuple[FakeRequest, FakeAnswer]:
    fake = _find(model)
    request = _request(fake.name, messages, optional_params, request_timeout)
    return request, await fake.answer(request, _ERRORS)


def _complete_sync(
    model: str, messages: Sequence[dict[str, Any]], optional_params: Any, timeout: object
) -> Any:
    request, answer = _answer_sync(model, messages, optional_params, timeout)
    return _response(_find(model), request, answer)


async def _complete_async(
    model: str, messages: Sequence[dict[str, Any]], optional_params: Any, request_timeout: object
) -> Any:
    request, answer = await _answer_async(model, messages, optional_params, request_timeout)
    return _response(_find(model), request, answer)


async def _embed(model: str, texts: list[Any], model_response: Any) -> Any:
    fake = _find(model)
    strings = [str(text) for text in texts]
    vectors = await fake.embed_texts(strings, _ERRORS)
    usage = embed_usage(strings)
    litellm = _litellm()
    model_response.model = fake.model
    model_response.object = "list"
    model_response.data = [
        {"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(vectors)
    ]
    model_response.usage = litellm.Usage(
        prompt_tokens=usage.prompt_tokens, completion_tokens=0, total_tokens=usage.total_tokens
    )
    return model_response


def _make_handler(litellm: ModuleType) -> Any:
    class FakeLLMHandler(litellm.CustomLLM):  # type: ignore[misc,name-defined]
        """litellm custom provider answering ``fake/<name>`` from the fake-model registry.

        litellm calls it with keyword arguments: ``model`` without the ``fake/`` prefix,
        ``messages``, ``optional_params`` (response_format, max_tokens, temperature, ...),
        ``timeout`` and more that a fake does not need.
        """

        def completion(self, model: str, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
            return _complete_sync(
                model, messages, kwargs.get("optional_params"), kwargs.get("timeout")
            )

        async def acompletion(
            self, model: str, messages: list[dict[str, Any]], **kwargs: Any
        ) -> Any:
            return await _complete_async(
                model, messages, kwargs.get("optional_params"), kwargs.get("timeout")
            )

        def streaming(
            self, model: str, messages: list[dict[str, Any]], **kwargs: Any
        ) -> Iterator[dict[str, Any]]:
            request, answer = _answer_sync(
                model, messages, kwargs.get("optional_params"), kwargs.get("timeout")
            )
            for n, chunk in enumerate(_chunks(request, answer)):
                if n and answer.delay and chunk["tool_use"] is None:
                    time.sleep(answer.delay)
                yield chunk

        async def astreaming(
            self, model: str, messages: list[dict[str, Any]], **kwargs: Any
        ) -> AsyncIterator[dict[str, Any]]:
            request, answer = await _answer_async(
                model, messages, kwargs.get("optional_params"), kwargs.get("timeout")
            )
            for n, chunk in enumerate(_chunks(request, answer)):
                if n and answer.delay and chunk["tool_use"] is None:
                    await anyio.sleep(answer.delay)
                yield chunk

        async def aembedding(self, model: str, input: list[Any], **kwargs: Any) -> Any:
            return await _embed(model, input, kwargs["model_response"])

    return FakeLLMHandler()


def _chunks(request: FakeRequest, answer: FakeAnswer) -> list[dict[str, Any]]:
    """The answer as litellm ``GenericStreamingChunk`` dicts: its text pieces (a plain text
    is one piece; a :class:`~._replies.FakeStream` its chunks), then one chunk per tool call;
    the last one is finished and carries the usage."""
    pieces = answer.chunks if answer.chunks is not None else (answer.text,)
    chunks: list[dict[str, Any]] = [{"text": piece, "tool_use": None} for piece in pieces if piece]
    for n, call in enumerate(answer.tool_calls):
        chunks.append({"text": "", "tool_use": {**call.to_openai(), "index": n}})
    if not chunks:  # an empty answer: one empty, finished chunk
        chunks.append({"text": "", "tool_use": None})
    for chunk in chunks:
        chunk.update(is_finished=False, finish_reason="", usage=None, index=0)
    chunks[-1].update(
        is_finished=True,
        finish_reason="tool_calls" if answer.tool_calls else "stop",
        usage=_usage(request, answer),
    )
    return chunks


def install(module: ModuleType) -> None:
    """The load hook: install the ``fake`` provider and price every fake model, known now
    or registered later.

    Idempotent; warns if ``litellm.custom_provider_map`` already has a ``fake`` provider.
    """
    global _installed, _exhausted_class
    litellm: Any = module
    with _lock:
        if _installed:
            return
        _exhausted_class = _make_exhausted_class(litellm)
        handler = _make_handler(litellm)
        provider_map = litellm.custom_provider_map
        if provider_map is None:
            provider_map = litellm.custom_provider_map = []
        if any(entry.get("provider") == FAKE_PROVIDER for entry in provider_map):
            logging.getLogger(__name__).warning(
                "litellm.custom_provider_map already has a %r provider; the agency_runtime "
                "fake models are shadowed by it",
                FAKE_PROVIDER,
            )
        provider_map.append({"provider": FAKE_PROVIDER, "custom_handler": handler})
        litellm.utils.custom_llm_setup()
        # Subscribe before listing: a model registered in between is priced twice, never not.
        on_register(lambda model: register_price(litellm, model))
        known = models()
        _installed = True
    for model in known:
        register_price(litellm, model)
