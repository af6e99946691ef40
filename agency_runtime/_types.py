"""Every shape a run persists or returns: one module, pydantic models all.

* what a run returns: :class:`RunResult`, :class:`ErrorInfo`, :class:`Interrupt`;
* the journal: :class:`JournalEntry` (a committed step), :class:`InterruptAnswer`,
  :class:`InterruptResponse`, :class:`Checkpoint` and the loaded :class:`Journal`;
* a run as stored: :class:`RunRecord`, and a claim on it, :class:`Claim`;
* conversation memory as stored: :class:`MemoryRecord`.

Every journal event of a run has a position, ``seq``, increasing in the order events were
written. Rewinding to a checkpoint deletes every event after the checkpoint's position.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from typing_extensions import TypeVar

from ._bounds import EARLIEST_TIME, LATEST_TIME, MAX_SECONDS
from ._errors import RunFailedError, RunPausedError

__all__ = [
    "FINAL_STATUSES",
    "MAX_TRACEBACK",
    "PRUNABLE_STATUSES",
    "Checkpoint",
    "Claim",
    "DeferredModel",
    "ErrorInfo",
    "Interrupt",
    "InterruptAnswer",
    "InterruptResponse",
    "Journal",
    "JournalEntry",
    "JournalPage",
    "MemoryRecord",
    "RunEvent",
    "RunRecord",
    "RunResult",
    "RunStatus",
    "Schedule",
    "Time",
    "bind_store",
    "note_failing_step",
    "store_of",
]

RunStatus = Literal["queued", "running", "waiting", "completed", "paused", "failed", "cancelled"]
"""A run's state. ``completed`` and ``cancelled`` are final; the others can continue.

