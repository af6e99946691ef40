"""The run inspector's guards: who may talk to it, and what its responses allow a browser.

* **Loopback by default.** Without a token, requests must name a loopback host in their
  ``Host`` header (``127.0.0.1``, ``[::1]``, ``localhost``): a web page that points a DNS
  name of its own at 127.0.0.1 (DNS rebinding) gets a 400, never a page of runs.
* **A token, when set, guards every request**: ``Authorization: Bearer T``, or the cookie
  set once by opening any page with ``?token=T`` (HttpOnly, SameSite=Lax; its value is an
  HMAC of the token, never the token; the redirect drops ``?token=`` from the address).
  Anything else gets a 401.
* **CSRF**: every POST carries a token, an HMAC (with a secret made at start-up) of the
  browser's session cookie (random, HttpOnly, SameSite=Strict); a POST without it, with a
  wrong one, or from another origin (``Origin``, ``Sec-Fetch-Site``) gets a 403.
* **Headers** on every response: a Content-Security-Policy of ``default-src 'self'`` (no
  inline script or style), ``X-Frame-Options: DENY``, ``nosniff``, ``Referrer-Policy:
  same-origin`` (``no-referrer`` would make browsers send ``Origin: null`` with same-site
  forms), and ``Cache-Control: no-store`` unless the response chose otherwise (the assets).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Mapping
from urllib.parse import urlencode

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agency_runtime import InvalidArgumentError

__all__ = [
    "MIN_TOKEN_LENGTH",
    "SESSION_COOKIE",
    "Csrf",
    "Guard",
    "check_token",
    "is_loopback",
]

MIN_TOKEN_LENGTH = 16
"""The shortest token accepted (``secrets.token_urlsafe(24)`` gives 32 characters)."""
SESSION_COOKIE = "agency_ui_session"

SECURITY_HEADERS: Mapping[str, str] = {
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}

_SESSION = re.compile(r"[A-Za-z0-9_-]{16,64}")


def check_token(token: str | None) -> str | None:
    """``token`` if it is acceptable (``None``: no token); raises otherwise."""
    if token is None:
        return None
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH or token != token.strip():
        raise InvalidArgumentError(
            f"the run inspector's token must be a string of at least {MIN_TOKEN_LENGTH} "
            "characters without surrounding spaces; make one with "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"
        )
    return token


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, maybe ``[v6]``) is this machine's loopback."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host part of a ``Host`` header (``[::1]:8765`` → ``[::1]``)."""
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Csrf:
    """CSRF tokens: an HMAC, with a per-process secret, of the browser's session cookie."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)

    @staticmethod
    def session_of(request: Request) -> str | None:
        """The request's session id, if its cookie holds a well-formed one."""
        value = request.cookies.get(SESSION_COOKIE)
        return value if value is not None and _SESSION.fullmatch(value) else None

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def token(self, session: str) -> str:
        """The CSRF token of ``session``."""
        return hmac.new(self._secret, b"csrf:" + session.encode(), hashlib.sha256).hexdigest()

    def valid(self, session: str | None, token: str | None) -> bool:
        """Whether ``token`` is the CSRF token of ``session``."""
        if session is None or not token:
            return False
        return hmac.compare_digest(self.token(session), token)


def same_origin(request: Request) -> bool:
    """Whether a request does not say it comes from another site (``Origin``,
    ``Sec-Fetch-Site``); a request that says nothing passes (the CSRF token decides)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin.lower() in (f"http://{host}".lower(), f"https://{host}".lower())


class Guard:
    """ASGI middleware: the host check, the token, and the security headers."""

    def __init__(self, app: ASGIApp, *, token: str | None) -> None:
        self.app = app
        self.token = check_token(token)
        if self.token is not None:
            digest = hashlib.sha256(self.token.encode()).hexdigest()
            self.cookie = f"agency_ui_auth_{digest[:8]}"
            self.cookie_value = hmac.new(
                self.token.encode(), b"agency-ui-auth", hashlib.sha256
            ).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                if "cache-control" not in headers:
                    headers["cache-control"] = "no-store"
            await send(message)

        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            await refusal(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)

    def _refusal(self, request: Request) -> Response | None:
        """The response that ends this request here, or ``None`` to serve it."""
        if self.token is None:
            host = request.headers.get("host", "")
            if not is_loopback(_host_name(host)):
                return HTMLResponse(
                    _plain_page(
                        "Host not allowed",
                        "This run inspector serves only its loopback address (a guard "
                        "against DNS rebinding). Open it as http://127.0.0.1:PORT/, or start "
                        "it with --token to serve other names.",
                    ),
                    status_code=400,
                )
            return None
        supplied = request.query_params.get("token")
        if supplied is not None and request.method in ("GET", "HEAD"):
            if hmac.compare_digest(supplied.encode(), self.token.encode()):
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
                response = RedirectResponse(target, status_code=303)
                response.set_cookie(
                    self.cookie, self.cookie_value, httponly=True, samesite="lax", path="/"
                )
                return response
            return self._unauthorized("the token in the address is not this server's token")
        if self._authorized(request):
            return None
        return self._unauthorized("this run inspector needs its token")

    def _authorized(self, request: Request) -> bool:
        assert self.token is not None
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value:
            return hmac.compare_digest(value.strip().encode(), self.token.encode())
        cookie = request.cookies.get(self.cookie)
        return cookie is not None and hmac.compare_digest(cookie, self.cookie_value)

    @staticmethod
    def _unauthorized(why: str) -> Response:
        body = _plain_page(
            "401 Unauthorized",
            f"{why.capitalize()}: open the address `agency ui` printed (it ends in "
            "?token=…), or send the header Authorization: Bearer <token>.",
            form=True,
        )
        return HTMLResponse(body, status_code=401, headers={"www-authenticate": "Bearer"})


def _plain_page(title: str, text: str, *, form: bool = False) -> str:
    """A page without styles or scripts (the assets need the token too)."""
    from html import escape

    ask = (
        '<form method="get" action=""><label>Token <input type="password" name="token" '
        'autocomplete="off" required></label> <button type="submit">Open</button></form>'
        if form
        else ""
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title></head><body><h1>{escape(title)}</h1>"
        f"<p>{escape(text)}</p>{ask}</body></html>"
    )
