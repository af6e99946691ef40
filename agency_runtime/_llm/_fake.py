"""The offline fake provider: ``fake/...`` models answered in-process, without litellm.

It powers ``AGENCY_MODEL=fake/echo``, the demo and the test suite, so it is production code;
:mod:`agency_runtime.testing` re-exports its public names. The registry
(:mod:`._registry`) routes every ``fake/<name>`` model to :data:`PROVIDER`, which answers
at the seam with no network and **without importing litellm**:

* ``fake/echo`` (built in): replies with the text of the last user message; when the request
  carries a JSON-schema response format it replies with a JSON document generated from the
  schema that validates against it, like pydantic-ai's ``TestModel``.
* ``fake/json`` (built in): the same, but replies ``{}`` when the request has no schema.
* a :class:`FakeModel` you registered: scripted replies, a reply function, latency,
  transient or permanent failures; every request it receives is recorded in ``.calls``
  (embedding requests in ``.embed_calls``).

A scripted reply (or a reply function's result) is a text, a dict (sent as JSON text), an
exception (raised), a :class:`FakeToolCall` or a list of them (the model calls those tools
instead of answering: the response has ``tool_calls`` and the text ``""``), or a
:class:`FakeStream` (a text streamed as exactly its chunks, ``delay`` seconds apart). The
built-in models never call tools on their own, even when the request offers some.

Usage and cost are deterministic: ``prompt_tokens`` is the number of whitespace-separated
words over all message contents plus one per message, ``completion_tokens`` the number of
words in the reply, plus the words of each tool call's name and JSON arguments (at least 1),
and the cost is ``prompt_tokens * input_cost_per_token +
completion_tokens * output_cost_per_token`` (default prices 1e-6 and 2e-6 USD a token).
Embeddings are bag-of-words hash vectors (:data:`EMBEDDING_DIMENSIONS` wide, unit length),
so texts sharing words are close; they cost ``input_cost_per_token`` for each word of the
texts plus one per text.

A failure at the seam is a :class:`~._provider.ProviderError` whose ``kind`` is the
``failure`` asked for (``rate_limit``, ``timeout``, ``server`` and ``connection`` are
transient; ``bad_request`` is not). A scripted exception is raised as it is (a
``ProviderError`` keeps its ``transient``; a litellm exception is classified as litellm's
would be; a ``TimeoutError`` or ``ConnectionError`` is transient; anything else is
permanent). :class:`FakeModelExhausted` is permanent.

**Through litellm.** Importing this module adds a litellm load hook (see
:mod:`._fake_litellm`): when anything loads litellm, ``fake`` is installed as a litellm
custom provider and every fake model is priced with ``litellm.register_model``, so
``litellm.acompletion(model="fake/<name>", ...)`` is answered by the same models, with
litellm's own exceptions for failures. ``FakeModel(..., via_litellm=True)`` makes
``agency.llm`` itself go that way (through the litellm provider and litellm's real code),
for tests of the litellm path. Tool calls and :class:`FakeStream` chunks come out of
litellm as they would from a real provider (``message.tool_calls``; streamed
``delta.tool_calls``), so the litellm provider's own parsing is what the test exercises.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import inspect
import json
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, get_args

import anyio
import anyio.lowlevel
from pydantic import SecretStr

from .._errors import AgencyError
from ._litellm import LITELLM_PROVIDER, add_load_hook, litellm_error, litellm_module
from ._provider import (
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
    ToolCall,
    Usage,
    json_schema_format,
)

__all__ = [
    "EMBEDDING_DIMENSIONS",
    "FAKE_PROVIDER",
    "PROVIDER",
    "FakeModel",
    "FakeModelExhausted",
    "FakeProvider",
    "FakeRequest",
    "FakeStream",
    "FakeToolCall",
    "fake_embedding",
    "fake_provider_installed",
    "reset",
]

FAKE_PROVIDER = "fake"
"""The provider prefix of every fake model: ``model="fake/<name>"``."""

EMBEDDING_DIMENSIONS = 64
"""The length of a fake embedding vector."""

FailureKind = Literal["rate_limit", "timeout", "server", "connection", "bad_request"]
_FAILURE_KINDS: tuple[str, ...] = get_args(FailureKind)


_BUILTIN_NAMES = ("echo", "json")
_MAX_SCHEMA_DEPTH = 12
_CALL_FUNCTION = object()  # FakeModel._plan's answer: "call the reply function"

_lock = threading.RLock()
_registry: dict[str, FakeModel] = {}
_builtins: dict[str, FakeModel] = {}


class FakeModelExhausted(AssertionError):
    """A scripted :class:`FakeModel` was called more often than it had replies for.

    At the seam it is a permanent failure (``agency.llm`` raises ``LLMCallError`` from it,
    with no retry). Inside a litellm call it is raised as an instance of a subclass that is
    also a ``litellm.BadRequestError`` (not transient, so no retry loop hides it).
    """


@dataclass(frozen=True, slots=True, init=False)
class FakeToolCall:
    """A scripted tool call: the fake model calls tool ``name`` with ``arguments``.

    ``arguments`` is a dict (sent as its JSON text) or the JSON text itself (sent as it is,
    so a test can script invalid JSON too). ``id`` is the call's id; by default it is
    ``f"call_{index}_{n}"``: the model's 0-based call index, then the call's position in
    the response, so ids are deterministic and unique across one model's responses.

    A reply of one ``FakeToolCall``, or a list of them (several calls in one response),
    makes the response carry those ``tool_calls`` with the text ``""``.
    """

    name: str
    arguments: dict[str, Any] | str
    id: str | None

    def __init__(
        self, name: str, arguments: dict[str, Any] | str | None = None, id: str | None = None
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"FakeToolCall name must be a str, got {type(name).__name__}")
        if not name.strip():
            raise ValueError("FakeToolCall name must be a non-empty string, e.g. 'get_weather'")
        if arguments is None:
            arguments = {}
        if isinstance(arguments, dict):
            try:
                json.dumps(arguments)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"FakeToolCall {name!r}: arguments must be JSON-serializable: {exc}"
                ) from None
            arguments = dict(arguments)
        elif not isinstance(arguments, str):
            raise TypeError(
                f"FakeToolCall {name!r}: arguments must be a dict or a JSON str, "
                f"got {type(arguments).__name__}"
            )
        if id is not None and (not isinstance(id, str) or not id):
            raise ValueError(f"FakeToolCall {name!r}: id must be a non-empty str or None")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "arguments", arguments)
        object.__setattr__(self, "id", id)

    @property
    def arguments_json(self) -> str:
        """The arguments as the model sends them: JSON text."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)

    def to_tool_call(self, default_id: str) -> ToolCall:
        """The seam's :class:`~._provider.ToolCall` (``default_id`` when :attr:`id` is unset)."""
        return ToolCall(id=self.id or default_id, name=self.name, arguments=self.arguments_json)


