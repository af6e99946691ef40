"""Shared fixtures: the anyio backend and an isolated store environment per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Never let a test reach a network or a stray .env if litellm is imported somewhere.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _isolated_store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs in its own directory with no AGENCY_STORE / AGENCY_MODEL set."""
    monkeypatch.delenv("AGENCY_STORE", raising=False)
    monkeypatch.delenv("AGENCY_MODEL", raising=False)
    monkeypatch.chdir(tmp_path)
