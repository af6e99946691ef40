"""An in-process store for tests and throwaway runs (``memory://`` or ``memory://NAME``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import ClassVar

from .._clock import SYSTEM_CLOCK, Clock
from .._errors import RunFinishedError, RunNotFoundError
from .._types import (
    Checkpoint,
    Claim,
    InterruptAnswer,
    InterruptResponse,
    Journal,
    JournalEntry,
    MemoryRecord,
    RunEvent,
    RunRecord,
    RunStatus,
    Schedule,
)
from ._rules import (
    DEFAULT_QUEUE,
    Corpus,
    claim_decision,
    pick_claims,
    query_terms,
    queued_record,
)
from ._wakeups import Wakeups

__all__ = ["MemoryStore"]


class MemoryStore:
    """Runs kept in a dict. Nothing survives the process.

    ``MemoryStore.named(name)`` returns one shared store per name and process, which is what
    the ``memory://NAME`` URL opens; ``MemoryStore()`` is a private, anonymous one.
    """

    _named: ClassVar[dict[str, MemoryStore]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str | None = None, *, clock: Clock | None = None) -> None:
        self._name = name
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._runs: dict[str, RunRecord] = {}
        self._steps: dict[str, dict[str, JournalEntry]] = {}
        self._answers: dict[str, dict[str, InterruptAnswer]] = {}
        self._checkpoints: dict[str, dict[str, Checkpoint]] = {}
        self._queues: dict[str, int | None] = {}
        self._events: list[RunEvent] = []
        self._schedules: dict[str, Schedule] = {}
        self._lock = threading.Lock()
        self._wakeups = Wakeups()

    @classmethod
    def named(cls, name: str = "", *, clock: Clock | None = None) -> MemoryStore:
        """The process-wide store called ``name`` (created on first use, with ``clock``)."""
        with cls._named_lock:
            store = cls._named.get(name)
            if store is None:
                store = cls._named[name] = cls(name, clock=clock)
            return store

    @property
    def url(self) -> str:
        """``memory://NAME`` for a named store, ``memory://`` plus an address otherwise."""
        if self._name is None:
            return f"memory://<anonymous {id(self):#x}>"
        return f"memory://{self._name}"

    async def claim_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        lease_seconds: float,
        steal_from: str | None = None,
    ) -> Claim:
        now = self._clock.time()
        lease = {"lease_owner": owner, "lease_expires_at": now + lease_seconds}
        with self._lock:
            existing = self._runs.get(record.run_id)
            decision = claim_decision(existing, now, steal_from)
            if decision == "refuse":
                assert existing is not None
                return Claim(acquired=False, created=False, record=existing.model_copy(deep=True))
            if decision == "insert":
                stored = record.model_copy(
                    update={
                        **lease,
                        "status": "running",
                        "attempts": 1,
                        "version": 1,
                        "started_at": now,
                        "updated_at": now,
                    },
                    deep=True,
                )
            else:
                assert existing is not None
                stored = existing.model_copy(
                    update={
                        **lease,
                        "status": "running",
                        "attempts": existing.attempts + 1,
                        "version": existing.version + 1,
                        "started_at": now,
                        "updated_at": now,
                        "wake_at": None,
                        "waiting_for": [],
                    },
                    deep=True,
                )
            self._runs[record.run_id] = stored
            return Claim(
                acquired=True, created=decision == "insert", record=stored.model_copy(deep=True)
            )

    async def renew_lease(self, run_id: str, *, owner: str, lease_seconds: float) -> bool:
        with self._lock:
            stored = self._runs.get(run_id)
            if stored is None or stored.lease_owner != owner or stored.status != "running":
                return False
            stored.lease_expires_at = self._clock.time() + lease_seconds
            return True

    async def finish_run(
        self,
        record: RunRecord,
        *,
        owner: str,
        unjournaled: tuple[int, int] = (0, 0),
        forget: Sequence[str] = (),
    ) -> bool:
        with self._lock:
            stored = self._runs.get(record.run_id)
            if stored is None or stored.lease_owner != owner or stored.status != "running":
                return False
            pico, tokens = self._drop_steps(record.run_id, lambda e: e.path in forget)
            now = self._clock.time()
            wake_at = record.wake_at
            if record.waiting_for and any(
                e.run_id == record.run_id and e.taken_by is None and e.name in record.waiting_for
                for e in self._events
            ):
                wake_at = now  # an event it waits for came while it parked
            self._runs[record.run_id] = record.model_copy(
                update={
                    "wake_at": wake_at,
                    "lease_owner": None,
                    "lease_expires_at": None,
                    "version": stored.version + 1,
                    "updated_at": self._clock.time(),
                    "overrides": stored.overrides,
                    "unjournaled_pico": stored.unjournaled_pico + unjournaled[0] + pico,
                    "unjournaled_tokens": stored.unjournaled_tokens + unjournaled[1] + tokens,
                },
                deep=True,
            )
        self._wakeups.ring()
        return True

    def _drop_steps(self, run_id: str, doomed: Callable[[JournalEntry], bool]) -> tuple[int, int]:
        """Delete the run's steps ``doomed`` picks; return the spend they held."""
        steps = self._steps.get(run_id, {})
        dropped = [key for key, entry in steps.items() if doomed(entry)]
        pico = sum(steps[key].cost_pico for key in dropped)
        tokens = sum(steps[key].tokens for key in dropped)
        for key in dropped:
            del steps[key]
        return pico, tokens

    async def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            stored = self._runs.get(run_id)
            return None if stored is None else stored.model_copy(deep=True)

    async def list_runs(
        self, *, status: RunStatus | None = None, limit: int = 100, offset: int = 0
    ) -> list[RunRecord]:
        with self._lock:
            # Newest first; runs created at the same instant: the later-inserted one first
            # (a dict keeps insertion order, as SQLite's rowid does).
            ordered = [
                (r.created_at, index, r)
                for index, r in enumerate(self._runs.values())
                if status is None or r.status == status
            ]
        ordered.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [r.model_copy(deep=True) for _, _, r in ordered[offset : offset + limit]]

    def _holds(self, run_id: str, owner: str) -> bool:
        stored = self._runs.get(run_id)
        return stored is not None and stored.lease_owner == owner and stored.status == "running"

    async def load_journal(self, run_id: str) -> Journal:
        with self._lock:
            return Journal(
                entries=sorted(self._steps.get(run_id, {}).values(), key=lambda e: e.seq),
                answers=sorted(self._answers.get(run_id, {}).values(), key=lambda a: a.seq),
                checkpoints=sorted(self._checkpoints.get(run_id, {}).values(), key=lambda c: c.seq),
            ).model_copy(deep=True)

    async def commit_step(self, entry: JournalEntry, *, owner: str) -> bool:
        with self._lock:
            if not self._holds(entry.run_id, owner):
                return False
            self._steps.setdefault(entry.run_id, {})[entry.path] = entry.model_copy()
            return True

    async def record_interrupts(self, answers: list[InterruptAnswer], *, owner: str) -> bool:
        with self._lock:
            if any(not self._holds(a.run_id, owner) for a in answers):
                return False
            for answer in answers:
                table = self._answers.setdefault(answer.run_id, {})
                table[answer.interrupt.interrupt_id] = answer.model_copy(deep=True)
            return True

    async def answer_interrupts(
        self, run_id: str, responses: dict[str, InterruptResponse], *, enqueue: bool = False
    ) -> list[str]:
        with self._lock:
            table = self._answers.get(run_id, {})
            refused = [
                key for key in responses if key not in table or table[key].response is not None
            ]
            if refused:
                return refused
            now = self._clock.time()
            for key, response in responses.items():
                table[key] = table[key].model_copy(
                    update={"response": response, "answered_at": now}
                )
            stored = self._runs.get(run_id)
            if stored is not None:
                stored.version += 1
                if enqueue and stored.status == "paused":
                    stored.status, stored.queue = "queued", stored.queue or DEFAULT_QUEUE
        if enqueue:
            self._wakeups.ring()
        return []

    async def save_checkpoint(self, checkpoint: Checkpoint, *, owner: str) -> bool:
        run_id = checkpoint.run_id or ""
        with self._lock:
            if not self._holds(run_id, owner):
                return False
            table = self._checkpoints.setdefault(run_id, {})
            table[checkpoint.checkpoint_id] = checkpoint.model_copy(deep=True)
            return True

    async def rewind(
        self,
        run_id: str,
        seq: int,
        *,
        owner: str,
        overrides: str | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> bool:
        with self._lock:
            if not self._holds(run_id, owner):
                return False
            run = self._runs[run_id]
            if overrides is not None:
                run.overrides = overrides
            pico, tokens = self._drop_steps(run_id, lambda e: e.seq > seq)
            run.unjournaled_pico += pico
            run.unjournaled_tokens += tokens
            for table in (self._answers, self._checkpoints):
                events = table.get(run_id, {})
                for key in [k for k, v in events.items() if v.seq > seq]:
                    del events[key]
            if checkpoint is not None:
                kept = self._checkpoints.setdefault(run_id, {})
                kept[checkpoint.checkpoint_id] = checkpoint.model_copy(deep=True)
            return True

    async def cancel_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            stored = self._runs.get(run_id)
            if stored is None:
                return None
            if not stored.is_final:
                stored = self._runs[run_id] = stored.model_copy(
                    update={
                        "status": "cancelled",
                        "lease_owner": None,
                        "lease_expires_at": None,
                        "version": stored.version + 1,
                        "finished_at": self._clock.time(),
                        "updated_at": self._clock.time(),
                    }
                )
            cancelled = stored.model_copy(deep=True)
        self._wakeups.ring()
        return cancelled

    async def fork_run(self, run_id: str, new_run_id: str, upto_seq: int) -> RunRecord:
        with self._lock:
            source = self._runs.get(run_id)
            if source is None:
                raise RunNotFoundError(run_id, self.url)
            kept = [e for e in self._steps.get(run_id, {}).values() if e.seq <= upto_seq]
            forked = source.fork_as(
                new_run_id,
                cost_pico=sum(e.cost_pico for e in kept),
                tokens=sum(e.tokens for e in kept),
            )
            self._runs[new_run_id] = forked
            # Answers are not copied: interrupt ids derive from the run id, so the fork asks
            # its own questions again.
            for table in (self._steps, self._checkpoints):
                copied = {
                    key: event.model_copy(update={"run_id": new_run_id}, deep=True)
                    for key, event in table.get(run_id, {}).items()
                    if event.seq <= upto_seq
                }
                table[new_run_id] = copied  # type: ignore[assignment]
            return forked.model_copy(deep=True)

    # -- queues ------------------------------------------------------------------------------

    async def enqueue_run(self, record: RunRecord) -> Claim:
        with self._lock:
            existing = self._runs.get(record.run_id)
            if existing is not None:
                return Claim(acquired=False, created=False, record=existing.model_copy(deep=True))
            stored = queued_record(record, self._clock.time())
            self._runs[record.run_id] = stored.model_copy(deep=True)
        self._wakeups.ring()
        return Claim(acquired=False, created=True, record=stored)

    async def claim_queued(
        self,
        *,
        queues: Sequence[str],
        owner: str,
        lease_seconds: float,
        limit: int,
        exclude: Sequence[str] = (),
    ) -> list[RunRecord]:
        if limit <= 0 or not queues:
            return []
        now = self._clock.time()
        with self._lock:
            room = {q: n for q in queues if (n := self._queues.get(q)) is not None}
            runnable: list[tuple[int, RunRecord]] = []
            for position, run in enumerate(self._runs.values()):  # dicts keep insertion order
                if run.queue not in queues:
                    continue
                if run.status == "running" and run.lease_alive(now):
                    if run.queue in room:
                        room[run.queue] -= 1
                elif run.run_id not in exclude and (
                    run.status in ("queued", "running")
                    or (run.status == "waiting" and run.wake_at is not None and run.wake_at <= now)
                ):
                    runnable.append((position, run))
            runnable.sort(key=lambda pair: (-pair[1].priority, pair[1].created_at, pair[0]))
            claimed: list[RunRecord] = []
            for run_id in pick_claims(((r.run_id, r.queue) for _, r in runnable), room, limit):
                run = self._runs[run_id]
                run.status, run.attempts, run.version = "running", run.attempts + 1, run.version + 1
                run.started_at = run.started_at if run.started_at is not None else now
                run.updated_at, run.lease_owner = now, owner
                run.lease_expires_at = now + lease_seconds
                run.wake_at, run.waiting_for = None, []
                claimed.append(run.model_copy(deep=True))
            return claimed

    async def next_wake(self, queues: Sequence[str], *, after: float | None = None) -> float | None:
        with self._lock:
            times = [
                run.wake_at
                for run in self._runs.values()
                if run.status == "waiting" and run.queue in queues and run.wake_at is not None
            ]
            times.extend(s.next_at for s in self._schedules.values() if s.queue in queues)
        later = [t for t in times if after is None or t > after]
        return min(later) if later else None

    # -- events -------------------------------------------------------------------------------

    async def send_event(self, run_id: str, name: str, payload: str) -> RunEvent:
        now = self._clock.time()
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                raise RunNotFoundError(run_id, self.url)
            if run.is_final:
                raise RunFinishedError(run_id, run.status, name)
            event = RunEvent(
                event_id=len(self._events) + 1,
                run_id=run_id,
                name=name,
                payload=payload,
                sent_at=now,
            )
            self._events.append(event)
            if run.status == "waiting" and name in run.waiting_for:
                run.wake_at, run.updated_at = now, now
        self._wakeups.ring()
        return event.model_copy()

    async def take_event(self, run_id: str, name: str, taker: str) -> RunEvent | None:
        with self._lock:
            for event in self._events:
                if event.run_id == run_id and event.name == name and event.taken_by == taker:
                    return event.model_copy()
            for event in self._events:
                if event.run_id == run_id and event.name == name and event.taken_by is None:
                    event.taken_by = taker
                    return event.model_copy()
        return None

    # -- schedules ----------------------------------------------------------------------------

    async def put_schedule(self, schedule: Schedule) -> None:
        with self._lock:
            self._schedules[schedule.name] = schedule.model_copy()
        self._wakeups.ring()

    async def get_schedule(self, name: str) -> Schedule | None:
        with self._lock:
            found = self._schedules.get(name)
        return None if found is None else found.model_copy()

    async def list_schedules(self) -> list[Schedule]:
        with self._lock:
            return [self._schedules[name].model_copy() for name in sorted(self._schedules)]

    async def remove_schedule(self, name: str) -> bool:
        with self._lock:
            return self._schedules.pop(name, None) is not None

    async def due_schedules(self, queues: Sequence[str], now: float) -> list[Schedule]:
        with self._lock:
            due = [s for s in self._schedules.values() if s.queue in queues and s.next_at <= now]
        return [s.model_copy() for s in sorted(due, key=lambda s: (s.next_at, s.name))]

    async def fire_schedule(self, name: str, *, due: float, next_at: float, run: RunRecord) -> bool:
        now = self._clock.time()
        with self._lock:
            schedule = self._schedules.get(name)
            if schedule is None or schedule.next_at != due:
                return False
            schedule.next_at, schedule.updated_at = next_at, now
            if run.run_id not in self._runs:
                self._runs[run.run_id] = queued_record(run, now).model_copy(deep=True)
        self._wakeups.ring()
        return True

    async def configure_queue(self, name: str, *, concurrency: int | None) -> None:
        with self._lock:
            self._queues[name] = concurrency
        self._wakeups.ring()

    async def queue_concurrency(self, name: str) -> int | None:
        with self._lock:
            return self._queues.get(name)

    async def wait_for_runs(self, timeout: float) -> None:
        await self._wakeups.wait(timeout)

    # -- memory ------------------------------------------------------------------------------

    _memories: dict[str, MemoryRecord] | None = None
    _corpus: Corpus | None = None
    _documents: dict[tuple[str, str], str] | None = None

    async def save_memory(self, record: MemoryRecord) -> bool:
        with self._lock:
            if self._memories is None or self._corpus is None:
                self._memories, self._corpus = {}, Corpus()
            if record.id in self._memories:
                return False  # saved before under this id: an idempotent repeat
            self._memories[record.id] = record.model_copy(deep=True)
            self._corpus.add(record.id, record.content)
            return True

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
        terms = query_terms(query)
        with self._lock:
            items = [
                item
                for item in (self._memories or {}).values()
                if item.namespace == namespace
                and (item.expires_at is None or item.expires_at > now)
                and (scope is None or item.scope == scope)
                and all(tag in item.tags for tag in tags)
            ]
            matched: list[tuple[float, MemoryRecord]] = []
            if terms and self._corpus is not None:
                corpus = self._corpus
                candidates = [item for item in items if corpus.matches(item.id, terms)]
                scores = corpus.scores(terms, [item.id for item in candidates])
                matched = list(zip(scores, candidates, strict=True))
        # Items are kept in save order, so the position breaks ties: the later save is newer.
        order = {id(item): position for position, item in enumerate(items)}

        def newest(item: MemoryRecord) -> tuple[float, int]:
            return (item.created_at, order[id(item)])

        if matched:  # the best bm25 first (lower is better), then the newest: as SQLite orders
            matched.sort(key=lambda pair: (pair[0], [-x for x in newest(pair[1])]))
            chosen = [item for _, item in matched[:limit]]
        else:
            chosen = sorted(items, key=newest, reverse=True)[:limit]
        chosen.sort(key=newest, reverse=True)
        return [item.model_copy(deep=True) for item in chosen]

    async def expire_memory(self, namespace: str, ids: list[str], *, at: float) -> int:
        with self._lock:
            memories = self._memories or {}
            hits = [
                memories[i] for i in ids if i in memories and memories[i].namespace == namespace
            ]
            for item in hits:
                item.expires_at = at
            return len(hits)

    async def purge_memory(self, *, now: float) -> int:
        with self._lock:
            memories = self._memories or {}
            expired = [
                k for k, v in memories.items() if v.expires_at is not None and v.expires_at <= now
            ]
            for key in expired:
                del memories[key]
                if self._corpus is not None:
                    self._corpus.remove(key)
            return len(expired)

    async def get_document(self, namespace: str, key: str) -> str | None:
        with self._lock:
            return (self._documents or {}).get((namespace, key))

    async def put_document(self, namespace: str, key: str, body: str) -> None:
        with self._lock:
            if self._documents is None:
                self._documents = {}
            self._documents[(namespace, key)] = body

    def close(self) -> None:
        """Nothing to release: a memory store lives as long as the process."""

    def __repr__(self) -> str:
        return f"<MemoryStore {self.url} runs={len(self._runs)}>"

    # -- global locks ------------------------------------------------------------------------

    _lock_seq: int = 0
    _lock_queues: dict[str, dict[int, tuple[str, float]]] | None = None
    """Per lock name: ticket -> (owner, lease expiry), made on first use."""

    def _lock_queue(self, name: str) -> dict[int, tuple[str, float]]:
        queues = self._lock_queues
        if queues is None:
            queues = self._lock_queues = {}
        return queues.setdefault(name, {})

    def _drop_lock_queue_if_empty(self, name: str) -> None:
        queues = self._lock_queues
        if queues is not None and not queues.get(name, True):
            del queues[name]

    async def enqueue_lock(self, name: str, owner: str, lease_seconds: float) -> int:
        now = self._clock.time()
        with self._lock:
            queue = self._lock_queue(name)
            for ticket in [t for t, (_, expires) in queue.items() if expires <= now]:
                del queue[ticket]
            self._lock_seq += 1
            queue[self._lock_seq] = (owner, now + lease_seconds)
            return self._lock_seq

    async def lock_holder(self, name: str) -> tuple[int, str] | None:
        now = self._clock.time()
        with self._lock:
            live = [(t, o) for t, (o, expires) in self._lock_queue(name).items() if expires > now]
        return min(live) if live else None

    async def lock_turn(self, name: str, ticket: int, owner: str, lease_seconds: float) -> bool:
        now = self._clock.time()
        with self._lock:
            queue = self._lock_queue(name)
            mine = queue.get(ticket)
            if mine is not None and mine[0] == owner:
                queue[ticket] = (owner, now + lease_seconds)
            for expired in [t for t, (_, expires) in queue.items() if expires <= now]:
                del queue[expired]
            held = ticket in queue and queue[ticket][0] == owner and min(queue) == ticket
            self._drop_lock_queue_if_empty(name)
            return held

    async def release_lock(self, name: str, ticket: int) -> None:
        with self._lock:
            self._lock_queue(name).pop(ticket, None)
            self._drop_lock_queue_if_empty(name)
