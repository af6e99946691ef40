"""Tests of ``agency.thread.*`` and ``agency.threads.*`` through the public namespace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from agency_runtime import (
    InvalidArgumentError,
    Message,
    MessageThread,
    OutsideFrameError,
    ThreadStore,
    agency,
)

pytestmark = pytest.mark.anyio


class Boom(Exception):
    """Raised on purpose by test bodies."""


def _contents(thread: MessageThread) -> list[tuple[str, Any]]:
    return [(m.role, m.content) for m in thread.messages]


# -- thread.user / system / assistant ------------------------------------------------------


def test_user_system_assistant_push_one_message_each_and_return_none() -> None:
    with agency.test_context() as frame:
        assert agency.thread.system("be brief") is None  # type: ignore[func-returns-value]
        assert agency.thread.user("hi") is None  # type: ignore[func-returns-value]
        assert agency.thread.assistant("hello") is None  # type: ignore[func-returns-value]
        thread = frame.threads.get("0")
        assert _contents(thread) == [
            ("system", "be brief"),
            ("user", "hi"),
            ("assistant", "hello"),
        ]
        assert frame.threads.ids() == ["0"]


def test_user_accepts_content_parts() -> None:
    parts = [{"type": "text", "text": "look"}]
    with agency.test_context() as frame:
        agency.thread.user(parts)
        assert frame.threads.get("0").messages == [Message(role="user", content=parts)]


def test_user_rejects_bad_content() -> None:
    with agency.test_context() as frame:
        with pytest.raises(InvalidArgumentError):
            agency.thread.user(42)  # type: ignore[arg-type]
        assert frame.threads.get("0").messages == []


def test_push_goes_to_the_active_thread_only() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    store.push_active("1")
    with agency.test_context(threads=store):
        agency.thread.user("to one")
    assert _contents(store.get("1")) == [("user", "to one")]
    assert store.get("0").messages == []


def test_user_creates_active_thread_when_none() -> None:
    store = ThreadStore()
    with agency.test_context(threads=store):
        agency.thread.user("hi")
    assert store.active_id() == "0"
    assert _contents(store.get("0")) == [("user", "hi")]


# -- thread.current / store / store_maybe --------------------------------------------------


def test_current_returns_the_active_thread() -> None:
    with agency.test_context() as frame:
        thread = agency.thread.current()
        assert thread is frame.threads.active()
        assert thread.id == "0"
        assert agency.thread.current() is thread
        assert frame.threads.ids() == ["0"]


def test_current_creates_and_activates_a_thread_when_none_is_active() -> None:
    store = ThreadStore()
    with agency.test_context(threads=store) as frame:
        assert frame.threads is store
        assert agency.threads.current() is None
        thread = agency.thread.current()
        assert thread.id == "0"
        assert store.active_id() == "0"
        assert agency.thread.current() is thread
        assert agency.threads.current() is thread
    assert store.ids() == ["0"]


def test_store_and_store_maybe_return_the_frame_store() -> None:
    store = ThreadStore.with_default_active()
    with agency.test_context(threads=store):
        assert agency.thread.store() is store
        assert agency.thread.store_maybe() is store


def test_default_test_context_has_thread_zero_active() -> None:
    with agency.test_context():
        store = agency.thread.store()
        assert store.ids() == ["0"]
        assert store.active_id() == "0"


async def test_with_test_context_returns_fn_value_and_uses_given_store() -> None:
    store = ThreadStore.with_default_active()

    def body() -> str:
        agency.thread.user("hi")
        assert agency.thread.store() is store
        return "done"

    assert await agency.with_test_context(threads=store, fn=body) == "done"
    assert _contents(store.get("0")) == [("user", "hi")]


async def test_with_test_context_async_fn() -> None:
    async def body() -> int:
        await anyio.lowlevel.checkpoint()
        agency.thread.assistant("a")
        return len(agency.thread.current().messages)

    assert await agency.with_test_context(fn=body) == 1


# -- thread.with_ --------------------------------------------------------------------------


async def test_with_runs_sync_fn_with_thread_active_and_restores() -> None:
    store = ThreadStore.with_default_active()
    store.create()

    def body() -> str:
        agency.thread.user("inside")
        return agency.thread.current().id

    async def outer() -> str:
        result = await agency.thread.with_("t1", body)
        assert agency.thread.current().id == "0"
        return result

    assert await agency.with_test_context(threads=store, fn=outer) == "1"
    assert _contents(store.get("1")) == [("user", "inside")]
    assert store.get("0").messages == []
    assert store.active_id() == "0"


async def test_with_runs_async_fn_with_thread_active_and_restores() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    seen: list[str | None] = []

    async def body() -> int:
        await anyio.lowlevel.checkpoint()
        seen.append(agency.thread.current().id)
        agency.thread.assistant("async inside")
        return 7

    async def outer() -> int:
        result = await agency.thread.with_("1", body)
        seen.append(agency.thread.current().id)
        return result

    assert await agency.with_test_context(threads=store, fn=outer) == 7
    assert seen == ["1", "0"]
    assert _contents(store.get("1")) == [("assistant", "async inside")]
    assert store.active_id() == "0"


async def test_with_restores_active_thread_when_fn_raises() -> None:
    store = ThreadStore.with_default_active()
    store.create()

    async def body() -> None:
        assert agency.thread.current().id == "1"
        raise Boom("nope")

    async def outer() -> str | None:
        with pytest.raises(Boom):
            await agency.thread.with_(1, body)
        return agency.thread.current().id

    assert await agency.with_test_context(threads=store, fn=outer) == "0"
    assert store.active_id() == "0"


async def test_with_restores_active_thread_when_sync_fn_raises() -> None:
    store = ThreadStore.with_default_active()
    store.create()

    def body() -> None:
        raise Boom("nope")

    with agency.test_context(threads=store):
        with pytest.raises(Boom):
            await agency.thread.with_("t1", body)
        assert agency.thread.current().id == "0"
        assert agency.threads.current() is store.get("0")


async def test_with_nested_switches_unwind_in_order() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    store.create()
    seen: list[str] = []

    async def innermost() -> None:
        seen.append(agency.thread.current().id)

    async def middle() -> None:
        seen.append(agency.thread.current().id)
        await agency.thread.with_("t2", innermost)
        seen.append(agency.thread.current().id)

    with agency.test_context(threads=store):
        await agency.thread.with_("t1", middle)
        seen.append(agency.thread.current().id)
    assert seen == ["1", "2", "1", "0"]


async def test_with_a_new_thread_id_creates_that_thread() -> None:
    """As the original's pushActive (agency.test.ts "with pushes/pops the active stack")."""
    seen: list[str] = []
    with agency.test_context():

        def inside() -> None:
            seen.append(agency.thread.current().id)
            agency.thread.user("hello")

        await agency.thread.with_("t9", inside)
        assert agency.thread.current().id == "0"  # the previous thread is active again
        with agency.thread.use("notes") as notes:
            seen.append(notes.id)
        assert [m.content for m in agency.thread.store().get("t9").get_messages()] == ["hello"]
        assert agency.thread.store().create() == "10"  # counted after the id it was given
    assert seen == ["9", "notes"]


