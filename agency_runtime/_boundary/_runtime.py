"""The composition root: the process's registries, wired in one place.

Everything the runtime keeps for the whole process lives in one :class:`Runtime`:

* ``stores`` — the stores opened so far, one per URL (the store layer's registry);
* ``journals`` — journals of runs this process paused, so answering one needs no reload;
* ``entries`` — the entries declared, named or run here (the trust model of the store);
* ``locks`` — the global locks this process holds (``agency.lock(..., scope="global")``);
* ``providers`` — which LLM provider answers which model prefix;
* ``clock`` — the time leases, waits, guards and TTLs read.

The facade and the run boundary take them from :data:`RUNTIME`; layers below receive what
they need explicitly or from the run's context (its store and clock). The registries a lower
layer must reach outside any run — the open stores (``agency_runtime._store``), the held
global locks (``agency_runtime._locks``) and the provider routing (``agency_runtime._llm``)
— live with their concept, and the root refers
to those very objects, so this class is still the one place that lists them all.
:meth:`Runtime.configure` swaps the clock (tests drive a fake one). The root builds the stores
with its clock: the registry hands each store it opens a view of :attr:`Runtime.clock`
(:class:`RuntimeClock`), so leases are written and judged on one clock, the configured one.
"""

from __future__ import annotations

from .._bounds import check_whole
from .._clock import SYSTEM_CLOCK, Clock
from .._durable._entries import EntryRegistry
from .._durable._journal import PausedJournals
from .._errors import InvalidArgumentError
from .._llm._registry import PROVIDERS, ProviderRegistry
from .._locks import HELD, HeldLocks
from .._store._url import STORES, StoreRegistry

__all__ = ["RUNTIME", "Runtime", "RuntimeClock"]


class RuntimeClock:
    """The clock a runtime uses now, read at every call (so :meth:`Runtime.configure` also
    moves the stores opened before it)."""

    __slots__ = ("_runtime",)

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def time(self) -> float:
        return self._runtime.clock.time()

    def monotonic(self) -> float:
        return self._runtime.clock.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self._runtime.clock.sleep(seconds)

    def __repr__(self) -> str:
        return f"<RuntimeClock {self._runtime.clock!r}>"


class Runtime:
    """The process's registries (see the module docstring)."""

    __slots__ = ("clock", "entries", "journals", "locks", "max_run_depth", "providers", "stores")

    def __init__(
        self,
        *,
        stores: StoreRegistry,
        locks: HeldLocks,
        providers: ProviderRegistry,
        journals: PausedJournals | None = None,
        entries: EntryRegistry | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.stores = stores
        self.locks = locks
        self.providers = providers
        self.journals = journals if journals is not None else PausedJournals()
        self.entries = entries if entries is not None else EntryRegistry()
        self.clock = clock
        self.max_run_depth = DEFAULT_MAX_RUN_DEPTH
        """How deep child runs may nest when no ``std::run`` handler decides."""
        stores.clock = RuntimeClock(self)

    def configure(self, *, clock: Clock | None = None, max_run_depth: int | None = None) -> Clock:
        """Use ``clock`` for runs started from now on, and let child runs nest
        ``max_run_depth`` deep when no handler decides; return the clock used before."""
        if max_run_depth is not None:
            self.max_run_depth = check_whole(max_run_depth, "max_run_depth", 0, MAX_RUN_DEPTH)
        previous = self.clock
        if clock is not None:
            if not isinstance(clock, Clock):
                raise InvalidArgumentError(
                    f"clock must have time(), monotonic() and async sleep(), "
                    f"got {type(clock).__name__}"
                )
            self.clock = clock
        return previous

    def __repr__(self) -> str:
        return f"<Runtime clock={self.clock!r}>"


DEFAULT_MAX_RUN_DEPTH = 8
"""Child runs nest this deep by default (``agency.configure(max_run_depth=...)``)."""
MAX_RUN_DEPTH = 1000
"""The deepest ``max_run_depth`` may be set."""

RUNTIME = Runtime(stores=STORES, locks=HELD, providers=PROVIDERS)
"""The process's runtime: the one place process-wide state lives."""
