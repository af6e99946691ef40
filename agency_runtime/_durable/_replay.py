"""Replaying what a journaled unit changed, when it is replayed instead of run.

A committed unit holds the changes it made (:mod:`agency_runtime._core._changes`): thread
changes, which this module applies to the frame's threads itself, and the changes features
report — spend and grants of guards — which each feature teaches it to apply with
:func:`register_change`. Every change applied is reported again to the unit that is running
around the replay, so an enclosing step records it too.

A unit that ran committed units inside it (a step calling ``agency.llm``) holds one
``["unit", path]`` change for each of them instead of a copy of their changes: their own
entries hold those, so each text is stored once. Replaying it applies the changes of the
entry at ``path`` (and of the units that one names, at any depth) in place of the marker,
and reports the marker itself to the unit running around the replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic_core import from_json

from .._core._branches import report_change
from .._core._changes import SAME, UNIT, Change
from .._core._frame import Frame
from .._core._threads import THREAD_CHANGE_KINDS
from .._types import JournalEntry

__all__ = ["expand", "last_push", "pushed_text", "register_change", "replay_changes"]

_APPLIERS: dict[str, Callable[[Frame, Change], None]] = {}

Units = Mapping[str, JournalEntry]
"""A run's recorded entries by path (``RunJournal.entries``): where markers are looked up."""


def register_change(kind: str, apply: Callable[[Frame, Change], None]) -> None:
    """Teach replay to apply changes of ``kind`` (a feature's, e.g. a guard's ``"cost"``)."""
    if kind in THREAD_CHANGE_KINDS or kind in (UNIT, SAME):
        raise ValueError(f"{kind!r} is a change kind of the runtime's own")
    _APPLIERS[kind] = apply


def replay_changes(
    frame: Frame, changes: list[Change], units: Units, *, report: bool = True
) -> None:
    """Apply recorded changes in ``frame`` and (``report``) report them to an enclosing
    running unit.

    ``["unit", path]`` markers are applied from ``units`` and reported as markers. The run's
    own spend is not charged again: the run starts from the spend its committed entries
    hold. An unknown kind, or a marker naming an entry ``units`` lacks, raises
    ``ValueError`` (the journal is then reported damaged).
    """
    for change in changes:
        kind = change[0]
        if kind in THREAD_CHANGE_KINDS:
            frame.threads.apply_change(change)
        elif kind == UNIT:
            replay_changes(frame, _unit_changes(change, units), units, report=False)
        elif kind == SAME:
            continue  # about this unit's own result: nothing to apply or pass on
        else:
            apply = _APPLIERS.get(kind)
            if apply is None:
                raise ValueError(f"unknown journaled change {kind!r}")
            apply(frame, change)
        if report:
            report_change(change)


def _unit_changes(marker: Change, units: Units) -> list[Change]:
    path = marker[1]
    entry = units.get(path) if isinstance(path, str) else None
    if entry is None:
        raise ValueError(f"a change stands for the unit at {path!r}, which the journal lacks")
    if entry.error is not None:
        raise ValueError(f"a change stands for the unit at {path!r}, which recorded a failure")
    return from_json(entry.deltas) if entry.deltas else []


def expand(changes: list[Change], units: Units) -> list[Change]:
    """``changes`` with each ``["unit", path]`` marker replaced by the changes it stands for
    (at any depth), and without ``["same", …]``: the list a unit's references index."""
    out: list[Change] = []
    for change in changes:
        kind = change[0]
        if kind == UNIT:
            out.extend(expand(_unit_changes(change, units), units))
        elif kind != SAME:
            out.append(change)
    return out


def last_push(changes: list[Change], text: str, *, role: str | None = None) -> int | None:
    """The index in ``changes`` of the last message pushed with ``text`` as its content (and
    ``role``, when given), or ``None``: where a unit's result can point instead of repeating
    the text."""
    for index in range(len(changes) - 1, -1, -1):
        change = changes[index]
        if change[0] != "push":
            continue
        message = change[2]
        if message.get("content") == text and (role is None or message.get("role") == role):
            return index
    return None


def pushed_text(changes: list[Change], index: int, *, role: str | None = None) -> str:
    """The text of the message pushed at ``changes[index]`` (:func:`last_push` undone).

    Raises ``IndexError`` for an index past the changes and ``ValueError`` when the change
    there is not a push (of ``role``) or its message holds no text (the journal is then
    reported damaged).
    """
    change = changes[index]
    message = change[2] if change[0] == "push" else None
    if message is None or (role is not None and message.get("role") != role):
        wanted = "a reply" if role == "assistant" else "a message"
        raise ValueError(f"the reference points at {change[0]!r}, not {wanted}")
    content = message.get("content")
    if not isinstance(content, str):
        raise ValueError("the reference points at a message without text")
    return content