@dataclass(frozen=True, slots=True, init=False)
class FakeStream:
    """A scripted text answer streamed as exactly ``chunks``, ``delay`` seconds apart.

    A stream yields one text delta per chunk, in order, sleeping ``delay`` seconds
    (``anyio.sleep``: cancellable) between two chunks; an empty chunk sends no delta. A
    non-streaming call answers the joined text at once (only ``latency`` is waited).
    """

    chunks: tuple[str, ...]
    delay: float

    def __init__(self, chunks: Sequence[str], delay: float = 0.0) -> None:
        if isinstance(chunks, str | bytes) or not isinstance(chunks, Sequence):
            raise TypeError("FakeStream chunks must be a sequence of str, e.g. ['Hel', 'lo']")
        if not all(isinstance(chunk, str) for chunk in chunks):
            raise TypeError("FakeStream chunks must all be str")
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise ValueError(f"FakeStream delay must be a number >= 0, got {delay!r}")
        object.__setattr__(self, "chunks", tuple(chunks))
        object.__setattr__(self, "delay", float(delay))

    @property
    def text(self) -> str:
        """The whole answer: the chunks joined."""
        return "".join(self.chunks)


Reply = str | dict[str, Any] | FakeToolCall | Sequence[FakeToolCall] | FakeStream
"""What a scripted reply (or a reply function's result) may be; an exception is raised."""
ReplyFunction = Callable[["FakeRequest"], "Reply | BaseException | Awaitable[Reply]"]
"""A reply function: gets the :class:`FakeRequest`, returns (or awaits to) a reply."""


