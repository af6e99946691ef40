"""Cost and time guards, and billing spend to the run and to every guard in scope.

* A :class:`CostGuard` counts the spend made after it was installed (exact pico-dollars)
  and trips when that spend is **strictly** over its limit. ``agency.add_cost`` raises
  :class:`GuardExceededError` at once; an LLM call that crosses a guard raises a resumable
  ``std::guard`` interrupt after the call (see :func:`gate`), whose approval can add budget.
* A :class:`TimeGuard` cancels the work inside it (anyio cancellation) and fires the
  branch's abort signal when its time is up; the block then raises
  :class:`GuardExceededError` with ``type="time"``.

Spend and grants made inside a journaled step are recorded with the step (``["cost", …]``
and ``["grant", …]`` changes), so when the step is replayed its spend counts toward the
guards again and its grants hold: budgets survive resume.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import anyio

from ._bounds import check_seconds
from ._clock import SYSTEM_CLOCK, Clock, SystemClock
from ._core import _observe
from ._core._branches import report_change, report_spend
from ._core._cancel import AbortSignal
from ._core._changes import Change
from ._core._frame import Frame, call_in_frame, current_frame, position_of, use_frame
from ._core._money import format_usd, pico_to_usd, usd_to_pico
from ._durable._journal import journal_of
from ._durable._replay import register_change
from ._errors import GuardApproveError, GuardExceededError, InvalidArgumentError

__all__ = [
    "CostGuard",
    "TimeGuard",
    "charge",
    "cost_guard",
    "gate",
    "time_guard",
    "with_cost_guard",
    "with_time_guard",
]

T = TypeVar("T")


class CostGuard:
    """A spend budget for the code inside it (US dollars, kept exactly)."""

    __slots__ = ("disarmed", "guard_id", "handlers_at_install", "label", "limit_pico", "spent_pico")

    type: Literal["cost"] = "cost"

    def __init__(self, guard_id: str, limit_pico: int, label: str | None, handlers: int) -> None:
        self.guard_id = guard_id
        self.label = label
        self.limit_pico = limit_pico
        self.spent_pico = 0
        self.disarmed = False
        self.handlers_at_install = handlers

    @property
    def limit(self) -> float:
        """The budget in US dollars (grants included)."""
        return pico_to_usd(self.limit_pico)

    @property
    def spent(self) -> float:
        """What was spent inside the guard, in US dollars."""
        return pico_to_usd(self.spent_pico)

    def over(self) -> bool:
        """Whether the spend is strictly over the budget (and the guard is armed)."""
        return not self.disarmed and self.spent_pico > self.limit_pico

    def error(self) -> GuardExceededError:
        """The error describing this guard's trip."""
        return GuardExceededError("cost", self.limit, self.spent, self.guard_id, self.label)

    def __repr__(self) -> str:
        return f"<CostGuard {self.guard_id} spent={self.spent} limit={self.limit}>"


