"""Replaying what a journaled step or LLM call did to the run's state.

While a step runs, every change it makes is reported (``_threads.CHANGES``): thread changes
(``new``, ``push``, ``queue``, ``take``), spend (``["cost", pico, tokens]``) and guard grants
(``["grant", guard_id, pico, seconds, disarm]``). They are journaled with the step; when the
step is replayed instead of run, :func:`replay_changes` applies them again, so the threads,
the guards' spend and their grants are as if the step had run.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic_core import from_json, to_json

from ._errors import JournalCorruptError, NondeterminismError
from ._frame import Frame
from ._guards import apply_grant, charge_guards, find_guard
from ._journal import journal_of
from ._records import JournalEntry
from ._threads import CHANGES, THREAD_CHANGE_KINDS, ThreadChange, report_change

__all__ = ["journaled", "replay_changes"]

T = TypeVar("T")


def replay_changes(frame: Frame, changes: list[ThreadChange]) -> None:
    """Apply recorded changes in ``frame`` and report them to an enclosing running step.

    The run's own spend is not charged again: the stored run cost already holds it.
    """
    for change in changes:
        kind = change[0]
        if kind in THREAD_CHANGE_KINDS:
            frame.threads.apply_change(change)
        elif kind == "cost":
            charge_guards(frame, int(change[1]))
        elif kind == "grant":
            guard = find_guard(frame, str(change[1]))
            if guard is not None:
                apply_grant(guard, change)
        else:
            raise ValueError(f"unknown journaled change {kind!r}")
        report_change(change)


async def journaled(
    frame: Frame,
    path: str,
    name: str,
    operation: Callable[[], Awaitable[T]],
    *,
    encode: Callable[[T], Any],
    decode: Callable[[Any], T],
    callsite: str = "",
) -> T:
    """Run ``operation`` once per run at ``path``: later executions replay its outcome.

    The first time, the changes the operation makes (threads, spend, grants) are recorded
    and committed with ``encode(result)`` as one journal entry (inside a run). When the
    entry exists, its changes are replayed and ``decode(recorded)`` is returned instead of
    running the operation: no provider is called and nothing is paid twice.
    """
    journal = journal_of(frame.ctx)
    entry = journal.entries.get(path)
    if entry is not None:
        if entry.name != name:
            raise NondeterminismError(
                f"run {entry.run_id!r} replayed {path!r} as {name}, but the journal recorded "
                f"{entry.name!r} there. The code changed under an in-flight run."
            )
        try:
            if entry.deltas:
                replay_changes(frame, from_json(entry.deltas))
            return decode(from_json(entry.result))
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise JournalCorruptError(
                f"the journal of run {entry.run_id!r} is damaged at {name} {path!r}: {exc}"
            ) from exc
    changes: list[ThreadChange] = []
    token = CHANGES.set(changes)
    try:
        result = await operation()
    finally:
        CHANGES.reset(token)
    outer = CHANGES.get()
    if outer is not None:
        outer.extend(changes)
    if journal.durable:
        await journal.commit_step(
            JournalEntry.from_row(
                {
                    "run_id": journal.run_id or "",
                    "seq": journal.next_seq(),
                    "path": path,
                    "name": name,
                    "callsite": callsite,
                    "result": to_json(encode(result)).decode(),
                    "locals": None,
                    "scopes": None,
                    "deltas": to_json(changes).decode() if changes else None,
                    "cost_pico": frame.ctx.cost_pico,
                    "tokens": frame.ctx.tokens,
                    "created_at": time.time(),
                }
            )
        )
    return result
