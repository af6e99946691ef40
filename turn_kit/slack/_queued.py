"""Slack turns as queued runs: the declared entry a worker runs, and what it runs them with.

The events app must answer Slack within 3 seconds, so it does not run a turn in the
request: it stores the turn as a queued run (``agency.enqueue``) and answers. A worker
serving the adapter's queue — the app's own, during its lifespan, or ``agency worker
--queue turn-kit-slack-<namespace> --import <your app module>`` elsewhere — claims the run
and calls :func:`slack_turn`, the declared entry ``turn_kit.slack.turn``, which finds the
adapter, ctx and ``respond`` that :func:`register` bound to the namespace in *this*
process (so the module that builds the events app must be imported by every worker).

A run id is an idempotency key, so a message Slack delivers again (a retry, or the
``message`` and ``app_mention`` events of one mention) finds its run instead of queuing a
second; a worker that dies mid-turn leaves the run to the next one, which resumes it from
its journal (see :mod:`turn_kit.slack._send` for why no chunk is posted twice).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agency_runtime import agency

from .._errors import TurnKitError
from .._runner import TurnArgs, TurnResult
from ._parse import SlackMessage

__all__ = ["ENTRY_NAME", "Bound", "bound", "register", "slack_turn"]

ENTRY_NAME = "turn_kit.slack.turn"


@dataclass(frozen=True)
class Bound:
    """What the turns of one namespace run with in this process."""

    adapter: Any
    ctx: Any
    respond: Callable[[TurnArgs], Any]


_BOUND: dict[str, Bound] = {}
_LOCK = threading.Lock()


def register(namespace: str, value: Bound) -> None:
    """Bind ``namespace``'s queued turns to ``value`` in this process (the last one wins)."""
    with _LOCK:
        _BOUND[namespace] = value


def bound(namespace: str) -> Bound:
    """What ``namespace``'s turns run with here; a clear error when nothing was bound."""
    with _LOCK:
        value = _BOUND.get(namespace)
    if value is None:
        raise TurnKitError(
            f"no Slack events app for namespace {namespace!r} in this process: a worker runs "
            "a queued Slack turn with the adapter and respond of slack_events_app(...), so "
            "import the module that builds the app in every worker (agency worker --import "
            "MODULE)"
        )
    return value


@agency.entry(name=ENTRY_NAME)
async def slack_turn(namespace: str, message: SlackMessage) -> TurnResult:
    """The declared entry of a queued Slack turn: run the turn's steps in this run."""
    value = bound(namespace)
    result: TurnResult = await value.adapter.run_turn(value.ctx, message, value.respond)
    return result
