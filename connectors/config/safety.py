"""Safe by default: pass-through options are allow-lists, checked before any connection.

A config file is data that may come from someone with less power than the
process that runs it. The pass-through settings (``kafka.client_config``,
``stream.spark.conf``, a database URL's query string) reach client libraries
that can load code, read files, run commands or turn verification off. Each
is therefore an **allow-list** of options known to be safe; anything else is a
validation error that names the key and why (``threes validate`` reports it
without connecting anywhere):

* options that load code or files, run commands, or disable verification are
  refused with the reason;
* options that override a typed setting (``bootstrap.servers``,
  ``security.protocol`` under a typed ``security_protocol``, a URL's ``host``)
  are refused: the typed field is the one place that decides;
* any other unknown option is refused as "not on the allow-list": add it here
  (with a reason it is safe) rather than to a config file.

Sources: librdkafka CONFIGURATION.md; libpq "Connection Strings" (34.1.2);
PyMySQL ``connect()`` arguments; Spark "Configuration"; OWASP "Deserialization
/ code loading" guidance (refuse class names and library paths from data).
"""

from __future__ import annotations

import re
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
                                  "(connectors/config/safety.py)"))
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


# -- Spark configuration --------------------------------------------------------------------------

SPARK_ALLOWED: frozenset[str] = frozenset({
    "spark.executor.memory", "spark.executor.cores", "spark.executor.instances", "spark.executor.memoryOverhead",
    "spark.executor.pyspark.memory", "spark.executor.heartbeatInterval", "spark.driver.cores",
    "spark.driver.maxResultSize", "spark.driver.memoryOverhead", "spark.driver.host", "spark.driver.bindAddress",
    "spark.driver.port", "spark.driver.blockManager.port", "spark.blockManager.port", "spark.cores.max",
    "spark.default.parallelism", "spark.task.cpus", "spark.task.maxFailures", "spark.network.timeout",
    "spark.scheduler.mode", "spark.ui.enabled", "spark.ui.port", "spark.ui.showConsoleProgress", "spark.log.level",
    "spark.rdd.compress", "spark.io.compression.codec", "spark.kryoserializer.buffer",
    "spark.kryoserializer.buffer.max",
    "spark.submit.deployMode", "spark.stage.maxConsecutiveAttempts", "spark.python.worker.reuse",
    "spark.python.worker.memory", "spark.python.sql.dataFrameDebugging.enabled", "spark.broadcast.blockSize",
    "spark.kubernetes.namespace", "spark.kubernetes.authenticate.driver.serviceAccountName",
    "spark.hadoop.fs.s3a.endpoint", "spark.hadoop.fs.s3a.endpoint.region", "spark.hadoop.fs.s3a.path.style.access",
    "spark.hadoop.fs.s3a.connection.ssl.enabled", "spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key",
    "spark.hadoop.fs.s3a.session.token", "spark.hadoop.fs.s3a.connection.maximum", "spark.hadoop.fs.s3a.threads.max",
    "spark.hadoop.fs.s3a.fast.upload", "spark.hadoop.fs.s3a.fast.upload.buffer", "spark.hadoop.fs.s3a.multipart.size",
    "spark.hadoop.fs.s3a.attempts.maximum", "spark.hadoop.fs.s3a.retry.limit",
    "spark.hadoop.fs.s3a.aws.credentials.provider",
    "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
})
SPARK_ALLOWED_PREFIXES = ("spark.sql.", "spark.memory.", "spark.dynamicAllocation.", "spark.speculation",
                          "spark.locality.wait", "spark.shuffle.", "spark.cleaner.")

