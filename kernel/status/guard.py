"""Who may read and who may act on a status endpoint: bearer tokens, and the page's CSRF defence.

Reads (``GET``) follow the endpoint's rule: open on loopback without a token, else every
request but ``/healthz`` and ``/readyz`` carries ``Authorization: Bearer <token>``.

A state-changing request (``POST``, ``PUT``, ``DELETE``) changes a running pipeline, so it
needs more even on loopback: a browser on the same machine can be made to POST to
``127.0.0.1`` by any page it opens (cross-site request forgery), and a page whose host name
an attacker controls can be re-pointed at ``127.0.0.1`` (DNS rebinding). It is accepted when

* it carries the endpoint's *admin token* as ``Authorization: Bearer <token>`` (a browser never
  adds that header on its own: ``threes ctl``, curl, scripts), or
* it is a form post of the status page itself (the OWASP "synchronizer token" pattern with an
  origin check): the ``csrf`` field holds the page's token (random per server, served only
  in the page), the ``Origin`` header is the endpoint's own origin and the ``Host`` header is
  one of the endpoint's own names (a rebound name is refused).

Everything else gets ``401`` (no or a wrong token) or ``403`` (a cross-origin form). Tokens
are compared in constant time.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import parse_qs, urlsplit

from kernel.status.wire import Request

FORM_TYPE = "application/x-www-form-urlencoded"
UNGUARDED = frozenset({"/healthz", "/readyz"})
"""Paths every client may read: they reveal nothing but ``ok``."""


class Refused(Exception):  # an answer, not an error of the server
    """A request refused: ``code`` (401 or 403) and the reason, for the ``{"error": ...}`` body."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


class Guard:
    """The checks of one endpoint.

    Args:
        token: the bearer token of every read but the unguarded paths (``None``: reads are open, loopback only).
        admin_token: the bearer token of state-changing requests (``None``: the token, else a random one
            only the status page's forms can use).
        port: the bound port (the ``Host``/``Origin`` names must carry it).
        addr: the bound address (an allowed host name besides ``127.0.0.1``, ``localhost``, ``[::1]``).
    """

    def __init__(self, token: str | None, admin_token: str | None, port: int, addr: str):
        self.read = f"Bearer {token}".encode() if token else None
        admin = admin_token or token or secrets.token_urlsafe(32)
        self.admin = f"Bearer {admin}".encode()
        self.csrf = secrets.token_urlsafe(32)
        names = {"127.0.0.1", "localhost", "[::1]", addr if ":" not in addr else f"[{addr}]"}
        self.hosts = {f"{name}:{port}" for name in names}

    def check_read(self, request: Request) -> None:
        """Raise :class:`Refused` (401) when a guarded read lacks the token."""
        if self.read is None or request.path in UNGUARDED:
            return
        if not hmac.compare_digest(request.headers.get("authorization", "").encode("latin-1"), self.read):
            raise Refused(401, "missing or wrong bearer token")

    def check_write(self, request: Request) -> dict[str, list[str]]:
        """Check a state-changing request; returns its form fields (empty unless it is a form post).

        Raises:
            Refused: 401 without the admin token and without a form's CSRF token, 403 for a form that
                is cross-origin, rebound, or carries a wrong CSRF token.
        """
        authorization = request.headers.get("authorization", "")
        if authorization:
            if hmac.compare_digest(authorization.encode("latin-1"), self.admin):
                return {}
            raise Refused(401, "wrong bearer token")
        if not request.headers.get("content-type", "").startswith(FORM_TYPE):
            raise Refused(401, "a bearer token is required (Authorization: Bearer <token>)")
        if self.read is not None:
            raise Refused(401, "this endpoint needs a bearer token: its page's forms are for loopback only")
        host = request.headers.get("host", "")
        origin = urlsplit(request.headers.get("origin", ""))
        if host not in self.hosts or origin.scheme != "http" or origin.netloc != host:
            raise Refused(403, "cross-origin request refused")
        fields = parse_qs(request.body.decode("utf-8", errors="replace"))
        given = (fields.get("csrf") or [""])[0]
        if not hmac.compare_digest(given.encode(), self.csrf.encode()):
            raise Refused(403, "missing or wrong CSRF token: reload the page")
        return fields
