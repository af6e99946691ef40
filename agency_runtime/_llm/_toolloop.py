"""The conversation of one ``agency.llm`` call: :func:`_converse`.

It delivers the thread's queued messages, pushes the prompt, then asks the model round after
round (:func:`_round`: one request, its answer on the thread, billed) while the model calls
tools, running each tool call as a journaled step of its own (:func:`_run_tool`, asking a
human first when the tool ``needs_approval``); the answer is parsed against the call's schema
(:func:`~._parsing.parse_structured`), a failed validation fed back and asked again.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from pydantic_core import from_json, to_json

from .._core import _observe
from .._core._changes import Change
from .._core._frame import Frame, Position, position_of, use_frame
from .._core._jsondata import json_problem
from .._core._money import pico_to_usd
from .._core._threads import Message, MessageThread
from .._durable._effect import journaled, will_replay
from .._durable._journal import journal_of
from .._durable._replay import last_push, pushed_text
from .._errors import (
    AgencyError,
    StepFailedError,
    StepResultError,
    StructuredOutputError,
    ToolRoundsExceededError,
)
from .._guards import charge, gate
from .._policies import with_policy
from ._billing import bill
from ._mcp import McpTool, offer, recorded, revive
from ._model import known_secrets
from ._parsing import parse_structured
from ._recorded import RECORDED_FAILURES
from ._request import _request
from ._tools import Tool, ValidationFailure

if TYPE_CHECKING:
    from ._call import _Call
    from ._provider import ToolCall

__all__ = ["TOOL_APPROVAL"]

FEEDBACK = (
    "Your previous response did not match the required output format. Errors:\n{errors}\n"
    "Respond again with only a JSON document that matches the schema."
)

TOOL_APPROVAL = "std::tool-approval"
"""The effect of the interrupt a ``needs_approval`` tool asks before it runs."""


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
        last = call.answer_at_max and call.has_tools and rounds >= max_rounds
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
            if call.has_tools:
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

    With MCP toolsets a live round first lists their tools; the MCP tools it offered are
    journaled with it (``"tools"``), and a replayed round offers those again
    (:func:`~._mcp.revive`), asking no server.
    """
    if not call.has_tools and _observe.OBSERVER is None:
        return await _answer(call, None)  # the common case: no round unit, nobody watching
    path = f"{call.path}/round#{turn}" if call.has_tools else call.path

    async def ask() -> tuple[str, list[ToolCall]]:
        if call.toolsets:
            call.tools, call.unreachable = await offer(call.functions, call.toolsets, call.tools)
        obs = _observe.OBSERVER
        if obs is None:
            return await _answer(call, None, tool_choice)
        with obs.chat(call.model.model, call.model.name, path, False) as watch:
            return await _answer(call, watch, tool_choice)

    if not call.has_tools:
        return await ask()
    from ._provider import ToolCall

    def encode(outcome: tuple[str, list[ToolCall]]) -> dict[str, Any]:
        data: dict[str, Any] = {
            "text": outcome[0],
            "calls": [[c.id, c.name, c.arguments] for c in outcome[1]],
        }
        if call.toolsets:
            data["tools"] = recorded(call.tools.values())
        return data

    def decode(data: dict[str, Any]) -> tuple[str, list[ToolCall]]:
        if call.toolsets:
            call.tools = revive(call.functions, call.toolsets, list(data.get("tools") or ()))
        return (
            str(data["text"]),
            [ToolCall(str(i), str(n), str(a)) for i, n, a in data["calls"]],
        )

    def unit() -> Awaitable[tuple[str, list[ToolCall]]]:
        return journaled(
            call.frame,
            path,
            "agency.llm:round",
            ask,
            encode=encode,
            decode=decode,
            callsite=call.model.name,
            failures=RECORDED_FAILURES,
            observed=False,
            refer=_refer_to_reply,  # a round's answer is the message it put on the thread
            resolve=_resolve_reply,
        )

    obs = _observe.OBSERVER
    if obs is None or not will_replay(journal_of(call.frame.ctx), path):
        return await unit()
    with obs.chat(call.model.model, call.model.name, path, True):
        return await unit()


