"""``agency.llm``: one LLM turn on a thread, through the provider seam, billed and journaled.

A call delivers the thread's queued messages (FIFO), pushes the prompt as a user message,
asks the model's provider (:func:`~._registry.provider_for`: litellm by default, the
offline fake provider for ``fake/...``; transient provider errors are retried here with
capped exponential backoff, for every provider alike), pushes the answer as an assistant
message and bills its cost and tokens to the run and every guard in scope. With
``schema=``, the answer is parsed tolerantly (code fences, envelopes, single-key objects)
and validated; a failed validation is fed back to the model
and retried (``retries``, default 1), then :class:`StructuredOutputError` is raised.

Inside a run every call is journaled when it completes: on replay it returns the recorded
answer without calling the provider and costs nothing more, while its spend still counts
toward the guards. After the call a guard it pushed over its budget raises a resumable
``std::guard`` interrupt.

The seam's shapes (:mod:`._provider`: requests, responses, stream events, tool calls) are
imported by the functions that build or read them, so ``import agency_runtime`` does not load
them: they are nine frozen dataclasses, whose generated methods cost ~7 ms to create.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import anyio
from pydantic import BaseModel, SecretStr, TypeAdapter, ValidationError, create_model
from pydantic_core import PydanticSerializationError, from_json, to_json

from .._bounds import check_seconds
from .._core import _observe
from .._core._branches import qualify
from .._core._cancel import AbortSignal, abort_reason, cancelled_by
from .._core._changes import Change
from .._core._frame import Frame, Position, current_frame, position_of, use_frame
from .._core._jsondata import json_problem
from .._core._money import pico_to_usd, usd_to_pico
from .._core._threads import Message, MessageContent, MessageThread
from .._durable._effect import RECORDED_FAILURES, journaled
from .._durable._journal import journal_of
from .._errors import (
    AgencyError,
    InvalidArgumentError,
    LLMCallError,
    NoModelError,
    ProviderError,
    StepResultError,
    StructuredOutputError,
    ToolRoundsExceededError,
)
from .._guards import CostGuard, charge, gate
from .._secrets import mask, quotes
from ._model import Model, resolve_model
from ._registry import provider_for
from ._tools import Tool, ValidationFailure, as_tools

if TYPE_CHECKING:
    import json

    from ._provider import ChatResponse, ToolCall, Usage

__all__ = [
    "MAX_TOOL_ROUNDS",
    "OnMaxToolRounds",
    "ask",
    "begin",
    "bill",
    "llm",
    "with_transient_retries",
]

logger = logging.getLogger("agency_runtime.llm")

T = TypeVar("T")

TRANSIENT_ATTEMPTS = 3
"""Attempts per request when the provider fails transiently (timeouts, 429, 5xx, drops)."""

BACKOFF_BASE, BACKOFF_CAP = 0.5, 10.0

FEEDBACK = (
    "Your previous response did not match the required output format. Errors:\n{errors}\n"
    "Respond again with only a JSON document that matches the schema."
)

MAX_TOOL_ROUNDS = 8
"""Rounds of tool calls ``agency.llm`` allows before it gives up (``max_tool_rounds``)."""

TOOL_APPROVAL = "std::tool-approval"
"""The effect of the interrupt a ``needs_approval`` tool asks before it runs."""

OnMaxToolRounds = Literal["raise", "answer"]
"""What ``agency.llm`` does when the model still calls tools after ``max_tool_rounds``."""

TokenCallback = Callable[[str], Awaitable[None] | None]
"""``on_token(delta)``: called with each piece of a streamed answer, in order."""

_unpriced: set[str] = set()
"""The model names whose unpriced calls were warned about (once per process)."""
_unpriced_in_guard: set[tuple[str, str]] = set()
"""(model name, guard) pairs warned about: an unpriced call inside a cost guard."""
_adapters: dict[object, TypeAdapter[Any]] = {}


def _is_empty(prompt: object) -> bool:
    if isinstance(prompt, str):
        return not prompt.strip()
    if isinstance(prompt, list):
        return all(
            (isinstance(part, str) and not part.strip())
            or (isinstance(part, dict) and not str(part.get("text", "x")).strip())
            for part in prompt
        )
    return False


def _resolve_model(frame: Frame, model: str | Model | None) -> Model:
    """The call's model: ``model=``, else the run's, else ``AGENCY_MODEL``; a string that
    names a registered :class:`Model` is that model, any other a plain provider string."""
    if isinstance(model, Model):
        return model  # for this call only: nothing of it is stored, so it is not registered
    chosen = model or frame.ctx.model or os.environ.get("AGENCY_MODEL")
    if not chosen:
        raise NoModelError(
            "agency.llm needs a model: pass model='provider/name' or model=agency.Model(...), "
            "run with agency.run(..., model=...), or set AGENCY_MODEL "
            "(offline: AGENCY_MODEL=fake/echo)"
        )
    if isinstance(chosen, Model):
        return chosen
    if not isinstance(chosen, str) or not chosen.strip():
        raise InvalidArgumentError(
            f"model must be a non-empty string or an agency.Model(...), got {chosen!r:.80}"
        )
    return resolve_model(chosen)


def _resolve_thread(frame: Frame, thread: MessageThread | str | int | None) -> MessageThread:
    if thread is None:
        return frame.threads.get_or_create_active()
    if isinstance(thread, MessageThread):
        return thread
    return frame.threads.get(thread)


def _adapter(schema: Any) -> TypeAdapter[Any]:
    try:
        return _adapters[schema]
    except (KeyError, TypeError):
        pass
    try:
        adapter: TypeAdapter[Any] = TypeAdapter(schema)
    except Exception as exc:  # pydantic cannot build a validator for it
        raise InvalidArgumentError(
            f"schema must be a pydantic model or a type pydantic can validate, got {schema!r}"
        ) from exc
    try:
        _adapters[schema] = adapter
    except TypeError:
        pass
    return adapter


def _response_format(schema: Any) -> type[BaseModel]:
    """Providers want an object at the top: other types travel inside ``{"value": ...}``."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema
    return create_model("Output", value=(schema, ...))


