"""Workers: processes that claim queued runs from a store and run them.

A :class:`Worker` claims runnable runs of its queues — queued ones, runs answered with
``enqueue=True``, runs handed back by a draining worker, and running runs whose holder's
lease expired or, on PostgreSQL, whose holder's liveness session is gone (it died: taken
at the next poll, not after the lease) — atomically, so no two workers get the same run,
and runs each under a lease it renews. Any worker recovers any dead worker's runs: there
are no executor ids and no version scoping; a worker that cannot run an entry (not
declared or not importable here) hands the run back for one that can.

``drain()`` stops claiming, asks every running run to stop after its next step commit, and
hands those runs back to their queue (their leases released), so another worker continues
them at once from their journals.

Time: a run's wait (``agency.sleep``, ``agency.wait_for_event``) longer than ``park_after``
parks it (``waiting``), freeing its slot; workers claim it again when it falls due. Workers
also fire the schedules of their queues (``agency.schedules``). Between claims a worker
sleeps until the next wake-up or schedule the store knows of, a notification, or ``poll``.

Retention: a worker given ``prune_after`` deletes the runs that ended longer ago than that
(``agency.runs.prune``) when it starts and every ``prune_every`` seconds after, in the
background; a prune that fails is logged and tried again at the next one.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Sequence
from datetime import timedelta

import anyio
from pydantic import ValidationError

from .._bounds import check_duration, check_seconds, check_whole
from .._durable._leases import owner_id
from .._durable._values import decode_arguments
from .._errors import AgencyError, InvalidArgumentError, StoreError
from .._store import ClaimedRun, RunRecord, Store
from ._handback import HandBack
from ._queue import check_queue
from ._run import LEASE_SECONDS, execute, warn_lease_lost
from ._runtime import RUNTIME
from ._schedules import fire_due

__all__ = ["Worker"]

logger = logging.getLogger("agency_runtime.worker")


PARK_AFTER_SECONDS = 30.0
"""A worker's run whose wait is longer than this parks (frees its slot) by default."""


MAX_CONCURRENCY = 10_000
"""The most runs one worker runs at once."""


PRUNE_EVERY_SECONDS = 3600.0
"""How often a worker given ``prune_after`` prunes (after the prune it makes at start)."""