# Spark options that load code or files, or change who runs what: only with
# ``stream.spark.acknowledge_code_loading`` naming each of them.
SPARK_CODE_LOADING = re.compile(
    r"(?i)(class(es)?|listeners?|extensions|plugins?|jars|packages|repositories|ivy|pyfiles|\.files$|archives|"
    r"module|discoveryscript|extraclasspath|extralibrarypath|\.python$|executorenv|appmasterenv|driverenv|"
    r"podtemplatefile|container\.image|\.catalog\.|metastore|shuffle\.manager|serializer$)"
)
_S3A_PROVIDERS = frozenset({
    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider",
    "org.apache.hadoop.fs.s3a.auth.IAMInstanceCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.WebIdentityTokenFileCredentialsProvider",
})
_SPARK_CODECS = frozenset({"lz4", "lzf", "snappy", "zstd"})
# Spark's built-in data source short names (DataSourceRegister.shortName of the sources Spark ships, avro
# included): anything else in spark.sql.sources.default is a class or package name that Spark loads
_SPARK_SOURCES = frozenset({"parquet", "orc", "json", "csv", "avro", "text", "binaryfile"})
# JVM flags a job may need (GC, stack, JIT compiler, time zone, encoding); everything else (an agent,
# -XX:OnOutOfMemoryError running a command, a boot class path, a system property naming a
# class or a trust store) is refused. The JIT flags only change when and how much is compiled and inlined
# (see docs/operations.md, "The executors' JIT compilers").
JIT_INLINE_FLAGS = "MaxInlineLevel|MaxInlineSize|FreqInlineSize|InlineSmallCode"
"""The HotSpot inlining limits (``-XX:<name>=<n>``): allowed, and one of the user's own replaces
``stream.spark.jit_inlining``'s set (:mod:`stream_app.config`)."""
_JVM_FLAG = re.compile(
    r"^(-XX:\+Use(G1|Parallel|Z|Shenandoah|Serial)GC|-XX:MaxGCPauseMillis=\d+|-XX:\+ExitOnOutOfMemoryError|"
    r"-XX:CompileThresholdScaling=\d+(\.\d+)?|-XX:TieredStopAtLevel=[0-4]|-XX:[+-]TieredCompilation|"
    r"-XX:CICompilerCount=\d+|-XX:ReservedCodeCacheSize=\d+[kmgKMG]?|"
    rf"-XX:({JIT_INLINE_FLAGS})=\d+|"
    r"-XX:\+CrashOnOutOfMemoryError|-XX:MaxDirectMemorySize=\d+[kmgKMG]?|-XX:MaxMetaspaceSize=\d+[kmgKMG]?|"
    r"-XX:[+-]UseCompressedOops|-XX:[+-]UseStringDeduplication|-Xss\d+[kmgKMG]?|-Duser\.timezone=[\w/+-]+|"
    r"-Dfile\.encoding=[\w-]+|-Dio\.netty\.tryReflectionSetAccessible=(true|false)|-verbose:gc|-Xlog:gc)$"
)


def spark_conf_problems(conf: Mapping[str, Any], acknowledged: frozenset[str] | set[str] = frozenset()
                        ) -> list[tuple[str, str]]:
    """Check ``stream.spark.conf`` against the allow-list.

    Args:
        conf: Spark setting -> value.
        acknowledged: settings the YAML explicitly accepts although they load code
            or files (``stream.spark.acknowledge_code_loading``), e.g. ``spark.archives``
            to ship a packed virtualenv. ``extraJavaOptions`` are never acknowledged:
            their flags are checked one by one.

    Returns:
        ``[(key, why it is refused)]``.
    """
    problems = []
    for key, value in conf.items():
        text = str(value).strip()
        if key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            bad = [flag for flag in text.split() if not _JVM_FLAG.match(flag)]
            if bad:
                problems.append((key, f"JVM flag(s) {bad} are not on the allow-list (an agent, a class path, "
                                      "a command run on error or a system property can load code or turn "
                                      "verification off); allowed: GC, stack, JIT compiler, time zone, encoding flags"))
        elif key == "spark.hadoop.fs.s3a.aws.credentials.provider":
            bad = [c.strip() for c in text.split(",") if c.strip() not in _S3A_PROVIDERS]
            if bad:
                problems.append((key, f"class(es) {bad} are not known credential providers (a class name loads code)"))
        elif key == "spark.io.compression.codec" and text not in _SPARK_CODECS:
            problems.append((key, f"only {sorted(_SPARK_CODECS)} (a class name loads code)"))
        elif key in acknowledged:
            continue
        elif key == "spark.sql.sources.default" and text.lower() not in _SPARK_SOURCES:
            problems.append((key, f"{text!r} is not a built-in data source short name (a class or package name "
                                  f"loads code); allowed: {', '.join(sorted(_SPARK_SOURCES))}, or list the key in "
                                  "stream.spark.acknowledge_code_loading to accept that"))
        elif key in ("spark.master", "spark.app.name", "spark.driver.memory"):
            problems.append((key, f"overrides the typed setting stream.spark.{key.removeprefix('spark.')}"
                                  .replace("app.name", "app_name").replace("driver.memory", "driver_memory")))
        elif key in ("spark.redaction.regex", "spark.sql.redaction.string.regex", "spark.sql.redaction.options.regex"):
            problems.append((key, "changes what Spark masks in its logs and UI (secrets could show)"))
        elif key.startswith(("spark.ssl", "spark.authenticate", "spark.network.crypto", "spark.io.encryption")):
            problems.append((key, "a security setting of Spark's own RPC/UI: not changeable through the YAML"))
        elif SPARK_CODE_LOADING.search(key) and key not in SPARK_ALLOWED:
            problems.append((key, "loads code or files, or sets the environment of Spark's processes; list it "
                                  "in stream.spark.acknowledge_code_loading to accept that"))
        elif key not in SPARK_ALLOWED and not key.startswith(SPARK_ALLOWED_PREFIXES):
            problems.append((key, "not on the allow-list of known-safe Spark settings (connectors/config/safety.py); "
                                  "list it in stream.spark.acknowledge_code_loading if you trust it"))
    return problems


def spark_conf_secret(key: str) -> bool:
    """Whether a Spark setting holds a secret (masked in ``repr`` and logs)."""
    lowered = key.lower()
    return any(word in lowered for word in ("secret", "password", "token", "access.key", "credential"))