``queued``: waiting for a worker (``agency.enqueue``, an answer given with ``enqueue=True``,
or handed back by a draining worker). ``waiting``: parked by a worker in ``agency.sleep`` or
``agency.wait_for_event``; a worker continues it at ``wake_at`` or when the event comes."""

FINAL_STATUSES: frozenset[str] = frozenset({"completed", "cancelled"})

PRUNABLE_STATUSES: tuple[RunStatus, ...] = ("completed", "failed", "cancelled")
"""The statuses of runs that ended, which ``agency.runs.prune`` may delete: the final ones,
and ``failed`` (a failed run can be resumed, but nothing continues it on its own). A queued,
running, waiting or paused run is never pruned."""

Time = Annotated[float, Field(allow_inf_nan=False, ge=EARLIEST_TIME, le=LATEST_TIME)]
"""A stored time, seconds since the epoch: finite and within the years 1 to 9999, so it can
always be shown as a date (a row holding another is damaged, see :attr:`RunRecord.damaged`)."""


class DeferredModel(BaseModel):
    """The base of this package's models: pydantic builds a model's schema on first use.

    Building every model's validator and serializer when its module was imported was most of
    the import's time, so each model defers it (``defer_build``) until it is first validated,
    dumped or described. ``defer_build`` alone would let an instance exist while its class is
    still unbuilt — made inside another model's or a TypeAdapter's validation (ours or a
    user's), by ``model_construct``, or unpickled — and pydantic-core cannot serialize such an
    instance by itself (``to_json(instance)``: "'MockValSer' object is not an instance of
    'SchemaSerializer'"). So every instance completes its class as it is made
    (``model_post_init``, ``__setstate__``): no instance of an unbuilt class ever exists.
    """

    model_config = ConfigDict(defer_build=True)

    def model_post_init(self, context: Any, /) -> None:
        """Build this model's class if this is its first instance (see the class docstring)."""
        if not type(self).__pydantic_complete__:
            complete(type(self))

    def __setstate__(self, state: dict[Any, Any]) -> None:
        """Unpickle, building the class first (see the class docstring)."""
        complete(type(self))
        super().__setstate__(state)


def complete(model: type[BaseModel]) -> None:
    """Build ``model``'s schema, validator and serializer now if they are still deferred."""
    if not model.__pydantic_complete__:
        # Depth 0: its annotations resolve in its own module, never in some caller's locals.
        model.model_rebuild(_parent_namespace_depth=0)


class _Origin:
    """The store a run's result, record or interrupt was read from, in this process only.

    It is no field (never dumped, never in JSON or a repr, never a schema), pickles as
    nothing (another process has its own stores), is immutable and compares equal to every
    other origin, so two results of one run are equal wherever they were read.
    """

    __slots__ = ("store",)

    def __init__(self, store: Any = None) -> None:
        self.store = store

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Origin)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<origin>"

    def __reduce__(self) -> tuple[type[_Origin], tuple[()]]:
        return _Origin, ()

    def __copy__(self) -> _Origin:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Origin:
        return self


_NOWHERE = _Origin()
_PICO_PER_USD = 10**12
"""Pico-dollars per US dollar (``_core._money.PICO_PER_USD``, a layer above this one)."""
_T = TypeVar("_T")
_V = TypeVar("_V", default=Any)
"""What a run's entry returns: ``RunResult[int]`` for an entry annotated ``-> int``; a bare
``RunResult`` is ``RunResult[Any]``. Only type checkers see it: the runtime never parametrizes
the class, so ``value`` validates and dumps as ``Any`` does."""


class _FromStore(DeferredModel):
    """A shape read from (or written to) a store, which it remembers in this process."""

    _source: _Origin = PrivateAttr(default=_NOWHERE)


def bind_store(value: _T, store: Any) -> _T:
    """Remember ``store`` as where ``value`` (a :class:`RunResult`, :class:`RunRecord` or
    :class:`Interrupt`, and the interrupts it holds) came from; returns ``value``.

    So ``agency.respond_to_interrupts(result, ...)`` answers on the store the run is on
    without ``store=``. Only the object is kept, in this process: never a URL, never stored.
    """
    if isinstance(value, _FromStore):
        origin = _Origin(store)
        value._source = origin
        for item in getattr(value, "interrupts", ()):
            if isinstance(item, _FromStore):
                item._source = origin
    return value


def store_of(value: object) -> Any:
    """The store ``value`` (a result, a record, an interrupt or a list of interrupts) was
    read from in this process, or ``None``."""
    if isinstance(value, list | tuple) and value:
        value = value[0]
    return value._source.store if isinstance(value, _FromStore) else None


_FAILING_STEP = "__agency_failing_step__"
MAX_TRACEBACK = 16_384
"""The most characters of a traceback a run's error keeps (its end: the innermost frames)."""


def note_failing_step(exc: BaseException, name: str, path: str) -> None:
    """Mark ``exc`` as raised out of the journaled unit ``name`` at ``path``, unless a unit
    inside it was marked first (the innermost unit is the failing step)."""
    if isinstance(exc, Exception) and not hasattr(exc, _FAILING_STEP):
        try:
            setattr(exc, _FAILING_STEP, f"{name} at {path}" if path else name)
        except (AttributeError, TypeError):  # an exception type without attributes
            pass


class ErrorInfo(DeferredModel):
    """The JSON form of an exception that ended a run."""

    model_config = ConfigDict()

    type: str
    message: str
    module: str | None = None
    step: str | None = None
    """The journaled unit it came out of (``"charge at main/2"``), when it came out of one."""
    traceback: str | None = None
    """Its traceback (the end, at most :data:`MAX_TRACEBACK` characters), secrets masked."""

    @classmethod
    def from_exception(cls, exc: BaseException, *secrets: str | None) -> ErrorInfo:
        """Describe ``exc`` by its class name, message, defining module, failing step and
        traceback, with each of ``secrets`` masked in the message and the traceback."""
        import traceback  # on first failure: not needed to import agency_runtime

        from ._secrets import mask

        kind = type(exc)
        text = "".join(traceback.format_exception(exc))
        if len(text) > MAX_TRACEBACK:
            text = "…" + text[-(MAX_TRACEBACK - 1) :]
        step = getattr(exc, _FAILING_STEP, None)
        return cls(
            type=kind.__qualname__,
            message=mask(str(exc), *secrets),
            module=kind.__module__,
            step=step if isinstance(step, str) else None,
            traceback=mask(text, *secrets),
        )


class Interrupt(_FromStore):
    """A question a run asks a human (or a handler) before it can go on.

    Interrupt ids are deterministic: derived from the run id and the call site, so a resumed
    run matches each answer to the call that asked it.
    """

    model_config = ConfigDict()

    interrupt_id: str
    effect: str = "unknown"
    message: str = ""
    data: Any = None
    origin: str = ""
    run_id: str | None = None
    expects_value: bool = False
    checkpoint_id: str | None = None


class RunResult(_FromStore, Generic[_V]):
    """The outcome of ``agency.run``: status, value or error, interrupts, spend and timings.

    Typed by what the entry returns: ``await agency.run(entry)`` for an entry annotated
    ``-> Answer`` is a ``RunResult[Answer]``, whose ``unwrap()`` is an ``Answer`` (and
    ``value`` an ``Answer | None``: a run that did not complete has none).

    ``exception`` holds the original exception object in the process that ran the entry; it
    is never stored (``error`` is its JSON form).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    run_id: str
    status: RunStatus
    value: _V | None = None
    interrupts: list[Interrupt] = Field(default_factory=list)
    cost: float = 0.0
    tokens: int = 0
    error: ErrorInfo | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration: float | None = Field(
        default=None, description="Seconds the last execution of the entry took."
    )
    replayed: bool = Field(
        default=False,
        description="True when this result was read from the store instead of executed now.",
    )
    wake_at: datetime | None = Field(
        default=None,
        description="When a waiting run (parked in agency.sleep or agency.wait_for_event) "
        "is due to continue; None for other runs and for a wait without a timeout.",
    )
    exception: BaseException | None = Field(default=None, exclude=True, repr=False)

    @property
    def ok(self) -> bool:
        """Whether the run completed."""
        return self.status == "completed"

    def unwrap(self) -> _V:
        """The run's value; raises :class:`RunPausedError` or :class:`RunFailedError` otherwise.

        A failed run's original exception (when this process ran it) is chained as the cause.
        """
        if self.status == "completed":
            return cast(_V, self.value)
        if self.status == "paused":
            raise RunPausedError(self)
        raise RunFailedError(self) from self.exception


class InterruptResponse(DeferredModel):
    """An answer to an interrupt: approve or reject, with an optional value."""

    model_config = ConfigDict(frozen=True)

    type: Literal["approve", "reject"]
    value: Any = None

    @property
    def approved(self) -> bool:
        """Whether the answer is an approval."""
        return self.type == "approve"


class JournalEntry(DeferredModel):
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
        if not cls.__pydantic_complete__:  # no instance of an unbuilt class (DeferredModel)
            complete(cls)
        entry = cls.__new__(cls)
        _object_setattr(entry, "__dict__", values)
        # One set for every entry: all fields are set, so pydantic's only change to it (the
        # name of an assigned field) leaves it as it is; copies of an entry copy it.
        _object_setattr(entry, "__pydantic_fields_set__", _ALL_SET)
        _object_setattr(entry, "__pydantic_extra__", None)
        _object_setattr(entry, "__pydantic_private__", None)
        return entry


_object_setattr = object.__setattr__
"""Bypasses pydantic's ``__setattr__`` (as its ``model_construct`` does); bound once: looking
it up on ``object`` is a type attribute lookup, four per journaled step."""

_ENTRY_FIELDS: frozenset[str] = frozenset(JournalEntry.model_fields)
_ALL_SET: set[str] = set(_ENTRY_FIELDS)


class InterruptAnswer(DeferredModel):
    """An interrupt a run paused on, and its answer once given."""

    model_config = ConfigDict()

    run_id: str
    seq: int
    interrupt: Interrupt
    response: InterruptResponse | None = None
    answered_at: float | None = None


class Checkpoint(DeferredModel):
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


class Journal(DeferredModel):
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


class JournalPage(Journal):
    """A window of a run's journal, in journal order: its steps after the position the page
    was read after (at most the page's limit), and the interrupts and checkpoints among them.

    ``next_after`` is where the next page starts (pass it as ``after_seq``), ``None`` at the
    end; ``size`` is how many steps the whole journal holds."""

    model_config = ConfigDict()

    next_after: int | None = None
    size: int = 0


class MemoryRecord(DeferredModel):
    """One remembered item of conversation memory, as stored."""

    model_config = ConfigDict()

    id: str
    namespace: str
    content: str
    tags: list[str] = Field(default_factory=list)
    scope: str = "workspace"
    created_at: float = Field(default_factory=time.time)
    expires_at: float | None = None


class RunRecord(_FromStore):
    """A run as stored: identity, inputs, state, outcome, spend and lease.

    A stored row that cannot be read back (edited by hand, written by a broken tool, a disk
    fault) damages only itself: ``agency.runs.list`` (and the CLI's and the inspector's lists)
    return it with ``status="damaged"`` and :attr:`damaged` saying what is wrong, keeping the
    fields that could be read and the defaults for the others; opening it
    (``agency.runs.get``, ``agency resume``, ...) raises :class:`StoreError` saying the same.
    A damaged record is never stored, claimed or run.
    """

    model_config = ConfigDict()

    run_id: str
    status: RunStatus | Literal["damaged"] = Field(
        description="The run's state; 'damaged' only on a row a list could not read."
    )
    entry: str = Field(description="Where the entry lives, as 'module:qualname'.")
    arguments: str = Field(description='The JSON {"args": [...], "kwargs": {...}} given.')
    model: str | None = None
    overrides: str | None = Field(
        default=None, description="The JSON arguments a restore replaced them with, if any."
    )
    value: str | None = Field(default=None, description="The JSON of the entry's value.")
    error: ErrorInfo | None = None
    interrupts: list[Interrupt] = Field(default_factory=list)
    cost_pico: int = Field(default=0, description="The run's spend when it last stopped.")
    tokens: int = 0
    unjournaled_pico: int = Field(
        default=0,
        description="Spend no committed step holds: made outside steps, or in steps since "
        "rewound or forgotten. A run's spend is this plus the sum of its steps' own spend.",
    )
    unjournaled_tokens: int = 0
    attempts: int = 0
    version: int = 0
    queue: str | None = Field(
        default=None,
        description="The queue whose workers run it (None: only agency.run/resume do).",
    )
    priority: int = Field(default=0, description="Within its queue, higher runs first.")
    wake_at: Time | None = Field(
        default=None,
        description="A waiting run: when a worker continues it (None: only an event wakes it).",
    )
    waiting_for: list[str] = Field(
        default_factory=list,
        description="A waiting run: the names of the events that wake it before wake_at.",
    )
    lease_owner: str | None = None
    lease_expires_at: Time | None = None
    created_at: Time = Field(default_factory=time.time)
    started_at: Time | None = None
    finished_at: Time | None = None
    updated_at: Time = Field(default_factory=time.time)
    parent_id: str | None = Field(
        default=None,
        description="The run that started this one as a child run (None: a top-level run).",
    )
    root_id: str | None = Field(
        default=None,
        description="The top-level run of this run's tree (None for a top-level run itself).",
    )
    depth: int = Field(
        default=0, ge=0, description="0 for a top-level run; a child's is its parent's + 1."
    )
    descendants_pico: int = Field(
        default=0,
        ge=0,
        description="The part of cost_pico that the run's descendants (its child runs and "
        "theirs) spent, in pico-dollars.",
    )
    damaged: str | None = Field(
        default=None,
        description="None for a readable row; for a row a list could not read (status "
        "'damaged'), what is wrong with it. Never stored.",
    )

    @property
    def is_final(self) -> bool:
        """Whether the run can no longer change (completed or cancelled)."""
        return self.status in FINAL_STATUSES

    @property
    def cost(self) -> float:
        """The run's spend in US dollars, its descendants' included (``cost_pico``), as
        :attr:`RunResult.cost` says it."""
        return self.cost_pico / _PICO_PER_USD

    @property
    def own_cost_pico(self) -> int:
        """The spend the run made itself, in pico-dollars: ``cost_pico`` without what its
        descendants spent (``descendants_pico``)."""
        return self.cost_pico - self.descendants_pico

    @property
    def own_cost(self) -> float:
        """The spend the run made itself in US dollars (:attr:`own_cost_pico`)."""
        return self.own_cost_pico / _PICO_PER_USD

    def fork_as(self, new_run_id: str, *, cost_pico: int = 0, tokens: int = 0) -> RunRecord:
        """A copy of this run under ``new_run_id``: paused, unclaimed, with no outcome yet.

        ``cost_pico`` and ``tokens``: the spend of the journal prefix the fork keeps. A fork
        is a new top-level run: no parent, no root, depth 0, no descendants' spend.
        """
        now = time.time()
        return self.model_copy(
            update={
                "run_id": new_run_id,
                "status": "paused",
                "cost_pico": cost_pico,
                "tokens": tokens,
                "unjournaled_pico": 0,
                "unjournaled_tokens": 0,
                "value": None,
                "error": None,
                "interrupts": [],
                "attempts": 0,
                "version": 1,
                "wake_at": None,
                "waiting_for": [],
                "lease_owner": None,
                "lease_expires_at": None,
                "created_at": now,
                "started_at": None,
                "finished_at": None,
                "updated_at": now,
                "parent_id": None,
                "root_id": None,
                "depth": 0,
                "descendants_pico": 0,
            },
            deep=True,
        )

    def lease_alive(self, now: float) -> bool:
        """Whether a running run's holder still holds an unexpired lease."""
        return (
            self.status == "running"
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )


class Claim(DeferredModel):
    """The answer to :meth:`Store.claim_run`."""

    model_config = ConfigDict()

    acquired: bool = Field(description="True when the caller now holds the run's lease.")
    created: bool = Field(description="True when the run did not exist before this claim.")
    record: RunRecord = Field(description="The run as it is after the claim.")


class RunEvent(DeferredModel):
    """An event sent to a run (``agency.runs.send``), buffered until a wait takes it."""

    model_config = ConfigDict()

    event_id: int = Field(description="Increasing in the order events were sent (per store).")
    run_id: str
    name: str
    payload: str = Field(description="The JSON of the payload sent.")
    sent_at: float
    taken_by: str | None = Field(
        default=None,
        description="The journal path of the wait that took it (None: not taken yet).",
    )


class Schedule(DeferredModel):
    """A schedule (``agency.schedules.add``): starts ``entry`` at every occurrence.

    Exactly one of ``cron`` and ``every`` is set. Occurrence runs are queued in ``queue``
    with the run id ``"{name}@{ISO time}"``; ``next_at`` is the next occurrence not started.
    A stored row that cannot be read back is listed with :attr:`damaged` saying what is
    wrong (and defaults for what could not be read); it is never fired.
    """

    model_config = ConfigDict()

    name: str
    entry: str = Field(description="The entry, as 'module:qualname' or its declared name.")
    arguments: str = Field(description='The JSON {"args": [...], "kwargs": {...}} given.')
    cron: str | None = Field(default=None, description="A cron expression (croniter's).")
    every: Annotated[float, Field(allow_inf_nan=False, gt=0, le=MAX_SECONDS)] | None = Field(
        default=None, description="Seconds between occurrences, counted from the epoch."
    )
    timezone: str = Field(default="UTC", description="The time zone cron fields are read in.")
    queue: str = "default"
    next_at: Time = Field(description="Seconds since the epoch of the next occurrence.")
    created_at: Time = Field(default_factory=time.time)
    updated_at: Time = Field(default_factory=time.time)
    damaged: str | None = Field(
        default=None,
        description="None for a readable row; for a row a list could not read, what is "
        "wrong with it. Never stored.",
    )

    @property
    def next_time(self) -> datetime:
        """:attr:`next_at` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.next_at, UTC)

    def same_plan(self, other: Schedule) -> bool:
        """Whether ``other`` starts the same entry, with the same arguments, at the same times."""
        keys = ("entry", "arguments", "cron", "every", "timezone", "queue")
        return all(getattr(self, key) == getattr(other, key) for key in keys)
