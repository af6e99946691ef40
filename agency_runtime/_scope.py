"""Resumable scopes: Temporal-style steps journaled to the run's store.

``await agency.with_resumable_scope("order", body)`` runs ``body(s)``; each
``await s.step(fn)`` either returns the journaled result of a step that already completed
(without calling ``fn``) or runs ``fn`` and commits its result, the scope's locals, the
thread messages it added and the spend it made in one transaction (through the one
journaled-effect primitive, :mod:`agency_runtime._durable._effect`).

Addressing: step ids are assigned when ``s.step`` is *called* (0, 1, 2, … per scope entry),
so steps started together get ids in call order; completed steps are found by id, so
parallel steps that finished out of order resume correctly. A scope's address is its
parent's address plus its name (``name~1``, ``name~2`` for repeated entries under the same
parent); a step's path is its scope's address plus its id (``outer/2/inner/0``). What a
concurrent branch counts (its steps of a shared scope, the scopes it enters) is qualified
by the branch's causal position (``outer/0.1:inner``, ``order/0.0:3``; see
:mod:`agency_runtime._core._branches`), so addresses never depend on how branches interleave.
"""

from __future__ import annotations

import dis
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable
from types import CodeType, FrameType
from typing import Any, TypeVar

from pydantic import ConfigDict, ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_json

from ._core import _observe
from ._core._branches import at_base, qualify, tick
from ._core._frame import (
    _FRAME,
    Frame,
    Position,
    ScopeState,
    call_in_frame,
    current_frame,
    position_of,
    use_frame,
)
from ._core._jsondata import is_plain, json_problem
from ._durable._effect import perform, recorded, replay
from ._durable._journal import RunJournal, journal_of
from ._durable._values import Adapter, return_adapter, validation_problems
from ._errors import (
    InvalidArgumentError,
    JournalCorruptError,
    NondeterminismError,
    StepResultError,
)
from ._policies import Retry, as_policy, with_policy
from ._types import DeferredModel

__all__ = ["ResumableScope", "ResumableScopeOpts", "step_name", "with_resumable_scope"]

T = TypeVar("T")

DEFAULT_MODULE_ID = "<py-helper>"


def _wants_arguments(fn: Callable[..., Any], exc: TypeError) -> bool:
    """Whether calling ``fn()`` raised ``exc`` itself, because ``fn`` needs arguments.

    Looked at only once a step failed with a ``TypeError`` (nothing on the step's path): the
    error must come from the call (no frame of ``fn`` in its traceback) and ``fn``'s
    signature must refuse an empty call.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or tb.tb_frame.f_code is not perform.__code__:
        return False  # raised inside fn (or further down): fn's own TypeError
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return True
    except ValueError:  # no signature to read (some builtins)
        return False
    return False


def _refuse_arguments(fn: Callable[..., Any], step_name: str, exc: TypeError) -> None:
    """Raise :class:`InvalidArgumentError` from ``exc`` when it says that the step function
    ``fn`` needs arguments (see :func:`_wants_arguments`); return when it is ``fn``'s own."""
    if _wants_arguments(fn, exc):
        raise InvalidArgumentError(
            f"s.step() calls its function with no arguments, and {step_name} takes "
            f"some ({exc}): a step function takes no arguments; pass them with a "
            f"lambda, s.step(lambda: {step_name}(...)), or functools.partial"
        ) from exc


class ResumableScopeOpts(DeferredModel):
    """Options of a resumable scope: its name, module id, and result-checkpoint pinning."""

    model_config = ConfigDict(frozen=True)

    name: str
    module_id: str = DEFAULT_MODULE_ID
    pin_result_checkpoint: bool = False


async def _ready(value: Any) -> Any:
    """An already-decided step result, as a coroutine (so create_task / start_soon take it)."""
    return value


_WHERE: dict[tuple[int, int], tuple[CodeType, str]] = {}
_WHERE_MAX = 4096


def _where(frame: FrameType) -> str:
    """The ``file:line`` of ``frame``'s current instruction (a step's callsite).

    Cached by code object and instruction offset: ``f_lineno`` decodes the code's line
    table on every read, and every step asks. The key holds the code's id (hashing a code
    object hashes its contents); the entry holds the code itself, so the id stays its own.
    """
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    cached = _WHERE.get(key)
    if cached is not None and cached[0] is code:
        return cached[1]
    if len(_WHERE) >= _WHERE_MAX:
        _WHERE.clear()
    where = f"{code.co_filename}:{frame.f_lineno}"
    _WHERE[key] = (code, where)
    return where


