"""Replaying what a journaled unit changed, when it is replayed instead of run.

A committed unit holds the changes it made (:mod:`agency_runtime._core._changes`): thread
changes, which this module applies to the frame's threads itself, and the changes features
report — spend and grants of guards — which each feature teaches it to apply with
:func:`register_change`. Every change applied is reported again to the unit that is running
around the replay, so an enclosing step records it too.
"""

from __future__ import annotations

from collections.abc import Callable

from .._core._changes import Change, report_change
from .._core._frame import Frame
from .._core._threads import THREAD_CHANGE_KINDS

__all__ = ["register_change", "replay_changes"]

_APPLIERS: dict[str, Callable[[Frame, Change], None]] = {}


def register_change(kind: str, apply: Callable[[Frame, Change], None]) -> None:
    """Teach replay to apply changes of ``kind`` (a feature's, e.g. a guard's ``"cost"``)."""
    if kind in THREAD_CHANGE_KINDS:
        raise ValueError(f"{kind!r} is a thread change; threads apply their own")
    _APPLIERS[kind] = apply


def replay_changes(frame: Frame, changes: list[Change]) -> None:
    """Apply recorded changes in ``frame`` and report them to an enclosing running unit.

    The run's own spend is not charged again: the run starts from the spend its committed
    entries hold. An unknown kind raises ``ValueError`` (the journal is then reported
    damaged).
    """
    for change in changes:
        kind = change[0]
        if kind in THREAD_CHANGE_KINDS:
            frame.threads.apply_change(change)
        else:
            apply = _APPLIERS.get(kind)
            if apply is None:
                raise ValueError(f"unknown journaled change {kind!r}")
            apply(frame, change)
        report_change(change)
