"""The offline fake provider: ``fake/...`` models answered in-process, without litellm.

A provider beside litellm, not part of the LLM layer: the registry
(:mod:`agency_runtime._llm._registry`) names this package for the ``fake`` prefix and
imports it on the first ``fake/<name>`` model, and it answers through the provider seam
(:mod:`agency_runtime._llm._provider`) like any provider. It powers ``AGENCY_MODEL=fake/echo``,
the demo and the test suite, so it is production code; :mod:`agency_runtime.testing`
re-exports its public names. Nothing here imports litellm.

``_models``          :class:`FakeModel` (scripts, reply functions, latency, failures) and the
                     process's table of fake models (``fake/echo``, ``fake/json`` built in)
``_replies``         what a fake model is asked (:class:`FakeRequest`) and may answer
                     (:class:`FakeToolCall`, :class:`FakeStream`)
``_schema``          JSON documents generated from a requested JSON schema
``_usage``           deterministic tokens, cost inputs and bag-of-words embeddings
``_provider``        :data:`PROVIDER`, the fake ``ChatProvider`` at the seam
``_litellm_handler`` the same models as a litellm custom provider, installed when litellm
                     loads (the load hook added here), for ``via_litellm=True``

**Through litellm.** Once anything loads litellm, ``litellm.acompletion(model="fake/<name>",
...)`` is answered by the same models, with litellm's own exceptions for failures.
``FakeModel(..., via_litellm=True)`` makes ``agency.llm`` itself go that way (through the
litellm provider and litellm's real code), for tests of the litellm path. Tool calls and
:class:`FakeStream` chunks come out of litellm as they would from a real provider
(``message.tool_calls``; streamed ``delta.tool_calls``), so the litellm provider's own
parsing is what the test exercises.
"""

from __future__ import annotations

from .._llm._litellm import add_load_hook
from ._litellm_handler import install
from ._litellm_handler import installed as fake_provider_installed
from ._models import FAKE_PROVIDER, FakeModel, FakeModelExhausted, reset
from ._provider import PROVIDER, FakeProvider
from ._replies import FakeRequest, FakeStream, FakeToolCall
from ._usage import EMBEDDING_DIMENSIONS, fake_embedding

__all__ = [
    "EMBEDDING_DIMENSIONS",
    "FAKE_PROVIDER",
    "PROVIDER",
    "FakeModel",
    "FakeModelExhausted",
    "FakeProvider",
    "FakeRequest",
    "FakeStream",
    "FakeToolCall",
    "fake_embedding",
    "fake_provider_installed",
    "reset",
]

add_load_hook(install)
