"""Exact money arithmetic.

Costs are kept as integer pico-dollars (1e-12 USD) so sums never drift through float
rounding: three ``add_cost(0.1)`` under a ``0.3`` guard add up to exactly 0.3.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal

from .._bounds import MAX_INT
from .._errors import InvalidArgumentError

PICO_PER_USD = 10**12
MAX_USD = MAX_INT // PICO_PER_USD
"""The largest amount of US dollars a store can hold as pico-dollars (about 9.2 million)."""


def usd_to_pico(usd: float, *, what: str = "amount") -> int:
    """Convert a non-negative, finite dollar amount to integer pico-dollars."""
    if isinstance(usd, bool) or not isinstance(usd, int | float):
        raise InvalidArgumentError(
            f"{what} must be a number of US dollars, got {type(usd).__name__} {usd!r}"
        )
    if not math.isfinite(usd) or usd < 0 or usd > MAX_USD:
        raise InvalidArgumentError(
            f"{what} must be a finite, non-negative number of US dollars, at most {MAX_USD:,}, "
            f"got {usd!r}"
        )
    # repr() is the shortest decimal that round-trips, so 0.1 becomes exactly 10**11 pico.
    return int((Decimal(repr(float(usd))) * PICO_PER_USD).to_integral_value(ROUND_HALF_EVEN))


def format_usd(usd: float) -> str:
    """``$0.00001`` rather than ``$1e-05``: dollars with up to 12 decimals, trailing zeros cut."""
    text = f"{usd:,.12f}".rstrip("0").rstrip(".")
    return f"${text}"


def pico_to_usd(pico: int) -> float:
    """Convert integer pico-dollars back to a float dollar amount."""
    return pico / PICO_PER_USD
