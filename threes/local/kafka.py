"""KRaft Kafka brokers (4.3.1) on 127.0.0.1: one by default (PLAINTEXT 19092, SASL_SSL 19094), or more.

``threes local up --brokers 3`` runs three nodes, each broker and controller
(:mod:`.kafka_cluster` holds the cluster's shape and ports); each node is one
:class:`Kafka` service with its own folder, ``server.properties``, log and PID record.

Jars come from Maven (``kafka-pom.xml``) into ``.threes/kafka/lib``; the
storage is formatted once (``.threes/kafka/.formatted`` marks a completed
format, so a half-formatted log dir is wiped and formatted again).

Two client listeners: ``PLAINTEXT://127.0.0.1:19092`` (tests, demo, inter-broker)
and ``SASL_SSL://127.0.0.1:19094`` with SCRAM-SHA-512 and a server certificate
for 127.0.0.1 / localhost signed by the stack's CA (:mod:`.tls`; clients trust
``.threes/tls/ca.pem`` and verify the host name). The SCRAM user
:data:`SASL_USERNAME` is upserted through the PLAINTEXT listener on every
``up`` (``AdminClient.alter_user_scram_credentials``, KIP-554), so an existing
data dir needs no re-format.
"""

from __future__ import annotations

import base64
import logging
import secrets
import shutil
import uuid
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .common import HOST, Layout, LocalStackError, wait_until
from .kafka_cluster import CONTROLLER_PORT, KAFKA_PORT, SASL_SSL_PORT, KafkaCluster
from .kafka_properties import SASL_MECHANISM, server_properties
from .maven import copy_dependencies
from .process import run
from .service import Service
from .system import find_java
from .tls import Certificates, ensure_certificates

if TYPE_CHECKING:
    from .endpoints import Endpoints

logger = logging.getLogger(__name__)

__all__ = ["CONTROLLER_PORT", "KAFKA_PORT", "SASL_SSL_PORT", "Kafka", "server_properties", "upsert_scram_user"]

SASL_USERNAME = "threes"
SASL_PASSWORD = "threes-scram-secret"  # the local stack's well-known test credential
SCRAM_ITERATIONS = 8192
JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64"
HEAP = ("-Xms256m", "-Xmx768m")
CLUSTER_HEAP = ("-Xms128m", "-Xmx512m")
"""Each node's heap when there are several (three JVMs on a laptop)."""


