"""The ``agency.memory`` state of one run: its stack of enabled frames and its memory id,
kept in the run's context under :data:`MEMORY_STATE`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from .._core._context import RuntimeContext, Slot
from .._durable._journal import journal_of
from .._errors import InvalidArgumentError
from ._config import DEFAULT_MEMORY_ID, MemoryConfig

if TYPE_CHECKING:
    from .._store import MemoryStore

__all__ = ["MEMORY_STATE", "MemoryFrame", "MemoryState"]


@dataclass(frozen=True, slots=True)
class MemoryFrame:
    """One ``enable`` call: its configuration and identity (the real path of ``dir``)."""

    config: MemoryConfig
    identity: str
    root: Path | None


_STORE_IDENTITY = "<run store>"


class MemoryState:
    """The ``agency.memory`` state of one run, kept on its context under ``MEMORY_STATE``."""

    __slots__ = ("_lock", "_store", "execution", "frames", "memory_id")

    def __init__(self) -> None:
        self.frames: list[MemoryFrame] = []
        self.memory_id = DEFAULT_MEMORY_ID
        self.execution: int | None = None
        self._store: MemoryStore | None = None
        self._lock: anyio.Lock | None = None

    @property
    def enabled(self) -> bool:
        """Whether a memory frame is active."""
        return bool(self.frames)

    def fallback_store(self) -> MemoryStore:
        """The in-process store used when the frame belongs to no run (unit tests)."""
        if self._store is None:
            from .._store import MemoryStore

            self._store = MemoryStore()
        return self._store

    def lock(self) -> anyio.Lock:
        """Serializes this run's graph updates when no store can hold a shared lock."""
        if self._lock is None:
            self._lock = anyio.Lock()
        return self._lock


MEMORY_STATE: Slot[MemoryState] = Slot("memory")
"""The run's ``agency.memory`` state (made on its first use)."""


def _state(ctx: RuntimeContext) -> MemoryState:
    state = ctx.ensure(MEMORY_STATE, MemoryState)
    # A restore runs the entry again from its start in the same context: the entry enables
    # memory again, so the frames start over.
    execution = journal_of(ctx).execution
    if state.execution != execution:
        if state.execution is not None:
            state.frames.clear()
            state.memory_id = DEFAULT_MEMORY_ID
        state.execution = execution
    return state


def _frame_for(config: MemoryConfig) -> MemoryFrame:
    if config.dir is None:
        return MemoryFrame(config, _STORE_IDENTITY, None)
    path = Path(config.dir).expanduser()
    try:
        path = path.resolve()
        path.mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(path))
    except OSError as exc:
        raise InvalidArgumentError(
            f"agency.memory.enable: cannot create the memory dir {config.dir!r}: {exc}"
        ) from exc
    return MemoryFrame(config, str(real), real)
