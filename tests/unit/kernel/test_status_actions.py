"""State-changing routes of the status server: who may act, and how refusals look (a real server, real sockets).

The guard of :mod:`kernel.status.guard`: the admin bearer token, or the page's own form (CSRF
token, same origin, own host name); everything else is refused with ``{"error": ...}`` and
the action never runs. ``/healthz`` and ``/readyz`` answer without the token and say ``ok``
only; ``/metrics`` and ``/status`` refuse a request without it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kernel.status.http import StatusServer

TOKEN = "s3cret-admin-token"


class Server:
    def __init__(self, token: str | None, admin: str | None, ready: bool = True):
        self.calls: list[tuple[str, str, bytes]] = []
        self.server = StatusServer(
            lambda: {"sync": []}, ready=lambda: ready, page=lambda _doc, csrf: f'<input name="csrf" value="{csrf}">'
        )
        self.server.add_action("/parts", self.act)
        self.port = self.server.serve(0, "127.0.0.1", token, admin)

    def act(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        self.calls.append((method, path, body))
        return 202, {"done": path}

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        head = {"Host": f"127.0.0.1:{self.port}", "Connection": "close", **(headers or {})}
        if body or method != "GET":
            head["Content-Length"] = str(len(body))
        raw = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n"
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            sock.sendall(raw.encode() + body)
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        top, _, rest = answer.partition(b"\r\n\r\n")
        lines = top.decode().split("\r\n")
        fields = dict(line.split(": ", 1) for line in lines[1:])
        return int(lines[0].split()[1]), {k.lower(): v for k, v in fields.items()}, rest


@pytest.fixture
def loopback() -> Iterator[Server]:
    server = Server(None, TOKEN)
    yield server
    server.server.close()


def _form(
    server: Server, origin: str | None = None, host: str | None = None, csrf: str | None = None
) -> tuple[int, dict[str, str], bytes]:
    token = csrf if csrf is not None else server.server.guard.csrf  # type: ignore[union-attr]
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Origin": origin or f"http://127.0.0.1:{server.port}",
    }
    if host is not None:
        headers["Host"] = host
    return server.request("POST", "/parts/sync/pause", headers, f"csrf={token}".encode())


def test_an_action_needs_the_admin_token_and_a_refusal_is_json(loopback: Server) -> None:
    code, _, body = loopback.request("POST", "/parts/sync/pause")
    assert code == 401 and json.loads(body) == {"error": "a bearer token is required (Authorization: Bearer <token>)"}
    code, _, body = loopback.request("POST", "/parts/sync/pause", {"Authorization": "Bearer wrong"})
    assert code == 401 and json.loads(body) == {"error": "wrong bearer token"}
    assert loopback.calls == []
    code, _, body = loopback.request("POST", "/parts/sync/pause", {"Authorization": f"Bearer {TOKEN}"})
    assert code == 202 and json.loads(body) == {"done": "/parts/sync/pause"}
    code, _, body = loopback.request("PUT", "/parts/sync", {"Authorization": f"Bearer {TOKEN}"}, b"kafka: {}\n")
    assert code == 202 and loopback.calls[-1] == ("PUT", "/parts/sync", b"kafka: {}\n")
    code, _, body = loopback.request("POST", "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert code == 405 and json.loads(body)["error"] == "read-only: GET only"


def test_the_pages_form_is_accepted_from_its_own_origin_only(loopback: Server) -> None:
    code, headers, _ = _form(loopback)
    assert code == 303 and headers["location"] == "/status" and len(loopback.calls) == 1
    for origin, host, csrf, reason in [
        ("http://evil.example", None, None, "cross-origin request refused"),
        ("null", None, None, "cross-origin request refused"),  # a sandboxed frame, a file:// page
        (f"http://localhost:{loopback.port}", None, None, "cross-origin request refused"),  # another origin
        # DNS rebinding: a name the attacker controls pointed at 127.0.0.1 (Origin and Host agree)
        (
            f"http://rebound.example:{loopback.port}",
            f"rebound.example:{loopback.port}",
            None,
            "cross-origin request refused",
        ),
        (None, None, "guess", "missing or wrong CSRF token: reload the page"),
        (None, None, "", "missing or wrong CSRF token: reload the page"),
    ]:
        code, _, body = _form(loopback, origin, host, csrf)
        assert (code, json.loads(body)) == (403, {"error": reason}), (origin, host, csrf)
    assert len(loopback.calls) == 1


def test_the_page_carries_its_csrf_token(loopback: Server) -> None:
    code, _, body = loopback.request("GET", "/status")
    assert code == 200 and loopback.server.guard.csrf.encode() in body  # type: ignore[union-attr]


def test_probes_skip_the_token_and_reveal_nothing_while_the_rest_needs_it() -> None:
    for ready, expected in [(True, (200, b"ok\n")), (False, (503, b"no\n"))]:
        server = Server("read-token", None, ready=ready)
        try:
            assert server.request("GET", "/healthz")[0::2] == (200, b"ok\n")
            assert server.request("GET", "/readyz")[0::2] == expected
            for path in ("/metrics", "/status", "/status.json", "/parts"):
                code, headers, body = server.request("GET", path)
                assert code == 401 and headers["www-authenticate"] == 'Bearer realm="threes"', path
                assert json.loads(body) == {"error": "missing or wrong bearer token"}
            assert server.request("GET", "/metrics", {"Authorization": "Bearer read-token"})[0] == 200
            # with a read token the page's forms are off: only the bearer token acts
            code, _, body = _form(server)
            assert code == 401 and server.calls == []
            assert server.request("POST", "/parts/x/pause", {"Authorization": "Bearer read-token"})[0] == 202
        finally:
            server.server.close()


def test_a_body_over_1_mib_is_refused_from_its_head(loopback: Server) -> None:
    with socket.create_connection(("127.0.0.1", loopback.port), timeout=10) as sock:
        sock.sendall(
            f"PUT /parts/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Length: {1024 * 1024 + 1}\r\n\r\n".encode()
        )  # refused before the body comes
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 413") and loopback.calls == []
    code, _, _ = loopback.request("PUT", "/parts/x", {"Authorization": f"Bearer {TOKEN}"}, b"a" * (1024 * 1024))
    assert code == 202 and len(loopback.calls[-1][2]) == 1024 * 1024  # 1 MiB is served, whatever the reads


def test_200_concurrent_actions_are_each_answered(loopback: Server) -> None:
    def one(i: int) -> int:
        return loopback.request("POST", f"/parts/p{i}/restart", {"Authorization": f"Bearer {TOKEN}"})[0]

    with ThreadPoolExecutor(40) as pool:
        codes = list(pool.map(one, range(200)))
    assert codes == [202] * 200
    assert sorted(path for _, path, _ in loopback.calls) == sorted(f"/parts/p{i}/restart" for i in range(200))
