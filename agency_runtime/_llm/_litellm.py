"""litellm, the default provider: loaded lazily, offline-safe, off the event loop.

``import litellm`` takes seconds and, with its defaults, fetches a price list over the
network and loads a stray ``.env`` file. So it is imported only when the first LLM call
needs it, in a worker thread, after ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and
``LITELLM_MODE=PRODUCTION`` are set (unless the user set them). ``agency.preload()`` does it
ahead of time. Whoever waits for the import can say so: :func:`add_import_notice`.

:class:`LiteLLMProvider` (:data:`LITELLM_PROVIDER`) is the :class:`~._provider.ChatProvider`
every model without a registered prefix goes to. Each request passes an explicit
``timeout`` and ``num_retries=0`` (the seam retries, with its own backoff); litellm's
exceptions become :class:`~._provider.ProviderError` (:func:`litellm_error`: timeouts,
429, 5xx and dropped connections are transient); a cost litellm cannot compute
(``completion_cost`` raises for unmapped models) is unknown (``None``), never a crash.

A request's ``api_base``, ``api_key`` (its secret value) and ``params`` (temperature, seed,
top_p, a model's options) go to ``litellm.acompletion`` and ``litellm.aembedding`` as
keyword arguments of the same names. A request's tools go to litellm as OpenAI-shape
``tools`` with an explicit ``tool_choice`` (:attr:`~._provider.ChatRequest.chosen_tool_choice`:
``"auto"`` unless the model's options or the runtime chose; without tools none is sent,
whatever the options say); the tools the model called come back as
:class:`~._provider.ToolCall` items, read from ``message.tool_calls`` or assembled from a
stream's ``delta.tool_calls`` pieces (arguments a provider sent as a dict are dumped to
JSON text).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import threading
from collections.abc import AsyncIterator, Callable
from types import ModuleType
from typing import Any

import anyio.to_thread

from .._errors import AgencyError
from ._provider import (
    ChatRequest,
    ChatResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorKind,
    ProviderError,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCall,
    Usage,
)

__all__ = [
    "IMPORT_NOTICE",
    "LITELLM_PROVIDER",
    "LiteLLMProvider",
    "add_import_notice",
    "add_load_hook",
    "litellm_error",
    "litellm_module",
    "load_litellm",
    "load_litellm_sync",
    "start_preload",
]

_lock = threading.Lock()
_module: ModuleType | None = None
_hooks: list[Callable[[ModuleType], None]] = []
_notices: list[Callable[[str], None]] = []
_noticed = False

logger = logging.getLogger("agency_runtime.llm")

IMPORT_NOTICE = "loading litellm for the first LLM call (a few seconds, once per process)…"
"""What an LLM call that has to wait for ``import litellm`` says before it waits."""


def add_import_notice(notice: Callable[[str], None]) -> None:
    """Call ``notice(message)`` when an LLM call starts waiting for ``import litellm``.

    Command-line tools use it to say what they are waiting for (the import takes seconds);
    the message is also logged at INFO on ``agency_runtime.llm``. Called at most once per
    process, and not at all when litellm is already loaded.
    """
    with _lock:
        if notice not in _notices:
            _notices.append(notice)


def add_load_hook(hook: Callable[[ModuleType], None]) -> None:
    """Call ``hook(litellm)`` once litellm is loaded (at once if it already is)."""
    with _lock:
        module = _module
        if module is None:
            _hooks.append(hook)
            return
    hook(module)


def load_litellm_sync() -> ModuleType:
    """Import and configure litellm (blocking; idempotent)."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
        import litellm

        litellm.suppress_debug_info = True
        litellm.telemetry = False
        # litellm brings ~3000 modules of long-lived objects: move them out of the cyclic
        # collector's view, so later collections do not walk them again and again.
        gc.freeze()
        hooks, _hooks[:] = list(_hooks), []
        _module = litellm
    for hook in hooks:
        hook(litellm)
    return litellm


