"""Store selection: a URL (or ``AGENCY_STORE``) names a store; one instance per URL.

Accepted URLs:

* ``sqlite:///relative/path.db`` — relative to the working directory;
* ``sqlite:////absolute/path.db`` — an absolute path (four slashes);
* ``sqlite:///:memory:`` — a private in-memory SQLite database;
* query options: ``?synchronous=FULL`` (or ``NORMAL``, ``OFF``, ``EXTRA``),
  ``?busy_timeout=SECONDS``;
* ``memory://`` or ``memory://NAME`` — one in-process store per name;
* ``postgresql://user:password@host:5432/database`` (or ``postgres://…``) — a PostgreSQL
  store (extra ``postgres``); ``?schema=NAME`` picks the PostgreSQL schema (default
  ``agency``), every other query option goes to libpq (``sslmode=require``, …).
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from .._clock import Clock
from .._errors import InvalidArgumentError
from ._protocols import Store
from ._redact import redact

if TYPE_CHECKING:
    from ._sqlite import SqliteStore, Synchronous

__all__ = [
    "DEFAULT_STORE_URL",
    "STORES",
    "StoreRegistry",
    "open_store",
    "redact",
    "resolve_store",
]

DEFAULT_STORE_URL = "sqlite:///./.agency/agency.db"
"""The store used when neither ``store=`` nor ``AGENCY_STORE`` says otherwise."""

_SCHEMES = (
    "sqlite:///path.db, sqlite:////absolute/path.db, memory://, memory://NAME or "
    "postgresql://user:password@host/database"
)


_STORE_TYPES: set[type] = set()
"""The classes whose instances passed the (slow) :class:`Store` protocol check once."""


class StoreRegistry:
    """The stores this process opened: one instance per URL (``memory://NAME`` included).

    The composition root (:mod:`agency_runtime._boundary._runtime`) refers to the process's
    one registry, :data:`STORES`, and gives it the runtime's clock (:attr:`clock`): the memory
    and SQLite stores it opens stamp leases and times on the clock the run boundary judges
    them by. A PostgreSQL store keeps the database server's clock, the one every host
    sharing it agrees on. :func:`resolve_store` and :func:`open_store` use it.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._opened: dict[str, Store] = {}
        self._lock = threading.Lock()
        self.clock = clock
        """The clock stores opened from now on get (``None``: each backend's default)."""

    def resolve(self, store: str | Store | None = None) -> Store:
        """``store``, the store its URL names, ``AGENCY_STORE``'s, or the default store."""
        if store is None:
            store = os.environ.get("AGENCY_STORE") or DEFAULT_STORE_URL
        if isinstance(store, str):
            return self.open(store)
        if type(store) in _STORE_TYPES:  # the common case: no second protocol check
            return store
        if isinstance(store, Store):
            _STORE_TYPES.add(type(store))
            return store
        raise InvalidArgumentError(
            f"store must be a URL string ({_SCHEMES}) or a Store instance, "
            f"got {type(store).__name__}"
        )

    def open(self, url: str) -> Store:
        """Open (or return the already open) store named by ``url``.

        A SQLite store whose file was deleted or replaced since it was opened is not
        returned again: it refuses writes and would serve the old file's rows, so ``url``
        opens the file at that path now (a new, empty store where the file was deleted).
        Whoever still holds the old store object keeps getting its errors.
        """
        key = _canonical(url)
        with self._lock:
            store = self._opened.get(key)
            if store is None or (
                key.startswith("sqlite:") and cast("SqliteStore", store).file_gone()
            ):
                store = self._opened[key] = _create(url, key, self.clock)
            return store


STORES = StoreRegistry()
"""The process's open stores."""


def resolve_store(store: str | Store | None = None) -> Store:
    """The store to use: ``store``, the store its URL names, ``AGENCY_STORE``'s, or the default.

    A :class:`Store` is returned as it is; ``None`` means ``AGENCY_STORE``, else
    ``sqlite:///./.agency/agency.db``.
    """
    return STORES.resolve(store)


def open_store(url: str | Store | None = None) -> Store:
    """Open (or return the already open) store named by ``url`` (see :func:`resolve_store`)."""
    return STORES.resolve(url)


def _canonical(url: str) -> str:
    """A key that is equal for URLs naming the same store (relative paths resolved)."""
    scheme, path, options = _parse(url)
    if scheme == "sqlite" and path != ":memory:":
        path = str(Path(path).expanduser().resolve())
    query = "&".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{scheme}:{path}?{query}"


def _parse(url: str) -> tuple[str, str, dict[str, str]]:
    if not isinstance(url, str) or not url.strip():
        raise InvalidArgumentError(f"a store URL must be a non-empty string like {_SCHEMES}")
    url = url.strip()
    try:
        url.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"the store URL holds {url[exc.start]!r} at position {exc.start}, which is not a "
            "character (a lone surrogate, as from undecodable bytes): write the URL as text"
        ) from exc
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        # not shown: a URL that does not parse cannot have its password masked
        raise InvalidArgumentError(
            f"malformed store URL ({exc}): close an IPv6 host in brackets, like "
            "postgresql://user:password@[::1]:5432/database"
        ) from exc
    scheme = parts.scheme.lower()
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    if scheme == "memory":
        if "://" not in url:
            raise InvalidArgumentError(
                f"malformed store URL {redact(url)!r}: write memory:// or memory://NAME"
            )
        if options:
            raise InvalidArgumentError(
                f"the memory store takes no options, got {sorted(options)} in {redact(url)!r}"
            )
        return "memory", unquote(parts.netloc + parts.path), {}
    if scheme == "sqlite":
        if not url.lower().startswith("sqlite:///") or parts.netloc:
            raise InvalidArgumentError(
                f"malformed SQLite store URL {redact(url)!r}: write sqlite:///relative/path.db "
                "(three slashes) or sqlite:////absolute/path.db (four slashes)"
            )
        path = unquote(parts.path[1:])
        if "\x00" in path:
            raise InvalidArgumentError(
                f"the SQLite store URL {redact(url)!r} names a path with a NUL character (%00), "
                "which no file system accepts"
            )
        if not path or path.endswith("/"):
            raise InvalidArgumentError(
                f"the SQLite store URL {redact(url)!r} names no file: write sqlite:///path/to/agency.db"
            )
        _check_path_length(path)
        unknown = sorted(set(options) - {"synchronous", "busy_timeout"})
        if unknown:
            raise InvalidArgumentError(
                f"unknown option(s) {unknown} in the SQLite store URL {redact(url)!r}; "
                "known: synchronous, busy_timeout"
            )
        return "sqlite", path, options
    if scheme in ("postgresql", "postgres"):
        if not parts.netloc and not parts.path.strip("/"):
            raise InvalidArgumentError(
                f"malformed PostgreSQL store URL {redact(url)!r}: write "
                "postgresql://user:password@host:5432/database"
            )
        return "postgresql", parts.netloc + parts.path, options
    shown = f"{scheme}://" if scheme else repr(redact(url))
    raise InvalidArgumentError(f"unknown store URL scheme {shown}: use {_SCHEMES}")


