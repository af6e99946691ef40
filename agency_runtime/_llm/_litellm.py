"""Loading litellm lazily, offline-safe, off the event loop.

``import litellm`` takes seconds and, with its defaults, fetches a price list over the
network and loads a stray ``.env`` file. So it is imported only when the first LLM call
needs it, in a worker thread, after ``LITELLM_LOCAL_MODEL_COST_MAP=True`` and
``LITELLM_MODE=PRODUCTION`` are set (unless the user set them). ``agency.preload()`` does it
ahead of time.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Callable
from types import ModuleType

import anyio.to_thread

__all__ = [
    "IMPORT_NOTICE",
    "add_import_notice",
    "add_load_hook",
    "litellm_module",
    "load_litellm",
    "load_litellm_sync",
    "start_preload",
]

_lock = threading.Lock()
_module: ModuleType | None = None
_hooks: list[Callable[[ModuleType], None]] = []
_notices: list[Callable[[str], None]] = []
_noticed = False

logger = logging.getLogger("agency_runtime.llm")

IMPORT_NOTICE = "loading litellm for the first LLM call (a few seconds, once per process)…"
"""What an LLM call that has to wait for ``import litellm`` says before it waits."""


def add_import_notice(notice: Callable[[str], None]) -> None:
    """Call ``notice(message)`` when an LLM call starts waiting for ``import litellm``.

    Command-line tools use it to say what they are waiting for (the import takes seconds);
    the message is also logged at INFO on ``agency_runtime.llm``. Called at most once per
    process, and not at all when litellm is already loaded.
    """
    with _lock:
        if notice not in _notices:
            _notices.append(notice)


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
    global _noticed
    module = _module
    if module is not None:
        return module
    with _lock:
        notices = [] if _noticed or _module is not None else list(_notices)
        first = not _noticed
        _noticed = True
    if first:
        logger.info(IMPORT_NOTICE)
        for notice in notices:
            try:
                notice(IMPORT_NOTICE)
            except Exception:  # a notice is a courtesy; it never fails the call
                logger.debug("an import notice failed", exc_info=True)
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
