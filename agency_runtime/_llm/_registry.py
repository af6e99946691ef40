"""Which provider answers a model string: routed by the model's prefix.

``provider_for("fake/echo")`` is the offline fake provider (:mod:`._fake`, imported the
first time a ``fake/`` model is used); a prefix registered with :func:`register_provider`
goes to its provider; every other model goes to the default provider, litellm
(:mod:`._litellm`, which imports litellm itself only when a request needs it).
"""

from __future__ import annotations

import importlib
import threading

from .._errors import InvalidArgumentError
from ._provider import ChatProvider

__all__ = ["default_provider", "provider_for", "register_provider", "unregister_provider"]

_lock = threading.Lock()
_providers: dict[str, ChatProvider] = {}
_BUILT_IN: dict[str, tuple[str, str]] = {"fake": ("agency_runtime._llm._fake", "PROVIDER")}
"""Prefixes served by a provider of this package: (module, attribute), imported on first use."""
_default: ChatProvider | None = None


def register_provider(prefix: str, provider: ChatProvider) -> ChatProvider | None:
    """Route every model ``"<prefix>/..."`` to ``provider``; return the one it replaces.

    A prefix is the part of the model string before its first ``/`` (``"fake"`` for
    ``"fake/echo"``). Registering one of this package's own prefixes (``fake``) replaces
    the built-in provider until :func:`unregister_provider`.
    """
    if not isinstance(prefix, str) or not prefix or "/" in prefix or prefix != prefix.strip():
        raise InvalidArgumentError(
            f"a provider prefix is the model string's part before '/', e.g. 'fake'; got {prefix!r}"
        )
    if not isinstance(provider, ChatProvider):
        raise InvalidArgumentError(
            f"provider must implement ChatProvider (complete, stream, embed, supports_schema); "
            f"got {type(provider).__name__}"
        )
    with _lock:
        previous = _providers.get(prefix)
        _providers[prefix] = provider
    return previous if previous is not None else _built_in(prefix)


def unregister_provider(prefix: str) -> None:
    """Route ``"<prefix>/..."`` models as if :func:`register_provider` never named it."""
    with _lock:
        _providers.pop(prefix, None)


def default_provider() -> ChatProvider:
    """The provider of models whose prefix nobody registered: litellm."""
    global _default
    provider = _default
    if provider is None:
        from ._litellm import LITELLM_PROVIDER

        provider = _default = LITELLM_PROVIDER
    return provider


def _built_in(prefix: str) -> ChatProvider | None:
    """This package's own provider of ``prefix`` (imported now), or ``None``."""
    built_in = _BUILT_IN.get(prefix)
    if built_in is None:
        return None
    module, attribute = built_in
    found: ChatProvider = getattr(importlib.import_module(module), attribute)
    return found


def provider_for(model: str) -> ChatProvider:
    """The provider that answers ``model`` (never imports a provider library itself)."""
    prefix, slash, _ = model.partition("/")
    if slash:
        provider = _providers.get(prefix)
        if provider is not None:
            return provider
        found = _built_in(prefix)
        if found is not None:
            with _lock:
                return _providers.setdefault(prefix, found)
    return default_provider()
