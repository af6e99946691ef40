"""The ``agency`` namespace: thin, typed wrappers over the current frame.

Every member reads the current :class:`~agency_runtime._core._frame.Frame`. Strict readers raise
:class:`OutsideFrameError` (naming the member and the fix) outside a frame; lax readers
(``ctx_maybe``, ``callsite``, ``thread.store_maybe``, ``threads.current``) return ``None``.
Every ``with_x(..., fn)`` takes a sync or async ``fn`` and returns an awaitable of its
result; each has a context-manager form that installs the same frame.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ._boundary._admin import RunsNamespace
from ._boundary._children import run as _run
from ._boundary._queue import QueuesNamespace, enqueue
from ._boundary._resume import respond_to_interrupts, resume
from ._boundary._run import run_sync as _run_sync
from ._boundary._runtime import RUNTIME
from ._boundary._schedules import SchedulesNamespace
from ._boundary._worker import Worker as _Worker
from ._checkpoints import create_checkpoint, get_checkpoint, restore
from ._clock import Clock
from ._core._branches import run_root
from ._core._cancel import AbortSignal
from ._core._context import BranchState, RuntimeContext
from ._core._frame import (
    CallsiteLocation,
    Frame,
    call_in_frame,
    current_frame,
    current_frame_maybe,
    use_frame,
)
from ._core._money import usd_to_pico
from ._core._threads import (
    Message,
    MessageContent,
    MessageThread,
    ThreadInfo,
    ThreadStore,
    normalize_thread_id,
)
from ._errors import InvalidArgumentError
from ._guards import charge, cost_guard, time_guard, with_cost_guard, with_time_guard
from ._interrupts import handler, interrupt, with_handler
from ._llm import _mcp
from ._llm._chat import llm as _llm
from ._llm._model import Model as _Model
from ._llm._model import register_model, unregister_model
from ._llm._stream import llm_stream
from ._llm._tools import tool
from ._locks import lock, with_lock
from ._patches import patched
from ._policies import Retry as _Retry
from ._scope import with_resumable_scope
from ._waits import sleep, wait_for_event

if TYPE_CHECKING:
    from ._llm._call import TokenCallback
    from ._llm._chat import OnMaxToolRounds
    from ._llm._mcp import McpServer
    from ._llm._tools import Tool
    from ._memory import MemoryNamespace
    from ._store import Store
    from ._types import RunResult

__all__ = ["Agency", "agency"]

T = TypeVar("T")
M = TypeVar("M")
F = TypeVar("F", bound=Callable[..., Any])
Fn = Callable[[], T | Awaitable[T]]


def _check_fn(fn: object, member: str) -> None:
    if not callable(fn):
        raise InvalidArgumentError(
            f"agency.{member} needs a callable taking no arguments (sync or async), "
            f"got {type(fn).__name__}"
        )


class ThreadNamespace:
    """``agency.thread``: the active message thread of the current frame."""

    def current(self) -> MessageThread:
        """The active thread; one is created and made active when there is none."""
        return current_frame("thread.current()").threads.get_or_create_active()

    def user(self, content: MessageContent) -> None:
        """Push a user message onto the active thread."""
        current_frame("thread.user()").threads.get_or_create_active().add("user", content)

    def system(self, content: MessageContent) -> None:
        """Push a system message onto the active thread."""
        current_frame("thread.system()").threads.get_or_create_active().add("system", content)

    def assistant(self, content: MessageContent) -> None:
        """Push an assistant message onto the active thread."""
        current_frame("thread.assistant()").threads.get_or_create_active().add("assistant", content)

    def store(self) -> ThreadStore:
        """The current frame's :class:`ThreadStore`."""
        return current_frame("thread.store()").threads

    def store_maybe(self) -> ThreadStore | None:
        """The current frame's :class:`ThreadStore`, or ``None`` outside a frame."""
        frame = current_frame_maybe()
        return None if frame is None else frame.threads

    def _switched(self, thread_id: str | int, member: str) -> Frame:
        frame = current_frame(member)
        return frame.evolve(threads=frame.threads.view_creating(thread_id))

    def with_(self, thread_id: str | int, fn: Fn[T]) -> Awaitable[T]:
        """Run ``fn`` with ``thread_id`` as the active thread; the switch ends with ``fn``.

        A thread id not created yet is created (empty) under exactly that id; the previous
        thread is active again afterwards.
        """
        _check_fn(fn, "thread.with_()")
        return call_in_frame(self._switched(thread_id, "thread.with_()"), fn)

    @contextmanager
    def use(self, thread_id: str | int) -> Iterator[MessageThread]:
        """``with agency.thread.use(thread_id) as thread:`` — a scoped switch of active thread.

        A thread id not created yet is created (empty) under exactly that id.
        """
        frame = self._switched(thread_id, "thread.use()")
        with use_frame(frame):
            yield frame.threads.get(thread_id)