async def _answer(
    call: _Call, watch: _observe.ChatWatch | None, tool_choice: str | None = None
) -> tuple[str, list[ToolCall]]:
    """Ask the model once; put its answer on the thread and bill it (``watch``: report it)."""
    sent = call.thread.request_messages() if watch and watch.captures_content else None
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
        watch.answered(
            usage.prompt_tokens, usage.completion_tokens, pico_to_usd(pico),
            model=response.model, response_id=response.response_id,
            finish_reasons=response.finish_reasons,
        )  # fmt: skip
        if sent is not None:
            calls_sent = [c.to_openai() for c in calls]
            watch.content(sent, response.text, calls_sent, known_secrets(call.model))
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
            unreachable = "".join(
                f"; the MCP server {name!r} could not list its tools: {why}"
                for name, why in call.unreachable.items()
            )
            return failed(
                f"there is no tool named {tool_call.name!r} (tools: {known}){unreachable}"
            )
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
            result = await _called(chosen, arguments, tool_frame, path)
        except StepFailedError as exc:  # its last attempt failed: the model reads it
            return failed(f"{chosen.name} {exc}", exc)
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
    step = tool_call.name if chosen is None else chosen.step_name
    server = chosen.server if isinstance(chosen, McpTool) else None
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
            f"tool:{step}",
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
        replayed = will_replay(journal_of(call.frame.ctx), path)
        with obs.tool(name, tool_call.id, path, replayed, server=server) as watch:
            content = await unit()
    call.thread.push(Message.trusted("tool", content, tool_call_id=tool_call.id, name=name))


async def _called(chosen: Tool, arguments: dict[str, Any], frame: Frame, path: str) -> Any:
    """The tool's result: one call, or calls under its retry policy (each failed attempt
    journaled under the call's path; the last failure raises StepFailedError)."""

    def call() -> Any:
        return chosen.fn(**arguments)

    async def once(attempt: Callable[[], Any]) -> Any:
        result = attempt()
        return await result if inspect.isawaitable(result) else result

    if chosen.retries is None:
        return await once(call)
    journal = journal_of(frame.ctx)
    return await with_policy(
        frame, journal, path, f"tool:{chosen.name}", chosen.retries, chosen.timeout, call, once,
        record=False,
    )  # fmt: skip


def from_json_safe(text: str) -> Any:
    """The model's arguments as data for an approval question (the text when not JSON)."""
    try:
        return from_json(text or "{}")
    except ValueError:
        return text


def _brief(exc: Exception) -> str:
    return "; ".join(_errors_of(exc))[:500]


def _errors_of(exc: Exception) -> list[str]:
    if isinstance(exc, ValidationError):
        return [
            f"{'.'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}"
            for error in exc.errors()
        ]
    return [str(exc)]


_REFER_MIN = 64
"""Answers (an LLM call's, a round's) shorter than this are journaled as they are: a
reference would save nothing."""


def _refer_to_reply(data: dict[str, Any], changes: list[Change]) -> dict[str, Any]:
    """The answer's text as a reference to the assistant message that holds it.

    The call's changes (journaled with it) hold the answer as the thread's new assistant
    message; pointing at it (``{"text_at": i}``, ``i`` the change's index) stores the
    reply once instead of twice.
    """
    text = data.get("text")
    if not isinstance(text, str) or len(text) < _REFER_MIN:
        return data
    index = last_push(changes, text, role="assistant")
    if index is None:
        return data
    return {**{k: v for k, v in data.items() if k != "text"}, "text_at": index}


def _resolve_reply(data: dict[str, Any], changes: list[Change]) -> dict[str, Any]:
    """:func:`_refer_to_reply` undone: the text put back from the message it points at.

    Raises ``IndexError``/``KeyError``/``ValueError`` when the reference does not hold an
    assistant's text (the journal is then reported damaged).
    """
    if "text_at" not in data:
        return data
    return {**data, "text": pushed_text(changes, int(data["text_at"]), role="assistant")}
