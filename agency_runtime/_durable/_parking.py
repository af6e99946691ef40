"""The parking seam: what the holder of a run may ask of it while it runs.

A run's holder can ask it to give itself up: to stop after the next step it commits, to
stop a wait in progress at once, and to park waits longer than a bound instead of waiting
in the process. The journal and the waits see only this protocol; the run boundary
implements it (a worker's hand-back) and hangs it on the run's journal
(``RunJournal.parking``) from above. A plain ``agency.run`` has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["Parking"]


class Parking(Protocol):
    """The holder's asks of a running run (set on its journal by the run boundary)."""

    @property
    def requested(self) -> bool:
        """Whether the holder asks the run to stop: after its next commit, or now if it waits."""
        ...

    def on_request(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once the holder asks the run to stop; returns a canceller."""
        ...

    def parks(self, seconds: float) -> bool:
        """Whether a wait of ``seconds`` parks the run rather than waiting in this process."""
        ...
