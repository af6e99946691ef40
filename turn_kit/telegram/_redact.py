"""Keeping bot tokens out of logs and error messages.

A Bot API URL carries the bot token (``/bot<id>:<secret>/<method>``): httpx logs every request
URL at INFO, python-telegram-bot logs its API URL at DEBUG, and an HTTP error may quote the URL.
This module scrubs such text:

* :func:`scrub_text` rewrites ``bot<id>:<secret>`` to ``bot<token>`` and every token known to
  this process (see :func:`install_token_redaction`; a bot token's secret part on its own too;
  secrets shorter than 6 characters are left to the pattern) to ``<token>``, both
  **case-insensitively** (python-telegram-bot capitalizes error texts, which may turn
  ``bot123:AbC`` into ``Bot123:abc``);
* :func:`scrub_exception` does the same, in place, to an exception and the exceptions chained
  to it, before it is raised into a run (whose stored error is the exception's message);
* :func:`install_token_redaction` adds one logging filter to the loggers that can carry a URL
  (``httpx``, ``httpcore.*``, python-telegram-bot's loggers and ``turn_kit.telegram``). Every
  Telegram component calls it when it is constructed. It is idempotent and cheap: it imports
  nothing (python-telegram-bot's loggers are named, not imported) and only checks a dozen
  loggers' filter lists.

A logger's filter applies to the records created on that very logger, so the list names the
loggers the libraries actually log on (httpcore's are ``httpcore.connection``,
``httpcore.http11``, …), not just their parents.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

__all__ = [
    "REDACTED_LOGGERS",
    "install_token_redaction",
    "scrub_exception",
    "scrub_text",
]

REDACTED_LOGGERS: tuple[str, ...] = (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "telegram",
    "telegram.Bot",
    "telegram.request.BaseRequest",
    "telegram.request.HTTPXRequest",
    "telegram.ext",
    "telegram.ext.ExtBot",
    "telegram.ext.Updater",
    "telegram.ext.Application",
    "turn_kit.telegram",
)
"""The loggers the redacting filter is installed on."""

_MIN_LITERAL = 6
"""Shorter secrets are not scrubbed literally (that would garble ordinary words)."""

_TOKEN_IN_URL = re.compile(r"bot\d+(?::|%3a)[A-Za-z0-9_-]+", re.IGNORECASE)

_lock = threading.Lock()
_known: set[str] = set()
_literals: re.Pattern[str] | None = None


def _remember(tokens: Iterable[str | None]) -> None:
    """Scrub ``tokens`` literally from now on, and a bot token's secret part on its own."""
    global _literals
    wanted: set[str] = set()
    for token in tokens:
        token = (token or "").strip()
        wanted.update((token, token.partition(":")[2]))
    fresh = {t for t in wanted if len(t) >= _MIN_LITERAL} - _known
    if not fresh:
        return
    with _lock:
        _known.update(fresh)
        ordered = sorted(_known, key=len, reverse=True)  # the longest first: no partial hits
        _literals = re.compile("|".join(re.escape(t) for t in ordered), re.IGNORECASE)


def scrub_text(text: str, *tokens: str | None) -> str:
    """``text`` without bot tokens: ``bot<id>:<secret>`` → ``bot<token>`` and every known
    token (plus ``tokens``) → ``<token>``, ignoring case."""
    if tokens:
        _remember(tokens)
    if not text:
        return text
    literals = _literals
    if literals is not None:
        text = literals.sub("<token>", text)
    return _TOKEN_IN_URL.sub("bot<token>", text)


def _scrub_value(value: object) -> object:
    return scrub_text(value) if isinstance(value, str) else value


def scrub_exception(exc: BaseException, *tokens: str | None) -> BaseException:
    """Scrub ``exc`` and the exceptions chained to it (``__cause__``/``__context__``), in
    place: their string ``args`` and a string ``message`` attribute (python-telegram-bot's).
    Returns ``exc``. Never raises."""
    if tokens:
        _remember(tokens)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 32:
        seen.add(id(current))
        try:
            args = tuple(_scrub_value(a) for a in current.args)
            if args != current.args:
                current.args = args
            message = getattr(current, "message", None)
            if isinstance(message, str):
                scrubbed = scrub_text(message)
                if scrubbed != message:
                    current.message = scrubbed  # type: ignore[attr-defined]
        except Exception:  # an exotic exception is left as it is
            pass
        current = current.__cause__ or current.__context__
    return exc


class _TokenRedactor(logging.Filter):
    """Scrubs bot tokens from a record's message (and its exception) before any handler
    sees it; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken record is not ours to fix
            return True
        redacted = scrub_text(message)
        if redacted != message:
            record.msg = redacted
            record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            scrub_exception(record.exc_info[1])
            if not record.exc_text:
                text = logging.Formatter().formatException(record.exc_info)
                scrubbed = scrub_text(text)
                if scrubbed != text:
                    record.exc_text = scrubbed
        if record.exc_text:
            record.exc_text = scrub_text(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub_text(record.stack_info)
        return True


_TOKEN_REDACTOR = _TokenRedactor()


def install_token_redaction(*tokens: str | None, loggers: Iterable[str] = ()) -> None:
    """Install the redacting filter on :data:`REDACTED_LOGGERS` (and ``loggers``), once per
    logger, and remember ``tokens`` (blank or ``None`` ones are ignored) for literal
    scrubbing."""
    _remember(tokens)
    with _lock:
        for name in (*REDACTED_LOGGERS, *loggers):
            logger = logging.getLogger(name)
            if not any(isinstance(f, _TokenRedactor) for f in logger.filters):
                logger.addFilter(_TOKEN_REDACTOR)