async def load_litellm() -> ModuleType:
    """litellm, imported in a worker thread the first time so the event loop never blocks."""
    global _noticed
    module = _module
    if module is not None:
        return module
    with _lock:
        notices = [] if _noticed or _module is not None else list(_notices)
        first = not _noticed
        _noticed = True
    if first:
        logger.info(IMPORT_NOTICE)
        for notice in notices:
            try:
                notice(IMPORT_NOTICE)
            except Exception:  # a notice is a courtesy; it never fails the call
                logger.debug("an import notice failed", exc_info=True)
    return await anyio.to_thread.run_sync(load_litellm_sync)


_preload: threading.Thread | None = None


def start_preload(*, wait: bool = False) -> None:
    """Import litellm in a daemon thread (once); with ``wait``, block until it is loaded."""
    global _preload
    with _lock:
        if _module is None and _preload is None:
            _preload = threading.Thread(
                target=load_litellm_sync, name="agency-preload-litellm", daemon=True
            )
            _preload.start()
        thread = _preload
    if wait:
        if thread is not None:
            thread.join()
        load_litellm_sync()


def litellm_module() -> ModuleType | None:
    """litellm if it is loaded already, else ``None`` (never imports it)."""
    return _module


# -- the provider ---------------------------------------------------------------------------------

_KINDS: tuple[tuple[str, ErrorKind], ...] = (
    # transient first (litellm's Timeout is also an openai APIConnectionError, for instance)
    ("Timeout", "timeout"),
    ("RateLimitError", "rate_limit"),
    ("InternalServerError", "server"),
    ("ServiceUnavailableError", "server"),
    ("APIConnectionError", "connection"),
    ("AuthenticationError", "auth"),
    ("PermissionDeniedError", "auth"),
    ("NotFoundError", "not_found"),
    ("BadRequestError", "bad_request"),
)


def litellm_error(exc: BaseException, model: str) -> ProviderError | None:
    """``exc`` as a :class:`ProviderError` if it is a litellm exception, else ``None``.

    Timeouts, rate limits (429), server errors (5xx) and connection errors are transient;
    every other litellm exception is permanent. Never imports litellm: if it is not loaded,
    ``exc`` cannot be one of its exceptions.
    """
    litellm = _module
    if litellm is None:
        return None
    for name, kind in _KINDS:
        cls = getattr(litellm, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return ProviderError(str(exc), kind=kind, model=model, provider="litellm")
    if type(exc).__module__.partition(".")[0] == "litellm":  # another of litellm's own
        return ProviderError(str(exc), kind="other", model=model, provider="litellm")
    return None


def _mapped(exc: Exception, model: str) -> ProviderError:
    error = litellm_error(exc, model)
    if error is None:  # not a litellm exception (a bug, a library's error): permanent
        error = ProviderError(str(exc), kind="other", model=model, provider="litellm")
    return error


def _usage_of(response: Any) -> Usage:
    usage = getattr(response, "usage", None)
    prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
    completion = int(getattr(usage, "completion_tokens", 0) or 0)
    total = int(getattr(usage, "total_tokens", 0) or 0)
    return Usage(prompt, completion, total or prompt + completion)


def _cost_of(litellm: Any, response: Any) -> float | None:
    """The response's cost in US dollars from litellm's (offline) prices, or ``None``."""
    if response is None:
        return None
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
    if cost is None:
        try:
            cost = litellm.completion_cost(completion_response=response)
        except Exception:  # unmapped model: the cost is unknown, never a crash
            return None
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        return None
    if not math.isfinite(cost) or cost < 0:
        return None
    return float(cost)


def _text_of(response: Any) -> str:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


def _get(item: Any, key: str) -> Any:
    """``item[key]`` of a dict, or ``item.key`` of an object (``None`` when missing)."""
    if isinstance(item, dict):
        return item.get(key)
    return getattr(item, key, None)


def _arguments_text(arguments: Any) -> str:
    """A tool call's arguments as JSON text (some providers send a dict)."""
    if arguments is None:
        return ""
    if isinstance(arguments, str):
        return arguments
    import json  # on first use (the json module is not needed to import agency_runtime)

    try:
        return json.dumps(arguments)
    except (TypeError, ValueError):
        return str(arguments)


def _tool_calls_of(response: Any) -> tuple[ToolCall, ...]:
    """The tool calls of a (non-streamed) response's first choice."""
    try:
        items = response.choices[0].message.tool_calls
    except (AttributeError, IndexError, KeyError, TypeError):
        return ()
    if not items:
        return ()
    calls: list[ToolCall] = []
    for n, item in enumerate(items):
        function = _get(item, "function")
        name = _get(function, "name")
        if not isinstance(name, str) or not name:
            continue  # not a function call (a provider's other tool kind): nothing to run
        call_id = _get(item, "id")
        calls.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{n}",
                name=name,
                arguments=_arguments_text(_get(function, "arguments")),
            )
        )
    return tuple(calls)


