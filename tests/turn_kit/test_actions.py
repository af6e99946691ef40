"""Confirmed turn actions (spec §4, case 9) and the turn persona helper (spec §5, case 1)."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agency_runtime import AgencyError, InvalidArgumentError
from turn_kit import TURN_KIT_VERSION
from turn_kit._actions import run_confirmed_turn_action
from turn_kit._errors import TurnKitError, UnconfirmedTurnActionError
from turn_kit._persona import define_turn_persona

pytestmark = pytest.mark.anyio

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


class LogCtx:
    """A ctx whose log records ``(level, message, attrs)``."""

    def __init__(self) -> None:
        self.logs: list[tuple[str, str, dict[str, Any]]] = []

    def log(self, level: str, message: str, **attrs: Any) -> None:
        self.logs.append((level, message, attrs))


def task(status: str) -> dict[str, Any]:
    return {"receipt": {"status": status}, "title": "Call Mom"}


def succeeded(result: dict[str, Any]) -> bool:
    return bool(result["receipt"]["status"] == "succeeded")


# -- turn-kit.test.ts case 9 ----------------------------------------------------------------


async def test_conformance_success_text_cannot_be_built_before_the_receipt() -> None:
    success_calls = 0

    def confirmed(result: dict[str, Any]) -> str:
        nonlocal success_calls
        success_calls += 1
        return f"Tracked: {result['title']}"

    async def queued() -> dict[str, Any]:
        return task("queued")

    async def done() -> dict[str, Any]:
        return task("succeeded")

    with pytest.raises(UnconfirmedTurnActionError):
        await run_confirmed_turn_action(
            name="create-task", perform=queued, confirm=succeeded, confirmed=confirmed
        )
    assert success_calls == 0

    line = await run_confirmed_turn_action(
        name="create-task", perform=done, confirm=succeeded, confirmed=confirmed
    )
    assert line == "Tracked: Call Mom"
    assert success_calls == 1


async def test_unconfirmed_error_message_and_type() -> None:
    with pytest.raises(UnconfirmedTurnActionError) as caught:
        await run_confirmed_turn_action(
            name="  create-github-task ",
            perform=lambda: task("queued"),
            confirm=succeeded,
            confirmed=lambda result: "never",
        )
    assert (
        str(caught.value)
        == 'turn action "create-github-task" returned an unconfirmed provider receipt'
    )
    assert isinstance(caught.value, TurnKitError)
    assert isinstance(caught.value, AgencyError)


# -- names and callbacks --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "   ", "\ufeff\n", None])
async def test_blank_name_raises_before_perform_runs(name: Any) -> None:
    performed: list[bool] = []
    with pytest.raises(InvalidArgumentError, match=r"^turn action name is required$"):
        await run_confirmed_turn_action(
            name=name,
            perform=lambda: performed.append(True),
            confirm=lambda receipt: True,
            confirmed=lambda receipt: "ok",
        )
    assert performed == []


@pytest.mark.parametrize("which", ["perform", "confirm", "confirmed"])
async def test_non_callable_callbacks_raise_before_perform_runs(which: str) -> None:
    performed: list[bool] = []
    callbacks: dict[str, Any] = {
        "perform": lambda: performed.append(True),
        "confirm": lambda receipt: True,
        "confirmed": lambda receipt: "ok",
    }
    callbacks[which] = "not callable"
    with pytest.raises(InvalidArgumentError, match=f"{which} must be callable"):
        await run_confirmed_turn_action(name="act", **callbacks)
    assert performed == []


async def test_arguments_are_keyword_only() -> None:
    function: Any = run_confirmed_turn_action
    with pytest.raises(TypeError):
        await function(None, "act", lambda: 1, lambda r: True, lambda r: r)


# -- sync / async ---------------------------------------------------------------------------


async def test_sync_callbacks() -> None:
    result = await run_confirmed_turn_action(
        name="sync",
        perform=lambda: 41,
        confirm=lambda receipt: receipt == 41,
        confirmed=lambda r: r + 1,
    )
    assert result == 42


async def test_async_callbacks_are_awaited() -> None:
    async def perform() -> int:
        return 41

    async def confirm(receipt: int) -> bool:
        return receipt == 41

    async def confirmed(receipt: int) -> int:
        return receipt + 1

    assert (
        await run_confirmed_turn_action(
            name="async", perform=perform, confirm=confirm, confirmed=confirmed
        )
        == 42
    )


async def test_an_async_confirm_that_resolves_false_now_rejects() -> None:
    # Deviation: the seed does not await confirm, so a promise was always truthy.
    calls: list[int] = []

    async def confirm(receipt: int) -> bool:
        return False

    with pytest.raises(UnconfirmedTurnActionError):
        await run_confirmed_turn_action(
            name="async-confirm",
            perform=lambda: 1,
            confirm=confirm,
            confirmed=lambda receipt: calls.append(receipt),
        )
    assert calls == []


async def test_confirm_returning_an_awaitable_from_a_sync_function_is_awaited() -> None:
    async def verdict() -> bool:
        return False

    with pytest.raises(UnconfirmedTurnActionError):
        await run_confirmed_turn_action(
            name="lambda-confirm",
            perform=lambda: 1,
            confirm=lambda receipt: verdict(),
            confirmed=lambda r: r,
        )


@pytest.mark.parametrize("verdict", [1, "yes", [0], {"ok": True}])
async def test_truthy_confirm_values_pass(verdict: Any) -> None:
    assert (
        await run_confirmed_turn_action(
            name="truthy",
            perform=lambda: "r",
            confirm=lambda receipt: verdict,
            confirmed=lambda r: r,
        )
        == "r"
    )


@pytest.mark.parametrize("verdict", [False, 0, "", None, [], {}])
async def test_falsy_confirm_values_reject(verdict: Any) -> None:
    with pytest.raises(UnconfirmedTurnActionError):
        await run_confirmed_turn_action(
            name="falsy",
            perform=lambda: "r",
            confirm=lambda receipt: verdict,
            confirmed=lambda r: r,
        )


# -- errors ---------------------------------------------------------------------------------


async def test_perform_errors_propagate_and_nothing_else_runs() -> None:
    error = ConnectionError("provider down")
    calls: list[str] = []

    async def perform() -> None:
        raise error

    ctx = LogCtx()
    with pytest.raises(ConnectionError) as caught:
        await run_confirmed_turn_action(
            ctx=ctx,
            name="act",
            perform=perform,
            confirm=lambda receipt: calls.append("confirm"),
            confirmed=lambda receipt: calls.append("confirmed"),
        )
    assert caught.value is error
    assert calls == []
    assert ctx.logs == []


async def test_confirm_errors_propagate_and_confirmed_never_runs() -> None:
    error = KeyError("receipt")
    calls: list[str] = []

    def confirm(receipt: Any) -> bool:
        raise error

    ctx = LogCtx()
    with pytest.raises(KeyError) as caught:
        await run_confirmed_turn_action(
            ctx=ctx,
            name="act",
            perform=dict,
            confirm=confirm,
            confirmed=lambda r: calls.append("x"),
        )
    assert caught.value is error
    assert calls == []
    assert ctx.logs == []


async def test_confirmed_errors_propagate() -> None:
    def confirmed(receipt: Any) -> str:
        raise ValueError("formatting failed")

    with pytest.raises(ValueError, match="formatting failed"):
        await run_confirmed_turn_action(
            name="act", perform=lambda: 1, confirm=lambda r: True, confirmed=confirmed
        )


# -- logging --------------------------------------------------------------------------------


async def test_logs_with_a_ctx() -> None:
    ctx = LogCtx()
    assert (
        await run_confirmed_turn_action(
            ctx=ctx,
            name=" act ",
            perform=lambda: 1,
            confirm=lambda r: True,
            confirmed=lambda r: "done",
        )
        == "done"
    )
    with pytest.raises(UnconfirmedTurnActionError):
        await run_confirmed_turn_action(
            ctx=ctx,
            name="act",
            perform=lambda: 1,
            confirm=lambda r: False,
            confirmed=lambda r: "no",
        )
    assert ctx.logs == [
        ("info", "turn-kit.action-confirmed", {"action": "act"}),
        ("error", "turn-kit.action-unconfirmed", {"action": "act"}),
    ]


async def test_no_logs_without_a_ctx(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="turn_kit"):
        await run_confirmed_turn_action(
            name="act", perform=lambda: 1, confirm=lambda r: True, confirmed=lambda r: "done"
        )
        with pytest.raises(UnconfirmedTurnActionError):
            await run_confirmed_turn_action(
                name="act", perform=lambda: 1, confirm=lambda r: False, confirmed=lambda r: "no"
            )
    assert "turn-kit." not in caplog.text


async def test_a_ctx_without_log_uses_stdlib_logging(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="turn_kit"):
        await run_confirmed_turn_action(
            ctx=SimpleNamespace(),
            name="act",
            perform=lambda: 1,
            confirm=lambda r: True,
            confirmed=lambda r: 2,
        )
    assert "turn-kit.action-confirmed" in caplog.text


# -- define_turn_persona (turn-kit.test.ts case 1) ------------------------------------------


def test_conformance_version_and_persona_pass_through() -> None:
    with PYPROJECT.open("rb") as handle:
        assert tomllib.load(handle)["project"]["version"] == TURN_KIT_VERSION
    persona = {
        "id": "joke-bot",
        "intent": "relay-orchestrator",
        "description": "Keeps a conversation.",
        "harnessSettings": {"reasoning": "low", "timeoutSeconds": 300},
        "onEvent": "./agent.ts",
        "memory": {"enabled": True, "scopes": ["workspace"], "ttlDays": 30},
    }
    assert define_turn_persona(persona) is persona
    assert persona["memory"]["ttlDays"] == 30  # type: ignore[index]


@pytest.mark.parametrize(
    "memory",
    [
        True,
        {},
        {"enabled": True},
        {"scopes": ["user", "global"]},
        {"enabled": None, "scopes": None},
        SimpleNamespace(enabled=True, scopes=["workspace"]),
        SimpleNamespace(),
        False,  # as in the seed: only TypeScript's types forbid it, the runtime lets it pass
    ],
)
def test_persona_memory_that_passes(memory: Any) -> None:
    persona = {"id": "bot", "memory": memory}
    assert define_turn_persona(persona) is persona
    as_object = SimpleNamespace(id="bot", memory=memory)
    assert define_turn_persona(as_object) is as_object


@pytest.mark.parametrize(
    "memory",
    [
        {"enabled": False},
        {"enabled": False, "scopes": ["workspace"]},
        {"scopes": []},
        {"enabled": True, "scopes": ()},
        SimpleNamespace(enabled=False),
        SimpleNamespace(scopes=[]),
    ],
)
def test_persona_memory_that_is_rejected(memory: Any) -> None:
    message = "^turn persona requires enabled memory with at least one scope$"
    with pytest.raises(InvalidArgumentError, match=message):
        define_turn_persona({"id": "bot", "memory": memory})
    with pytest.raises(InvalidArgumentError, match=message):
        define_turn_persona(SimpleNamespace(id="bot", memory=memory))


@pytest.mark.parametrize(
    "persona", [{"id": "bot"}, {"id": "bot", "memory": None}, SimpleNamespace(id="bot"), None]
)
def test_persona_without_memory_is_rejected(persona: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="turn persona requires enabled memory"):
        define_turn_persona(persona)