@dataclass(frozen=True, slots=True)
class FakeAnswer:
    """A fake model's answer, as both paths (the seam, litellm) send it."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    chunks: tuple[str, ...] | None = None
    """The stream's chunks (:class:`FakeStream`), or ``None``: the text word by word."""
    delay: float = 0.0
    """Seconds between two streamed chunks."""

    def pieces(self) -> list[str]:
        """The stream's text deltas, in order (no empty ones)."""
        if self.chunks is not None:
            return [chunk for chunk in self.chunks if chunk]
        return _pieces(self.text)


@dataclass
class FakeRequest:
    """One request a fake model received (at the seam, or through litellm)."""

    model: str
    """The model as the caller named it: ``"fake/<name>"``."""
    messages: list[dict[str, Any]]
    """The chat messages, as the provider received them."""
    response_format: Any | None
    """The response format the provider received (a pydantic class arrives as
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``)."""
    max_tokens: int | None
    """``max_tokens`` if the caller set it."""
    timeout: float | None
    """The request timeout in seconds, if any."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Every other optional parameter the provider received through litellm (temperature,
    seed, ...)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The tools the request offered, in the OpenAI shape (``{"type": "function",
    "function": {"name", "description", "parameters"}}``); ``[]`` when none."""
    tool_choice: str | dict[str, Any] | None = None
    """The ``tool_choice`` the request carried: ``"auto"`` with tools unless the model's
    options chose, ``"none"`` on a last round that must answer, ``None`` without tools."""
    params: dict[str, Any] = field(default_factory=dict)
    """The request's provider keyword arguments at the seam: an ``agency.Model``'s
    ``temperature``, ``seed``, ``top_p`` and ``options`` (``{}`` when none)."""
    api_base: str | None = None
    """The endpoint the request was sent to (a model's ``api_base``), if any."""
    api_key: SecretStr | None = field(default=None, repr=False)
    """The key the request carried (a ``SecretStr``: shown as ``'**********'``), if any."""

    @property
    def has_api_key(self) -> bool:
        """Whether the request carried an api_key."""
        return self.api_key is not None


class _Errors(Protocol):
    """How a path (the seam, or litellm) reports a fake model's failures."""

    def failure(self, model: FakeModel, index: int) -> BaseException: ...

    def exhausted(self, model: FakeModel, message: str) -> BaseException: ...