def _check_options(max_tokens: int | None, retries: int | None, timeout: float | None) -> None:
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise InvalidArgumentError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
    ):
        raise InvalidArgumentError(f"retries must be 0 or more, got {retries!r}")
    if timeout is not None:
        check_seconds(timeout, "timeout", positive=True)  # finite, at most 100 years


def _check_rounds(max_tool_rounds: object) -> int:
    if (
        isinstance(max_tool_rounds, bool)
        or not isinstance(max_tool_rounds, int)
        or max_tool_rounds < 1
    ):
        raise InvalidArgumentError(
            f"max_tool_rounds must be a whole number >= 1, got {max_tool_rounds!r}"
        )
    return max_tool_rounds


async def llm(
    prompt: MessageContent,
    *,
    model: str | Model | None = None,
    schema: Any = None,
    thread: MessageThread | str | int | None = None,
    max_tokens: int | None = None,
    retries: int | None = None,
    timeout: float | None = None,
    tools: list[Tool | Callable[..., Any]] | None = None,
    max_tool_rounds: int = MAX_TOOL_ROUNDS,
    on_max_tool_rounds: OnMaxToolRounds = "raise",
    on_token: TokenCallback | None = None,
) -> Any:
    """Ask the model; return its answer (``str``, or an instance of ``schema``).

    ``model`` applies to this call only (default: the run's model, else ``AGENCY_MODEL``):
    an :class:`~agency_runtime.Model`, the name of a registered one, or a provider model
    string. (A ``Model`` given here is used as it is and not registered: the journal keeps
    the call's answer, so a replay never needs it again.)
    ``thread`` is a :class:`MessageThread` or a thread id (default: the active thread).
    ``retries`` counts structured-output validation retries (default 1); transient
    provider errors are retried separately. ``timeout`` bounds each request (seconds).
    An empty prompt returns ``""`` and does nothing else.

    ``tools``: functions (or :func:`agency.tool <agency_runtime._llm._tools.tool>` values)
    the model may call (each request offers them with ``tool_choice="auto"`` unless the
    model's options choose). Each round's model answer and each tool execution are journaled
    steps of their own (``tool:<name>``), so a run resumed in the middle of the loop never
    runs a completed tool again; a tool's error, unknown tool names and arguments that fail
    validation are fed back to the model. After ``max_tool_rounds`` rounds of calls,
    ``on_max_tool_rounds="raise"`` (the default) raises :class:`ToolRoundsExceededError`
    when the model calls tools again; ``"answer"`` asks one last round with
    ``tool_choice="none"``, whose text is the answer (journaled like any round).
    ``on_token(delta)`` (sync or async) streams the answer's text as it arrives; a replayed
    call gives it the recorded text in one piece.
    """
    call = begin(
        prompt,
        model=model,
        schema=schema,
        thread=thread,
        max_tokens=max_tokens,
        retries=retries,
        timeout=timeout,
        tools=tools,
        max_tool_rounds=max_tool_rounds,
        on_max_tool_rounds=on_max_tool_rounds,
        on_token=on_token,
    )
    return "" if call is None else await ask(call)


