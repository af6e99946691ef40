"""Test helpers: offline fake LLM models (``fake/...``, answered in-process) and a fake clock.

:class:`FakeClock` moves only when a test advances it; ``agency.configure(clock=...)`` (or
the ``agency_clock`` pytest fixture) gives new runs that clock, and stores take one with
``clock=``: leases, guards, TTLs and stored times then follow it, so nothing sleeps.

The fake provider itself is production code (it also powers ``AGENCY_MODEL=fake/echo`` and
the demo) and lives in its own package beside the providers, :mod:`agency_runtime._fakes`;
this module re-exports its public names. Importing it never imports litellm, and neither
does a ``fake/`` model call: the LLM layer routes ``fake/<name>`` to the fake provider at
its seam. ``agency.llm`` with ``model="fake/<name>"`` (or ``AGENCY_MODEL=fake/<name>``) is
answered, with no network, by:

* ``fake/echo`` (built in): replies with the text of the last user message; when the request
  carries a JSON-schema response format (a pydantic class, or
  ``{"type": "json_schema", "json_schema": {"schema": {...}}}``) it replies with a JSON
  document generated from the schema that validates against it, like pydantic-ai's
  ``TestModel``.
* ``fake/json`` (built in): the same, but replies ``{}`` when the request has no schema.
* a :class:`FakeModel` you registered: scripted replies, a reply function, latency,
  transient or permanent failures; every request it receives is recorded in ``.calls``.
  It answers embedding requests too (bag-of-words hash vectors, recorded in
  ``.embed_calls``), so agent memory's embedding search works offline.

Usage and cost are deterministic: ``prompt_tokens`` is the number of whitespace-separated
words over all message contents plus one per message, ``completion_tokens`` the number of
words in the reply (at least 1), and the cost is ``prompt_tokens * input_cost_per_token +
completion_tokens * output_cost_per_token``.

Example::

    from agency_runtime.testing import FakeModel

    with FakeModel("planner", replies=["first", {"answer": 42}]) as fake:
        ...  # code that calls agency.llm with model=fake.model ("fake/planner")
    assert len(fake.calls) == 2

At the seam, ``fail_times``/``failure`` raise a provider error of that kind (rate limits,
timeouts, server and connection errors are transient, so ``agency.llm`` retries them; a bad
request is not), and a scripted exception is raised as it is. :class:`FakeModelExhausted` is
raised when a script runs out (``agency.llm`` turns it into ``LLMCallError``, no retry).

**Through litellm.** Once anything loads litellm, ``fake`` is also installed as a litellm
custom provider (:func:`fake_provider_installed`) and every fake model is priced with
``litellm.register_model``: ``litellm.acompletion(model="fake/<name>", ...)`` is answered by
the same models, failures are litellm's exceptions (``litellm.RateLimitError``,
``litellm.Timeout``, ...), ``response._hidden_params["response_cost"]`` and
``litellm.completion_cost`` give the same cost. litellm wraps any exception a provider
raises that is not a litellm exception into ``litellm.APIConnectionError`` (the original is
its ``__context__``); :class:`FakeModelExhausted` is then raised as a
``litellm.BadRequestError`` that is also a :class:`FakeModelExhausted`, so it reaches the
caller unwrapped. ``FakeModel(..., via_litellm=True)`` sends ``agency.llm``'s calls for that
model through litellm (its real code path), for tests of the litellm provider.
"""

from __future__ import annotations

from ._clock import FakeClock
from ._fakes import (
    FAKE_PROVIDER,
    FakeModel,
    FakeModelExhausted,
    FakeRequest,
    FakeStream,
    FakeToolCall,
    fake_embedding,
    fake_provider_installed,
    reset,
)

__all__ = [
    "FAKE_PROVIDER",
    "FakeClock",
    "FakeModel",
    "FakeModelExhausted",
    "FakeRequest",
    "FakeStream",
    "FakeToolCall",
    "fake_embedding",
    "fake_provider_installed",
    "reset",
]
