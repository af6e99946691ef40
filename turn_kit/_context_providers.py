"""Deterministic context: providers that collect labelled sections before the responder runs.

A provider (:func:`define_turn_context`) has a ``name``, a ``collect(args)`` callable (sync
or async) and an ``optional`` flag. :func:`collect_turn_context` runs every provider
**concurrently** and returns their sections flattened in provider order. A required
provider that fails makes the whole collection fail with its original error (fail closed);
an optional one is logged and contributes nothing. Duplicate section ids are an error even
when an optional provider returned them (``reference/turn-kit-spec.md`` §3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from pydantic import ConfigDict, ValidationError

from agency_runtime import DeferredModel, InvalidArgumentError

from ._ctx import log_event
from ._history import TurnHistoryEntry
from ._identity import TurnConversation, js_trim
from ._util import maybe_await

__all__ = [
    "TurnContext",
    "TurnContextArgs",
    "TurnContextProvider",
    "collect_turn_context",
    "define_turn_context",
]

ContextImportance = Literal["low", "medium", "high"]
"""How much a section should weigh."""
ContextCategory = Literal["memory", "session", "enrichment", "workspace", "guardrail", "other"]
"""What kind of context a section is."""


class TurnContext(DeferredModel):
    """One labelled section of context handed to the responder."""

    model_config = ConfigDict()

    id: str
    """Unique within a turn, e.g. ``"open-tasks"``."""
    label: str
    """A human-readable title, e.g. ``"Open tasks"``."""
    content: str
    """The section's text."""
    importance: ContextImportance | None = None
    """How much the responder should weigh it."""
    source: str | None = None
    """Where it came from, e.g. ``"task-store"``."""
    category: ContextCategory | None = None
    """What kind of context it is."""
    metadata: dict[str, Any] | None = None
    """Anything else the application wants to carry along."""


@dataclass(frozen=True)
class TurnContextArgs:
    """What ``collect(args)`` gets: the turn's ``ctx``, conversation, input and history."""

    ctx: Any
    conversation: TurnConversation
    input: str
    history: list[TurnHistoryEntry]


@dataclass(frozen=True)
class TurnContextProvider:
    """A named source of context sections; build one with :func:`define_turn_context`."""

    name: str
    collect: Callable[[TurnContextArgs], Any]
    """``collect(args)``: a :class:`TurnContext`, a dict of its fields, a list of either or
    ``None``; sync or async."""
    optional: bool = False
    """An optional provider that fails is logged and skipped; a required one fails the turn."""


def define_turn_context(
    *,
    name: str,
    collect: Callable[[TurnContextArgs], Any],
    optional: bool = False,
) -> TurnContextProvider:
    """A context provider (required unless ``optional``).

    Raises:
        InvalidArgumentError: ``name`` is blank ("turn context provider name is required"),
            ``collect`` is not callable, or ``optional`` is not a bool.
    """
    if not isinstance(name, str) or not js_trim(name):
        raise InvalidArgumentError("turn context provider name is required")
    if not callable(collect):
        raise InvalidArgumentError(
            f"turn context provider {name} needs a callable collect(args), "
            f"got {type(collect).__name__}"
        )
    if not isinstance(optional, bool):
        raise InvalidArgumentError(
            f"turn context provider {name}: optional must be a bool, got {optional!r}"
        )
    return TurnContextProvider(name=js_trim(name), collect=collect, optional=optional)


def _as_provider(provider: object) -> TurnContextProvider:
    if isinstance(provider, TurnContextProvider):
        return provider
    if isinstance(provider, Mapping):
        return define_turn_context(
            name=provider.get("name", ""),
            collect=provider.get("collect", None),
            optional=provider.get("optional", False),
        )
    raise InvalidArgumentError(
        "turn context providers must be made with define_turn_context(), "
        f"got {type(provider).__name__}"
    )


def _empty(name: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"turn context provider {name} returned an empty section")