def begin(
    prompt: MessageContent,
    *,
    model: str | Model | None = None,
    schema: Any = None,
    thread: MessageThread | str | int | None = None,
    max_tokens: int | None = None,
    retries: int | None = None,
    timeout: float | None = None,
    tools: list[Tool | Callable[..., Any]] | None = None,
    max_tool_rounds: int = MAX_TOOL_ROUNDS,
    on_max_tool_rounds: OnMaxToolRounds = "raise",
    on_token: TokenCallback | None = None,
) -> _Call | None:
    """The first half of :func:`llm` (same arguments): check them and count the call at the
    current task's position, so its journal address is fixed here; ``None`` for an empty
    prompt. :func:`ask` makes the call, in this task or in one it starts
    (``agency.llm_stream``): either way the call has the address ``agency.llm`` gives it."""
    frame = current_frame("llm()")
    if _is_empty(prompt):
        return None
    if not isinstance(prompt, str | list):
        raise InvalidArgumentError(
            f"the prompt must be a string or a list of content parts, got {type(prompt).__name__}"
        )
    _check_options(max_tokens, retries, timeout)
    rounds = _check_rounds(max_tool_rounds)
    if on_max_tool_rounds not in ("raise", "answer"):
        raise InvalidArgumentError(
            f"on_max_tool_rounds must be 'raise' or 'answer', got {on_max_tool_rounds!r}"
        )
    if on_token is not None and not callable(on_token):
        raise InvalidArgumentError(f"on_token must be a callable, got {type(on_token).__name__}")
    chosen_tools = {} if tools is None else as_tools(tools)
    target = _resolve_thread(frame, thread)
    chosen = _resolve_model(frame, model)
    adapter = None if schema is None else _adapter(schema)
    journal = journal_of(frame.ctx)
    address = position_of(frame).address
    branch, ordinal = journal.count(address, "llm")
    segment = qualify(branch, f"llm#{ordinal}")
    path = f"{address}/{segment}" if address else segment
    call = _Call(
        frame, path, target, chosen, schema, adapter, timeout, max_tokens, chosen_tools, on_token
    )
    call.prompt, call.retries, call.max_rounds = prompt, retries, rounds
    call.answer_at_max = on_max_tool_rounds == "answer"
    return call


async def ask(call: _Call) -> Any:
    """The second half of :func:`llm`: the call :func:`begin` counted, journaled at its
    address (a replay returns the recorded answer without asking the model)."""
    frame, path, chosen, adapter, on_token = (
        call.frame,
        call.path,
        call.model,
        call.adapter,
        call.on_token,
    )
    replayed = journal_of(frame.ctx).entries.get(path) is not None

    def unit(observed: bool) -> Awaitable[tuple[Any, str]]:
        return journaled(
            frame,
            path,
            "agency.llm",
            lambda: _converse(call),
            encode=lambda outcome: _recorded(outcome, adapter),
            decode=lambda recorded: _revived(recorded, adapter),
            callsite=chosen.name,
            failures=RECORDED_FAILURES,
            observed=observed,
            refer=_refer_to_reply,
            resolve=_resolve_reply,
        )

    obs = _observe.OBSERVER
    if obs is None or not replayed:
        value, text = await unit(True)
    else:  # a replayed call: its step, and the answer it gives without asking the model
        with obs.step("agency.llm", path, True), obs.chat(chosen.model, chosen.name, path, True):
            value, text = await unit(False)
    if replayed and on_token is not None and text:
        await _emit(on_token, text)  # a replay streams the recorded answer in one piece
    if frame.stack.guards:  # (gate looks at nothing else)
        await gate(frame, path)
    return value


def _recorded(outcome: tuple[Any, str], adapter: TypeAdapter[Any] | None) -> dict[str, Any]:
    """The journaled answer: its text, and its value when a schema made one (without a
    schema the value is the text; entries written before stored it twice)."""
    value, text = outcome
    if adapter is None:
        return {"text": text}
    try:
        stored = adapter.dump_python(value, mode="json")
    except (PydanticSerializationError, TypeError, ValueError):
        stored = None
    return {"text": text, "value": stored}


def _revived(recorded: Any, adapter: TypeAdapter[Any] | None) -> tuple[Any, str]:
    text = str(recorded["text"])
    return (text if adapter is None else adapter.validate_python(recorded["value"])), text


_REFER_MIN = 64
"""Answers shorter than this are journaled as they are: a reference would save nothing."""


def _refer_to_reply(data: dict[str, Any], changes: list[Change]) -> dict[str, Any]:
    """The answer's text as a reference to the assistant message that holds it.

    The call's changes (journaled with it) hold the answer as the thread's new assistant
    message; pointing at it (``{"text_at": i}``, ``i`` the change's index) stores the
    reply once instead of twice.
    """
    text = data.get("text")
    if not isinstance(text, str) or len(text) < _REFER_MIN:
        return data
    for index in range(len(changes) - 1, -1, -1):
        change = changes[index]
        if change[0] != "push":
            continue
        message = change[2]
        if message.get("role") == "assistant" and message.get("content") == text:
            return {**{k: v for k, v in data.items() if k != "text"}, "text_at": index}
    return data


