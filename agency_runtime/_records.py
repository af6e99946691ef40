"""The journal's persisted shapes: steps, interrupt answers and checkpoints.

Every journal event of a run has a position, ``seq``, increasing in the order events were
written. Rewinding to a checkpoint deletes every event after the checkpoint's position.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._results import Interrupt

__all__ = [
    "Checkpoint",
    "InterruptAnswer",
    "InterruptResponse",
    "Journal",
    "JournalEntry",
    "MemoryRecord",
]


class InterruptResponse(BaseModel):
    """An answer to an interrupt: approve or reject, with an optional value."""

    model_config = ConfigDict(frozen=True)

    type: Literal["approve", "reject"]
    value: Any = None

    @property
    def approved(self) -> bool:
        """Whether the answer is an approval."""
        return self.type == "approve"


class JournalEntry(BaseModel):
    """One completed step (or journaled call), committed with everything it changed."""

    model_config = ConfigDict()

    run_id: str
    seq: int = Field(description="Position in the run's journal.")
    path: str = Field(description="The step's address, e.g. 'order/2' or 'outer/1/inner/0'.")
    name: str = Field(description="The step's name (name= or the callable's qualified name).")
    callsite: str = Field(default="", description="Where s.step was called, as 'file:line'.")
    result: str = Field(description="The JSON of the step's result.")
    locals: str | None = Field(default=None, description="The JSON of the scope's locals.")
    scopes: str | None = Field(
        default=None, description="The JSON [[parent, ordinal, name], ...] of enclosing scopes."
    )
    deltas: str | None = Field(
        default=None,
        description="The JSON list of changes the step made (threads, spend, guard grants).",
    )
    error: str | None = Field(
        default=None,
        description="The JSON of the failure the step recorded (an LLM call that failed); "
        "replaying the step raises it again.",
    )
    cost_pico: int = Field(
        default=0,
        description="The spend the step made itself, in pico-dollars (journaled calls nested "
        "in it commit their own).",
    )
    tokens: int = Field(default=0, description="The tokens the step billed itself.")
    created_at: float = Field(default_factory=time.time)

    @classmethod
    def from_row(cls, values: dict[str, Any]) -> JournalEntry:
        """Build an entry from trusted values (every field given), skipping validation.

        Stores use it to load thousands of rows: it does what ``model_construct`` does for a
        complete set of fields, an order of magnitude faster. Values that turn out to be
        damaged are reported when the step is replayed.
        """
        entry = cls.__new__(cls)
        object.__setattr__(entry, "__dict__", values)
        object.__setattr__(entry, "__pydantic_fields_set__", set(_ENTRY_FIELDS))
        object.__setattr__(entry, "__pydantic_extra__", None)
        object.__setattr__(entry, "__pydantic_private__", None)
        return entry


_ENTRY_FIELDS: frozenset[str] = frozenset(JournalEntry.model_fields)


class InterruptAnswer(BaseModel):
    """An interrupt a run paused on, and its answer once given."""

    model_config = ConfigDict()

    run_id: str
    seq: int
    interrupt: Interrupt
    response: InterruptResponse | None = None
    answered_at: float | None = None


class Checkpoint(BaseModel):
    """A run's state at one point: journal position, threads, globals and spend."""

    model_config = ConfigDict()

    checkpoint_id: str
    run_id: str | None
    seq: int = Field(description="The journal position the checkpoint rewinds to.")
    label: str | None = None
    module_id: str = ""
    scope_name: str = ""
    step_path: str = ""
    threads: str = Field(default="{}", description="The JSON of the run's ThreadStore.")
    globals: dict[str, dict[str, Any]] = Field(default_factory=dict)
    locals: dict[str, Any] = Field(default_factory=dict)
    cost: float = 0.0
    tokens: int = 0
    pinned: bool = False
    restores: int = Field(default=0, description="How many times the run was restored to it.")
    created_at: float = Field(default_factory=time.time)


class Journal(BaseModel):
    """Everything stored about a run's progress, as loaded to resume it."""

    model_config = ConfigDict()

    entries: list[JournalEntry] = Field(default_factory=list)
    answers: list[InterruptAnswer] = Field(default_factory=list)
    checkpoints: list[Checkpoint] = Field(default_factory=list)

    @property
    def last_seq(self) -> int:
        """The highest position used so far (0 for an empty journal)."""
        return max(
            [0]
            + [e.seq for e in self.entries]
            + [a.seq for a in self.answers]
            + [c.seq for c in self.checkpoints]
        )


class MemoryRecord(BaseModel):
    """One remembered item of conversation memory, as stored."""

    model_config = ConfigDict()

    id: str
    namespace: str
    content: str
    tags: list[str] = Field(default_factory=list)
    scope: str = "workspace"
    created_at: float = Field(default_factory=time.time)
    expires_at: float | None = None
