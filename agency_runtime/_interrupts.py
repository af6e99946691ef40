"""Human-in-the-loop interrupts and the handler chain.

``await agency.interrupt(effect, message, data)`` asks a question. The handlers installed
around the call (``agency.with_handler`` / ``with agency.handler(h):``) are visited
innermost first, every one of them: a rejection stops the walk; a ``propagate`` beats any
approval; otherwise the outermost approval wins. A handler never hears an interrupt raised
by its own code, and handlers nested more than ten deep raise ``HandlerRecursionError``.

When no handler decides, the run pauses: ``RunPaused`` travels to the run boundary, which
stores the interrupt and returns ``RunResult(status="paused")``.

An interrupt's identity is its *position* (DESIGN §11.1), never its content or the order of
asking: the run, the address it is asked at and an ordinal among the asks at that address.
``agency.interrupt`` asks at its task's causal position (the frame's address, branch-
qualified for a concurrent task, §10.2): a scope step, a tool call and a memory operation
each run at their own address, so what they ask is numbered apart from their caller's. A
tool approval is the first ask at its tool call's address; a guard trip is asked at the LLM
call or tool round that tripped it (``ask(..., at=...)``). So an answer only ever answers
the call it was given for, and a question skipped on replay (its tool call finished
already) shifts no other ordinal. Once an answer is stored, the same position returns it
(without running handlers) when the run continues.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import anyio.lowlevel
from pydantic import ConfigDict
from pydantic_core import PydanticSerializationError, from_json, to_json

from ._core import _observe
from ._core._branches import qualify
from ._core._frame import Frame, call_in_frame, current_frame, position_of, use_frame
from ._core._jsondata import check_text, json_problem
from ._durable._journal import RunJournal, journal_of
from ._errors import (
    HandlerRecursionError,
    InvalidArgumentError,
    NondeterminismError,
    NotInRunError,
    RunPaused,
)
from ._types import DeferredModel, Interrupt, InterruptResponse

__all__ = [
    "MAX_HANDLER_DEPTH",
    "Handler",
    "HandlerDecision",
    "approve",
    "ask",
    "interrupt",
    "interrupt_id",
    "pass_",
    "propagate",
    "reject",
]

T = TypeVar("T")

MAX_HANDLER_DEPTH = 10
"""Handlers may run inside handlers up to this depth."""


class HandlerDecision(DeferredModel):
    """What a handler decided: approve, reject, propagate (defer upward) or pass."""

    model_config = ConfigDict(frozen=True)

    type: Literal["approve", "reject", "propagate", "pass"]
    value: Any = None


Decision = InterruptResponse | HandlerDecision | None
Handler = Callable[[Interrupt], Decision | Awaitable[Decision]]
"""A handler gets the :class:`Interrupt` and returns a decision (or ``None`` to pass)."""


def approve(value: Any = None) -> InterruptResponse:
    """Approve an interrupt, optionally with a value for the code that asked."""
    return InterruptResponse(type="approve", value=value)


def reject(value: Any = None) -> InterruptResponse:
    """Reject an interrupt, optionally with a value for the code that asked."""
    return InterruptResponse(type="reject", value=value)


def propagate() -> HandlerDecision:
    """Defer to the outer handlers and, failing them, to a human (beats approvals)."""
    return HandlerDecision(type="propagate")


def pass_() -> HandlerDecision:
    """Express no opinion (the same as returning ``None``)."""
    return HandlerDecision(type="pass")


def interrupt_id(run_id: str, address: str, ordinal: int | str) -> str:
    """The deterministic id of the ``ordinal``-th interrupt at ``address`` of a run.

    ``ordinal`` is a plain number for the task that opened ``address``, a branch-qualified
    token (``"2.0:0"``) for a concurrent branch (see :mod:`agency_runtime._core._branches`).
    """
    import hashlib  # on first use: it loads OpenSSL, which importing agency_runtime needs not

    digest = hashlib.blake2b(f"{run_id}\x00{address}\x00{ordinal}".encode(), digest_size=10)
    return f"intr_{digest.hexdigest()}"


def _push_handler(handler: Handler, member: str) -> Frame:
    if not callable(handler):
        raise InvalidArgumentError(
            f"agency.{member} needs a handler callable taking an Interrupt, "
            f"got {type(handler).__name__}"
        )
    frame = current_frame(member)
    return frame.evolve(stack=frame.stack.evolve(handlers=(*frame.stack.handlers, handler)))


def with_handler(handler: Handler, fn: Callable[[], T | Awaitable[T]]) -> Awaitable[T]:
    """Run ``fn`` with ``handler`` installed; it is removed when ``fn`` ends or raises."""
    if not callable(fn):
        raise InvalidArgumentError("agency.with_handler needs fn: a callable taking no arguments")
    return call_in_frame(_push_handler(handler, "with_handler()"), fn)


@contextmanager
def handler(handler: Handler) -> Iterator[None]:
    """``with agency.handler(h):`` — the context-manager form of :func:`with_handler`."""
    with use_frame(_push_handler(handler, "handler()")):
        yield


def _as_decision(result: object, handler: Handler) -> HandlerDecision | InterruptResponse | None:
    if result is None or isinstance(result, InterruptResponse | HandlerDecision):
        return result
    raise InvalidArgumentError(
        f"Handler returned invalid result type: {type(result).__name__} from {handler!r}; "
        "return approve(...), reject(...), propagate(), pass_() or None"
    )


async def dispatch(frame: Frame, asked: Interrupt) -> InterruptResponse | None:
    """Walk the handler chain; the decision, or ``None`` when nobody decided."""
    stack = frame.stack
    handlers = stack.handlers
    if not handlers:
        return None
    if stack.handler_depth >= MAX_HANDLER_DEPTH:
        raise HandlerRecursionError(
            f"interrupt handlers nested more than {MAX_HANDLER_DEPTH} deep while handling "
            f"{asked.effect!r}: a handler keeps raising interrupts that handlers answer by "
            "raising more"
        )
    approvals: list[InterruptResponse] = []
    propagated = False
    for index in range(len(handlers) - 1, -1, -1):
        stack.abort_signal.raise_if_aborted()
        current = handlers[index]
        others = handlers[:index] + handlers[index + 1 :]
        inner = frame.evolve(
            stack=stack.evolve(handlers=others, handler_depth=stack.handler_depth + 1)
        )
        decision = _as_decision(
            await call_in_frame(inner, lambda h=current: h(asked)),  # type: ignore[misc]
            current,
        )
        if decision is None or decision.type == "pass":
            continue
        if decision.type == "reject":
            return decision if isinstance(decision, InterruptResponse) else reject(decision.value)
        if decision.type == "approve":
            approvals.append(
                decision if isinstance(decision, InterruptResponse) else approve(decision.value)
            )
        else:
            propagated = True
    if propagated or not approvals:
        return None
    return approvals[-1]  # the outermost approval wins


def _same_question(recorded: Interrupt, effect: str, message: str, data: Any) -> bool:
    """Whether a recorded question is the one asked now (its answer may be handed over).

    A guard's question is identified by its guard id, not its text (the text shows the time
    spent, which differs on every replay).
    """
    if recorded.effect != effect:
        return False
    if effect == "std::guard":
        before = recorded.data if isinstance(recorded.data, dict) else {}
        now = data if isinstance(data, dict) else {}
        return before.get("guard_id") == now.get("guard_id")
    return recorded.message == message


async def interrupt(
    effect: str = "unknown",
    message: str = "",
    data: Any = None,
    expects_value: bool = False,
) -> InterruptResponse:
    """Ask a question; return the handlers' decision, or pause the run for a human answer."""
    return await ask(current_frame("interrupt()"), effect, message, data, expects_value)