def _resolve_reply(data: dict[str, Any], changes: list[Change]) -> dict[str, Any]:
    """:func:`_refer_to_reply` undone: the text put back from the message it points at.

    Raises ``IndexError``/``KeyError``/``ValueError`` when the reference does not hold an
    assistant's text (the journal is then reported damaged).
    """
    if "text_at" not in data:
        return data
    change = changes[int(data["text_at"])]
    message = change[2]
    if change[0] != "push" or message["role"] != "assistant":
        raise ValueError(f"the answer's reference points at {change[0]!r}, not a reply")
    content = message["content"]
    if not isinstance(content, str):
        raise ValueError("the answer's reference points at a message without text")
    return {**data, "text": content}


class _Call:
    """What one ``agency.llm`` call asks, shared by its rounds."""

    __slots__ = (
        "adapter",
        "answer_at_max",
        "frame",
        "max_rounds",
        "max_tokens",
        "model",
        "on_token",
        "path",
        "prompt",
        "retries",
        "schema",
        "thread",
        "timeout",
        "tools",
    )

    def __init__(
        self,
        frame: Frame,
        path: str,
        thread: MessageThread,
        model: Model,
        schema: Any,
        adapter: TypeAdapter[Any] | None,
        timeout: float | None,
        max_tokens: int | None,
        tools: dict[str, Tool],
        on_token: TokenCallback | None,
    ) -> None:
        self.frame, self.path, self.thread, self.model = frame, path, thread, model
        self.schema, self.adapter, self.timeout, self.max_tokens = (
            schema,
            adapter,
            timeout,
            max_tokens,
        )
        self.tools, self.on_token = tools, on_token
        self.prompt: MessageContent = ""
        self.retries: int | None = None
        self.max_rounds = MAX_TOOL_ROUNDS
        self.answer_at_max = False
        """``on_max_tool_rounds="answer"``: a last round without tools after the last one."""


def _deliver_queued(thread: MessageThread) -> None:
    if not thread.queued_messages:  # the common case: take nothing, report nothing
        return
    for queued in thread.take_queued():
        thread.add(queued.role, queued.content, queued.label)


async def _converse(call: _Call) -> tuple[Any, str]:
    thread, adapter, max_rounds = call.thread, call.adapter, call.max_rounds
    _deliver_queued(thread)
    thread.add("user", call.prompt)
    attempts = (1 if call.retries is None else call.retries) + 1
    attempt, rounds, turn, executed = 1, 0, 0, 0
    while True:
        last = call.answer_at_max and bool(call.tools) and rounds >= max_rounds
        text, calls = await _round(call, turn, "none" if last else None)
        turn += 1
        if calls:
            rounds += 1
            if last:
                raise ToolRoundsExceededError(
                    f"the model {call.model.name!r} still called tools in the last round "
                    f"after {max_rounds} round(s) ({', '.join(c.name for c in calls)}), "
                    "although it was sent tool_choice='none'; its server may not honour "
                    "tool_choice: raise max_tool_rounds, or tell it in the prompt when to stop",
                    model=call.model.name,
                    attempts=rounds,
                )
            if rounds > max_rounds:
                raise ToolRoundsExceededError(
                    f"the model {call.model.name!r} still called tools after {max_rounds} "
                    f"round(s) ({', '.join(c.name for c in calls)}) without answering; raise "
                    "max_tool_rounds, tell it in the prompt when to stop, or pass "
                    "on_max_tool_rounds='answer' to ask for an answer without tools then",
                    model=call.model.name,
                    attempts=rounds,
                )
            if call.tools:
                # a guard over budget stops the loop between rounds (asked at the round)
                await gate(call.frame, f"{call.path}/round#{turn - 1}")
            for tool_call in calls:
                await _run_tool(call, tool_call, executed)
                executed += 1
            _deliver_queued(thread)  # queued messages follow a round's tool results
            continue
        if adapter is None:
            return text, text
        try:
            return parse_structured(text, adapter), text
        except (ValidationError, ValueError) as exc:
            errors = _errors_of(exc)
            if attempt == attempts:
                raise StructuredOutputError(
                    f"the model's answer did not match the schema after {attempts} attempt(s): "
                    f"{'; '.join(errors)}",
                    raw=text,
                    errors=errors,
                ) from exc
            attempt += 1
            thread.add("user", FEEDBACK.format(errors="\n".join(f"- {e}" for e in errors)))


