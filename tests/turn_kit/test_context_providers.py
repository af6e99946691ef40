"""Context providers: definition, concurrent collection, normalisation, failures (spec §3, §9)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from pydantic import ValidationError

from agency_runtime import InvalidArgumentError
from agency_runtime.testing import FakeClock
from turn_kit._context_providers import (
    TurnContext,
    TurnContextArgs,
    TurnContextProvider,
    collect_turn_context,
    define_turn_context,
)
from turn_kit._history import TurnHistoryEntry
from turn_kit._identity import TurnConversation

pytestmark = pytest.mark.anyio


class LogCtx:
    """A ctx whose log records ``(level, message, attrs)``."""

    def __init__(self) -> None:
        self.memory = None
        self.logs: list[tuple[str, str, dict[str, Any]]] = []

    def log(self, level: str, message: str, **attrs: Any) -> None:
        self.logs.append((level, message, attrs))

    def events(self) -> list[str]:
        return [message for _, message, _ in self.logs]


def make_args(ctx: Any = None, history: list[TurnHistoryEntry] | None = None) -> TurnContextArgs:
    return TurnContextArgs(
        ctx=LogCtx() if ctx is None else ctx,
        conversation=TurnConversation(transport="telegram", id="8587:42"),
        input="remind me what is open",
        history=[] if history is None else history,
    )


def block(ident: str, **fields: Any) -> dict[str, Any]:
    return {"id": ident, "label": f"Label {ident}", "content": f"Content {ident}", **fields}


def ids(sections: list[TurnContext]) -> list[str]:
    return [section.id for section in sections]


# -- define_turn_context --------------------------------------------------------------------


def test_define_turn_context_builds_a_frozen_provider() -> None:
    def collect(args: TurnContextArgs) -> None:
        return None

    provider = define_turn_context(name="  task-store ", collect=collect)
    assert provider == TurnContextProvider(name="task-store", collect=collect, optional=False)
    assert define_turn_context(name="x", collect=collect, optional=True).optional is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        provider.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["", "   ", "\ufeff\n", None])
def test_define_turn_context_requires_a_name(name: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^turn context provider name is required$"):
        define_turn_context(name=name, collect=lambda args: None)


def test_define_turn_context_requires_a_callable_and_a_bool() -> None:
    with pytest.raises(InvalidArgumentError, match="callable collect"):
        define_turn_context(name="x", collect="not callable")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="optional must be a bool"):
        define_turn_context(name="x", collect=lambda args: None, optional="yes")  # type: ignore[arg-type]


# -- turn-kit.test.ts case 7 (the provider part) and case 11 --------------------------------


async def test_conformance_provider_sees_history_and_returns_a_dict_section() -> None:
    seen: list[str] = []

    def collect(args: TurnContextArgs) -> dict[str, Any]:
        seen.append(args.history[0].content)
        seen.append(args.input)
        seen.append(args.conversation.id)
        return {
            "id": "open-tasks",
            "label": "Open tasks",
            "content": "#7 Call Mom",
            "source": "task-store",
            "category": "workspace",
        }

    args = make_args(history=[TurnHistoryEntry(content="User: old\nAssistant: earlier")])
    context = await collect_turn_context(
        [define_turn_context(name="task-store", collect=collect)], args
    )
    assert context == [
        TurnContext(
            id="open-tasks",
            label="Open tasks",
            content="#7 Call Mom",
            source="task-store",
            category="workspace",
        )
    ]
    assert seen == ["User: old\nAssistant: earlier", "remind me what is open", "8587:42"]
    assert args.ctx.logs == [
        ("info", "turn-kit.context-collected", {"providers": 1, "sections": 1})
    ]


async def test_conformance_required_provider_fails_closed() -> None:
    error = RuntimeError("state unavailable")

    async def collect(args: TurnContextArgs) -> None:
        raise error

    args = make_args()
    with pytest.raises(RuntimeError, match="state unavailable") as caught:
        await collect_turn_context([define_turn_context(name="exact-state", collect=collect)], args)
    assert caught.value is error  # the original object, not an ExceptionGroup
    assert args.ctx.logs == [
        (
            "error",
            "turn-kit.context-provider-failed",
            {"provider": "exact-state", "optional": False, "error": "state unavailable"},
        )
    ]


async def test_conformance_optional_provider_degrades_to_nothing() -> None:
    async def collect(args: TurnContextArgs) -> None:
        raise RuntimeError("temporarily unavailable")

    args = make_args()
    provider = define_turn_context(name="nice-to-have", optional=True, collect=collect)
    assert await collect_turn_context([provider], args) == []
    assert args.ctx.logs == [
        (
            "warn",
            "turn-kit.context-provider-failed",
            {"provider": "nice-to-have", "optional": True, "error": "temporarily unavailable"},
        ),
        ("info", "turn-kit.context-collected", {"providers": 1, "sections": 0}),
    ]


# -- concurrency ----------------------------------------------------------------------------


async def test_providers_run_concurrently_and_results_keep_provider_order() -> None:
    first_started = anyio.Event()
    second_started = anyio.Event()
    second_finished = anyio.Event()
    finished: list[str] = []

    async def slow_first(args: TurnContextArgs) -> dict[str, Any]:
        first_started.set()
        await second_started.wait()  # deadlocks unless the providers overlap
        await second_finished.wait()  # the first provider finishes last
        finished.append("first")
        return block("first")

    async def slow_second(args: TurnContextArgs) -> list[dict[str, Any]]:
        second_started.set()
        await first_started.wait()
        finished.append("second")
        second_finished.set()
        return [block("second-a"), block("second-b")]

    providers = [
        define_turn_context(name="first", collect=slow_first),
        define_turn_context(name="second", collect=slow_second),
    ]
    with anyio.fail_after(5):
        context = await collect_turn_context(providers, make_args())
    assert finished == ["second", "first"]
    assert ids(context) == ["first", "second-a", "second-b"]


async def test_two_slow_providers_overlap_in_time() -> None:
    clock = FakeClock()

    async def slow(args: TurnContextArgs) -> None:
        await clock.sleep(0.2)  # 0.2 s of the fake clock

    providers = [define_turn_context(name=f"p{i}", collect=slow) for i in range(2)]
    collected: list[list[TurnContext]] = []

    async def collect() -> None:
        collected.append(await collect_turn_context(providers, make_args()))

    async with anyio.create_task_group() as group:
        group.start_soon(collect)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 2  # both providers wait at the same time
        clock.advance(0.2)
    assert collected == [[]]
    assert clock.monotonic() == 0.2  # 0.2 s for the two of them: they overlapped


async def test_a_required_failure_cancels_the_other_providers() -> None:
    cancelled: list[str] = []
    hanging = anyio.Event()

    async def hangs(args: TurnContextArgs) -> None:
        try:
            hanging.set()
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append("hangs")
            raise

    async def fails(args: TurnContextArgs) -> None:
        await hanging.wait()  # fails while the other provider is in flight
        raise LookupError("no state")

    providers = [
        define_turn_context(name="hangs", collect=hangs),
        define_turn_context(name="fails", collect=fails),
    ]
    args = make_args()
    with anyio.fail_after(5), pytest.raises(LookupError, match="no state"):
        await collect_turn_context(providers, args)
    assert cancelled == ["hangs"]
    assert "turn-kit.context-collected" not in args.ctx.events()


async def test_the_first_required_failure_in_time_is_raised() -> None:
    early_failed = anyio.Event()

    async def late(args: TurnContextArgs) -> None:
        await early_failed.wait()  # fails after the other one did (if it still runs)
        await anyio.lowlevel.checkpoint()
        raise RuntimeError("late")

    async def early(args: TurnContextArgs) -> None:
        early_failed.set()
        raise KeyError("early")

    providers = [
        define_turn_context(name="late", collect=late),
        define_turn_context(name="early", collect=early),
    ]
    with pytest.raises(KeyError, match="early"):
        await collect_turn_context(providers, make_args())


async def test_an_optional_failure_does_not_stop_the_others() -> None:
    failed = anyio.Event()

    async def fails(args: TurnContextArgs) -> None:
        failed.set()
        raise RuntimeError("optional down")

    async def works(args: TurnContextArgs) -> dict[str, Any]:
        await failed.wait()  # still in flight when the optional provider fails
        return block("kept")

    providers = [
        define_turn_context(name="fails", collect=fails, optional=True),
        define_turn_context(name="works", collect=works),
    ]
    assert ids(await collect_turn_context(providers, make_args())) == ["kept"]


async def test_a_control_flow_signal_propagates_as_itself() -> None:
    class Signal(BaseException):
        pass

    signal = Signal()

    async def pauses(args: TurnContextArgs) -> None:
        raise signal

    args = make_args()
    with pytest.raises(Signal) as caught:
        await collect_turn_context(
            [define_turn_context(name="pauses", collect=pauses, optional=True)], args
        )
    assert caught.value is signal
    assert args.ctx.logs == []  # a signal is not a provider failure


# -- results and normalisation --------------------------------------------------------------


async def test_sync_async_and_awaitable_returning_collects() -> None:
    async def make() -> dict[str, Any]:
        return block("from-awaitable")

    async def async_collect(args: TurnContextArgs) -> TurnContext:
        return TurnContext(id="from-async", label="A", content="a")

    providers = [
        define_turn_context(name="sync", collect=lambda args: block("from-sync")),
        define_turn_context(name="async", collect=async_collect),
        define_turn_context(name="awaitable", collect=lambda args: make()),
        define_turn_context(name="none", collect=lambda args: None),
        define_turn_context(name="empty", collect=lambda args: []),
        define_turn_context(name="tuple", collect=lambda args: (block("t1"), block("t2"))),
    ]
    args = make_args()
    context = await collect_turn_context(providers, args)
    assert ids(context) == ["from-sync", "from-async", "from-awaitable", "t1", "t2"]
    assert args.ctx.logs == [
        ("info", "turn-kit.context-collected", {"providers": 6, "sections": 5})
    ]


async def test_sections_are_trimmed_and_keep_their_other_fields() -> None:
    raw = TurnContext(
        id="  tasks\n",
        label="\ufeffOpen tasks ",
        content="\n  #7 Call Mom  \n",
        importance="high",
        source="  task-store  ",
        category="workspace",
        metadata={"count": 1},
    )
    mixed = [raw, {"id": " b ", "label": " B ", "content": " b ", "source": None}]
    context = await collect_turn_context(
        [define_turn_context(name="p", collect=lambda args: mixed)], make_args()
    )
    assert context == [
        TurnContext(
            id="tasks",
            label="Open tasks",
            content="#7 Call Mom",
            importance="high",
            source="task-store",
            category="workspace",
            metadata={"count": 1},
        ),
        TurnContext(id="b", label="B", content="b"),
    ]
    assert raw.id == "  tasks\n"  # the provider's object is not mutated


async def test_trimming_follows_javascript() -> None:
    section = {"id": "\x1c", "label": "L", "content": "\x1fbody\x1f"}
    context = await collect_turn_context(
        [define_turn_context(name="p", collect=lambda args: section)], make_args()
    )
    assert (context[0].id, context[0].content) == ("\x1c", "\x1fbody\x1f")


@pytest.mark.parametrize(
    "section",
    [
        block("  "),
        {**block("x"), "label": ""},
        {**block("x"), "content": " \n\t "},
        {**block("x"), "content": "\u3000\ufeff"},
        {"label": "L", "content": "c"},
        {"id": "x", "content": "c"},
        {"id": "x", "label": "L"},
        {"id": None, "label": "L", "content": "c"},
        TurnContext(id="x", label="L", content="   "),
    ],
)
async def test_empty_sections_fail_the_provider(section: Any) -> None:
    args = make_args()
    provider = define_turn_context(name="bad", collect=lambda args: [block("ok"), section])
    with pytest.raises(
        InvalidArgumentError, match=r"^turn context provider bad returned an empty section$"
    ):
        await collect_turn_context([provider], args)
    level, message, attrs = args.ctx.logs[0]
    assert (level, message, attrs["provider"]) == (
        "error",
        "turn-kit.context-provider-failed",
        "bad",
    )
    assert attrs["error"] == "turn context provider bad returned an empty section"

    optional_args = make_args()
    optional = define_turn_context(
        name="bad", optional=True, collect=lambda args: [block("ok"), section]
    )
    assert await collect_turn_context([optional], optional_args) == []  # the whole provider goes
    assert optional_args.ctx.logs[0][0] == "warn"


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        ("a string", "returned str"),
        (5, "returned int"),
        ({**block("x"), "category": "nonsense"}, "invalid section"),
        ({**block("x"), "importance": "urgent"}, "invalid section"),
        ({**block("x"), "id": 5}, "invalid section"),
        ([block("x"), "not a section"], "returned a str section"),
        ([[block("x")]], "returned a list section"),
    ],
)
async def test_malformed_results_fail_the_provider(returned: Any, match: str) -> None:
    provider = define_turn_context(name="weird", collect=lambda args: returned)
    with pytest.raises(InvalidArgumentError, match=match):
        await collect_turn_context([provider], make_args())
    optional = define_turn_context(name="weird", optional=True, collect=lambda args: returned)
    assert await collect_turn_context([optional], make_args()) == []


async def test_unknown_section_keys_are_ignored() -> None:
    context = await collect_turn_context(
        [define_turn_context(name="p", collect=lambda args: {**block("x"), "extra": 1})],
        make_args(),
    )
    assert context == [TurnContext(id="x", label="Label x", content="Content x")]


# -- duplicate ids --------------------------------------------------------------------------


@pytest.mark.parametrize("optional", [False, True])
async def test_duplicate_ids_raise_without_logging_even_from_optional_providers(
    optional: bool,
) -> None:
    args = make_args()
    providers = [
        define_turn_context(name="first", collect=lambda args: block("shared")),
        define_turn_context(
            name="second", optional=optional, collect=lambda args: block(" shared ")
        ),
    ]
    with pytest.raises(InvalidArgumentError, match=r"^duplicate turn context id: shared$"):
        await collect_turn_context(providers, args)
    assert args.ctx.logs == []


async def test_duplicate_ids_within_one_provider_raise() -> None:
    provider = define_turn_context(
        name="p", optional=True, collect=lambda args: [block("a"), block("a")]
    )
    with pytest.raises(InvalidArgumentError, match="duplicate turn context id: a"):
        await collect_turn_context([provider], make_args())


# -- arguments ------------------------------------------------------------------------------


async def test_no_providers_collects_nothing() -> None:
    args = make_args()
    assert await collect_turn_context([], args) == []
    assert args.ctx.logs == [
        ("info", "turn-kit.context-collected", {"providers": 0, "sections": 0})
    ]


async def test_dict_providers_and_dict_args_are_accepted() -> None:
    providers: list[Any] = [{"name": "d", "collect": lambda args: block(args.input)}]
    args: Any = {
        "ctx": LogCtx(),
        "conversation": TurnConversation(transport="t", id="1"),
        "input": "hello",
        "history": [],
    }
    assert ids(await collect_turn_context(providers, args)) == ["hello"]


async def test_non_providers_are_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="define_turn_context"):
        await collect_turn_context([lambda args: None], make_args())  # type: ignore[list-item]
    single: Any = define_turn_context(name="x", collect=lambda args: None)
    with pytest.raises(InvalidArgumentError, match="list of providers"):
        await collect_turn_context(single, make_args())


async def test_a_ctx_without_log_is_fine() -> None:
    async def fails(args: TurnContextArgs) -> None:
        raise RuntimeError("down")

    args = make_args(ctx=SimpleNamespace())
    providers = [
        define_turn_context(name="fails", optional=True, collect=fails),
        define_turn_context(name="ok", collect=lambda args: block("ok")),
    ]
    assert ids(await collect_turn_context(providers, args)) == ["ok"]


def test_turn_context_model() -> None:
    section = TurnContext(id="a", label="A", content="x", category="guardrail", importance="low")
    assert TurnContext.model_validate_json(section.model_dump_json()) == section
    with pytest.raises(ValidationError):
        TurnContext(id="a", label="A", content="x", category="nope")  # type: ignore[arg-type]
    assert (
        TurnContextArgs(
            ctx=None, conversation=TurnConversation(transport="t", id="1"), input="i", history=[]
        ).input
        == "i"
    )
