"""turn_kit.assistant: the bridge (assistant.test.ts) and the turn-context assembler rules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest

from agency_runtime import InvalidArgumentError
from turn_kit._errors import TurnKitError
from turn_kit._identity import TurnConversation
from turn_kit.assistant import (
    MAX_ENRICHMENT_BLOCKS,
    MAX_MEMORY_BLOCKS,
    AssistantIdentity,
    AssistantTurnInput,
    EnrichmentCandidate,
    Guardrail,
    GuardrailInput,
    InstructionOverlay,
    MemoryCandidate,
    MemoryInput,
    MemoryRetrievalInput,
    ResponseStyle,
    TurnContextAssembler,
    TurnContextAssembly,
    TurnContextInput,
    TurnContextValidationError,
    TurnSession,
    TurnShaping,
    assemble_assistant_turn_context,
)

pytestmark = pytest.mark.anyio

IDENTITY = AssistantIdentity(base_prompt="You are a helpful assistant.")


def turn_input(**overrides: Any) -> TurnContextInput:
    fields: dict[str, Any] = {
        "assistant_id": "assistant-1",
        "turn_id": "turn-1",
        "identity": IDENTITY,
    }
    fields.update(overrides)
    return TurnContextInput(**fields)


# ─── assistant.test.ts ───────────────────────────────────────────────────────


async def test_bridge_reuses_turn_context_assembly_and_harness_projection() -> None:
    assembly = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="life-agent",
            turn_id="telegram-update-42",
            conversation=TurnConversation(transport="telegram", id="8587:7"),
            identity=AssistantIdentity(
                assistant_name="Life Agent", base_prompt="You are a personal life assistant."
            ),
            shaping=TurnShaping(
                mode="personal-assistance", response_style=ResponseStyle(prefer_markdown=True)
            ),
            history=[
                {
                    "content": "User: Add the flight task\nAssistant: Added it.",
                    "created_at": "2026-07-24T10:00:00.000Z",
                }
            ],
            context=[
                {
                    "id": "open-tasks",
                    "label": "Open tasks",
                    "content": "#5 Book the hotel",
                    "source": "github",
                    "category": "workspace",
                }
            ],
            guardrails=[
                Guardrail(
                    id="confirmed-writes",
                    source="workforce",
                    rule="Only claim a write succeeded after its provider receipt.",
                    kind="truthfulness_constraint",
                    priority="high",
                )
            ],
        )
    )

    assert assembly.session_id == "turn:life-agent:telegram:8587%3A7"
    assert assembly.provenance.used_memory_ids == ["telegram-update-42:history:1"]
    assert assembly.provenance.used_guardrail_ids == ["confirmed-writes"]
    assert [block.id for block in assembly.context.blocks] == [
        "memory-telegram-update-42:history:1",
        "open-tasks",
    ]
    assert assembly.harness_projection.context.blocks[-1].content == "#5 Book the hotel"
    assert "provider receipt" in (assembly.harness_projection.instructions.developer_prompt or "")


async def test_bridge_rejects_ids_that_collide_with_assembled_memory_blocks() -> None:
    with pytest.raises(TurnContextValidationError, match="duplicate assembled turn context id"):
        await assemble_assistant_turn_context(
            {
                "assistant_id": "life-agent",
                "turn_id": "turn-1",
                "conversation": {"transport": "telegram", "id": "8587"},
                "identity": {"base_instructions": {"system_prompt": "Be helpful."}},
                "history": [{"content": "Earlier turn"}],
                "context": [
                    {
                        "id": "memory-turn-1:history:1",
                        "label": "Collision",
                        "content": "This id is already used.",
                    }
                ],
            }
        )


# ─── The bridge ──────────────────────────────────────────────────────────────


@dataclass
class HistoryRecord:
    content: str
    created_at: datetime | None = None


@dataclass
class ProviderBlock:
    id: str
    label: str
    content: str
    importance: str | None = None
    source: str | None = None
    category: str | None = None
    metadata: dict[str, Any] | None = None


async def test_bridge_maps_history_entries_to_session_memory_candidates() -> None:
    stamp = datetime(2026, 7, 24, 10, tzinfo=UTC)
    seen: list[TurnContextInput] = []

    class Recording(TurnContextAssembler):
        async def assemble(self, input: Any) -> TurnContextAssembly:
            seen.append(input)
            return await super().assemble(input)

    assembly = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="joke-bot",
            turn_id="t9",
            conversation=TurnConversation(transport="slack", id="C1:171.2"),
            identity=IDENTITY,
            history=[
                HistoryRecord("first", stamp),
                {"content": "second", "createdAt": "2026-07-24T11:00:00Z"},
                HistoryRecord("third"),
            ],
            metadata={"origin": "test"},
        ),
        assembler=Recording(),
    )

    memory = seen[0].memory
    assert memory is not None
    assert memory.candidates == [
        MemoryCandidate(
            id="t9:history:1",
            text="first",
            scope="session",
            source="workforce-memory",
            metadata={"created_at": stamp, "chronological_index": 0},
        ),
        MemoryCandidate(
            id="t9:history:2",
            text="second",
            scope="session",
            source="workforce-memory",
            metadata={"created_at": "2026-07-24T11:00:00Z", "chronological_index": 1},
        ),
        MemoryCandidate(
            id="t9:history:3",
            text="third",
            scope="session",
            source="workforce-memory",
            metadata={"chronological_index": 2},
        ),
    ]
    assert assembly.provenance.used_memory_ids == ["t9:history:1", "t9:history:2", "t9:history:3"]
    assert [block.label for block in assembly.context.blocks] == ["Memory [session]"] * 3
    assert {block.source for block in assembly.context.blocks} == {"workforce-memory"}
    assert assembly.session_id == "turn:joke-bot:slack:C1%3A171.2"
    assert assembly.thread_id == "C1:171.2"
    assert assembly.metadata == {
        "origin": "test",
        "workforce_transport": "slack",
        "workforce_conversation_id": "C1:171.2",
    }


async def test_bridge_uses_given_session_and_thread_ids_without_computing_the_tag() -> None:
    conversation = TurnConversation(transport="telegram", id="8587")
    # "Not A Slug" would make conversation_tag raise; a given session id never computes it.
    assembly = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="Not A Slug",
            turn_id="t1",
            conversation=conversation,
            identity=IDENTITY,
            session_id="sessions:abc",
            thread_id="thread-9",
            user_id="u-1",
        )
    )
    assert (assembly.session_id, assembly.thread_id, assembly.user_id) == (
        "sessions:abc",
        "thread-9",
        "u-1",
    )

    with pytest.raises(InvalidArgumentError, match="lowercase slug"):
        await assemble_assistant_turn_context(
            AssistantTurnInput(
                assistant_id="Not A Slug",
                turn_id="t1",
                conversation=conversation,
                identity=IDENTITY,
            )
        )


async def test_bridge_returns_the_assembly_as_is_without_context() -> None:
    produced: list[TurnContextAssembly] = []

    class Keeping(TurnContextAssembler):
        async def assemble(self, input: Any) -> TurnContextAssembly:
            assembly = await super().assemble(input)
            produced.append(assembly)
            return assembly

    base = {
        "assistant_id": "life-agent",
        "turn_id": "t1",
        "conversation": {"transport": "telegram", "id": "8587"},
        "identity": IDENTITY,
    }
    assert await assemble_assistant_turn_context(base, assembler=Keeping()) is produced[-1]
    result = await assemble_assistant_turn_context({**base, "context": []}, assembler=Keeping())
    assert result is produced[-1]


async def test_bridge_appends_provider_blocks_after_session_memory_and_enrichment() -> None:
    assembly = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="hn-monitor",
            turn_id="t1",
            conversation=TurnConversation(transport="telegram", id="42"),
            identity=IDENTITY,
            session=TurnSession(state="active", summary="Reviewing the digest."),
            history=[{"content": "Earlier turn"}],
            enrichment=[EnrichmentCandidate(id="memo", content="A memo.", source="reviewer")],
            context=[
                ProviderBlock(
                    id="digest",
                    label="Digest",
                    content="3 stories",
                    importance="high",
                    source="hn",
                    category="workspace",
                    metadata={"fetched": 1},
                )
            ],
        )
    )
    assert [block.id for block in assembly.context.blocks] == [
        "session-turn:hn-monitor:telegram:42",
        "memory-t1:history:1",
        "enrichment-memo",
        "digest",
    ]
    provider = assembly.context.blocks[-1]
    assert (provider.category, provider.metadata) == ("workspace", {"fetched": 1})
    assert [block.id for block in assembly.harness_projection.context.blocks] == [
        block.id for block in assembly.context.blocks
    ]
    assert assembly.harness_projection.context.blocks[-1].model_dump() == {
        "id": "digest",
        "label": "Digest",
        "content": "3 stories",
        "importance": "high",
        "source": "hn",
    }


async def test_bridge_rejects_duplicate_ids_among_provider_blocks() -> None:
    block = {"id": "same", "label": "A", "content": "a"}
    with pytest.raises(
        TurnContextValidationError, match="duplicate assembled turn context id: same"
    ):
        await assemble_assistant_turn_context(
            AssistantTurnInput(
                assistant_id="life-agent",
                turn_id="t1",
                conversation=TurnConversation(transport="telegram", id="1"),
                identity=IDENTITY,
                context=[block, block],
            )
        )


async def test_bridge_rejects_history_entries_without_string_content() -> None:
    with pytest.raises(pydantic.ValidationError, match="history entry 0"):
        AssistantTurnInput(
            assistant_id="life-agent",
            turn_id="t1",
            conversation=TurnConversation(transport="telegram", id="1"),
            identity=IDENTITY,
            history=[{"text": "no content key"}],
        )


# ─── Turn-context: memory retrieval and scopes ───────────────────────────────


async def test_retriever_is_used_without_history_and_scopes_map_into_labels() -> None:
    asked: list[MemoryRetrievalInput] = []

    async def retriever(query: MemoryRetrievalInput) -> list[Any]:
        asked.append(query)
        return [
            MemoryCandidate(id="m-user", text="Prefers bullets.", scope="user", relevance=0.9),
            {"id": "m-ws", "text": "Repo is monorepo.", "scope": "workspace", "source": "store"},
            {"id": "m-none", "text": "Unscoped fact."},
        ]

    assembly = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="life-agent",
            turn_id="t1",
            conversation=TurnConversation(transport="telegram", id="8587"),
            identity=IDENTITY,
            user_id="u-1",
            retriever=retriever,
            query="what do I prefer?",
        )
    )

    assert len(asked) == 1
    assert asked[0].session_id == "turn:life-agent:telegram:8587"
    assert (asked[0].user_id, asked[0].thread_id, asked[0].query) == (
        "u-1",
        "8587",
        "what do I prefer?",
    )
    assert [(b.id, b.label, b.source, b.category) for b in assembly.context.blocks] == [
        ("memory-m-user", "Memory [user]", "user", "memory"),
        ("memory-m-ws", "Memory [workspace]", "store", "memory"),
        ("memory-m-none", "Memory", None, "memory"),
    ]
    assert assembly.provenance.used_memory_ids == ["m-user", "m-ws", "m-none"]


async def test_given_candidates_bypass_the_assembler_retriever() -> None:
    calls: list[str] = []

    def retriever(query: MemoryRetrievalInput) -> list[MemoryCandidate]:
        calls.append(query.turn_id)
        return [MemoryCandidate(id="retrieved", text="From the store.", scope="org")]

    assembler = TurnContextAssembler(retriever=retriever)
    plain = await assembler.assemble(turn_input())
    assert calls == ["turn-1"]
    assert [block.label for block in plain.context.blocks] == ["Memory [org]"]

    given = await assembler.assemble(
        turn_input(memory=MemoryInput(candidates=[MemoryCandidate(id="given", text="Given.")]))
    )
    assert calls == ["turn-1"]
    assert given.provenance.used_memory_ids == ["given"]

    # Through the bridge, history (even an empty one) is authoritative over the retriever.
    bridged = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="life-agent",
            turn_id="t2",
            conversation=TurnConversation(transport="telegram", id="1"),
            identity=IDENTITY,
            history=[],
        ),
        assembler=assembler,
    )
    assert calls == ["turn-1"]
    assert bridged.context.blocks == []

    no_retriever = await TurnContextAssembler().assemble(turn_input())
    assert no_retriever.context.blocks == []
    assert no_retriever.provenance.used_memory_ids == []


async def test_memory_is_capped_at_ten_with_a_stable_relevance_sort() -> None:
    relevances: list[float | None] = [None, 0.5, 0.9, 0.5, None, 0.1, 0.9, 0.3, 0.5, 0.0, 0.2, 0.7]
    candidates = [
        MemoryCandidate(id=f"m{i}", text=f"fact {i}", relevance=r) for i, r in enumerate(relevances)
    ]
    assembly = await TurnContextAssembler().assemble(
        turn_input(memory=MemoryInput(candidates=candidates))
    )
    expected = ["m2", "m6", "m11", "m1", "m3", "m8", "m7", "m10", "m5", "m0"]
    assert MAX_MEMORY_BLOCKS == 10
    assert assembly.provenance.used_memory_ids == expected
    assert [block.id for block in assembly.context.blocks] == [f"memory-{i}" for i in expected]


# ─── Turn-context: enrichment, session and projection ────────────────────────


async def test_enrichment_is_capped_at_eight_and_the_rest_is_reported_dropped() -> None:
    candidates = [
        EnrichmentCandidate(id=f"e{i}", content=f"note {i}", source="reviewer") for i in range(10)
    ]
    candidates[9] = candidates[9].model_copy(update={"relevance": 1.0, "label": "Top note"})
    assembly = await TurnContextAssembler().assemble(turn_input(enrichment=candidates))

    assert MAX_ENRICHMENT_BLOCKS == 8
    assert assembly.provenance.used_enrichment_ids == ["e9", *(f"e{i}" for i in range(7))]
    assert assembly.provenance.dropped_enrichment_ids == ["e7", "e8"]
    first, second = assembly.context.blocks[:2]
    assert (first.id, first.label, first.category) == ("enrichment-e9", "Top note", "enrichment")
    assert (second.label, second.source) == ("Enrichment from reviewer", "reviewer")

    none = await TurnContextAssembler().assemble(turn_input())
    assert none.provenance.dropped_enrichment_ids == []


async def test_projection_drops_category_and_metadata_and_keeps_session_blocks() -> None:
    assembly = await assemble_assistant_turn_context(
        AssistantTurnInput(
            assistant_id="life-agent",
            turn_id="t1",
            conversation=TurnConversation(transport="telegram", id="1"),
            identity=IDENTITY,
            session_id="session-1",
            session=[
                "Discussing the trip.",
                "   ",
                {"id": "open-question", "label": "Open question", "content": "Which hotel?"},
            ],
            context=[
                ProviderBlock(
                    id="tasks",
                    label="Tasks",
                    content="#5",
                    source="github",
                    category="workspace",
                    metadata={"etag": "x"},
                )
            ],
        )
    )
    session_block, question, tasks = assembly.context.blocks
    assert (session_block.id, session_block.label, session_block.content) == (
        "session-session-1",
        "Session Context",
        "Discussing the trip.",
    )
    assert (session_block.category, question.category, question.source) == (
        "session",
        "session",
        "session",
    )
    assert tasks.metadata == {"etag": "x"}

    projected = [block.model_dump() for block in assembly.harness_projection.context.blocks]
    assert projected == [
        {
            "id": "session-session-1",
            "label": "Session Context",
            "content": "Discussing the trip.",
            "importance": None,
            "source": "session",
        },
        {
            "id": "open-question",
            "label": "Open question",
            "content": "Which hotel?",
            "importance": None,
            "source": "session",
        },
        {"id": "tasks", "label": "Tasks", "content": "#5", "importance": None, "source": "github"},
    ]
    assert assembly.harness_projection.context.structured is None


async def test_structured_session_renders_one_session_block() -> None:
    assembly = await TurnContextAssembler().assemble(
        turn_input(
            session_id="session-1",
            session=TurnSession(
                state="active",
                summary="Discussing local BYOH.",
                recent_unresolved_questions=["Which port?", "Which user?"],
                conversational_momentum="high",
            ),
        )
    )
    (block,) = assembly.context.blocks
    assert block.model_dump() == {
        "id": "session-session-1",
        "label": "Session Context",
        "content": "State: active\nSummary: Discussing local BYOH.\n"
        "Unresolved: Which port?; Which user?\nMomentum: high",
        "importance": None,
        "source": "session",
        "category": "session",
        "metadata": None,
    }
    empty = await TurnContextAssembler().assemble(turn_input(session=TurnSession()))
    assert empty.context.blocks == []


# ─── Turn-context: validation ────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"assistant_id": ""}, "assistant_id"),
        ({"assistant_id": " \ufeff "}, "assistant_id"),
        ({"turn_id": ""}, "turn_id"),
        ({"identity": AssistantIdentity()}, "identity"),
        ({"identity": AssistantIdentity(base_prompt="  ", developer_prompt="\n")}, "identity"),
    ],
)
async def test_validation_errors(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(TurnContextValidationError, match="validation failed") as raised:
        await TurnContextAssembler().assemble(turn_input(**overrides))
    assert raised.value.field == field
    assert isinstance(raised.value, TurnKitError)


async def test_bridge_reports_a_blank_assistant_id_as_a_validation_error() -> None:
    with pytest.raises(TurnContextValidationError, match="assistant_id"):
        await assemble_assistant_turn_context(
            AssistantTurnInput(
                assistant_id=" ",
                turn_id="t1",
                conversation=TurnConversation(transport="telegram", id="1"),
                identity=IDENTITY,
            )
        )


async def test_identity_rejects_unknown_fields() -> None:
    with pytest.raises(pydantic.ValidationError):
        AssistantIdentity.model_validate({"systemPrompt": "camelCase is not accepted"})
    with pytest.raises(pydantic.ValidationError):
        AssistantIdentity.model_validate({"base_instructions": {"systemPrompt": "x"}})


# ─── Turn-context: instructions and priorities ───────────────────────────────


async def test_system_prompt_is_empty_without_system_segments() -> None:
    developer_only = await TurnContextAssembler().assemble(
        turn_input(identity=AssistantIdentity(developer_prompt="  Be concise.  "))
    )
    instructions = developer_only.harness_projection.instructions
    assert instructions.system_prompt == ""
    assert instructions.developer_prompt == "Be concise."
    assert [s.kind for s in developer_only.instructions] == ["developer"]

    system_only = await TurnContextAssembler().assemble(turn_input())
    assert system_only.harness_projection.instructions.system_prompt == (
        "You are a helpful assistant."
    )
    assert system_only.harness_projection.instructions.developer_prompt is None
    assert system_only.harness_projection.instructions.response_style is None


async def test_segments_are_ordered_by_priority_within_developer_then_guardrail_groups() -> None:
    assembly = await TurnContextAssembler().assemble(
        turn_input(
            identity=AssistantIdentity(
                base_prompt="  System floor.  ",
                developer_prompt="Developer floor.",
                overlays=[
                    "Medium identity overlay.",
                    InstructionOverlay(id="ov-low", text="Low overlay.", priority="low"),
                    "   ",
                ],
                mode="ignored-because-shaping-wins",
                response_style=ResponseStyle(max_answer_chars=500),
            ),
            shaping=TurnShaping(
                mode="review",
                overlays=[InstructionOverlay(id="ov-high", text="High overlay.", priority="high")],
                response_style=ResponseStyle(prefer_markdown=True),
            ),
            guardrails=[
                Guardrail(id="g-low", rule="Low guardrail.", priority="low"),
                Guardrail(id="g-medium", rule="Medium guardrail."),
                Guardrail(id="g-high", rule="High guardrail.", priority="high"),
            ],
        )
    )
    assert [(s.id, s.kind, s.priority) for s in assembly.instructions] == [
        ("base-system", "system", "high"),
        ("base-developer", "developer", "high"),
        ("overlay-1", "developer", "medium"),
        ("ov-low", "developer", "low"),
        ("overlay-3", "developer", "medium"),
        ("ov-high", "developer", "high"),
        ("shaping-mode", "developer", "medium"),
        ("g-low", "guardrail", "low"),
        ("g-medium", "guardrail", "medium"),
        ("g-high", "guardrail", "high"),
    ]
    instructions = assembly.harness_projection.instructions
    assert instructions.system_prompt == "System floor."
    assert instructions.developer_prompt == "\n\n".join(
        [
            "Developer floor.",
            "High overlay.",
            "Medium identity overlay.",
            "Current mode: review",
            "Low overlay.",
            "High guardrail.",
            "Medium guardrail.",
            "Low guardrail.",
        ]
    )
    assert instructions.response_style == ResponseStyle(prefer_markdown=True)
    assert assembly.provenance.used_guardrail_ids == ["g-low", "g-medium", "g-high"]


async def test_identity_projection_and_expression() -> None:
    assembly = await TurnContextAssembler().assemble(
        turn_input(
            identity=AssistantIdentity(
                assistant_name="Sage",
                base_prompt="You are Sage.",
                traits=["voice:concise", "formality:casual", "proactivity:high"],
            ),
            shaping=TurnShaping(expression_overrides={"directness": "low"}),
            guardrails=[
                Guardrail(id="tone", rule="Stay professional.", kind="tone_constraint"),
            ],
        )
    )
    assert assembly.identity.model_dump() == {
        "assistant_name": "Sage",
        "traits_applied": True,
        "identity_summary": [
            "name:Sage",
            "voice:concise",
            "formality:casual",
            "proactivity:high",
            "base:system-prompt-present",
        ],
    }
    assert assembly.expression == {
        "directness": "low",
        "warmth": "high",
        "humor": "light",
        "initiative": "high",
        "explanation_density": "low",
    }

    plain = await TurnContextAssembler().assemble(turn_input(session=TurnSession(state="cold")))
    assert plain.identity.traits_applied is False
    assert plain.expression == {
        "directness": "medium",
        "warmth": "medium",
        "humor": "light",
        "initiative": "medium",
        "explanation_density": "medium",
    }


# ─── The seed's guardrails shape and input errors ────────────────────────────


def bridge_input(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "assistant_id": "life-agent",
        "turn_id": "t1",
        "conversation": {"transport": "telegram", "id": "8587"},
        "identity": {"base_prompt": "You are a personal life assistant."},
    }
    fields.update(overrides)
    return fields


SEED_OVERLAYS = [
    {
        "id": "confirmed-writes",
        "source": "workforce",
        "rule": "Only claim a write succeeded after its provider receipt.",
        "priority": "high",
        "kind": "truthfulness_constraint",
    },
    {"id": "tone", "source": "product", "rule": "Stay calm.", "kind": "tone_constraint"},
]


async def test_bridge_accepts_the_seeds_guardrails_overlays_shape() -> None:
    as_dict = await assemble_assistant_turn_context(
        bridge_input(guardrails={"overlays": SEED_OVERLAYS})
    )
    as_list = await assemble_assistant_turn_context(bridge_input(guardrails=SEED_OVERLAYS))
    as_model = await assemble_assistant_turn_context(
        AssistantTurnInput.model_validate(
            bridge_input(
                guardrails=GuardrailInput(
                    overlays=[Guardrail.model_validate(g) for g in SEED_OVERLAYS]
                )
            )
        )
    )
    for assembly in (as_dict, as_list, as_model):
        assert assembly.provenance.used_guardrail_ids == ["confirmed-writes", "tone"]
        assert [(s.id, s.kind, s.source) for s in assembly.instructions[1:]] == [
            ("confirmed-writes", "guardrail", "workforce"),
            ("tone", "guardrail", "product"),
        ]
        assert assembly.harness_projection.instructions.developer_prompt == (
            "Only claim a write succeeded after its provider receipt.\n\nStay calm."
        )
        assert assembly.expression["humor"] == "light"  # the tone constraint caps humor
    assert as_dict == as_list == as_model


async def test_the_overlays_shape_is_stored_as_the_list_of_guardrails() -> None:
    data = AssistantTurnInput.model_validate(bridge_input(guardrails={"overlays": SEED_OVERLAYS}))
    assert [g.id for g in data.guardrails] == ["confirmed-writes", "tone"]
    assert all(isinstance(g, Guardrail) for g in data.guardrails)
    empties: list[Any] = [{}, {"overlays": None}, {"overlays": []}, None]
    for empty in empties:
        assert AssistantTurnInput.model_validate(bridge_input(guardrails=empty)).guardrails == []


async def test_the_assembler_accepts_the_overlays_shape_too() -> None:
    assembly = await TurnContextAssembler().assemble(
        {
            "assistant_id": "assistant-1",
            "turn_id": "turn-1",
            "identity": {"base_prompt": "Be helpful."},
            "guardrails": {"overlays": [{"id": "g", "source": "seed", "rule": "Be kind."}]},
        }
    )
    assert assembly.provenance.used_guardrail_ids == ["g"]
    assert turn_input(guardrails={"overlays": SEED_OVERLAYS}).guardrails[0].id == (
        "confirmed-writes"
    )


async def test_an_invalid_overlay_names_its_field_as_an_invalid_argument_error() -> None:
    broken = [{"id": "no-rule", "source": "seed"}]
    with pytest.raises(InvalidArgumentError) as raised:
        await assemble_assistant_turn_context(bridge_input(guardrails={"overlays": broken}))
    error = raised.value
    assert isinstance(error, ValueError)
    assert not isinstance(error, pydantic.ValidationError)
    assert "guardrails.overlays.0.rule: Field required" in str(error)
    assert isinstance(error.__cause__, pydantic.ValidationError)

    with pytest.raises(InvalidArgumentError, match=r"guardrails\.0\.rule: Field required"):
        await assemble_assistant_turn_context(bridge_input(guardrails=broken))
    with pytest.raises(InvalidArgumentError, match=r"guardrails\.rules: Extra inputs"):
        await assemble_assistant_turn_context(bridge_input(guardrails={"rules": []}))


async def test_every_failing_field_of_a_dict_input_is_named() -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        await assemble_assistant_turn_context(
            {
                "assistant_id": "life-agent",
                "conversation": {"transport": "telegram"},
                "identity": {"base_prompt": "x"},
                "history": [{"content": 1}],
                "colour": "blue",
            }
        )
    message = str(raised.value)
    assert message.startswith("invalid assistant turn input: ")
    for expected in (
        "turn_id: Field required",
        "conversation.id: Field required",
        "history: Value error, history entry 0 needs a string `content`",
        "colour: Extra inputs are not permitted",
    ):
        assert expected in message
    assert isinstance(raised.value.__cause__, pydantic.ValidationError)

    with pytest.raises(InvalidArgumentError, match=r"\(input\): Input should be"):
        await assemble_assistant_turn_context("not a turn")  # type: ignore[arg-type]


async def test_the_assembler_reports_dict_input_errors_as_invalid_argument_errors() -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        await TurnContextAssembler().assemble({"assistant_id": "a", "turn_id": "t"})
    assert str(raised.value) == "invalid turn context input: identity: Field required"
    assert isinstance(raised.value.__cause__, pydantic.ValidationError)
    assert not isinstance(raised.value, TurnContextValidationError)


async def test_invalid_candidates_from_a_retriever_are_an_invalid_argument_error() -> None:
    def retriever(query: MemoryRetrievalInput) -> list[Any]:
        return [{"id": "m1"}]

    with pytest.raises(InvalidArgumentError, match=r"candidates\.0\.text: Field required"):
        await TurnContextAssembler(retriever=retriever).assemble(turn_input())


async def test_turn_context_validation_errors_are_invalid_argument_errors() -> None:
    # The spec's checks keep their own class, which is also an InvalidArgumentError.
    with pytest.raises(InvalidArgumentError) as raised:
        await assemble_assistant_turn_context(bridge_input(turn_id=" "))
    assert isinstance(raised.value, TurnContextValidationError)
    assert isinstance(raised.value, TurnKitError)
    assert raised.value.field == "turn_id"
    assert str(raised.value) == (
        "TurnContext validation failed: turn_id — must be a non-empty string"
    )
    duplicate = {"id": "same", "label": "A", "content": "a"}
    with pytest.raises(InvalidArgumentError, match="duplicate assembled turn context id"):
        await assemble_assistant_turn_context(bridge_input(context=[duplicate, duplicate]))
