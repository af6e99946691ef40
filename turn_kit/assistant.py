"""The assistant bridge: a turn's identity, instructions and context, assembled for a harness.

:func:`assemble_assistant_turn_context` turns Workforce-style turn material (recalled history,
exact context-provider blocks, a conversation) into a :class:`TurnContextAssembly`: the
assistant's identity, instruction segments (system, developer, guardrail), prepared context
blocks, provenance and a ``harness_projection`` (a system prompt, a developer prompt and
category-free context blocks) ready for a model call.

The assembly rules are those of ``@agent-assistant/turn-context`` (memory capped at 10 blocks,
enrichment at 8, guardrails in the developer prompt, priorities high to low), implemented here
by :class:`TurnContextAssembler`, since no Python package provides them.

    assembly = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="my-agent",
            turn_id=message_id,
            conversation=conversation,
            identity=AssistantIdentity(base_prompt="You are a helpful assistant."),
            history=history,
            context=context,
        )
    )
    assembly.harness_projection.instructions.system_prompt

Inputs may be models or dicts of their fields (snake_case). Guardrails are a list of
:class:`Guardrail` or the seed's ``{"overlays": [...]}`` (:class:`GuardrailInput`). A dict input
that does not validate raises :class:`~agency_runtime.InvalidArgumentError` (a ``ValueError``)
naming the fields, with pydantic's ``ValidationError`` chained; the turn-context checks of the
spec (a blank id or prompt, a duplicate block id) raise :class:`TurnContextValidationError`, a
subclass of it.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from agency_runtime import DeferredModel, InvalidArgumentError
from turn_kit._context_providers import ContextCategory, ContextImportance, TurnContext
from turn_kit._errors import TurnKitError
from turn_kit._identity import TurnConversation, conversation_tag, js_trim

__all__ = [
    "MAX_ENRICHMENT_BLOCKS",
    "MAX_MEMORY_BLOCKS",
    "AssistantIdentity",
    "AssistantTurnInput",
    "ContextBlock",
    "EnrichmentCandidate",
    "Guardrail",
    "GuardrailInput",
    "HarnessContext",
    "HarnessContextBlock",
    "HarnessInstructions",
    "HarnessProjection",
    "IdentityProjection",
    "InstructionOverlay",
    "InstructionSegment",
    "MemoryCandidate",
    "MemoryInput",
    "MemoryRetrievalInput",
    "MemoryRetriever",
    "PreparedContext",
    "ResponseStyle",
    "SupportsAssemble",
    "TurnContextAssembler",
    "TurnContextAssembly",
    "TurnContextInput",
    "TurnContextProvenance",
    "TurnContextValidationError",
    "TurnSession",
    "TurnShaping",
    "assemble_assistant_turn_context",
    "project_to_harness",
]

MAX_MEMORY_BLOCKS = 10
"""At most this many memory candidates become context blocks in one turn."""

MAX_ENRICHMENT_BLOCKS = 8
"""At most this many enrichment candidates become context blocks in one turn."""

Priority = ContextImportance
BlockCategory = ContextCategory
SegmentKind = Literal["system", "developer", "guardrail"]

_PRIORITY_ORDER: dict[str, int] = {"low": 0, "medium": 1, "high": 2}
_BLOCK_FIELDS = ("id", "label", "content", "importance", "source", "category", "metadata")
_CANDIDATE_FIELDS = ("id", "text", "scope", "source", "relevance", "metadata")
_MAX_REPORTED_ERRORS = 10


class TurnContextValidationError(TurnKitError, InvalidArgumentError):
    """A turn's context input fails a turn-context check (a blank id or prompt, a duplicate id).

    These are the checks of ``@agent-assistant/turn-context`` (its ``TurnContextValidationError``,
    message ``TurnContext validation failed: <field> — <reason>``); ``field`` names the
    offending input field when there is one. Input of the wrong shape or type (a missing
    field, a number for a string) is reported by pydantic and raised as a plain
    :class:`~agency_runtime.InvalidArgumentError`, of which this class is a subclass: catch
    that (or ``ValueError``) for any bad input to the bridge.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _invalid(what: str, error: ValidationError) -> InvalidArgumentError:
    """``error`` as an InvalidArgumentError naming each failing field (``a.0.b: reason``)."""
    details = error.errors(include_url=False)
    parts = [
        f"{'.'.join(str(part) for part in detail['loc']) or '(input)'}: {detail['msg']}"
        for detail in details[:_MAX_REPORTED_ERRORS]
    ]
    if len(details) > _MAX_REPORTED_ERRORS:
        parts.append(f"and {len(details) - _MAX_REPORTED_ERRORS} more")
    return InvalidArgumentError(f"invalid {what}: {'; '.join(parts)}")