class Worker:
    """Claims queued runs of ``queues`` from ``store`` and runs up to ``concurrency`` at once.

    ``lease`` is how long a claim lasts without renewal (renewed every third of it): a worker
    that dies leaves its runs to others after at most that long (on PostgreSQL at their next
    poll: its process's liveness session goes with its connections). ``poll`` is how often it
    looks for work when no wake-up comes (PostgreSQL's NOTIFY wakes it at once; SQLite
    workers of other processes are seen by polling). A run waiting longer than
    ``park_after`` seconds (``agency.sleep``, ``agency.wait_for_event``) parks and frees its
    slot. With ``prune_after`` (seconds, a ``timedelta`` or a string such as ``"30d"``), it
    deletes the runs that ended longer ago than that (``agency.runs.prune``) at start and
    every ``prune_every`` seconds (default an hour), in the background. Serve with
    ``await worker.run()`` (until cancelled or drained); stop gracefully with
    ``await worker.drain()``.
    """

    def __init__(
        self,
        store: str | Store | None = None,
        *,
        queues: Sequence[str] = ("default",),
        concurrency: int = 8,
        lease: float = LEASE_SECONDS,
        poll: float = 1.0,
        park_after: float = PARK_AFTER_SECONDS,
        prune_after: float | timedelta | str | None = None,
        prune_every: float = PRUNE_EVERY_SECONDS,
    ) -> None:
        if isinstance(queues, str):
            queues = (queues,)
        self.queues: tuple[str, ...] = tuple(check_queue(q) for q in queues)
        if not self.queues:
            raise InvalidArgumentError("Worker: queues must name at least one queue")
        self.concurrency = check_whole(concurrency, "Worker: concurrency", 1, MAX_CONCURRENCY)
        self.lease = check_seconds(lease, "Worker: lease", positive=True)
        self.poll = check_seconds(poll, "Worker: poll", positive=True)
        self.park_after = check_seconds(park_after, "Worker: park_after")
        self.prune_after = (
            None if prune_after is None else check_duration(prune_after, "Worker: prune_after")
        )
        """Runs that ended longer ago than this many seconds are pruned (``None``: never)."""
        self.prune_every = check_seconds(prune_every, "Worker: prune_every", positive=True)
        self._store_arg = store
        self.owner = owner_id(f"worker-{uuid.uuid4().hex[:12]}")
        """The lease owner of every run this worker holds."""
        self._running: dict[str, HandBack] = {}
        self._cannot: set[str] = set()
        self._draining = False
        self._serving: anyio.Event | None = None
        self._group: anyio.CancelScope | None = None
        self._waiting: anyio.CancelScope | None = None
        self._renewing: anyio.CancelScope | None = None
        self._woken = False  # _wake() was called since the serving loop last looked
        self._due: float | None = None
        self._due_read = -math.inf  # when _due was read (anyio.current_time())
        self._looked = -math.inf
        self._fire_now = True  # at start (occurrences missed while no worker ran), after errors
        self.runs_finished = 0
        """How many runs this worker took to an outcome (completed, failed, paused, …)."""
        self.runs_pruned = 0
        """How many runs this worker's prunes deleted."""

    @property
    def serving(self) -> bool:
        """Whether :meth:`run` is serving now."""
        return self._serving is not None and not self._serving.is_set()

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` was called: no new runs are claimed."""
        return self._draining

    @property
    def running(self) -> frozenset[str]:
        """The ids of the runs this worker runs now."""
        return frozenset(self._running)

    async def run(self) -> None:
        """Serve until cancelled, or until :meth:`drain` finishes.

        A store that fails (a database restarting, a dropped connection) is retried every
        ``poll`` seconds, with a warning: the worker goes on once the store is back.
        """
        if self._serving is not None:
            raise InvalidArgumentError("Worker.run() is running already; one call per worker")
        store = RUNTIME.stores.resolve(self._store_arg)
        self._serving = anyio.Event()
        pruning = anyio.CancelScope()
        self._renewing = renewing = anyio.CancelScope()
        try:
            async with anyio.create_task_group() as group:
                self._group = group.cancel_scope
                group.start_soon(self._renew, store, renewing)
                if self.prune_after is not None:
                    group.start_soon(self._prune, store, self.prune_after, pruning)
                while not self._draining:
                    self._woken = False  # a slot that frees from now on is seen by _wait
                    await self._fire_schedules(store)
                    free = self.concurrency - len(self._running)
                    self._looked = RUNTIME.clock.time()
                    claimed = await self._claim(store, free) if free > 0 else []
                    for record, empty in claimed:
                        self._running[record.run_id] = HandBack(self.park_after)
                        group.start_soon(self._serve, store, record, empty, name=record.run_id)
                    if claimed and len(claimed) == free:
                        continue  # maybe more work; with no slot free the loop waits below
                    await self._wait(store, full=free == 0)
                pruning.cancel()
                for handback in self._running.values():  # draining
                    handback.request()
                if not self._running:
                    renewing.cancel()  # else when the last run ends (_serve)
        finally:
            self._group = None
            self._serving.set()

    async def _claim(self, store: Store, free: int) -> list[ClaimedRun]:
        try:
            return await store.claim_queued_runs(
                queues=self.queues,
                owner=self.owner,
                lease_seconds=self.lease,
                limit=free,
                # Never its own running runs: they may look free when its liveness session
                # was cut (a server restart) before the listener took it again.
                exclude=sorted(self._cannot | self._running.keys()),
            )
        except StoreError as exc:
            logger.warning("worker %s: cannot claim runs (%s); retrying", self.owner, exc)
            return []

    async def _renew(self, store: Store, scope: anyio.CancelScope) -> None:
        """Renew the lease of every run this worker holds, every third of ``lease`` (on the
        runtime's clock), until ``scope`` is cancelled (drained, its last run ended).

        One loop for all of them instead of a task per run: a run claimed between two
        rounds is renewed at the next, within a third of its lease, as its own task would.
        A run whose lease was taken is logged once and renewed no more (its next commit
        fails the lease check and stops it); a store that fails is logged and retried at the
        next round (meanwhile the leases run on).
        """
        lost: set[str] = set()
        clock, period = RUNTIME.clock, self.lease / 3
        with scope:
            began = clock.time()
            while True:
                # A round every period from the start of the last, not a period after its
                # end: renewing many runs one after another must not stretch the interval.
                await clock.sleep(max(0.0, began + period - clock.time()))
                began = clock.time()
                lost &= self._running.keys()
                for run_id in [r for r in self._running if r not in lost]:
                    try:
                        renewed = await store.renew_lease(
                            run_id, owner=self.owner, lease_seconds=self.lease
                        )
                    except StoreError as exc:
                        logger.warning(
                            "worker %s: cannot renew the lease of run %r (%s); retrying",
                            self.owner,
                            run_id,
                            exc,
                        )
                        continue
                    if not renewed and run_id in self._running:
                        lost.add(run_id)
                        await self._lost(store, run_id)

    async def _lost(self, store: Store, run_id: str) -> None:
        """Say that run ``run_id``'s lease was not renewed because another process holds
        it now (not when the run just stored its own outcome, or was cancelled)."""
        try:
            current = await store.get_run(run_id)
        except StoreError:
            return
        if current is not None and current.lease_owner not in (None, self.owner):
            warn_lease_lost(run_id)

    async def _fire_schedules(self, store: Store) -> None:
        """Start the schedules of this worker's queues that fell due (once each)."""
        now = RUNTIME.clock.time()
        if not self._fire_now and (self._due is None or self._due > now):
            return
        try:
            await fire_due(store, self.queues, now)
            self._fire_now = False
        except (StoreError, AgencyError, ValueError) as exc:
            self._fire_now = True
            logger.warning("worker %s: cannot fire schedules (%s); retrying", self.owner, exc)

    async def _prune(self, store: Store, older_than: float, scope: anyio.CancelScope) -> None:
        """Prune now and every ``prune_every`` seconds (on the runtime's clock) until
        ``scope`` is cancelled (draining); a failed prune is logged, never fatal."""
        with scope:
            while True:
                try:
                    deleted = await store.prune_runs(older_than=older_than)
                except StoreError as exc:
                    logger.warning(
                        "worker %s: cannot prune runs (%s); trying again in %gs",
                        self.owner,
                        exc,
                        self.prune_every,
                    )
                except Exception:  # a worker serves on whatever its housekeeping meets
                    logger.exception("worker %s: pruning runs failed", self.owner)
                else:
                    self.runs_pruned += deleted
                    if deleted:
                        logger.info(
                            "worker %s: pruned %d run(s) that ended over %gs ago",
                            self.owner,
                            deleted,
                            older_than,
                        )
                await RUNTIME.clock.sleep(self.prune_every)

    async def _wait(self, store: Store, *, full: bool) -> None:
        """Wait for a wake-up: the store's (a run queued, answered, finished), the next time
        a parked run or a schedule falls due (on the runtime's clock), or ``poll``.

        ``full`` (no slot free): only a slot freeing (:meth:`_wake`), the next due time or
        ``poll`` end the wait. The store's wake-ups are not waited for then (every run that
        ends in any process rings them, and nothing can be claimed without a slot), and the
        due time read less than ``poll`` ago is used again while it is still ahead.
        """
        clock = RUNTIME.clock
        now = anyio.current_time()
        if not (
            full
            and now - self._due_read < self.poll
            and (self._due is None or self._due > clock.time())
        ):
            try:
                # Only what falls due after the last look: a due run that could not be
                # claimed then (no slot, a queue limit) waits for a wake-up, and never hides
                # a later one.
                self._due = await store.next_wake(self.queues, after=self._looked)
                self._due_read = now
            except StoreError:
                self._due, self._due_read, self._fire_now = None, -math.inf, True
        if self._woken:
            return  # a slot freed (or draining began) since the loop looked: look again
        wake = anyio.sleep(self.poll) if full else store.wait_for_runs(self.poll)
        with anyio.CancelScope() as self._waiting:
            if self._due is None or not math.isfinite(self._due):
                await wake  # no task group: nothing to race
            else:
                left = self._due - clock.time()  # past: the clock only yields
                async with anyio.create_task_group() as race:

                    async def timer() -> None:
                        await clock.sleep(left)
                        race.cancel_scope.cancel()

                    race.start_soon(timer)
                    await wake
                    race.cancel_scope.cancel()
        self._waiting = None

    def _wake(self) -> None:
        """Let the serving loop look again now (a slot freed, or draining began), also when
        it is not waiting yet (it looks before it waits)."""
        self._woken = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def _serve(self, store: Store, record: RunRecord, empty_journal: bool) -> None:
        handback = self._running[record.run_id]
        try:
            try:
                entry = RUNTIME.entries.find(record.run_id, record.entry)
                args, kwargs = decode_arguments(entry, record.arguments)
            except (AgencyError, ValidationError) as exc:
                await self._hand_back(store, record, exc)
                return
            if self._draining:
                handback.request()
            await execute(
                store,
                record,
                self.owner,
                entry,
                args,
                kwargs,
                lease_seconds=self.lease,
                handback=handback,
                empty_journal=empty_journal,
                renews=False,  # _renew renews it
            )
            self.runs_finished += 1
        except Exception:  # execute() turns failures into results; this is a store failure
            logger.exception("worker %s: run %r could not be run", self.owner, record.run_id)
        finally:
            del self._running[record.run_id]
            if self._draining and not self._running and self._renewing is not None:
                self._renewing.cancel()  # the last run ended: nothing to renew any more
            self._wake()

    async def _hand_back(self, store: Store, record: RunRecord, why: BaseException) -> None:
        """Give a run this worker cannot run back to its queue, and skip it from now on."""
        logger.warning(
            "worker %s: cannot run %r here (%s); handing it back for another worker. "
            "Start workers with the application's modules (`agency worker --import MODULE`) "
            "and declare entries with @agency.entry",
            self.owner,
            record.run_id,
            why,
        )
        self._cannot.add(record.run_id)
        back = record.model_copy(update={"status": "queued", "finished_at": None})
        with anyio.CancelScope(shield=True):
            await store.finish_run(back, owner=self.owner)

    async def drain(self, timeout: float | None = None) -> None:
        """Stop taking work and hand every running run back to its queue.

        Each running run stops after its next step commit and goes back to its queue with
        its lease released, so another worker continues it at once from its journal.
        Returns when :meth:`run` has returned. With ``timeout``, runs still going after that
        many seconds are interrupted: they go back to their queue as well (their in-flight
        steps run again elsewhere).
        """
        self._draining = True
        for handback in self._running.values():
            handback.request()
        self._wake()
        serving = self._serving
        if serving is None:
            return
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            await serving.wait()
            return
        if self._group is not None:
            self._group.cancel()
        await serving.wait()
