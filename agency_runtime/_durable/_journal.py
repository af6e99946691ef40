"""A run's journal as one execution sees it: what is recorded, and writing new events.

The run boundary loads the journal once per attempt and hangs it on the run's
:class:`RuntimeContext`; scopes, interrupts and checkpoints read and extend it. Outside a
run (``agency.test_context``) a journal lives only in memory, so the same code works in
unit tests.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict

from pydantic_core import from_json

from .._core._branches import qualify, tick
from .._core._context import RuntimeContext, Slot
from .._errors import AgencyCancelledError, JournalCorruptError, RunHandedBack
from .._store import RunLog
from .._types import (
    Checkpoint,
    Interrupt,
    InterruptAnswer,
    InterruptResponse,
    Journal,
    JournalEntry,
)
from ._parking import Parking

__all__ = [
    "CHILD_UNIT",
    "JOURNAL",
    "PATCH_PREFIX",
    "PausedJournals",
    "RunJournal",
    "journal_of",
]

PATCH_PREFIX = "patch:"
"""The journal path of ``agency.patched(change_id)``'s marker is this plus the change id."""

CHILD_UNIT = "agency.run"
"""The name a child run's call is journaled under in its parent (its spend is the child's)."""


class RunJournal:
    """Recorded steps, interrupt answers and checkpoints of one run, plus per-execution state.

    ``store`` and ``owner`` are ``None`` for an in-memory journal (a test frame): nothing is
    persisted and pausing is impossible.
    """

    __slots__ = (
        "_counters",
        "_last_scopes",
        "answers",
        "asked",
        "checkpoints",
        "children_pico",
        "claimed",
        "entries",
        "execution",
        "failures",
        "markers",
        "owner",
        "parking",
        "patches",
        "paused",
        "pending",
        "restores",
        "run_id",
        "scope_locals",
        "scope_names",
        "seq",
        "spent_pico",
        "spent_tokens",
        "store",
    )

    def __init__(
        self,
        run_id: str | None,
        store: RunLog | None = None,
        owner: str | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.run_id = run_id
        self.store = store
        self.owner = owner
        self.parking: Parking | None = None
        """What the run's holder asks of it (a worker's run; set by the run boundary)."""
        self.entries: dict[str, JournalEntry] = {}
        self.answers: dict[str, InterruptResponse] = {}
        self.pending: dict[str, Interrupt] = {}
        self.asked: dict[str, Interrupt] = {}
        """The recorded question of every answered interrupt (checked when it is asked again)."""
        self.checkpoints: dict[str, Checkpoint] = {}
        self.scope_names: dict[tuple[str, str], str] = {}
        self.scope_locals: dict[str, str] = {}
        self.restores: dict[str, int] = defaultdict(int)
        self.seq = 0
        self.execution = 0
        """How many times the entry has started in this attempt (a restore starts it again)."""
        self.paused: list[Interrupt] = []
        self.failures: list[tuple[BaseException, str]] = []
        """Recorded failures raised in this execution (performed or replayed), with paths."""
        self.claimed: set[str] = set()
        """What this execution replayed or recorded so far: entry paths and interrupt ids."""
        self.patches: dict[str, bool] = {}
        """What ``agency.patched`` answered for each change id in this execution."""
        self.markers: list[JournalEntry] = []
        """Patch markers not written yet: they go to the store before the next event."""
        self._counters: dict[tuple[str, str, str], int] = defaultdict(int)
        self._last_scopes: str | None = None
        self.spent_pico = 0
        """The spend the entries hold (kept as they are indexed: a resume starts from it)."""
        self.spent_tokens = 0
        self.children_pico = 0
        """The part of :attr:`spent_pico` held by child runs' calls (:data:`CHILD_UNIT`)."""
        if journal is not None:
            self._load(journal)

    def _load(self, journal: Journal) -> None:
        for entry in journal.entries:
            self._index(entry)
        self._load_answers(journal.answers)
        for checkpoint in journal.checkpoints:
            self.checkpoints[checkpoint.checkpoint_id] = checkpoint
            self.restores[checkpoint.checkpoint_id] = checkpoint.restores
        self.seq = journal.last_seq

    def _load_answers(self, answers: list[InterruptAnswer]) -> None:
        for answer in answers:
            key = answer.interrupt.interrupt_id
            if answer.response is None:
                self.pending[key] = answer.interrupt
            else:
                self.answers[key] = answer.response
                self.asked[key] = answer.interrupt

    def _index(self, entry: JournalEntry) -> str:
        """Index ``entry``; return its path."""
        # The entry's fields read as one: each attribute of a pydantic model goes through
        # its __getattr__ hook, and this runs for every step committed or loaded.
        fields = entry.__dict__
        path: str = fields["path"]
        replaced = self.entries.get(path)
        if replaced is not None:
            self._count_spend(replaced, -1)
        self.entries[path] = entry
        if fields["cost_pico"] or fields["tokens"]:
            self._count_spend(entry, 1)
        if fields["locals"] is not None:
            self.scope_locals[path.rpartition("/")[0]] = fields["locals"]
        scopes = fields["scopes"]
        if scopes and scopes != self._last_scopes:
            # Consecutive steps of one scope share their chain: parse each chain once.
            self._last_scopes = scopes
            try:
                chain = from_json(scopes)
                for parent, ordinal, name in chain:
                    self.scope_names[(str(parent), str(ordinal))] = str(name)
            except (ValueError, TypeError) as exc:
                raise JournalCorruptError(
                    f"the journal of run {self.run_id!r} is damaged at step {entry.path!r}: "
                    f"unreadable scope chain ({exc})"
                ) from exc
        return path

    def _count_spend(self, entry: JournalEntry, sign: int) -> None:
        self.spent_pico += sign * entry.cost_pico
        self.spent_tokens += sign * entry.tokens
        if entry.name == CHILD_UNIT:
            self.children_pico += sign * entry.cost_pico

    @property
    def durable(self) -> bool:
        """Whether events are persisted (a real run) rather than kept in memory."""
        return self.store is not None

    # -- per-execution state -----------------------------------------------------------------

    def begin_execution(self) -> None:
        """Reset what one execution of the entry counts (a restore re-runs the entry)."""
        self._counters.clear()
        self.paused = []
        self.failures = []
        self.claimed = set()
        self.patches = {}
        self.markers = []
        self.execution += 1

    def replaying(self) -> bool:
        """Whether this execution has recorded events still ahead of it: steps (patch markers
        aside) or interrupts (answered or pending) it has not replayed yet. An entry journaled
        inside a unit this execution replayed whole (a step's own steps, an LLM call inside a
        step, a step's failed attempts) is behind it with that unit."""
        claimed = self.claimed
        return (
            any(
                not path.startswith(PATCH_PREFIX) and not _covered(path, claimed)
                for path in self.entries
            )
            or any(key not in claimed for key in self.answers)
            or any(key not in claimed for key in self.pending)
        )

    def ordinal(self, address: str, kind: str, branch: str = "") -> int:
        """The next ordinal of ``kind`` (scope, interrupt, checkpoint, …) at ``address``,
        counted apart for each concurrent ``branch`` (see :mod:`agency_runtime._core._branches`)."""
        key = (address, branch, kind)
        value = self._counters[key]
        self._counters[key] = value + 1
        return value

    def count(self, address: str, kind: str) -> tuple[str, int]:
        """Count one ``kind`` event of the current task at ``address``.

        Returns the task's branch there (``""`` for the task that opened ``address``) and
        the event's ordinal within that branch, so neither depends on how concurrent
        branches interleave (see :mod:`agency_runtime._core._branches`).
        """
        branch = tick(address)
        return branch, self.ordinal(address, kind, branch)

    def next_token(self, address: str, kind: str) -> str:
        """:meth:`count` as one token: ``"3"``, or ``"2.0:3"`` in a concurrent branch."""
        branch, ordinal = self.count(address, kind)
        return qualify(branch, str(ordinal))

    def failed(self, path: str, exc: BaseException) -> None:
        """Note that the recorded failure at ``path`` was raised as ``exc``."""
        self.failures.append((exc, path))

    def uncaught(self, error: BaseException | None) -> list[str]:
        """Paths of recorded failures that ended the run (``error`` or what caused it)."""
        if error is None or not self.failures:
            return []
        seen: set[int] = set()
        pending: list[BaseException] = [error]
        while pending:
            exc = pending.pop()
            if id(exc) in seen:
                continue
            seen.add(id(exc))
            if isinstance(exc, BaseExceptionGroup):
                pending.extend(exc.exceptions)
            for linked in (exc.__cause__, exc.__context__):
                if linked is not None:
                    pending.append(linked)
        return sorted({path for exc, path in self.failures if id(exc) in seen})

    def next_seq(self) -> int:
        """Reserve the next journal position."""
        self.seq += 1
        return self.seq

    # -- writing ---------------------------------------------------------------------------

    def _lost(self) -> AgencyCancelledError:
        return AgencyCancelledError(
            f"run {self.run_id!r} was cancelled or taken over by another process; "
            "this process stops here",
            cause={"kind": "leaseLost"},
        )

    async def _write_markers(self) -> None:
        """Persist the patch markers of this execution before anything recorded after them."""
        markers, self.markers = self.markers, []
        for marker in markers:
            await self._persist(marker)

    async def _persist(self, entry: JournalEntry) -> None:
        """:meth:`commit_step` of a patch marker (no hand-back: the step it precedes follows)."""
        if self.store is not None:
            assert self.owner is not None
            if not await self.store.commit_step(entry, owner=self.owner):
                raise self._lost()
        self._own(entry)

    def _own(self, entry: JournalEntry) -> None:
        """Index an entry this execution committed (nothing to replay there)."""
        self.claimed.add(self._index(entry))

    async def commit_step(self, entry: JournalEntry) -> None:
        """Persist a completed step (one transaction) and index it.

        Every step commits here: the store is awaited directly, not through :meth:`_persist`
        (a coroutine more per step)."""
        if self.markers:
            await self._write_markers()
        store = self.store
        if store is not None:
            assert self.owner is not None
            if not await store.commit_step(entry, owner=self.owner):
                raise self._lost()
        self._own(entry)
        if self.parking is not None and self.parking.requested:
            raise RunHandedBack()  # the holder asked the run to stop after this commit

    async def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Persist a checkpoint and index it."""
        if self.markers:
            await self._write_markers()
        if self.store is not None:
            assert self.owner is not None
            if not await self.store.save_checkpoint(checkpoint, owner=self.owner):
                raise self._lost()
        self.checkpoints[checkpoint.checkpoint_id] = checkpoint

    async def record_pause(self) -> None:
        """Persist the interrupts this execution paused on, before the run reports them."""
        if self.store is None or not self.paused:
            return
        if self.markers:
            await self._write_markers()
        assert self.run_id is not None
        assert self.owner is not None
        answers = [
            InterruptAnswer(run_id=self.run_id, seq=self.next_seq(), interrupt=interrupt)
            for interrupt in self.paused
        ]
        if not await self.store.record_interrupts(answers, owner=self.owner):
            raise self._lost()
        for interrupt in self.paused:
            self.pending[interrupt.interrupt_id] = interrupt

    async def rewind(
        self, seq: int, *, overrides: str | None = None, checkpoint: Checkpoint | None = None
    ) -> None:
        """Forget (and delete from the store) every event after position ``seq``.

        ``overrides`` and ``checkpoint`` (the restored checkpoint with its restore count) are
        stored in the same transaction.
        """
        if self.store is not None:
            assert self.run_id is not None
            assert self.owner is not None
            if not await self.store.rewind(
                self.run_id, seq, owner=self.owner, overrides=overrides, checkpoint=checkpoint
            ):
                raise self._lost()
        entries = [e for e in self.entries.values() if e.seq <= seq]
        self.entries, self.scope_locals, self.scope_names = {}, {}, {}
        self._last_scopes = None
        self.spent_pico = self.spent_tokens = self.children_pico = 0
        for entry in sorted(entries, key=lambda e: e.seq):
            self._index(entry)
        self.checkpoints = {k: c for k, c in self.checkpoints.items() if c.seq <= seq}
        if checkpoint is not None:
            self.checkpoints[checkpoint.checkpoint_id] = checkpoint
        # Answers and pending interrupts carry no position in memory; reload keeps it exact.
        if self.store is not None:
            assert self.run_id is not None
            self.answers, self.pending, self.asked = {}, {}, {}
            self._load_answers((await self.store.load_journal(self.run_id)).answers)
        self.seq = max(self.seq, seq)


class PausedJournals:
    """Journals of runs paused in this process, so answering one does not re-read it.

    An entry is valid while the run's ``version`` is the one it was cached at (every status
    change and every stored answer bumps it), so another process's change is never missed.
    """

    def __init__(self, limit: int = 256) -> None:
        self._limit = limit
        self._items: OrderedDict[tuple[int, str], tuple[int, RunJournal]] = OrderedDict()

    def keep(self, store: RunLog, run_id: str, version: int, journal: RunJournal) -> None:
        """Remember ``journal`` as it is at ``version`` of the run."""
        self._items[(id(store), run_id)] = (version, journal)
        self._items.move_to_end((id(store), run_id))
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def answered(
        self, store: RunLog, run_id: str, version: int, answers: dict[str, InterruptResponse]
    ) -> None:
        """Record answers this process stored (moving the run from ``version`` on by one)."""
        item = self._items.get((id(store), run_id))
        if item is None or item[0] != version:
            self._items.pop((id(store), run_id), None)
            return
        journal = item[1]
        for key, response in answers.items():
            journal.answers[key] = response
            asked = journal.pending.pop(key, None)
            if asked is not None:
                journal.asked[key] = asked
        self._items[(id(store), run_id)] = (version + 1, journal)

    def take(self, store: RunLog, run_id: str, version: int) -> RunJournal | None:
        """The cached journal if the run is exactly one claim past it, else ``None``."""
        item = self._items.pop((id(store), run_id), None)
        if item is None or item[0] + 1 != version:
            return None
        return item[1]


JOURNAL: Slot[RunJournal] = Slot("journal")
"""The run's journal, kept on its context (set by the run boundary)."""


def _covered(path: str, claimed: set[str]) -> bool:
    """Whether ``path``, or a unit it was journaled inside (a path it extends by ``/…``),
    was claimed by this execution."""
    if path in claimed:
        return True
    cut = path.rfind("/")
    while cut > 0:
        if path[:cut] in claimed:
            return True
        cut = path.rfind("/", 0, cut)
    return False


def journal_of(ctx: RuntimeContext) -> RunJournal:
    """The journal of ``ctx``'s run (an in-memory one is made for test frames)."""
    return ctx.ensure(JOURNAL, lambda: RunJournal(ctx.run_id))
