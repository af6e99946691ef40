"""Replaying what a journaled step or LLM call did to the run's state.

While a step runs, every change it makes is reported (``_threads.CHANGES``): thread changes
(``new``, ``push``, ``queue``, ``take``), spend (``["cost", pico, tokens]``) and guard grants
(``["grant", guard_id, pico, seconds, disarm]``). They are journaled with the step; when the
step is replayed instead of run, :func:`replay_changes` applies them again, so the threads,
the guards' spend and their grants are as if the step had run.
"""

from __future__ import annotations

from ._frame import Frame
from ._guards import apply_grant, charge_guards, find_guard
from ._threads import THREAD_CHANGE_KINDS, ThreadChange, report_change

__all__ = ["replay_changes"]


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