def _cluster_id() -> str:
    """Return a random Kafka cluster id: 16 bytes, URL-safe base64 without padding."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not value.startswith("-"):
            return value


class Kafka(Service):
    """Kafka broker + KRaft controller in one JVM (Java 17): node ``node`` of the local cluster.

    Args:
        layout: The project-local folder.
        node: The node's id, 1-based; node 1 is the service ``kafka``, node ``n`` ``kafka-n``.
        cluster: The cluster's shape; the recorded one (:meth:`KafkaCluster.load`) when None.
    """

    name = "kafka"
    title = "Kafka"
    env_var = "THREES_KAFKA_BOOTSTRAP"
    endpoint_vars: ClassVar[dict[str, str]] = {
        "kafka_bootstrap": "THREES_KAFKA_BOOTSTRAP",
        "kafka_sasl_bootstrap": "THREES_KAFKA_SASL_BOOTSTRAP",
        "kafka_sasl_username": "THREES_KAFKA_SASL_USERNAME",
        "kafka_sasl_password": "THREES_KAFKA_SASL_PASSWORD",
    }
    ports = (KAFKA_PORT, CONTROLLER_PORT, SASL_SSL_PORT)
    health_timeout = 90.0
    stop_timeout = 30.0

    def __init__(self, layout: Layout, node: int = 1, cluster: KafkaCluster | None = None) -> None:
        self.node = node
        self.cluster = cluster or KafkaCluster.load(layout)
        self.name = self.cluster.service_name(node)
        if node > 1:
            self.title = f"Kafka broker {node}"
        self.ports = (
            self.cluster.plaintext_port(node),
            self.cluster.controller_port(node),
            self.cluster.sasl_ssl_port(node),
        )
        super().__init__(layout)

    @property
    def lib(self) -> Path:
        """Folder of the broker's jars (node 2...: a link to node 1's, under its own folder for the marker)."""
        return self.dir / "lib"

    @property
    def data(self) -> Path:
        """KRaft metadata and log segments."""
        return self.dir / "data"

    @property
    def properties(self) -> Path:
        """The broker's ``server.properties``."""
        return self.dir / "server.properties"

    @property
    def keystore(self) -> Path:
        """PKCS#12 key store of the SASL_SSL listener (made from the stack's certificates)."""
        return self.dir / "keystore.p12"

    def _java(self) -> str:
        return str(find_java(17, prefer=(JAVA_17,)) / "bin" / "java")

    def _write_keystore(self, certs: Certificates) -> str:
        """Write :attr:`keystore` from the PEM files; return its password (random, kept in a 0600 file)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.serialization import pkcs12

        password_file = self.dir / "keystore.password"
        if not password_file.exists():
            password_file.touch(mode=0o600)
            password_file.write_text(secrets.token_urlsafe(24))
        password = password_file.read_text().strip()
        key = serialization.load_pem_private_key(certs.key.read_bytes(), password=None)
        blob = pkcs12.serialize_key_and_certificates(
            b"threes",
            key,  # type: ignore[arg-type]
            x509.load_pem_x509_certificate(certs.cert.read_bytes()),
            [x509.load_pem_x509_certificate(certs.ca.read_bytes())],
            serialization.BestAvailableEncryption(password.encode()),
        )
        self.keystore.touch(mode=0o600)
        self.keystore.write_bytes(blob)
        return password

    def install(self) -> None:
        """Resolve the broker's jars with Maven (skipped when present)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.node == 1:
            copy_dependencies(self.layout, "kafka-pom.xml", self.lib, log_name="kafka")
            return
        first = Kafka(self.layout, 1, self.cluster)
        first.install()
        if not self.lib.exists():
            self.lib.symlink_to(first.lib, target_is_directory=True)

    def prepare(self) -> None:
        """Write the configs and format the storage once.

        Raises:
            LocalStackError: If formatting fails.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        password = self._write_keystore(ensure_certificates(self.layout))
        # the file holds the key store's password: readable by us only
        self.properties.touch(mode=0o600)
        self.properties.chmod(0o600)
        self.properties.write_text(
            server_properties(self.data, self.keystore, password, node=self.node, cluster=self.cluster)
        )
        log4j = resources.files(__package__).joinpath("kafka-log4j2.xml").read_text()
        (self.dir / "log4j2.xml").write_text(log4j)
        formatted = self.dir / ".formatted"
        if formatted.exists() and (self.data / "meta.properties").exists():
            return
        logger.info("kafka: formatting KRaft storage in %s", self.data)
        shutil.rmtree(self.data, ignore_errors=True)
        formatted.unlink(missing_ok=True)
        id_file = self.layout.service_dir("kafka") / "cluster.id"  # one id for every node
        if not id_file.exists():
            id_file.write_text(_cluster_id())
        run(
            [
                self._java(),
                *self._jvm_flags(),
                "-cp",
                f"{self.lib}/*",
                "kafka.tools.StorageTool",
                "format",
                "-t",
                id_file.read_text().strip(),
                "-c",
                str(self.properties),
            ],
            what="format Kafka's KRaft storage",
            log=self.log,
            cwd=self.dir,
            timeout=120,
        )
        formatted.touch()

    def _jvm_flags(self) -> list[str]:
        return [
            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.xml'}",
            f"-Dthrees.log={self.log}",
            "-Djava.awt.headless=true",
        ]

    def command(self) -> tuple[list[str], dict[str, str], Path]:
        """Return the broker's command line (``kafka.Kafka server.properties``)."""
        cmd = [
            self._java(),
            *(HEAP if self.cluster.brokers == 1 else CLUSTER_HEAP),
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            *self._jvm_flags(),
            "-cp",
            f"{self.lib}/*",
            "kafka.Kafka",
            str(self.properties),
        ]
        return cmd, {}, self.dir

    def bootstrap(self) -> None:
        """Upsert the SCRAM-SHA-512 credential of :data:`SASL_USERNAME` once the broker answers.

        Goes through the PLAINTEXT listener (no authentication there), so it
        works on a data dir formatted before the SASL_SSL listener existed.

        Raises:
            LocalStackError: If the broker does not answer or refuses the credential, or
                runs with a configuration written before the SASL_SSL listener existed.
        """
        if self.properties.exists() and "SASL_SSL://" not in self.properties.read_text():
            raise LocalStackError(
                "the running Kafka was started without the SASL_SSL listener (by an older threes); restart it: "
                "threes local down --service kafka && threes local up --service kafka"
            )
        wait_until(
            lambda: upsert_scram_user(self.cluster.bootstrap(), SASL_USERNAME, SASL_PASSWORD),
            timeout=self.health_timeout,
            what=f"{self.title} (SCRAM user {SASL_USERNAME})",
            log=self.log,
        )

    def probe(self, endpoints: Endpoints) -> None:
        """Ask the broker for its metadata and its group coordinator (raises while either is not answering).

        When the stack's own broker is used, the SASL_SSL listener must answer
        too, with the SCRAM user and the stack's CA (host name verified).
        """
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {"bootstrap.servers": endpoints.kafka_bootstrap, "log_level": 0, "socket.connection.setup.timeout.ms": 3000}
        )
        metadata = admin.list_topics(timeout=5)
        if endpoints.kafka_bootstrap == self.cluster.bootstrap() and len(metadata.brokers) < self.cluster.brokers:
            raise LocalStackError(f"{len(metadata.brokers)} of {self.cluster.brokers} brokers registered")
        if endpoints.kafka_sasl_bootstrap and endpoints.tls_ca_location:
            secure = AdminClient(
                {
                    "bootstrap.servers": endpoints.kafka_sasl_bootstrap,
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": SASL_MECHANISM,
                    "sasl.username": endpoints.kafka_sasl_username,
                    "sasl.password": endpoints.kafka_sasl_password,
                    "ssl.ca.location": endpoints.tls_ca_location,
                    "log_level": 0,
                    "socket.connection.setup.timeout.ms": 3000,
                }
            )
            secure.list_topics(timeout=5)
        # A fresh broker answers metadata before its group coordinator has
        # loaded __consumer_offsets: until then group requests fail with
        # COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE. Ready means
        # the coordinator answers too (an unknown group is a fine answer).
        future = admin.describe_consumer_groups(["_threes_probe"], request_timeout=5)["_threes_probe"]
        try:
            future.result()
        except Exception as exc:
            if "GROUP_ID_NOT_FOUND" not in str(exc):
                raise

    def address(self, endpoints: Endpoints) -> str:
        """The bootstrap servers, and the SASL_SSL listener's when there is one (a node of several: its own)."""
        if self.cluster.brokers > 1 and endpoints.kafka_bootstrap == self.cluster.bootstrap():
            return (f"{HOST}:{self.cluster.plaintext_port(self.node)} "
                    f"(SASL_SSL {HOST}:{self.cluster.sasl_ssl_port(self.node)})")
        if endpoints.kafka_sasl_bootstrap:
            return f"{endpoints.kafka_bootstrap} (SASL_SSL {endpoints.kafka_sasl_bootstrap})"
        return endpoints.kafka_bootstrap