_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_VARIABLES = frozenset(
    {"LOAD_DEREF", "LOAD_CLOSURE", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"}
)
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_TRANSPARENT = frozenset({"CACHE", "EXTENDED_ARG", "NOP", "RESUME", "COPY_FREE_VARS"})
_MAX_LAMBDA_NAMES = 4


@functools.lru_cache(maxsize=1024)
def _instructions(code: CodeType) -> tuple[tuple[str, Any], ...]:
    """``code``'s instructions that matter to :func:`_code_names` (disassembled once: a
    lambda step is named on every call)."""
    return tuple(
        (i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in _TRANSPARENT
    )


def _code_names(code: CodeType, closure: dict[str, Any], found: dict[str, None]) -> None:
    """Add to ``found`` the names ``code`` calls or reads: globals and their attributes,
    attributes of its variables, and variables holding callables (see :func:`step_name`)."""
    chain: list[str] | None = None

    def flush() -> None:
        if chain:
            found.setdefault(".".join(chain), None)

    for op, argval in _instructions(code):
        if op in _LOADS:
            flush()
            chain = [str(argval)]
        elif op in _VARIABLES and isinstance(argval, str):
            flush()
            chain = [argval] if callable(closure.get(argval)) else []
        elif op in _ATTRIBUTES and chain is not None:
            chain.append(str(argval))
        else:
            flush()
            chain = None
    flush()
    for const in code.co_consts:
        if isinstance(const, CodeType):
            _code_names(const, {}, found)


_LAMBDA_NAMES: dict[tuple[int, str, int], tuple[CodeType, str]] = {}
_MAX_CACHED_NAMES = 4096


def _callable_cells(cells: tuple[Any, ...]) -> int:
    """Which of ``cells`` hold a callable, as bits (bit ``k``: cell ``k``; an empty cell
    holds none)."""
    bits = 0
    for k, cell in enumerate(cells):
        try:
            if callable(cell.cell_contents):
                bits |= 1 << k
        except ValueError:  # an empty cell
            continue
    return bits


def _lambda_name(name: str, code: CodeType, cells: tuple[Any, ...]) -> str:
    """:func:`step_name` of a lambda named ``name`` with ``code`` and closure ``cells``."""
    closure: dict[str, Any] = {}
    for variable, cell in zip(code.co_freevars, cells, strict=False):
        try:
            closure[variable] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    found: dict[str, None] = {}
    _code_names(code, closure, found)
    names = list(found)[:_MAX_LAMBDA_NAMES]
    return f"{name[:-1]}:{','.join(names)}>" if names else name


def step_name(fn: Callable[..., Any]) -> str:
    """A step's default name: the callable's qualified name.

    A lambda is named after what its code calls or reads (``body.<locals>.<lambda:reserve>``,
    ``<lambda:agency.llm>``): a deploy that swaps ``lambda: reserve(x)`` for
    ``lambda: charge(x)`` then fails the determinism check instead of replaying the old
    result, while moving lines or renaming its local variables does not.
    """
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        if not name.endswith("<lambda>"):
            return name
        code = getattr(fn, "__code__", None)
        if isinstance(code, CodeType):
            cells = getattr(fn, "__closure__", None) or ()
            # The name depends on the code and on which closure variables hold callables
            # only: found once per such combination (a loop's lambda steps share one). The
            # key holds the code's id (hashing a code object hashes its contents), the entry
            # the code itself, so the id stays its own (as _where's cache does).
            key = (id(code), name, _callable_cells(cells) if cells else 0)
            cached = _LAMBDA_NAMES.get(key)
            if cached is not None and cached[0] is code:
                return cached[1]
            named = _lambda_name(name, code, cells)
            if len(_LAMBDA_NAMES) >= _MAX_CACHED_NAMES:
                _LAMBDA_NAMES.clear()
            _LAMBDA_NAMES[key] = (code, named)
            return named
        return name
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None:
        return step_name(inner)
    return type(fn).__qualname__


class ResumableScope:
    """The handle a scope body gets: ``step``, ``get_local``, ``set_local``, ``halt``."""

    __slots__ = (
        "_chain_json",
        "_halt_value",
        "_halted",
        "_journal",
        "_last_adapter",
        "_next_id",
        "address",
        "module_id",
        "name",
        "state",
    )

    def __init__(
        self,
        name: str,
        address: str,
        module_id: str,
        journal: RunJournal,
        chain: tuple[tuple[str, int | str, str], ...],
    ) -> None:
        self.name = name
        self.address = address
        self.module_id = module_id
        self.state = ScopeState(name, address, chain)
        """What code inside the scope sees of it (its chain and locals)."""
        self._journal = journal
        self._next_id = 0
        self._halted = False
        self._halt_value: Any = None
        self._chain_json: tuple[object, str] = ((), "")  # the chain and its JSON, built once
        self._last_adapter: tuple[object, Adapter | None] = (None, None)
        recorded_locals = journal.scope_locals.get(address)
        if recorded_locals is not None:
            try:
                self.state.locals = dict(from_json(recorded_locals))
            except (ValueError, TypeError) as exc:
                raise JournalCorruptError(
                    f"the journal of run {journal.run_id!r} holds unreadable locals for scope "
                    f"{address!r}: {exc}"
                ) from exc

    # -- steps -------------------------------------------------------------------------------

    def step(
        self,
        fn: Callable[[], T | Awaitable[T]],
        name: str | None = None,
        *,
        returns: Any = None,
        retries: Retry | int | None = None,
        timeout: float | None = None,
    ) -> Awaitable[T]:
        """Run ``fn`` once per run: on resume, return its journaled result instead.

        ``fn`` takes no arguments and may be sync or async (an awaitable it returns is
        awaited). The result must be JSON data or pydantic models; it comes back
        round-tripped through JSON (revived into ``returns=`` or ``fn``'s return
        annotation when given), on the first run as on replay. ``name=`` names the step for
        the determinism check (the default is ``fn``'s qualified name; a lambda is named
        after what it calls, see :func:`step_name`).

        ``retries`` (an :class:`~agency_runtime.Retry`, or ``N`` for N retries) retries a
        failing ``fn`` durably: each failed attempt is journaled, the backoff is a durable
        sleep, and after the last attempt the step raises
        :class:`~agency_runtime.StepFailedError` (recorded: a replay raises it again).
        ``timeout`` (seconds) bounds one attempt; a timed-out attempt is a failed one
        (``TimeoutError``). See :mod:`agency_runtime._policies`.

        Step ids are given at call time, in call order, by the task that opened the scope;
        a concurrent task calling steps of this scope gets ids qualified by its branch
        (``order/2.0:0``), so ids never depend on how tasks interleave.
        """
        journal = self._journal
        address = self.address
        branch = tick(address)
        if branch:
            path = f"{address}/{branch}:{journal.ordinal(address, 'step', branch)}"
        else:
            path = f"{address}/{self._next_id}"
            self._next_id += 1
        if self._halted:
            return _ready(None)
        if not callable(fn):
            raise InvalidArgumentError(
                f"s.step() needs a callable taking no arguments, got {type(fn).__name__}; "
                "wrap a call as s.step(lambda: work(x))"
            )
        called = name if name is not None else step_name(fn)
        entry = journal.entries.get(path)
        if entry is not None:
            # The entry's fields read as one: each attribute of a pydantic model goes through
            # its __getattr__ hook, and this runs for every replayed step.
            fields = entry.__dict__
            if fields["name"] == called:  # the determinism check, its common case inline
                journal.claimed.add(path)
            else:
                recorded(journal, path, called, _where(sys._getframe(1)))
            last = self._last_adapter  # _adapter's cache, looked at here (every replayed step)
            if returns is None and getattr(fn, "__code__", None) is last[0] is not None:
                adapter = last[1]
            else:
                adapter = self._adapter(fn, returns)
            decode = from_json if adapter is None else adapter.validate_json
            frame = _FRAME.get()
            if frame is None:
                frame = current_frame("ResumableScope.step()")  # raises OutsideFrameError
            if fields["deltas"] is None and fields["error"] is None and _observe.OBSERVER is None:
                # replay()'s common case inline (nothing to apply, no failure, no observer):
                # replaying 1,000 steps is most of answering an interrupt after them.
                try:
                    return _ready(decode(fields["result"]))
                except ValueError:
                    pass  # a damaged result: replay() below says so
            return _ready(replay(frame, journal, entry, decode))
        index = path[len(address) + 1 :]
        # Most steps have neither retries nor a timeout: no call to find they have no policy.
        policy = None if retries is None and timeout is None else as_policy(retries, timeout)
        return self._execute(
            index, path, fn, called, _where(sys._getframe(1)), returns, policy, timeout
        )

    async def _execute(
        self,
        index: str,
        path: str,
        fn: Callable[[], Any],
        step_name: str,
        callsite: str,
        returns: Any,
        policy: Retry | None = None,
        timeout: float | None = None,
    ) -> Any:
        frame = current_frame("ResumableScope.step()")
        step_frame = frame.at((self.module_id, self.name, index), self.state, path)
        adapter = self._adapter(fn, returns)

        def encode(result: Any) -> tuple[str, Any]:
            # JSON data whose JSON round trip gives back the value itself (a dict: a copy):
            # neither checked further nor parsed back from its JSON.
            plain = adapter is None and is_plain(result)
            problem = None if plain else json_problem(result)
            if problem is not None:
                raise StepResultError(
                    f"{self._returned(path, step_name, result)}, which cannot be journaled as "
                    f"JSON: {problem}"
                )
            try:
                text = to_json(result).decode()
            except (PydanticSerializationError, TypeError, ValueError) as exc:
                raise StepResultError(
                    f"{self._returned(path, step_name, result)}, which cannot be journaled as "
                    f"JSON ({exc}); return JSON data or a pydantic model"
                ) from exc
            if plain:
                return text, dict(result) if type(result) is dict else result
            try:
                value = from_json(text) if adapter is None else adapter.validate_json(text)
            except ValidationError as exc:
                problems = validation_problems(exc)
                raise StepResultError(
                    f"{self._returned(path, step_name, result)}, which does not fit the step's "
                    f"return type: {problems}"
                ) from exc
            return text, value

        if policy is not None:
            return await self._retried(
                frame, step_frame, path, fn, step_name, callsite, encode, policy, timeout
            )
        try:
            return await perform(
                frame, self._journal, path, step_name, callsite, fn,
                encode=encode, run_frame=step_frame, fields=self._fields,
            )  # fmt: skip
        except TypeError as exc:
            _refuse_arguments(fn, step_name, exc)
            raise

    async def _retried(
        self,
        frame: Frame,
        step_frame: Frame,
        path: str,
        fn: Callable[[], Any],
        step_name: str,
        callsite: str,
        encode: Callable[[Any], tuple[str, Any]],
        policy: Retry,
        timeout: float | None,
    ) -> Any:
        """:meth:`_execute` of a step with a retry policy: each attempt is performed as
        :meth:`_execute` performs a step's one attempt (see :mod:`agency_runtime._policies`)."""

        async def once(work: Callable[[], Any]) -> Any:
            try:
                return await perform(
                    frame, self._journal, path, step_name, callsite, work,
                    encode=encode, run_frame=step_frame, fields=self._fields,
                )  # fmt: skip
            except TypeError as exc:
                _refuse_arguments(fn, step_name, exc)
                raise

        return await with_policy(frame, self._journal, path, step_name, policy, timeout, fn, once)

    def _fields(self) -> dict[str, Any]:
        """The scope's columns of a step's entry: its locals and its chain (the chain's JSON
        made once, while it stays the same)."""
        state = self.state
        if self._chain_json[0] is not state.chain:
            self._chain_json = (state.chain, to_json(state.chain).decode())
        return {
            "locals": to_json(locals_).decode() if (locals_ := state.locals) else None,
            "scopes": self._chain_json[1],
        }

    def _returned(self, path: str, step_name: str, result: Any) -> str:
        """The start of a message about what the step at ``path`` returned (built only to
        say why it cannot be journaled)."""
        return (
            f"step {path!r} ({step_name}) of scope {self.name!r} in run "
            f"{self._journal.run_id!r} returned a {type(result).__name__}"
        )

    def _adapter(self, fn: Callable[..., Any], returns: Any) -> Adapter | None:
        """:func:`return_adapter` of a step: a loop's steps are one function (one code), so
        the scope keeps the last one's (``return_adapter`` is cached per code as well)."""
        if returns is None:
            code = getattr(fn, "__code__", None)
            last = self._last_adapter
            if code is not None and code is last[0]:
                return last[1]
            adapter = return_adapter(fn)
            if code is not None:
                self._last_adapter = (code, adapter)
            return adapter
        return return_adapter(fn, returns)

    # -- locals and halt -------------------------------------------------------------------------

    def get_local(self, key: str, default: Any = None) -> Any:
        """A scope local (journaled with every step, so it survives resume)."""
        return self.state.locals.get(key, default)

    def set_local(self, key: str, value: Any) -> None:
        """Set a scope local; it must be JSON data, since it is journaled."""
        if not isinstance(key, str):
            raise InvalidArgumentError(f"a local's key must be a string, got {key!r}")
        problem = json_problem(value)
        if problem is not None:
            raise InvalidArgumentError(
                f"local {key!r} of scope {self.name!r} cannot be journaled as JSON: {problem}"
            )
        try:
            to_json(value)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"local {key!r} of scope {self.name!r} cannot be journaled as JSON ({exc})"
            ) from exc
        self.state.locals[key] = value

    def halt(self, result: Any = None) -> None:
        """Finish the scope with ``result``: later steps return ``None`` without running.

        It does not raise: code after ``halt`` runs on to the next step (``return`` right
        after it to stop at once).
        """
        self._halted = True
        self._halt_value = result

    @property
    def halted(self) -> bool:
        """Whether :meth:`halt` was called."""
        return self._halted

    def __repr__(self) -> str:
        return f"<ResumableScope {self.address!r} next_step={self._next_id}>"


def _check_opts(opts: ResumableScopeOpts | str) -> ResumableScopeOpts:
    if isinstance(opts, str):
        opts = ResumableScopeOpts(name=opts)
    if not isinstance(opts, ResumableScopeOpts):
        raise InvalidArgumentError(
            "with_resumable_scope needs a name or ResumableScopeOpts(name=...), "
            f"got {type(opts).__name__}"
        )
    if not opts.name.strip() or any(c in opts.name for c in "/~#"):
        raise InvalidArgumentError(
            f"a scope name must be non-empty without '/', '~' or '#', got {opts.name!r}"
        )
    return opts


async def with_resumable_scope(
    opts: ResumableScopeOpts | str,
    body: Callable[[ResumableScope], T | Awaitable[T]],
) -> T:
    """Run ``body(s)`` as a resumable scope; see :class:`ResumableScope`."""
    frame = current_frame("with_resumable_scope()")
    options = _check_opts(opts)
    if not callable(body):
        raise InvalidArgumentError(
            "with_resumable_scope needs a body callable taking the scope, "
            f"got {type(body).__name__}"
        )
    journal = journal_of(frame.ctx)
    position = position_of(frame)
    parent = position.address
    branch, ordinal = journal.count(parent, "scope")
    repeat = journal.ordinal(parent, "scope:" + options.name, branch)
    segment = qualify(branch, options.name if repeat == 0 else f"{options.name}~{repeat}")
    address = f"{parent}/{segment}" if parent else segment
    key: int | str = qualify(branch, str(ordinal)) if branch else ordinal
    recorded_name = journal.scope_names.get((parent, str(key)))
    if recorded_name is not None and recorded_name != options.name:
        raise NondeterminismError(
            f"Resume desync in run {journal.run_id!r}: scope {options.name!r} tried to claim "
            f"the saved state of {recorded_name!r} (scope #{key} under "
            f"{parent or 'the run root'!r}). The code changed under an in-flight run."
        )
    chain = (position.scope.chain if position.scope is not None else ()) + (
        (parent, key, options.name),
    )
    scope = ResumableScope(options.name, address, options.module_id, journal, chain)
    inner = frame.evolve(
        callsite=(options.module_id, options.name, ""), position=Position(scope.state, address)
    )
    with at_base(address):
        if options.pin_result_checkpoint:
            from ._checkpoints import create_checkpoint

            with use_frame(inner):
                await create_checkpoint(label="result-entry", pinned=True)
        result = await call_in_frame(inner, lambda: body(scope))
    return scope._halt_value if scope.halted else result
