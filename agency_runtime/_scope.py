"""Resumable scopes: Temporal-style steps journaled to the run's store.

``await agency.with_resumable_scope("order", body)`` runs ``body(s)``; each
``await s.step(fn)`` either returns the journaled result of a step that already completed
(without calling ``fn``) or runs ``fn`` and commits its result, the scope's locals, the
thread messages it added and the run's spend in one transaction.

Addressing: step ids are assigned when ``s.step`` is *called* (0, 1, 2, … per scope entry),
so steps started concurrently get ids in call order; completed steps are found by id, so
parallel steps that finished out of order resume correctly. A scope's address is its
parent's address plus its name (``name~1``, ``name~2`` for repeated entries under the same
parent); a step's path is its scope's address plus its id (``outer/2/inner/0``).
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticSerializationError, from_json, to_json

from ._effects import replay_changes
from ._entry import return_adapter
from ._errors import (
    InvalidArgumentError,
    JournalCorruptError,
    NondeterminismError,
    StepResultError,
)
from ._frame import _FRAME, Position, call_in_frame, current_frame, position_of, use_frame
from ._journal import RunJournal, journal_of
from ._records import JournalEntry
from ._threads import CHANGES, ThreadChange

__all__ = ["ResumableScope", "ResumableScopeOpts", "with_resumable_scope"]

T = TypeVar("T")

DEFAULT_MODULE_ID = "<py-helper>"


class ResumableScopeOpts(BaseModel):
    """Options of a resumable scope: its name, module id, and result-checkpoint pinning."""

    model_config = ConfigDict(frozen=True)

    name: str
    module_id: str = DEFAULT_MODULE_ID
    pin_result_checkpoint: bool = False


async def _ready(value: Any) -> Any:
    """An already-decided step result, as a coroutine (so create_task / start_soon take it)."""
    return value


def _where(frame: FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _name_of(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        return name
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None:
        return _name_of(inner)
    return type(fn).__qualname__


class ResumableScope:
    """The handle a scope body gets: ``step``, ``get_local``, ``set_local``, ``halt``."""

    __slots__ = (
        "_chain",
        "_halt_value",
        "_halted",
        "_journal",
        "_locals",
        "_next_id",
        "address",
        "module_id",
        "name",
    )

    def __init__(
        self,
        name: str,
        address: str,
        module_id: str,
        journal: RunJournal,
        chain: tuple[tuple[str, int, str], ...],
    ) -> None:
        self.name = name
        self.address = address
        self.module_id = module_id
        self._journal = journal
        self._chain = chain
        self._next_id = 0
        self._halted = False
        self._halt_value: Any = None
        self._locals: dict[str, Any] = {}
        recorded = journal.scope_locals.get(address)
        if recorded is not None:
            try:
                self._locals = dict(from_json(recorded))
            except (ValueError, TypeError) as exc:
                raise JournalCorruptError(
                    f"the journal of run {journal.run_id!r} holds unreadable locals for scope "
                    f"{address!r}: {exc}"
                ) from exc

    # -- steps -------------------------------------------------------------------------------

    def step(
        self,
        fn: Callable[[], T | Awaitable[T]],
        *,
        name: str | None = None,
        returns: Any = None,
    ) -> Awaitable[T]:
        """Run ``fn`` once per run: on resume, return its journaled result instead.

        ``fn`` takes no arguments and may be sync or async (an awaitable it returns is
        awaited). The result must be JSON data or pydantic models; it comes back
        round-tripped through JSON (revived into ``returns=`` or ``fn``'s return
        annotation when given), on the first run as on replay. ``name=`` names the step for
        the determinism check (the default is ``fn``'s qualified name; use it for lambdas).
        """
        index = self._next_id
        self._next_id += 1
        if self._halted:
            return _ready(None)
        if not callable(fn):
            raise InvalidArgumentError(
                f"s.step() needs a callable taking no arguments, got {type(fn).__name__}; "
                "wrap a call as s.step(lambda: work(x))"
            )
        path = f"{self.address}/{index}"
        step_name = name if name is not None else _name_of(fn)
        caller = sys._getframe(1)
        entry = self._journal.entries.get(path)
        if entry is not None:
            if entry.name != step_name:
                raise self._desync(entry, path, step_name, _where(caller))
            return _ready(self._replay(entry, path, step_name, fn, returns))
        return self._execute(index, path, fn, step_name, _where(caller), returns)

    def _desync(
        self, entry: JournalEntry, path: str, step_name: str, callsite: str
    ) -> NondeterminismError:
        return NondeterminismError(
            f"run {self._journal.run_id!r} replayed step {path!r} as {step_name!r} (called "
            f"at {callsite}), but the journal recorded {entry.name!r} (called at "
            f"{entry.callsite or 'an unknown place'}). The code changed under an "
            "in-flight run: restore the old code to finish it, or start a new run."
        )

    def _replay(
        self,
        entry: JournalEntry,
        path: str,
        step_name: str,
        fn: Callable[..., Any],
        returns: Any,
    ) -> Any:
        try:
            if entry.deltas:
                changes: list[ThreadChange] = from_json(entry.deltas)
                replay_changes(current_frame("ResumableScope.step()"), changes)
            adapter = return_adapter(fn, returns)
            if adapter is not None:
                return adapter.validate_json(entry.result)
            return from_json(entry.result)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise JournalCorruptError(
                f"the journal of run {self._journal.run_id!r} is damaged at step {path!r} "
                f"({step_name}): "
                f"{exc}. Fork the run before this step with agency.runs.fork(...) or start "
                "a new run."
            ) from exc

    async def _execute(
        self,
        index: int,
        path: str,
        fn: Callable[[], Any],
        step_name: str,
        callsite: str,
        returns: Any,
    ) -> Any:
        frame = current_frame("ResumableScope.step()")
        step_frame = frame.evolve(
            callsite=(self.module_id, self.name, str(index)), scope=Position(self, path)
        )
        changes: list[ThreadChange] = []
        outer_changes = CHANGES.get()
        changes_token = CHANGES.set(changes)
        frame_token = _FRAME.set(step_frame)
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
        finally:
            _FRAME.reset(frame_token)
            CHANGES.reset(changes_token)
        if outer_changes is not None:
            outer_changes.extend(changes)
        try:
            result_json = to_json(result).decode()
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise StepResultError(
                f"step {path!r} ({step_name}) of scope {self.name!r} in run "
                f"{self._journal.run_id!r} returned a {type(result).__name__}, which cannot "
                f"be journaled as JSON ({exc}); return JSON data or a pydantic model"
            ) from exc
        adapter = return_adapter(fn, returns)
        value = from_json(result_json) if adapter is None else adapter.validate_json(result_json)
        journal = self._journal
        ctx = frame.ctx
        await journal.commit_step(
            JournalEntry.from_row(
                {
                    "run_id": journal.run_id or "",
                    "seq": journal.next_seq(),
                    "path": path,
                    "name": step_name,
                    "callsite": callsite,
                    "result": result_json,
                    "locals": to_json(self._locals).decode() if self._locals else None,
                    "scopes": to_json(self._chain).decode(),
                    "deltas": to_json(changes).decode() if changes else None,
                    "cost_pico": ctx.cost_pico,
                    "tokens": ctx.tokens,
                    "created_at": time.time(),
                }
            )
        )
        return value

    # -- locals and halt -------------------------------------------------------------------------

    def get_local(self, key: str, default: Any = None) -> Any:
        """A scope local (journaled with every step, so it survives resume)."""
        return self._locals.get(key, default)

    def set_local(self, key: str, value: Any) -> None:
        """Set a scope local; it must be JSON data, since it is journaled."""
        if not isinstance(key, str):
            raise InvalidArgumentError(f"a local's key must be a string, got {key!r}")
        try:
            to_json(value)
        except (PydanticSerializationError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"local {key!r} of scope {self.name!r} cannot be journaled as JSON ({exc})"
            ) from exc
        self._locals[key] = value

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
    ordinal = journal.ordinal(parent, "scope")
    repeat = journal.ordinal(parent, "scope:" + options.name)
    segment = options.name if repeat == 0 else f"{options.name}~{repeat}"
    address = f"{parent}/{segment}" if parent else segment
    recorded = journal.scope_names.get((parent, ordinal))
    if recorded is not None and recorded != options.name:
        raise NondeterminismError(
            f"Resume desync in run {journal.run_id!r}: scope {options.name!r} tried to claim "
            f"the saved state of {recorded!r} (scope #{ordinal} under "
            f"{parent or 'the run root'!r}). The code changed under an in-flight run."
        )
    chain = (position.scope._chain if position.scope is not None else ()) + (
        (parent, ordinal, options.name),
    )
    scope = ResumableScope(options.name, address, options.module_id, journal, chain)
    inner = frame.evolve(
        callsite=(options.module_id, options.name, ""), scope=Position(scope, address)
    )
    if options.pin_result_checkpoint:
        from ._checkpoints import create_checkpoint

        with use_frame(inner):
            await create_checkpoint(label="result-entry", pinned=True)
    result = await call_in_frame(inner, lambda: body(scope))
    return scope._halt_value if scope.halted else result