async def test_with_rejects_non_callable() -> None:
    with agency.test_context(), pytest.raises(InvalidArgumentError, match="callable"):
        await agency.thread.with_("0", "not callable")  # type: ignore[arg-type]


# -- thread.use ----------------------------------------------------------------------------


def test_use_switches_and_restores() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    with agency.test_context(threads=store):
        with agency.thread.use("t1") as thread:
            assert thread is store.get("1")
            assert agency.thread.current() is thread
            assert agency.threads.current() is thread
            agency.thread.user("via use")
        assert agency.thread.current().id == "0"
    assert _contents(store.get("1")) == [("user", "via use")]
    assert store.get("0").messages == []
    assert store.active_id() == "0"


def test_use_restores_when_body_raises() -> None:
    store = ThreadStore.with_default_active()
    store.create()

    def switch_and_fail() -> None:
        with agency.thread.use(1):
            assert agency.thread.current().id == "1"
            raise Boom("inside use")

    with agency.test_context(threads=store):
        with pytest.raises(Boom):
            switch_and_fail()
        assert agency.thread.current().id == "0"
    assert store.active_id() == "0"


async def test_switch_in_one_task_does_not_affect_sibling() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    switched = anyio.Event()
    checked = anyio.Event()
    seen: dict[str, Any] = {}

    async def switcher() -> None:
        with agency.thread.use("t1"):
            switched.set()
            await checked.wait()
            seen["switcher"] = agency.thread.current().id
        seen["switcher_after"] = agency.thread.current().id

    async def sibling() -> None:
        await switched.wait()
        seen["sibling"] = agency.thread.current().id
        seen["sibling_store_active"] = agency.thread.store().active_id()
        agency.thread.user("from sibling")
        checked.set()

    async def body() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(switcher)
            tg.start_soon(sibling)

    with anyio.fail_after(5):
        await agency.with_test_context(threads=store, fn=body)
    assert seen == {
        "switcher": "1",
        "switcher_after": "0",
        "sibling": "0",
        "sibling_store_active": "0",
    }
    assert _contents(store.get("0")) == [("user", "from sibling")]
    assert store.get("1").messages == []


async def test_with_in_one_task_does_not_affect_sibling() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    switched = anyio.Event()
    checked = anyio.Event()
    seen: list[str] = []

    async def inside() -> None:
        switched.set()
        await checked.wait()

    async def switcher() -> None:
        await agency.thread.with_("1", inside)

    async def sibling() -> None:
        await switched.wait()
        seen.append(agency.thread.current().id)
        checked.set()

    async def body() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(switcher)
            tg.start_soon(sibling)

    with anyio.fail_after(5):
        await agency.with_test_context(threads=store, fn=body)
    assert seen == ["0"]


# -- threads.list / get / current ----------------------------------------------------------


