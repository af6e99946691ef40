"""``agency.runs``: an admin view of the runs in a store (list, tree, get, journal, cancel,
fork), sending events to runs (``send``), and deleting runs that ended long ago (``prune``)."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Collection
from datetime import timedelta
from typing import Any, get_args

from .._bounds import check_duration, check_whole, shown
from .._errors import InvalidArgumentError, RunNotFoundError
from .._store import RunRecord, Store
from .._types import PRUNABLE_STATUSES, JournalEntry, RunEvent, RunResult, RunStatus, bind_store
from .._waits import check_event_name, encode_payload
from ._queue import wait
from ._resume import get_record
from ._run import tell_parent
from ._runtime import RUNTIME

__all__ = ["MAX_LIST_LIMIT", "MAX_TREE_RUNS", "RunsNamespace", "prune_statuses"]

MAX_LIST_LIMIT = 10_000
"""The most runs one ``agency.runs.list`` call returns; page with ``offset`` for more."""
MAX_TREE_RUNS = 10_000
"""The most runs ``agency.runs.tree`` returns (a run and its descendants)."""


class RunsNamespace:
    """``agency.runs``: an admin view of the runs in a store."""

    async def list(
        self,
        *,
        store: str | Store | None = None,
        status: RunStatus | None = None,
        limit: int = 100,
        offset: int = 0,
        parent: str | None = None,
    ) -> builtins.list[RunRecord]:
        """Up to ``limit`` runs, newest first, after the first ``offset`` (a page).

        Optionally only those with ``status``, and only the child runs that run ``parent``
        started (its direct children; :meth:`tree` has every descendant). ``limit`` is 1 to
        ``MAX_LIST_LIMIT`` (10 000); ``offset`` is 0 or more. The order is stable, so
        consecutive pages (``offset=0, 100, 200, ...``) do not overlap while no run is added.
        """
        if status is not None and status not in get_args(RunStatus):
            raise InvalidArgumentError(
                f"status must be one of {', '.join(get_args(RunStatus))}, got {status!r}"
            )
        if parent is not None and (not isinstance(parent, str) or not parent):
            raise InvalidArgumentError(
                f"parent must be a run id (a non-empty string) or None, got {shown(parent)}"
            )
        check_whole(limit, "limit", 1, MAX_LIST_LIMIT)
        check_whole(offset, "offset", 0)
        store_ = RUNTIME.stores.resolve(store)
        records = await store_.list_runs(status=status, limit=limit, offset=offset, parent=parent)
        return [bind_store(record, store_) for record in records]

    async def tree(
        self, run_id: str, *, store: str | Store | None = None
    ) -> builtins.list[RunRecord]:
        """Run ``run_id`` and all its descendants (the child runs it started, theirs, ...),
        depth first: each run followed by its children's trees, in the order they were
        created.

        Raises :class:`RunNotFoundError` for an unknown id, and :class:`InvalidArgumentError`
        for a tree of more than ``MAX_TREE_RUNS`` (10 000) runs: page through it with
        ``list(parent=...)`` instead.
        """
        store_ = RUNTIME.stores.resolve(store)
        top = await get_record(store_, run_id)
        runs: builtins.list[RunRecord] = []
        seen = {top.run_id}
        pending = [top]  # runs to visit, the next on top
        while pending:
            run = pending.pop()
            runs.append(run)
            room = MAX_TREE_RUNS - len(runs) - len(pending)
            # Newest first. Room + 1 says whether there are too many; + 1 more as ``top``
            # may be listed again (a parent cycle a damaged store may hold): each run has one
            # parent, so no other run can come twice.
            listed = await store_.list_runs(parent=run.run_id, limit=room + 2)
            children = [child for child in listed if child.run_id not in seen]
            if len(children) > room:
                raise InvalidArgumentError(
                    f"run {run_id!r} has more than {MAX_TREE_RUNS:,} runs in its tree; list "
                    "them a page at a time with agency.runs.list(parent=ID)"
                )
            seen.update(child.run_id for child in children)
            pending += [bind_store(child, store_) for child in children]  # oldest on top
        return runs

    async def send(
        self,
        run_id: str,
        name: str,
        payload: Any = None,
        *,
        store: str | Store | None = None,
    ) -> RunEvent:
        """Send event ``name`` with ``payload`` (JSON data) to run ``run_id``; returns once
        it is stored.

        The event is buffered until a wait of the run (``agency.wait_for_event(name)``)
        takes it, oldest first; a run parked waiting for it is woken. Raises
        :class:`RunNotFoundError` for an unknown run and :class:`RunFinishedError` for a
        completed or cancelled one.
        """
        name = check_event_name(name)
        body = encode_payload(payload)
        if not isinstance(run_id, str) or not run_id:
            raise InvalidArgumentError(f"run_id must be a non-empty string, got {run_id!r}")
        return await RUNTIME.stores.resolve(store).send_event(run_id, name, body)

    async def wait(
        self, run_id: str, *, store: str | Store | None = None, timeout: float | None = None
    ) -> RunResult[Any]:
        """Wait for run ``run_id`` to be completed, failed, cancelled or paused; its result.

        Raises :class:`RunNotFoundError` for an unknown id and :class:`RunWaitTimeoutError`
        when ``timeout`` seconds pass first (the run goes on).
        """
        return await wait(run_id, store=store, timeout=timeout)

    async def get(self, run_id: str, *, store: str | Store | None = None) -> RunRecord:
        """The stored run ``run_id``; raises :class:`RunNotFoundError` if there is none."""
        return await get_record(RUNTIME.stores.resolve(store), run_id)

    async def journal(
        self,
        run_id: str,
        *,
        after_seq: int | None = None,
        limit: int | None = None,
        store: str | Store | None = None,
    ) -> builtins.list[JournalEntry]:
        """The completed steps of ``run_id``, in the order they were committed.

        A big run's a page at a time: ``after_seq`` (only the steps after that journal
        position: the last ``seq`` of the page before) and ``limit`` (at most that many, 1 to
        ``MAX_LIST_LIMIT``); the store reads just that page.
        """
        if after_seq is not None:
            check_whole(after_seq, "after_seq", 0)
        if limit is not None:
            check_whole(limit, "limit", 1, MAX_LIST_LIMIT)
        store_ = RUNTIME.stores.resolve(store)
        await get_record(store_, run_id)
        if after_seq is None and limit is None:
            return (await store_.load_journal(run_id)).entries
        page = await store_.load_journal_page(
            run_id, after_seq=after_seq, limit=limit or MAX_LIST_LIMIT
        )
        return page.entries

    async def cancel(self, run_id: str, *, store: str | Store | None = None) -> RunRecord:
        """Cancel ``run_id`` (final) and its unfinished child runs, theirs, and so on.

        A process running one stops at its next step; a child cancelled alone returns
        ``status="cancelled"`` to its parent's call.
        """
        store_ = RUNTIME.stores.resolve(store)
        record = await store_.cancel_run(run_id)
        if record is None:
            raise RunNotFoundError(run_id, store_.url)
        await _cancel_descendants(store_, run_id)
        await tell_parent(store_, record)  # a queued child's parent waits for its end
        return bind_store(record, store_)

    async def fork(
        self,
        run_id: str,
        step_path: str,
        *,
        new_run_id: str | None = None,
        store: str | Store | None = None,
    ) -> str:
        """Copy ``run_id`` with its journal up to and including ``step_path``; return the new id.

        The fork is paused: continue it with ``agency.resume(new_id)``; the steps after
        ``step_path`` run again there.
        """
        store_ = RUNTIME.stores.resolve(store)
        await get_record(store_, run_id)
        entries = (await store_.load_journal(run_id)).entries
        match = next((e for e in entries if e.path == step_path), None)
        if match is None:
            known = ", ".join(e.path for e in entries[:10]) or "none"
            raise InvalidArgumentError(
                f"run {run_id!r} has no completed step {step_path!r} (steps: {known})"
            )
        new_id = new_run_id or f"{run_id}-fork-{uuid.uuid4().hex[:8]}"
        if await store_.get_run(new_id) is not None:
            raise InvalidArgumentError(f"a run {new_id!r} exists already; pick another new_run_id")
        await store_.fork_run(run_id, new_id, match.seq)
        remembered = RUNTIME.entries.remembered(run_id)
        if remembered is not None:
            RUNTIME.entries.remember(new_id, remembered)  # a closure's fork resumes here too
        return new_id

    async def prune(
        self,
        *,
        older_than: float | timedelta | str,
        status: RunStatus | Collection[RunStatus] | None = None,
        store: str | Store | None = None,
    ) -> int:
        """Delete the runs that ended more than ``older_than`` ago, with their journals,
        events and child runs; return how many runs were deleted.

        ``older_than`` is seconds (a number), a ``timedelta``, or a string such as ``"30d"``,
        ``"12h"``, ``"90m"`` or ``"45s"``; a run's age is the time since it last changed (on
        the store's clock). ``status`` is ``"completed"``, ``"failed"`` or ``"cancelled"``,
        or a collection of them (default: all three). A run is deleted with every run below
        it, and only when all of them have ended and are that old: a queued, running,
        waiting or paused run is never deleted, nor the runs above it, and a child run goes
        only with its parent. The store deletes about 500 runs per transaction.
        """
        seconds = check_duration(older_than, "older_than")
        statuses = prune_statuses(status)
        return await RUNTIME.stores.resolve(store).prune_runs(older_than=seconds, statuses=statuses)


def prune_statuses(status: object) -> tuple[RunStatus, ...]:
    """``agency.runs.prune``'s ``status``: the statuses it names (``None``: every prunable
    one), or an InvalidArgumentError saying which may be pruned."""
    if status is None:
        return PRUNABLE_STATUSES
    named = [status] if isinstance(status, str) else status
    allowed = ", ".join(PRUNABLE_STATUSES[:-1]) + " or " + PRUNABLE_STATUSES[-1]
    if not isinstance(named, Collection) or isinstance(named, bytes | dict) or not named:
        raise InvalidArgumentError(
            f"status must be one of {allowed}, or a list of them, got {shown(status)}"
        )
    chosen: list[RunStatus] = []
    for one in named:
        if one in PRUNABLE_STATUSES:
            chosen.append(one)
        elif isinstance(one, str) and one in get_args(RunStatus):
            raise InvalidArgumentError(
                f"status {one!r} cannot be pruned: a {one} run has not ended; prune deletes "
                f"only {allowed} runs"
            )
        else:
            raise InvalidArgumentError(
                f"status must be one of {allowed} (or a list of them), got {shown(one)}"
            )
    return tuple(dict.fromkeys(chosen))


_CANCEL_PAGE = 500
"""Children read per page while cancelling a tree."""


async def _cancel_descendants(store: Store, run_id: str) -> None:
    """Cancel every unfinished run below ``run_id`` (breadth first, a page at a time)."""
    waiting = [run_id]
    while waiting:
        parent = waiting.pop()
        offset = 0
        while True:
            children = await store.list_runs(parent=parent, limit=_CANCEL_PAGE, offset=offset)
            for child in children:
                if not child.is_final:
                    await store.cancel_run(child.run_id)
                waiting.append(child.run_id)
            if len(children) < _CANCEL_PAGE:
                break
            offset += _CANCEL_PAGE