async def _round(
    call: _Call, turn: int, tool_choice: str | None = None
) -> tuple[str, list[ToolCall]]:
    """One request to the model and its answer on the thread, billed.

    With tools each round is a journaled unit of its own (``…/round#N``): a run resumed in
    the middle of a tool loop replays the rounds it had instead of asking again. An
    observer sees each request as a chat (the round's own step would only repeat it), and a
    replayed round as a replayed chat. ``tool_choice``: the runtime's own (``"none"``: the
    last round, which must answer).
    """
    if not call.tools and _observe.OBSERVER is None:
        return await _answer(call, None)  # the common case: no round unit, nobody watching
    path = f"{call.path}/round#{turn}" if call.tools else call.path

    async def ask() -> tuple[str, list[ToolCall]]:
        obs = _observe.OBSERVER
        if obs is None:
            return await _answer(call, None, tool_choice)
        with obs.chat(call.model.model, call.model.name, path, False) as watch:
            return await _answer(call, watch, tool_choice)

    if not call.tools:
        return await ask()
    from ._provider import ToolCall

    def unit() -> Awaitable[tuple[str, list[ToolCall]]]:
        return journaled(
            call.frame,
            path,
            "agency.llm:round",
            ask,
            encode=lambda outcome: {
                "text": outcome[0],
                "calls": [[c.id, c.name, c.arguments] for c in outcome[1]],
            },
            decode=lambda data: (
                str(data["text"]),
                [ToolCall(str(i), str(n), str(a)) for i, n, a in data["calls"]],
            ),
            callsite=call.model.name,
            failures=RECORDED_FAILURES,
            observed=False,
        )

    obs = _observe.OBSERVER
    if obs is None or path not in journal_of(call.frame.ctx).entries:
        return await unit()
    with obs.chat(call.model.model, call.model.name, path, True):
        return await unit()


async def _answer(
    call: _Call, watch: _observe.ChatWatch | None, tool_choice: str | None = None
) -> tuple[str, list[ToolCall]]:
    """Ask the model once; put its answer on the thread and bill it (``watch``: report it)."""
    response = await _request(call, tool_choice)
    calls = list(response.tool_calls)
    if calls:
        call.thread.push(
            Message.trusted("assistant", response.text, tool_calls=[c.to_openai() for c in calls])
        )
    else:
        call.thread.add("assistant", response.text)
    pico, tokens = bill(response.cost, response.usage, call.model, call.frame)
    charge(call.frame, pico=pico, tokens=tokens, enforce=False)
    if watch is not None:
        usage = response.usage
        watch.answered(usage.prompt_tokens, usage.completion_tokens, pico_to_usd(pico))
    return response.text, calls


async def _run_tool(call: _Call, tool_call: ToolCall, index: int) -> None:
    """Execute one tool call as a journaled step (``tool:<name>``) and put its result on the
    thread; what went wrong is the result the model reads (and an observer's failure)."""
    chosen = call.tools.get(tool_call.name)
    watch: _observe.ToolWatch | None = None

    def failed(message: str, error: Exception | None = None) -> str:
        if watch is not None:
            watch.failed(message, error)
        return f"Error: {message}"

    async def execute() -> str:
        if chosen is None:
            known = ", ".join(sorted(call.tools)) or "none"
            return failed(f"there is no tool named {tool_call.name!r} (tools: {known})")
        try:
            arguments = chosen.parse(tool_call.arguments)
        except ValidationFailure as exc:
            return failed(f"the arguments of {chosen.name!r} are not valid: {_brief(exc)}", exc)
        if chosen.needs_approval:
            from .._interrupts import ask  # interrupts sit beside this layer, not below it

            shown = from_json_safe(tool_call.arguments)
            answer = await ask(
                tool_frame,  # the tool call's own position: its answer answers it alone
                TOOL_APPROVAL,
                f"The model wants to call {chosen.name}({tool_call.arguments}). Allow it?",
                {"tool": chosen.name, "arguments": shown},
            )
            if not answer.approved:
                why = f": {answer.value}" if answer.value else ""
                return f"The call of {chosen.name!r} was refused by a human{why}"
        try:
            result = chosen.fn(**arguments)
            if inspect.isawaitable(result):
                result = await result
        except AgencyError:
            raise
        except Exception as exc:  # the model reads what went wrong, and may try again
            return failed(f"{chosen.name} raised {type(exc).__name__}: {exc}", exc)
        problem = json_problem(result)
        if problem is not None:
            raise StepResultError(
                f"tool {chosen.name!r} returned a value that cannot be journaled as JSON: "
                f"{problem}; return JSON data (str, numbers, lists, dicts) or a pydantic model"
            )
        return result if isinstance(result, str) else to_json(result).decode()

    name = tool_call.name if chosen is None else chosen.name
    path = f"{call.path}/tool#{index}"
    # The call runs at its own address, like a scope step or a memory operation: what the
    # tool asks, calls or counts is numbered under it, apart from its caller's (a finished
    # call replays without running, so it must shift none of the caller's ordinals).
    tool_frame = call.frame.evolve(position=Position(position_of(call.frame).scope, path))

    async def in_frame() -> str:
        with use_frame(tool_frame):
            return await execute()

    def unit() -> Awaitable[str]:
        return journaled(
            call.frame,
            path,
            f"tool:{name}",
            in_frame,
            encode=lambda text: text,
            decode=str,
            callsite=tool_call.id,
            observed=False,  # the tool's span is its step's
        )

    obs = _observe.OBSERVER
    if obs is None:
        content = await unit()
    else:
        replayed = path in journal_of(call.frame.ctx).entries
        with obs.tool(name, tool_call.id, path, replayed) as watch:
            content = await unit()
    call.thread.push(Message.trusted("tool", content, tool_call_id=tool_call.id, name=name))


