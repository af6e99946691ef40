"""Resumable scopes: steps, halt, locals, addressing, typed revival, determinism and resume.

Ported from the spec's ``resumableScope`` / ``ts-helpers`` cases (agency-lang-spec §11) plus the
design's own rules (DESIGN.md §4 "Resumable scopes and the journal", §8 "Steps and scopes").
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from agency_runtime import (
    CallsiteLocation,
    InvalidArgumentError,
    JournalCorruptError,
    MemoryStore,
    NondeterminismError,
    OutsideFrameError,
    ResumableScope,
    ResumableScopeOpts,
    SqliteStore,
    StepResultError,
    Store,
    agency,
)

pytestmark = pytest.mark.anyio


class Model(BaseModel):
    item: str
    quantity: int


def make_model() -> Model:
    return Model(item="tea", quantity=2)


async def make_model_async() -> Model:
    return Model(item="cake", quantity=3)


def make_pair() -> tuple[int, int]:
    return (1, 2)


def untyped_pair():  # type: ignore[no-untyped-def]
    return (1, 2)


class Flaky:
    """Counts calls per step name and fails the named steps on their first attempt."""

    def __init__(self, *failing: str) -> None:
        self.calls: Counter[str] = Counter()
        self.failing = set(failing)

    def __call__(self, name: str, value: Any = None) -> Any:
        self.calls[name] += 1
        if name in self.failing and self.calls[name] == 1:
            raise RuntimeError(f"{name} failed on its first attempt")
        return value


@pytest.fixture
def memory_store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteStore]:
    store = SqliteStore(tmp_path / "scope.db")
    yield store
    store.close()


async def journal_paths(run_id: str, store: Store) -> list[str]:
    return [e.path for e in await agency.runs.journal(run_id, store=store)]


# -- spec cases --------------------------------------------------------------------------------


async def test_step_result_feeds_the_next_step() -> None:
    async def body(s: ResumableScope) -> int:
        first = await s.step(lambda: 10, name="ten")
        return await s.step(lambda: first * 2, name="double")

    with agency.test_context():
        assert await agency.with_resumable_scope("calc", body) == 20


async def test_step_result_feeds_the_next_step_in_a_run(store: Store) -> None:
    async def entry() -> int:
        async def body(s: ResumableScope) -> int:
            first = await s.step(lambda: 10, name="ten")
            return await s.step(lambda: first * 2, name="double")

        return await agency.with_resumable_scope("calc", body)

    result = await agency.run(entry, run_id="feeds", store=store)
    assert result.status == "completed"
    assert result.value == 20
    entries = await agency.runs.journal("feeds", store=store)
    assert [(e.path, e.name, e.result) for e in entries] == [
        ("calc/0", "ten", "10"),
        ("calc/1", "double", "20"),
    ]


async def test_sync_and_async_bodies_and_steps() -> None:
    async def async_ten() -> int:
        return 10

    async def body(s: ResumableScope) -> list[int]:
        return [await s.step(async_ten), await s.step(lambda: 5, name="five")]

    with agency.test_context():
        assert await agency.with_resumable_scope("sync", lambda s: 7) == 7
        assert await agency.with_resumable_scope("async", body) == [10, 5]
        # A step whose callable returns an awaitable has it awaited.
        awaited = await agency.with_resumable_scope(
            "awaits", lambda s: s.step(lambda: async_ten(), name="lazy")
        )
        assert awaited == 10


async def test_frame_is_popped_on_return_halt_and_throw() -> None:
    loc = CallsiteLocation(module_id="mod", scope_name="outer", step_path="3")

    async def returns(s: ResumableScope) -> str:
        assert agency.callsite() != loc
        return await s.step(lambda: "ok", name="ok")

    async def halts(s: ResumableScope) -> None:
        s.halt("stopped")
        await s.step(lambda: "never", name="never")

    async def throws(s: ResumableScope) -> None:
        await s.step(lambda: 1, name="one")
        raise ValueError("body failed")

    with agency.test_context():
        assert agency.callsite() is None
        assert await agency.with_resumable_scope("r", returns) == "ok"
        assert agency.callsite() is None
        with agency.at_callsite(loc):
            assert await agency.with_resumable_scope("r2", returns) == "ok"
            assert agency.callsite() == loc
            assert await agency.with_resumable_scope("h", halts) == "stopped"
            assert agency.callsite() == loc
            with pytest.raises(ValueError, match="body failed"):
                await agency.with_resumable_scope("t", throws)
            assert agency.callsite() == loc
        assert agency.callsite() is None


async def test_frame_is_popped_inside_a_run(store: Store) -> None:
    seen: list[object] = []

    async def entry() -> None:
        seen.append(agency.callsite())
        await agency.with_resumable_scope("one", lambda s: s.step(lambda: 1, name="x"))
        seen.append(agency.callsite())
        try:
            await agency.with_resumable_scope("two", lambda s: 1 / 0)
        except ZeroDivisionError:
            seen.append(agency.callsite())

    result = await agency.run(entry, run_id="popped", store=store)
    assert result.status == "completed"
    assert seen == [None, None, None]


async def test_halt_returns_its_value_and_later_steps_return_none() -> None:
    ran: list[str] = []

    def work(name: str) -> str:
        ran.append(name)
        return name

    later: list[object] = []

    async def body(s: ResumableScope) -> str:
        assert await s.step(lambda: work("a"), name="a") == "a"
        s.halt({"done": True})
        assert s.halted
        later.append(await s.step(lambda: work("b"), name="b"))
        later.append(await s.step(lambda: work("c"), name="c"))
        return "the body's own value is discarded"

    with agency.test_context():
        assert await agency.with_resumable_scope("h", body) == {"done": True}
    assert ran == ["a"]
    assert later == [None, None]


async def test_halt_in_a_run_journals_only_the_steps_before_it(store: Store) -> None:
    ran: list[str] = []

    async def entry() -> Any:
        async def body(s: ResumableScope) -> str:
            await s.step(lambda: ran.append("a"), name="a")
            s.halt("early")
            await s.step(lambda: ran.append("b"), name="b")
            return "late"

        return await agency.with_resumable_scope("h", body)

    result = await agency.run(entry, run_id="halted", store=store)
    assert result.status == "completed"
    assert result.value == "early"
    assert ran == ["a"]
    assert await journal_paths("halted", store) == ["h/0"]


async def test_finally_still_runs_after_halt() -> None:
    events: list[str] = []

    async def body(s: ResumableScope) -> str:
        try:
            s.halt("halted")
            await s.step(lambda: events.append("step"), name="skipped")
            events.append("after-step")
            return "ignored"
        finally:
            events.append("finally")

    with agency.test_context():
        assert await agency.with_resumable_scope("f", body) == "halted"
    # halt does not throw: code after it runs on, the step is skipped, finally runs.
    assert events == ["after-step", "finally"]


async def test_module_id_defaults_to_py_helper() -> None:
    seen: dict[str, object] = {}

    async def body(s: ResumableScope) -> None:
        seen["body"] = agency.callsite()

        def first() -> None:
            seen["step0"] = agency.callsite()

        def second() -> None:
            seen["step1"] = agency.callsite()

        await s.step(first)
        await s.step(second)
        seen["after"] = agency.callsite()

    with agency.test_context():
        await agency.with_resumable_scope("helper", body)
    assert ResumableScopeOpts(name="x").module_id == "<py-helper>"
    assert seen["body"] == CallsiteLocation(
        module_id="<py-helper>", scope_name="helper", step_path=""
    )
    assert seen["after"] == seen["body"]
    step0, step1 = seen["step0"], seen["step1"]
    assert isinstance(step0, CallsiteLocation)
    assert isinstance(step1, CallsiteLocation)
    assert step0.as_tuple() == ("<py-helper>", "helper", "0")
    assert step1.as_tuple() == ("<py-helper>", "helper", "1")


async def test_module_id_can_be_set() -> None:
    seen: list[object] = []

    async def body(s: ResumableScope) -> None:
        seen.append(agency.callsite())
        await s.step(lambda: seen.append(agency.callsite()), name="x")

    with agency.test_context():
        await agency.with_resumable_scope(ResumableScopeOpts(name="mine", module_id="pkg.m"), body)
    assert [c.as_tuple() for c in seen if isinstance(c, CallsiteLocation)] == [
        ("pkg.m", "mine", ""),
        ("pkg.m", "mine", "0"),
    ]


@pytest.mark.parametrize("pinned", [False, True])
async def test_pin_result_checkpoint_is_opt_in(pinned: bool, store: Store) -> None:
    async def entry() -> int:
        opts = ResumableScopeOpts(name="pinning", pin_result_checkpoint=pinned)
        return await agency.with_resumable_scope(opts, lambda s: s.step(lambda: 3, name="three"))

    run_id = f"pin-{pinned}"
    result = await agency.run(entry, run_id=run_id, store=store)
    assert result.status == "completed"
    assert result.value == 3
    checkpoints = (await store.load_journal(run_id)).checkpoints
    labelled = [c for c in checkpoints if c.label == "result-entry"]
    if pinned:
        assert len(labelled) == 1
        assert labelled[0].pinned is True
        assert labelled[0].scope_name == "pinning"
    else:
        assert labelled == []
        assert checkpoints == []


async def test_default_opts_do_not_pin() -> None:
    assert ResumableScopeOpts(name="x").pin_result_checkpoint is False


async def test_nested_scopes_run_in_order_and_are_addressed_by_path(store: Store) -> None:
    order: list[str] = []

    def mark(name: str, value: str) -> str:
        order.append(name)
        return value

    async def entry() -> str:
        async def inner(s: ResumableScope) -> str:
            x = await s.step(lambda: mark("i1", "x"), name="i1")
            y = await s.step(lambda: mark("i2", "y"), name="i2")
            return x + y

        async def outer(s: ResumableScope) -> str:
            a = await s.step(lambda: mark("o1", "a"), name="o1")

            async def o2() -> str:
                order.append("o2")
                return await agency.with_resumable_scope("inner", inner)

            return a + await s.step(o2, name="o2")

        return await agency.with_resumable_scope("outer", outer)

    result = await agency.run(entry, run_id="nested", store=store)
    assert result.status == "completed"
    assert result.value == "axy"
    assert order == ["o1", "o2", "i1", "i2"]
    entries = await agency.runs.journal("nested", store=store)
    # Committed in completion order: the inner steps finish before the outer step holding them.
    assert [(e.path, e.name) for e in entries] == [
        ("outer/0", "o1"),
        ("outer/1/inner/0", "i1"),
        ("outer/1/inner/1", "i2"),
        ("outer/1", "o2"),
    ]


async def test_nested_scope_failure_resumes_inside_the_inner_scope(store: Store) -> None:
    flaky = Flaky("i2")

    async def entry() -> str:
        async def inner(s: ResumableScope) -> str:
            x = await s.step(lambda: flaky("i1", "x"), name="i1")
            y = await s.step(lambda: flaky("i2", "y"), name="i2")
            return x + y

        async def outer(s: ResumableScope) -> str:
            a = await s.step(lambda: flaky("o1", "a"), name="o1")

            async def o2() -> str:
                flaky("o2")
                return await agency.with_resumable_scope("inner", inner)

            b = await s.step(o2, name="o2")
            return a + b + await s.step(lambda: flaky("o3", "z"), name="o3")

        return await agency.with_resumable_scope("outer", outer)

    first = await agency.run(entry, run_id="nested-resume", store=store)
    assert first.status == "failed"
    assert await journal_paths("nested-resume", store) == ["outer/0", "outer/1/inner/0"]
    second = await agency.run(entry, run_id="nested-resume", store=store)
    assert second.status == "completed"
    assert second.value == "axyz"
    # The outer step holding the failed inner step re-runs; completed steps do not.
    assert flaky.calls == {"o1": 1, "o2": 2, "i1": 1, "i2": 2, "o3": 1}


async def test_resume_counts_s1_1_s2_2_s3_1(store: Store) -> None:
    flaky = Flaky("s2")

    async def entry() -> list[int]:
        async def body(s: ResumableScope) -> list[int]:
            return [
                await s.step(lambda: flaky("s1", 1), name="s1"),
                await s.step(lambda: flaky("s2", 2), name="s2"),
                await s.step(lambda: flaky("s3", 3), name="s3"),
            ]

        return await agency.with_resumable_scope("counts", body)

    first = await agency.run(entry, run_id="counts", store=store)
    assert first.status == "failed"
    assert first.error is not None
    assert first.error.type == "RuntimeError"
    assert "s2 failed" in first.error.message
    assert flaky.calls == {"s1": 1, "s2": 1}
    assert (await agency.runs.get("counts", store=store)).status == "failed"

    second = await agency.run(entry, run_id="counts", store=store)
    assert second.status == "completed"
    assert second.value == [1, 2, 3]
    assert flaky.calls == {"s1": 1, "s2": 2, "s3": 1}
    assert await journal_paths("counts", store) == ["counts/0", "counts/1", "counts/2"]

    # The run is final now: a third call returns the stored result and runs nothing.
    third = await agency.run(entry, run_id="counts", store=store)
    assert third.value == [1, 2, 3]
    assert flaky.calls == {"s1": 1, "s2": 2, "s3": 1}


# -- ids at call time --------------------------------------------------------------------------


class InOrder:
    """Makes concurrent steps finish in a chosen order, whatever order they started in.

    A step's work waits for :meth:`turn`, which comes once the step before it in ``order``
    has finished (its ``s.step`` returned: it is committed). Events, not delays, fix it.
    """

    def __init__(self, *order: str) -> None:
        self.order = order
        self.done = {name: anyio.Event() for name in order}

    async def turn(self, name: str) -> None:
        index = self.order.index(name)
        if index:
            await self.done[self.order[index - 1]].wait()

    def finished(self, name: str) -> None:
        self.done[name].set()


async def test_concurrent_steps_in_a_task_group_get_ids_of_their_branch() -> None:
    """Each task of a task group is a branch named by when its parent started it (the
    n-th task after the parent's e-th counted event), so its step ids never depend on how
    the tasks interleave."""
    paths: dict[str, str] = {}

    async def body(s: ResumableScope) -> list[str]:
        results: dict[str, str] = {}
        order = InOrder("b", "c", "a")  # started a, b, c; finished b, c, a

        async def work(name: str) -> str:
            await order.turn(name)
            location = agency.callsite()
            assert location is not None
            paths[name] = location.step_path
            return name

        async def run_step(name: str) -> None:
            results[name] = await s.step(lambda: work(name), name=name)
            order.finished(name)

        async with anyio.create_task_group() as tg:
            for name in "abc":
                tg.start_soon(run_step, name)
        return [results[n] for n in "abc"]

    with agency.test_context():
        assert await agency.with_resumable_scope("par", body) == ["a", "b", "c"]
    assert paths == {"a": "0.0:0", "b": "0.1:0", "c": "0.2:0"}


async def test_step_id_is_assigned_when_step_is_called_not_awaited() -> None:
    paths: dict[str, str] = {}

    def work(name: str) -> str:
        location = agency.callsite()
        assert location is not None
        paths[name] = location.step_path
        return name

    async def body(s: ResumableScope) -> list[str]:
        pending = [s.step(lambda n=n: work(n), name=n) for n in "abc"]  # type: ignore[misc]
        # Awaited in reverse order: the ids were fixed by the calls above.
        return [await aw for aw in reversed(pending)]

    with agency.test_context():
        assert await agency.with_resumable_scope("lazy", body) == ["c", "b", "a"]
    assert paths == {"a": "0", "b": "1", "c": "2"}


async def test_parallel_steps_finished_out_of_order_resume_by_id(store: Store) -> None:
    flaky = Flaky("after")

    async def entry() -> list[str]:
        async def body(s: ResumableScope) -> list[str]:
            results: dict[str, str] = {}
            order = InOrder("b", "c", "a")

            async def run_step(name: str) -> None:
                async def work() -> str:
                    await order.turn(name)
                    return str(flaky(name, name.upper()))

                results[name] = await s.step(work, name=name)
                order.finished(name)

            async with anyio.create_task_group() as tg:
                for name in "abc":
                    tg.start_soon(run_step, name)
            tail = await s.step(lambda: flaky("after", "!"), name="after")
            return [results[n] for n in "abc"] + [tail]

        return await agency.with_resumable_scope("par", body)

    first = await agency.run(entry, run_id="out-of-order", store=store)
    assert first.status == "failed"
    entries = await agency.runs.journal("out-of-order", store=store)
    # b finished first, then c, then a: committed out of id order.
    assert [(e.path, e.name) for e in entries] == [
        ("par/0.1:0", "b"),
        ("par/0.2:0", "c"),
        ("par/0.0:0", "a"),
    ]

    second = await agency.run(entry, run_id="out-of-order", store=store)
    assert second.status == "completed"
    assert second.value == ["A", "B", "C", "!"]
    assert flaky.calls == {"a": 1, "b": 1, "c": 1, "after": 2}


async def test_a_failed_parallel_step_reruns_while_later_ids_are_skipped(store: Store) -> None:
    # The slowest step (id 0) fails after steps 1 and 2 completed: a high-water mark would
    # re-run them or skip step 0; membership re-runs only step 0.
    flaky = Flaky("a")

    async def entry() -> list[str]:
        async def body(s: ResumableScope) -> list[str]:
            results: dict[str, str] = {}
            order = InOrder("b", "c", "a")

            async def run_step(name: str) -> None:
                async def work() -> str:
                    await order.turn(name)
                    return str(flaky(name, name.upper()))

                results[name] = await s.step(work, name=name)
                order.finished(name)

            async with anyio.create_task_group() as tg:
                for name in "abc":
                    tg.start_soon(run_step, name)
            return [results[n] for n in "abc"]

        return await agency.with_resumable_scope("par", body)

    first = await agency.run(entry, run_id="membership", store=store)
    assert first.status == "failed"
    assert first.error is not None
    assert first.error.type == "RuntimeError"
    assert await journal_paths("membership", store) == ["par/0.1:0", "par/0.2:0"]

    second = await agency.run(entry, run_id="membership", store=store)
    assert second.status == "completed"
    assert second.value == ["A", "B", "C"]
    assert flaky.calls == {"a": 2, "b": 1, "c": 1}


# -- repeated scope names ----------------------------------------------------------------------


async def test_repeated_scope_names_are_addressed_with_tilde_ordinals(store: Store) -> None:
    async def entry() -> list[int]:
        out: list[int] = []
        for i in range(3):
            out.append(
                await agency.with_resumable_scope(
                    "loop", lambda s, i=i: s.step(lambda: i * 10, name=f"turn{i}")
                )
            )

        async def outer(s: ResumableScope) -> None:
            for _ in range(2):
                await agency.with_resumable_scope("inner", lambda s: s.step(lambda: 0, name="z"))
            await s.step(lambda: 1, name="tail")

        await agency.with_resumable_scope("outer", outer)
        return out

    result = await agency.run(entry, run_id="repeat", store=store)
    assert result.status == "completed"
    assert result.value == [0, 10, 20]
    entries = await agency.runs.journal("repeat", store=store)
    assert [(e.path, e.name) for e in entries] == [
        ("loop/0", "turn0"),
        ("loop~1/0", "turn1"),
        ("loop~2/0", "turn2"),
        ("outer/inner/0", "z"),
        ("outer/inner~1/0", "z"),
        ("outer/0", "tail"),
    ]


async def test_repeated_scope_names_resume_each_entry(store: Store) -> None:
    flaky = Flaky("turn2")

    async def entry() -> list[int]:
        out: list[int] = []
        for i in range(3):
            out.append(
                await agency.with_resumable_scope(
                    "loop",
                    lambda s, i=i: s.step(lambda: flaky(f"turn{i}", i), name=f"turn{i}"),
                )
            )
        return out

    assert (await agency.run(entry, run_id="repeat-resume", store=store)).status == "failed"
    second = await agency.run(entry, run_id="repeat-resume", store=store)
    assert second.status == "completed"
    assert second.value == [0, 1, 2]
    assert flaky.calls == {"turn0": 1, "turn1": 1, "turn2": 2}


async def test_scope_address_is_visible_on_the_handle() -> None:
    seen: list[str] = []

    async def body(s: ResumableScope) -> None:
        seen.append(s.address)

    with agency.test_context():
        await agency.with_resumable_scope("same", body)
        await agency.with_resumable_scope("same", body)
        await agency.with_resumable_scope("other", body)
        await agency.with_resumable_scope("same", body)
    assert seen == ["same", "same~1", "other", "same~2"]


# -- locals ------------------------------------------------------------------------------------


async def test_locals_survive_resume(store: Store) -> None:
    flaky = Flaky("s2")
    seen: list[dict[str, Any]] = []

    async def entry() -> dict[str, Any]:
        async def body(s: ResumableScope) -> dict[str, Any]:
            seen.append(
                {
                    "greeting": s.get_local("greeting"),
                    "n": s.get_local("n", "unset"),
                    "visits": s.get_local("visits", 0),
                }
            )
            s.set_local("greeting", "hello")
            # A read-modify-write outside a step applies again when the body re-runs.
            s.set_local("visits", s.get_local("visits", 0) + 1)

            def s1() -> str:
                flaky("s1")
                s.set_local("n", {"items": [1, 2]})
                return "one"

            await s.step(s1, name="s1")
            await s.step(lambda: flaky("s2", "two"), name="s2")
            return {"n": s.get_local("n"), "visits": s.get_local("visits")}

        return await agency.with_resumable_scope("locals", body)

    first = await agency.run(entry, run_id="locals", store=store)
    assert first.status == "failed"
    second = await agency.run(entry, run_id="locals", store=store)
    assert second.status == "completed"
    assert seen == [
        {"greeting": None, "n": "unset", "visits": 0},
        {"greeting": "hello", "n": {"items": [1, 2]}, "visits": 1},
    ]
    assert second.value == {"n": {"items": [1, 2]}, "visits": 2}
    assert flaky.calls == {"s1": 1, "s2": 2}


async def test_locals_in_a_test_context() -> None:
    async def body(s: ResumableScope) -> Any:
        assert s.get_local("missing") is None
        assert s.get_local("missing", 5) == 5
        s.set_local("k", [1, "two", {"three": 3.0}])
        await s.step(lambda: None, name="noop")
        return s.get_local("k")

    with agency.test_context():
        assert await agency.with_resumable_scope("loc", body) == [1, "two", {"three": 3.0}]


async def test_set_local_rejects_non_json_values_and_keys() -> None:
    async def body(s: ResumableScope) -> None:
        with pytest.raises(InvalidArgumentError, match="k"):
            s.set_local("k", object())
        assert s.get_local("k") is None
        with pytest.raises(InvalidArgumentError):
            s.set_local("f", lambda: 1)
        with pytest.raises(InvalidArgumentError):
            s.set_local(3, "value")  # type: ignore[arg-type]
        s.set_local("model", Model(item="a", quantity=1))  # pydantic models are JSON data

    with agency.test_context():
        await agency.with_resumable_scope("loc", body)
    assert issubclass(InvalidArgumentError, ValueError)


# -- typed revival -----------------------------------------------------------------------------


async def test_annotated_steps_revive_their_type_on_first_run_and_replay(store: Store) -> None:
    flaky = Flaky("boom")
    seen: list[dict[str, Any]] = []

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            model = await s.step(make_model)
            async_model = await s.step(make_model_async)
            pair = await s.step(lambda: [3, 4], name="pair", returns=tuple[int, int])
            annotated_pair = await s.step(make_pair)
            plain = await s.step(untyped_pair)
            seen.append(
                {
                    "model": model,
                    "async_model": async_model,
                    "pair": pair,
                    "annotated_pair": annotated_pair,
                    "plain": plain,
                }
            )
            await s.step(lambda: flaky("boom"), name="boom")

        await agency.with_resumable_scope("typed", body)

    assert (await agency.run(entry, run_id="typed", store=store)).status == "failed"
    assert (await agency.run(entry, run_id="typed", store=store)).status == "completed"
    assert len(seen) == 2
    for values in seen:  # first run, then replay: the same types
        assert values["model"] == Model(item="tea", quantity=2)
        assert type(values["model"]) is Model
        assert type(values["async_model"]) is Model
        assert values["async_model"].item == "cake"
        assert values["pair"] == (3, 4)
        assert type(values["pair"]) is tuple
        assert values["annotated_pair"] == (1, 2)
        assert type(values["annotated_pair"]) is tuple
        assert values["plain"] == [1, 2]
        assert type(values["plain"]) is list


async def test_unannotated_results_are_json_round_tripped_on_the_first_run() -> None:
    async def body(s: ResumableScope) -> list[Any]:
        return [
            await s.step(lambda: (1, 2), name="tuple"),
            await s.step(lambda: Model(item="x", quantity=1), name="model"),
            await s.step(lambda: {"k": (1,)}, name="nested"),
        ]

    with agency.test_context():
        values = await agency.with_resumable_scope("json", body)
    assert values == [[1, 2], {"item": "x", "quantity": 1}, {"k": [1]}]


# -- step result errors ------------------------------------------------------------------------


async def test_non_serializable_result_raises_step_result_error_at_step_time() -> None:
    after: list[str] = []

    async def body(s: ResumableScope) -> None:
        await s.step(lambda: 1, name="fine")
        await s.step(lambda: object(), name="opaque")
        after.append("not reached")

    with agency.test_context(), pytest.raises(StepResultError) as caught:
        await agency.with_resumable_scope("billing", body)
    message = str(caught.value)
    assert message.startswith(
        "step 'billing/1' (opaque) of scope 'billing' in run None returned a object, which "
        "cannot be journaled as JSON: "
    )
    assert after == []


async def test_non_serializable_result_fails_the_run(store: Store) -> None:
    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            await s.step(lambda: 1, name="fine")
            await s.step(lambda: {1, 2, object()}, name="opaque")

        await agency.with_resumable_scope("billing", body)

    result = await agency.run(entry, run_id="bad-result", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "StepResultError"
    assert "billing/1" in result.error.message
    assert "billing" in result.error.message
    assert isinstance(result.exception, StepResultError)
    # The bad step was never journaled.
    assert await journal_paths("bad-result", store) == ["billing/0"]


# -- determinism -------------------------------------------------------------------------------


async def test_a_renamed_step_raises_nondeterminism_error(store: Store) -> None:
    version = {"name": "alpha"}
    calls: list[str] = []

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            name = version["name"]
            await s.step(lambda: calls.append(name), name=name)
            raise RuntimeError("fail after the first step")

        await agency.with_resumable_scope("det", body)

    first = await agency.run(entry, run_id="renamed", store=store)
    assert first.status == "failed"
    assert calls == ["alpha"]

    version["name"] = "beta"
    second = await agency.run(entry, run_id="renamed", store=store)
    assert second.status == "failed"
    assert second.error is not None
    assert second.error.type == "NondeterminismError"
    message = second.error.message
    for part in ("renamed", "det/0", "alpha", "beta"):
        assert part in message
    assert isinstance(second.exception, NondeterminismError)
    assert calls == ["alpha"]  # the mismatched step never ran
    assert (await agency.runs.get("renamed", store=store)).status == "failed"


async def test_default_step_names_are_qualified_names(store: Store) -> None:
    def fetch() -> int:
        return 1

    async def entry() -> int:
        return await agency.with_resumable_scope("q", lambda s: s.step(fetch))

    assert (await agency.run(entry, run_id="qualnames", store=store)).value == 1
    (entry_,) = await agency.runs.journal("qualnames", store=store)
    assert entry_.name == fetch.__qualname__
    assert entry_.callsite  # where s.step was called


async def test_a_renamed_scope_raises_resume_desync(store: Store) -> None:
    version = {"scope": "first"}

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            await s.step(lambda: 1, name="one")
            raise RuntimeError("fail after the first step")

        await agency.with_resumable_scope(version["scope"], body)

    assert (await agency.run(entry, run_id="desync", store=store)).status == "failed"
    version["scope"] = "second"
    result = await agency.run(entry, run_id="desync", store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "NondeterminismError"
    assert "Resume desync" in result.error.message
    assert "first" in result.error.message
    assert "second" in result.error.message


# -- threads and spend on replay ---------------------------------------------------------------


async def test_thread_messages_from_completed_steps_are_restored_once(store: Store) -> None:
    flaky = Flaky("s3")
    snapshots: list[list[str]] = []

    def contents() -> list[str]:
        return [f"{m.role}:{m.content}" for m in agency.thread.current().get_messages()]

    async def entry() -> list[str]:
        async def body(s: ResumableScope) -> list[str]:
            agency.thread.system("intro")  # outside any step: re-runs with the body

            def s1() -> None:
                agency.thread.user("q1")
                agency.thread.assistant("a1")

            def s2() -> None:
                agency.thread.user("q2")

            def s3() -> None:
                agency.thread.user("q3")
                flaky("s3")

            await s.step(s1, name="s1")
            await s.step(s2, name="s2")
            snapshots.append(contents())
            await s.step(s3, name="s3")
            return contents()

        return await agency.with_resumable_scope("chat", body)

    assert (await agency.run(entry, run_id="threads", store=store)).status == "failed"
    second = await agency.run(entry, run_id="threads", store=store)
    assert second.status == "completed"
    replayed = ["system:intro", "user:q1", "assistant:a1", "user:q2"]
    assert snapshots == [replayed, replayed]
    assert second.value == [*replayed, "user:q3"]
    assert flaky.calls == {"s3": 2}


async def test_new_threads_created_in_a_step_are_restored(store: Store) -> None:
    flaky = Flaky("fail")
    seen: list[list[str]] = []

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            def make_side_thread() -> str:
                thread_id = agency.thread.store().create(label="side")
                agency.thread.store().get(thread_id).add("user", "side note")
                return thread_id

            thread_id = await s.step(make_side_thread, name="side")
            side = agency.thread.store().get(thread_id)
            seen.append([str(m.content) for m in side.get_messages()])
            await s.step(lambda: flaky("fail"), name="fail")

        await agency.with_resumable_scope("side", body)

    assert (await agency.run(entry, run_id="side", store=store)).status == "failed"
    assert (await agency.run(entry, run_id="side", store=store)).status == "completed"
    assert seen == [["side note"], ["side note"]]


async def test_spend_in_completed_steps_is_not_charged_again(store: Store) -> None:
    flaky = Flaky("s3")

    async def entry() -> float:
        async def body(s: ResumableScope) -> float:
            def s1() -> None:
                agency.add_cost(0.5)
                agency.add_tokens(10)

            def s2() -> None:
                agency.add_cost(0.25)

            def s3() -> None:
                agency.add_cost(0.125)  # spent on every attempt: the money was spent
                flaky("s3")

            await s.step(s1, name="s1")
            await s.step(s2, name="s2")
            await s.step(s3, name="s3")
            return agency.ctx().cost

        return await agency.with_resumable_scope("spend", body)

    first = await agency.run(entry, run_id="spend", store=store)
    assert first.status == "failed"
    assert first.cost == pytest.approx(0.875)
    assert first.tokens == 10
    second = await agency.run(entry, run_id="spend", store=store)
    assert second.status == "completed"
    assert second.cost == pytest.approx(0.875 + 0.125)
    assert second.value == pytest.approx(1.0)
    assert second.tokens == 10
    assert flaky.calls == {"s3": 2}


# -- a corrupt journal -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "names"),
    [
        ("result", "sc/0"),
        ("deltas", "sc/0"),
        ("locals", "'sc'"),  # locals belong to the scope: the message names its address
        ("scopes", "sc/0"),
    ],
)
async def test_corrupt_step_row_fails_the_run_with_journal_corrupt_error(
    tmp_path: Path, column: str, names: str
) -> None:
    path = tmp_path / "corrupt.db"
    store = SqliteStore(path)
    flaky = Flaky("s2")

    async def entry() -> int:
        async def body(s: ResumableScope) -> int:
            def s1() -> int:
                s.set_local("seen", True)
                agency.thread.user("from s1")
                return int(flaky("s1", 1))

            one = await s.step(s1, name="s1")
            return one + await s.step(lambda: flaky("s2", 2), name="s2")

        return await agency.with_resumable_scope("sc", body)

    try:
        assert (await agency.run(entry, run_id="corrupt", store=store)).status == "failed"
        with sqlite3.connect(path) as conn:
            changed = conn.execute(
                f"UPDATE steps SET {column} = '{{bad' WHERE run_id = ? AND path = ?",
                ("corrupt", "sc/0"),
            ).rowcount
        assert changed == 1
        for _ in range(2):  # stays failed, never hangs or loops
            with anyio.fail_after(5):
                result = await agency.run(entry, run_id="corrupt", store=store)
            assert result.status == "failed"
            assert result.error is not None
            assert result.error.type == "JournalCorruptError"
            assert "'corrupt'" in result.error.message
            assert names in result.error.message
            assert isinstance(result.exception, JournalCorruptError)
        assert flaky.calls == {"s1": 1, "s2": 1}  # nothing after the damaged row ran
        assert (await agency.runs.get("corrupt", store=store)).status == "failed"
    finally:
        store.close()


# -- bad arguments -----------------------------------------------------------------------------


async def test_step_needs_a_callable() -> None:
    async def body(s: ResumableScope) -> None:
        with pytest.raises(InvalidArgumentError, match="callable"):
            await s.step(42)  # type: ignore[arg-type]
        # The failed call does not break the scope.
        assert await s.step(lambda: "ok", name="ok") == "ok"

    with agency.test_context():
        await agency.with_resumable_scope("args", body)


@pytest.mark.parametrize("name", ["", "a/b", "   ", "a~1"])
async def test_bad_scope_names_are_rejected(name: str) -> None:
    called: list[bool] = []

    with agency.test_context():
        with pytest.raises(InvalidArgumentError):
            await agency.with_resumable_scope(name, lambda s: called.append(True))
        with pytest.raises(InvalidArgumentError):
            await agency.with_resumable_scope(
                ResumableScopeOpts(name=name), lambda s: called.append(True)
            )
    assert called == []


async def test_bad_opts_and_body_are_rejected() -> None:
    with agency.test_context():
        with pytest.raises(InvalidArgumentError):
            await agency.with_resumable_scope(42, lambda s: None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await agency.with_resumable_scope("ok", "not callable")  # type: ignore[arg-type]


async def test_with_resumable_scope_outside_a_frame_raises() -> None:
    called: list[bool] = []
    with pytest.raises(OutsideFrameError) as caught:
        await agency.with_resumable_scope("x", lambda s: called.append(True))
    assert "with_resumable_scope" in str(caught.value)
    assert called == []
