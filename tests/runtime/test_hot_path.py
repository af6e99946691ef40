"""The resume hot path keeps its semantics: adapters of plain scalars, entry parameters read
once, the journal's running spend totals, a task's quick ownership test in ``tick``, and a
damaged entry met by the inline replay."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import inspect
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from agency_runtime import JournalEntry, ResumableScope, SqliteStore, _scope, agency
from agency_runtime._core import _branches
from agency_runtime._core._branches import at_base, run_root, tick
from agency_runtime._core._jsondata import MAX_DEPTH, json_problem
from agency_runtime._durable._journal import CHILD_UNIT, RunJournal
from agency_runtime._durable._values import adapter_for, decode_arguments, return_adapter
from agency_runtime._errors import EntryImportError, JournalCorruptError
from agency_runtime._scope import step_name
from agency_runtime._types import Journal

pytestmark = pytest.mark.anyio


# -- adapters of plain scalar annotations ----------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "text", "expected"),
    [
        (str, '"abc"', "abc"),
        (int, "12345678901234567890", 12345678901234567890),
        (bool, "true", True),
        (float, "2.5", 2.5),
        (float, "3", 3.0),  # not exactly a float: pydantic's answer
        (int, "3.0", 3),
    ],
)
def test_a_scalar_annotation_validates_as_pydantic_does(
    annotation: type, text: str, expected: Any
) -> None:
    value = adapter_for(annotation).validate_json(text)
    assert value == expected
    assert type(value) is annotation


@pytest.mark.parametrize(
    ("annotation", "text"), [(int, '"x"'), (str, "1"), (bool, '"maybe"'), (int, "{not json")]
)
def test_a_scalar_annotation_refuses_what_pydantic_refuses(annotation: type, text: str) -> None:
    with pytest.raises(ValidationError):
        adapter_for(annotation).validate_json(text)


def test_python_values_of_a_scalar_annotation() -> None:
    assert adapter_for(float).validate_python(1) == 1.0
    assert type(adapter_for(float).validate_python(1)) is float
    text = "kept as it is"
    assert adapter_for(str).validate_python(text) is text
    with pytest.raises(ValidationError):
        adapter_for(int).validate_python("seven")


def test_other_annotations_get_a_pydantic_adapter_of_their_own() -> None:
    # int | str and str | int compare equal but need not validate alike: never shared
    assert adapter_for(int | str) is not adapter_for(str | int)
    assert adapter_for(list[int]).validate_json("[1, 2]") == [1, 2]


def test_a_step_returning_a_scalar_is_revived_into_its_annotation() -> None:
    def price() -> float:
        return 3.0

    adapter = return_adapter(price)
    assert adapter is not None
    assert adapter.validate_json("3") == 3.0
    assert type(adapter.validate_json("3")) is float


class Priced(BaseModel):
    cents: int


def _price(cents: int) -> Priced:
    return Priced(cents=cents)


def test_a_partial_is_read_as_its_function_and_cached_once() -> None:
    from agency_runtime._durable import _values

    steps = [functools.partial(functools.partial(_price), n) for n in range(50)]
    adapters = {id(return_adapter(step)) for step in steps}
    assert len(adapters) == 1  # one adapter, the function's
    adapter = return_adapter(steps[0])
    assert adapter is not None
    assert adapter.validate_json('{"cents": 3}') == Priced(cents=3)
    assert not any(isinstance(key, functools.partial) for key in _values._ADAPTERS)


async def test_a_partial_step_returns_its_function_annotation_now_and_on_replay(
    tmp_path: Path,
) -> None:
    seen: list[object] = []

    @agency.entry
    async def flow() -> int:
        async def body(s: ResumableScope) -> int:
            priced = await s.step(functools.partial(_price, 3), name="price")
            seen.append(priced)
            await agency.interrupt("look")
            return int(priced.cents)

        return await agency.with_resumable_scope("partial", body)

    store = SqliteStore(tmp_path / "s.db")
    paused = await agency.run(flow, run_id="partial", store=store)
    assert paused.status == "paused"
    await agency.resume("partial", store=store)
    assert seen == [Priced(cents=3), Priced(cents=3)]  # a model both times, not a dict


# -- an entry's parameters, read once --------------------------------------------------------


def test_arguments_are_validated_into_the_entry_annotations() -> None:
    def entry(n: int, ratio: float, *names: str, **flags: bool) -> None: ...

    args, kwargs = decode_arguments(
        entry, '{"args": [2, 1, "a", "b"], "kwargs": {"x": true, "y": "false"}}'
    )
    assert args == (2, 1.0, "a", "b")
    assert type(args[1]) is float
    assert kwargs == {"x": True, "y": False}


def test_arguments_that_no_longer_validate_raise() -> None:
    def entry(n: int) -> None: ...

    with pytest.raises(ValidationError):
        decode_arguments(entry, '{"args": ["seven"], "kwargs": {}}')
    with pytest.raises(EntryImportError):
        decode_arguments(entry, '{"args": [1, 2], "kwargs": {}}')


def test_an_entry_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def entry(n: int) -> None: ...

    reads: list[object] = []
    real = inspect.signature

    def signature(fn: Any) -> inspect.Signature:
        reads.append(fn)
        return real(fn)

    monkeypatch.setattr(inspect, "signature", signature)
    for n in (1, 2, 3):
        assert decode_arguments(entry, f'{{"args": [{n}], "kwargs": {{}}}}') == ((n,), {})
    assert reads == [entry]


def test_an_unresolved_annotation_is_read_again_later() -> None:
    def entry(n: LaterType) -> None:  # type: ignore[name-defined]  # noqa: F821
        ...

    assert decode_arguments(entry, '{"args": [1], "kwargs": {}}') == ((1,), {})
    globals()["LaterType"] = int
    try:
        assert decode_arguments(entry, '{"args": ["2"], "kwargs": {}}') == ((2,), {})
    finally:
        del globals()["LaterType"]


# -- the journal's spend totals ----------------------------------------------------------------


def entry_at(seq: int, path: str, *, name: str = "step", pico: int = 0, tokens: int = 0) -> Any:
    return JournalEntry(
        run_id="r", seq=seq, path=path, name=name, result="null", cost_pico=pico, tokens=tokens
    )


async def test_the_journal_totals_the_spend_of_its_entries() -> None:
    loaded = Journal(
        entries=[
            entry_at(1, "s/0", pico=5, tokens=2),
            entry_at(2, "s/1", name=CHILD_UNIT, pico=7, tokens=1),
        ]
    )
    journal = RunJournal("r", None, None, loaded)
    assert (journal.spent_pico, journal.spent_tokens, journal.children_pico) == (12, 3, 7)
    await journal.commit_step(entry_at(3, "s/2", pico=10, tokens=4))
    await journal.commit_step(entry_at(4, "s/1", pico=1))  # replaces the child call's entry
    assert (journal.spent_pico, journal.spent_tokens, journal.children_pico) == (16, 6, 0)
    await journal.rewind(1)
    assert (journal.spent_pico, journal.spent_tokens, journal.children_pico) == (5, 2, 0)
    assert sum(e.cost_pico for e in journal.entries.values()) == journal.spent_pico
    await journal.commit_step(entry_at(5, "s/0"))  # no spend of its own, replacing some
    assert (journal.spent_pico, journal.spent_tokens, journal.children_pico) == (0, 0, 0)


@pytest.mark.parametrize("result", ["{bad", "[1,"])
async def test_a_damaged_result_with_nothing_to_apply_is_a_corrupt_journal(
    tmp_path: Path, result: str
) -> None:
    """A step with no changes and no failure replays inline in ``s.step``; a result that does
    not read there still fails the run with JournalCorruptError naming the step, and nothing
    after it runs."""
    ran: list[int] = []

    def work(i: int) -> int:
        ran.append(i)
        return i

    async def entry() -> int:
        async def body(s: ResumableScope) -> int:
            return sum([await s.step(functools.partial(work, i), name="w") for i in range(3)])

        return await agency.with_resumable_scope("sc", body)

    store = SqliteStore(tmp_path / "damaged.db")
    try:
        first = await agency.run(entry, run_id="d", store=store)
        assert (first.status, first.value, ran) == ("completed", 3, [0, 1, 2])
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE steps SET result = ? WHERE path = 'sc/1'", (result,))
            conn.execute("DELETE FROM steps WHERE path = 'sc/2'")
            conn.execute("UPDATE runs SET status = 'queued', value = NULL WHERE run_id = 'd'")
        again = await agency.run(entry, run_id="d", store=store)
        assert again.status == "failed"
        assert isinstance(again.exception, JournalCorruptError)
        assert "'sc/1'" in again.exception.args[0]
        assert ran == [0, 1, 2]  # the damaged step's successor never ran again
    finally:
        store.close()


# -- tick's quick test of the running task -----------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_task_started_without_the_hook_counts_on_a_branch_of_its_own() -> None:
    with run_root(), at_base("scope"):
        assert tick("scope") == ""
        loop = asyncio.get_running_loop()

        async def unhooked() -> str:
            return tick("scope")

        # asyncio.Task() itself, not the loop's task factory: the cursor is inherited
        branch = await asyncio.Task(unhooked(), loop=loop)
        assert branch.startswith("?")
        assert tick("scope") == ""  # the owner still counts as itself


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_another_thread_loop_is_not_the_owner_while_the_owner_waits_for_it() -> None:
    """A thread running its own loop with a copy of the context, while the owner task blocks
    on it: the owner is still its loop's current task, yet the thread is not the owner."""
    with run_root(), at_base("scope"):
        assert tick("scope") == ""
        seen: list[str] = []

        async def elsewhere() -> None:
            seen.append(tick("scope"))

        context = contextvars.copy_context()
        thread = threading.Thread(target=lambda: context.run(asyncio.run, elsewhere()))
        thread.start()
        thread.join()  # the owner blocks: its loop's current task is still the owner
        assert len(seen) == 1
        assert seen[0].startswith("?")
        assert tick("scope") == ""


