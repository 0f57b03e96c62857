"""Who may read the pages of ``spark-abs ui``: the ``Host`` a request names
and, when the page is exposed, a token.

- The ``Host`` header must name a host the page answers to: loopback's names
  (``localhost``, ``127.0.0.1``, ``[::1]``, any port) unless told more
  (``--allow-host``).  A page on loopback is otherwise reachable from any web
  page the operator's browser opens, through a name the attacker points at
  127.0.0.1 (DNS rebinding); such a request names the attacker's host and is
  answered 400.
- With a token (required off loopback), every request carries it: the header
  ``Authorization: Bearer <token>``, or ``?token=<token>`` once, which sets an
  HttpOnly, SameSite=Strict cookie and redirects to the same page without it.
  The token is compared in constant time (``hmac.compare_digest``) and never
  written to a log or a page: the server's request log shows ``token=<redacted>``.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from flask import Flask, Response, redirect, request
from werkzeug.serving import WSGIRequestHandler
from werkzeug.wrappers import Response as BaseResponse

from streaming.errors import ConfigError
from streaming.hosts import LOOPBACK_HOSTS, host_name, is_loopback
from streaming.private_files import read_private

__all__ = [
    "TOKEN_ENV",
    "LOOPBACK_HOSTS",
    "COOKIE",
    "Access",
    "RedactingRequestHandler",
    "guard",
    "host_name",
    "is_loopback",
    "read_token",
]

# the environment variable a token comes from (or a file: read_token)
TOKEN_ENV = "SPARK_ABS_UI_TOKEN"
# the cookie ``?token=`` sets
COOKIE = "spark_abs_ui_token"
_QUERY = "token"
_REDACT = re.compile(r"([?&]token=)[^&\s\"]*")


@dataclass(frozen=True, slots=True)
class Access:
    """What a request must show: a ``Host`` among ``hosts`` and, if ``token``
    is set, that token.  The defaults are a page on loopback."""

    # the host names (no port) a request's Host header may give
    hosts: frozenset[str] = LOOPBACK_HOSTS
    # the token every request must carry; None asks for none (a page on loopback)
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", frozenset(host_name(h) for h in self.hosts if h.strip()))
        if self.token is not None and not self.token.strip():
            raise ConfigError("ui token: empty; give a long random string")

    def allowing(self, names: Iterable[str]) -> Access:
        """These hosts allowed too."""
        return Access(self.hosts | frozenset(names), self.token)


def read_token(environ: Mapping[str, str], token_file: Path | None = None) -> str | None:
    """The token from ``token_file`` (a regular file of this user's that only its
    owner may read or write: ``read_private``; the token its first line) or
    ``$SPARK_ABS_UI_TOKEN``; None if neither."""
    from_env = environ.get(TOKEN_ENV, "").strip() or None
    if token_file is None:
        return from_env
    if from_env is not None:
        raise ConfigError(f"ui: a token from both --token-file and {TOKEN_ENV}; give one")
    text = read_private(token_file, "ui: the token file")
    token = text.splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise ConfigError(f"ui: the token file {token_file} is empty")
    return token


def _text(message: str, status: int, **headers: str) -> Response:
    return Response(message + "\n", status, {"Content-Type": "text/plain; charset=utf-8", **headers})


def _matches(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def guard(app: Flask, access: Access) -> None:
    """Check every request to ``app`` against ``access`` before it is served:
    a foreign ``Host`` is 400, a missing or wrong token 401."""
    allowed = ", ".join(sorted(f"[{h}]" if ":" in h else h for h in access.hosts))

    @app.before_request
    def _check() -> BaseResponse | None:
        name = host_name(request.host)
        if name not in access.hosts:
            return _text(
                f"400: this page answers to {allowed} (any port), not to the Host a request names here. "
                "A request for another name may be a web page that rebinds its name to this address; "
                f"to reach the page by that name, start it with --allow-host {name or 'NAME'}",
                400,
            )
        if access.token is None:
            return None
        if _QUERY in request.args:
            if not _matches(request.args.get(_QUERY), access.token):
                return _unauthorized()
            rest = urlencode([(k, v) for k, v in request.args.items(multi=True) if k != _QUERY])
            # to this server's own path: //host/... would leave it
            response = redirect("/" + request.path.lstrip("/") + (f"?{rest}" if rest else ""), 303)
            response.set_cookie(COOKIE, access.token, httponly=True, samesite="Strict", secure=request.is_secure)
            return response
        scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
        given = bearer.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE)
        return None if _matches(given, access.token) else _unauthorized()

    @app.after_request
    def _no_referrer(response: Response) -> Response:
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        return response


def _unauthorized() -> Response:
    return _text(
        "401: this page asks for its token: the header `Authorization: Bearer <token>`, "
        "or open it once as /?token=<token> (a cookie keeps it for the browser session)",
        401,
        **{"WWW-Authenticate": 'Bearer realm="spark-abs ui"'},
    )


class RedactingRequestHandler(WSGIRequestHandler):
    """werkzeug's request handler, its log lines without a ``?token=`` value."""

    def log(self, type: str, message: str, *args: object) -> None:
        super().log(type, _REDACT.sub(r"\1<redacted>", message), *(_REDACT.sub(r"\1<redacted>", str(a)) for a in args))
