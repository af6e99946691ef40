"""Each text stored once when journaled units nest (issue 30): a unit that ran committed units
inside it (a step calling ``agency.llm``, an LLM call's rounds) holds one ``["unit", path]``
change for each instead of a copy of their changes, and a step whose result is a message its
changes hold stores ``["same", index]`` instead of the text; replay puts both back."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from agency_runtime import (
    JournalCorruptError,
    JournalEntry,
    MemoryStore,
    SqliteStore,
    Store,
    agency,
    approve,
)
from agency_runtime._core import _changes
from agency_runtime._store._migrations import SCHEMA_VERSION
from agency_runtime._store._pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from agency_runtime.testing import FakeModel, FakeToolCall

pytestmark = pytest.mark.anyio

QUESTION = "what is the question? " * 8
ANSWER = "forty-two, said the model. " * 8
FOLLOW_UP = "and why is that so? " * 8
WHY = "because it is the answer. " * 8
FINAL = "Oslo is mild today, 21 C. " * 4
TOOL_RESULT = '{"city":"Oslo","temp":21}'


def forecast(city: str) -> dict[str, Any]:
    """The weather in ``city``."""
    return {"city": city, "temp": 21}


async def nested_flow(model: str) -> list[Any]:
    """Steps around LLM calls at several depths, then a pause; returns every value it saw
    and the thread as it is after the answer."""

    async def body(s: Any) -> list[Any]:
        first = await s.step(lambda: agency.llm(QUESTION, model=model), name="ask")

        async def deeper() -> str:  # a step's step: its result two markers down
            async def inner(t: Any) -> str:
                return str(await t.step(lambda: agency.llm(FOLLOW_UP, model=model), name="why"))

            return await agency.with_resumable_scope("inner", inner)

        second = await s.step(deeper, name="deeper")
        third = await s.step(
            lambda: agency.llm("weather in Oslo?", model=model, tools=[forecast]), name="tools"
        )
        answer = await agency.interrupt("go-on", "continue?")
        messages = [m.content for m in agency.thread.current().get_messages()]
        return [first, second, third, bool(answer.approved), messages]

    return await agency.with_resumable_scope("flow", body)


def replies() -> list[Any]:
    return [ANSWER, WHY, FakeToolCall("forecast", {"city": "Oslo"}), FINAL]


def stored_text(entries: list[JournalEntry]) -> str:
    return "".join(e.result + (e.deltas or "") for e in entries)


async def test_a_step_around_an_llm_call_stores_each_text_once(store: Store) -> None:
    async def entry(model: str) -> str:
        async def body(s: Any) -> str:
            return str(await s.step(lambda: agency.llm(QUESTION, model=model), name="ask"))

        return await agency.with_resumable_scope("once", body)

    with FakeModel("once-step", replies=[ANSWER]) as fake:
        result = await agency.run(entry, fake.model, run_id="once", store=store)
    assert (result.status, result.value) == ("completed", ANSWER)
    call, step = await agency.runs.journal("once", store=store)
    assert (call.name, step.name) == ("agency.llm", "ask")
    text = stored_text([call, step])
    assert text.count("forty-two") == 8  # the answer, once
    assert text.count("the question") == 8  # the prompt, once
    changes = json.loads(step.deltas or "[]")
    assert changes[0] == ["unit", call.path]
    assert changes[-1][0] == "same"
    assert step.result == "null"
    pushed = json.loads(call.deltas or "[]")[changes[-1][1]]
    assert pushed[0] == "push"
    assert pushed[2] == {"role": "assistant", "content": ANSWER}


async def test_a_short_result_and_a_result_no_message_holds_are_stored_as_they_are() -> None:
    store = MemoryStore()

    async def entry(model: str) -> list[Any]:
        async def body(s: Any) -> list[Any]:
            short = await s.step(lambda: agency.llm("hi", model=model), name="short")

            async def own_text() -> str:
                await agency.llm(QUESTION, model=model)
                return "x" * 100

            own = await s.step(own_text)
            return [short, own]

        return await agency.with_resumable_scope("as-is", body)

    with FakeModel("as-is", replies=["hello", ANSWER]) as fake:
        result = await agency.run(entry, fake.model, run_id="as-is", store=store)
    assert result.value == ["hello", "x" * 100]
    entries = await agency.runs.journal("as-is", store=store)
    short, own = (e for e in entries if e.name != "agency.llm")
    assert short.result == '"hello"'
    assert own.result == json.dumps("x" * 100)
    assert all(c[0] != "same" for e in (short, own) for c in json.loads(e.deltas or "[]"))


@pytest.mark.parametrize("answered", ["here", "from the store"])
async def test_a_resumed_run_replays_nested_units_exactly(store: Store, answered: str) -> None:
    with FakeModel("nested", replies=replies()) as fake:
        paused = await agency.run(nested_flow, fake.model, run_id="nested", store=store)
        assert paused.status == "paused", paused.error
        asked = len(fake.calls)
        if answered == "here":  # the paused journal this process cached
            done = await agency.respond_to_interrupts(paused, [approve()], store=store)
        else:  # answered elsewhere: this process reads the journal again
            key = paused.interrupts[0].interrupt_id
            assert await store.answer_interrupts("nested", {key: approve()}) == []
            done = await agency.resume("nested", store=store)
        assert len(fake.calls) == asked  # every call replayed, none asked again
    assert done.status == "completed", done.error
    assert done.value == [
        ANSWER,
        WHY,
        FINAL,
        True,
        [
            QUESTION,
            ANSWER,
            FOLLOW_UP,
            WHY,
            "weather in Oslo?",
            "",
            '{"city":"Oslo","temp":21}',
            FINAL,
        ],
    ]
    entries = await agency.runs.journal("nested", store=store)
    text = stored_text(entries)
    for each in (QUESTION, ANSWER, FOLLOW_UP, WHY, FINAL):
        assert text.count(json.dumps(each)[1:-1]) == 1, each
    by_name = {e.name: e for e in entries}
    # the outer step marks the inner step, which marks its call: nothing is copied
    deeper = json.loads(by_name["deeper"].deltas or "[]")
    assert deeper[0] == ["unit", by_name["why"].path]
    assert [c[0] for c in deeper] == ["unit", "same"]


async def test_a_journal_written_with_copies_still_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries of earlier releases copy their inner units' changes: they replay as before."""
    store = MemoryStore()
    absorb = _changes.Recorder.absorb

    def copying(self: _changes.Recorder, inner: _changes.Recorder, *, spend: bool,
                unit: str | None = None) -> None:  # fmt: skip
        absorb(self, inner, spend=spend)

    with FakeModel("copies", replies=replies()) as fake:
        monkeypatch.setattr(_changes.Recorder, "absorb", copying)
        paused = await agency.run(nested_flow, fake.model, run_id="copies", store=store)
        monkeypatch.undo()
        entries = await agency.runs.journal("copies", store=store)
        assert all(c[0] != "unit" for e in entries for c in json.loads(e.deltas or "[]"))
        key = paused.interrupts[0].interrupt_id
        assert await store.answer_interrupts("copies", {key: approve()}) == []
        done = await agency.resume("copies", store=store)
    assert done.status == "completed", done.error
    assert done.value[0] == ANSWER
    assert done.value[4][-1] == FINAL