async def ask(
    frame: Frame,
    effect: str,
    message: str = "",
    data: Any = None,
    expects_value: bool = False,
    *,
    at: str | None = None,
) -> InterruptResponse:
    """:func:`interrupt` in an explicit frame (the guard gate asks with fewer handlers).

    ``at``: the position of the call this question is about (a tool call's or an LLM
    call's journal path). Asks there are counted at that position alone and never tick the
    task's causal position, so whether they happen (a guard trips on one execution and not
    on another, a finished tool call asks nothing on replay) changes no other address.
    Without ``at`` the question is asked at the task's causal position, as
    :func:`interrupt` does.
    """
    if not isinstance(effect, str) or not effect.strip():
        raise InvalidArgumentError(
            f"an interrupt's effect must be a non-empty string, got {effect!r}"
        )
    if not isinstance(message, str):
        raise InvalidArgumentError(
            f"an interrupt's message must be a string, got {type(message).__name__}"
        )
    check_text(effect, "an interrupt's effect")
    check_text(message, "an interrupt's message")
    problem = json_problem(data)
    if problem is not None:
        raise InvalidArgumentError(
            f"interrupt data must be JSON data, since it is stored: {problem}"
        )
    try:
        data = from_json(to_json(data))  # what is stored is what everyone sees
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"interrupt data must be JSON data or pydantic models, since it is stored ({exc})"
        ) from exc
    journal = journal_of(frame.ctx)
    if at is None:
        address = position_of(frame).address
        key = _task_position(journal, address, effect)
    else:
        address = at
        key = interrupt_id(journal.run_id or "", at, journal.ordinal(at, "interrupt"))
    journal.claimed.add(key)  # replayed: asked again (answered or still pending)
    obs = _observe.OBSERVER
    if obs is None:
        return await _answer(frame, journal, key, address, effect, message, data, expects_value)
    with obs.interrupt(effect, key, key in journal.answers) as watch:
        answer = await _answer(frame, journal, key, address, effect, message, data, expects_value)
        watch.decided(answer.type)
    return answer


