"""Confirmed domain actions: success text is built only after the provider receipt passes.

The seed's ``runConfirmedTurnAction``: ``perform`` the side effect, check its receipt with
``confirm``, and only then build the user-visible result with ``confirmed``, so no
optimistic "Done" can escape before the provider confirmed the write.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agency_runtime import InvalidArgumentError

from ._ctx import log_event
from ._errors import UnconfirmedTurnActionError
from ._identity import js_trim
from ._util import maybe_await

__all__ = ["run_confirmed_turn_action"]

R = TypeVar("R")
T = TypeVar("T")


async def run_confirmed_turn_action(
    *,
    ctx: Any = None,
    name: str,
    perform: Callable[[], Awaitable[R] | R],
    confirm: Callable[[R], Any],
    confirmed: Callable[[R], Awaitable[T] | T],
) -> T:
    """Run ``perform()``, require ``confirm(receipt)``, then return ``confirmed(receipt)``.

    ``perform``, ``confirm`` and ``confirmed`` may be sync or async. **Deviation** from the
    seed: an awaitable returned by ``confirm`` is awaited, so an async predicate that
    resolves falsy is a rejection (the seed treated the promise itself as truthy).

    Errors from ``perform`` and ``confirm`` propagate; in that case, and when the receipt is
    not confirmed, ``confirmed`` is never called. With a ``ctx``, logs
    ``turn-kit.action-unconfirmed {action}`` (error) or ``turn-kit.action-confirmed
    {action}``.

    Raises:
        InvalidArgumentError: ``name`` is blank ("turn action name is required") or a
            callback is not callable; raised before ``perform`` runs.
        UnconfirmedTurnActionError: ``confirm`` returned a falsy value.
    """
    action = js_trim(name) if isinstance(name, str) else ""
    if not action:
        raise InvalidArgumentError("turn action name is required")
    for label, callback in (("perform", perform), ("confirm", confirm), ("confirmed", confirmed)):
        if not callable(callback):
            raise InvalidArgumentError(
                f"turn action {action!r}: {label} must be callable, got {type(callback).__name__}"
            )
    receipt: R = await maybe_await(perform())
    if not await maybe_await(confirm(receipt)):
        if ctx is not None:
            log_event(ctx, "error", "action-unconfirmed", action=action)
        raise UnconfirmedTurnActionError(
            f'turn action "{action}" returned an unconfirmed provider receipt'
        )
    if ctx is not None:
        log_event(ctx, "info", "action-confirmed", action=action)
    result: T = await maybe_await(confirmed(receipt))
    return result
