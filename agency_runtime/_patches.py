"""``agency.patched(change_id)``: changing code under in-flight runs (Temporal's ``patched``).

A run replays its journal by address, so code that adds, removes or reorders steps before
the point an in-flight run reached would replay the wrong entries. Wrap the change::

    if agency.patched("send-receipt"):
        await s.step(send_receipt)      # the new code

``patched`` is ``True`` in a run that reaches this point for the first time (it records a
marker, ``patch:<change_id>``, with the run's next journal event) and in every replay of a
run that recorded the marker; it is ``False`` in a replay of a run that passed this point
before the change existed: one with recorded events still ahead of it (steps, or interrupts
asked) and no marker. The answer is fixed per change id for the rest of the execution.
"""

from __future__ import annotations

from ._core._frame import current_frame
from ._core._jsondata import check_name
from ._durable._effect import will_replay
from ._durable._journal import PATCH_PREFIX, journal_of
from ._types import JournalEntry

__all__ = ["patched"]


def patched(change_id: str) -> bool:
    """Whether this run takes the new code of change ``change_id`` (see the module doc)."""
    check_name(change_id, "agency.patched: a change id", "send-receipt")
    frame = current_frame("patched()")
    journal = journal_of(frame.ctx)
    known = journal.patches.get(change_id)
    if known is not None:
        return known
    path = PATCH_PREFIX + change_id
    if will_replay(journal, path):
        answer = True
    elif journal.replaying():
        answer = False  # the run passed here before the change existed: the old code
    else:
        answer = True
        journal.markers.append(
            JournalEntry.from_row(
                {
                    "run_id": journal.run_id or "",
                    "seq": journal.next_seq(),
                    "path": path,
                    "name": "agency.patched",
                    "callsite": "",
                    "result": "true",
                    "locals": None,
                    "scopes": None,
                    "deltas": None,
                    "error": None,
                    "cost_pico": 0,
                    "tokens": 0,
                    "created_at": frame.ctx.clock.time(),
                }
            )
        )
    journal.patches[change_id] = answer
    return answer
