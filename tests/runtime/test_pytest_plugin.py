"""The pytest fixtures shipped with agency_runtime (loaded through the pytest11 entry point)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agency_runtime import MemoryStore, agency
from agency_runtime._core._frame import Frame

pytestmark = pytest.mark.anyio


def test_agency_frame_makes_agency_members_work(agency_frame: Frame) -> None:
    agency.thread.user("hi")
    assert agency.ctx() is agency_frame.ctx
    assert [m.content for m in agency.thread.current().get_messages()] == ["hi"]


def test_agency_store_is_private_and_empty(agency_store: MemoryStore) -> None:
    assert isinstance(agency_store, MemoryStore)
    assert agency_store is not MemoryStore.named("")


async def test_agency_fake_model_registers_for_the_test(
    agency_store: MemoryStore, agency_fake_model: Callable[..., Any]
) -> None:
    fake = agency_fake_model("plugin-check", replies=["scripted answer"])

    async def entry() -> str:
        return str(await agency.llm("question"))

    result = await agency.run(entry, store=agency_store, model=fake.model)
    assert result.value == "scripted answer"
    assert len(fake.calls) == 1
