"""Checkpoints and restore: deterministic ids, contents, rewinding a run, overrides, guards."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic_core import from_json

from agency_runtime import (
    Checkpoint,
    CheckpointError,
    OutsideFrameError,
    RestoreSignal,
    ResumableScope,
    Store,
    agency,
)

pytestmark = pytest.mark.anyio


# -- ids and contents (test frames) ----------------------------------------------------------


async def test_checkpoint_returns_a_string_id_and_two_at_one_place_differ() -> None:
    with agency.test_context():
        ids = [await agency.checkpoint() for _ in range(2)]
    assert all(isinstance(i, str) and i for i in ids)
    assert ids[0] != ids[1]


async def test_checkpoint_ids_are_the_same_when_the_same_code_runs_again(
    store: Store,
) -> None:
    async def entry() -> list[str]:
        ids = [await agency.checkpoint("top")]

        async def body(s: ResumableScope) -> None:
            await s.step(lambda: 1, name="first")
            ids.append(await agency.checkpoint())
            ids.append(await agency.checkpoint())

            async def inside() -> None:
                ids.append(await agency.checkpoint())

            await s.step(inside)

        await agency.with_resumable_scope("job", body)
        return ids

    first = await agency.run(entry, store=store)
    second = await agency.run(entry, store=store)
    assert first.status == second.status == "completed"
    assert first.run_id != second.run_id
    assert first.value == second.value
    assert len(set(first.value)) == 4  # every position (and ordinal) gets its own id

    with agency.test_context():
        in_test_frame = [await agency.checkpoint()]
    with agency.test_context():
        in_test_frame.append(await agency.checkpoint())
    assert in_test_frame[0] == in_test_frame[1]


async def test_get_checkpoint_returns_label_threads_globals_and_cost() -> None:
    with agency.test_context():
        agency.thread.user("before the checkpoint")
        agency.set_global("mood", "calm")
        agency.add_cost(0.25)
        checkpoint_id = await agency.checkpoint(label="start")
        agency.thread.user("after the checkpoint")
        agency.set_global("mood", "angry")
        agency.add_cost(0.5)
        checkpoint = agency.get_checkpoint(checkpoint_id)
        unlabelled = agency.get_checkpoint(await agency.checkpoint())

    assert isinstance(checkpoint, Checkpoint)
    assert checkpoint.checkpoint_id == checkpoint_id
    assert checkpoint.label == "start"
    assert unlabelled.label is None
    threads = from_json(checkpoint.threads)
    assert "before the checkpoint" in checkpoint.threads
    assert "after the checkpoint" not in checkpoint.threads
    assert threads  # real JSON, not an empty placeholder
    assert checkpoint.globals == {"": {"mood": "calm"}}
    assert checkpoint.cost == pytest.approx(0.25)
    assert unlabelled.cost == pytest.approx(0.75)
    assert "after the checkpoint" in unlabelled.threads


async def test_a_missing_checkpoint_id_is_a_checkpoint_error() -> None:
    with agency.test_context():
        with pytest.raises(CheckpointError, match="does not exist"):
            agency.get_checkpoint("cp:nowhere#7")
        with pytest.raises(CheckpointError, match="does not exist"):
            await agency.restore("cp:nowhere#7")


async def test_restore_raises_restore_signal_in_a_test_frame() -> None:
    with agency.test_context():
        checkpoint_id = await agency.checkpoint()
        with pytest.raises(RestoreSignal):
            await agency.restore(checkpoint_id)
        # A Checkpoint object works as well as its id.
        with pytest.raises(RestoreSignal):
            await agency.restore(agency.get_checkpoint(checkpoint_id))
    assert not issubclass(RestoreSignal, Exception)


# -- restore inside a run --------------------------------------------------------------------


async def test_restore_reruns_only_the_steps_after_the_checkpoint(store: Store) -> None:
    counts: Counter[str] = Counter()
    executions: list[int] = []

    def work(name: str) -> str:
        counts[name] += 1
        return name

    async def entry() -> list[str]:
        executions.append(1)

        async def body(s: ResumableScope) -> list[str]:
            done = [await s.step(lambda: work("before"), name="before")]
            checkpoint_id = await agency.checkpoint("middle")
            done.append(await s.step(lambda: work("after-1"), name="after-1"))
            done.append(await s.step(lambda: work("after-2"), name="after-2"))
            await agency.restore(checkpoint_id, max_restores=1)
            done.append(await s.step(lambda: work("last"), name="last"))
            return done

        return await agency.with_resumable_scope("job", body)

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    assert result.value == ["before", "after-1", "after-2", "last"]
    assert len(executions) == 2
    assert counts == {"before": 1, "after-1": 2, "after-2": 2, "last": 1}
    journal = await agency.runs.journal(result.run_id, store=store)
    assert [e.name for e in journal] == ["before", "after-1", "after-2", "last"]


async def test_restore_with_a_dict_overrides_keyword_arguments(store: Store) -> None:
    seen: list[tuple[int, int]] = []

    async def entry(y: int, *, x: int = 1) -> int:
        seen.append((y, x))
        checkpoint_id = await agency.checkpoint()
        if x == 1:
            await agency.restore(checkpoint_id, args={"x": 2})
        return x * 10 + y

    result = await agency.run(entry, 5, x=1, store=store)
    assert result.status == "completed", result.error
    assert seen == [(5, 1), (5, 2)]
    assert result.value == 25


async def test_restore_with_a_list_replaces_positional_arguments(store: Store) -> None:
    seen: list[tuple[Any, ...]] = []

    async def entry(a: int, b: int, *, tag: str = "t") -> str:
        seen.append((a, b, tag))
        checkpoint_id = await agency.checkpoint()
        if a == 1:
            await agency.restore(checkpoint_id, args=[7, 8])
        return f"{tag}:{a + b}"

    result = await agency.run(entry, 1, 2, tag="k", store=store)
    assert result.status == "completed", result.error
    assert seen == [(1, 2, "k"), (7, 8, "k")]
    assert result.value == "k:15"


async def test_restore_with_globals_sets_them_for_the_rerun(store: Store) -> None:
    seen: list[tuple[Any, Any, Any]] = []

    async def entry() -> Any:
        seen.append((agency.global_("a"), agency.global_("b"), agency.global_("k")))
        if agency.global_("a") is None:
            agency.set_global("a", 1)
        checkpoint_id = await agency.checkpoint()
        agency.set_global("b", 2)  # after the checkpoint: undone by the restore
        if agency.global_("k") is None:
            await agency.restore(checkpoint_id, globals={"k": "v"})
        return agency.global_("k")

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    assert result.value == "v"
    assert seen == [(None, None, None), (1, None, "v")]


async def test_restore_deletes_the_checkpoints_taken_after_it(store: Store) -> None:
    later_ids: list[str] = []
    found_on_rerun: list[bool] = []

    async def entry() -> None:
        first = await agency.checkpoint("first")
        if later_ids:  # the re-run: the later checkpoint was rewound away
            try:
                agency.get_checkpoint(later_ids[0])
                found_on_rerun.append(True)
            except CheckpointError:
                found_on_rerun.append(False)
        later_ids.append(await agency.checkpoint("later"))
        await agency.restore(first, max_restores=1)

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    assert found_on_rerun == [False]
    assert later_ids[0] == later_ids[1]


async def test_max_restores_restores_once_then_returns_silently(store: Store) -> None:
    executions: list[int] = []

    async def entry() -> str:
        executions.append(1)
        checkpoint_id = await agency.checkpoint()
        await agency.restore(checkpoint_id, max_restores=1)
        return "fell through"

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    assert result.value == "fell through"
    assert len(executions) == 2


@pytest.mark.parametrize(("succeeds_on", "attempts"), [(2, 2), (None, 4)])
async def test_a_restore_until_it_works_loop_ends(
    store: Store, succeeds_on: int | None, attempts: int
) -> None:
    tries: list[int] = []

    def attempt() -> bool:
        tries.append(1)
        return len(tries) == succeeds_on

    async def entry() -> bool:
        async def body(s: ResumableScope) -> bool:
            checkpoint_id = await agency.checkpoint()
            ok = await s.step(attempt)
            if not ok:
                await agency.restore(checkpoint_id, max_restores=3)
            return ok

        return await agency.with_resumable_scope("retry", body)

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    assert result.value is (succeeds_on is not None)
    assert len(tries) == attempts


async def test_more_than_100_restores_of_one_checkpoint_fail_the_run(store: Store) -> None:
    executions: list[int] = []

    async def entry() -> None:
        executions.append(1)
        checkpoint_id = await agency.checkpoint()
        await agency.restore(checkpoint_id)

    result = await agency.run(entry, store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "CheckpointError"
    assert "Possible infinite loop" in result.error.message
    assert isinstance(result.exception, CheckpointError)
    assert len(executions) == 101  # the first run and 100 restores


async def test_more_than_100_restores_in_one_run_fail_it_too(store: Store) -> None:
    executions: list[int] = []

    async def entry() -> None:
        executions.append(1)
        first = await agency.checkpoint("a")
        second = await agency.checkpoint("b")
        await agency.restore(first if len(executions) % 2 else second)

    result = await agency.run(entry, store=store)
    assert result.status == "failed"
    assert result.error is not None
    assert result.error.type == "CheckpointError"
    assert "infinite loop" in result.error.message.lower()
    assert len(executions) == 101  # no checkpoint passed 100 restores on its own


async def test_run_cost_never_decreases_across_a_restore(store: Store) -> None:
    seen: list[float] = []

    async def entry() -> float:
        seen.append(agency.ctx().cost)

        async def body(s: ResumableScope) -> None:
            await s.step(lambda: agency.add_cost(0.1), name="cheap")
            checkpoint_id = await agency.checkpoint()
            await s.step(lambda: agency.add_cost(0.2), name="dear")
            seen.append(agency.ctx().cost)
            await agency.restore(checkpoint_id, max_restores=1)

        await agency.with_resumable_scope("job", body)
        return agency.ctx().cost

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    # first execution: 0 → 0.3; the re-run starts from 0.3, not the checkpoint's 0.1,
    # replays "cheap" for free and pays for "dear" again.
    assert seen == pytest.approx([0.0, 0.3, 0.3, 0.5])
    assert result.cost == pytest.approx(0.5)
    assert result.value == pytest.approx(0.5)
    stored = await agency.runs.get(result.run_id, store=store)
    assert stored.cost_pico == round(0.5 * 1e12)


async def test_a_checkpoint_made_in_a_rerun_step_keeps_its_id(store: Store) -> None:
    made: list[str] = []
    looked_up: list[str | None] = []

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            start = await agency.checkpoint("start")

            async def inner() -> str:
                checkpoint_id = await agency.checkpoint("inner")
                made.append(checkpoint_id)
                looked_up.append(agency.get_checkpoint(checkpoint_id).label)
                return checkpoint_id

            await s.step(inner)
            await agency.restore(start, max_restores=1)

        await agency.with_resumable_scope("job", body)

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    assert len(made) == 2
    assert made[0] == made[1]
    assert looked_up == ["inner", "inner"]


async def test_restore_rolls_the_threads_back_to_the_checkpoint(store: Store) -> None:
    async def entry() -> list[str]:
        async def body(s: ResumableScope) -> None:
            await s.step(lambda: agency.thread.user("kept"), name="greet")
            checkpoint_id = await agency.checkpoint()
            agency.thread.assistant("said after the checkpoint")
            await s.step(lambda: agency.thread.user("redone"), name="again")
            await agency.restore(checkpoint_id, max_restores=1)

        await agency.with_resumable_scope("chat", body)
        return [str(m.content) for m in agency.thread.current().get_messages()]

    result = await agency.run(entry, store=store)
    assert result.status == "completed", result.error
    assert result.value == ["kept", "said after the checkpoint", "redone"]


async def test_a_checkpoint_survives_a_failure_and_restores_after_resume(store: Store) -> None:
    counts: Counter[str] = Counter()
    fail_once = [True]

    def work(name: str) -> str:
        counts[name] += 1
        return name

    async def entry() -> str:
        async def body(s: ResumableScope) -> str:
            checkpoint_id = await agency.checkpoint("before")
            await s.step(lambda: work("a"), name="a")
            if fail_once:
                fail_once.pop()
                raise RuntimeError("transient")
            await agency.restore(checkpoint_id, max_restores=1)
            return await s.step(lambda: work("b"), name="b")

        return await agency.with_resumable_scope("job", body)

    first = await agency.run(entry, run_id="cp-resume", store=store)
    assert first.status == "failed"
    assert counts == {"a": 1}
    second = await agency.run(entry, run_id="cp-resume", store=store)
    assert second.status == "completed", second.error
    assert second.value == "b"
    # the resume replayed "a", the restore rewound past it, so it ran once more
    assert counts == {"a": 2, "b": 1}


def test_checkpoint_readers_outside_a_frame_say_how_to_fix_it() -> None:
    with pytest.raises(OutsideFrameError, match="get_checkpoint"):
        agency.get_checkpoint("cp:/#0")


async def test_max_restores_is_remembered_when_the_run_resumes(store: Store) -> None:
    counts: Counter[str] = Counter()
    fail_once = [True]

    def flaky() -> str:
        counts["b"] += 1
        if fail_once:
            fail_once.pop()
            raise RuntimeError("transient")
        return "b"

    async def entry() -> None:
        async def body(s: ResumableScope) -> None:
            checkpoint_id = await agency.checkpoint()
            await s.step(lambda: counts.update(["a"]), name="a")
            await agency.restore(checkpoint_id, max_restores=1)  # used up on the first attempt
            await s.step(flaky)

        await agency.with_resumable_scope("job", body)

    first = await agency.run(entry, run_id="restore-budget", store=store)
    assert first.status == "failed"
    assert counts == {"a": 2, "b": 1}
    second = await agency.run(entry, run_id="restore-budget", store=store)
    assert second.status == "completed", second.error
    # "a" completed after the one allowed restore; resuming must not run it again
    assert counts == {"a": 2, "b": 2}
