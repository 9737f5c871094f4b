"""``server.properties`` of a local Kafka node: listeners, KRaft quorum, replication of the cluster's topics.

One combined broker+controller node per broker (:class:`~threes.local.kafka_cluster.KafkaCluster`);
with the SASL_SSL listener when a key store is given (:mod:`threes.local.tls`).
"""

from __future__ import annotations

from pathlib import Path

from .common import HOST
from .kafka_cluster import KafkaCluster

SASL_MECHANISM = "SCRAM-SHA-512"


def server_properties(
    data_dir: Path,
    keystore: Path | None = None,
    keystore_password: str | None = None,
    *,
    node: int = 1,
    cluster: KafkaCluster | None = None,
) -> str:
    """Return ``server.properties`` for one combined broker+controller node.

    With three or more brokers the cluster's own topics (``__consumer_offsets``,
    ``__transaction_state``) and auto-created ones get three replicas and
    ``min.insync.replicas=2``, as :func:`schemas.kafka_admin.replication_settings` gives
    the project's topics; with one broker, one replica.

    Args:
        data_dir: Absolute folder for the log segments and KRaft metadata.
        keystore: PKCS#12 key store of the SASL_SSL listener (server key and
            certificate chain); None leaves that listener out.
        keystore_password: Password of ``keystore`` (and of the key in it).
        node: This node's id (1-based).
        cluster: The cluster's shape; one broker on the default ports when None.
    """
    cluster = cluster or KafkaCluster()
    plain, controller, sasl = cluster.plaintext_port(node), cluster.controller_port(node), cluster.sasl_ssl_port(node)
    listeners = f"PLAINTEXT://{HOST}:{plain},CONTROLLER://{HOST}:{controller}"
    advertised = f"PLAINTEXT://{HOST}:{plain}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    tls: dict[str, str] = {}
    if keystore is not None:
        listeners += f",SASL_SSL://{HOST}:{sasl}"
        advertised += f",SASL_SSL://{HOST}:{sasl}"
        protocols += ",SASL_SSL:SASL_SSL"
        tls = _sasl_ssl(keystore, keystore_password or "")
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        "controller.quorum.voters": cluster.voters(),
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        **tls,
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        **_replication(cluster.brokers),
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
        "num.network.threads": "2",
        "num.io.threads": "4",
    }
    lines = ["# Written by threes.local.kafka; regenerated on every start."]
    lines += [f"{key}={value}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def _sasl_ssl(keystore: Path, password: str) -> dict[str, str]:
    """The SASL_SSL listener's settings: SCRAM over TLS with the node's PKCS#12 key store."""
    prefix = "listener.name.sasl_ssl."
    return {
        "sasl.enabled.mechanisms": SASL_MECHANISM,
        f"{prefix}sasl.enabled.mechanisms": SASL_MECHANISM,
        f"{prefix}{SASL_MECHANISM.lower()}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        f"{prefix}ssl.keystore.type": "PKCS12",
        f"{prefix}ssl.keystore.location": str(keystore),
        f"{prefix}ssl.keystore.password": password,
        f"{prefix}ssl.key.password": password,
        f"{prefix}ssl.client.auth": "none",
    }


def _replication(brokers: int) -> dict[str, str]:
    """Replicas of the cluster's own and auto-created topics: min(3, brokers), ``min.insync.replicas`` 2 on 3+."""
    replicas = str(min(3, brokers))
    min_isr = "2" if brokers >= 3 else "1"
    return {
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
    }
