"""Opt-in: the examples and the tool loop against a real OpenAI-compatible server.

Off by default (``addopts`` deselects the ``real_llm`` marker); run them with::

    AGENCY_REAL_LLM_MODEL=openai/qwen2.5 AGENCY_REAL_LLM_API_BASE=http://127.0.0.1:8080/v1 \\
        python3 -m pytest -m real_llm -n 0

Any OpenAI-compatible server does, e.g. a local llama.cpp ``llama-server`` or
llama-cpp-python's ``python -m llama_cpp.server``. Every generation goes to one
``agency.Model`` built from these variables (``tests/real_llm.py``):

* ``AGENCY_REAL_LLM_MODEL``, ``AGENCY_REAL_LLM_API_BASE``: the litellm model string and the
  server's ``/v1`` URL (required);
* ``AGENCY_REAL_LLM_API_KEY``: the key the server wants (default ``none``);
* ``AGENCY_REAL_LLM_MAX_TOKENS``: the most tokens of every generation, the examples' too
  (default 256: a CPU server would otherwise write for minutes);
* ``AGENCY_REAL_LLM_OPTIONS``: a JSON object of Model options sent with every request,
  e.g. ``'{"tool_choice": "required", "temperature": 0}'``;
* ``AGENCY_REAL_LLM_JSON_SCHEMA``: ``1`` when the server constrains output to a JSON schema
  (``Model(json_schema=True)``), ``0`` to put schemas in the prompt (unset: litellm decides);
* ``AGENCY_REAL_LLM_TIMEOUT``: seconds an example may run (default 600).

An example that fails shows its exit code and the tails of its stdout (its own report) and
its stderr. Selected without the required variables, the tests fail saying what is missing:
they never skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agency_runtime import agency
from tests.real_llm import RealLLM, RealLLMSettingsError, failure_message, read_settings

pytestmark = [pytest.mark.real_llm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def _settings() -> RealLLM:
    try:
        return read_settings(os.environ)
    except RealLLMSettingsError as exc:
        pytest.fail(str(exc))


@pytest.mark.parametrize("example", ["quickstart.py", "research_helper.py"])
def test_an_example_runs_against_the_real_model(example: str, tmp_path: Path) -> None:
    settings = _settings()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "OPENAI_BASE_URL": settings.api_base,  # for anything that names the server by itself
        "OPENAI_API_BASE": settings.api_base,
        "OPENAI_API_KEY": settings.api_key,
        "AGENCY_STORE": f"sqlite:///{tmp_path / 'runs.db'}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.real_llm", str(ROOT / "examples" / example)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=settings.timeout,
    )
    assert done.returncode == 0, failure_message(done)


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def test_the_tool_loop_against_the_real_model() -> None:
    model = _settings().model()
    calls: list[Any] = []

    async def entry() -> str:
        def counted(a: int, b: int) -> int:
            """Add two whole numbers."""
            calls.append((a, b))
            return add(a, b)

        return str(
            await agency.llm(
                "Use the tool to add 1234 and 4321, then answer with the sum only.",
                model=model,
                tools=[agency.tool(counted, name="add")],
                on_max_tool_rounds="answer",  # a model that keeps calling still answers
            )
        )

    result = agency.run_sync(entry, store="memory://")
    assert result.status == "completed", result.error
    assert calls  # the model called the tool
    assert "5555" in str(result.value)