# ─── Inputs ──────────────────────────────────────────────────────────────────


def _coerce_block(value: Any) -> Any:
    """Accept any object with block attributes (a turn_kit ``TurnContext``, a dataclass)."""
    if isinstance(value, str | Mapping | ContextBlock):
        return value
    return {name: getattr(value, name) for name in _BLOCK_FIELDS if hasattr(value, name)}


def _coerce_candidate(value: Any) -> Any:
    if isinstance(value, Mapping | MemoryCandidate):
        return value
    return {name: getattr(value, name) for name in _CANDIDATE_FIELDS if hasattr(value, name)}


ContextBlock = TurnContext
"""One prepared context block (memory, session, enrichment or a provider's): a TurnContext."""


BlockLike = Annotated[ContextBlock, BeforeValidator(_coerce_block)]
"""A :class:`ContextBlock`, a dict, or any object with the block's attributes."""


class ResponseStyle(DeferredModel):
    """Response-format hints passed through to the harness."""

    model_config = ConfigDict()

    prefer_markdown: bool | None = None
    max_answer_chars: int | None = None


class InstructionOverlay(DeferredModel):
    """A developer-instruction overlay with an explicit id, source and priority."""

    model_config = ConfigDict(extra="forbid")

    id: str
    text: str
    source: str = "shaping"
    priority: Priority | None = None


