"""Masking secrets in text, in any case: the one helper every layer that scrubs uses.

A provider's error may quote the api_key it was sent, a database server's the password, and
not always as it was sent: ``INVALID KEY SK-…`` is the key ``sk-…`` in capitals. So a secret
is found and masked ignoring case. Only error paths call these (never a successful call's),
so the cost of a case-insensitive search is paid when something already went wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MASK", "mask", "quotes"]

MASK = "**********"
"""What a masked secret shows (pydantic's ``SecretStr`` shows the same)."""


def _pattern(secrets: Iterable[str | None]) -> re.Pattern[str] | None:
    wanted = sorted({s for s in secrets if s}, key=len, reverse=True)  # longest first
    if not wanted:
        return None
    return re.compile("|".join(re.escape(s) for s in wanted), re.IGNORECASE)


def quotes(text: str, *secrets: str | None) -> bool:
    """Whether ``text`` holds any of ``secrets``, in any case."""
    pattern = _pattern(secrets)
    return pattern is not None and pattern.search(text) is not None


def mask(text: str, *secrets: str | None, shown: str = MASK) -> str:
    """``text`` with every occurrence of each of ``secrets``, in any case, replaced by
    ``shown`` (``None`` and empty secrets are ignored)."""
    pattern = _pattern(secrets) if text else None
    return text if pattern is None else pattern.sub(lambda _: shown, text)