def from_json_safe(text: str) -> Any:
    """The model's arguments as data for an approval question (the text when not JSON)."""
    try:
        return from_json(text or "{}")
    except ValueError:
        return text


def _brief(exc: Exception) -> str:
    return "; ".join(_errors_of(exc))[:500]


async def _emit(on_token: TokenCallback, delta: str) -> None:
    result = on_token(delta)
    if inspect.isawaitable(result):
        await result


def _errors_of(exc: Exception) -> list[str]:
    if isinstance(exc, ValidationError):
        return [
            f"{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}"
            for error in exc.errors()
        ]
    return [str(exc)]


def bill(
    cost: float | None, usage: Usage, model: Model | str, frame: Frame | None = None
) -> tuple[int, int]:
    """A response's spend: (pico-dollars, total tokens).

    A :class:`Model` with prices of its own is billed with them (prompt tokens times its
    input price plus completion tokens times its output price), whatever the provider
    says; otherwise the provider's ``cost``. With neither the call is billed $0, and a
    WARNING says so once per model name, and once per model and cost guard in ``frame``'s
    scope (such a guard cannot stop those calls).
    """
    tokens = usage.total_tokens
    if isinstance(model, Model) and model.priced:
        return model.price_pico(usage), tokens
    if cost is None or isinstance(cost, bool) or not math.isfinite(cost) or cost < 0:
        _warn_unpriced(model, frame)
        return 0, tokens
    return usd_to_pico(float(cost)), tokens


def _price_hint(model: Model | str) -> str:
    """How to price ``model``: the ``agency.Model(...)`` call that would."""
    provider_model, name = (model, model) if isinstance(model, str) else (model.model, model.name)
    named = "" if name == provider_model else f", name={name!r}"
    return (
        f"price it with agency.Model({provider_model!r}{named}, input_cost_per_token=..., "
        "output_cost_per_token=...) (US dollars a token)"
    )


def _warn_unpriced(model: Model | str, frame: Frame | None) -> None:
    name = model if isinstance(model, str) else model.name
    if name not in _unpriced:
        _unpriced.add(name)
        logger.warning(
            "no price is known for model %r: its calls are billed $0, so cost guards cannot "
            "stop them; %s",
            name,
            _price_hint(model),
        )
    if frame is None:
        return
    for guard in frame.stack.guards:
        if not isinstance(guard, CostGuard):
            continue
        shown = guard.guard_id if guard.label is None else f"{guard.label!r} ({guard.guard_id})"
        key = (name, shown)
        if key in _unpriced_in_guard:
            continue
        _unpriced_in_guard.add(key)
        logger.warning(
            "a call of the unpriced model %r inside the cost guard %s is billed $0: the "
            "guard cannot stop it; %s",
            name,
            shown,
            _price_hint(model),
        )


class _ScrubbedError(Exception):
    """A provider's error that quoted the model's api_key, the key masked (its chain cut)."""


def _cause(original: BaseException, key: str | None) -> BaseException:
    """What an :class:`LLMCallError` is chained to: the provider's exception, or a stand-in
    with the key masked when its message, arguments or notes (or those of an exception it
    chains) quote the key in any case, so a traceback never shows it."""
    if not key:
        return original
    seen: BaseException | None = original
    for _ in range(16):
        if seen is None:
            return original
        notes = getattr(seen, "__notes__", None)
        if quotes(f"{seen} {seen.args!r} {notes!r}", key):
            break
        seen = seen.__cause__ or seen.__context__
    return _ScrubbedError(mask(f"{type(original).__qualname__}: {original}", key))