class ThreadsNamespace:
    """``agency.threads``: read-only listings of the current frame's threads."""

    def list(self) -> builtins.list[ThreadInfo]:
        """Every visible thread (``id`` as ``"t0"``, ``"t1"``, …), in creation order."""
        return current_frame("threads.list()").threads.list_info()

    def get(self, thread_id: str | int, offset: int = 0, limit: int = 50) -> builtins.list[Message]:
        """Up to ``limit`` messages of a thread from ``offset`` (``[]`` for an unknown id).

        ``thread_id`` may be ``"t3"`` or ``"3"``.
        """
        if offset < 0 or limit < 0:
            raise InvalidArgumentError(f"offset and limit must be 0 or more, got {offset}, {limit}")
        thread = current_frame("threads.get()").threads.get_maybe(normalize_thread_id(thread_id))
        if thread is None:
            return []
        return thread.messages[offset : offset + limit]

    def current(self) -> MessageThread | None:
        """The active thread, or ``None`` (outside a frame, or when none is active)."""
        frame = current_frame_maybe()
        return None if frame is None else frame.threads.active()


class McpNamespace:
    """``agency.mcp``: the tools of MCP servers as toolsets for ``agency.llm(..., tools=[...])``
    (extra ``mcp``; the SDK loads with the first listing or call)."""

    stdio = staticmethod(_mcp.stdio)
    http = staticmethod(_mcp.http)


