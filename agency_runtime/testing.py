"""An offline fake LLM provider for tests, registered with litellm as ``fake/...``.

Importing this module never imports litellm. It adds a load hook
(:func:`agency_runtime._llm._litellm.add_load_hook`), so the moment anything loads litellm the
``fake`` provider is installed as a litellm custom provider; if litellm is loaded already,
it is installed at once. After that, ``litellm.acompletion(model="fake/<name>", ...)`` (and
``agency.llm`` with ``model="fake/<name>"`` or ``AGENCY_MODEL=fake/<name>``) is answered
in-process, with no network, by:

* ``fake/echo`` (built in): replies with the text of the last user message; when the request
  carries a JSON-schema ``response_format`` (a pydantic class, or
  ``{"type": "json_schema", "json_schema": {"schema": {...}}}``) it replies with a JSON
  document generated from the schema that validates against it, like pydantic-ai's
  ``TestModel``.
* ``fake/json`` (built in): the same, but replies ``{}`` when the request has no schema.
* a :class:`FakeModel` you registered: scripted replies, a reply function, latency,
  transient or permanent failures; every request it receives is recorded in ``.calls``.

Usage and cost are deterministic: ``prompt_tokens`` is the number of whitespace-separated
words over all message contents plus one per message, ``completion_tokens`` the number of
words in the reply (at least 1), and each model is priced with ``litellm.register_model``,
so ``response._hidden_params["response_cost"]`` and ``litellm.completion_cost`` give
``prompt_tokens * input_cost_per_token + completion_tokens * output_cost_per_token``.

Example::

    from agency_runtime.testing import FakeModel

    with FakeModel("planner", replies=["first", {"answer": 42}]) as fake:
        ...  # code that calls litellm / agency.llm with model=fake.model ("fake/planner")
    assert len(fake.calls) == 2

litellm wraps any exception a provider raises that is not a litellm exception into
``litellm.APIConnectionError`` (the original is its ``__context__``). Script litellm
exceptions (or use ``fail_times``/``failure``) to simulate provider errors precisely.
:class:`FakeModelExhausted` is the exception: it is raised as a ``litellm.BadRequestError``
that is also a :class:`FakeModelExhausted`, so it reaches the caller unwrapped and is never
mistaken for a transient error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Literal, get_args

import anyio

from ._llm._litellm import add_load_hook, litellm_module

__all__ = [
    "FAKE_PROVIDER",
    "FakeModel",
    "FakeModelExhausted",
    "FakeRequest",
    "fake_provider_installed",
    "reset",
]

FAKE_PROVIDER = "fake"
"""The litellm provider prefix of every fake model: ``model="fake/<name>"``."""

_FailureKind = Literal["rate_limit", "timeout", "server", "connection", "bad_request"]
_FAILURE_KINDS: tuple[str, ...] = get_args(_FailureKind)

_Reply = str | dict[str, Any]
_ReplyFunction = Callable[["FakeRequest"], _Reply | Awaitable[_Reply]]

_BUILTIN_NAMES = ("echo", "json")
_MAX_SCHEMA_DEPTH = 12
_CALL_FUNCTION = object()  # FakeModel._plan's answer: "call the reply function"

_lock = threading.RLock()
_registry: dict[str, FakeModel] = {}
_builtins: dict[str, FakeModel] = {}
_installed = False
_exhausted_class: type[FakeModelExhausted] | None = None


class FakeModelExhausted(AssertionError):
    """A scripted :class:`FakeModel` was called more often than it had replies for.

    Inside a litellm call it is raised as an instance of a subclass that is also a
    ``litellm.BadRequestError`` (not transient, so no retry loop hides it).
    """


@dataclass
class FakeRequest:
    """One request a fake model received through litellm."""

    model: str
    """The model as the caller named it: ``"fake/<name>"``."""
    messages: list[dict[str, Any]]
    """The chat messages, as litellm passed them to the provider."""
    response_format: Any | None
    """The response format the provider received (a pydantic class arrives as
    ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``)."""
    max_tokens: int | None
    """``max_tokens`` if the caller set it."""
    timeout: float | None
    """The request timeout in seconds, if any."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Every other optional parameter the provider received (temperature, tools, ...)."""


