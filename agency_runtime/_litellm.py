"""Loading litellm lazily, offline-safe, off the event loop.

``import litellm`` takes seconds and, with its defaults, fetches a price list over the
network and loads a stray ``.env`` file. So it is imported only when the first LLM call
needs it, in a worker thread, after ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and
``LITELLM_MODE=PRODUCTION`` are set (unless the user set them). ``agency.preload()`` does it
ahead of time.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from types import ModuleType

import anyio.to_thread

__all__ = [
    "add_load_hook",
    "litellm_module",
    "load_litellm",
    "load_litellm_sync",
    "start_preload",
]

_lock = threading.Lock()
_module: ModuleType | None = None
_hooks: list[Callable[[ModuleType], None]] = []


def add_load_hook(hook: Callable[[ModuleType], None]) -> None:
    """Call ``hook(litellm)`` once litellm is loaded (at once if it already is)."""
    with _lock:
        module = _module
        if module is None:
            _hooks.append(hook)
            return
    hook(module)


def load_litellm_sync() -> ModuleType:
    """Import and configure litellm (blocking; idempotent)."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
        import litellm

        litellm.suppress_debug_info = True
        litellm.telemetry = False
        # litellm brings ~3000 modules of long-lived objects: move them out of the cyclic
        # collector's view, so later collections do not walk them again and again.
        gc.freeze()
        hooks, _hooks[:] = list(_hooks), []
        _module = litellm
    for hook in hooks:
        hook(litellm)
    return litellm


async def load_litellm() -> ModuleType:
    """litellm, imported in a worker thread the first time so the event loop never blocks."""
    module = _module
    if module is not None:
        return module
    return await anyio.to_thread.run_sync(load_litellm_sync)


_preload: threading.Thread | None = None


def start_preload(*, wait: bool = False) -> None:
    """Import litellm in a daemon thread (once); with ``wait``, block until it is loaded."""
    global _preload
    with _lock:
        if _module is None and _preload is None:
            _preload = threading.Thread(
                target=load_litellm_sync, name="agency-preload-litellm", daemon=True
            )
            _preload.start()
        thread = _preload
    if wait:
        if thread is not None:
            thread.join()
        load_litellm_sync()


def litellm_module() -> ModuleType | None:
    """litellm if it is loaded already, else ``None`` (never imports it)."""
    return _module
