"""What a provider's response costs: :func:`bill` (pico-dollars and tokens), and the
warnings about models without a price (once per model, and once per model and cost guard).

The caller charges the result to the run and the guards in scope (:func:`~.._guards.charge`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from .._core._money import usd_to_pico
from .._guards import CostGuard
from ._model import Model

if TYPE_CHECKING:
    from .._core._frame import Frame
    from ._provider import Usage

__all__ = ["bill"]

logger = logging.getLogger("agency_runtime.llm")

_unpriced: set[str] = set()
"""The model names whose unpriced calls were warned about (once per process)."""
_unpriced_in_guard: set[tuple[str, str]] = set()
"""(model name, guard) pairs warned about: an unpriced call inside a cost guard."""


def bill(
    cost: float | None, usage: Usage, model: Model | str, frame: Frame | None = None
) -> tuple[int, int]:
    """A response's spend: (pico-dollars, total tokens).

    A :class:`Model` with prices of its own is billed with them (prompt tokens times its
    input price plus completion tokens times its output price), whatever the provider
    says; otherwise the provider's ``cost``. With neither the call is billed $0, and a
    WARNING says so once per model name, and once per model and cost guard in ``frame``'s
    scope (such a guard cannot stop those calls).
    """
    tokens = usage.total_tokens
    if isinstance(model, Model) and model.priced:
        return model.price_pico(usage), tokens
    if cost is None or isinstance(cost, bool) or not math.isfinite(cost) or cost < 0:
        _warn_unpriced(model, frame)
        return 0, tokens
    return usd_to_pico(float(cost)), tokens


def _price_hint(model: Model | str) -> str:
    """How to price ``model``: the ``agency.Model(...)`` call that would."""
    provider_model, name = (model, model) if isinstance(model, str) else (model.model, model.name)
    named = "" if name == provider_model else f", name={name!r}"
    return (
        f"price it with agency.Model({provider_model!r}{named}, input_cost_per_token=..., "
        "output_cost_per_token=...) (US dollars a token)"
    )


def _warn_unpriced(model: Model | str, frame: Frame | None) -> None:
    name = model if isinstance(model, str) else model.name
    if name not in _unpriced:
        _unpriced.add(name)
        logger.warning(
            "no price is known for model %r: its calls are billed $0, so cost guards cannot "
            "stop them; %s",
            name,
            _price_hint(model),
        )
    if frame is None:
        return
    for guard in frame.stack.guards:
        if not isinstance(guard, CostGuard):
            continue
        shown = guard.guard_id if guard.label is None else f"{guard.label!r} ({guard.guard_id})"
        key = (name, shown)
        if key in _unpriced_in_guard:
            continue
        _unpriced_in_guard.add(key)
        logger.warning(
            "a call of the unpriced model %r inside the cost guard %s is billed $0: the "
            "guard cannot stop it; %s",
            name,
            shown,
            _price_hint(model),
        )
