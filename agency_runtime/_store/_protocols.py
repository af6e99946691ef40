"""The store's protocols: seven narrow ones, and :class:`Store`, their union.

A feature depends on the protocol it uses:

* :class:`RunLog` — runs, leases, journals and answers, pruning (the run boundary, the
  journal, ``agency.runs.prune``);
* :class:`RunQueue` — queued runs, workers claiming them, wake-ups (queues, workers, waits);
* :class:`EventLog` — events sent to runs and taken by waits (``agency.runs.send``, waits);
* :class:`ScheduleTable` — cron and interval schedules (``agency.schedules``, workers);
* :class:`LockTable` — store-wide FIFO locks (``agency.lock(..., scope="global")``);
* :class:`MemoryIndex` — conversation memory and the agent memory's keyword index;
* :class:`DocumentStore` — JSON documents (agent memory graphs, the Telegram poller).

:class:`AgentMemoryStore` is the one intersection a feature needs (agent memory keeps its
graph as documents and indexes its observations). A backend implements all seven
(:class:`Store`), and the semantics every backend must share (who may claim a run, which
words a query searches, how recall is ranked) are written once in
:mod:`agency_runtime._store._rules`.

Every method may raise :class:`~agency_runtime.StoreError` (the underlying database error
chained). Methods are ``async`` so network-backed stores need no thread hop; embedded
stores commit inline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from .._types import (
    PRUNABLE_STATUSES,
    Checkpoint,
    Claim,
    InterruptAnswer,
    InterruptResponse,
    Journal,
    JournalEntry,
    JournalPage,
    MemoryRecord,
    RunEvent,
    RunRecord,
    RunStatus,
    Schedule,
)

__all__ = [
    "AgentMemoryStore",
    "ClaimedRun",
    "DocumentStore",
    "EventLog",
    "LockTable",
    "MemoryIndex",
    "RunLog",
    "RunQueue",
    "ScheduleTable",
    "Store",
]


class ClaimedRun(NamedTuple):
    """A run a worker claimed (:meth:`RunQueue.claim_queued_runs`)."""

    record: RunRecord
    """The run as stored by the claim."""
    empty_journal: bool
    """``True`` when the run had journaled nothing when it was claimed (no step, answer or
    checkpoint stored for it: a queued run that never started), so its journal is empty and
    need not be read; ``False`` when it had, or the claim could not tell."""


@runtime_checkable
class RunLog(Protocol):
    """Runs, their leases, their journals and the answers to their interrupts, and pruning
    the runs that ended long ago."""

    @property
    def url(self) -> str:
        """The URL this store was opened from (``memory://``, ``sqlite:///…``)."""
        ...

    async def claim_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        lease_seconds: float,
        steal_from: str | None = None,
    ) -> Claim:
        """Atomically claim ``record.run_id`` for ``owner``.

        * no such run: insert ``record`` as ``running`` with the lease → acquired, created;
        * the run is final, or running under an unexpired lease: nothing changes → not
          acquired (the stored record is returned);
        * otherwise (paused, failed, a holder whose lease expired, or the holder named by
          ``steal_from``, known to be dead): take it over as ``running`` with
          ``attempts + 1`` → acquired.
        """
        ...

    async def renew_lease(self, run_id: str, *, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s lease; ``False`` when ``owner`` no longer holds it."""
        ...

    async def finish_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        unjournaled: tuple[int, int] = (0, 0),
        forget: Sequence[str] = (),
    ) -> bool:
        """Store the outcome fields of ``record`` and release the lease, in one transaction.

        A ``record.status`` of ``queued`` hands the run back to its queue (a draining worker):
        the lease is released and any worker may claim it at once. A ``waiting`` run (parked
        by a worker) is stored with its ``wake_at`` and ``waiting_for``; when an event it
        waits for is buffered already, its ``wake_at`` becomes now, in the same transaction,
        so an event sent while it parked is never missed. Every stored outcome wakes
        whoever waits on runs (:meth:`RunQueue.wait_for_runs`).

        The spend stored is ``record``'s: ``cost_pico`` (its descendants' included),
        ``descendants_pico`` and ``tokens``. ``unjournaled`` (pico-dollars, tokens) is added
        to the run's unjournaled spend: what this attempt spent outside committed steps.
        ``forget`` names steps to delete (failures recorded by this attempt that ended the
        run, so a retry runs them again); their spend moves to the unjournaled spend. Writes
        only while ``owner`` holds the lease; returns ``False`` (writing nothing) when the
        lease was lost to another claimant.
        """
        ...

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The stored run, or ``None``."""
        ...

    async def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        limit: int = 100,
        offset: int = 0,
        parent: str | None = None,
    ) -> list[RunRecord]:
        """Up to ``limit`` runs, newest first, after skipping ``offset`` of them.

        Optionally only those with ``status``, and only the direct children of run
        ``parent`` (the runs whose ``parent_id`` it is). The order is stable (creation time,
        then insertion order, both descending), so pages do not overlap.
        """
        ...

    async def load_journal(self, run_id: str) -> Journal:
        """Every step, interrupt and checkpoint stored for ``run_id``, in journal order."""
        ...

    async def load_journal_page(
        self, run_id: str, *, after_seq: int | None = None, limit: int = 200
    ) -> JournalPage:
        """Up to ``limit`` steps of ``run_id`` after position ``after_seq`` (from the start
        when ``None``), in journal order, with the interrupts and checkpoints among them and
        the journal's size: a big run's journal a page at a time."""
        ...

    async def journal_position(self, run_id: str, index: int) -> int | None:
        """The position of the run's ``index``-th step (0 the first), ``None`` past the end
        (pages by number: page ``n`` of ``limit`` starts after ``index = (n - 1) * limit - 1``)."""
        ...

    async def commit_step(self, entry: JournalEntry, *, owner: str) -> bool:
        """Append a completed step in one transaction, while ``owner`` holds the lease.

        Returns ``False`` (writing nothing) when the lease was lost or the run cancelled.
        """
        ...

    async def record_interrupts(self, answers: list[InterruptAnswer], *, owner: str) -> bool:
        """Store interrupts a run is pausing on (unanswered), while ``owner`` holds the lease."""
        ...

    async def answer_interrupts(
        self, run_id: str, responses: dict[str, InterruptResponse], *, enqueue: bool = False
    ) -> list[str]:
        """Store answers for pending interrupts, all or none.

        Returns the ids that could not be answered (unknown, or answered already); when the
        list is not empty nothing was written. Answering bumps the run's ``version``. With
        ``enqueue``, the same transaction makes the paused run ``queued`` (in its queue, or
        ``"default"`` when it has none) for a worker to continue, and wakes the workers.
        """
        ...

    async def save_checkpoint(self, checkpoint: Checkpoint, *, owner: str) -> bool:
        """Store (or replace) a checkpoint, while ``owner`` holds the lease."""
        ...

    async def rewind(
        self,
        run_id: str,
        seq: int,
        *,
        owner: str,
        overrides: str | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        """Delete every journal event after position ``seq`` (restore to a checkpoint).

        In one transaction: ``overrides``, when given, becomes the run's effective arguments
        and globals from now on; the deleted steps' spend moves to the unjournaled spend (it
        was spent); ``checkpoint``, when given, is stored (with its restore count), so a
        process killed right after the rewind never restores again by mistake.
        """
        ...

    async def cancel_run(self, run_id: str) -> RunRecord | None:
        """Mark a run cancelled unless it is final; its holder stops at its next step."""
        ...

    async def fork_run(self, run_id: str, new_run_id: str, upto_seq: int) -> RunRecord:
        """Copy a run and its journal up to position ``upto_seq`` under a new id (paused)."""
        ...

    async def trace_context(self, run_id: str) -> str | None:
        """The trace context (a W3C ``traceparent``) the run's last traced execution noted, or
        its parent's call span for a queued child run; ``None`` when never traced."""
        ...

    async def note_trace_context(self, run_id: str, context: str) -> None:
        """Note ``context`` (a ``traceparent``) as the run's trace context (for span links)."""
        ...

    async def prune_runs(
        self,
        *,
        older_than: float,
        statuses: Sequence[str] = PRUNABLE_STATUSES,
        batch: int = 500,
    ) -> int:
        """Delete the runs that ended more than ``older_than`` seconds ago (on the store's
        clock), with their journals, events and descendants; return how many runs.

        A top-level run (or one whose parent is gone) is deleted when its status is one of
        ``statuses`` (only :data:`~agency_runtime._types.PRUNABLE_STATUSES` count: completed,
        failed, cancelled), and with it every run below it (child runs, theirs, ...), but
        only when every run of that tree has ended and was last updated before the cutoff.
        So a queued, running, waiting or paused run is never deleted, nor any run above it,
        and a child run is never deleted while its parent stays. Each transaction deletes
        about ``batch`` runs (a tree is never split).
        """
        ...


@runtime_checkable
class RunQueue(Protocol):
    """Queued runs, the workers that claim them, and wake-ups for whoever waits on runs."""

    @property
    def url(self) -> str:
        """The URL this store was opened from (``memory://``, ``sqlite:///…``)."""
        ...

    async def enqueue_run(self, record: RunRecord) -> Claim:
        """Store ``record`` (status ``queued``, its ``queue`` and ``priority``) unless a run
        with its id exists, and wake the workers.

        Returns ``Claim(acquired=False, created=..., record=<the stored run>)``: ``created``
        is ``False`` when the id was taken (the stored run is returned unchanged, so a
        repeated enqueue with the same id is idempotent).
        """
        ...

    async def claim_queued(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[RunRecord]:
        """Claim up to ``limit`` runnable runs of ``queues`` for ``owner``, atomically.

        Runnable: ``queued`` runs, ``waiting`` runs whose ``wake_at`` has come, and
        ``running`` runs whose lease expired (their holder died). Highest ``priority``
        first, then the oldest (``created_at``, then insertion order); run ids in
        ``exclude`` are skipped. Every queue's concurrency limit (:meth:`configure_queue`)
        holds across all claimants: a queue limited to N never has more than N runs
        running under live leases. Each claimed run becomes ``running``
        under ``owner``'s lease with ``attempts + 1`` (``started_at`` set if unset;
        ``wake_at`` and ``waiting_for`` cleared) and is returned as stored. Concurrent
        claimants never get the same run.
        """
        ...

    async def claim_queued_runs(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[ClaimedRun]:
        """:meth:`claim_queued`, each run with whether its journal is known to be empty
        (:attr:`ClaimedRun.empty_journal`): a worker runs such a run without reading its
        journal, one round trip fewer for every run that starts fresh."""
        ...

    async def next_wake(self, queues: Sequence[str], *, after: float | None = None) -> float | None:
        """The earliest time something of ``queues`` falls due: a waiting run's ``wake_at``
        or a schedule's ``next_at``, only those later than ``after`` when given (``None``:
        nothing is due at a known time)."""
        ...

    async def configure_queue(self, name: str, *, concurrency: int | None) -> None:
        """Limit queue ``name`` to ``concurrency`` running runs across all workers
        (``None``: no limit)."""
        ...

    async def queue_concurrency(self, name: str) -> int | None:
        """The limit of queue ``name`` (``None``: no limit)."""
        ...

    async def wait_for_runs(self, timeout: float) -> None:
        """Return when a run may have become runnable or final, or after ``timeout`` s.

        Stores with notifications (PostgreSQL's LISTEN/NOTIFY) return as soon as any process
        queues, answers for a worker, hands back or finishes a run; others return when this
        process did, or when ``timeout`` passes (the caller polls). Spurious returns are
        allowed: callers look at the store again.
        """
        ...


@runtime_checkable
class EventLog(Protocol):
    """Events sent to runs (``agency.runs.send``), buffered until a wait takes each one."""

    @property
    def url(self) -> str:
        """The URL this store was opened from (``memory://``, ``sqlite:///…``)."""
        ...

    async def send_event(self, run_id: str, name: str, payload: str) -> RunEvent:
        """Buffer event ``name`` (``payload``: JSON text) for run ``run_id``, in one
        transaction; return it as stored.

        When the run is ``waiting`` for ``name``, its ``wake_at`` becomes now, so a worker
        continues it at once (and the workers are woken). Raises
        :class:`~agency_runtime.RunNotFoundError` for an unknown run and
        :class:`~agency_runtime.RunFinishedError` for a completed or cancelled one.
        """
        ...

    async def take_event(self, run_id: str, name: str, taker: str) -> RunEvent | None:
        """The event ``taker`` (a wait's journal path) took already, else the oldest event
        ``name`` of the run nobody took, now taken by ``taker``; ``None`` when there is none.

        Idempotent per ``taker``: a wait that runs again after a crash gets the same event,
        so each event is consumed by exactly one wait.
        """
        ...


@runtime_checkable
class ScheduleTable(Protocol):
    """Schedules: entries started at cron or interval occurrences, each exactly once."""

    @property
    def url(self) -> str:
        """The URL this store was opened from (``memory://``, ``sqlite:///…``)."""
        ...

    async def put_schedule(self, schedule: Schedule) -> None:
        """Store ``schedule``, replacing one of the same name, and wake the workers."""
        ...

    async def get_schedule(self, name: str) -> Schedule | None:
        """The schedule called ``name``, or ``None``."""
        ...

    async def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        ...

    async def remove_schedule(self, name: str) -> bool:
        """Delete the schedule called ``name``; ``False`` when there was none."""
        ...

    async def due_schedules(self, queues: Sequence[str], now: float) -> list[Schedule]:
        """The schedules of ``queues`` whose ``next_at`` is ``now`` or earlier."""
        ...

    async def fire_schedule(self, name: str, *, due: float, next_at: float, run: RunRecord) -> bool:
        """Start one occurrence of schedule ``name``, in one transaction.

        Only while the schedule's ``next_at`` is still ``due`` (another worker did not fire
        it first): ``next_at`` becomes the given one and ``run`` is queued unless a run with
        its id exists (as :meth:`RunQueue.enqueue_run`). Returns whether this call fired.
        """
        ...


@runtime_checkable
class LockTable(Protocol):
    """Store-wide FIFO locks (``agency.lock(name, scope="global")``): leased tickets."""

    @property
    def url(self) -> str:
        """The URL this store was opened from (``memory://``, ``sqlite:///…``)."""
        ...

    async def enqueue_lock(self, name: str, owner: str, lease_seconds: float) -> int:
        """Append a waiter for the global lock ``name``; return its ticket.

        Tickets only ever grow (across all names), so ticket order is arrival order. The
        ticket is leased for ``lease_seconds``; a ticket whose lease expires is dropped.
        """
        ...

    async def lock_holder(self, name: str) -> tuple[int, str] | None:
        """The lowest live ticket of lock ``name`` and its owner (``None``: nobody queues)."""
        ...

    async def lock_turn(self, name: str, ticket: int, owner: str, lease_seconds: float) -> bool:
        """Renew ``ticket``'s lease, drop expired tickets of ``name``, and say whether
        ``ticket`` is now the lowest live one (it holds the lock).

        ``False`` while earlier tickets wait or hold, and for a ticket that no longer
        exists (released, or dropped after its lease expired) or belongs to another owner.
        """
        ...

    async def release_lock(self, name: str, ticket: int) -> None:
        """Remove ``ticket`` from the queue of ``name`` (idempotent)."""
        ...


@runtime_checkable
class MemoryIndex(Protocol):
    """Conversation-memory items: tagged, expiring, keyword-ranked."""

    @property
    def url(self) -> str:
        """The URL this store was opened from (``memory://``, ``sqlite:///…``)."""
        ...

    async def save_memory(self, record: MemoryRecord) -> bool:
        """Store one memory item; ``False`` (and nothing written) when its id is stored already.

        Saves are idempotent by id: a step that saves under an id derived from the run and the
        step's path can run again after a crash without saving twice.
        """
        ...

    async def recall_memory(
        self,
        *,
        namespace: str,
        query: str,
        tags: list[str],
        scope: str | None,
        limit: int,
        now: float,
    ) -> list[MemoryRecord]:
        """Up to ``limit`` live items of ``namespace`` carrying every tag (and ``scope``).

        The best keyword matches of ``query`` (full-text rank) when any item matches, else
        the most recent items; returned newest first. Items expired at ``now`` never return.
        """
        ...

    async def expire_memory(self, namespace: str, ids: list[str], *, at: float) -> int:
        """Make the given items of ``namespace`` expire at ``at`` (soft delete); return how many."""
        ...

    async def purge_memory(self, *, now: float) -> int:
        """Delete every item expired at ``now``; return how many."""
        ...


@runtime_checkable
class DocumentStore(Protocol):
    """JSON documents by namespace and key (agent memory graphs, poller offsets, …)."""

    @property
    def url(self) -> str:
        """The URL this store was opened from (``memory://``, ``sqlite:///…``)."""
        ...

    async def get_document(self, namespace: str, key: str) -> str | None:
        """A stored JSON document (agent memory graphs, summaries, …), or ``None``."""
        ...

    async def put_document(self, namespace: str, key: str, body: str) -> None:
        """Store (or replace) a JSON document."""
        ...


class AgentMemoryStore(DocumentStore, MemoryIndex, Protocol):
    """What agent memory uses: its graph as documents, its observations in the index."""


@runtime_checkable
class Store(
    RunLog, RunQueue, EventLog, ScheduleTable, LockTable, MemoryIndex, DocumentStore, Protocol
):
    """Durable storage of runs: all seven protocols. Implementations: MemoryStore,
    SqliteStore, PostgresStore."""

    def close(self) -> None:
        """Release the store's resources (idempotent)."""
        ...
