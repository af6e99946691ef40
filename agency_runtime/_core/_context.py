"""The run context, the per-branch state and the abort signal.

:class:`RuntimeContext` is shared by every frame of one run: run id, spend, tokens,
globals, cancellation. :class:`BranchState` belongs to one branch of execution (the TS
"state stack"): guards, handlers and the branch's abort signal. It is immutable; pushing a
guard or handler makes a new one, carried by a new frame.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from .._errors import AgencyCancelledError, InvalidArgumentError
from ._money import pico_to_usd, usd_to_pico

__all__ = ["AbortSignal", "BranchState", "RuntimeContext"]


class AbortSignal:
    """A one-shot cancellation flag that code can poll, await or subscribe to.

    A signal made with a ``parent`` fires when the parent fires, so a branch's signal
    follows the run's. Firing is idempotent: the first reason wins.
    """

    __slots__ = (
        "_aborted",
        "_callbacks",
        "_deadline",
        "_event",
        "_expire",
        "_lock",
        "_parent",
        "_reason",
    )

    def __init__(self, parent: AbortSignal | None = None) -> None:
        self._aborted = False
        self._reason: BaseException | None = None
        self._callbacks: list[Callable[[BaseException], None]] = []
        self._event: anyio.Event | None = None
        self._lock = threading.Lock()
        self._parent = parent
        self._deadline: float | None = None
        self._expire: Callable[[], BaseException] | None = None
        if parent is not None:
            parent.add_callback(self.abort)

    def set_deadline(self, deadline: float, expire: Callable[[], BaseException]) -> None:
        """Fire at ``deadline`` (``time.monotonic()`` seconds) with the reason ``expire()``.

        The signal fires when it is next looked at after the deadline (``aborted``,
        ``reason``, ``raise_if_aborted``, ``wait``): no timer thread is involved.
        """
        self._deadline = deadline
        self._expire = expire

    def _next_deadline(self) -> float | None:
        deadlines = []
        signal: AbortSignal | None = self
        while signal is not None:
            if signal._deadline is not None:
                deadlines.append(signal._deadline)
            signal = signal._parent
        return min(deadlines) if deadlines else None

    @property
    def aborted(self) -> bool:
        """Whether the signal has fired (a passed deadline or a fired parent fires it now)."""
        if self._aborted:
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.abort(self._expire() if self._expire is not None else None)
            return True
        parent = self._parent
        if parent is not None and parent.aborted:
            self.abort(parent.reason)
            return True
        return False

    @property
    def reason(self) -> BaseException | None:
        """The exception describing why the signal fired, or ``None`` while it has not."""
        return self._reason if self.aborted else None

    def abort(self, reason: BaseException | None = None) -> None:
        """Fire the signal (idempotent). ``reason`` defaults to ``AgencyCancelledError``."""
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            self._reason = reason if reason is not None else AgencyCancelledError()
            callbacks, self._callbacks = self._callbacks, []
            event = self._event
        if event is not None:
            event.set()
        for callback in callbacks:
            callback(self._reason)

    def add_callback(self, callback: Callable[[BaseException], None]) -> Callable[[], None]:
        """Call ``callback(reason)`` when the signal fires (at once if it already has).

        Returns a function that unsubscribes the callback.
        """
        with self._lock:
            if not self._aborted:
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        assert self._reason is not None
        callback(self._reason)
        return lambda: None

    def _remove(self, callback: Callable[[BaseException], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def raise_if_aborted(self) -> None:
        """Raise the abort reason if the signal has fired; do nothing otherwise."""
        if self.aborted:
            assert self._reason is not None
            raise self._reason

    async def wait(self) -> BaseException:
        """Wait until the signal fires and return its reason."""
        while not self.aborted:
            with self._lock:
                if self._event is None:
                    self._event = anyio.Event()
                event = self._event
            deadline = self._next_deadline()
            if deadline is None:
                await event.wait()
            else:
                with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                    await event.wait()
        assert self._reason is not None
        return self._reason

    def __repr__(self) -> str:
        state = f"aborted reason={self._reason!r}" if self._aborted else "pending"
        return f"<AbortSignal {state}>"


class RuntimeContext:
    """What every frame of one run shares: its id, its spend, its globals, cancellation.

    Cost is kept exactly (integer pico-dollars) and only ever grows; :attr:`cost` reports
    it in US dollars.
    """

    __slots__ = (
        "_cost_pico",
        "_lock",
        "_tokens",
        "abort_signal",
        "globals",
        "journal",
        "locks",
        "memory",
        "model",
        "run_id",
        "subprocess_depth",
    )

    def __init__(
        self,
        run_id: str | None = None,
        *,
        model: str | None = None,
        globals: dict[str, dict[str, Any]] | None = None,
        subprocess_depth: int = 0,
        cost: float = 0.0,
        tokens: int = 0,
    ) -> None:
        if subprocess_depth < 0:
            raise InvalidArgumentError(
                f"subprocess_depth must be 0 or more, got {subprocess_depth}"
            )
        if tokens < 0:
            raise InvalidArgumentError(f"tokens must be 0 or more, got {tokens}")
        self.run_id = run_id
        self.model = model
        self.globals: dict[str, dict[str, Any]] = globals if globals is not None else {}
        self.subprocess_depth = subprocess_depth
        self.abort_signal = AbortSignal()
        self.journal: Any = None  # the run's RunJournal, set by the run boundary
        self.locks: Any = None  # the run's named locks (agency_runtime._locks), made lazily
        self.memory: Any = None  # the run's agency.memory state (agency_runtime._memory), lazily
        self._cost_pico = usd_to_pico(cost, what="cost")
        self._tokens = tokens
        self._lock = threading.Lock()

    @property
    def cost(self) -> float:
        """Total spend of the run so far, in US dollars."""
        return pico_to_usd(self._cost_pico)

    @property
    def cost_pico(self) -> int:
        """Total spend of the run so far, in exact integer pico-dollars (1e-12 USD)."""
        return self._cost_pico

    @property
    def tokens(self) -> int:
        """Total tokens billed to the run so far."""
        return self._tokens

    def charge(self, *, pico: int = 0, tokens: int = 0) -> None:
        """Add spend and tokens to the run's totals (never negative)."""
        if pico < 0 or tokens < 0:
            raise InvalidArgumentError("run cost and tokens never decrease")
        with self._lock:
            self._cost_pico += pico
            self._tokens += tokens

    def cancel(self, reason: str | None = None) -> None:
        """Cancel the run (idempotent): fires the run's abort signal.

        Work that awaits inside the run is cancelled, and the run ends with
        ``status="cancelled"``.
        """
        message = "Agent execution was cancelled"
        if reason:
            message = f"{message}: {reason}"
        self.abort_signal.abort(AgencyCancelledError(message, cause={"kind": "userKill"}))

    def is_cancelled(self) -> bool:
        """Whether :meth:`cancel` has been called."""
        return self.abort_signal.aborted

    def __repr__(self) -> str:
        return (
            f"<RuntimeContext run_id={self.run_id!r} cost={self.cost!r} "
            f"tokens={self._tokens} cancelled={self.is_cancelled()}>"
        )


@dataclass(frozen=True, slots=True)
class BranchState:
    """State private to one branch of execution: guards, handlers, abort signal.

    Immutable: installing a guard or handler produces a new ``BranchState`` (see
    :meth:`evolve`) carried by a new frame, so sibling branches never see each other's.
    """

    abort_signal: AbortSignal = field(default_factory=AbortSignal)
    guards: tuple[Any, ...] = ()
    handlers: tuple[Any, ...] = ()
    handler_depth: int = 0
    """How many interrupt handlers are running around this branch (0 outside any)."""

    @classmethod
    def for_context(cls, ctx: RuntimeContext) -> BranchState:
        """The root branch of a run: its abort signal follows ``ctx.cancel()``."""
        return cls(abort_signal=AbortSignal(parent=ctx.abort_signal))

    def evolve(self, **changes: Any) -> BranchState:
        """Return a copy with ``changes`` applied."""
        return replace(self, **changes)
