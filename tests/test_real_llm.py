"""Opt-in: the examples and the tool loop against a real OpenAI-compatible server.

Off by default (``addopts`` deselects the ``real_llm`` marker); run them with::

    AGENCY_REAL_LLM_MODEL=openai/qwen2.5 AGENCY_REAL_LLM_API_BASE=http://127.0.0.1:8080/v1 \\
        python3 -m pytest -m real_llm -n 0

(``AGENCY_REAL_LLM_API_KEY`` when the server wants one.) Any OpenAI-compatible server does,
e.g. a local llama.cpp ``llama-server``. Selected without those variables, the tests fail
saying what is missing: they never skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agency_runtime import agency

pytestmark = [pytest.mark.real_llm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def _server() -> dict[str, str]:
    model = os.environ.get("AGENCY_REAL_LLM_MODEL")
    base = os.environ.get("AGENCY_REAL_LLM_API_BASE")
    if not model or not base:
        pytest.fail(
            "the real_llm tests need AGENCY_REAL_LLM_MODEL (a litellm model string such as "
            "openai/qwen2.5) and AGENCY_REAL_LLM_API_BASE (the server's /v1 URL)"
        )
    return {"model": model, "base": base, "key": os.environ.get("AGENCY_REAL_LLM_API_KEY", "none")}


@pytest.mark.parametrize("example", ["quickstart.py", "research_helper.py"])
def test_an_example_runs_against_the_real_model(example: str, tmp_path: Path) -> None:
    server = _server()
    env = {
        **os.environ,
        "AGENCY_MODEL": server["model"],
        "OPENAI_BASE_URL": server["base"],
        "OPENAI_API_BASE": server["base"],
        "OPENAI_API_KEY": server["key"],
        "AGENCY_STORE": f"sqlite:///{tmp_path / 'runs.db'}",
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def test_the_tool_loop_against_the_real_model(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server()
    monkeypatch.setenv("OPENAI_BASE_URL", server["base"])
    monkeypatch.setenv("OPENAI_API_KEY", server["key"])
    calls: list[Any] = []

    async def entry() -> str:
        def counted(a: int, b: int) -> int:
            """Add two whole numbers."""
            calls.append((a, b))
            return add(a, b)

        return str(
            await agency.llm(
                "Use the tool to add 1234 and 4321, then answer with the sum only.",
                model=server["model"],
                tools=[agency.tool(counted, name="add")],
            )
        )

    result = agency.run_sync(entry, store="memory://")
    assert result.status == "completed", result.error
    assert calls  # the model called the tool
    assert "5555" in str(result.value)
