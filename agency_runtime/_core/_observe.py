"""The observation seam: what the runtime tells a tracer about a run, when one is installed.

:data:`OBSERVER` is ``None`` unless :func:`agency_runtime.otel.instrument` installed one, and
every call site reads it once and takes its plain path when it is ``None``
(``obs = _observe.OBSERVER; if obs is None: ...``), so a process that does not trace pays
one attribute read per run, step, model request, tool call or interrupt, and imports no
tracing library. An :class:`Observer` gives context managers: the runtime enters one around
the work it describes, inside the task doing it, so the work (a step's function, a tool)
runs with the observer's span current and a user's own spans nest under it. An exception
leaving the block is the work's outcome (the run-control signals, ``RunPaused`` and its
kin, among them); the handles some of them yield take what is known only at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = [
    "OBSERVER",
    "ChatWatch",
    "InterruptWatch",
    "Observer",
    "RunWatch",
    "ToolWatch",
    "install",
]


class RunWatch(Protocol):
    """The handle of one execution of a run."""

    def finished(self, status: str, cost_usd: float, error: BaseException | None) -> None:
        """The execution ended: the run's status, its whole cost so far, its error."""

    def context(self) -> str | None:
        """The execution's span as a W3C ``traceparent`` (noted in the store, so the run's
        next execution links to it); ``None`` when it has none to give."""


class ChatWatch(Protocol):
    """The handle of one request to a model."""

    def answered(
        self,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float,
        *,
        model: str | None = None,
        response_id: str | None = None,
        finish_reasons: Sequence[str] = (),
    ) -> None:
        """The model answered: the tokens the provider counted, what the answer cost, and
        what the provider said of it (the model that answered, the response's id, why each
        choice ended: ``stop``, ``length``, ``tool_calls``)."""

    @property
    def captures_content(self) -> bool:
        """Whether :meth:`content` wants the messages (the user opted in)."""

    def content(
        self,
        messages: Sequence[Mapping[str, Any]],
        text: str,
        tool_calls: Sequence[Any],
        secrets: Sequence[str],
    ) -> None:
        """The messages sent and the answer (only when :attr:`captures_content`); each of
        ``secrets`` (the api_keys of the model and of the registered ones) is masked."""


class ToolWatch(Protocol):
    """The handle of one tool execution."""

    def failed(self, message: str, error: BaseException | None = None) -> None:
        """The tool failed (its error goes back to the model, so nothing is raised)."""


class InterruptWatch(Protocol):
    """The handle of one interrupt asked."""

    def decided(self, decision: str) -> None:
        """The interrupt was answered (``"approve"`` or ``"reject"``)."""


class Observer(Protocol):
    """What the runtime reports; each method opens a context manager around the work."""

    def run(
        self, run_id: str, entry: str, attempt: int, link: str | None = None
    ) -> AbstractContextManager[RunWatch]:
        """One execution of a run (the entry called until it returns, pauses or fails);
        ``link``: the ``traceparent`` of the span it follows (the run's previous execution,
        or the parent's call of a queued child run)."""

    def current(self) -> str | None:
        """The current span as a ``traceparent`` (``None`` when there is none)."""

    def step(self, name: str, path: str, replayed: bool) -> AbstractContextManager[object]:
        """A journaled unit: executed, or ``replayed`` from its journal entry (no work)."""

    def chat(
        self, model: str, name: str, path: str, replayed: bool
    ) -> AbstractContextManager[ChatWatch]:
        """A request to the provider ``model`` (the agency model ``name``), or a replayed
        answer (no request)."""

    def tool(
        self, name: str, call_id: str, path: str, replayed: bool, *, server: str | None = None
    ) -> AbstractContextManager[ToolWatch]:
        """A tool the model called, executed or replayed (``server``: the MCP server whose
        tool it is, else ``None`` for a function)."""

    def interrupt(
        self, effect: str, interrupt_id: str, replayed: bool
    ) -> AbstractContextManager[InterruptWatch]:
        """An interrupt asked (``replayed``: its answer is in the journal)."""

    def guard(
        self, kind: str, guard_id: str, label: str | None, budget: float, spent: float
    ) -> AbstractContextManager[object]:
        """A guard over its budget: what is done about it (asked, granted, raised)."""

    def retried(
        self, path: str, attempt: int, error_type: str, message: str, due: float | None
    ) -> None:
        """Attempt ``attempt`` of the step at ``path`` failed (journaled); the next is due at
        ``due`` (``None``: it was the last). Reported on the span around the step."""


OBSERVER: Observer | None = None
"""The process's observer (``None``: nothing is observed)."""


def install(observer: Observer | None) -> None:
    """Make ``observer`` the process's observer (``None``: stop observing)."""
    global OBSERVER
    OBSERVER = observer