class _ToolCallPieces:
    """Streamed ``delta.tool_calls`` pieces, assembled into whole calls.

    A call's pieces share an ``index``: the first usually has the ``id`` and the name, the
    rest pieces of the arguments' JSON text, to be concatenated in order.
    """

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, Any]] = {}

    def add(self, chunk: Any) -> None:
        try:
            items = chunk.choices[0].delta.tool_calls
        except (AttributeError, IndexError, KeyError, TypeError):
            return
        for position, item in enumerate(items or ()):
            index = _get(item, "index")
            if not isinstance(index, int):
                index = position
            call = self._calls.setdefault(index, {"id": None, "name": None, "arguments": []})
            call_id = _get(item, "id")
            if isinstance(call_id, str) and call_id:
                call["id"] = call_id
            function = _get(item, "function")
            name = _get(function, "name")
            if isinstance(name, str) and name:
                call["name"] = name
            arguments = _get(function, "arguments")
            if isinstance(arguments, str):
                call["arguments"].append(arguments)
            elif arguments is not None:  # a whole dict at once: it replaces any pieces
                call["arguments"] = [_arguments_text(arguments)]

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(
            ToolCall(
                id=call["id"] or f"call_{index}",
                name=call["name"],
                arguments="".join(call["arguments"]),
            )
            for index, call in sorted(self._calls.items())
            if call["name"]
        )


def _delta_of(chunk: Any) -> str:
    try:
        content = chunk.choices[0].delta.content
    except (AttributeError, IndexError, KeyError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


def _endpoint(request: ChatRequest | EmbedRequest) -> dict[str, Any]:
    """The request's own endpoint and key (the key's value: litellm sends it)."""
    kwargs: dict[str, Any] = {}
    if request.api_base is not None:
        kwargs["api_base"] = request.api_base
    if request.api_key is not None:
        kwargs["api_key"] = request.api_key.get_secret_value()
    return kwargs


def _chat_kwargs(request: ChatRequest) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        **request.params,  # temperature, seed, top_p, the model's options
        "model": request.model,
        "messages": request.messages,
        "timeout": request.timeout,
        "num_retries": 0,
        **_endpoint(request),
    }
    if request.max_tokens is not None:
        kwargs["max_tokens"] = request.max_tokens
    if request.response_format is not None:
        kwargs["response_format"] = request.response_format
    kwargs.pop("tool_choice", None)  # only with tools: a provider refuses it without
    if request.tools:
        kwargs["tools"] = [tool.to_openai() for tool in request.tools]
        kwargs["tool_choice"] = request.chosen_tool_choice
    return kwargs


def _id_of(response: Any) -> str | None:
    """The response's id (``chatcmpl-…``), when it has a non-empty one."""
    value = getattr(response, "id", None)
    return value if isinstance(value, str) and value else None


def _finish_reasons_of(response: Any) -> tuple[str, ...]:
    """Each choice's ``finish_reason``, in order (those the provider gave)."""
    choices = getattr(response, "choices", None) or ()
    reasons = (getattr(choice, "finish_reason", None) for choice in choices)
    return tuple(r for r in reasons if isinstance(r, str) and r)


def _last(chunks: list[Any], name: str) -> str | None:
    """The last non-empty string attribute ``name`` of the stream's chunks."""
    for chunk in reversed(chunks):
        value = getattr(chunk, name, None)
        if isinstance(value, str) and value:
            return value
    return None