RUNTIME_EFFECTS = frozenset({"std::tool-approval", "std::guard"})
"""The runtime's own questions: asked at the call they are about (``ask(..., at=...)``)."""


def _task_position(journal: RunJournal, address: str, effect: str) -> str:
    """The id of the next interrupt (``effect``) the current task asks at ``address``.

    Before the third release the runtime's own questions were counted among their caller's
    asks (a tool approval at the LLM call's address, a guard trip at the guard's). An
    answer such a question got there (a run paused before the upgrade) keeps its ordinal,
    so the asks after it keep theirs, and is never handed to another kind of question.
    """
    branch, ordinal = journal.count(address, "interrupt")
    run_id = journal.run_id or ""
    while True:
        key = interrupt_id(run_id, address, qualify(branch, str(ordinal)))
        before = journal.asked.get(key)
        if before is None or before.effect not in RUNTIME_EFFECTS or before.effect == effect:
            return key
        ordinal = journal.ordinal(address, "interrupt", branch)


async def _answer(
    frame: Frame,
    journal: RunJournal,
    key: str,
    address: str,
    effect: str,
    message: str,
    data: Any,
    expects_value: bool,
) -> InterruptResponse:
    """The answer to interrupt ``key``: the journal's, the handlers', or a pause."""
    answer = journal.answers.get(key)
    if answer is not None:
        asked_before = journal.asked.get(key)
        if asked_before is not None and not _same_question(asked_before, effect, message, data):
            raise NondeterminismError(
                f"run {journal.run_id!r} asked interrupt {key} at {address or 'the run root'!r} "
                f"as {effect!r} ({message!r}), but the journal recorded an answer to "
                f"{asked_before.effect!r} ({asked_before.message!r}) there. The code changed "
                "under an in-flight run (or asks in an order that is not deterministic): "
                "restore the old code to finish it, guard the change with "
                "`if agency.patched('change-id'):`, or start a new run."
            )
        return answer
    asked = Interrupt(
        interrupt_id=key,
        effect=effect,
        message=message,
        data=data,
        origin=frame.callsite[0] if frame.callsite else "",
        run_id=journal.run_id,
        expects_value=expects_value,
    )
    decision = await dispatch(frame, asked)
    if decision is not None:
        return decision
    if frame.stack.handler_depth > 0:
        return reject(
            f'Cannot ask the user about "{effect}" from inside a handler function: no other '
            "handler answered it, and a handler cannot pause the run"
        )
    if not journal.durable:
        raise NotInRunError(
            f"agency.interrupt({effect!r}) got no answer from a handler and would pause the "
            "run, but this frame belongs to no run: call it inside agency.run(...), or "
            "install a handler with agency.with_handler(...)"
        )
    journal.paused.append(asked)
    # Let sibling tasks reach their own interrupts before this one unwinds the task group.
    await anyio.lowlevel.checkpoint()
    raise RunPaused([asked])
