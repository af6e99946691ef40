"""The exceptions of turn_kit; each derives from :class:`TurnKitError` (an ``AgencyError``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agency_runtime import AgencyError, InvalidArgumentError

if TYPE_CHECKING:
    from agency_runtime import RunResult

__all__ = [
    "InvalidArgumentError",
    "SlackError",
    "SlackRateLimitedError",
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


class SlackError(TurnKitError):
    """The Slack Web API refused a call (its ``error`` code is in the message, as ``code``)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class SlackRateLimitedError(SlackError):
    """Slack answered 429 more often than the call was allowed to wait it out.

    ``retry_after`` is the wait Slack asked for (its ``Retry-After`` header), in seconds.
    """

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, code="ratelimited")
        self.retry_after = retry_after
