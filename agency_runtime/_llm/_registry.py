"""Which provider answers a model: routing by the model string's prefix.

The provider model string routes (an ``agency.Model``'s ``model``, not its name):
a prefix registered with :func:`register_provider` to its provider; ``fake/...`` to the
offline fake provider, a package beside this one (:mod:`agency_runtime._fakes`) that this
layer names but never imports until a ``fake/`` model is first asked for; everything else to
litellm (:mod:`._litellm`), the default, which imports litellm only when it is first asked.
Routing itself never imports a provider library. The process's routing table is one
:class:`ProviderRegistry`, :data:`PROVIDERS`, which the composition root refers to.
"""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

from .._errors import InvalidArgumentError
from ._model import Model

if TYPE_CHECKING:
    from ._provider import ChatProvider

__all__ = [
    "PROVIDERS",
    "ProviderRegistry",
    "default_provider",
    "provider_for",
    "register_provider",
    "unregister_provider",
]

_BUILT_IN: dict[str, tuple[str, str]] = {"fake": ("agency_runtime._fakes", "PROVIDER")}
"""Prefixes served by a provider of this package: (module, attribute), imported on first use.

The module is named, not imported: the LLM layer never imports the fake provider
(import-linter holds ``_llm`` below ``_fakes``), and a process that never asks for a
``fake/`` model never loads it."""


class ProviderRegistry:
    """Model prefix → provider, plus the default provider (litellm, made on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._providers: dict[str, ChatProvider] = {}
        self._built_ins: dict[str, ChatProvider] = {}
        self._default: ChatProvider | None = None

    def register(self, prefix: str, provider: ChatProvider) -> ChatProvider | None:
        """Route every model ``"<prefix>/..."`` to ``provider``; return the one it replaces.

        A prefix is the part of the model string before its first ``/`` (``"fake"`` for
        ``"fake/echo"``). Registering one of this package's own prefixes (``fake``) replaces
        the built-in provider until :meth:`unregister`.
        """
        if not isinstance(prefix, str) or not prefix or "/" in prefix or prefix != prefix.strip():
            raise InvalidArgumentError(
                "a provider prefix is the model string's part before '/', e.g. 'fake'; "
                f"got {prefix!r}"
            )
        from ._provider import ChatProvider  # the seam's shapes load with their first use

        if not isinstance(provider, ChatProvider):
            raise InvalidArgumentError(
                "provider must implement ChatProvider (complete, stream, embed, "
                f"supports_schema); got {type(provider).__name__}"
            )
        with self._lock:
            previous = self._providers.get(prefix)
            self._providers[prefix] = provider
        return previous if previous is not None else _built_in(prefix)

    def unregister(self, prefix: str) -> None:
        """Route ``"<prefix>/..."`` models as if :meth:`register` never named it."""
        with self._lock:
            self._providers.pop(prefix, None)

    def default(self) -> ChatProvider:
        """The provider of models whose prefix nobody registered: litellm."""
        provider = self._default
        if provider is None:
            from ._litellm import LITELLM_PROVIDER

            provider = self._default = LITELLM_PROVIDER
        return provider

    def provider_for(self, model: str | Model) -> ChatProvider:
        """The provider that answers ``model`` (never imports a provider library itself).

        A :class:`~._model.Model` is routed by its provider model string (``model.model``),
        never by its name.
        """
        if isinstance(model, Model):
            model = model.model
        prefix, slash, _ = model.partition("/")
        if slash:
            provider = self._providers.get(prefix) or self._built_ins.get(prefix)
            if provider is not None:
                return provider
            built_in = _built_in(prefix)
            if built_in is not None:
                with self._lock:
                    return self._built_ins.setdefault(prefix, built_in)
        return self.default()


def _built_in(prefix: str) -> ChatProvider | None:
    """This package's own provider of ``prefix`` (imported now), or ``None``."""
    built_in = _BUILT_IN.get(prefix)
    if built_in is None:
        return None
    module, attribute = built_in
    found: ChatProvider = getattr(importlib.import_module(module), attribute)
    return found


PROVIDERS = ProviderRegistry()
"""The process's routing table."""


def register_provider(prefix: str, provider: ChatProvider) -> ChatProvider | None:
    """Route every model ``"<prefix>/..."`` to ``provider`` (:meth:`ProviderRegistry.register`)."""
    return PROVIDERS.register(prefix, provider)


def unregister_provider(prefix: str) -> None:
    """Undo :func:`register_provider` for ``prefix``."""
    PROVIDERS.unregister(prefix)


def default_provider() -> ChatProvider:
    """The provider of models whose prefix nobody registered: litellm."""
    return PROVIDERS.default()


def provider_for(model: str | Model) -> ChatProvider:
    """The provider that answers ``model`` (never imports a provider library itself)."""
    return PROVIDERS.provider_for(model)