async def with_transient_retries(
    call: Callable[[], Awaitable[T]],
    *,
    model: str,
    signal: AbortSignal | None,
    what: str = "call",
    secret: SecretStr | None = None,
) -> T:
    """``await call()``, retrying transient :class:`ProviderError` with capped backoff.

    Up to :data:`TRANSIENT_ATTEMPTS` attempts, sleeping ``BACKOFF_BASE`` seconds after the
    first failure and twice as long after each next one (at most ``BACKOFF_CAP``). A
    permanent provider error, or a transient one on the last attempt, raises
    :class:`LLMCallError` chained to the provider library's original exception; any other
    exception a provider lets out (not an :class:`AgencyError`) is permanent too. When
    ``signal`` fires the call and the backoff sleep stop and its reason is raised.
    ``secret`` (the model's api_key) is masked, in any case, in every message that quotes
    the provider, and in the exceptions the error chains (see :func:`_cause`). Errors are
    raised outside the ``except`` clause that caught the provider's, so the provider's
    exception is not their ``__context__`` either.
    """
    delay = BACKOFF_BASE
    key = None if secret is None else secret.get_secret_value()
    for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
        if signal is not None:
            signal.raise_if_aborted()
        failure: LLMCallError | None = None
        try:
            if signal is None:
                return await call()
            with cancelled_by(signal) as scope:
                result = await call()
            if scope.cancelled_caught:
                raise abort_reason(signal)
            return result
        except ProviderError as exc:
            original = exc.original
            reason = mask(f"{type(original).__name__}: {original}", key)
            if not exc.transient or attempt == TRANSIENT_ATTEMPTS:
                times = f" {attempt} times" if exc.transient else ""
                failure = LLMCallError(
                    f"the {what} to {model!r} failed{times}: {reason}",
                    model=model,
                    attempts=attempt,
                )
                cause = _cause(original, key)
            else:
                logger.info("transient error from %r (attempt %d): %s", model, attempt, reason)
                cause = _cause(exc, key)  # what a cancelled backoff's error is chained to
        except (AgencyError, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:
            failure = LLMCallError(
                mask(f"the {what} to {model!r} failed: {type(exc).__name__}: {exc}", key),
                model=model,
                attempts=attempt,
            )
            cause = _cause(exc, key)
        if failure is not None:
            raise failure from cause
        if signal is None:
            await anyio.sleep(delay)
        else:
            with cancelled_by(signal) as scope:
                await anyio.sleep(delay)
            if scope.cancelled_caught:
                raise abort_reason(signal) from cause
        delay = min(delay * 2, BACKOFF_CAP)
    raise AssertionError("unreachable")  # pragma: no cover


async def _request(call: _Call, tool_choice: str | None = None) -> ChatResponse:
    from ._provider import DEFAULT_TIMEOUT, ChatRequest, ChatResponse, StreamEnd, TextDelta

    chosen, schema, timeout, max_tokens = call.model, call.schema, call.timeout, call.max_tokens
    model, secret = chosen.name, chosen.api_key
    provider = provider_for(chosen.model)
    messages = call.thread.request_messages()
    output: type[BaseModel] | None = None
    if schema is not None:
        output = _response_format(schema)
        constrained = chosen.json_schema
        if constrained is None:  # the model does not say: the provider knows (or not)
            constrained = await provider.supports_schema(chosen.model)
        if not constrained:
            import json  # on first use (the json module is not needed to import agency_runtime)

            instruction = (
                "Respond with only a JSON document matching this JSON schema: "
                + json.dumps(output.model_json_schema())
            )
            messages = [*messages, {"role": "system", "content": instruction}]
            output = None
    request = ChatRequest(
        model=chosen.model,
        messages=messages,
        timeout=DEFAULT_TIMEOUT if timeout is None else float(timeout),
        max_tokens=max_tokens,
        response_format=output,
        tools=tuple(tool.spec for tool in call.tools.values()) if call.tools else (),
        tool_choice=tool_choice,
        api_base=chosen.api_base,
        api_key=secret,
        params=chosen.params,
    )
    on_token = call.on_token
    if on_token is None:
        return await with_transient_retries(
            lambda: provider.complete(request),
            model=model,
            signal=call.frame.stack.abort_signal,
            secret=secret,
        )
    streamed: list[str] = []

    async def stream() -> ChatResponse:
        if streamed:  # a stream cut after it gave text cannot be taken back: fail clearly
            raise LLMCallError(
                f"the stream from {model!r} was cut after {len(''.join(streamed))} "
                "characters of its answer",
                model=model,
                attempts=1,
            )
        events = provider.stream(request)
        end: StreamEnd | None = None
        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    if event.text:
                        streamed.append(event.text)
                        await _emit(on_token, event.text)
                elif isinstance(event, StreamEnd):
                    end = event
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()  # a provider's generator is closed here, never by the GC
        if end is not None:
            return ChatResponse(
                text=end.text,
                usage=end.usage,
                cost=end.cost,
                tool_calls=end.tool_calls,
                raw=end.raw,
            )
        raise ProviderError(
            f"the stream from {model!r} ended without its last event",
            kind="connection",
            model=model,
        )

    return await with_transient_retries(
        stream, model=model, signal=call.frame.stack.abort_signal, what="stream", secret=secret
    )


# -- tolerant parsing -----------------------------------------------------------------------------

_FENCE = r"```(?:[A-Za-z]+)?\s*\n?(.*?)```"  # patterns: compiled (and cached by re) on first use
_ENVELOPES = ("data", "result", "output", "response", "answer", "value")
_OPENERS = r"[\[{]"
_DECODER: json.JSONDecoder | None = None
"""Scans a text for JSON values (``raw_decode``): made on first use, with the json module."""
_MAX_STARTS = 32
"""At most this many ``{``/``[`` positions of one text are tried as the start of a JSON value.

Each try may scan to the end of the text, so the bound keeps a pathological answer (thousands
of unclosed brackets) linear in its length instead of quadratic."""


class _NoJSONError(ValueError):
    """The answer holds no JSON value that could be parsed."""


def _values_in(text: str) -> tuple[list[Any], bool]:
    """The complete JSON values in ``text`` in order (bounded), and whether one nested too deep.

    The whole text first, when it is one JSON document (a scalar too); otherwise each value
    that starts at a ``{`` or ``[`` and parses completely, scanning on after its end. Trailing
    text after a value (``{"a": 1}}``, ``{"a": 1} (hope that helps :})``) is ignored.
    """
    import json  # on first use (the json module is not needed to import agency_runtime)

    decoder = _decoder()
    openers = re.compile(_OPENERS)
    too_deep = False
    try:
        return [json.loads(text)], False
    except RecursionError:
        too_deep = True
    except ValueError:
        pass
    values: list[Any] = []
    position = 0
    for _ in range(_MAX_STARTS):
        opener = openers.search(text, position)
        if opener is None:
            break
        try:
            value, end = decoder.raw_decode(text, opener.start())
        except RecursionError:
            too_deep = True
            position = opener.start() + 1
        except ValueError:
            position = opener.start() + 1
        else:
            values.append(value)
            position = end
    return values, too_deep


def _decoder() -> json.JSONDecoder:
    global _DECODER
    if _DECODER is None:
        import json

        _DECODER = json.JSONDecoder()
    return _DECODER


def _json_values(text: str) -> list[Any]:
    """The JSON values of a model's answer, the first complete one first.

    A code fence's content is searched before the rest of the answer. Raises
    :class:`_NoJSONError` (a ``ValueError``) when there is none.
    """
    stripped = text.strip()
    fence = re.search(_FENCE, stripped, re.DOTALL)
    too_deep = False
    for candidate in (fence.group(1).strip(), stripped) if fence else (stripped,):
        values, deep = _values_in(candidate)
        if values:
            return values
        too_deep = too_deep or deep
    snippet = f"{text[:80]!r}{'…' if len(text) > 80 else ''}"
    if too_deep:
        raise _NoJSONError(f"the answer's JSON is nested too deeply to parse: {snippet}")
    raise _NoJSONError(f"the answer contains no JSON value ({{...}} or [...]): {snippet}")


def _validate_unwrapping(data: Any, adapter: TypeAdapter[Any]) -> Any:
    """``data`` validated, else an envelope's or a single-key object's value; else the error."""
    try:
        return adapter.validate_python(data)
    except ValidationError as first:
        if isinstance(data, dict):
            inner = [data[k] for k in _ENVELOPES if k in data]
            if len(data) == 1:
                inner.append(next(iter(data.values())))
            for candidate in inner:
                try:
                    return adapter.validate_python(candidate)
                except ValidationError:
                    continue
        raise first


def parse_structured(text: str, adapter: TypeAdapter[Any]) -> Any:
    """Parse a model's answer into ``adapter``'s type, forgiving common wrappers.

    Accepts code fences, prose around the JSON, trailing text after it (a stray ``}``), an
    envelope such as ``{"data": ...}`` and a single-key object around the value. The first
    complete JSON value in the answer is used; when it does not validate, the later ones are
    tried (prose may cite ``[1]`` before the answer), and the first value's validation error
    is raised when none fits.

    Raises:
        pydantic.ValidationError: the answer's JSON does not match the schema.
        ValueError: the answer holds no JSON value (or only one nested too deeply to parse)
            and is not itself a valid value (the plain text of a ``str`` schema is).
    """
    try:
        values = _json_values(text)
    except _NoJSONError as missing:
        try:
            return adapter.validate_python(text.strip())  # a plain-text answer to a str schema
        except ValidationError as exc:
            reasons = "; ".join(str(error["msg"]) for error in exc.errors()[:3])
            raise _NoJSONError(f"{missing} (as plain text: {reasons})") from exc
    try:
        return _validate_unwrapping(values[0], adapter)
    except ValidationError as first:
        for data in values[1:]:
            try:
                return _validate_unwrapping(data, adapter)
            except ValidationError:
                continue
        raise first