class Agency:
    """The ``agency`` namespace. Use the module-level instance, ``agency``."""

    def __init__(self) -> None:
        self.thread = ThreadNamespace()
        self.threads = ThreadsNamespace()
        self.runs = RunsNamespace()
        self.queues = QueuesNamespace()
        self.schedules = SchedulesNamespace()
        self.mcp = McpNamespace()

    @functools.cached_property
    def memory(self) -> MemoryNamespace:
        """``agency.memory``: agent memory. Its modules (the knowledge graph, its prompts and
        models) load when a program first uses it, not with ``import agency_runtime``."""
        from ._memory import MemoryNamespace

        return MemoryNamespace()

    if TYPE_CHECKING:  # agency.run's types: RunResult[T], T what the entry returns or awaits
        # An entry returning an Awaitable[T] (an async def, or a def returning a coroutine or
        # a future) gives T: the run awaits what the entry returns (call_in_frame) and checks
        # the value against T (return_annotation reads T out of Awaitable[T]).

        @overload
        @staticmethod
        async def run(
            entry: Callable[..., Awaitable[T]],
            *args: Any,
            run_id: str | None = ...,
            queue: str | None = ...,
            store: str | Store | None = ...,
            model: str | _Model | None = ...,
            **kwargs: Any,
        ) -> RunResult[T]: ...

        @overload
        @staticmethod
        async def run(
            entry: Callable[..., T],
            *args: Any,
            run_id: str | None = ...,
            queue: str | None = ...,
            store: str | Store | None = ...,
            model: str | _Model | None = ...,
            **kwargs: Any,
        ) -> RunResult[T]: ...

        @staticmethod
        async def run(entry: Callable[..., Any], *args: Any, **kwargs: Any) -> RunResult[Any]: ...

        @overload
        @staticmethod
        def run_sync(
            entry: Callable[..., Awaitable[T]],
            *args: Any,
            run_id: str | None = ...,
            store: str | Store | None = ...,
            model: str | _Model | None = ...,
            **kwargs: Any,
        ) -> RunResult[T]: ...

        @overload
        @staticmethod
        def run_sync(
            entry: Callable[..., T],
            *args: Any,
            run_id: str | None = ...,
            store: str | Store | None = ...,
            model: str | _Model | None = ...,
            **kwargs: Any,
        ) -> RunResult[T]: ...

        @staticmethod
        def run_sync(entry: Callable[..., Any], *args: Any, **kwargs: Any) -> RunResult[Any]: ...

    else:  # at run time the functions themselves: no wrapper on the call's path
        run = staticmethod(_run)
        run_sync = staticmethod(_run_sync)
    enqueue = staticmethod(enqueue)
    resume = staticmethod(resume)
    respond_to_interrupts = staticmethod(respond_to_interrupts)
    with_resumable_scope = staticmethod(with_resumable_scope)
    interrupt = staticmethod(interrupt)
    with_handler = staticmethod(with_handler)
    handler = staticmethod(handler)
    get_checkpoint = staticmethod(get_checkpoint)
    restore = staticmethod(restore)
    if TYPE_CHECKING:  # agency.llm's types: str, or an instance of schema (a type)

        @overload
        @staticmethod
        async def llm(
            prompt: MessageContent,
            *,
            model: str | _Model | None = ...,
            schema: None = ...,
            thread: MessageThread | str | int | None = ...,
            max_tokens: int | None = ...,
            retries: int | None = ...,
            timeout: float | None = ...,
            tools: builtins.list[Tool | McpServer | Callable[..., Any]] | None = ...,
            max_tool_rounds: int = ...,
            on_max_tool_rounds: OnMaxToolRounds = ...,
            on_token: TokenCallback | None = ...,
        ) -> str: ...

        @overload
        @staticmethod
        async def llm(
            prompt: MessageContent,
            *,
            model: str | _Model | None = ...,
            schema: type[M],
            thread: MessageThread | str | int | None = ...,
            max_tokens: int | None = ...,
            retries: int | None = ...,
            timeout: float | None = ...,
            tools: builtins.list[Tool | McpServer | Callable[..., Any]] | None = ...,
            max_tool_rounds: int = ...,
            on_max_tool_rounds: OnMaxToolRounds = ...,
            on_token: TokenCallback | None = ...,
        ) -> M: ...

        @overload
        @staticmethod
        async def llm(
            prompt: MessageContent,
            *,
            model: str | _Model | None = ...,
            schema: Any,
            thread: MessageThread | str | int | None = ...,
            max_tokens: int | None = ...,
            retries: int | None = ...,
            timeout: float | None = ...,
            tools: builtins.list[Tool | McpServer | Callable[..., Any]] | None = ...,
            max_tool_rounds: int = ...,
            on_max_tool_rounds: OnMaxToolRounds = ...,
            on_token: TokenCallback | None = ...,
        ) -> Any: ...

        @staticmethod
        async def llm(prompt: MessageContent, **options: Any) -> Any: ...

    else:  # at run time the function itself: no wrapper on the call's path
        llm = staticmethod(_llm)
    tool = staticmethod(tool)
    llm_stream = staticmethod(llm_stream)
    with_lock = staticmethod(with_lock)
    lock = staticmethod(lock)
    with_cost_guard = staticmethod(with_cost_guard)
    cost_guard = staticmethod(cost_guard)
    with_time_guard = staticmethod(with_time_guard)
    time_guard = staticmethod(time_guard)
    sleep = staticmethod(sleep)
    wait_for_event = staticmethod(wait_for_event)
    patched = staticmethod(patched)

    Worker = _Worker
    """``agency.Worker(store, queues=[...], concurrency=8)``: serves queued runs
    (``await worker.run()``); the same class as ``agency_runtime.Worker``."""

    # -- models ------------------------------------------------------------------------------

    Model = _Model
    """``agency.Model(...)``: a model with its own endpoint, key, options and prices."""

    Retry = _Retry
    """``agency.Retry(attempts=3, backoff=1.0, ...)``: a step's retry policy
    (``s.step(fn, retries=agency.Retry(...))``); the same class as ``agency_runtime.Retry``."""

    def register_model(self, model: _Model) -> _Model | None:
        """Make the string ``model.name`` mean ``model`` in this process; return the model
        it replaces.

        A registered name works wherever a model string does (``agency.llm(model=...)``,
        ``agency.run``, ``agency.enqueue``, ``AGENCY_MODEL``), and a run stored with it
        resumes with it. Runs record only the name, never the key: register models at
        import, like entries, in every process that may resume or work on their runs.
        """
        return register_model(model)

    def unregister_model(self, name: str) -> _Model | None:
        """Forget the model registered under ``name``; return it (``None``: there was none)."""
        return unregister_model(name)

    # -- declared entries --------------------------------------------------------------------

    @overload
    def entry(self, fn: F, /) -> F: ...

    @overload
    def entry(self, fn: None = None, /, *, name: str | None = None) -> Callable[[F], F]: ...

    def entry(self, fn: F | None = None, /, *, name: str | None = None) -> F | Callable[[F], F]:
        """Declare a run entry: ``@agency.entry`` or ``@agency.entry(name="refund")``.

        The function is returned unchanged. Only declared entries (and ones this process
        ran) continue a stored run — in ``agency.resume``, ``respond_to_interrupts`` and the
        ``agency runs`` CLI — because the store is data, never code. With ``name``, runs
        record the name instead of ``module:qualname``, so the function may move; a new
        process then needs the declaring module imported (``--import`` / ``AGENCY_IMPORTS``).
        """
        if fn is None:

            def declare(target: F) -> F:
                return RUNTIME.entries.declare(target, name=name)

            return declare
        return RUNTIME.entries.declare(fn, name=name)

    def register_entry(self, fn: F, name: str | None = None) -> F:
        """Declare ``fn`` as a run entry without a decorator (see :meth:`entry`); returns it."""
        return RUNTIME.entries.declare(fn, name=name)

    def configure(self, *, clock: Clock | None = None, max_run_depth: int | None = None) -> Clock:
        """Configure the runtime: ``clock`` is the time runs started from now on read
        (leases, guards, TTLs, stored times); ``max_run_depth`` (default 8) is how deep child
        runs nest when no ``std::run`` handler decides; returns the clock used before.

        Tests pass :class:`agency_runtime.testing.FakeClock` and advance it by hand.
        """
        return RUNTIME.configure(clock=clock, max_run_depth=max_run_depth)

    def preload(self, *, wait: bool = False) -> None:
        """Start importing litellm in a background thread now (it takes seconds).

        The first ``agency.llm`` call then finds it ready. ``wait=True`` blocks until done.
        """
        from ._llm._litellm import start_preload  # the litellm provider, loaded on first use

        start_preload(wait=wait)

    async def checkpoint(self, label: str | None = None) -> str:
        """Record a checkpoint of the run here and return its id."""
        return await create_checkpoint(label)

    # -- context ---------------------------------------------------------------------------

    def ctx(self) -> RuntimeContext:
        """The current run's :class:`RuntimeContext`; raises outside a frame."""
        return current_frame("ctx()").ctx

    def ctx_maybe(self) -> RuntimeContext | None:
        """The current run's :class:`RuntimeContext`, or ``None`` outside a frame."""
        frame = current_frame_maybe()
        return None if frame is None else frame.ctx

    def callsite(self) -> CallsiteLocation | None:
        """The current callsite, or ``None`` (outside a frame, or when the frame has none)."""
        frame = current_frame_maybe()
        return None if frame is None else frame.callsite_location()

    def global_(self, name: str, module_id: str = "", default: Any = None) -> Any:
        """The module global ``name`` of ``module_id`` from the frame's globals (or ``default``)."""
        return current_frame("global_()").globals.get(module_id, {}).get(name, default)

    def set_global(self, name: str, value: Any, module_id: str = "") -> None:
        """Set the module global ``name`` of ``module_id`` in the frame's globals."""
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a global's name must be a non-empty string, got {name!r}")
        current_frame("set_global()").globals.setdefault(module_id, {})[name] = value

    def abort_signal(self) -> AbortSignal:
        """The current branch's :class:`AbortSignal` (fires on cancel and time-guard trips)."""
        return current_frame("abort_signal()").stack.abort_signal

    # -- callsite --------------------------------------------------------------------------

    def _at(self, loc: CallsiteLocation | tuple[str, str, str], member: str) -> Frame:
        frame = current_frame(member)
        if isinstance(loc, CallsiteLocation):
            return frame.evolve(callsite=loc.as_tuple())
        if isinstance(loc, tuple) and len(loc) == 3 and all(isinstance(p, str) for p in loc):
            return frame.evolve(callsite=loc)
        raise InvalidArgumentError(
            f"agency.{member} needs a CallsiteLocation(module_id, scope_name, step_path), "
            f"got {type(loc).__name__}"
        )

    def with_callsite(
        self, loc: CallsiteLocation | tuple[str, str, str], fn: Fn[T]
    ) -> Awaitable[T]:
        """Run ``fn`` with ``loc`` as the callsite; the previous callsite returns afterwards."""
        _check_fn(fn, "with_callsite()")
        return call_in_frame(self._at(loc, "with_callsite()"), fn)

    @contextmanager
    def at_callsite(
        self, loc: CallsiteLocation | tuple[str, str, str]
    ) -> Iterator[CallsiteLocation]:
        """``with agency.at_callsite(loc):`` — the context-manager form of :meth:`with_callsite`."""
        frame = self._at(loc, "at_callsite()")
        with use_frame(frame):
            location = frame.callsite_location()
            assert location is not None
            yield location

    # -- cost and tokens -------------------------------------------------------------------

    def add_cost(self, usd: float) -> None:
        """Bill ``usd`` US dollars to the run and every cost guard in scope.

        Raises :class:`GuardExceededError` at once when a guard is now strictly over.
        """
        pico = usd_to_pico(usd, what="add_cost: amount")
        charge(current_frame("add_cost()"), pico=pico)

    def add_tokens(self, n: int) -> None:
        """Bill ``n`` tokens to the run (a non-negative integer)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgumentError(f"add_tokens: n must be a non-negative integer, got {n!r}")
        charge(current_frame("add_tokens()"), tokens=n, enforce=False)

    # -- test frames -----------------------------------------------------------------------

    def _test_frame(
        self,
        ctx: RuntimeContext | None,
        stack: BranchState | None,
        threads: ThreadStore | None,
    ) -> Frame:
        if ctx is not None and not isinstance(ctx, RuntimeContext):
            raise InvalidArgumentError(f"ctx must be a RuntimeContext, got {type(ctx).__name__}")
        if stack is not None and not isinstance(stack, BranchState):
            raise InvalidArgumentError(f"stack must be a BranchState, got {type(stack).__name__}")
        if threads is not None and not isinstance(threads, ThreadStore):
            raise InvalidArgumentError(
                f"threads must be a ThreadStore, got {type(threads).__name__}"
            )
        ctx = ctx if ctx is not None else RuntimeContext()
        return Frame(
            ctx,
            stack if stack is not None else BranchState.for_context(ctx),
            threads if threads is not None else ThreadStore.with_default_active(),
        )

    def with_test_context(
        self,
        ctx: RuntimeContext | Fn[T] | None = None,
        stack: BranchState | None = None,
        threads: ThreadStore | None = None,
        fn: Fn[T] | None = None,
    ) -> Awaitable[T]:
        """Run ``fn`` in a frame built from explicit parts, for unit tests.

        Parts left out are fresh: a new :class:`RuntimeContext`, its root
        :class:`BranchState`, and a :class:`ThreadStore` with thread ``"0"`` active.
        ``agency.with_test_context(fn)`` is accepted as a shorthand.
        """
        if fn is None and callable(ctx) and not isinstance(ctx, RuntimeContext):
            ctx, fn = None, ctx
        if fn is None:
            raise InvalidArgumentError("agency.with_test_context needs fn=<a callable to run>")
        _check_fn(fn, "with_test_context()")
        assert ctx is None or isinstance(ctx, RuntimeContext)
        frame = self._test_frame(ctx, stack, threads)

        async def call() -> T:
            with run_root():
                return await call_in_frame(frame, fn)

        return call()

    @contextmanager
    def test_context(
        self,
        ctx: RuntimeContext | None = None,
        stack: BranchState | None = None,
        threads: ThreadStore | None = None,
    ) -> Iterator[Frame]:
        """``with agency.test_context() as frame:`` — the context-manager form, for unit tests."""
        frame = self._test_frame(ctx, stack, threads)
        with run_root(), use_frame(frame):
            yield frame


agency = Agency()
"""The ``agency`` namespace."""
