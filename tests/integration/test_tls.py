"""TLS and SASL for real: the local broker's SASL_SSL (SCRAM-SHA-512) listener and PostgreSQL's ``ssl = on``.

Certificate verification stays on everywhere: the clients trust the stack's CA
(``.threes/tls/ca.pem``) and check the host name. A test user is created with
a password holding a ``"``, a ``\\`` and a ``'``: the librdkafka clients (source,
sync service) and Spark's Java client (JAAS string) must all log in with it.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from connectors.rds.connection import RdsConnection, sql_engine
from kernel.config.models import KafkaConfig
from kernel.exceptions import SetupError
from kernel.kafka.topics import cluster_metadata
from sync_service.service import SyncService
from tests.integration.stream.conftest import Env, flight
from tests.integration.sync.helpers import run_in_thread, wait_until
from threes.cli import app
from threes.config import pipeline_from_dict
from threes.local.kafka import upsert_scram_user
from threes.testing.source import run_once

PASSWORD = "p\"w\\d'x ü"  # a double quote, a backslash, a single quote, a space, non-ASCII


@pytest.fixture(scope="module")
def scram_user(endpoints: Any) -> str:
    """A SCRAM-SHA-512 user of this module with :data:`PASSWORD`, created through the PLAINTEXT listener."""
    assert endpoints.kafka_sasl_bootstrap, "the stack's broker has a SASL_SSL listener"
    user = f"tls-{uuid.uuid4().hex[:8]}"
    upsert_scram_user(endpoints.kafka_bootstrap, user, PASSWORD)
    return user


def secure_dict(endpoints: Any, user: str, password: str = PASSWORD, ca: str | None = None) -> dict[str, Any]:
    return {
        "bootstrap_servers": endpoints.kafka_sasl_bootstrap,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": user,
        "sasl_password": password,
        "ssl_ca_location": ca or endpoints.tls_ca_location,
        "request_timeout_s": 30,
    }


@pytest.fixture
def secure_kafka(endpoints: Any, scram_user: str) -> KafkaConfig:
    return KafkaConfig.model_validate(secure_dict(endpoints, scram_user))


@pytest.mark.spark
def test_source_stream_job_and_sync_service_over_sasl_ssl(
    spark: Any, pg_engine: Any, pg: RdsConnection, endpoints: Any, secure_kafka: KafkaConfig, scram_user: str,
    unique: str, tmp_path: Path,
) -> None:
    schema = f"tls_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE SCHEMA {schema}"))
        c.execute(text(
            f"CREATE TABLE {schema}.airports (faa text PRIMARY KEY, name text NOT NULL, lat double precision NOT NULL, "
            "lon double precision NOT NULL, alt integer NOT NULL, tz integer, dst text, tzone text)"
        ))
        c.execute(text(
            f"INSERT INTO {schema}.airports VALUES ('EWR', 'Newark over TLS', 40.69, -74.17, 18, -5, 'A', NULL), "
            "('LAX', 'Los Angeles Intl', 33.94, -118.41, 125, -8, 'A', NULL)"
        ))
    env = Env(secure_kafka, secure_kafka.librdkafka_config(), unique, tmp_path)  # its topics made over SASL_SSL
    # PostgreSQL over TLS too, its certificate verified against the stack's CA (host name included)
    url = f"{pg.url}?sslmode=verify-full&sslrootcert={endpoints.tls_ca_location}"
    connections = {"pg": {"type": "rds", "url": url, "password": pg.password.get_secret_value()}}
    kafka = secure_dict(endpoints, scram_user)

    # source: PostgreSQL -> the compacted state topic, through the SASL_SSL listener
    sources = pipeline_from_dict({"kafka": kafka, "connections": connections, "sources": [
        {"name": f"tls-{unique}", "type": "rds_source", "connection": "pg", "topic": env.airports,
         "table": "airports", "schema_name": schema},
    ]})
    (stats,) = run_once(sources).values()
    assert stats.state == "caught_up", stats.error

    # stream job: Spark's Java Kafka client reads and writes over SASL_SSL with the escaped JAAS string
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "LAX", "EWR")])
    config = env.config(updates=[{"topic": env.updates, "kind": "projection", "key": ["flight_id"],
                                  "fields": ["flight_id", "origin", "origin_name"]}])
    job = env.start(spark, config, available_now=True)
    try:
        assert job.await_termination(180)
    finally:
        env.close()
    assert job.readiness["airports"]["keys"] == 2

    # sync service: the update topic -> a PostgreSQL table, consumer group over SASL_SSL
    sync = pipeline_from_dict({"kafka": kafka, "connections": connections, "sync": [
        {"name": f"tls-{unique}", "dead_letter_topic": f"tls.dlq.{unique}", "sinks": [
            {"name": "flights", "type": "rds_sink", "connection": "pg", "topics": [env.updates],
             "table": "flights", "schema_name": schema, "key": ["flight_id"], "create_table": True},
        ]},
    ]})
    service = SyncService(sync.kafka, sync.sync[0], dict(sync.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        def rows() -> list[Any]:
            with pg_engine.connect() as c:
                try:
                    return list(c.execute(text(f"SELECT flight_id, origin_name FROM {schema}.flights ORDER BY 1")))
                except Exception:  # the sink creates the table on its first batch
                    return []

        got = wait_until(lambda: len(rows()) == 2 and rows(), 120, "both flights in PostgreSQL")
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert [tuple(r) for r in got] == [(1, "Newark over TLS"), (2, "Los Angeles Intl")]


def check_yaml(tmp_path: Path, kafka: dict[str, Any]) -> Path:
    lines = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in kafka.items())  # JSON strings are YAML
    path = tmp_path / "secure.yaml"
    path.write_text(f"kafka:\n{lines}\nconnections: {{}}\nsources: []\n")
    return path


def test_check_passes_over_sasl_ssl(tmp_path: Path, endpoints: Any, scram_user: str) -> None:
    kafka = secure_dict(endpoints, scram_user, password="${env:THREES_TEST_SCRAM_PASSWORD}")
    result = CliRunner().invoke(
        app, ["check", str(check_yaml(tmp_path, kafka))], env={"THREES_TEST_SCRAM_PASSWORD": PASSWORD, "COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "broker(s)" in result.output and PASSWORD not in result.output


def test_a_wrong_password_fails_at_once_in_one_line(tmp_path: Path, endpoints: Any, scram_user: str) -> None:
    kafka = secure_dict(endpoints, scram_user, password="not-the-password")
    kafka["request_timeout_s"] = 120  # a timeout would take two minutes: the refusal itself must end the check
    result = CliRunner().invoke(app, ["check", str(check_yaml(tmp_path, kafka))], env={"COLUMNS": "400"})
    assert result.exit_code == 1
    failed = [line for line in result.output.splitlines() if "FAILED" in line]
    assert len(failed) == 1, result.output  # one problem, said once
    assert f"refused the login of user '{scram_user}' (SCRAM-SHA-512)" in failed[0]
    assert "did not answer" not in result.output and "not-the-password" not in result.output
    assert "Traceback" not in result.output


def test_the_stream_job_refuses_a_wrong_password_before_starting_spark(
    tmp_path: Path, endpoints: Any, scram_user: str
) -> None:
    kafka = secure_dict(endpoints, scram_user, password="${env:THREES_TEST_SCRAM_PASSWORD}")
    kafka["request_timeout_s"] = 120
    config = tmp_path / "stream.yaml"
    (tmp_path / "event.avsc").write_text('{"type": "record", "name": "E", "fields": [{"name": "id", "type": "long"}]}')
    config.write_text(check_yaml(tmp_path, kafka).read_text().replace("sources: []\n", "") + textwrap.dedent("""\
        stream:
          name: tls-wrong-password
          events: {topic: tls.events, value_schema: event.avsc}
          enriched_topic: tls.enriched
          dead_letter_topic: tls.dlq
          checkpoint_location: checkpoint
        """))
    threes = Path(sys.executable).parent / "threes"
    done = subprocess.run(
        [str(threes), "stream", "run", str(config)], capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "THREES_TEST_SCRAM_PASSWORD": "wrong\"pass\\", "COLUMNS": "200"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = (done.stdout + done.stderr).strip().splitlines()
    assert len(out) == 1, out  # one line: no Spark start-up, no librdkafka log lines, no traceback
    assert f"refused the login of user '{scram_user}'" in out[0] and "wrong" not in out[0]


@pytest.mark.parametrize("command", [["source", "run"], ["sync", "run"]])
def test_long_running_commands_refuse_a_wrong_password_at_start_up_in_one_line(
    tmp_path: Path, endpoints: Any, pg: RdsConnection, scram_user: str, command: list[str]
) -> None:
    kafka = secure_dict(endpoints, scram_user, password="${env:THREES_TEST_SCRAM_PASSWORD}")
    kafka["request_timeout_s"] = 120
    config = tmp_path / "pipeline.yaml"
    config.write_text(check_yaml(tmp_path, kafka).read_text().replace("connections: {}\nsources: []\n", "") + textwrap.dedent(f"""\
        connections:
          pg: {{type: rds, url: "{pg.url}"}}
        sources:
          - {{name: tls-x, type: rds_source, connection: pg, topic: tls.refused.x, table: nosuch}}
        sync:
          - name: tls-refused
            dead_letter_topic: tls.refused.dlq
            sinks:
              - {{name: t, type: rds_sink, connection: pg, topics: [tls.refused.u], table: t, key: [id]}}
        """))
    threes = Path(sys.executable).parent / "threes"
    done = subprocess.run(
        [str(threes), *command, str(config)], capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "THREES_TEST_SCRAM_PASSWORD": "wrong", "COLUMNS": "300"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = (done.stdout + done.stderr).strip().splitlines()
    # one line: no librdkafka FAIL lines, no supervisor restarts, no traceback
    assert len(out) == 1 and f"refused the login of user '{scram_user}'" in out[0], out


def test_a_broker_that_is_down_is_not_a_refusal() -> None:
    """Start-up tolerates a broker that does not answer yet (the runtime retries it)."""
    from kernel.kafka.topics import check_credentials

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert check_credentials({"bootstrap.servers": f"127.0.0.1:{port}"}, 1.0) is False


@pytest.fixture
def other_name_server(stack: Any, tmp_path: Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 whose certificate is signed by the stack's CA but issued for another name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from threes.local.tls import issue, private_pem, tls_dir

    folder = tls_dir(stack.layout)
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = issue(ca, ca_key, key, ["kafka.other.example"])
    tmp = tmp_path
    (tmp / "other.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "other.key").write_bytes(private_pem(key))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "other.pem", tmp / "other.key")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    done.set()
    thread.join(5)
    server.close()


def test_a_certificate_for_another_name_is_refused(endpoints: Any, scram_user: str, other_name_server: int) -> None:
    kafka = KafkaConfig.model_validate(
        {**secure_dict(endpoints, scram_user), "bootstrap_servers": f"127.0.0.1:{other_name_server}"}
    )
    with pytest.raises(SetupError) as caught:
        cluster_metadata(kafka.librdkafka_config(), 120)
    message = str(caught.value)
    assert "\n" not in message
    assert "certificate is not valid for '127.0.0.1'" in message, message
    assert PASSWORD not in message


def test_spark_options_keep_verification_on(endpoints: Any, secure_kafka: KafkaConfig) -> None:
    from stream_app.spark_kafka_options import spark_kafka_options

    options = spark_kafka_options(secure_kafka)
    assert options["kafka.ssl.endpoint.identification.algorithm"] == "https"
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.ssl.truststore.location"] == endpoints.tls_ca_location


# -- PostgreSQL ------------------------------------------------------------------------------------------


def test_postgres_over_tls_with_verify_full(endpoints: Any, pg: RdsConnection) -> None:
    url = f"{pg.url}?sslmode=verify-full&sslrootcert={endpoints.tls_ca_location}"
    engine = sql_engine(RdsConnection(type="rds", url=url, password=pg.password))
    try:
        with engine.connect() as c:
            row = c.execute(text("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).one()
    finally:
        engine.dispose()
    assert row[0] is True and row[1].startswith("TLSv1.")


def test_postgres_refuses_a_certificate_it_cannot_verify(endpoints: Any, pg: RdsConnection, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from threes.local.tls import make_ca

    other_ca = tmp_path / "other-ca.pem"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    other_ca.write_bytes(make_ca(key, "not the stack's CA").public_bytes(serialization.Encoding.PEM))
    password = pg.password.get_secret_value()
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(
            f"host=127.0.0.1 port=15432 dbname=threes user=threes password={password} "
            f"sslmode=verify-full sslrootcert={other_ca} connect_timeout=5"
        )
