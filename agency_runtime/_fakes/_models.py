"""The fake models: :class:`FakeModel` and the process's table of them (``fake/<name>``).

A :class:`FakeModel` answers from a script (``replies``), a reply function, or by itself:
``fake/echo`` (built in) replies with the text of the last user message, or, when the
request carries a JSON-schema response format, with a JSON document generated from the
schema (:mod:`._schema`); ``fake/json`` (built in) replies ``{}`` when there is no schema.
The built-in models never call tools on their own, even when the request offers some.

A model answers through a path that says how its failures are raised (:class:`_Errors`): the
seam's provider errors (:mod:`._provider`) or litellm's exceptions (:mod:`._litellm_handler`);
this module knows neither path. A path that must hear of every model registered later (the
litellm handler prices each one in litellm) subscribes with :func:`on_register`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Literal, Protocol, get_args

import anyio

from .._llm._provider import Usage
from ._replies import FakeAnswer, FakeRequest, FakeStream, FakeToolCall, Reply, ReplyFunction
from ._schema import sample_document, schema_of
from ._usage import fake_embedding, last_user_text

__all__ = [
    "FAKE_PROVIDER",
    "FailureKind",
    "FakeModel",
    "FakeModelExhausted",
    "failure_message",
    "lookup",
    "models",
    "name_of",
    "not_found_message",
    "on_register",
    "reset",
]

FAKE_PROVIDER = "fake"
"""The provider prefix of every fake model: ``model="fake/<name>"``."""

FailureKind = Literal["rate_limit", "timeout", "server", "connection", "bad_request"]
_FAILURE_KINDS: tuple[str, ...] = get_args(FailureKind)


_BUILTIN_NAMES = ("echo", "json")
_CALL_FUNCTION = object()  # FakeModel._plan's answer: "call the reply function"

_lock = threading.RLock()
_registry: dict[str, FakeModel] = {}
_builtins: dict[str, FakeModel] = {}
_listeners: list[Callable[[FakeModel], None]] = []


class FakeModelExhausted(AssertionError):
    """A scripted :class:`FakeModel` was called more often than it had replies for.

    At the seam it is a permanent failure (``agency.llm`` raises ``LLMCallError`` from it,
    with no retry). Inside a litellm call it is raised as an instance of a subclass that is
    also a ``litellm.BadRequestError`` (not transient, so no retry loop hides it).
    """


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
            listeners = list(_listeners)
        for listener in listeners:
            listener(self)
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


def failure_message(model: FakeModel, index: int) -> str:
    """What the ``index``-th scripted failure of ``model`` says (both paths say the same)."""
    return (
        f"fake model {model.model!r}: scripted {model.failure} failure "
        f"{index + 1} of {model.fail_times}"
    )


def on_register(listener: Callable[[FakeModel], None]) -> None:
    """Call ``listener(model)`` each time a model is registered from now on."""
    with _lock:
        _listeners.append(listener)


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


def lookup(name: str) -> FakeModel | None:
    """The model that answers ``fake/<name>`` now (a registered one, else a built-in)."""
    with _lock:
        return _registry.get(name) or _builtins.get(name)


def _known_names() -> list[str]:
    with _lock:
        return sorted({*_registry, *_builtins})


def models() -> list[FakeModel]:
    """Every fake model that answers now: the built-ins, then the registered ones."""
    with _lock:
        return [*_builtins.values(), *_registry.values()]


def name_of(model: str) -> str:
    """A fake model string's name: ``"fake/<name>"`` (or ``"<name>"``) → ``"<name>"``."""
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
    schema = schema_of(request.response_format)
    if schema is not None:
        return json.dumps(sample_document(schema))
    if model._builtin == "json":
        return "{}"
    return last_user_text(request.messages)
