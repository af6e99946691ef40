"""The helpers of the opt-in real-model tests (``tests/real_llm.py``), without a real model:
the ``AGENCY_REAL_LLM_*`` settings, the failure message, and the example runner that bounds
every generation."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agency_runtime import agency
from agency_runtime.testing import FakeModel
from tests import real_llm
from tests.real_llm import (
    MODEL_NAME,
    RealLLM,
    RealLLMSettingsError,
    failure_message,
    read_settings,
)

SERVER = {
    "AGENCY_REAL_LLM_MODEL": "openai/qwen2.5",
    "AGENCY_REAL_LLM_API_BASE": "http://127.0.0.1:8080/v1",
}


def test_the_settings_need_a_model_and_a_server() -> None:
    for env in ({}, {"AGENCY_REAL_LLM_MODEL": "openai/x"}, {"AGENCY_REAL_LLM_API_BASE": "x"}):
        with pytest.raises(RealLLMSettingsError, match=r"AGENCY_REAL_LLM_MODEL .* AGENCY_REAL"):
            read_settings(env)


def test_the_settings_default_to_bounded_generations() -> None:
    settings = read_settings(SERVER)
    assert settings == RealLLM("openai/qwen2.5", "http://127.0.0.1:8080/v1")
    model = settings.model()
    assert (model.name, model.model, model.api_base) == (
        MODEL_NAME,
        "openai/qwen2.5",
        "http://127.0.0.1:8080/v1",
    )
    assert model.params == {"max_tokens": 256}
    assert (model.json_schema, model.input_cost_per_token, model.output_cost_per_token) == (
        None,
        0.0,
        0.0,
    )


def test_every_setting_is_read_from_the_environment() -> None:
    settings = read_settings(
        {
            **SERVER,
            "AGENCY_REAL_LLM_API_KEY": "sk-local",
            "AGENCY_REAL_LLM_MAX_TOKENS": "64",
            "AGENCY_REAL_LLM_OPTIONS": '{"tool_choice": "required", "temperature": 0}',
            "AGENCY_REAL_LLM_JSON_SCHEMA": "1",
            "AGENCY_REAL_LLM_TIMEOUT": "90",
        }
    )
    model = settings.model()
    assert model.params == {"tool_choice": "required", "max_tokens": 64, "temperature": 0.0}
    assert model.api_key is not None
    assert model.api_key.get_secret_value() == "sk-local"
    assert (model.json_schema, settings.timeout) == (True, 90.0)
    assert read_settings({**SERVER, "AGENCY_REAL_LLM_JSON_SCHEMA": "0"}).json_schema is False


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("AGENCY_REAL_LLM_MAX_TOKENS", "lots", "MAX_TOKENS must be a whole number > 0"),
        ("AGENCY_REAL_LLM_MAX_TOKENS", "0", "MAX_TOKENS must be a whole number > 0"),
        ("AGENCY_REAL_LLM_TIMEOUT", "-5", "TIMEOUT must be a number of seconds > 0"),
        ("AGENCY_REAL_LLM_OPTIONS", "{tool_choice: auto}", "OPTIONS must be a JSON object"),
        ("AGENCY_REAL_LLM_OPTIONS", '["auto"]', "OPTIONS must be a JSON object"),
        ("AGENCY_REAL_LLM_OPTIONS", '{"max_tokens": 9}', "with AGENCY_REAL_LLM_MAX_TOKENS"),
        ("AGENCY_REAL_LLM_OPTIONS", '{"tools": []}', "may not set 'tools'"),
        ("AGENCY_REAL_LLM_JSON_SCHEMA", "maybe", "JSON_SCHEMA must be 1 or 0"),
        ("AGENCY_REAL_LLM_API_BASE", "localhost:8080", "api_base must be an http"),
    ],
)
def test_a_bad_setting_says_which_and_why(variable: str, value: str, message: str) -> None:
    with pytest.raises(RealLLMSettingsError, match=message):
        read_settings({**SERVER, variable: value})


def test_a_failure_shows_the_tails_of_stdout_and_stderr() -> None:
    done = subprocess.CompletedProcess(
        ["python3", "examples/quickstart.py"],
        1,
        stdout="x" * 50 + "failed: LLMCallError: the call timed out",
        stderr="WARNING no price is known\n" * 3,
    )
    message = failure_message(done, tail=40)
    assert message.startswith("python3 examples/quickstart.py exited with 1\n")
    stdout = "--- stdout (last 40 of 90 characters) ---\nfailed: LLMCallError: the call timed out"
    assert stdout in message
    assert "x" * 11 not in message  # only the tail
    assert "--- stderr (last 40 of 78 characters) ---" in message
    empty = failure_message(subprocess.CompletedProcess(["x"], 2, stdout="", stderr=None))
    assert "--- stdout (all of it) ---\n(empty)" in empty


def test_the_runner_bounds_every_generation_of_an_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = tmp_path / "example.py"
    example.write_text(
        textwrap.dedent(
            """
            import os, sys
            from agency_runtime import agency

            async def entry() -> str:
                return str(await agency.llm("hi"))

            if __name__ == "__main__":
                model = os.environ["AGENCY_MODEL"]
                agency.run_sync(entry, store="memory://", model=model).unwrap()
                sys.exit(3)
            """
        )
    )
    for name, value in {**SERVER, "AGENCY_REAL_LLM_MODEL": "fake/bounded"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AGENCY_REAL_LLM_MAX_TOKENS", "32")
    monkeypatch.setenv("AGENCY_REAL_LLM_OPTIONS", '{"temperature": 0}')
    monkeypatch.setenv("AGENCY_MODEL", "unused")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        with FakeModel("bounded", replies=["hello"]) as fake, pytest.raises(SystemExit) as ended:
            real_llm.main([str(example)])
    finally:
        agency.unregister_model(MODEL_NAME)
    assert ended.value.code == 3  # the example ran as __main__, to its end
    (request,) = fake.calls
    assert request.params == {"temperature": 0.0, "max_tokens": 32}