# -- database URL query options -------------------------------------------------------------------

_PG_ALLOWED = frozenset({
    "sslmode", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "ssl_min_protocol_version",
    "ssl_max_protocol_version", "sslnegotiation", "sslcompression", "gssencmode", "krbsrvname", "channel_binding",
    "requirepeer", "application_name", "fallback_application_name", "target_session_attrs", "load_balance_hosts",
    "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout",
    "client_encoding",
})
# sslmode values that let the connection run without a verified server certificate, like MySQL's
# ssl_disabled and ssl_verify_cert=false (libpq "SSL Support", table 34.1 "SSL Mode Descriptions")
_PG_SSLMODE_REFUSED = {
    "disable": "turns TLS off",
    "allow": "falls back to a connection without TLS (tried first without it)",
    "prefer": "falls back to a connection without TLS when the server (or a man in the middle) offers none",
    "require": "encrypts but skips server certificate verification (anyone on the path can pose as the server)",
}
_PG_REFUSED = {
    "passfile": "reads a password file",
    "sslkey": "reads a private key file (client certificates are not supported through the URL)",
    "sslcert": "reads a certificate file (client certificates are not supported through the URL)",
    "sslpassword": "is a secret in plain text",
    "sslcertmode": "client certificates are not supported through the URL",
    "options": "sets server parameters for the session (-c ...), e.g. its search_path or checks",
    "service": "reads connection settings from a service file",
    "servicefile": "reads connection settings from a file",
    "host": "overrides the URL's host",
    "hostaddr": "overrides the URL's host",
    "port": "overrides the URL's port",
    "dbname": "overrides the URL's database",
    "user": "overrides the URL's user",
    "connect_timeout": "overrides the typed setting connect_timeout_s",
}
_MYSQL_ALLOWED = frozenset({
    "charset", "collation", "read_timeout", "write_timeout", "ssl_ca", "ssl_verify_cert", "ssl_verify_identity",
    "binary_prefix", "program_name", "ssl_check_hostname",
})
_MYSQL_REFUSED = {
    "local_infile": "lets the server read any file of the client (LOAD DATA LOCAL INFILE)",
    "read_default_file": "reads connection settings from a file",
    "read_default_group": "reads connection settings from an option file",
    "init_command": "runs SQL on every connection",
    "client_flag": "sets protocol flags (it can enable LOCAL INFILE)",
    "unix_socket": "overrides the URL's host",
    "ssl_key": "reads a private key file (client certificates are not supported through the URL)",
    "ssl_cert": "reads a certificate file (client certificates are not supported through the URL)",
    "ssl_disabled": "turns TLS off",
    "auth_plugin_map": "loads authentication plugins (code)",
    "server_public_key": "replaces the server's key (man in the middle)",
    "autocommit": "the sink's transactions need autocommit off",
    "connect_timeout": "overrides the typed setting connect_timeout_s",
    "defer_connect": "decided by the connection pool",
}
_SQLITE_ALLOWED = frozenset({"timeout", "check_same_thread", "uri", "mode", "cache", "immutable", "nolock"})


def url_query_problems(backend: str, query: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Check a database URL's query options against its driver's allow-list.

    Args:
        backend: SQLAlchemy backend name (``postgresql``, ``mysql``, ``mariadb``, ``sqlite``).
        query: the URL's query options (values unused except for a few checks).

    Returns:
        ``[(option, why it is refused)]``.
    """
    problems = []
    for key, value in query.items():
        values = value if isinstance(value, (tuple, list)) else (value,)
        if backend == "postgresql":
            if key in _PG_REFUSED:
                problems.append((key, _PG_REFUSED[key]))
            elif key not in _PG_ALLOWED:
                problems.append((key, "not on the allow-list of known-safe PostgreSQL (libpq) options"))
            elif key == "sslmode":
                for v in values:
                    why = _PG_SSLMODE_REFUSED.get(str(v).strip().lower())
                    if why:
                        problems.append((key, f"{v} {why}; use sslmode=verify-full (or verify-ca) with "
                                              "sslrootcert=<CA file>; there is no opt-in, as for MySQL's "
                                              "ssl_disabled"))
        elif backend in ("mysql", "mariadb"):
            if key in _MYSQL_REFUSED:
                problems.append((key, _MYSQL_REFUSED[key]))
            elif key not in _MYSQL_ALLOWED:
                problems.append((key, "not on the allow-list of known-safe MySQL options"))
            elif key == "ssl_verify_cert" and any(str(v).lower() in ("false", "0", "no") for v in values):
                problems.append((key, "turns server certificate verification off"))
        elif backend == "sqlite":
            if key not in _SQLITE_ALLOWED:
                problems.append((key, "not on the allow-list of known-safe SQLite options"))
        else:
            problems.append((key, f"no query options are allowed for {backend!r} URLs"))
    return problems