class LiteLLMProvider:
    """The default :class:`~._provider.ChatProvider`: any model litellm knows, lazily loaded."""

    @property
    def name(self) -> str:
        """``"litellm"``."""
        return "litellm"

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """``litellm.acompletion`` with an explicit timeout and no retries of its own."""
        litellm: Any = _module or await load_litellm()
        try:
            response = await litellm.acompletion(**_chat_kwargs(request))
        except AgencyError:
            raise
        except Exception as exc:
            raise _mapped(exc, request.model) from exc
        return ChatResponse(
            text=_text_of(response),
            usage=_usage_of(response),
            cost=_cost_of(litellm, response),
            model=getattr(response, "model", None),
            tool_calls=_tool_calls_of(response),
            response_id=_id_of(response),
            finish_reasons=_finish_reasons_of(response),
            raw=response,
        )

    async def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """``litellm.acompletion(stream=True)``: its text deltas, then usage, cost and the
        tool calls assembled from the stream's pieces."""
        litellm: Any = await load_litellm()
        kwargs = _chat_kwargs(request)
        kwargs.update(stream=True, stream_options={"include_usage": True})
        try:
            stream = await litellm.acompletion(**kwargs)
        except AgencyError:
            raise
        except Exception as exc:
            raise _mapped(exc, request.model) from exc
        chunks: list[Any] = []
        parts: list[str] = []
        tool_pieces = _ToolCallPieces()
        iterator = stream.__aiter__()
        finished = False
        try:
            while True:
                try:
                    chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    finished = True
                    break
                except AgencyError:
                    raise
                except Exception as exc:
                    raise _mapped(exc, request.model) from exc
                chunks.append(chunk)
                tool_pieces.add(chunk)
                delta = _delta_of(chunk)
                if delta:
                    parts.append(delta)
                    yield TextDelta(delta)
        finally:
            close = getattr(iterator, "aclose", None)
            if not finished and close is not None:  # the caller stopped early, or it failed
                await close()
        try:
            rebuilt = litellm.stream_chunk_builder(chunks) if chunks else None
        except Exception:  # a stream litellm cannot rebuild: usage and cost unknown
            rebuilt = None
        yield StreamEnd(
            text="".join(parts),
            usage=_usage_of(rebuilt),
            cost=_cost_of(litellm, rebuilt),
            tool_calls=tool_pieces.calls() or _tool_calls_of(rebuilt),
            model=getattr(rebuilt, "model", None) or _last(chunks, "model"),
            response_id=_id_of(rebuilt) or _last(chunks, "id"),
            finish_reasons=_finish_reasons_of(rebuilt),
            raw=rebuilt,
        )

    async def embed(self, request: EmbedRequest) -> EmbedResponse:
        """``litellm.aembedding``: one vector per text, in the request's order."""
        litellm: Any = await load_litellm()
        try:
            response = await litellm.aembedding(
                **request.params,
                model=request.model,
                input=list(request.texts),
                timeout=request.timeout,
                num_retries=0,
                **_endpoint(request),
            )
        except AgencyError:
            raise
        except Exception as exc:
            raise _mapped(exc, request.model) from exc
        items = list(getattr(response, "data", None) or [])

        def position(item: Any) -> int:
            index = item.get("index") if isinstance(item, dict) else getattr(item, "index", 0)
            return int(index or 0)

        vectors: list[list[float]] = []
        for item in sorted(items, key=position):
            vector: Any = item.get("embedding") if isinstance(item, dict) else item.embedding
            vectors.append([float(x) for x in vector or []])
        return EmbedResponse(
            vectors=vectors,
            usage=_usage_of(response),
            cost=_cost_of(litellm, response),
            raw=response,
        )

    async def supports_schema(self, model: str) -> bool:
        """litellm's ``supports_response_schema`` (an unknown model: no)."""
        litellm: Any = await load_litellm()
        try:
            return bool(litellm.supports_response_schema(model=model))
        except Exception:  # an unknown model: fall back to instructions in the prompt
            return False

    def __repr__(self) -> str:
        return "LiteLLMProvider()"


LITELLM_PROVIDER = LiteLLMProvider()
"""The default provider instance (routes nothing by itself: see :mod:`._registry`)."""
