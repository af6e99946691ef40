"""The run context and the per-branch state.

:class:`RuntimeContext` is shared by every frame of one run: run id, model (a model string
or an ``agency.Model``), store, clock, spend, tokens, globals, cancellation, and the typed
state features keep per run (:class:`Slot`). :class:`BranchState` belongs to one branch of
execution (the TS "state stack"): guards, handlers and the branch's abort signal. It is
immutable; pushing a guard or handler makes a new one, carried by a new frame.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import AgencyCancelledError, GuardExceededError, InvalidArgumentError
from ._cancel import AbortSignal
from ._money import pico_to_usd, usd_to_pico

if TYPE_CHECKING:
    from .._store import Store
    from .._types import Interrupt

__all__ = ["BranchState", "GuardLike", "NamedModel", "RuntimeContext", "Slot"]

T = TypeVar("T")


class NamedModel(Protocol):
    """What the context needs of a run's model object (an ``agency.Model``): its name.

    The LLM layer owns the model type; the context only carries it, so it names no layer
    above it."""

    @property
    def name(self) -> str: ...


class Slot(Generic[T]):
    """A typed key for state a feature keeps per run (``ctx.get(SLOT)``, ``ctx.put(...)``).

    The feature that owns the state defines the slot, so the context knows nothing of it and
    still hands back the right type.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<Slot {self.name}>"


class GuardLike(Protocol):
    """What a branch's guard offers whoever walks the branch's guards."""

    @property
    def guard_id(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def label(self) -> str | None: ...

    @property
    def handlers_at_install(self) -> int: ...

    def over(self) -> bool: ...

    def error(self) -> GuardExceededError: ...


Handler = Callable[["Interrupt"], Any]
"""An interrupt handler (see :mod:`agency_runtime._interrupts`)."""


class RuntimeContext:
    """What every frame of one run shares: its id, store, clock, spend, globals, cancellation.

    Cost is kept exactly (integer pico-dollars) and only ever grows; :attr:`cost` reports
    it in US dollars. ``store`` is the run's store (resolved once, when the run starts;
    ``None`` in a test frame); ``clock`` the time every part of the run reads.
    """

    __slots__ = (
        "_cost_pico",
        "_lock",
        "_state",
        "_tokens",
        "abort_signal",
        "clock",
        "globals",
        "model",
        "run_id",
        "store",
        "subprocess_depth",
    )

    def __init__(
        self,
        run_id: str | None = None,
        *,
        model: str | NamedModel | None = None,
        globals: dict[str, dict[str, Any]] | None = None,
        subprocess_depth: int = 0,
        cost: float = 0.0,
        tokens: int = 0,
        store: Store | None = None,
        clock: Clock | None = None,
    ) -> None:
        if subprocess_depth < 0:
            raise InvalidArgumentError(
                f"subprocess_depth must be 0 or more, got {subprocess_depth}"
            )
        if tokens < 0:
            raise InvalidArgumentError(f"tokens must be 0 or more, got {tokens}")
        self.run_id = run_id
        self.model: str | NamedModel | None = model
        """The default model of the run's ``agency.llm`` calls: an ``agency.Model`` (the one
        given, or registered under the run's stored model name), a model string, or
        ``None``; :attr:`model_name` is what the run records."""
        self.store = store
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.globals: dict[str, dict[str, Any]] = globals if globals is not None else {}
        self.subprocess_depth = subprocess_depth
        self.abort_signal = AbortSignal(clock=self.clock)
        self._state: dict[Slot[Any], object] = {}
        self._cost_pico = usd_to_pico(cost, what="cost")
        self._tokens = tokens
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str | None:
        """The name of the run's model (what its record stores), or ``None``."""
        model = self.model
        return model if model is None or isinstance(model, str) else model.name

    # -- feature state -----------------------------------------------------------------------

    def get(self, slot: Slot[T]) -> T | None:
        """The run's state for ``slot``, or ``None`` when the feature keeps none yet."""
        return cast("T | None", self._state.get(slot))

    def put(self, slot: Slot[T], value: T) -> T:
        """Keep ``value`` as the run's state for ``slot``; return it."""
        self._state[slot] = value
        return value

    def ensure(self, slot: Slot[T], make: Callable[[], T]) -> T:
        """The run's state for ``slot``, made with ``make()`` the first time it is asked."""
        state = self._state.get(slot)
        if state is None:
            state = self._state[slot] = make()
        return cast("T", state)

    # -- spend -------------------------------------------------------------------------------
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
    guards: tuple[GuardLike, ...] = ()
    handlers: tuple[Handler, ...] = ()
    handler_depth: int = 0
    """How many interrupt handlers are running around this branch (0 outside any)."""

    @classmethod
    def for_context(cls, ctx: RuntimeContext) -> BranchState:
        """The root branch of a run: its abort signal follows ``ctx.cancel()``."""
        return cls(abort_signal=AbortSignal(parent=ctx.abort_signal, clock=ctx.clock))

    def evolve(self, **changes: Any) -> BranchState:
        """Return a copy with ``changes`` applied."""
        return replace(self, **changes)