class AssistantIdentity(DeferredModel):
    """The product-owned identity floor of the assistant.

    ``base_prompt`` is the system prompt; at least one of it and ``developer_prompt`` must be
    non-blank. ``overlays`` are developer instructions, ``mode`` adds ``Current mode: <mode>``.
    Traits of the form ``key:value`` (``voice:concise``, ``formality:casual``,
    ``proactivity:high``) also set expression defaults. The seed's
    ``base_instructions={"system_prompt": ..., "developer_prompt": ...}`` is accepted too.
    """

    model_config = ConfigDict(extra="forbid")

    assistant_name: str | None = None
    base_prompt: str | None = None
    developer_prompt: str | None = None
    overlays: list[str | InstructionOverlay] = Field(default_factory=list)
    traits: list[str] = Field(default_factory=list)
    mode: str | None = None
    response_style: ResponseStyle | None = None

    @model_validator(mode="before")
    @classmethod
    def _base_instructions(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "base_instructions" in data:
            data = dict(data)
            base = data.pop("base_instructions") or {}
            if not isinstance(base, Mapping):
                raise ValueError("base_instructions must be a mapping")
            unknown = set(base) - {"system_prompt", "developer_prompt"}
            if unknown:
                raise ValueError(f"unknown base_instructions keys: {sorted(unknown)}")
            data.setdefault("base_prompt", base.get("system_prompt"))
            data.setdefault("developer_prompt", base.get("developer_prompt"))
        return data


class TurnShaping(DeferredModel):
    """Turn-scoped shaping; its ``mode`` and ``response_style`` win over the identity's."""

    model_config = ConfigDict(extra="forbid")

    mode: str | None = None
    overlays: list[str | InstructionOverlay] = Field(default_factory=list)
    response_style: ResponseStyle | None = None
    expression_overrides: dict[str, str] = Field(default_factory=dict)


class TurnSession(DeferredModel):
    """Structured session continuity, rendered as one ``Session Context`` block."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["cold", "active", "resumed"] | None = None
    summary: str | None = None
    recent_unresolved_questions: list[str] = Field(default_factory=list)
    conversational_momentum: Priority | None = None


class Guardrail(DeferredModel):
    """A guardrail rule; it becomes a guardrail segment of the developer prompt.

    ``kind`` ``tone_constraint`` / ``sensitivity_constraint`` also caps humor. The fields are
    those of turn-context's ``TurnGuardrailOverlay`` (all one word, so the same in camelCase).
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    rule: str
    priority: Priority | None = None
    source: str = "guardrails"
    kind: str | None = None


class GuardrailInput(DeferredModel):
    """The seed's guardrails shape, ``{"overlays": [<guardrail>, ...]}`` (``TurnGuardrailInput``).

    Wherever guardrails are taken, this model, a dict of it or a plain list of
    :class:`Guardrail` (or their dicts) is accepted; ``None`` means none.
    """

    model_config = ConfigDict(extra="forbid")

    overlays: list[Guardrail] | None = None


def _coerce_guardrails(value: Any) -> Any:
    """Unwrap ``{"overlays": [...]}`` / :class:`GuardrailInput` into the list of guardrails.

    A dict is validated as :class:`GuardrailInput`, so its errors keep their place
    (``guardrails.overlays.0.rule``).
    """
    if value is None:
        return []
    if isinstance(value, Mapping):
        value = GuardrailInput.model_validate(value)
    if isinstance(value, GuardrailInput):
        return list(value.overlays or [])
    return value


Guardrails = Annotated[list[Guardrail], BeforeValidator(_coerce_guardrails)]
"""A list of :class:`Guardrail`, or the seed's ``{"overlays": [...]}``; stored as the list."""


class EnrichmentCandidate(DeferredModel):
    """Pre-packaged backstage context (a specialist memo, a snapshot) offered for the turn."""

    model_config = ConfigDict()

    id: str
    content: str
    label: str | None = None
    source: str | None = None
    relevance: float | None = None
    importance: Priority | None = None


class MemoryCandidate(DeferredModel):
    """A memory offered for the turn; the most relevant ten become ``memory-<id>`` blocks."""

    model_config = ConfigDict()

    id: str
    text: str
    scope: str | None = None
    source: str | None = None
    relevance: float | None = None
    metadata: dict[str, Any] | None = None


CandidateLike = Annotated[MemoryCandidate, BeforeValidator(_coerce_candidate)]


class MemoryRetrievalInput(DeferredModel):
    """What a memory retriever is asked: the turn, its session and the query text."""

    model_config = ConfigDict()

    assistant_id: str
    turn_id: str
    session_id: str | None = None
    user_id: str | None = None
    thread_id: str | None = None
    query: str | None = None
    metadata: dict[str, Any] | None = None


MemoryRetriever = Callable[[MemoryRetrievalInput], Awaitable[Iterable[Any]] | Iterable[Any]]
"""A sync or async callable returning memory candidates (models, dicts or objects)."""


class MemoryInput(DeferredModel):
    """Memory for one turn: given ``candidates`` bypass any retriever."""

    model_config = ConfigDict(extra="forbid")

    candidates: list[CandidateLike] | None = None
    retriever: MemoryRetriever | None = Field(default=None, exclude=True)
    query: str | None = None


class TurnContextInput(DeferredModel):
    """The input of :meth:`TurnContextAssembler.assemble`.

    ``guardrails`` is a list of :class:`Guardrail` or the seed's ``{"overlays": [...]}``.
    """

    model_config = ConfigDict(extra="forbid")

    assistant_id: str
    turn_id: str
    session_id: str | None = None
    user_id: str | None = None
    thread_id: str | None = None
    identity: AssistantIdentity
    shaping: TurnShaping | None = None
    session: TurnSession | list[str | BlockLike] | None = None
    memory: MemoryInput | None = None
    enrichment: list[EnrichmentCandidate] = Field(default_factory=list)
    guardrails: Guardrails = Field(default_factory=list)
    metadata: dict[str, Any] | None = None


def _history_content(entry: Any) -> Any:
    if isinstance(entry, Mapping):
        return entry.get("content")
    return getattr(entry, "content", None)


def _history_created_at(entry: Any) -> Any:
    if isinstance(entry, Mapping):
        value = entry.get("created_at")
        return entry.get("createdAt") if value is None else value
    value = getattr(entry, "created_at", None)
    return getattr(entry, "createdAt", None) if value is None else value


class AssistantTurnInput(DeferredModel):
    """The input of :func:`assemble_assistant_turn_context`.

    ``history`` holds oldest-first entries (turn_kit's ``TurnHistoryEntry``, dicts or objects
    with ``content`` and optional ``created_at`` / ``createdAt``); ``context`` the exact blocks
    of the context providers (``TurnContext``, dicts or objects). Without ``history`` the
    ``retriever`` (or the assembler's own) is asked for memory with ``query``. ``guardrails``
    is a list of :class:`Guardrail` or the seed's ``{"overlays": [...]}`` (kept as the list).
    """

    model_config = ConfigDict(extra="forbid")

    assistant_id: str
    turn_id: str
    conversation: TurnConversation
    identity: AssistantIdentity
    history: list[Any] | None = None
    context: list[BlockLike] | None = None
    user_id: str | None = None
    session_id: str | None = None
    thread_id: str | None = None
    session: TurnSession | list[str | BlockLike] | None = None
    shaping: TurnShaping | None = None
    guardrails: Guardrails = Field(default_factory=list)
    enrichment: list[EnrichmentCandidate] = Field(default_factory=list)
    retriever: MemoryRetriever | None = Field(default=None, exclude=True)
    query: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("history")
    @classmethod
    def _history_entries(cls, value: list[Any] | None) -> list[Any] | None:
        for index, entry in enumerate(value or []):
            content = _history_content(entry)
            if not isinstance(content, str):
                raise ValueError(
                    f"history entry {index} needs a string `content`, got {type(content).__name__}"
                )
        return value


# ─── Outputs ─────────────────────────────────────────────────────────────────


class IdentityProjection(DeferredModel):
    """A structural summary of the identity floor (not prompt text)."""

    model_config = ConfigDict()

    assistant_name: str | None = None
    traits_applied: bool
    identity_summary: list[str]


class InstructionSegment(DeferredModel):
    """One instruction: ``kind`` says which prompt it belongs to."""

    model_config = ConfigDict()

    id: str
    kind: SegmentKind
    source: str
    text: str
    priority: Priority | None = "medium"


class PreparedContext(DeferredModel):
    """The assembled context blocks (session, memory, enrichment, then provider blocks)."""

    model_config = ConfigDict()

    blocks: list[ContextBlock]
    structured: dict[str, Any] | None = None


class TurnContextProvenance(DeferredModel):
    """Which memory, enrichment and guardrail inputs the assembly used (or dropped)."""

    model_config = ConfigDict()

    used_memory_ids: list[str]
    used_enrichment_ids: list[str]
    used_guardrail_ids: list[str]
    dropped_enrichment_ids: list[str] | None = None


class HarnessInstructions(DeferredModel):
    """The prompts a harness sends: ``system_prompt`` is ``''`` when there is none."""

    model_config = ConfigDict()

    system_prompt: str
    developer_prompt: str | None = None
    response_style: ResponseStyle | None = None


class HarnessContextBlock(DeferredModel):
    """A context block as the harness sees it: no category, no metadata."""

    model_config = ConfigDict()

    id: str
    label: str
    content: str
    importance: Priority | None = None
    source: str | None = None


class HarnessContext(DeferredModel):
    """The harness's context: blocks and optional structured data."""

    model_config = ConfigDict()

    blocks: list[HarnessContextBlock]
    structured: dict[str, Any] | None = None


class HarnessProjection(DeferredModel):
    """Instructions and context in the harness's shape."""

    model_config = ConfigDict()

    instructions: HarnessInstructions
    context: HarnessContext


class TurnContextAssembly(DeferredModel):
    """The assembled turn: identity, expression, instructions, context, provenance, projection."""

    model_config = ConfigDict()

    assistant_id: str
    turn_id: str
    session_id: str | None = None
    user_id: str | None = None
    thread_id: str | None = None
    identity: IdentityProjection
    expression: dict[str, Any]
    instructions: list[InstructionSegment]
    context: PreparedContext
    provenance: TurnContextProvenance
    harness_projection: HarnessProjection
    metadata: dict[str, Any] | None = None


# ─── Projection ──────────────────────────────────────────────────────────────


def _sort_by_priority(segments: Iterable[InstructionSegment]) -> list[InstructionSegment]:
    return sorted(segments, key=lambda s: -_PRIORITY_ORDER[s.priority or "medium"])


def _join(segments: Iterable[InstructionSegment]) -> str:
    texts = (js_trim(segment.text) for segment in segments)
    return "\n\n".join(text for text in texts if text)


def project_to_harness(
    instructions: Sequence[InstructionSegment],
    context: PreparedContext,
    response_style: ResponseStyle | None = None,
) -> HarnessProjection:
    """Project instruction segments and context blocks into the harness's shape.

    ``system_prompt``: the system segments, stably sorted high to low priority, trimmed, blank
    ones dropped, joined with a blank line (``''`` when none). ``developer_prompt``: the
    developer segments, then the guardrail segments, each group sorted the same way; ``None``
    when there are neither. Blocks lose their ``category`` and ``metadata``.
    """
    system = [s for s in instructions if s.kind == "system"]
    developer = _sort_by_priority(s for s in instructions if s.kind == "developer")
    guardrail = _sort_by_priority(s for s in instructions if s.kind == "guardrail")
    parts = [*developer, *guardrail]
    return HarnessProjection(
        instructions=HarnessInstructions(
            system_prompt=_join(_sort_by_priority(system)),
            developer_prompt=_join(parts) if parts else None,
            response_style=response_style.model_copy() if response_style is not None else None,
        ),
        context=HarnessContext(
            blocks=[
                HarnessContextBlock(
                    id=block.id,
                    label=block.label,
                    content=block.content,
                    importance=block.importance,
                    source=block.source,
                )
                for block in context.blocks
            ],
            structured=dict(context.structured) if context.structured is not None else None,
        ),
    )


# ─── The assembler ───────────────────────────────────────────────────────────


@runtime_checkable
class SupportsAssemble(Protocol):
    """Anything with ``async assemble(TurnContextInput) -> TurnContextAssembly``."""

    async def assemble(self, input: TurnContextInput) -> TurnContextAssembly:
        """Assemble one turn's context."""
        ...


def _blank(text: str | None) -> bool:
    return text is None or not js_trim(text)


def _validate(input: TurnContextInput) -> None:
    if _blank(input.assistant_id):
        raise TurnContextValidationError(
            "TurnContext validation failed: assistant_id — must be a non-empty string",
            field="assistant_id",
        )
    if _blank(input.turn_id):
        raise TurnContextValidationError(
            "TurnContext validation failed: turn_id — must be a non-empty string",
            field="turn_id",
        )
    identity = input.identity
    if _blank(identity.base_prompt) and _blank(identity.developer_prompt):
        raise TurnContextValidationError(
            "TurnContext validation failed: identity — at least one of base_prompt (system) or "
            "developer_prompt must be a non-empty string",
            field="identity",
        )


def _trait_map(traits: Sequence[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for trait in traits:
        key, sep, value = trait.partition(":")
        if sep:
            pairs[js_trim(key).lower().replace("-", "_")] = js_trim(value).lower()
    return pairs


def _cap(current: str | None, cap: str, order: Sequence[str]) -> str:
    if current is None:
        return cap
    if current not in order:
        return current
    return current if order.index(current) <= order.index(cap) else cap


def _resolve_expression(input: TurnContextInput) -> dict[str, Any]:
    """Traits defaults, then shaping overrides, session nudges and guardrail downgrades."""
    profile: dict[str, str] = {}
    traits = _trait_map(input.identity.traits)
    if traits:
        voice = traits.get("voice")
        directness = {"concise": "high", "verbose": "low", "balanced": "medium"}.get(voice or "")
        if directness:
            profile["directness"] = directness
        formality = traits.get("formality")
        if formality in ("formal", "professional"):
            profile.update(warmth="medium", humor="light")
        elif formality == "casual":
            profile.update(warmth="high", humor="normal")
        elif formality == "friendly":
            profile.update(warmth="high", humor="light")
        proactivity = traits.get("proactivity")
        if proactivity in ("low", "medium", "high"):
            profile["initiative"] = proactivity
        profile["explanation_density"] = {"concise": "low", "verbose": "high"}.get(
            voice or "", "medium"
        )
    if input.shaping is not None:
        profile.update(input.shaping.expression_overrides)
    if isinstance(input.session, TurnSession):
        if input.session.state == "cold" and "explanation_density" not in profile:
            profile["explanation_density"] = "medium"
        if (
            input.session.conversational_momentum == "low"
            and profile.get("explanation_density") == "low"
        ):
            profile["explanation_density"] = "medium"
    for guardrail in input.guardrails:
        if guardrail.kind in ("tone_constraint", "sensitivity_constraint"):
            cap = "off" if guardrail.priority == "high" else "light"
            profile["humor"] = _cap(profile.get("humor"), cap, ("off", "light", "normal"))
    expression: dict[str, Any] = {}
    if profile.get("tone"):
        expression["tone"] = profile["tone"]
    expression.update(
        directness=profile.get("directness", "medium"),
        warmth=profile.get("warmth", "medium"),
        humor=profile.get("humor", "light"),
        initiative=profile.get("initiative", "medium"),
        explanation_density=profile.get("explanation_density", "medium"),
    )
    return expression


def _resolve_identity(identity: AssistantIdentity) -> IdentityProjection:
    summary: list[str] = []
    if identity.assistant_name:
        summary.append(f"name:{identity.assistant_name}")
    traits = [js_trim(trait) for trait in identity.traits]
    summary.extend(trait for trait in traits if trait)
    if not _blank(identity.base_prompt):
        summary.append("base:system-prompt-present")
    if not _blank(identity.developer_prompt):
        summary.append("base:developer-prompt-present")
    return IdentityProjection(
        assistant_name=identity.assistant_name,
        traits_applied=bool(identity.traits),
        identity_summary=summary,
    )


def _overlay_segments(
    overlays: Sequence[str | InstructionOverlay], source: str, start: int
) -> list[InstructionSegment]:
    segments: list[InstructionSegment] = []
    for offset, overlay in enumerate(overlays):
        if isinstance(overlay, str):
            segments.append(
                InstructionSegment(
                    id=f"overlay-{start + offset + 1}",
                    kind="developer",
                    source=source,
                    text=overlay,
                    priority="medium",
                )
            )
        else:
            segments.append(
                InstructionSegment(
                    id=overlay.id,
                    kind="developer",
                    source=overlay.source,
                    text=overlay.text,
                    priority=overlay.priority or "medium",
                )
            )
    return segments


def _compose_instructions(input: TurnContextInput) -> list[InstructionSegment]:
    identity = input.identity
    shaping = input.shaping
    segments: list[InstructionSegment] = []
    if identity.base_prompt is not None and not _blank(identity.base_prompt):
        segments.append(
            InstructionSegment(
                id="base-system",
                kind="system",
                source="identity",
                text=identity.base_prompt,
                priority="high",
            )
        )
    if identity.developer_prompt is not None and not _blank(identity.developer_prompt):
        segments.append(
            InstructionSegment(
                id="base-developer",
                kind="developer",
                source="identity",
                text=identity.developer_prompt,
                priority="high",
            )
        )
    segments.extend(_overlay_segments(identity.overlays, "identity", 0))
    if shaping is not None:
        segments.extend(_overlay_segments(shaping.overlays, "shaping", len(identity.overlays)))
    mode = shaping.mode if shaping is not None and shaping.mode else identity.mode
    if mode:
        segments.append(
            InstructionSegment(
                id="shaping-mode",
                kind="developer",
                source="shaping",
                text=f"Current mode: {mode}",
                priority="medium",
            )
        )
    segments.extend(
        InstructionSegment(
            id=guardrail.id,
            kind="guardrail",
            source=guardrail.source,
            text=guardrail.rule,
            priority=guardrail.priority or "medium",
        )
        for guardrail in input.guardrails
    )
    return segments


def _relevance(value: float | None) -> float:
    return 0.0 if value is None or math.isnan(value) else value


def _memory_blocks(candidates: Sequence[MemoryCandidate]) -> tuple[list[ContextBlock], list[str]]:
    ranked = sorted(candidates, key=lambda c: -_relevance(c.relevance))[:MAX_MEMORY_BLOCKS]
    blocks = [
        ContextBlock(
            id=f"memory-{candidate.id}",
            label=f"Memory [{candidate.scope}]" if candidate.scope else "Memory",
            content=candidate.text,
            source=candidate.source if candidate.source is not None else candidate.scope,
            category="memory",
        )
        for candidate in ranked
    ]
    return blocks, [candidate.id for candidate in ranked]


def _enrichment_blocks(
    candidates: Sequence[EnrichmentCandidate],
) -> tuple[list[ContextBlock], list[str], list[str]]:
    ranked = sorted(candidates, key=lambda c: -_relevance(c.relevance))
    selected, dropped = ranked[:MAX_ENRICHMENT_BLOCKS], ranked[MAX_ENRICHMENT_BLOCKS:]
    blocks = [
        ContextBlock(
            id=f"enrichment-{candidate.id}",
            label=candidate.label
            or (f"Enrichment from {candidate.source}" if candidate.source else "Enrichment"),
            content=candidate.content,
            importance=candidate.importance,
            source=candidate.source,
            category="enrichment",
        )
        for candidate in selected
    ]
    return blocks, [c.id for c in selected], [c.id for c in dropped]


def _session_blocks(input: TurnContextInput) -> list[ContextBlock]:
    session = input.session
    if session is None:
        return []
    block_id = f"session-{input.session_id if input.session_id is not None else input.turn_id}"
    parts: list[str] = []
    extra: list[ContextBlock] = []
    if isinstance(session, TurnSession):
        if session.state:
            parts.append(f"State: {session.state}")
        if session.summary:
            parts.append(f"Summary: {session.summary}")
        if session.recent_unresolved_questions:
            parts.append(f"Unresolved: {'; '.join(session.recent_unresolved_questions)}")
        if session.conversational_momentum:
            parts.append(f"Momentum: {session.conversational_momentum}")
    else:
        for item in session:
            if isinstance(item, str):
                if js_trim(item):
                    parts.append(item)
            else:
                extra.append(
                    item.model_copy(
                        update={
                            "category": "session",
                            "source": item.source if item.source is not None else "session",
                        }
                    )
                )
    blocks: list[ContextBlock] = []
    if parts:
        blocks.append(
            ContextBlock(
                id=block_id,
                label="Session Context",
                content="\n".join(parts),
                source="session",
                category="session",
            )
        )
    return [*blocks, *extra]


async def _call_retriever(
    retriever: MemoryRetriever, query: MemoryRetrievalInput
) -> list[MemoryCandidate]:
    result = retriever(query)
    if inspect.isawaitable(result):
        result = await result
    try:
        return MemoryInput.model_validate({"candidates": list(result)}).candidates or []
    except ValidationError as exc:
        raise _invalid("memory from the retriever", exc) from exc


class TurnContextAssembler:
    """The turn-context assembly rules.

    Validates the input (``assistant_id``, ``turn_id`` and a non-blank system or developer
    prompt), resolves identity and expression, composes instruction segments (system: the
    base prompt; developer: the developer prompt, overlays, then ``Current mode: <mode>``;
    guardrail: the rules), projects session, memory (stably sorted by relevance, at most
    :data:`MAX_MEMORY_BLOCKS`) and enrichment (at most :data:`MAX_ENRICHMENT_BLOCKS`, the rest
    reported as dropped) into blocks, records provenance and the harness projection.

    ``retriever`` is asked for memory when the input carries no ``memory.candidates`` (and no
    retriever of its own).
    """

    def __init__(self, *, retriever: MemoryRetriever | None = None) -> None:
        self.retriever = retriever

    async def _memory_candidates(self, input: TurnContextInput) -> list[MemoryCandidate]:
        memory = input.memory
        if memory is not None and memory.candidates is not None:
            return list(memory.candidates)
        retriever = memory.retriever if memory is not None and memory.retriever else None
        retriever = retriever or self.retriever
        if retriever is None:
            return []
        return await _call_retriever(
            retriever,
            MemoryRetrievalInput(
                assistant_id=input.assistant_id,
                turn_id=input.turn_id,
                session_id=input.session_id,
                user_id=input.user_id,
                thread_id=input.thread_id,
                query=memory.query if memory is not None else None,
                metadata=input.metadata,
            ),
        )

    async def assemble(self, input: TurnContextInput | Mapping[str, Any]) -> TurnContextAssembly:
        """Assemble one turn's context from ``input`` (a model or its dict).

        Raises:
            InvalidArgumentError: a dict ``input`` does not validate (the message names the
                fields, pydantic's error is chained), or the retriever returned candidates
                that do not.
            TurnContextValidationError: ``assistant_id`` or ``turn_id`` is blank, or the
                identity has neither a system nor a developer prompt.
        """
        if not isinstance(input, TurnContextInput):
            try:
                input = TurnContextInput.model_validate(input)
            except ValidationError as exc:
                raise _invalid("turn context input", exc) from exc
        _validate(input)
        instructions = _compose_instructions(input)
        memory_blocks, used_memory_ids = _memory_blocks(await self._memory_candidates(input))
        enrichment_blocks, used_enrichment_ids, dropped_enrichment_ids = _enrichment_blocks(
            input.enrichment
        )
        context = PreparedContext(
            blocks=[*_session_blocks(input), *memory_blocks, *enrichment_blocks]
        )
        shaping = input.shaping
        response_style = (
            shaping.response_style
            if shaping is not None and shaping.response_style is not None
            else input.identity.response_style
        )
        return TurnContextAssembly(
            assistant_id=input.assistant_id,
            turn_id=input.turn_id,
            session_id=input.session_id,
            user_id=input.user_id,
            thread_id=input.thread_id,
            identity=_resolve_identity(input.identity),
            expression=_resolve_expression(input),
            instructions=instructions,
            context=context,
            provenance=TurnContextProvenance(
                used_memory_ids=used_memory_ids,
                used_enrichment_ids=used_enrichment_ids,
                used_guardrail_ids=[guardrail.id for guardrail in input.guardrails],
                dropped_enrichment_ids=dropped_enrichment_ids,
            ),
            harness_projection=project_to_harness(instructions, context, response_style),
            metadata=dict(input.metadata) if input.metadata is not None else None,
        )


# ─── The bridge ──────────────────────────────────────────────────────────────


def _history_candidates(turn_id: str, history: Sequence[Any]) -> list[MemoryCandidate]:
    candidates: list[MemoryCandidate] = []
    for index, entry in enumerate(history):
        metadata: dict[str, Any] = {}
        created_at = _history_created_at(entry)
        if created_at is not None:
            metadata["created_at"] = created_at
        metadata["chronological_index"] = index
        candidates.append(
            MemoryCandidate(
                id=f"{turn_id}:history:{index + 1}",
                text=_history_content(entry),
                scope="session",
                source="workforce-memory",
                metadata=metadata,
            )
        )
    return candidates


def _turn_context_input(data: AssistantTurnInput) -> TurnContextInput:
    """The assembler's input for a bridge call (history as memory candidates, default ids)."""
    conversation = data.conversation
    memory: MemoryInput | None = None
    if data.history is not None:
        memory = MemoryInput(candidates=_history_candidates(data.turn_id, data.history))
    elif data.retriever is not None or data.query is not None:
        memory = MemoryInput(retriever=data.retriever, query=data.query)
    return TurnContextInput(
        assistant_id=data.assistant_id,
        turn_id=data.turn_id,
        session_id=(
            data.session_id
            if data.session_id is not None
            else conversation_tag(data.assistant_id, conversation)
        ),
        user_id=data.user_id,
        thread_id=data.thread_id if data.thread_id is not None else conversation.id,
        identity=data.identity,
        shaping=data.shaping,
        session=data.session,
        memory=memory,
        enrichment=data.enrichment,
        guardrails=data.guardrails,
        metadata={
            **data.metadata,
            "workforce_transport": conversation.transport,
            "workforce_conversation_id": conversation.id,
        },
    )


async def assemble_assistant_turn_context(
    input: AssistantTurnInput | Mapping[str, Any],
    *,
    assembler: SupportsAssemble | None = None,
) -> TurnContextAssembly:
    """Assemble a Workforce turn (history, provider blocks, conversation) for an assistant.

    History entry ``i`` becomes memory candidate ``<turn_id>:history:<i+1>`` (scope
    ``session``, source ``workforce-memory``, metadata ``created_at`` when known and
    ``chronological_index``); given history bypasses any retriever. ``session_id`` defaults
    to ``conversation_tag(assistant_id, conversation)`` (computed only then), ``thread_id`` to
    the conversation id, and ``metadata`` gains ``workforce_transport`` and
    ``workforce_conversation_id``. The ``context`` blocks follow the assembled session, memory
    and enrichment blocks; a repeated block id raises :class:`TurnContextValidationError`.

    Raises:
        InvalidArgumentError: a dict ``input`` does not validate (the message names each
            failing field, e.g. ``guardrails.overlays.0.rule: Field required``, and pydantic's
            ``ValidationError`` is chained), the retriever returned invalid candidates, or
            ``session_id`` is left to default and ``assistant_id`` is not a lowercase slug.
        TurnContextValidationError: a blank ``assistant_id``, ``turn_id`` or prompt, or a
            repeated block id (the spec's checks; a subclass of ``InvalidArgumentError``).
    """
    if isinstance(input, AssistantTurnInput):
        data = input
    else:
        try:
            data = AssistantTurnInput.model_validate(input)
        except ValidationError as exc:
            raise _invalid("assistant turn input", exc) from exc
    if _blank(data.assistant_id):
        raise TurnContextValidationError(
            "TurnContext validation failed: assistant_id — must be a non-empty string",
            field="assistant_id",
        )
    engine: SupportsAssemble = assembler if assembler is not None else TurnContextAssembler()
    try:
        turn = _turn_context_input(data)
    except ValidationError as exc:  # fields of a model built without validation, or changed
        raise _invalid("assistant turn input", exc) from exc
    assembly = await engine.assemble(turn)
    if not data.context:
        return assembly

    blocks = [*assembly.context.blocks, *(block.model_copy() for block in data.context)]
    seen: set[str] = set()
    for block in blocks:
        if block.id in seen:
            raise TurnContextValidationError(
                f"duplicate assembled turn context id: {block.id}", field="context"
            )
        seen.add(block.id)
    context = assembly.context.model_copy(update={"blocks": blocks})
    return assembly.model_copy(
        update={
            "context": context,
            "harness_projection": project_to_harness(
                assembly.instructions,
                context,
                assembly.harness_projection.instructions.response_style,
            ),
        }
    )