class TimeGuard:
    """A time budget for the code inside it (seconds of the run's clock)."""

    __slots__ = (
        "_disarm",
        "clock",
        "guard_id",
        "handlers_at_install",
        "label",
        "limit",
        "scope",
        "signal",
        "started",
    )

    type: Literal["time"] = "time"

    def __init__(
        self,
        guard_id: str,
        limit: float,
        label: str | None,
        handlers: int,
        signal: AbortSignal,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.guard_id = guard_id
        self.label = label
        self.limit = limit
        self.clock = clock
        self.started = clock.monotonic()
        self.signal = signal
        self.scope: anyio.CancelScope | None = None
        self.handlers_at_install = handlers
        self._disarm: Callable[[], None] | None = None

    @property
    def spent(self) -> float:
        """Seconds since the guard was installed."""
        return self.clock.monotonic() - self.started

    def over(self) -> bool:
        """Whether the time is up."""
        return self.spent >= self.limit

    def error(self) -> GuardExceededError:
        """The error describing this guard's trip."""
        return GuardExceededError(
            "time", self.limit, round(self.spent, 6), self.guard_id, self.label
        )

    def arm(self, scope: anyio.CancelScope) -> None:
        """Cancel ``scope`` when the time is up (again after :meth:`extend`).

        On the system clock that is the scope's own deadline; on another clock (a test's
        fake one) a timer of that clock cancels it, so advancing fake time trips the guard.
        """
        self.scope = scope
        remaining = self.started + self.limit - self.clock.monotonic()
        if isinstance(self.clock, SystemClock):
            scope.deadline = anyio.current_time() + remaining
            return
        if self._disarm is not None:
            self._disarm()
        call_at = getattr(self.clock, "call_at", None)
        if callable(call_at):
            self._disarm = call_at(self.started + self.limit, scope.cancel)
        else:  # a clock without timers: the scope's deadline is the best available
            scope.deadline = anyio.current_time() + remaining

    def extend(self, seconds: float) -> None:
        """Add ``seconds`` to the budget (a grant), moving the deadline with it."""
        self.limit += seconds
        if self.scope is not None:
            self.arm(self.scope)
        self.signal.set_deadline(self.started + self.limit, self.error)

    def disarm(self) -> None:
        """Stop the timer (the block ended)."""
        if self._disarm is not None:
            self._disarm()
            self._disarm = None

    def __repr__(self) -> str:
        return f"<TimeGuard {self.guard_id} spent={self.spent:.3f}s limit={self.limit}s>"


Guard = CostGuard | TimeGuard


def _guard_id(frame: Frame, kind: str) -> str:
    journal = journal_of(frame.ctx)
    address = position_of(frame).address
    return f"{kind}-guard:{address or '/'}#{journal.next_token(address, f'{kind}-guard')}"


# -- billing -----------------------------------------------------------------------------------


def charge(frame: Frame, *, pico: int = 0, tokens: int = 0, enforce: bool = True) -> None:
    """Bill spend to the run and to every cost guard of the frame's branch.

    With ``enforce``, a guard that is now strictly over its budget (or a time guard whose
    time is up) raises :class:`GuardExceededError` at once (``agency.add_cost``). An LLM
    call bills without enforcing, then goes through :func:`gate`.
    """
    frame.ctx.charge(pico=pico, tokens=tokens)
    charge_guards(frame, pico)
    if pico or tokens:
        report_spend(pico, tokens)
        report_change(["cost", pico, tokens])
    if enforce:
        for guard in reversed(frame.stack.guards):
            if guard.over():
                error = guard.error()
                obs = _observe.OBSERVER
                if obs is not None:
                    with obs.guard(
                        guard.type, guard.guard_id, guard.label, error.limit, error.spent
                    ):
                        raise error
                raise error


def charge_guards(frame: Frame, pico: int) -> None:
    """Add ``pico`` to the spend of every cost guard in the frame's branch."""
    if pico:
        for guard in frame.stack.guards:
            if isinstance(guard, CostGuard):
                guard.spent_pico += pico


def find_guard(frame: Frame, guard_id: str) -> Guard | None:
    """The guard with ``guard_id`` in the frame's branch, if it is installed there."""
    for guard in frame.stack.guards:
        if isinstance(guard, CostGuard | TimeGuard) and guard.guard_id == guard_id:
            return guard
    return None


def apply_grant(guard: Guard, grant: list[Any]) -> None:
    """Apply a recorded ``["grant", guard_id, pico, seconds, disarm]`` to ``guard``."""
    _, _, pico, seconds, disarm = grant
    if isinstance(guard, CostGuard):
        guard.limit_pico += int(pico)
        guard.disarmed = guard.disarmed or bool(disarm)
    elif seconds:
        guard.extend(float(seconds))


def _replay_cost(frame: Frame, change: Change) -> None:
    charge_guards(frame, int(change[1]))


def _replay_grant(frame: Frame, change: Change) -> None:
    guard = find_guard(frame, str(change[1]))
    if guard is not None:
        apply_grant(guard, change)


register_change("cost", _replay_cost)
register_change("grant", _replay_grant)


# -- the std::guard interrupt ---------------------------------------------------------------------


def _number(value: object, key: str) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise GuardApproveError(f"guard approval error: {key} must be a number, got {value!r}")
    return max(0.0, float(value))


def _parse_grant(value: object) -> tuple[float, float, bool, str | None]:
    if value is None:
        return 0.0, 0.0, False, None
    if not isinstance(value, dict):
        raise GuardApproveError(
            "guard approval error: approve a guard with a dict such as "
            f'{{"max_cost": 0.5}} or {{"max_time": 30}}, got {type(value).__name__}'
        )
    cost = value.get("max_cost", value.get("maxCost"))
    seconds = value.get("max_time", value.get("maxTime"))
    message = value.get("message")
    return (
        _number(cost, "max_cost"),
        _number(seconds, "max_time"),
        bool(value.get("disarm", False)),
        message if isinstance(message, str) and message else None,
    )


async def gate(frame: Frame, at: str) -> None:
    """After an LLM call: turn each tripped guard into a ``std::guard`` interrupt.

    ``at`` is the journal path of the call (or tool round) that may have tripped them:
    the questions are asked at that position, one ordinal per tripped guard, so a trip is
    never confused with a user's interrupt or another call's trip (DESIGN §11.1), even
    when concurrent branches share a guard and trip it in another order on replay.

    Innermost guard first; extending an inner guard does not widen an outer one, so each
    guard over its budget is asked about in turn. Handlers installed inside the tripped
    guard cannot answer. An approval's ``max_cost``/``max_time`` add budget, ``disarm``
    disarms the guard and ``message`` is queued on the active thread; an approval that
    leaves the guard over raises :class:`GuardApproveError`; a rejection raises the guard's
    :class:`GuardExceededError`. Unanswered, the run pauses like any interrupt.
    """
    for guard in reversed(frame.stack.guards):
        if not isinstance(guard, CostGuard | TimeGuard) or not guard.over():
            continue
        obs = _observe.OBSERVER
        if obs is None:
            await _settle(frame, guard, at)
            continue
        error = guard.error()
        with obs.guard(guard.type, guard.guard_id, guard.label, error.limit, error.spent):
            await _settle(frame, guard, at)
        # Go on outwards: every guard this call pushed over its budget is asked about.


async def _settle(frame: Frame, guard: Guard, at: str) -> None:
    """Ask about ``guard``, over its budget; apply the grant, or raise its error."""
    from ._interrupts import ask  # the interrupt layer sits beside guards, not below them

    error = guard.error()
    name = f'guard "{guard.label}"' if guard.label else f"the {guard.type} guard"
    if guard.type == "cost":
        spent, limit = format_usd(error.spent), format_usd(error.limit)
    else:
        spent, limit = f"{error.spent:.3f}s", f"{error.limit}s"
    asking = frame.evolve(
        stack=frame.stack.evolve(handlers=frame.stack.handlers[: guard.handlers_at_install])
    )
    answer = await ask(
        asking,
        "std::guard",
        f"{name} exceeded its {guard.type} budget: spent {spent} of {limit}. Approve more "
        "budget (max_cost / max_time), or reject to stop.",
        {
            "label": guard.label,
            "guard_id": guard.guard_id,
            "dimension": guard.type,
            "limit": error.limit,
            "spent": error.spent,
        },
        at=at,
    )
    if not answer.approved:
        raise error
    cost, seconds, disarm, message = _parse_grant(answer.value)
    grant = ["grant", guard.guard_id, usd_to_pico(cost, what="max_cost"), seconds, disarm]
    apply_grant(guard, grant)
    report_change(grant)
    if message is not None:
        frame.threads.get_or_create_active().queue_message(
            message, label=f"guard:{guard.label or guard.type}"
        )
    if guard.over():
        raise GuardApproveError(
            f"guard approval error: {name} is still over its {guard.type} budget after "
            f"the approval (spent {error.spent}, limit now {guard.error().limit}); approve "
            'with enough budget, e.g. {"max_cost": ...}, or reject'
        )


# -- installing guards -----------------------------------------------------------------------


def _check_fn(fn: object, member: str) -> None:
    if not callable(fn):
        raise InvalidArgumentError(f"agency.{member} needs fn: a callable taking no arguments")


def _install_cost(max_usd: float, label: str | None, member: str) -> Frame:
    frame = current_frame(member)
    limit = usd_to_pico(max_usd, what=f"{member}: max_usd")
    guard = CostGuard(_guard_id(frame, "cost"), limit, label, len(frame.stack.handlers))
    return frame.evolve(stack=frame.stack.evolve(guards=(*frame.stack.guards, guard)))


def with_cost_guard(
    max_usd: float, fn: Callable[[], T | Awaitable[T]], *, label: str | None = None
) -> Awaitable[T]:
    """Run ``fn`` under a spend budget of ``max_usd`` US dollars."""
    _check_fn(fn, "with_cost_guard()")
    return call_in_frame(_install_cost(max_usd, label, "with_cost_guard()"), fn)


@asynccontextmanager
async def cost_guard(max_usd: float, *, label: str | None = None) -> AsyncIterator[CostGuard]:
    """``async with agency.cost_guard(0.50):`` — the context-manager form of a cost guard."""
    frame = _install_cost(max_usd, label, "cost_guard()")
    guard = frame.stack.guards[-1]
    assert isinstance(guard, CostGuard)
    with use_frame(frame):
        yield guard


@asynccontextmanager
async def time_guard(seconds: float, *, label: str | None = None) -> AsyncIterator[TimeGuard]:
    """``async with agency.time_guard(30):`` — cancel the block after ``seconds``.

    When the time is up, the work inside is cancelled (LLM calls, sleeps, anything that
    awaits), the branch's abort signal fires (for loops that poll it, even in a worker
    thread), and the block raises :class:`GuardExceededError` with ``type="time"`` — also
    when the work noticed the signal and stopped by itself. Exceptions from the block pass
    through unchanged.
    """
    limit = check_seconds(seconds, "agency.time_guard(): seconds", positive=True)
    frame = current_frame("time_guard()")
    signal = AbortSignal(parent=frame.stack.abort_signal)
    guard = TimeGuard(
        _guard_id(frame, "time"), limit, label, len(frame.stack.handlers), signal,
        frame.ctx.clock,
    )  # fmt: skip
    signal.set_deadline(guard.started + limit, guard.error)
    inner = frame.evolve(
        stack=frame.stack.evolve(guards=(*frame.stack.guards, guard), abort_signal=signal)
    )
    try:
        with anyio.CancelScope() as scope:
            guard.arm(scope)
            with use_frame(inner):
                yield guard
    finally:
        guard.disarm()
    if scope.cancelled_caught or guard.over():
        error = guard.error()
        signal.abort(error)
        raise error


async def with_time_guard(
    seconds: float, fn: Callable[[], T | Awaitable[T]], *, label: str | None = None
) -> T:
    """Run ``fn`` with at most ``seconds`` of wall time (see :func:`time_guard`)."""
    _check_fn(fn, "with_time_guard()")
    async with time_guard(seconds, label=label):
        result = fn()
        if inspect.isawaitable(result):
            result = await result
        return result
    raise AssertionError("unreachable")  # pragma: no cover - the block raised or returned
