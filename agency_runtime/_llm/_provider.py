"""The provider seam: what the LLM layer asks of a model provider, in our own shapes.

``agency.llm`` (and memory's embeddings) never talk to a provider library directly: they
build a :class:`ChatRequest` or an :class:`EmbedRequest` and hand it to the
:class:`ChatProvider` that the registry (:mod:`._registry`) picks for the model string.
litellm is the default provider (:class:`~._litellm.LiteLLMProvider`); ``fake/...`` models
are answered in-process by the fake provider (:mod:`agency_runtime._fakes`, a package above
this layer that answers through this seam), without importing litellm.

A provider answers with :class:`ChatResponse` (text, :class:`Usage`, cost in US dollars or
``None`` when unknown), streams :class:`TextDelta` events then one :class:`StreamEnd`, and
embeds into :class:`EmbedResponse`. It reports a failure as a :class:`ProviderError` that
says whether it is transient (timeouts, 429, 5xx, dropped connections), raised ``from`` the
provider library's own exception; the seam's caller (``_retries``) retries transient ones with
capped backoff and turns the rest into :class:`~agency_runtime.LLMCallError`, chaining the
original. Cancellation is never mapped: anyio's cancellation exception passes through.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, SecretStr

from .._errors import TRANSIENT_KINDS, ErrorKind, ProviderError

__all__ = [
    "DEFAULT_TIMEOUT",
    "TRANSIENT_KINDS",
    "ChatProvider",
    "ChatRequest",
    "ChatResponse",
    "EmbedRequest",
    "EmbedResponse",
    "ErrorKind",
    "ProviderError",
    "StreamEnd",
    "StreamEvent",
    "TextDelta",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "json_schema_format",
]

DEFAULT_TIMEOUT = 120.0
"""Seconds one provider request may take (litellm's own default is 6000 s)."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one request consumed, as the provider counted them."""

    prompt_tokens: int = 0
    """Tokens of the input (messages, or the texts embedded)."""
    completion_tokens: int = 0
    """Tokens of the answer (0 for embeddings)."""
    total_tokens: int = 0
    """All tokens billed for the request (providers may count it on its own)."""

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int = 0) -> Usage:
        """A usage whose total is the sum of its parts."""
        return cls(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: its name, what it does, and its arguments' JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    """A JSON schema of type ``object`` for the call's arguments."""

    def to_openai(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` form providers accept."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call of a tool the model asked for, as it sent it."""

    id: str
    """The provider's id of the call (tool results name it)."""
    name: str
    arguments: str
    """The JSON text of the arguments, as the model wrote it (it may not be valid)."""

    def to_openai(self) -> dict[str, Any]:
        """The assistant message's ``tool_calls`` item providers accept back."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat completion to ask a provider for."""

    model: str
    """The provider's model string (``"openai/gpt-4o-mini"``, ``"fake/echo"``): an
    ``agency.Model``'s ``model``, never its name."""
    messages: list[dict[str, Any]]
    """The chat messages (``{"role", "content"}`` dicts); a provider must not mutate them."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds the request may take (always explicit: provider defaults are far too long)."""
    max_tokens: int | None = None
    """The most tokens the answer may have, if the caller set a limit."""
    response_format: type[BaseModel] | None = None
    """The pydantic model the answer must be a JSON document of, sent as a JSON-schema
    response format. The caller sets it only when the model says its endpoint takes one
    (``agency.Model(..., json_schema=True)``) or, when the model does not say,
    :meth:`ChatProvider.supports_schema` said yes; otherwise the schema travels as an
    instruction in ``messages``."""
    tools: tuple[ToolSpec, ...] = ()
    """Tools the model may call instead of answering (none: a plain completion)."""
    tool_choice: str | dict[str, Any] | None = None
    """How the model may use ``tools`` when the runtime decides it (``"none"``: a last round
    that must answer in text); ``None``: the model's own choice (see
    :attr:`chosen_tool_choice`)."""
    api_base: str | None = None
    """The endpoint's base URL, when the model has its own (``None``: the provider's default)."""
    api_key: SecretStr | None = field(default=None, repr=False)
    """The key to send, when the model has its own (``None``: the provider's default). A
    provider sends ``api_key.get_secret_value()`` and never shows it."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """More keyword arguments for the provider: ``temperature``, ``seed``, ``top_p`` and the
    model's ``options`` (JSON data), when set."""

    @property
    def chosen_tool_choice(self) -> str | dict[str, Any] | None:
        """The ``tool_choice`` the request carries: ``None`` without tools; with tools the
        request's own :attr:`tool_choice`, else the one the model's options (``params``) set,
        else ``"auto"``. (Some servers, llama-cpp-python's among them, leave the tools out of
        the prompt when a request names no ``tool_choice``.)"""
        if not self.tools:
            return None
        if self.tool_choice is not None:
            return self.tool_choice
        chosen = self.params.get("tool_choice")
        return "auto" if chosen is None else chosen


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """A provider's answer to a :class:`ChatRequest`."""

    text: str
    """The answer's text (``""`` when the provider sent no text)."""
    usage: Usage = field(default_factory=Usage)
    """Tokens the request consumed."""
    cost: float | None = None
    """What the request cost in US dollars, or ``None`` when the provider cannot say."""
    model: str | None = None
    """The model that answered, as the provider reports it."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tools the model called (its turn then has ``text`` as an optional note)."""
    response_id: str | None = None
    """The provider's id of this response, when it gives one."""
    finish_reasons: tuple[str, ...] = ()
    """Why each choice ended (``stop``, ``length``, ``tool_calls``, ...), when known."""
    raw: Any = field(default=None, repr=False, compare=False)
    """The provider library's own response object, for debugging (never journaled)."""


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of a streamed answer, in order."""

    text: str


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The last event of a stream: the whole answer's text, usage and cost."""

    text: str
    """The whole answer (the concatenation of the deltas)."""
    usage: Usage = field(default_factory=Usage)
    cost: float | None = None
    """US dollars, or ``None`` when unknown."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tools the model called, assembled from the stream's pieces."""
    model: str | None = None
    """The model that answered, as the provider reports it."""
    response_id: str | None = None
    """The provider's id of this response, when it gives one."""
    finish_reasons: tuple[str, ...] = ()
    """Why each choice ended, when known."""
    raw: Any = field(default=None, repr=False, compare=False)


StreamEvent = TextDelta | StreamEnd
"""What :meth:`ChatProvider.stream` yields: text deltas, then exactly one :class:`StreamEnd`."""


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """Texts to turn into embedding vectors."""

    model: str
    texts: list[str]
    timeout: float = DEFAULT_TIMEOUT
    api_base: str | None = None
    """The endpoint's base URL, when the model has its own."""
    api_key: SecretStr | None = field(default=None, repr=False)
    """The key to send, when the model has its own (never shown)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """More keyword arguments for the provider (the model's ``options``)."""


@dataclass(frozen=True, slots=True)
class EmbedResponse:
    """One vector per text of the request, in the request's order."""

    vectors: list[list[float]]
    usage: Usage = field(default_factory=Usage)
    cost: float | None = None
    """US dollars, or ``None`` when unknown."""
    raw: Any = field(default=None, repr=False, compare=False)


@runtime_checkable
class ChatProvider(Protocol):
    """What the LLM layer needs from a model provider.

    Implementations raise :class:`ProviderError` for provider failures (with ``transient``
    set right), let cancellation through, and never retry on their own: the seam does.
    """

    @property
    def name(self) -> str:
        """A short name for logs and errors (``"litellm"``, ``"fake"``)."""
        ...

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Answer one chat request."""
        ...

    def stream(self, request: ChatRequest) -> AsyncIterator[StreamEvent]:
        """Answer one chat request as :class:`TextDelta` events, then one :class:`StreamEnd`."""
        ...

    async def embed(self, request: EmbedRequest) -> EmbedResponse:
        """Embed the request's texts (one vector each, in order)."""
        ...

    async def supports_schema(self, model: str) -> bool:
        """Whether ``model`` accepts a JSON-schema ``response_format``.

        When it does not, the caller puts the schema in the prompt instead.
        """
        ...


def json_schema_format(output: type[BaseModel]) -> dict[str, Any]:
    """``output`` as an OpenAI-style JSON-schema response format (what litellm sends)."""
    return {
        "type": "json_schema",
        "json_schema": {
            "schema": output.model_json_schema(),
            "name": output.__name__,
            "strict": True,
        },
    }