def upsert_scram_user(
    bootstrap: str,
    username: str,
    password: str,
    mechanism: str = SASL_MECHANISM,
    *,
    conf: dict[str, str] | None = None,
) -> None:
    """Create or replace a SCRAM credential on the broker (``alter_user_scram_credentials``, KIP-554).

    Args:
        bootstrap: ``host:port`` of a listener the caller may alter credentials through.
        username: The SASL user name.
        password: Its password (any characters; SCRAM stores only a salted hash).
        mechanism: ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``.
        conf: Extra librdkafka properties (security settings of that listener).

    Raises:
        LocalStackError: If the broker refuses the credential.
        confluent_kafka.KafkaException: While the broker is not answering yet.
    """
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "log_level": 0, "socket.connection.setup.timeout.ms": 3000, **(conf or {})}
    )
    kind = ScramMechanism.SCRAM_SHA_512 if mechanism == "SCRAM-SHA-512" else ScramMechanism.SCRAM_SHA_256
    upsert = UserScramCredentialUpsertion(username, ScramCredentialInfo(kind, SCRAM_ITERATIONS), password.encode())
    futures = admin.alter_user_scram_credentials([upsert], request_timeout=5)
    try:
        futures[username].result()
    except Exception as exc:
        if "UNSUPPORTED_SASL_MECHANISM" in str(exc) or "ILLEGAL_SASL_PROFILE" in str(exc):
            raise LocalStackError(f"Kafka refused the SCRAM credential of {username}: {exc}") from exc
        raise
