"""A worker's hold on the run it serves: the run boundary's side of the parking seam.

:class:`HandBack` implements :class:`~agency_runtime._durable._parking.Parking`: a worker
makes one per run it claims and :func:`~agency_runtime._boundary._run.execute` hangs it on
the run's journal, where the journal (stop after a commit) and the waits (park) consult it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["HandBack"]


class HandBack:
    """A worker's hold on the run it serves.

    ``requested`` (set by :meth:`request` when the worker drains) asks the run to stop
    after the next step it commits: the run boundary turns the
    :class:`~agency_runtime._errors.RunHandedBack` signal into a run handed back to its
    queue, where any worker continues it from its journal. A wait in progress
    (``agency.sleep``, ``agency.wait_for_event``) is told at once through :meth:`on_request`
    and parks instead. ``park_after``: a wait longer than this many seconds parks the run
    (``None``: never park).
    """

    __slots__ = ("_callbacks", "park_after", "requested")

    def __init__(self, park_after: float | None = None) -> None:
        self.requested = False
        self.park_after = park_after
        self._callbacks: list[Callable[[], None]] = []

    def request(self) -> None:
        """Ask the run to stop (draining): after its next commit, or now if it waits."""
        self.requested = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_request(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` when :meth:`request` is called; returns a canceller."""
        self._callbacks.append(callback)

        def cancel() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return cancel

    def parks(self, seconds: float) -> bool:
        """Whether a wait of ``seconds`` parks the run rather than waiting in this process."""
        return self.requested or (self.park_after is not None and seconds > self.park_after)
