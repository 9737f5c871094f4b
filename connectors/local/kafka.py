"""A single-node KRaft Kafka broker (4.3.1) on 127.0.0.1:19092.

Jars come from Maven (``kafka-pom.xml``) into ``.threes/kafka/lib``; the
storage is formatted once (``.threes/kafka/.formatted`` marks a completed
format, so a half-formatted log dir is wiped and formatted again).
"""

from __future__ import annotations

import base64
import logging
import shutil
import uuid
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from .common import HOST
from .maven import copy_dependencies
from .process import run
from .service import Service
from .system import find_java

if TYPE_CHECKING:
    from .stack import Endpoints

logger = logging.getLogger(__name__)

KAFKA_PORT = 19092
CONTROLLER_PORT = 19093
JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64"
HEAP = ("-Xms256m", "-Xmx768m")


def _cluster_id() -> str:
    """Return a random Kafka cluster id: 16 bytes, URL-safe base64 without padding."""
    while True:
        value = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not value.startswith("-"):
            return value


def server_properties(data_dir: Path) -> str:
    """Return ``server.properties`` for one combined broker+controller node.

    Args:
        data_dir: Absolute folder for the log segments and KRaft metadata.
    """
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{CONTROLLER_PORT}",
        "listeners": f"PLAINTEXT://{HOST}:{KAFKA_PORT},CONTROLLER://{HOST}:{CONTROLLER_PORT}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{KAFKA_PORT}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    lines = ["# Written by connectors.local.kafka; regenerated on every start."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


class Kafka(Service):
    """Kafka broker + KRaft controller in one JVM (Java 17)."""

    name = "kafka"
    title = "Kafka"
    env_var = "THREES_KAFKA_BOOTSTRAP"
    ports = (KAFKA_PORT, CONTROLLER_PORT)
    health_timeout = 90.0
    stop_timeout = 30.0

    @property
    def lib(self) -> Path:
        """Folder of the broker's jars."""
        return self.dir / "lib"

    @property
    def data(self) -> Path:
        """KRaft metadata and log segments."""
        return self.dir / "data"

    @property
    def properties(self) -> Path:
        """The broker's ``server.properties``."""
        return self.dir / "server.properties"

    def _java(self) -> str:
        return str(find_java(17, prefer=(JAVA_17,)) / "bin" / "java")

    def install(self) -> None:
        """Resolve the broker's jars with Maven (skipped when present)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        copy_dependencies(self.layout, "kafka-pom.xml", self.lib, log_name="kafka")

    def prepare(self) -> None:
        """Write the configs and format the storage once.

        Raises:
            LocalStackError: If formatting fails.
        """
        self.properties.write_text(server_properties(self.data))
        log4j = resources.files(__package__).joinpath("kafka-log4j2.xml").read_text()
        (self.dir / "log4j2.xml").write_text(log4j)
        formatted = self.dir / ".formatted"
        if formatted.exists() and (self.data / "meta.properties").exists():
            return
        logger.info("kafka: formatting KRaft storage in %s", self.data)
        shutil.rmtree(self.data, ignore_errors=True)
        formatted.unlink(missing_ok=True)
        id_file = self.dir / "cluster.id"
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
            *HEAP,
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

    def probe(self, endpoints: Endpoints) -> None:
        """Ask the broker for its metadata and its group coordinator (raises while either is not answering)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {"bootstrap.servers": endpoints.kafka_bootstrap, "log_level": 0, "socket.connection.setup.timeout.ms": 3000}
        )
        admin.list_topics(timeout=5)
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
        """The bootstrap servers."""
        return endpoints.kafka_bootstrap
