"""The allow-list of ``stream.spark.conf``: Spark settings a config file may pass through.

Spark settings can load code (class names, jars, plugins, listeners), read files,
set the environment of Spark's processes, turn verification off or change what
Spark masks in its logs. ``stream.spark.conf`` is therefore an allow-list, as
``kafka.client_config`` is (:mod:`kernel.config.safety`): a setting that loads
code is refused unless ``stream.spark.acknowledge_code_loading`` names it, a
setting that overrides a typed field is refused, and any other unknown one is
"not on the allow-list".

Sources: Spark "Configuration"; OWASP "Deserialization / code loading" guidance.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

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
``stream.spark.jit_inlining``'s set (:mod:`stream_app.spark_settings`)."""
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
            problems.append((key, "not on the allow-list of known-safe Spark settings "
                                  "(stream_app/spark_conf_safety.py); list it in "
                                  "stream.spark.acknowledge_code_loading if you trust it"))
    return problems


def spark_conf_secret(key: str) -> bool:
    """Whether a Spark setting holds a secret (masked in ``repr`` and logs)."""
    lowered = key.lower()
    return any(word in lowered for word in ("secret", "password", "token", "access.key", "credential"))
