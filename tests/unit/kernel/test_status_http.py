"""Status and metrics endpoints: loopback by default, a bearer token off loopback, every string redacted.

Issue #40 item 6: the sync service's ``metrics_port`` and ``threes source run --metrics-port``
bound 0.0.0.0 without authentication, and a password in an S3 endpoint URL appeared in clear
in ``last_error`` on ``/status``, ``/status.json`` and ``threes status``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kernel.exceptions import ConfigError
from kernel.status.http import StatusServer
from threes.config import pipeline_from_dict

# a password in each kind of URL the config accepts, and a Kafka SASL password
PASSWORDS = {
    "sql_userinfo": "PgUserinfoPw-1111",
    "sql_query": "PgQueryPw-2222",
    "es": "EsUserinfoPw-3333",
    "s3": "S3EndpointSecret-4444",
    "sasl": "KafkaSaslPw-5555",
}


def secret_config() -> dict[str, Any]:
    p = PASSWORDS
    return {
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                  "sasl_username": "u", "sasl_password": p["sasl"]},
        "connections": {
            "pg": {"type": "rds", "url": f"postgresql+psycopg://threes:{p['sql_userinfo']}@127.0.0.1:1/db"},
            "pgq": {"type": "rds", "url": f"postgresql+psycopg://threes@127.0.0.1:1/db?password={p['sql_query']}"},
            "es": {"type": "elasticsearch", "hosts": [f"https://elastic:{p['es']}@127.0.0.1:1"]},
            "s3": {"type": "s3", "endpoint_url": f"http://minio:{p['s3']}@127.0.0.1:1", "access_key_id": "k",
                   "secret_access_key": "another-secret-key"},
        },
    }


def leaky_document() -> dict[str, Any]:
    """A status document whose error texts echo every URL (as drivers' errors do), the SASL password raw."""
    p = PASSWORDS
    return {"generated_at": "now", "sources": [{
        "connector": "planes", "task": "planes", "state": "failed", "position": None,
        "last_error": f"connection to postgresql+psycopg://threes:{p['sql_userinfo']}@127.0.0.1:1/db failed",
    }], "snapshots": [], "endpoints": [], "sync": [{
        "service": "s", "group": "g", "state": "restarting", "lag": 0, "paused": [], "dead_letters": 0,
        "restarts": 2, "partitions": [],
        "last_error": f'Could not connect to the endpoint URL: "http://minio:{p["s3"]}@127.0.0.1:1/bucket"',
        "sinks": [
            {"sink": "db", "state": "restarting", "restarts": 1, "dead_letters": 0,
             "last_error": f"cannot open postgresql+psycopg://threes@127.0.0.1:1/db?password={p['sql_query']}"},
            {"sink": "idx", "state": "restarting", "restarts": 1, "dead_letters": 0,
             "last_error": f"ConnectionError(https://elastic:{p['es']}@127.0.0.1:1) caused by refused"},
            {"sink": "k", "state": "restarting", "restarts": 1, "dead_letters": 0,
             "last_error": f"SASL authentication with {p['sasl']} failed"},
        ],
    }]}


def get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:  # loopback
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def assert_no_password(text: str) -> None:
    leaked = [kind for kind, pw in PASSWORDS.items() if pw in text]
    assert not leaked, f"passwords in clear: {leaked}\n{text[:2000]}"


def test_every_server_binds_loopback_by_default() -> None:
    from stream_app import metrics as stream_metrics
    from sync_service.metrics import SyncMetrics

    servers = [StatusServer(lambda: {})]
    servers[0].serve(0)
    servers.append(SyncMetrics("loopback-test").serve(0))
    servers.append(stream_metrics.serve(0))
    try:
        assert [s.address[0] for s in servers] == ["127.0.0.1"] * 3
    finally:
        for s in servers:
            s.close()


def test_config_defaults_to_loopback_and_refuses_another_address_without_a_token() -> None:
    from sync_service.config import SyncServiceBase

    base = {"name": "s", "dead_letter_topic": "dlq"}
    assert SyncServiceBase(**base).metrics_host == "127.0.0.1"
    with pytest.raises(ValueError, match="metrics_host '0.0.0.0' is not a loopback address: set metrics_token"):
        SyncServiceBase(**base, metrics_host="0.0.0.0")
    assert SyncServiceBase(**base, metrics_host="0.0.0.0", metrics_token="t0ken-t0ken").metrics_token
    with pytest.raises(ConfigError, match="would bind 0.0.0.0 without authentication"):
        StatusServer(lambda: {}).serve(0, "0.0.0.0")


def test_a_token_is_required_on_every_endpoint_but_healthz() -> None:
    server = StatusServer(lambda: {"sync": []})
    port = server.serve(0, "127.0.0.1", token="s3cret-t0ken")
    base = f"http://127.0.0.1:{port}"
    try:
        for path in ("/metrics", "/status", "/status.json"):
            assert get(base + path)[0] == 401
            assert get(base + path, "wrong-token")[0] == 401
            assert get(base + path, "s3cret-t0ken")[0] == 200
        assert get(base + "/healthz")[0] == 200  # probes carry no secret and reveal nothing
    finally:
        server.close()


def test_status_page_and_json_mask_a_password_in_every_kind_of_url() -> None:
    pipeline_from_dict(secret_config())  # registers the config's secrets, as loading a YAML does
    server = StatusServer(leaky_document)
    port = server.serve(0)
    try:
        code, body = get(f"http://127.0.0.1:{port}/status.json")
        assert code == 200
        assert_no_password(body)
        assert json.loads(body)["sync"][0]["sinks"][0]["last_error"].startswith("cannot open postgresql+psycopg")
        code, html = get(f"http://127.0.0.1:{port}/status")
        assert code == 200 and "minio" in html
        assert_no_password(html)
    finally:
        server.close()


def test_threes_status_table_and_json_mask_a_password_in_every_kind_of_url(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from threes.cli import app
    from threes.status_gather import Gatherer

    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(secret_config()))
    monkeypatch.setattr(Gatherer, "gather", lambda self: leaky_document())  # no Kafka: only the printing
    from threes import console

    # the shared console's width is fixed when it is first measured (another test's terminal may be
    # narrow): a wide one here, so the table does not truncate the cells the test reads
    monkeypatch.setattr(console.out, "_width", 400)
    runner = CliRunner()
    for args in (["status", str(config), "--json"], ["status", str(config)]):
        done = runner.invoke(app, args, env={"COLUMNS": "400"})
        assert done.exit_code == 0, done.output
        assert "minio" in done.output and "restarting" in done.output
        assert_no_password(done.output)


def test_one_connection_serves_pipelined_requests_in_order_and_refuses_a_body() -> None:
    import socket
    import threading

    release = threading.Event()

    def slow_status() -> dict[str, Any]:  # a status that gathers from a slow system
        release.wait(10)
        return {"sync": []}

    server = StatusServer(slow_status)
    server.add_route("/echo", lambda path, query: (200, {"path": path}),
                     fast=lambda path, query: (200, {"fast": path}) if "fast" in path else None)
    port = server.serve(0)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            # three requests in one write (HTTP/1.1 pipelining): answered in order on the same connection
            sock.sendall(b"GET /echo/fast HTTP/1.1\r\nHost: x\r\n\r\nGET /echo/slow HTTP/1.1\r\nHost: x\r\n\r\n"
                         b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            seen = b""
            while seen.count(b"HTTP/1.1 200") < 3:
                chunk = sock.recv(65536)
                assert chunk, seen
                seen += chunk
            assert seen.index(b'{"fast":"/echo/fast"}') < seen.index(b'{"path":"/echo/slow"}') < seen.index(b"ok\n")
            # a second connection is answered while the first one's /status waits on the slow gatherer
            sock.sendall(b"GET /status.json HTTP/1.1\r\nHost: x\r\n\r\n")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as other:
                other.sendall(b"GET /echo/fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = b"".join(iter(lambda: other.recv(65536), b""))
                assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer
            release.set()
            status = b""
            while b'"sync"' not in status:
                status += sock.recv(65536)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"DELETE /echo/fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
            assert answer.startswith(b"HTTP/1.1 405")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /echo/fast HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
            assert answer.startswith(b"HTTP/1.1 400") and b"/echo" not in answer
    finally:
        release.set()
        server.close()


@pytest.mark.parametrize("pieces", [1, 40])
def test_a_request_head_over_64_kib_is_refused_however_it_arrives(pieces: int) -> None:
    import socket

    server = StatusServer(lambda: {"sync": []})
    port = server.serve(0)
    try:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Filler: " + b"a" * (70 * 1024) + b"\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            size = -(-len(head) // pieces)
            try:
                for i in range(0, len(head), size):
                    sock.sendall(head[i:i + size])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered and closed before the rest arrived
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.1 413"), answer[:80]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # a head under the limit is served
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Filler: " + b"a" * 1000
                         + b"\r\n\r\n")
            assert b"".join(iter(lambda: sock.recv(65536), b"")).startswith(b"HTTP/1.1 200")
    finally:
        server.close()