def test_threads_list_shows_ids_active_flag_and_parent() -> None:
    with agency.test_context() as frame:
        agency.thread.user("hi")
        sub_id = frame.threads.create_subthread()
        infos = agency.threads.list()
        assert [i.id for i in infos] == ["t0", "t1"]
        assert [i.is_active for i in infos] == [True, False]
        assert infos[0].parent_id is None
        assert infos[0].thread_type == "thread"
        assert infos[1].parent_id == "t0"
        assert infos[1].thread_type == "subthread"
        assert [i.message_count for i in infos] == [1, 1]

        with agency.thread.use(sub_id):
            assert [i.is_active for i in agency.threads.list()] == [False, True]
        assert [i.is_active for i in agency.threads.list()] == [True, False]


def test_threads_list_skips_hidden() -> None:
    with agency.test_context() as frame:
        frame.threads.create(hidden=True)
        frame.threads.create()
        assert [i.id for i in agency.threads.list()] == ["t0", "t2"]


def test_threads_get_slices_and_accepts_both_id_forms() -> None:
    store = ThreadStore.with_default_active()
    store.create()
    for n in range(5):
        store.get("1").add("user", f"m{n}")
    with agency.test_context(threads=store):
        everything = agency.threads.get("t1")
        assert [m.content for m in everything] == ["m0", "m1", "m2", "m3", "m4"]
        assert agency.threads.get("1") == everything
        assert agency.threads.get(1) == everything
        assert [m.content for m in agency.threads.get("t1", offset=1, limit=2)] == ["m1", "m2"]
        assert [m.content for m in agency.threads.get("1", offset=3)] == ["m3", "m4"]
        assert agency.threads.get("t1", limit=0) == []
        assert agency.threads.get("t1", offset=10) == []
        assert agency.threads.get("t0") == []


def test_threads_get_returns_a_copy() -> None:
    with agency.test_context() as frame:
        agency.thread.user("hi")
        got = agency.threads.get("t0")
        got.clear()
        assert len(frame.threads.get("0").messages) == 1


def test_threads_get_default_limit_is_50() -> None:
    with agency.test_context():
        for n in range(60):
            agency.thread.user(str(n))
        got = agency.threads.get("t0")
        assert len(got) == 50
        assert got[0].content == "0"
        assert got[-1].content == "49"


def test_threads_get_unknown_is_empty_list() -> None:
    with agency.test_context():
        assert agency.threads.get("t99") == []
        assert agency.threads.get("99") == []
        assert agency.threads.get("nonsense") == []


def test_threads_get_rejects_negative_offset_or_limit() -> None:
    with agency.test_context():
        with pytest.raises(InvalidArgumentError):
            agency.threads.get("t0", offset=-1)
        with pytest.raises(InvalidArgumentError):
            agency.threads.get("t0", limit=-1)


def test_threads_current_inside_a_frame() -> None:
    with agency.test_context() as frame:
        assert agency.threads.current() is frame.threads.get("0")
    with agency.test_context(threads=ThreadStore()):
        assert agency.threads.current() is None


# -- outside a frame -----------------------------------------------------------------------


def test_lax_readers_return_none_outside_a_frame() -> None:
    assert agency.threads.current() is None
    assert agency.thread.store_maybe() is None


def _enter_use() -> None:
    with agency.thread.use("0"):
        pass


STRICT_MEMBERS: list[tuple[str, Callable[[], object]]] = [
    ("thread.current()", lambda: agency.thread.current()),
    ("thread.user()", lambda: agency.thread.user("hi")),
    ("thread.system()", lambda: agency.thread.system("hi")),
    ("thread.assistant()", lambda: agency.thread.assistant("hi")),
    ("thread.store()", lambda: agency.thread.store()),
    ("thread.use()", _enter_use),
    ("threads.list()", lambda: agency.threads.list()),
    ("threads.get()", lambda: agency.threads.get("t0")),
]


def _check_outside_message(error: OutsideFrameError, member: str) -> None:
    message = str(error)
    assert f"agency.{member}" in message
    assert "agency.run" in message
    assert "with_test_context" in message
    assert isinstance(error, RuntimeError)
    assert error.member == member


@pytest.mark.parametrize(("member", "call"), STRICT_MEMBERS, ids=[m for m, _ in STRICT_MEMBERS])
def test_strict_members_raise_outside_a_frame(member: str, call: Callable[[], object]) -> None:
    with pytest.raises(OutsideFrameError) as info:
        call()
    _check_outside_message(info.value, member)


async def test_with_raises_outside_a_frame() -> None:
    with pytest.raises(OutsideFrameError) as info:
        await agency.thread.with_("0", lambda: None)
    _check_outside_message(info.value, "thread.with_()")


def test_frame_is_gone_after_test_context_exits() -> None:
    with agency.test_context():
        assert agency.thread.store_maybe() is not None
    assert agency.thread.store_maybe() is None
    with pytest.raises(OutsideFrameError):
        agency.thread.current()
