"""Whether a status or metrics endpoint may bind an address: a non-loopback one needs a bearer token."""

from __future__ import annotations

import ipaddress
from typing import Any


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` (an IP address or ``localhost``) only accepts connections from this host."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def metrics_endpoint_problem(host: str, token: Any) -> str | None:
    """Why a ``metrics_host`` / ``metrics_token`` pair is refused, ``None`` when it is fine.

    Every status and metrics endpoint binds ``127.0.0.1`` by default; another address
    serves topics, positions and error texts to the network, so it needs a bearer token.
    """
    if not is_loopback(host) and (token is None or not token.get_secret_value()):
        return (f"metrics_host {host!r} is not a loopback address: set metrics_token "
                "(e.g. ${env:THREES_METRICS_TOKEN}); clients then send 'Authorization: Bearer <token>'")
    return None