async def test_the_owner_ticks_on_its_own_cursor() -> None:
    with run_root() as root, at_base("scope"):
        for _ in range(3):
            assert tick("scope") == ""
        cursor = _branches._CURSOR.get()
        assert cursor is not None
        assert cursor.events == 3
        assert cursor.owner == root.owner


# -- lambda step names, found once per code and closure --------------------------------------


def test_one_lambda_is_named_after_what_its_closure_holds_each_time() -> None:
    names = []
    for held in (len, "text", max, None):

        def make(f: Any) -> Any:
            return lambda: f("x")

        names.append(step_name(make(held)))
    assert [n.rsplit(".", 1)[-1] for n in names] == [
        "<lambda:f>",
        "<lambda>",
        "<lambda:f>",
        "<lambda>",
    ]


def test_a_lambda_with_an_empty_cell_is_named_as_before() -> None:
    def make() -> Any:
        later: Any
        step = lambda: later()  # noqa: E731
        if step is None:  # never true: the cell of ``later`` stays empty
            later = len
        return step

    assert step_name(make()).endswith(".<lambda>")


def test_a_lambda_name_is_not_taken_from_another_code_at_the_same_id() -> None:
    step = lambda: len("x")  # noqa: E731
    code = step.__code__
    other = (lambda: max([1])).__code__  # a code that once had this id
    _scope._LAMBDA_NAMES[(id(code), step.__qualname__, 0)] = (other, "<lambda:max>")
    try:
        assert step_name(step).endswith(".<lambda:len>")
    finally:
        _scope._LAMBDA_NAMES.clear()


