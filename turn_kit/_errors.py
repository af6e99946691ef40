"""The exceptions of turn_kit; each derives from :class:`TurnKitError` (an ``AgencyError``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agency_runtime import AgencyError, InvalidArgumentError

if TYPE_CHECKING:
    from agency_runtime import RunResult

__all__ = [
    "InvalidArgumentError",
    "TurnKitError",
    "TurnMemoryError",
    "TurnPausedError",
    "UnconfirmedTurnActionError",
    "UnconfirmedTurnDeliveryError",
]


class TurnKitError(AgencyError):
    """Base class of the errors turn_kit raises."""


class UnconfirmedTurnDeliveryError(TurnKitError):
    """The reply was delivered but ``confirm_delivery`` rejected the receipt."""


class UnconfirmedTurnActionError(TurnKitError):
    """A confirmed action's provider receipt did not pass ``confirm``."""


class TurnMemoryError(TurnKitError):
    """A required memory save returned no receipt."""


class TurnPausedError(TurnKitError):
    """The turn paused on interrupts; answer them with ``agency.respond_to_interrupts``."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        ids = ", ".join(i.interrupt_id for i in result.interrupts)
        super().__init__(
            f"the turn (run {result.run_id!r}) paused on interrupt(s) {ids}; answer them with "
            "`await agency.respond_to_interrupts(error.result, answers)` to finish the turn"
        )
