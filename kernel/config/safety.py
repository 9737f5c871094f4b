"""Safe by default: pass-through options are allow-lists, checked before any connection.

A config file is data that may come from someone with less power than the
process that runs it. The pass-through settings reach client libraries that can
load code, read files, run commands or turn verification off. Each is
therefore an **allow-list** of options known to be safe; anything else is a
validation error that names the key and why (``threes validate`` reports it
without connecting anywhere):

* options that load code or files, run commands, or disable verification are
  refused with the reason;
* options that override a typed setting (``bootstrap.servers``,
  ``security.protocol`` under a typed ``security_protocol``) are refused: the
  typed field is the one place that decides;
* any other unknown option is refused as "not on the allow-list": add it here
  (with a reason it is safe) rather than to a config file.

This module holds the Kafka clients' list (``kafka.client_config``, librdkafka's
properties), which every part shares. Each owner keeps its own list beside it:
a database URL's query options in :mod:`connectors.rds.url_options`, the stream
job's ``stream.spark.conf`` in :mod:`stream_app.spark_conf_safety`.

Sources: librdkafka CONFIGURATION.md; OWASP "Deserialization / code loading"
guidance (refuse class names and library paths from data).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# -- Kafka (librdkafka properties) --------------------------------------------------------------

KAFKA_ALLOWED: frozenset[str] = frozenset({
    "client.id", "client.rack", "client.dns.lookup",
    "linger.ms", "queue.buffering.max.ms", "queue.buffering.max.messages", "queue.buffering.max.kbytes",
    "batch.num.messages", "batch.size", "compression.type", "compression.codec", "compression.level",
    "message.max.bytes", "message.timeout.ms", "delivery.timeout.ms", "request.timeout.ms",
    "socket.timeout.ms", "socket.keepalive.enable", "socket.nagle.disable", "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes", "socket.connection.setup.timeout.ms", "socket.connection.setup.timeout.max.ms",
    "connections.max.idle.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms", "retry.backoff.ms",
    "retry.backoff.max.ms", "retries", "message.send.max.retries", "metadata.max.age.ms",
    "topic.metadata.refresh.interval.ms", "topic.metadata.refresh.sparse", "broker.address.family",
    "broker.address.ttl", "api.version.request.timeout.ms", "statistics.interval.ms", "log.connection.close",
    "log_level", "fetch.min.bytes", "fetch.max.bytes", "fetch.wait.max.ms", "fetch.message.max.bytes",
    "max.partition.fetch.bytes", "max.poll.interval.ms", "session.timeout.ms", "heartbeat.interval.ms",
    "queued.min.messages", "queued.max.messages.kbytes", "fetch.queue.backoff.ms", "partition.assignment.strategy",
    "receive.message.max.bytes", "max.in.flight.requests.per.connection", "max.in.flight",
    "sticky.partitioning.linger.ms", "partitioner", "transaction.timeout.ms",
    # value-checked below
    "debug", "acks", "request.required.acks", "enable.idempotence", "isolation.level",
})

# key -> why it is refused (whatever its value)
KAFKA_REFUSED: dict[str, str] = {
    "plugin.library.paths": "loads shared libraries (code) into the process",
    "sasl.kerberos.kinit.cmd": "runs a shell command",
    "sasl.kerberos.keytab": "reads a file (Kerberos is not supported through client_config)",
    "ssl.engine.location": "loads an OpenSSL engine (code) into the process",
    "ssl.engine.id": "selects an OpenSSL engine (code)",
    "ssl.providers": "loads OpenSSL providers (code) into the process",
    "ssl.key.location": "reads a private key file (client certificates are not supported through client_config)",
    "ssl.key.pem": "is a secret in plain text",
    "ssl.key.password": "is a secret in plain text",
    "ssl.keystore.location": "reads a key store file",
    "ssl.keystore.password": "is a secret in plain text",
    "ssl.certificate.location": "reads a file (client certificates are not supported through client_config)",
    "ssl.crl.location": "reads a file",
    "ssl.ca.certificate.stores": "reads the system's certificate stores",
    "ssl.endpoint.identification.algorithm": "turns broker host name verification off when none; it is always "
    "https (verified) under SSL/SASL_SSL",
    "enable.ssl.certificate.verification": "turns broker certificate verification off",
    "sasl.oauthbearer.config": "configures an OAuth token source from text",
    "sasl.oauthbearer.token.endpoint.url": "sends credentials to a URL",
    "sasl.oauthbearer.client.secret": "is a secret in plain text",
    "enable.sasl.oauthbearer.unsecure.jwt": "accepts unsigned tokens",
    "bootstrap.servers": "overrides the typed setting kafka.bootstrap_servers",
    "metadata.broker.list": "overrides the typed setting kafka.bootstrap_servers",
    "security.protocol": "overrides the typed setting kafka.security_protocol (it could downgrade SASL_SSL to "
    "plaintext)",
    "sasl.mechanism": "overrides the typed setting kafka.sasl_mechanism",
    "sasl.mechanisms": "overrides the typed setting kafka.sasl_mechanism",
    "sasl.username": "overrides the typed setting kafka.sasl_username",
    "sasl.password": "looks like a secret: use kafka.sasl_password (masked)",
    "ssl.ca.location": "overrides the typed setting kafka.ssl_ca_location",
    "ssl.ca.pem": "overrides the typed setting kafka.ssl_ca_location",
    "group.id": "is set by the sync service (sync[].consumer_group)",
    "transactional.id": "is set by the source worker (exactly_once)",
    "enable.auto.commit": "offsets are committed by the runtime after the write is durable",
    "enable.auto.offset.store": "offsets are stored by the runtime after the write is durable",
    "auto.offset.reset": "is decided by the runtime",
    "allow.auto.create.topics": "topics are created by the runtime with their cleanup policy",
}

# debug contexts that neither dump the configuration nor the SASL/TLS exchange
_KAFKA_DEBUG_OK = frozenset({
    "generic", "broker", "topic", "metadata", "feature", "queue", "msg", "cgrp", "fetch", "consumer",
    "admin", "eos", "assignor", "telemetry",
})


def kafka_client_config_problems(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Check ``kafka.client_config`` against the allow-list.

    Args:
        config: librdkafka property -> value, as written in the YAML.

    Returns:
        ``[(key, why it is refused)]``, empty when every key is allowed.
    """
    problems = []
    for key, value in config.items():
        text = str(value).strip().lower()
        if key in KAFKA_REFUSED:
            problems.append((key, KAFKA_REFUSED[key]))
        elif key.startswith(("ssl.", "sasl.", "ssl_", "oauthbearer")) or "interceptor" in key:
            problems.append((key, "a TLS/SASL setting: security is decided by the typed kafka.* settings"))
        elif key not in KAFKA_ALLOWED:
            problems.append((key, "not on the allow-list of known-safe librdkafka options "
                                  "(kernel/config/safety.py)"))
        elif key == "debug":
            contexts = {c.strip() for c in text.split(",") if c.strip()}
            bad = sorted(contexts - _KAFKA_DEBUG_OK)
            if bad:
                problems.append((key, f"debug context(s) {bad} log the configuration or the SASL/TLS exchange "
                                      "(secrets) and flood the logs; allowed: " + ", ".join(sorted(_KAFKA_DEBUG_OK))))
        elif key in ("acks", "request.required.acks") and text not in ("all", "-1"):
            problems.append((key, "only all (-1): the runtime's guarantees need every in-sync replica to acknowledge"))
        elif key == "enable.idempotence" and text not in ("true", "1"):
            problems.append((key, "only true: the runtime's guarantees need the idempotent producer"))
        elif key == "isolation.level" and text != "read_committed":
            problems.append((key, "only read_committed: read_uncommitted would read aborted transactions"))
    return problems
