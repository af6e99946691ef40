"""Transient provider errors retried with capped exponential backoff, and the model's key
scrubbed from every error that quotes the provider: :func:`with_transient_retries`.

Every request through the provider seam goes through it (chat, streams and embeddings), for
every provider alike: a permanent error, or a transient one on its last attempt, becomes an
:class:`~agency_runtime.LLMCallError` chained to the provider's exception (or to a
:class:`_ScrubbedError` stand-in when that quotes the key).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio

from .._core._cancel import abort_reason, cancelled_by
from .._errors import AgencyError, LLMCallError, ProviderError
from .._secrets import mask, quotes

if TYPE_CHECKING:
    from pydantic import SecretStr

    from .._core._cancel import AbortSignal

__all__ = ["BACKOFF_BASE", "BACKOFF_CAP", "TRANSIENT_ATTEMPTS", "with_transient_retries"]

logger = logging.getLogger("agency_runtime.llm")

T = TypeVar("T")

TRANSIENT_ATTEMPTS = 3
"""Attempts per request when the provider fails transiently (timeouts, 429, 5xx, drops)."""

BACKOFF_BASE, BACKOFF_CAP = 0.5, 10.0


class _ScrubbedError(Exception):
    """A provider's error that quoted the model's api_key, the key masked (its chain cut)."""


def _cause(original: BaseException, key: str | None) -> BaseException:
    """What an :class:`LLMCallError` is chained to: the provider's exception, or a stand-in
    with the key masked when its message, arguments or notes (or those of an exception it
    chains) quote the key in any case, so a traceback never shows it."""
    if not key:
        return original
    seen: BaseException | None = original
    for _ in range(16):
        if seen is None:
            return original
        notes = getattr(seen, "__notes__", None)
        if quotes(f"{seen} {seen.args!r} {notes!r}", key):
            break
        seen = seen.__cause__ or seen.__context__
    return _ScrubbedError(mask(f"{type(original).__qualname__}: {original}", key))


async def with_transient_retries(
    call: Callable[[], Awaitable[T]],
    *,
    model: str,
    signal: AbortSignal | None,
    what: str = "call",
    secret: SecretStr | None = None,
) -> T:
    """``await call()``, retrying transient :class:`ProviderError` with capped backoff.

    Up to :data:`TRANSIENT_ATTEMPTS` attempts, sleeping ``BACKOFF_BASE`` seconds after the
    first failure and twice as long after each next one (at most ``BACKOFF_CAP``). A
    permanent provider error, or a transient one on the last attempt, raises
    :class:`LLMCallError` chained to the provider library's original exception; any other
    exception a provider lets out (not an :class:`AgencyError`) is permanent too. When
    ``signal`` fires the call and the backoff sleep stop and its reason is raised.
    ``secret`` (the model's api_key) is masked, in any case, in every message that quotes
    the provider, and in the exceptions the error chains (see :func:`_cause`). Errors are
    raised outside the ``except`` clause that caught the provider's, so the provider's
    exception is not their ``__context__`` either.
    """
    delay = BACKOFF_BASE
    key = None if secret is None else secret.get_secret_value()
    for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
        if signal is not None:
            signal.raise_if_aborted()
        failure: LLMCallError | None = None
        try:
            if signal is None:
                return await call()
            with cancelled_by(signal) as scope:
                result = await call()
            if scope.cancelled_caught:
                raise abort_reason(signal)
            return result
        except ProviderError as exc:
            original = exc.original
            reason = mask(f"{type(original).__name__}: {original}", key)
            if not exc.transient or attempt == TRANSIENT_ATTEMPTS:
                times = f" {attempt} times" if exc.transient else ""
                failure = LLMCallError(
                    f"the {what} to {model!r} failed{times}: {reason}",
                    model=model,
                    attempts=attempt,
                )
                cause = _cause(original, key)
            else:
                logger.info("transient error from %r (attempt %d): %s", model, attempt, reason)
                cause = _cause(exc, key)  # what a cancelled backoff's error is chained to
        except (AgencyError, anyio.get_cancelled_exc_class()):
            raise
        except Exception as exc:
            failure = LLMCallError(
                mask(f"the {what} to {model!r} failed: {type(exc).__name__}: {exc}", key),
                model=model,
                attempts=attempt,
            )
            cause = _cause(exc, key)
        if failure is not None:
            raise failure from cause
        if signal is None:
            await anyio.sleep(delay)
        else:
            with cancelled_by(signal) as scope:
                await anyio.sleep(delay)
            if scope.cancelled_caught:
                raise abort_reason(signal) from cause
        delay = min(delay * 2, BACKOFF_CAP)
    raise AssertionError("unreachable")  # pragma: no cover
