"""The change log: what a running journaled unit changed, reported as it happens.

While a journaled unit (a step, an LLM call, a memory operation) runs, the code it calls
reports what it changes — thread messages, spend, guard grants — into the unit's
:class:`Recorder`, found on the running task's cursor (``_branches.report_change``; child
tasks share their unit's). The durable layer (:mod:`agency_runtime._durable`) opens a
recorder per unit, commits what it collected with the unit's outcome, and replays it when
the unit is replayed instead of run.
Features only report; they never write journal rows.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SAME", "UNIT", "Change", "Recorder"]

Change = list[Any]
"""One change a journaled step made to the run's state, as JSON data: thread changes
(``["new", id, parent_id, label, hidden, messages]``, ``["push", id, message]``,
``["queue", id, queued]``, ``["take", id]``), spend (``["cost", pico, tokens]``) and guard
grants (``["grant", guard_id, pico, seconds, disarm]``), and two kinds the durable layer
writes itself: ``["unit", path]`` (every change of the committed unit at ``path``, which its
own entry holds) and ``["same", index]`` (the unit's result is the text of the message at
``index`` of its changes)."""

UNIT = "unit"
"""The kind of a change that stands for all the changes of a committed inner unit."""

SAME = "same"
"""The kind of the change that says a unit's result is a message its changes already hold."""


class Recorder:
    """What one executing journaled unit (a step, an LLM call, …) collects.

    ``changes`` are replayed when the unit is replayed instead of run (``None`` for a run's
    root, which keeps none: it is never replayed); ``pico`` and ``tokens`` are the spend made
    in the unit itself, not in journaled units nested in it (those commit their own).
    """

    __slots__ = ("changes", "pico", "tokens")

    def __init__(self, *, keep: bool = True) -> None:
        self.changes: list[Change] | None = [] if keep else None
        self.pico = 0
        self.tokens = 0

    def absorb(self, inner: Recorder, *, spend: bool, unit: str | None = None) -> None:
        """Take over ``inner``'s changes (and, with ``spend``, its uncommitted spend).

        ``unit``: the path of the entry ``inner`` committed its changes with; one
        ``["unit", path]`` change then stands for all of them instead of a copy.
        """
        if self.changes is not None and inner.changes:
            if unit is None:
                self.changes.extend(inner.changes)
            else:
                self.changes.append([UNIT, unit])
        if spend:
            self.pico += inner.pico
            self.tokens += inner.tokens
