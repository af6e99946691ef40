"""A store URL as it may be shown: every secret in it replaced by ``***``.

What is a secret (names compared ignoring case, ``-`` read as ``_``, percent-decoded):

* the password of the URL's user info (``postgresql://user:***@host/db``);
* the value of every query parameter or ``key=value`` conninfo setting named in
  :data:`SECRET_PARAMETERS` (libpq's ``password`` and ``sslpassword``, and the usual names
  of tokens and keys), or whose name holds one of :data:`SECRET_PARTS`
  (``db_password``, ``auth_token``, …).

Paths to files that hold secrets (libpq's ``passfile``, ``sslkey``, ``sslcert``) are shown:
they say where a secret is, not what it is, and nothing here ever reads those files.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

__all__ = ["SECRET_PARAMETERS", "SECRET_PARTS", "is_secret_parameter", "redact"]

SECRET_PARAMETERS = frozenset({"password", "sslpassword", "key", "apikey", "api_key", "pwd"})
"""Parameters whose value is a secret, by name."""

SECRET_PARTS = ("password", "passwd", "secret", "token", "api_key", "apikey", "access_key")
"""A parameter whose (lower-case) name holds one of these is a secret too."""

_CONNINFO = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")


def is_secret_parameter(name: str) -> bool:
    """Whether the URL parameter (or conninfo setting) ``name`` holds a secret."""
    name = unquote_plus(name).strip().lower().replace("-", "_")
    return name in SECRET_PARAMETERS or any(part in name for part in SECRET_PARTS)


def _conninfo(text: str) -> str:
    return _CONNINFO.sub(
        lambda m: m.group(1) + m.group(2) + "***" if is_secret_parameter(m.group(1)) else m[0],
        text,
    )


def _query(query: str) -> str:
    pieces = []
    for piece in query.split("&"):
        name, equals, _value = piece.partition("=")
        pieces.append(f"{name}=***" if equals and is_secret_parameter(name) else piece)
    return "&".join(pieces)


def _userinfo(rest: str) -> str:
    """``rest`` (a URL after its ``scheme://``) with the password of its user info masked.

    The user info ends at the last ``@`` before the ``/`` or ``?`` that follows its first
    ``@``, so a password holding an unencoded ``@``, ``/``, ``?`` or ``#`` is masked whole; an
    ``@`` after both the path's first ``/`` and the query's ``?`` is not user info.
    """
    at = rest.find("@")
    if at <= 0 or rest.startswith("/"):
        return rest
    slash, question = rest.find("/"), rest.find("?")
    if 0 <= slash < at and 0 <= question < at:
        return rest  # an "@" in the query: no user info
    ends = [i for i in (rest.find("/", at), rest.find("?", at)) if i >= 0]
    last = rest.rfind("@", 0, min(ends, default=len(rest)))
    user, colon, _password = rest[:last].partition(":")
    return f"{user}{':***' if colon else ''}{rest[last:]}"


def redact(url: str) -> str:
    """``url`` (or a ``key=value`` conninfo) with its secrets replaced by ``***``; the rest
    is shown as written (percent-encoding kept)."""
    if "://" not in url:
        return _conninfo(url)
    scheme, rest = url.split("://", 1)
    place, question, query = _userinfo(rest).partition("?")
    return f"{scheme}://{place}{question}{_query(query)}"
