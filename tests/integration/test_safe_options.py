"""Every dangerous option is refused by ``threes validate``, naming the key and why, and nothing is contacted.

Each case points every system of the pipeline at one loopback listener this test
opens; after ``threes validate`` exits with its error, the listener has accepted
no connection (the check runs on the config alone).
"""

from __future__ import annotations

import copy
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from threes.cli import app


def _base() -> dict[str, Any]:
    """A valid pipeline naming every kind of system (the addresses are replaced by the listener's)."""
    return {
        "version": 1,
        "kafka": {"bootstrap_servers": "127.0.0.1:19092"},
        "connections": {
            "postgres": {"type": "rds", "url": "postgresql+psycopg://threes@127.0.0.1:15432/threes",
                         "password": "threes"},
            "elasticsearch": {"type": "elasticsearch", "hosts": ["http://127.0.0.1:19200"]},
            "s3": {"type": "s3", "endpoint_url": "http://127.0.0.1:18090", "access_key_id": "threes",
                   "secret_access_key": "threes-secret-key", "path_style": True},
        },
        "sources": [{"name": "customers", "type": "rds_source", "connection": "postgres",
                     "topic": "state.customers", "table": "customers"}],
        "stream": {"events": {"topic": "orders", "value_schema": "event.avsc"}, "enriched_topic": "orders.enriched",
                   "dead_letter_topic": "orders.dlq", "checkpoint_location": "/tmp/threes-safe-options-cp"},
    }


def _kafka(**client_config: Any) -> Any:
    def apply(doc: dict[str, Any]) -> None:
        doc["kafka"]["client_config"] = client_config

    return apply


def _pg_url(query: str) -> Any:
    def apply(doc: dict[str, Any]) -> None:
        doc["connections"]["postgres"]["url"] += f"?{query}"

    return apply


def _mysql_url(query: str) -> Any:
    def apply(doc: dict[str, Any]) -> None:
        url = doc["connections"]["postgres"]["url"].replace("postgresql+psycopg", "mysql+pymysql")
        doc["connections"]["postgres"]["url"] = f"{url}?{query}"

    return apply


def _pg_password(value: str) -> Any:
    def apply(doc: dict[str, Any]) -> None:
        doc["connections"]["postgres"]["password"] = value

    return apply


def _downgrade(doc: dict[str, Any]) -> None:
    doc["kafka"].update(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="u",
                        sasl_password="p", client_config={"security.protocol": "PLAINTEXT"})


def _es_unverified(doc: dict[str, Any]) -> None:
    doc["connections"]["elasticsearch"]["verify_certs"] = False


def _java_options(doc: dict[str, Any]) -> None:
    doc["stream"].setdefault("spark", {})["conf"] = {
        "spark.driver.extraJavaOptions": "-javaagent:/tmp/agent.jar -XX:+UseG1GC"
    }


# (case, change to the example pipeline, the key the error must name, a word of the reason)
CASES = [
    ("plugin.library.paths", _kafka(**{"plugin.library.paths": "/tmp/evil.so"}), "plugin.library.paths", "code"),
    ("kinit.cmd", _kafka(**{"sasl.kerberos.kinit.cmd": "touch /tmp/pwned"}), "sasl.kerberos.kinit.cmd", "command"),
    ("ssl.engine.location", _kafka(**{"ssl.engine.location": "/tmp/engine.so"}), "ssl.engine.location", "code"),
    ("no host name check", _kafka(**{"ssl.endpoint.identification.algorithm": "none"}),
     "ssl.endpoint.identification.algorithm", "verification"),
    ("SASL_SSL downgraded", _downgrade, "security.protocol", "downgrade"),
    ("bootstrap override", _kafka(**{"bootstrap.servers": "evil:9092"}), "bootstrap.servers", "typed"),
    ("debug all", _kafka(debug="all"), "debug", "secrets"),
    ("pg passfile", _pg_url("passfile=/tmp/pgpass"), "passfile", "password file"),
    ("pg sslkey", _pg_url("sslkey=/tmp/key.pem"), "sslkey", "private key"),
    ("pg options", _pg_url("options=-c%20search_path%3Devil"), "options", "server parameters"),
    ("mysql local_infile", _mysql_url("local_infile=1"), "local_infile", "file"),
    ("mysql read_default_file", _mysql_url("read_default_file=/etc/mysql/my.cnf"), "read_default_file", "file"),
    ("file absolute", _pg_password("${file:/etc/shadow}"), "/etc/shadow", "outside"),
    ("file climbing", _pg_password("${file:../../../etc/shadow}"), "../../../etc/shadow", "outside"),
    ("es verify_certs false", _es_unverified, "verify_certs", "accept_unverified_certificates"),
    ("spark extraJavaOptions", _java_options, "spark.driver.extraJavaOptions", "-javaagent"),
]


@pytest.fixture
def listener() -> Any:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


def _point_everything_at(doc: dict[str, Any], port: int) -> None:
    doc["kafka"]["bootstrap_servers"] = f"127.0.0.1:{port}"
    doc["connections"]["postgres"]["url"] = f"postgresql+psycopg://threes@127.0.0.1:{port}/threes"
    doc["connections"]["elasticsearch"]["hosts"] = [f"https://127.0.0.1:{port}"]
    doc["connections"]["s3"]["endpoint_url"] = f"http://127.0.0.1:{port}"


def test_every_dangerous_option_is_refused_without_a_connection(tmp_path: Path, listener: Any) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "event.avsc").write_text(
        '{"type": "record", "name": "E", "fields": [{"name": "id", "type": "long"}]}'
    )
    base = _base()
    port = listener.getsockname()[1]
    _point_everything_at(base, port)
    runner = CliRunner()
    ok = tmp_path / "cfg" / "ok.yaml"
    ok.write_text(yaml.safe_dump(base))
    assert runner.invoke(app, ["validate", str(ok)]).exit_code == 0
    for name, change, key, why in CASES:
        doc = copy.deepcopy(base)
        change(doc)
        path = tmp_path / "cfg" / f"{name.replace(' ', '_')}.yaml"
        path.write_text(yaml.safe_dump(doc))
        done = runner.invoke(app, ["validate", str(path)])
        output = done.output
        assert done.exit_code == 1, (name, output)
        assert key in output and why in output, (name, output)
        assert "Traceback" not in output, (name, output)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected: validation is offline
