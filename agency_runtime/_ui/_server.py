"""Serving the run inspector with uvicorn (``agency ui``)."""

from __future__ import annotations

import logging
import re

import uvicorn
from starlette.applications import Starlette

__all__ = ["RedactTokens", "serve", "server"]

_TOKEN = re.compile(r"(?i)(token=)[^&\s\"']*")


class RedactTokens(logging.Filter):
    """Replaces ``token=...`` in log records by ``token=***`` (the access log shows paths)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                _TOKEN.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args
            )
        if isinstance(record.msg, str):
            record.msg = _TOKEN.sub(r"\1***", record.msg)
        return True


def server(app: Starlette, *, host: str, port: int, log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for ``app`` on ``host:port``: no proxy headers trusted, no server
    banner, and an access log that never shows a token."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        proxy_headers=False,
        server_header=False,
        lifespan="off",
    )
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, RedactTokens) for f in access.filters):
        access.addFilter(RedactTokens())
    return uvicorn.Server(config)


def serve(app: Starlette, *, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve ``app`` on ``host:port`` until Ctrl-C or SIGTERM."""
    server(app, host=host, port=port).run()