# -- what a step's result may hold -------------------------------------------------------------


class _Level(enum.StrEnum):
    LOW = "low"


async def test_a_flat_dict_result_comes_back_as_a_copy_and_others_through_json() -> None:
    held = {"i": 1, "ok": True, "s": "x", "n": None}
    levelled = {"level": _Level.LOW}  # a str subclass: its JSON comes back a plain str

    async def body(s: ResumableScope) -> tuple[Any, ...]:
        return (
            await s.step(lambda: held),
            await s.step(lambda: levelled),
            await s.step(lambda: {"t": (1, 2)}),
        )

    with agency.test_context():
        flat, revived, nested = await agency.with_resumable_scope("flat", body)
    assert flat == held
    assert flat is not held
    assert revived == {"level": "low"}
    assert type(revived["level"]) is str
    assert nested == {"t": [1, 2]}


def _nested(depth: int, leaf: object) -> object:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"i": 1, "ok": True, "s": "x", "n": None}, None),
        # A flat dict is checked in one pass; whatever it does not settle takes the walk.
        ({"i": 1, "x": 1.5}, None),
        ({"i": 1, "x": float("inf")}, "the float inf at ['x'] is not a JSON number"),
        ({"i": 1, 2: "x"}, "the dict has a int key 2; JSON keys are strings (it would come "
         "back as a string)"),
        ({}, None),
        (_nested(MAX_DEPTH + 5, "leaf"), "it is nested more than 200 levels deep at [0][0][0]…"),
        (_nested(MAX_DEPTH, "leaf"), None),  # a plain leaf is fine at any depth
        ({"f": [1.5, float("nan")]}, "the float nan at ['f'][1] is not a JSON number"),
        ({"a": [1, {2: "x"}]}, "the dict at ['a'][1] has a int key 2; JSON keys are strings "
         "(it would come back as a string)"),
        ({"e": ["x", b"y"]}, "the bytes at ['e'][1] is not JSON; store text (e.g. base64) instead"),
        ([memoryview(b"m")], "the memoryview at [0] is not JSON; store text (e.g. base64) "
         "instead"),
        ({"s": frozenset({1})}, "the frozenset at ['s'] would come back as a list; store a list"),
        ((1, ("t", [True, None])), None),  # tuples come back as lists: a documented round trip
        ([enum.IntEnum("Level", "LOW").LOW], None),  # an int subclass is checked as an int
        ([object()], "the object object at [0] is not JSON data"),
    ],
)  # fmt: skip
def test_plain_leaves_are_skipped_and_the_rest_checked(value: Any, problem: str | None) -> None:
    assert json_problem(value) == problem
