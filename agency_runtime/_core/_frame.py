"""Execution frames: one ``ContextVar`` holding an immutable :class:`Frame`.

Every ``agency.*`` member reads its dependencies from the current frame. Frames are never
mutated: entering a step, switching thread, installing a handler or guard, or setting a
callsite makes a new frame, installed with ``ContextVar.set`` and removed with ``reset`` in
a ``finally``. Tasks started inside a frame inherit it (contextvars copy on task creation).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from pydantic import ConfigDict

from .._errors import OutsideFrameError
from .._types import DeferredModel
from ._context import BranchState, RuntimeContext
from ._threads import ThreadStore

__all__ = [
    "CallsiteLocation",
    "Frame",
    "Position",
    "ScopeState",
    "current_frame",
    "current_frame_maybe",
    "position_of",
    "use_frame",
]

T = TypeVar("T")

Callsite = tuple[str, str, str]
"""``(module_id, scope_name, step_path)``: the cheap form frames carry."""


class CallsiteLocation(DeferredModel):
    """Where the current step lives: module, scope name and step path."""

    model_config = ConfigDict(frozen=True)

    module_id: str
    scope_name: str
    step_path: str

    def as_tuple(self) -> Callsite:
        """The ``(module_id, scope_name, step_path)`` tuple frames carry."""
        return (self.module_id, self.scope_name, self.step_path)


class _FrameFields(NamedTuple):
    ctx: RuntimeContext
    stack: BranchState
    threads: ThreadStore
    globals: dict[str, dict[str, Any]]
    callsite: Callsite | None
    position: Position


class Frame(_FrameFields):
    """What ``agency.*`` sees: run context, branch state, threads, globals, callsite, scope.

    Immutable: a tuple of its fields (nothing can change one after it is made, not even
    ``object.__setattr__``), so making one is a single allocation: every step makes one.
    :meth:`evolve` returns a modified copy. Frames compare and hash by identity, as
    objects do, not by their fields as tuples do.
    """

    __slots__ = ()

    def __new__(
        cls,
        ctx: RuntimeContext,
        stack: BranchState,
        threads: ThreadStore,
        globals: dict[str, dict[str, Any]] | None = None,
        callsite: Callsite | None = None,
        position: Position | None = None,
    ) -> Frame:
        return _new_frame(
            cls,
            (
                ctx,
                stack,
                threads,
                ctx.globals if globals is None else globals,
                callsite,
                ROOT if position is None else position,
            ),
        )

    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __hash__ = object.__hash__

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Frame is immutable; use frame.evolve(...) to derive a new one")

    def evolve(self, **changes: Any) -> Frame:
        """A copy of this frame with ``changes`` applied."""
        unknown = changes.keys() - _FIELDS
        if unknown:
            raise TypeError(f"Frame has no field {sorted(unknown)[0]!r}")
        fields = zip(self._fields, self, strict=True)
        return _new_frame(Frame, [changes.get(name, value) for name, value in fields])

    def at(self, callsite: Callsite, scope: ScopeState | None, address: str) -> Frame:
        """``evolve(callsite=callsite, position=Position(scope, address))``, made for every
        step: two tuples built directly, without the keyword checks or the named tuple's
        constructor (a Python function behind ``Position(...)``)."""
        position = _new_position(Position, (scope, address))
        return _new_frame(Frame, (self.ctx, self.stack, self.threads, self.globals, callsite,
                                  position))  # fmt: skip

    def callsite_location(self) -> CallsiteLocation | None:
        """The callsite as a :class:`CallsiteLocation`, or ``None``."""
        if self.callsite is None:
            return None
        module_id, scope_name, step_path = self.callsite
        return CallsiteLocation(module_id=module_id, scope_name=scope_name, step_path=step_path)

    def __repr__(self) -> str:
        return f"<Frame run_id={self.ctx.run_id!r} callsite={self.callsite!r}>"


@dataclass(slots=True)
class ScopeState:
    """What a resumable scope shares with the code running inside it.

    ``chain`` names the scope and its ancestors as journaled with every step
    (``(parent address, ordinal, name)`` each); ``locals`` are the scope's locals
    (``s.set_local``), which checkpoints capture.
    """

    name: str
    address: str
    chain: tuple[tuple[str, int | str, str], ...]
    locals: dict[str, Any] = field(default_factory=dict)


class Position(NamedTuple):
    """Where a frame is inside the scope tree: the scope (if any) and the address.

    The address is ``""`` at the run root, a scope's address inside its body (``"order"``),
    and a step's path inside the step (``"order/2"``).
    """

    scope: ScopeState | None
    address: str


ROOT = Position(None, "")


_FIELDS = frozenset(_FrameFields._fields)
_new_frame = tuple.__new__
"""A frame from its fields in order (what :class:`Frame`'s constructor ends in)."""
_new_position = tuple.__new__
"""A position from its fields in order (what ``Position(scope, address)`` ends in)."""


def position_of(frame: Frame) -> Position:
    """The frame's position (the run root when it has none)."""
    return frame.position


_FRAME: ContextVar[Frame | None] = ContextVar("agency_frame", default=None)


def current_frame(member: str) -> Frame:
    """The current frame; raises :class:`OutsideFrameError` naming ``member`` if none."""
    frame = _FRAME.get()
    if frame is None:
        raise OutsideFrameError(member)
    return frame


def current_frame_maybe() -> Frame | None:
    """The current frame, or ``None`` outside any frame."""
    return _FRAME.get()


@contextmanager
def use_frame(frame: Frame) -> Iterator[Frame]:
    """Install ``frame`` for the duration of the ``with`` block."""
    token = _FRAME.set(frame)
    try:
        yield frame
    finally:
        _FRAME.reset(token)


async def call_in_frame(frame: Frame, fn: Callable[[], T | Awaitable[T]]) -> T:
    """Call ``fn`` (sync or async) with ``frame`` installed; await its result if needed."""
    token = _FRAME.set(frame)
    try:
        result = fn()
        if inspect.isawaitable(result):
            return await result
        return result
    finally:
        _FRAME.reset(token)