MAX_PATH_BYTES = 4095
"""The longest SQLite store path accepted, in bytes (Linux's PATH_MAX less its NUL)."""
MAX_NAME_BYTES = 255
"""The longest file or folder name in a SQLite store path, in bytes (NAME_MAX)."""


def _check_path_length(path: str) -> None:
    """An InvalidArgumentError when ``path`` is longer than a file system takes."""
    size = len(os.fsencode(path))
    longest = max((len(os.fsencode(name)) for name in path.split("/")), default=0)
    if size > MAX_PATH_BYTES or longest > MAX_NAME_BYTES:
        raise InvalidArgumentError(
            f"the SQLite store path {path[:40]!r}... is too long ({size} bytes, a name of "
            f"{longest}): a path may have at most {MAX_PATH_BYTES} bytes and each name in it "
            f"{MAX_NAME_BYTES}"
        )


def _create(url: str, key: str, clock: Clock | None) -> Store:
    scheme, path, options = _parse(url)
    if scheme == "memory":
        from ._memory import MemoryStore

        return MemoryStore.named(path, clock=clock)
    if scheme == "postgresql":
        return _postgres(url, options)
    synchronous = options.get("synchronous", "NORMAL").upper()
    if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise InvalidArgumentError(
            f"synchronous={options['synchronous']!r} in {url!r} is not one of "
            "OFF, NORMAL, FULL, EXTRA"
        )
    try:
        busy_timeout = float(options.get("busy_timeout", "10"))
    except ValueError:
        raise InvalidArgumentError(
            f"busy_timeout={options['busy_timeout']!r} in {url!r} is not a number of seconds"
        ) from None
    if not math.isfinite(busy_timeout) or busy_timeout < 0 or busy_timeout > 86400:
        raise InvalidArgumentError(
            f"busy_timeout={options['busy_timeout']!r} in {url!r} must be a number of seconds, "
            "0 or more (at most 86400)"
        )
    file = path if path == ":memory:" else str(Path(path).expanduser().resolve())
    from ._sqlite import SqliteStore  # the backends load when a URL first names them

    return SqliteStore(
        file,
        synchronous=cast("Synchronous", synchronous),
        busy_timeout=busy_timeout,
        url=url,
        clock=clock,
    )


def _postgres(url: str, options: dict[str, str]) -> Store:
    """A PostgreSQL store: ``schema``, ``prepare`` and ``liveness`` are ours, every other
    option is handed to libpq."""
    parts = urlsplit(url.strip())
    ours = ("schema", "prepare", "liveness")
    rest = {key: value for key, value in options.items() if key not in ours}
    flags: dict[str, bool] = {}
    for name, why in (
        ("prepare", "false for a pooler that cannot keep prepared statements"),
        ("liveness", "false for a pooler in transaction mode: takeover then waits for leases"),
    ):
        value = options.get(name, "true").lower()
        if value not in ("true", "false"):
            raise InvalidArgumentError(
                f"{name}={options[name]!r} in {redact(url)!r} must be true or false ({why})"
            )
        flags[name] = value == "true"
    timeout = 5.0
    if "connect_timeout" in rest:
        try:
            timeout = float(rest["connect_timeout"])
        except ValueError:
            raise InvalidArgumentError(
                f"connect_timeout={rest['connect_timeout']!r} in {redact(url)!r} is not a "
                "number of seconds"
            ) from None
        if not math.isfinite(timeout) or timeout <= 0:
            raise InvalidArgumentError(
                f"connect_timeout={rest['connect_timeout']!r} in {redact(url)!r} must be a "
                "number of seconds above 0"
            )
    dsn = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), ""))
    schema = options.get("schema", "agency")
    from ._postgres import PostgresStore

    return PostgresStore(
        dsn, schema=schema, connect_timeout=timeout, url=url,
        prepare=flags["prepare"], liveness=flags["liveness"],
    )  # fmt: skip
