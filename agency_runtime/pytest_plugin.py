"""pytest fixtures for code built on agency_runtime (loaded automatically by pytest).

* ``agency_store`` — a fresh in-memory :class:`~agency_runtime.MemoryStore` per test;
* ``agency_frame`` — a test frame (``agency.test_context()``) around the test, so
  ``agency.*`` members work in plain unit tests;
* ``agency_fake_model`` — a factory of offline :class:`~agency_runtime.testing.FakeModel`
  instances, registered for the test and removed after it.

Nothing here imports litellm, and neither does a call to a fake model: ``agency.llm``
answers ``fake/...`` models at its provider seam. (Pass ``via_litellm=True`` to the factory
to send a model's calls through litellm's real code instead.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ._clock import FakeClock
from ._core._frame import Frame
from ._facade import agency
from ._store import MemoryStore

__all__ = ["agency_clock", "agency_fake_model", "agency_frame", "agency_store"]


@pytest.fixture
def agency_store() -> MemoryStore:
    """A private, empty in-memory store."""
    return MemoryStore()


@pytest.fixture
def agency_clock() -> Iterator[FakeClock]:
    """A :class:`~agency_runtime.testing.FakeClock` that runs started in the test read.

    Advance it with ``agency_clock.advance(seconds)``; the system clock is back afterwards.
    Build stores with ``clock=agency_clock`` when their leases and stored times should
    follow it too.
    """
    clock = FakeClock()
    previous = agency.configure(clock=clock)
    try:
        yield clock
    finally:
        agency.configure(clock=previous)


@pytest.fixture
def agency_frame() -> Iterator[Frame]:
    """An ``agency.test_context()`` frame for the duration of the test."""
    with agency.test_context() as frame:
        yield frame


@pytest.fixture
def agency_fake_model() -> Iterator[Callable[..., Any]]:
    """``agency_fake_model(name, replies=[...], ...)`` → a registered ``FakeModel``.

    Keyword options are :class:`~agency_runtime.testing.FakeModel`'s (``function=``,
    ``latency=``, ``fail_times=``, ``failure=``, prices, ``via_litellm=``).
    """
    from ._fakes import FakeModel

    made: list[Any] = []

    def make(name: str = "scripted", **options: Any) -> Any:
        model = FakeModel(name, **options).register()
        made.append(model)
        return model

    yield make
    for model in made:
        model.unregister()