async def test_a_marker_to_a_missing_unit_is_a_damaged_journal(tmp_path: Path) -> None:
    db = tmp_path / "damaged.db"
    store = SqliteStore(db)
    try:
        with FakeModel("damaged", replies=replies()) as fake:
            paused = await agency.run(nested_flow, fake.model, run_id="damaged", store=store)
            # the step's row rewritten by hand: its marker names a unit the journal lacks
            with closing(sqlite3.connect(db)) as conn, conn:
                (deltas,) = conn.execute(
                    "SELECT deltas FROM steps WHERE run_id = 'damaged' AND name = 'ask'"
                ).fetchone()
                broken = json.dumps([["unit", "flow/nowhere"], *json.loads(deltas)[1:]])
                conn.execute(
                    "UPDATE steps SET deltas = ? WHERE run_id = 'damaged' AND name = 'ask'",
                    (broken,),
                )
            key = paused.interrupts[0].interrupt_id
            assert await store.answer_interrupts("damaged", {key: approve()}) == []
            done = await agency.resume("damaged", store=store)
    finally:
        store.close()
    assert done.status == "failed"
    assert done.error is not None
    assert done.error.type == JournalCorruptError.__name__
    assert "flow/nowhere" in done.error.message


async def test_a_recorded_failure_inside_a_step_is_copied_not_marked() -> None:
    """A failure that ends the run is forgotten when the run stops, so no entry points at it."""
    store = MemoryStore()

    async def entry(model: str) -> str:
        async def body(s: Any) -> str:
            async def careful() -> str:
                agency.thread.user("before the call")
                try:
                    return str(await agency.llm(QUESTION, model=model))
                except Exception as exc:
                    return f"failed: {type(exc).__name__}"

            return str(await s.step(careful, name="careful"))

        return await agency.with_resumable_scope("careful", body)

    with FakeModel("fails", fail_times=10, failure="bad_request") as fake:
        result = await agency.run(entry, fake.model, run_id="fails", store=store)
    assert result.status == "completed", result.error
    assert str(result.value).startswith("failed:")
    entries = await agency.runs.journal("fails", store=store)
    [call] = [e for e in entries if e.name == "agency.llm"]
    [step] = [e for e in entries if e.name == "careful"]
    assert call.error is not None
    assert ["unit", call.path] not in json.loads(step.deltas or "[]")


def test_the_journal_format_is_a_schema_version_older_releases_refuse() -> None:
    assert SCHEMA_VERSION >= 8
    assert PG_SCHEMA_VERSION >= 6
