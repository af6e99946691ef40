"""Pacing a streamed reply's edits: per chat, never faster than an interval, never inside a 429.

Shared by the Telegram and Slack adapters' live previews (``stream=True``).
"""

from __future__ import annotations

import anyio

__all__ = ["Pace", "retry_after"]


def _now() -> float:
    """The event loop's clock (tests replace this to move time by hand)."""
    return anyio.current_time()


_sleep = anyio.sleep
"""How a pace waits (tests replace this, with ``_now``, to wait on a fake clock)."""


def retry_after(exc: BaseException) -> float | None:
    """The wait a rate-limit error a transport raised asks for (its ``retry_after_seconds``
    or ``retry_after``, in seconds), else ``None``."""
    value = getattr(exc, "retry_after_seconds", None)
    if value is None:
        value = getattr(exc, "retry_after", None)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return max(0.0, float(value))


class Pace:
    """When each chat may get its next streamed-preview edit (on the event loop's clock)."""

    _PRUNE_AT = 1024

    def __init__(self) -> None:
        # chat -> (due at, the wait it was, whether the surface asked for it: a 429)
        self._next: dict[str, tuple[float, float, bool]] = {}

    def remaining(self, chat: str, *, rate_limited_only: bool = False) -> float:
        """Seconds until ``chat`` may get an edit (``0.0``: now); with ``rate_limited_only``,
        only a 429's hold counts."""
        entry = self._next.get(chat)
        if entry is None:
            return 0.0
        due, wait, limited = entry
        left = due - _now()
        if left <= 0 or left > wait:  # due, or set on another event loop's clock
            del self._next[chat]
            return 0.0
        return 0.0 if rate_limited_only and not limited else left

    async def wait_out_limit(self, chat: str) -> None:
        """Wait until a 429's hold on ``chat`` is over (an interval's hold is not waited)."""
        wait = self.remaining(chat, rate_limited_only=True)
        if wait > 0:
            await _sleep(wait)

    def ready(self, chat: str) -> bool:
        return self.remaining(chat) == 0.0

    def hold(self, chat: str, wait: float, *, rate_limited: bool = False) -> None:
        """No edit in ``chat`` for ``wait`` seconds from now."""
        now = _now()
        if len(self._next) >= self._PRUNE_AT:
            self._next = {c: e for c, e in self._next.items() if e[0] > now}
        self._next[chat] = (now + wait, wait, rate_limited)