class FakeModel:
    """A scripted, offline chat model served by litellm as ``fake/<name>``.

    Like pydantic-ai's ``TestModel``/``FunctionModel``: give ``replies`` (answered in order;
    a dict is sent as JSON text, an exception instance is raised) or a ``function`` that
    gets a :class:`FakeRequest` and returns the reply (sync or async). With neither, the
    model echoes the last user message, or generates JSON for a requested schema.

    The first ``fail_times`` calls raise the litellm exception for ``failure``:
    ``"rate_limit"`` → ``litellm.RateLimitError``, ``"timeout"`` → ``litellm.Timeout``,
    ``"server"`` → ``litellm.InternalServerError``, ``"connection"`` →
    ``litellm.APIConnectionError`` (all transient) or ``"bad_request"`` →
    ``litellm.BadRequestError`` (permanent). ``latency`` seconds pass before each answer
    (``anyio.sleep`` on the async path, so it is cancellable).

    Call :meth:`register` (or use ``with FakeModel(...) as fake:``) to make it reachable.
    """

    def __init__(
        self,
        name: str = "scripted",
        *,
        replies: Sequence[str | dict[str, Any] | BaseException] | None = None,
        function: _ReplyFunction | None = None,
        latency: float = 0.0,
        fail_times: int = 0,
        failure: _FailureKind = "rate_limit",
        input_cost_per_token: float = 1e-6,
        output_cost_per_token: float = 2e-6,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError("FakeModel name must be a non-empty string, e.g. FakeModel('planner')")
        if name.startswith(f"{FAKE_PROVIDER}/"):
            name = name[len(FAKE_PROVIDER) + 1 :]
        if isinstance(replies, (str, bytes)):
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
        self.replies: tuple[str | dict[str, Any] | BaseException, ...] | None = (
            None if replies is None else tuple(replies)
        )
        self.function = function
        self.latency = float(latency)
        self.fail_times = fail_times
        self.failure: _FailureKind = failure
        self.input_cost_per_token = float(input_cost_per_token)
        self.output_cost_per_token = float(output_cost_per_token)
        self.calls: list[FakeRequest] = []
        self._builtin: str | None = None
        self._served = 0
        self._call_lock = threading.Lock()

    @property
    def model(self) -> str:
        """The litellm model string: ``"fake/<name>"``."""
        return f"{FAKE_PROVIDER}/{self.name}"

    def __repr__(self) -> str:
        return f"FakeModel({self.name!r}, calls={len(self.calls)})"

    # -- registration -------------------------------------------------------------------

    def register(self) -> FakeModel:
        """Make this model answer ``fake/<name>`` process-wide (replacing an earlier one)."""
        with _lock:
            _registry[self.name] = self
        module = litellm_module()
        if module is not None:
            _register_price(module, self)
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

    def _plan(self, index: int, request: FakeRequest) -> object:
        """The answer to call ``index``: a reply, or :data:`_CALL_FUNCTION`.

        Raises the scripted failure, or :class:`FakeModelExhausted`.
        """
        if index < self.fail_times:
            raise _failure(self, index)
        if self.function is not None:
            return _CALL_FUNCTION
        if self.replies is None:
            return _default_reply(self, request)
        position = index - self.fail_times
        if position >= len(self.replies):
            raise _exhausted(self, position, index)
        return self.replies[position]

    def _answer_sync(self, request: FakeRequest) -> str:
        index = self._record(request)
        if self.latency:
            time.sleep(self.latency)
        plan = self._plan(index, request)
        if plan is _CALL_FUNCTION and self.function is not None:
            result = self.function(request)
            if inspect.isawaitable(result):
                result = _run_awaitable(result)
            plan = result
        return _as_text(self, plan)

    async def _answer_async(self, request: FakeRequest) -> str:
        index = self._record(request)
        if self.latency:
            await anyio.sleep(self.latency)
        plan = self._plan(index, request)
        if plan is _CALL_FUNCTION and self.function is not None:
            result = self.function(request)
            if inspect.isawaitable(result):
                result = await result
            plan = result
        return _as_text(self, plan)

    def _clear(self) -> None:
        with self._call_lock:
            self.calls.clear()
            self._served = 0


async def _await(awaitable: Awaitable[_Reply]) -> _Reply:
    return await awaitable


def _run_awaitable(awaitable: Awaitable[_Reply]) -> _Reply:
    """Run an async reply function's result from the sync path (sync ``litellm.completion``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(_await, awaitable)
    # A loop is running in this thread (sync completion called from async code): use another.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, _await, awaitable).result()


def _as_text(model: FakeModel, reply: object) -> str:
    if isinstance(reply, BaseException):
        raise reply
    if isinstance(reply, str):
        return reply
    if isinstance(reply, dict):
        return json.dumps(reply)
    raise TypeError(
        f"FakeModel {model.model!r}: a reply must be a str, a dict or an exception; "
        f"got {type(reply).__name__}"
    )


def fake_provider_installed() -> bool:
    """Whether the ``fake`` provider has been installed into litellm (litellm is loaded)."""
    return _installed


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
    if isinstance(minimum, (int, float)) and value < minimum:
        value = minimum
    if isinstance(ex_min, (int, float)) and value <= ex_min:
        value = ex_min + 1
    if isinstance(maximum, (int, float)) and value > maximum:
        value = maximum
    if isinstance(ex_max, (int, float)) and value >= ex_max:
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


# -- usage and cost -----------------------------------------------------------------------------


def _count_words(text: str) -> int:
    return len(text.split())


def _prompt_tokens(messages: Sequence[dict[str, Any]]) -> int:
    return sum(
        1 + sum(_count_words(part) for part in _text_parts(_field(message, "content")))
        for message in messages
    )


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


def _register_price(litellm: ModuleType, model: FakeModel) -> None:
    litellm.register_model({model.model: _price_entry(model)})


# -- litellm errors ------------------------------------------------------------------------------


def _litellm() -> Any:
    module = litellm_module()
    if module is None:  # pragma: no cover - the handler only runs once litellm is loaded
        raise RuntimeError("litellm is not loaded")
    return module


def _failure(model: FakeModel, index: int) -> BaseException:
    litellm = _litellm()
    message = (
        f"fake model {model.model!r}: scripted {model.failure} failure "
        f"{index + 1} of {model.fail_times}"
    )
    common: dict[str, Any] = {
        "message": message,
        "model": model.model,
        "llm_provider": FAKE_PROVIDER,
    }
    classes = {
        "rate_limit": litellm.RateLimitError,
        "timeout": litellm.Timeout,
        "server": litellm.InternalServerError,
        "connection": litellm.APIConnectionError,
        "bad_request": litellm.BadRequestError,
    }
    error: BaseException = classes[model.failure](**common)
    return error


def _exhausted(model: FakeModel, position: int, index: int) -> FakeModelExhausted:
    count = len(model.replies or ())
    message = (
        f"fake model {model.model!r} has no reply left: it was given {count} "
        f"{'reply' if count == 1 else 'replies'} and this is reply request {position + 1} "
        f"(call {index + 1}); add replies or use function="
    )
    cls = _exhausted_class
    if cls is None:  # pragma: no cover - set by the load hook before any request
        return FakeModelExhausted(message)
    return cls(message, model.model)


def _make_exhausted_class(litellm: ModuleType) -> type[FakeModelExhausted]:
    class FakeModelExhaustedError(FakeModelExhausted, litellm.BadRequestError):  # type: ignore[misc,name-defined]
        """:class:`FakeModelExhausted` as a litellm ``BadRequestError`` (passes through litellm)."""

        def __init__(self, message: str, model: str) -> None:
            litellm.BadRequestError.__init__(
                self, message=message, model=model, llm_provider=FAKE_PROVIDER
            )

    # Reported under the public name (RunResult.error.type, tracebacks, logs).
    FakeModelExhaustedError.__module__ = __name__
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
    seconds: float | None
    if isinstance(timeout, (int, float)):
        seconds = float(timeout)
    else:
        read = getattr(timeout, "read", None)
        seconds = float(read) if isinstance(read, (int, float)) else None
    return FakeRequest(
        model=f"{FAKE_PROVIDER}/{model_name}",
        messages=[dict(m) for m in messages],
        response_format=response_format,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        timeout=seconds,
        extra=params,
    )


def _find(model: str) -> FakeModel:
    name = model[len(FAKE_PROVIDER) + 1 :] if model.startswith(f"{FAKE_PROVIDER}/") else model
    found = _lookup(name)
    if found is None:
        known = ", ".join(f"{FAKE_PROVIDER}/{n}" for n in _known_names())
        raise _litellm().NotFoundError(
            message=(
                f"no fake model {FAKE_PROVIDER}/{name} is registered; registered fake models: "
                f"{known}. Register one with agency_runtime.testing.FakeModel({name!r}).register()"
            ),
            model=f"{FAKE_PROVIDER}/{name}",
            llm_provider=FAKE_PROVIDER,
        )
    return found


def _response(model: FakeModel, request: FakeRequest, text: str) -> Any:
    litellm = _litellm()
    prompt = _prompt_tokens(request.messages)
    completion = max(1, _count_words(text))
    return litellm.ModelResponse(
        model=model.model,
        choices=[
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
            }
        ],
        usage=litellm.Usage(
            prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
        ),
    )


def _complete_sync(
    model: str, messages: Sequence[dict[str, Any]], optional_params: Any, timeout: object
) -> Any:
    fake = _find(model)
    request = _request(fake.name, messages, optional_params, timeout)
    return _response(fake, request, fake._answer_sync(request))


async def _complete_async(
    model: str, messages: Sequence[dict[str, Any]], optional_params: Any, request_timeout: object
) -> Any:
    fake = _find(model)
    request = _request(fake.name, messages, optional_params, request_timeout)
    return _response(fake, request, await fake._answer_async(request))


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
            response = _complete_sync(
                model, messages, kwargs.get("optional_params"), kwargs.get("timeout")
            )
            yield _chunk(response)

        async def astreaming(
            self, model: str, messages: list[dict[str, Any]], **kwargs: Any
        ) -> AsyncIterator[dict[str, Any]]:
            response = await _complete_async(
                model, messages, kwargs.get("optional_params"), kwargs.get("timeout")
            )
            yield _chunk(response)

    return FakeLLMHandler()


def _chunk(response: Any) -> dict[str, Any]:
    """The whole reply as one litellm ``GenericStreamingChunk``, usage included."""
    usage = response.usage
    return {
        "text": response.choices[0].message.content or "",
        "tool_use": None,
        "is_finished": True,
        "finish_reason": "stop",
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        },
        "index": 0,
    }


def _install(module: ModuleType) -> None:
    """The load hook: install the ``fake`` provider and price every known fake model."""
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
        models = [*_builtins.values(), *_registry.values()]
        _installed = True
    for model in models:
        _register_price(litellm, model)


add_load_hook(_install)