class FakeModel:
    """A scripted, offline chat model answering ``fake/<name>``.

    Like pydantic-ai's ``TestModel``/``FunctionModel``: give ``replies`` (answered in order;
    a dict is sent as JSON text, an exception instance is raised, a :class:`FakeToolCall`
    or a list of them calls tools, a :class:`FakeStream` streams its chunks) or a
    ``function`` that gets a :class:`FakeRequest` and returns the reply (sync or async).
    With neither, the model echoes the last user message, or generates JSON for a requested
    schema (it never calls tools on its own).

    The first ``fail_times`` calls fail with ``failure``: ``"rate_limit"``, ``"timeout"``,
    ``"server"``, ``"connection"`` (all transient) or ``"bad_request"`` (permanent) — at the
    seam a :class:`~agency_runtime._llm._provider.ProviderError` of that ``kind``; through
    litellm ``litellm.RateLimitError``, ``litellm.Timeout``, ``litellm.InternalServerError``,
    ``litellm.APIConnectionError`` or ``litellm.BadRequestError``. (Embedding requests count
    their own ``fail_times``.) ``latency`` seconds pass before each answer (``anyio.sleep``
    on the async path, so it is cancellable). Prices are per token, in US dollars.

    ``via_litellm=True`` sends ``agency.llm``'s requests for this model through the litellm
    provider (so litellm's real code runs: it is imported); by default they are answered at
    the seam and litellm is never imported.

    Call :meth:`register` (or use ``with FakeModel(...) as fake:``) to make it reachable.

    A ``replies`` script belongs to the process: each call this process makes takes the next
    reply, and a model registered in another process starts at the first. A run that goes
    on elsewhere (``agency runs respond``, a resume after a crash, a worker) meets that
    process's model; for such a run give ``function=``, which decides from the request (the
    messages so far) as a real model does, so every process answers alike.
    """

    def __init__(
        self,
        name: str = "scripted",
        *,
        replies: Sequence[Reply | BaseException] | None = None,
        function: ReplyFunction | None = None,
        latency: float = 0.0,
        fail_times: int = 0,
        failure: FailureKind = "rate_limit",
        input_cost_per_token: float = 1e-6,
        output_cost_per_token: float = 2e-6,
        via_litellm: bool = False,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("FakeModel name must be a non-empty string, e.g. FakeModel('planner')")
        if name.startswith(f"{FAKE_PROVIDER}/"):
            name = name[len(FAKE_PROVIDER) + 1 :]
        if isinstance(replies, str | bytes):
            raise TypeError("FakeModel replies must be a sequence of replies, not one string")
        if latency < 0:
            raise ValueError(f"FakeModel latency must be >= 0, got {latency!r}")
        if fail_times < 0:
            raise ValueError(f"FakeModel fail_times must be >= 0, got {fail_times!r}")
        if failure not in _FAILURE_KINDS:
            raise ValueError(
                f"FakeModel failure must be one of {', '.join(_FAILURE_KINDS)}; got {failure!r}"
            )
        self.name = name
        self.replies: tuple[Reply | BaseException, ...] | None = (
            None if replies is None else tuple(replies)
        )
        for reply in self.replies or ():
            if isinstance(reply, list | tuple):
                _tool_calls_of(self, reply)  # fail now, not at the call
        self.function = function
        self.latency = float(latency)
        self.fail_times = fail_times
        self.failure: FailureKind = failure
        self.input_cost_per_token = float(input_cost_per_token)
        self.output_cost_per_token = float(output_cost_per_token)
        self.via_litellm = bool(via_litellm)
        self.calls: list[FakeRequest] = []
        """Every chat request this model received, in order (failed ones too)."""
        self.embed_calls: list[list[str]] = []
        """The texts of every embedding request this model received, in order."""
        self._builtin: str | None = None
        self._served = 0
        self._embedded = 0
        self._call_lock = threading.Lock()

    @property
    def model(self) -> str:
        """The model string: ``"fake/<name>"``."""
        return f"{FAKE_PROVIDER}/{self.name}"

    def __repr__(self) -> str:
        return f"FakeModel({self.name!r}, calls={len(self.calls)})"

    def cost(self, usage: Usage) -> float:
        """What ``usage`` costs at this model's prices, in US dollars."""
        prompt = usage.prompt_tokens * self.input_cost_per_token
        completion = usage.completion_tokens * self.output_cost_per_token
        return prompt + completion

    # -- registration -------------------------------------------------------------------

    def register(self) -> FakeModel:
        """Make this model answer ``fake/<name>`` process-wide (replacing an earlier one)."""
        with _lock:
            _registry[self.name] = self
        module = litellm_module()
        if module is not None:
            from ._fake_litellm import register_price

            register_price(module, self)
        return self

    def unregister(self) -> None:
        """Stop answering ``fake/<name>`` (a no-op if another model replaced this one)."""
        with _lock:
            if _registry.get(self.name) is self:
                del _registry[self.name]

    def __enter__(self) -> FakeModel:
        return self.register()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unregister()

    # -- answering ------------------------------------------------------------------------

    def _record(self, request: FakeRequest) -> int:
        """Record the request; its 0-based call index."""
        with self._call_lock:
            self.calls.append(request)
            index = self._served
            self._served += 1
        return index

    def _plan(self, index: int, request: FakeRequest, errors: _Errors) -> object:
        """The answer to call ``index``: a reply, or :data:`_CALL_FUNCTION`.

        Raises the scripted failure, or :class:`FakeModelExhausted`.
        """
        if index < self.fail_times:
            raise errors.failure(self, index)
        if self.function is not None:
            return _CALL_FUNCTION
        if self.replies is None:
            return _default_reply(self, request)
        position = index - self.fail_times
        if position >= len(self.replies):
            raise errors.exhausted(self, _exhausted_message(self, position, index))
        return self.replies[position]

    def answer_sync(self, request: FakeRequest, errors: _Errors) -> FakeAnswer:
        """Answer ``request`` (recorded in :attr:`calls`); for the litellm adapter's sync path."""
        index = self._record(request)
        if self.latency:
            time.sleep(self.latency)
        plan = self._plan(index, request, errors)
        if plan is _CALL_FUNCTION and self.function is not None:
            result: object = self.function(request)
            if inspect.isawaitable(result):
                result = _run_awaitable(result)
            plan = result
        return _as_answer(self, plan, index)

    async def answer(self, request: FakeRequest, errors: _Errors) -> FakeAnswer:
        """Answer ``request`` (recorded in :attr:`calls`), raising failures as ``errors`` make
        them: the seam's provider errors, or litellm's exceptions for the litellm adapter."""
        index = self._record(request)
        if self.latency:
            await anyio.sleep(self.latency)
        plan = self._plan(index, request, errors)
        if plan is _CALL_FUNCTION and self.function is not None:
            result = self.function(request)
            if inspect.isawaitable(result):
                result = await result
            plan = result
        return _as_answer(self, plan, index)

    async def embed_texts(self, texts: list[str], errors: _Errors) -> list[list[float]]:
        """Embed ``texts`` (recorded in :attr:`embed_calls`), failing as ``errors`` make it."""
        with self._call_lock:
            self.embed_calls.append(list(texts))
            index = self._embedded
            self._embedded += 1
        if self.latency:
            await anyio.sleep(self.latency)
        if index < self.fail_times:
            raise errors.failure(self, index)
        return [fake_embedding(text) for text in texts]

    def _clear(self) -> None:
        with self._call_lock:
            self.calls.clear()
            self.embed_calls.clear()
            self._served = 0
            self._embedded = 0


async def _await(awaitable: Awaitable[object]) -> object:
    return await awaitable


def _run_awaitable(awaitable: Awaitable[object]) -> object:
    """Run an async reply function's result from the sync path (sync ``litellm.completion``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(_await, awaitable)
    # A loop is running in this thread (sync completion called from async code): use another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, _await, awaitable).result()


def _tool_calls_of(model: FakeModel, reply: Sequence[object]) -> list[FakeToolCall]:
    """A list reply's tool calls (it must be a non-empty list of :class:`FakeToolCall`)."""
    if not reply:
        raise ValueError(
            f"FakeModel {model.model!r}: a list reply is tool calls, and this one is empty"
        )
    calls: list[FakeToolCall] = []
    for item in reply:
        if not isinstance(item, FakeToolCall):
            raise TypeError(
                f"FakeModel {model.model!r}: a list reply must hold FakeToolCall items only; "
                f"got {type(item).__name__}"
            )
        calls.append(item)
    return calls


def _as_answer(model: FakeModel, reply: object, index: int) -> FakeAnswer:
    """``reply`` (a scripted one, or a reply function's) as the answer to call ``index``."""
    if isinstance(reply, BaseException):
        raise reply
    if isinstance(reply, str):
        return FakeAnswer(reply)
    if isinstance(reply, dict):
        return FakeAnswer(json.dumps(reply))
    if isinstance(reply, FakeStream):
        return FakeAnswer(reply.text, chunks=reply.chunks, delay=reply.delay)
    if isinstance(reply, FakeToolCall):
        reply = [reply]
    if isinstance(reply, list | tuple):
        calls = _tool_calls_of(model, reply)
        return FakeAnswer(
            "", tool_calls=tuple(c.to_tool_call(f"call_{index}_{n}") for n, c in enumerate(calls))
        )
    raise TypeError(
        f"FakeModel {model.model!r}: a reply must be a str, a dict, a FakeToolCall, a list of "
        f"FakeToolCall, a FakeStream or an exception; got {type(reply).__name__}"
    )


def _exhausted_message(model: FakeModel, position: int, index: int) -> str:
    count = len(model.replies or ())
    return (
        f"fake model {model.model!r} has no reply left: it was given {count} "
        f"{'reply' if count == 1 else 'replies'} and this is reply request {position + 1} "
        f"(call {index + 1}); add replies or use function="
    )


def _failure_message(model: FakeModel, index: int) -> str:
    return (
        f"fake model {model.model!r}: scripted {model.failure} failure "
        f"{index + 1} of {model.fail_times}"
    )


def fake_provider_installed() -> bool:
    """Whether the ``fake`` provider has been installed into litellm (litellm is loaded)."""
    from ._fake_litellm import installed

    return installed()


def reset() -> None:
    """Unregister every non-built-in :class:`FakeModel` and clear the built-ins' call lists.

    Handy in a pytest fixture: ``@pytest.fixture(autouse=True)`` that yields, then resets.
    """
    with _lock:
        _registry.clear()
        for model in _builtins.values():
            model._clear()


def _make_builtin(name: str) -> FakeModel:
    model = FakeModel(name)
    model._builtin = name
    return model


for _name in _BUILTIN_NAMES:
    _builtins[_name] = _make_builtin(_name)


def _lookup(name: str) -> FakeModel | None:
    with _lock:
        return _registry.get(name) or _builtins.get(name)


def _known_names() -> list[str]:
    with _lock:
        return sorted({*_registry, *_builtins})


def models() -> list[FakeModel]:
    """Every fake model that answers now: the built-ins, then the registered ones."""
    with _lock:
        return [*_builtins.values(), *_registry.values()]


def _name_of(model: str) -> str:
    prefix = f"{FAKE_PROVIDER}/"
    return model[len(prefix) :] if model.startswith(prefix) else model


def not_found_message(name: str) -> str:
    """What a request for the unregistered ``fake/<name>`` is told."""
    known = ", ".join(f"{FAKE_PROVIDER}/{n}" for n in _known_names())
    return (
        f"no fake model {FAKE_PROVIDER}/{name} is registered; registered fake models: "
        f"{known}. Register one with agency_runtime.testing.FakeModel({name!r}).register()"
    )


# -- replies without a script: echo and schema-driven JSON ------------------------------------


def _default_reply(model: FakeModel, request: FakeRequest) -> str:
    schema = _schema_of(request.response_format)
    if schema is not None:
        return json.dumps(_sample(schema, schema, 0))
    if model._builtin == "json":
        return "{}"
    return _last_user_text(request.messages)


def _field(message: object, key: str) -> object:
    if isinstance(message, dict):
        return message.get(key)
    return getattr(message, key, None)


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if _field(message, "role") == "user":
            return "\n".join(_text_parts(_field(message, "content")))
    return ""


def _text_parts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return parts
    return []


def _schema_of(response_format: object) -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for, or ``None``."""
    if response_format is None:
        return None
    if isinstance(response_format, type):
        model_json_schema = getattr(response_format, "model_json_schema", None)
        if callable(model_json_schema):
            schema = model_json_schema()
            return schema if isinstance(schema, dict) else None
        return None
    if not isinstance(response_format, dict):
        return None
    json_schema = response_format.get("json_schema")
    if isinstance(json_schema, dict):
        schema = json_schema.get("schema")
        if isinstance(schema, dict):
            return schema
    schema = response_format.get("schema")
    if isinstance(schema, dict):
        return schema
    return None


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for token in ref.lstrip("#").strip("/").split("/"):
        if not token:
            continue
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or token not in node:
            return {}
        node = node[token]
    return node if isinstance(node, dict) else {}


def _is_null(schema: object) -> bool:
    return isinstance(schema, dict) and (schema.get("type") == "null" or schema == {"const": None})


_STRING_FORMATS: dict[str, str] = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "duration": "PT1S",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
}


def _sample(schema: dict[str, Any], root: dict[str, Any], depth: int) -> Any:
    """A JSON value that validates against ``schema`` (simple, deterministic choices)."""
    if depth > _MAX_SCHEMA_DEPTH:
        return None
    if isinstance(schema.get("$ref"), str):
        merged = {
            **_resolve(schema["$ref"], root),
            **{k: v for k, v in schema.items() if k != "$ref"},
        }
        return _sample(merged, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            chosen = next((b for b in branches if not _is_null(b)), None)
            if chosen is None:
                return None
            return _sample(chosen, root, depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        values = [
            _sample(part, root, depth + 1) for part in schema["allOf"] if isinstance(part, dict)
        ]
        if values and all(isinstance(v, dict) for v in values):
            combined: dict[str, Any] = {}
            for value in values:
                combined.update(value)
            return combined
        return values[0] if values else None
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        if "properties" in schema:
            kind = "object"
        elif "items" in schema or "prefixItems" in schema:
            kind = "array"
        else:
            kind = "string"
    if kind == "string":
        return _sample_string(schema)
    if kind == "integer":
        return int(_sample_number(schema, 1))
    if kind == "number":
        return float(_sample_number(schema, 1.0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "array":
        return _sample_array(schema, root, depth)
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {
            name: _sample(sub if isinstance(sub, dict) else {}, root, depth + 1)
            for name, sub in properties.items()
        }
    return "text"


def _sample_string(schema: dict[str, Any]) -> str:
    fmt = schema.get("format")
    text = _STRING_FORMATS.get(fmt, "text") if isinstance(fmt, str) else "text"
    min_length = schema.get("minLength")
    if isinstance(min_length, int) and len(text) < min_length:
        text = (text * (min_length // len(text) + 1))[:min_length]
    max_length = schema.get("maxLength")
    if isinstance(max_length, int) and len(text) > max_length:
        text = text[:max_length]
    return text


def _sample_number(schema: dict[str, Any], default: float) -> float:
    value = default
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    ex_min, ex_max = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(minimum, int | float) and value < minimum:
        value = minimum
    if isinstance(ex_min, int | float) and value <= ex_min:
        value = ex_min + 1
    if isinstance(maximum, int | float) and value > maximum:
        value = maximum
    if isinstance(ex_max, int | float) and value >= ex_max:
        value = ex_max - 1
    return value


def _sample_array(schema: dict[str, Any], root: dict[str, Any], depth: int) -> list[Any]:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list):
        return [_sample(p if isinstance(p, dict) else {}, root, depth + 1) for p in prefix]
    items = schema.get("items")
    if not isinstance(items, dict):
        return []
    max_items = schema.get("maxItems")
    min_items = schema.get("minItems")
    count = 1
    if isinstance(min_items, int):
        count = max(count, min_items)
    if isinstance(max_items, int):
        count = min(count, max_items)
    if depth >= _MAX_SCHEMA_DEPTH // 2 and not (isinstance(min_items, int) and min_items > 0):
        count = 0  # a recursive schema: stop growing the document
    return [_sample(items, root, depth + 1) for _ in range(count)]


# -- usage, cost and embeddings -----------------------------------------------------------------


def _count_words(text: str) -> int:
    return len(text.split())


def prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    """The fake ``prompt_tokens`` of ``messages``: their words plus one per message."""
    return sum(
        1 + sum(_count_words(part) for part in _text_parts(_field(message, "content")))
        for message in messages
    )


def chat_usage(
    messages: Sequence[dict[str, Any]], reply: str, tool_calls: Sequence[ToolCall] = ()
) -> Usage:
    """The fake usage of answering ``messages`` with ``reply`` (and ``tool_calls``): the
    completion counts the reply's words, and each call's name and JSON arguments' words."""
    completion = _count_words(reply) + sum(
        _count_words(call.name) + _count_words(call.arguments) for call in tool_calls
    )
    return Usage.of(prompt_tokens(messages), max(1, completion))


def embed_usage(texts: Sequence[str]) -> Usage:
    """The fake usage of embedding ``texts``: their words plus one per text."""
    return Usage.of(sum(1 + _count_words(text) for text in texts))


_WORD = re.compile(r"[^\W_]+")


def fake_embedding(text: str) -> list[float]:
    """A deterministic bag-of-words vector of ``text`` (unit length; all zeros for no words).

    Each word (case-folded) adds ±1 at a position chosen by its hash, so texts that share
    words have a high cosine similarity and unrelated texts one near 0.
    """
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for word in _WORD.findall(text.casefold()):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        position = int.from_bytes(digest[:4], "big") % EMBEDDING_DIMENSIONS
        vector[position] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


# -- the provider at the seam -----------------------------------------------------------------


class _SeamErrors:
    """Failures at the seam: :class:`ProviderError` and plain :class:`FakeModelExhausted`."""

    def failure(self, model: FakeModel, index: int) -> BaseException:
        kind: ErrorKind = model.failure
        return ProviderError(
            _failure_message(model, index), kind=kind, model=model.model, provider=FAKE_PROVIDER
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
    name = _name_of(model)
    found = _lookup(name)
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


def _pieces(text: str) -> list[str]:
    """``text`` in stream-sized pieces (words with their trailing space), in order."""
    return re.findall(r"\s*\S+\s*|\s+", text) or ([text] if text else [])


class FakeProvider:
    """The :class:`~._provider.ChatProvider` of ``fake/...`` models (no litellm, no network).

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
            text=answer.text, usage=usage, cost=fake.cost(usage), tool_calls=answer.tool_calls
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


def _install_into_litellm(module: Any) -> None:
    from ._fake_litellm import install

    install(module)


add_load_hook(_install_into_litellm)
