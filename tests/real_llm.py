"""The settings of the opt-in real-model tests (``tests/test_real_llm.py``), and their runner.

The tests read ``AGENCY_REAL_LLM_*`` variables (:data:`VARIABLES` says what each means) into
:class:`RealLLM`, whose :meth:`RealLLM.model` is the ``agency.Model`` every generation of
the tests goes to: its ``max_tokens`` bounds each answer (a CPU server may otherwise write
for minutes), its options reach every request. An example runs in a subprocess through
``python3 -m tests.real_llm examples/<name>.py``, which registers that model under
:data:`MODEL_NAME` and makes it the example's ``AGENCY_MODEL``.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agency_runtime import InvalidArgumentError, Model, agency

__all__ = [
    "MODEL_NAME",
    "VARIABLES",
    "RealLLM",
    "RealLLMSettingsError",
    "failure_message",
    "read_settings",
]

MODEL_NAME = "real-llm"
"""The name the real model is registered under in an example's process."""

DEFAULT_MAX_TOKENS = 256
DEFAULT_TIMEOUT = 600.0
TAIL = 2000
"""Characters of each of an example's stdout and stderr a failure shows."""
SAMPLING = ("temperature", "seed", "top_p")
"""Options that are ``agency.Model`` fields of their own."""

VARIABLES: Mapping[str, str] = {
    "AGENCY_REAL_LLM_MODEL": "the litellm model string, e.g. openai/qwen2.5 (required)",
    "AGENCY_REAL_LLM_API_BASE": "the server's /v1 URL, e.g. http://127.0.0.1:8080/v1 (required)",
    "AGENCY_REAL_LLM_API_KEY": "the key the server wants (default: none)",
    "AGENCY_REAL_LLM_MAX_TOKENS": (
        f"the most tokens of every generation (default {DEFAULT_MAX_TOKENS})"
    ),
    "AGENCY_REAL_LLM_OPTIONS": (
        'a JSON object of Model options for every request, e.g. {"tool_choice": "required"}'
    ),
    "AGENCY_REAL_LLM_JSON_SCHEMA": (
        "1: the server constrains output to a JSON schema (Model json_schema=True); 0: the "
        "schema goes in the prompt; unset: litellm decides"
    ),
    "AGENCY_REAL_LLM_TIMEOUT": (f"seconds an example may run (default {DEFAULT_TIMEOUT:.0f})"),
}
"""Every variable the real-model tests read, with what it means."""


class RealLLMSettingsError(ValueError):
    """An ``AGENCY_REAL_LLM_*`` variable is missing or malformed."""


@dataclass(frozen=True)
class RealLLM:
    """Where the real-model tests send their generations, and how."""

    model_string: str
    api_base: str
    api_key: str = "none"
    max_tokens: int = DEFAULT_MAX_TOKENS
    options: dict[str, Any] = field(default_factory=dict)
    json_schema: bool | None = None
    timeout: float = DEFAULT_TIMEOUT

    def model(self) -> Model:
        """The ``agency.Model`` of the server: every request bounded by ``max_tokens`` and
        carrying ``options`` (``temperature``, ``seed`` and ``top_p`` become the Model's
        fields of those names); priced at $0 (a local server is free, and an unpriced
        model's warnings would fill the output a failure shows)."""
        options = dict(self.options)
        sampling = {key: options.pop(key) for key in SAMPLING if key in options}
        return Model(
            self.model_string,
            name=MODEL_NAME,
            api_base=self.api_base,
            api_key=self.api_key,
            options={**options, "max_tokens": self.max_tokens},
            json_schema=self.json_schema,
            input_cost_per_token=0.0,
            output_cost_per_token=0.0,
            **sampling,
        )


def _positive(env: Mapping[str, str], name: str, default: float, kind: type) -> Any:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value <= 0:
        what = "a whole number" if kind is int else "a number of seconds"
        raise RealLLMSettingsError(f"{name} must be {what} > 0, got {raw!r}")
    return value


