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

import os
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import TypeAdapter
from pydantic_core import PydanticSerializationError

from .._bounds import check_seconds
from .._core import _observe
from .._core._branches import qualify
from .._core._frame import Frame, current_frame, position_of
from .._core._threads import MessageContent, MessageThread
from .._durable._effect import journaled, will_replay
from .._durable._journal import journal_of
from .._errors import InvalidArgumentError, NoModelError
from .._guards import gate
from ._call import MAX_TOOL_ROUNDS, TokenCallback, _Call, _emit
from ._mcp import McpServer
from ._mcp import split as split_toolsets
from ._model import Model, resolve_model
from ._recorded import RECORDED_FAILURES
from ._toolloop import _converse, _refer_to_reply, _resolve_reply
from ._tools import Tool, as_tools

__all__ = ["OnMaxToolRounds", "ask", "begin", "llm"]

OnMaxToolRounds = Literal["raise", "answer"]
"""What ``agency.llm`` does when the model still calls tools after ``max_tool_rounds``."""

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
    tools: list[Tool | McpServer | Callable[..., Any]] | None = None,
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

    ``tools``: functions (or :func:`agency.tool <agency_runtime._llm._tools.tool>` values,
    or MCP servers' toolsets: ``agency.mcp.stdio(...)``/``agency.mcp.http(...)``)
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
    tools: list[Tool | McpServer | Callable[..., Any]] | None = None,
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
    toolsets: tuple[McpServer, ...] = ()
    if tools is None:
        chosen_tools: dict[str, Tool] = {}
    else:
        functions, toolsets = split_toolsets(tools)
        chosen_tools = as_tools(functions)
    target = _resolve_thread(frame, thread)
    chosen = _resolve_model(frame, model)
    adapter = None if schema is None else _adapter(schema)
    journal = journal_of(frame.ctx)
    address = position_of(frame).address
    branch, ordinal = journal.count(address, "llm")
    segment = qualify(branch, f"llm#{ordinal}")
    path = f"{address}/{segment}" if address else segment
    call = _Call(
        frame,
        path,
        target,
        chosen,
        schema,
        adapter,
        timeout,
        max_tokens,
        chosen_tools,
        on_token,
        toolsets,
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
    replayed = will_replay(journal_of(frame.ctx), path)

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
