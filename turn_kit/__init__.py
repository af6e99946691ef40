"""turn_kit: the multi-turn chat lifecycle, built on agency_runtime.

Every turn is a durable run of :mod:`agency_runtime`. The turn runner, context providers,
history helpers and the Telegram adapter arrive in later releases; this package currently
exposes its version only.
"""

TURN_KIT_VERSION = "0.1.0"

__all__ = ["TURN_KIT_VERSION"]