def read_settings(env: Mapping[str, str]) -> RealLLM:
    """The settings in ``env`` (``os.environ``); :class:`RealLLMSettingsError` says what is
    missing or wrong."""
    model = env.get("AGENCY_REAL_LLM_MODEL", "").strip()
    base = env.get("AGENCY_REAL_LLM_API_BASE", "").strip()
    if not model or not base:
        raise RealLLMSettingsError(
            "the real_llm tests need AGENCY_REAL_LLM_MODEL (a litellm model string such as "
            "openai/qwen2.5) and AGENCY_REAL_LLM_API_BASE (the server's /v1 URL)"
        )
    raw_options = env.get("AGENCY_REAL_LLM_OPTIONS", "").strip()
    try:
        options = json.loads(raw_options) if raw_options else {}
    except ValueError as exc:
        raise RealLLMSettingsError(
            f"AGENCY_REAL_LLM_OPTIONS must be a JSON object, e.g. "
            f'{{"tool_choice": "required"}}: {exc}'
        ) from None
    if not isinstance(options, dict):
        raise RealLLMSettingsError(
            f"AGENCY_REAL_LLM_OPTIONS must be a JSON object, got {raw_options!r:.80}"
        )
    if "max_tokens" in options:
        raise RealLLMSettingsError(
            "set max_tokens with AGENCY_REAL_LLM_MAX_TOKENS, not in AGENCY_REAL_LLM_OPTIONS"
        )
    flag = env.get("AGENCY_REAL_LLM_JSON_SCHEMA", "").strip().lower()
    if flag not in ("", "1", "true", "yes", "0", "false", "no"):
        raise RealLLMSettingsError(
            f"AGENCY_REAL_LLM_JSON_SCHEMA must be 1 or 0 (or unset), got {flag!r}"
        )
    settings = RealLLM(
        model_string=model,
        api_base=base,
        api_key=env.get("AGENCY_REAL_LLM_API_KEY", "").strip() or "none",
        max_tokens=_positive(env, "AGENCY_REAL_LLM_MAX_TOKENS", DEFAULT_MAX_TOKENS, int),
        options=options,
        json_schema=None if not flag else flag in ("1", "true", "yes"),
        timeout=_positive(env, "AGENCY_REAL_LLM_TIMEOUT", DEFAULT_TIMEOUT, float),
    )
    try:
        settings.model()
    except InvalidArgumentError as exc:  # an option the Model refuses, a bad URL, ...
        raise RealLLMSettingsError(f"the AGENCY_REAL_LLM_* settings are not valid: {exc}") from None
    return settings


def failure_message(done: subprocess.CompletedProcess[str], tail: int = TAIL) -> str:
    """What a failed example printed: its exit code, then the last ``tail`` characters of
    its stdout and of its stderr (the example's own report is on stdout)."""

    def shown(name: str, text: str | None) -> str:
        text = text or ""
        cut = f"last {tail} of {len(text)} characters" if len(text) > tail else "all of it"
        return f"--- {name} ({cut}) ---\n{text[-tail:] if text else '(empty)'}"

    return "\n".join(
        [
            f"{' '.join(map(str, done.args))} exited with {done.returncode}",
            shown("stdout", done.stdout),
            shown("stderr", done.stderr),
        ]
    )


def main(argv: list[str]) -> None:
    """``python3 -m tests.real_llm EXAMPLE [ARGS...]``: run an example against the real
    model of the environment's settings (registered, and the example's ``AGENCY_MODEL``)."""
    if not argv:
        raise SystemExit("usage: python3 -m tests.real_llm examples/<name>.py [args...]")
    try:
        settings = read_settings(os.environ)
    except RealLLMSettingsError as exc:
        raise SystemExit(str(exc)) from None
    agency.register_model(settings.model())
    os.environ["AGENCY_MODEL"] = MODEL_NAME
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python3 EXAMPLE` does
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
