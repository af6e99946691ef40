"""Frames and the context members of the ``agency`` namespace (spec: agency.test, asyncContext)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from agency_runtime import (
    AbortSignal,
    AgencyCancelledError,
    CallsiteLocation,
    InvalidArgumentError,
    OutsideFrameError,
    RuntimeContext,
    ThreadStore,
    agency,
)
from agency_runtime._core._context import BranchState
from agency_runtime._core._frame import Frame, Position, ScopeState

pytestmark = pytest.mark.anyio

LOC = CallsiteLocation(module_id="mod", scope_name="scope", step_path="2")


# -- strict and lax readers outside a frame ------------------------------------------------


@pytest.mark.parametrize(
    ("call", "member"),
    [
        (lambda: agency.ctx(), "ctx()"),
        (lambda: agency.global_("x"), "global_()"),
        (lambda: agency.set_global("x", 1), "set_global()"),
        (lambda: agency.abort_signal(), "abort_signal()"),
        (lambda: agency.add_cost(0.1), "add_cost()"),
        (lambda: agency.add_tokens(1), "add_tokens()"),
        (lambda: agency.with_callsite(LOC, lambda: None), "with_callsite()"),
        (lambda: agency.at_callsite(LOC).__enter__(), "at_callsite()"),
    ],
)
def test_strict_readers_outside_a_frame_name_the_member_and_the_fix(call, member) -> None:
    with pytest.raises(OutsideFrameError) as caught:
        call()
    message = str(caught.value)
    assert f"agency.{member}" in message
    assert "agency.run" in message
    assert "with_test_context" in message
    assert caught.value.member == member


def test_lax_readers_outside_a_frame_return_none() -> None:
    assert agency.ctx_maybe() is None
    assert agency.callsite() is None


def test_outside_frame_error_is_an_agency_error_and_a_runtime_error() -> None:
    with pytest.raises(RuntimeError):
        agency.ctx()


# -- frames --------------------------------------------------------------------------------


def test_frames_are_immutable_and_evolve_into_copies() -> None:
    ctx = RuntimeContext("r")
    frame = Frame(ctx, BranchState.for_context(ctx), ThreadStore.with_default_active())
    with pytest.raises(AttributeError, match="immutable"):
        frame.callsite = ("a", "b", "c")  # type: ignore[misc]
    moved = frame.evolve(callsite=("a", "b", "c"))
    assert moved is not frame
    assert moved.callsite == ("a", "b", "c")
    assert frame.callsite is None
    assert moved.ctx is ctx
    assert moved.globals is ctx.globals


def test_frames_are_immutable_even_to_object_setattr_and_compare_by_identity() -> None:
    ctx = RuntimeContext("r")
    frame = Frame(ctx, BranchState.for_context(ctx), ThreadStore.with_default_active())
    with pytest.raises(AttributeError):
        object.__setattr__(frame, "callsite", ("a", "b", "c"))
    assert frame.callsite is None
    with pytest.raises(TypeError, match="no field 'colour'"):
        frame.evolve(colour="red")
    same_fields = frame.evolve()
    assert same_fields is not frame
    assert same_fields != frame  # identity, as for any object: not field by field
    assert frame == frame
    assert len({frame, same_fields}) == 2  # hashable, although its globals are a dict
    state = ScopeState("s", "s", (("", 0, "s"),))
    at = frame.at(("m", "s", "0"), state, "s/0")
    assert (at.callsite, at.position, at.ctx, at.globals) == (
        ("m", "s", "0"), Position(state, "s/0"), ctx, ctx.globals,
    )  # fmt: skip
    assert type(at.position) is Position
    assert at.position.scope is state


def test_test_context_yields_its_frame_and_pops_it() -> None:
    with agency.test_context() as frame:
        assert agency.ctx() is frame.ctx
        assert agency.ctx_maybe() is frame.ctx
        assert agency.thread.store() is frame.threads
        assert frame.threads.active_id() == "0"
        assert frame.ctx.run_id is None
    assert agency.ctx_maybe() is None


def test_test_context_uses_the_parts_given() -> None:
    ctx = RuntimeContext("run-7", subprocess_depth=2)
    threads = ThreadStore()
    stack = BranchState.for_context(ctx)
    with agency.test_context(ctx=ctx, stack=stack, threads=threads) as frame:
        assert agency.ctx() is ctx
        assert agency.ctx().subprocess_depth == 2
        assert frame.stack is stack
        assert agency.thread.store() is threads
        assert agency.abort_signal() is stack.abort_signal


def test_test_context_rejects_parts_of_the_wrong_type() -> None:
    with pytest.raises(InvalidArgumentError, match="ctx must be a RuntimeContext"):
        agency.test_context(ctx="nope").__enter__()  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="threads must be a ThreadStore"):
        agency.test_context(threads=[]).__enter__()  # type: ignore[arg-type]


async def test_with_test_context_runs_sync_and_async_fns_and_returns_their_value() -> None:
    assert await agency.with_test_context(fn=lambda: agency.ctx().tokens) == 0

    async def body() -> str:
        await anyio.lowlevel.checkpoint()
        agency.thread.user("hello")
        return agency.thread.current().get_messages()[0].content  # type: ignore[return-value]

    assert await agency.with_test_context(fn=body) == "hello"
    assert agency.ctx_maybe() is None


async def test_with_test_context_accepts_fn_positionally_and_explicit_parts() -> None:
    ctx = RuntimeContext("explicit")
    assert await agency.with_test_context(lambda: agency.ctx().run_id) is None
    assert await agency.with_test_context(ctx=ctx, fn=lambda: agency.ctx().run_id) == "explicit"


async def test_with_test_context_without_fn_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="needs fn="):
        await agency.with_test_context()


async def test_with_test_context_pops_the_frame_when_fn_raises() -> None:
    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await agency.with_test_context(fn=boom)
    assert agency.ctx_maybe() is None


async def test_child_tasks_inherit_the_frame_and_their_changes_stay_theirs() -> None:
    seen: dict[str, object] = {}

    async def child() -> None:
        seen["ctx"] = agency.ctx()
        with agency.at_callsite(("m", "child", "0")):
            seen["inner"] = agency.callsite()
            await anyio.lowlevel.checkpoint()

    with agency.test_context() as frame:
        async with anyio.create_task_group() as group:
            group.start_soon(child)
            await anyio.lowlevel.checkpoint()
            assert agency.callsite() is None
        assert seen["ctx"] is frame.ctx
        assert seen["inner"] == CallsiteLocation(module_id="m", scope_name="child", step_path="0")


# -- callsite ------------------------------------------------------------------------------


async def test_with_callsite_sets_and_restores_the_previous_callsite() -> None:
    with agency.test_context():
        assert agency.callsite() is None
        outer = await agency.with_callsite(LOC, agency.callsite)
        assert outer == LOC

        async def nested() -> tuple[object, object]:
            inner = await agency.with_callsite(("m2", "s2", "0"), agency.callsite)
            return inner, agency.callsite()

        inner, after = await agency.with_callsite(LOC, nested)
        assert inner == CallsiteLocation(module_id="m2", scope_name="s2", step_path="0")
        assert after == LOC
        assert agency.callsite() is None


async def test_with_callsite_restores_the_callsite_when_fn_raises() -> None:
    def boom() -> None:
        raise ValueError("no")

    with agency.test_context():
        with pytest.raises(ValueError, match="no"):
            await agency.with_callsite(LOC, boom)
        assert agency.callsite() is None


def test_at_callsite_is_the_context_manager_form() -> None:
    with agency.test_context(), agency.at_callsite(LOC) as loc:
        assert loc == LOC
        assert agency.callsite() == LOC


def test_with_callsite_rejects_a_bad_location_and_a_bad_fn() -> None:
    with agency.test_context():
        with pytest.raises(InvalidArgumentError, match="CallsiteLocation"):
            agency.with_callsite("mod#2", lambda: None)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="callable"):
            agency.with_callsite(LOC, 42)  # type: ignore[arg-type]


# -- globals -------------------------------------------------------------------------------


def test_global_defaults_module_id_to_empty_and_reads_the_frame_globals() -> None:
    ctx = RuntimeContext(globals={"": {"API": "k"}, "config": {"API": "c"}})
    with agency.test_context(ctx=ctx) as frame:
        assert agency.global_("API") == "k"
        assert agency.global_("API", "config") == "c"
        assert agency.global_("missing") is None
        assert agency.global_("missing", default=3) == 3
        agency.set_global("added", [1], module_id="config")
        assert frame.globals["config"]["added"] == [1]


def test_global_reads_the_frames_globals_not_the_contexts() -> None:
    ctx = RuntimeContext(globals={"": {"x": "run"}})
    with agency.test_context(ctx=ctx) as frame:
        branch = frame.evolve(globals={"": {"x": "branch"}})
        from agency_runtime._core._frame import use_frame

        with use_frame(branch):
            assert agency.global_("x") == "branch"
        assert agency.global_("x") == "run"


# -- cost and tokens -----------------------------------------------------------------------


def test_add_cost_adds_to_the_run() -> None:
    with agency.test_context() as frame:
        agency.add_cost(0.25)
        assert frame.ctx.cost == 0.25


def test_money_adds_up_exactly() -> None:
    with agency.test_context() as frame:
        for _ in range(3):
            agency.add_cost(0.1)
        assert frame.ctx.cost == 0.3
        assert frame.ctx.cost_pico == 300_000_000_000


@pytest.mark.parametrize("amount", [-0.01, float("nan"), float("inf"), "1", None, True])
def test_add_cost_rejects_bad_amounts_before_changing_anything(amount: object) -> None:
    with agency.test_context() as frame:
        agency.add_cost(0.5)
        with pytest.raises(InvalidArgumentError, match="add_cost"):
            agency.add_cost(amount)  # type: ignore[arg-type]
        assert frame.ctx.cost == 0.5


def test_add_tokens_counts_and_rejects_bad_counts() -> None:
    with agency.test_context() as frame:
        agency.add_tokens(5)
        agency.add_tokens(7)
        assert frame.ctx.tokens == 12
        for bad in (-1, 1.5, "3", False):
            with pytest.raises(InvalidArgumentError, match="add_tokens"):
                agency.add_tokens(bad)  # type: ignore[arg-type]
        assert frame.ctx.tokens == 12


def test_invalid_argument_error_is_a_value_error() -> None:
    with agency.test_context(), pytest.raises(ValueError, match="non-negative"):
        agency.add_cost(-1)


def test_runtime_context_validates_its_inputs() -> None:
    with pytest.raises(InvalidArgumentError):
        RuntimeContext(subprocess_depth=-1)
    with pytest.raises(InvalidArgumentError):
        RuntimeContext(tokens=-3)
    assert RuntimeContext(cost=1.5, tokens=3).cost == 1.5


# -- cancellation --------------------------------------------------------------------------


def test_cancel_is_idempotent_and_fires_the_branch_signal() -> None:
    with agency.test_context() as frame:
        signal = agency.abort_signal()
        assert not signal.aborted
        assert not frame.ctx.is_cancelled()
        frame.ctx.cancel("user pressed stop")
        frame.ctx.cancel("second reason is ignored")
        assert frame.ctx.is_cancelled()
        assert signal.aborted
        assert isinstance(signal.reason, AgencyCancelledError)
        assert str(signal.reason) == "Agent execution was cancelled: user pressed stop"
        assert signal.reason.agency_cause == {"kind": "userKill"}
        with pytest.raises(AgencyCancelledError):
            signal.raise_if_aborted()


async def test_abort_signal_wait_returns_the_reason() -> None:
    signal = AbortSignal()
    got: list[BaseException] = []

    async def waiter() -> None:
        got.append(await signal.wait())

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.lowlevel.checkpoint()
        signal.abort(RuntimeError("stop"))
    assert isinstance(got[0], RuntimeError)
    assert isinstance(await signal.wait(), RuntimeError)  # already fired: returns at once


def test_abort_signal_callbacks_run_once_and_can_unsubscribe() -> None:
    signal = AbortSignal()
    calls: list[str] = []
    signal.add_callback(lambda reason: calls.append("kept"))
    unsubscribe = signal.add_callback(lambda reason: calls.append("dropped"))
    unsubscribe()
    signal.abort()
    signal.abort()
    assert calls == ["kept"]
    signal.add_callback(lambda reason: calls.append("late"))
    assert calls == ["kept", "late"]
    assert repr(signal).startswith("<AbortSignal aborted")


def test_a_branch_signal_follows_its_parent_but_not_the_other_way() -> None:
    parent = AbortSignal()
    child = AbortSignal(parent=parent)
    child.abort()
    assert not parent.aborted
    other = AbortSignal(parent=parent)
    parent.abort()
    assert other.aborted