def _section(item: object, name: str) -> TurnContext:
    """One returned section, validated and with ``id``/``label``/``content``/``source`` trimmed."""
    if isinstance(item, TurnContext):
        block = item
    elif isinstance(item, Mapping):
        for key in ("id", "label", "content"):
            value = item.get(key)
            if value is None or (isinstance(value, str) and not js_trim(value)):
                raise _empty(name)
        try:
            block = TurnContext.model_validate(dict(item))
        except ValidationError as exc:
            raise InvalidArgumentError(
                f"turn context provider {name} returned an invalid section: {exc}"
            ) from exc
    else:
        raise InvalidArgumentError(
            f"turn context provider {name} returned a {type(item).__name__} section; "
            "return a TurnContext or a dict of its fields"
        )
    ident, label, content = js_trim(block.id), js_trim(block.label), js_trim(block.content)
    if not ident or not label or not content:
        raise _empty(name)
    source = None if block.source is None else js_trim(block.source)
    return block.model_copy(
        update={"id": ident, "label": label, "content": content, "source": source}
    )


def _sections(value: object, name: str) -> list[TurnContext]:
    if value is None:
        return []
    if isinstance(value, TurnContext | Mapping):
        return [_section(value, name)]
    if isinstance(value, list | tuple):
        return [_section(item, name) for item in value]
    raise InvalidArgumentError(
        f"turn context provider {name} returned {type(value).__name__}; return a "
        "TurnContext, a dict of its fields, a list of them or None"
    )


async def _collect(provider: TurnContextProvider, args: TurnContextArgs) -> list[TurnContext]:
    return _sections(await maybe_await(provider.collect(args)), provider.name)


async def collect_turn_context(
    providers: Sequence[TurnContextProvider],
    args: TurnContextArgs,
) -> list[TurnContext]:
    """Run ``providers`` concurrently; their sections, flattened in provider order.

    A provider error (including a bad section) is logged as
    ``turn-kit.context-provider-failed`` (``warn`` for an optional provider, else
    ``error``). An optional provider then contributes nothing; a required one makes this
    raise its original exception (the first to fail; the others are cancelled). Logs
    ``turn-kit.context-collected {providers, sections}``.

    Raises:
        InvalidArgumentError: two sections share an id ("duplicate turn context id: <id>",
            not logged, even when an optional provider returned them), or a provider is
            not one.
        Exception: the error of a failed required provider, as raised.
    """
    if isinstance(args, Mapping):
        args = TurnContextArgs(**args)
    if isinstance(providers, TurnContextProvider | str | bytes):
        raise InvalidArgumentError("turn context providers must be a list of providers")
    checked = [_as_provider(provider) for provider in providers]
    results: list[list[TurnContext]] = [[] for _ in checked]
    failures: list[BaseException] = []

    async with anyio.create_task_group() as group:

        async def run(index: int, provider: TurnContextProvider) -> None:
            try:
                results[index] = await _collect(provider, args)
            except Exception as exc:
                log_event(
                    args.ctx,
                    "warn" if provider.optional else "error",
                    "context-provider-failed",
                    provider=provider.name,
                    optional=provider.optional,
                    error=str(exc),
                )
                if not provider.optional:
                    failures.append(exc)
                    group.cancel_scope.cancel()
            except anyio.get_cancelled_exc_class():
                raise
            except BaseException as exc:  # a control-flow signal (a pause, a restore)
                failures.append(exc)
                group.cancel_scope.cancel()

        for index, provider in enumerate(checked):
            group.start_soon(run, index, provider, name=f"turn-context:{provider.name}")

    if failures:
        raise failures[0]
    sections = [section for result in results for section in result]
    seen: set[str] = set()
    for section in sections:
        if section.id in seen:
            raise InvalidArgumentError(f"duplicate turn context id: {section.id}")
        seen.add(section.id)
    log_event(args.ctx, "info", "context-collected", providers=len(checked), sections=len(sections))
    return sections
