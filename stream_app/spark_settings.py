"""Config of where and how Spark runs (``stream.spark``): :class:`SparkSettings`.

Beside the model: the JVM flags its settings lead the driver's and the
executors' ``extraJavaOptions`` with (the executors' garbage collector, the
C2 compiler's inlining) and the reading of Spark memory sizes.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from kernel.config.fields import StrictModel
from stream_app.spark_conf_safety import JIT_INLINE_FLAGS

EXECUTOR_GC_FLAGS: dict[str, str | None] = {
    "parallel": "-XX:+UseParallelGC",
    "serial": "-XX:+UseSerialGC",
    "g1": "-XX:+UseG1GC",
    "jvm": None,
}
"""JVM flag of each ``stream.spark.executor_gc`` (``jvm``: none, the JVM's ergonomics choose)."""


GC_FLAG = re.compile(r"-XX:\+Use\w+GC\b")


LEAN_INLINING = "-XX:MaxInlineLevel=6 -XX:InlineSmallCode=1000 -XX:MaxInlineSize=20 -XX:FreqInlineSize=200"
"""``stream.spark.jit_inlining: lean``: the C2 compiler inlines less deep and smaller methods than HotSpot 17's
defaults (``MaxInlineLevel`` 15, ``InlineSmallCode`` 2500, ``MaxInlineSize`` 35, ``FreqInlineSize`` 325), so it
spends less CPU compiling Spark's generated code: see docs/operations.md, "The JIT compilers' inlining"."""


INLINE_FLAG = re.compile(rf"-XX:({JIT_INLINE_FLAGS})=")


AUTO_PARALLEL_MAX_MIB = 8 * 1024
"""``executor_gc: auto`` picks the parallel collector for executors of at most this heap (MiB), else the JVM's."""


_SIZE = re.compile(r"^\s*(\d+)\s*(b|k|kb|m|mb|g|gb|t|tb|p|pb)?\s*$", re.IGNORECASE)


_MIB_PER_UNIT = {"b": 2.0**-20, "k": 2.0**-10, "m": 1.0, "g": 2.0**10, "t": 2.0**20, "p": 2.0**30}


def memory_mib(text: str) -> float | None:
    """A Spark memory size (``spark.executor.memory``: ``4g``, ``512m``, ``2048``) in MiB; ``None`` if unreadable.

    A number without a unit is MiB, as Spark reads ``spark.executor.memory``.
    """
    match = _SIZE.match(str(text))
    if match is None:
        return None
    unit = (match.group(2) or "m").lower()
    return int(match.group(1)) * _MIB_PER_UNIT[unit[0]]


class SparkSettings(StrictModel):
    """Where and how Spark runs.

    ``conf`` is an allow-list (:func:`stream_app.spark_conf_safety.spark_conf_problems`):
    tuning and deployment settings pass; settings that load code or files (``spark.jars``,
    ``spark.archives``, a class name, ``spark.pyspark.python``...) pass only when named in
    ``acknowledge_code_loading``; ``extraJavaOptions`` take GC/stack/time zone flags only;
    Spark's own security and redaction settings are refused. Secret values (``...secret.key``)
    are masked in ``repr``.
    """

    master: str = "local[*]"
    app_name: str = "threes-stream"
    driver_memory: str = "1g"
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="spark.* settings from an allow-list (tuning, spark.sql.*, S3A endpoint and keys); others need "
        "acknowledge_code_loading. With every executor on the driver's host (local[*], or a standalone master at "
        "127.0.0.1/localhost) spark.shuffle.compress and spark.shuffle.spill.compress default to false (shuffle "
        "files never cross a network there); set them here to override",
    )
    acknowledge_code_loading: list[str] = Field(
        default_factory=list,
        description="conf keys accepted although they load code or files or set the processes' environment "
        "(e.g. spark.archives, spark.pyspark.python, spark.kubernetes.container.image)",
    )
    executor_gc: Literal["auto", "parallel", "serial", "g1", "jvm"] = Field(
        "auto",
        description="the executors' garbage collector on a cluster (their JVMs' -XX:+Use...GC): parallel (a "
        "throughput collector; on 1 GB executors a 10M-key bootstrap took 2-21% less time and the job ran 3-24% "
        "more events/s than with the JVM's G1 in five alternating pairs), serial (one-core executors), g1 (large "
        "heaps with pause-time goals), jvm (the JVM's own choice) or auto: parallel for executors of "
        "spark.executor.memory up to 8g, else the JVM's; a collector named in spark.executor.extraJavaOptions wins",
    )
    jit_inlining: Literal["lean", "jvm"] = Field(
        "lean",
        description="how much the C2 JIT compiler of the driver's and the executors' JVMs inlines: lean "
        f"({LEAN_INLINING}: less CPU spent compiling Spark's generated code; on the local cluster a bootstrap took "
        "0.89x the time and the job ran more events/s than with the JVM's defaults) or jvm (HotSpot's defaults); "
        "an inlining flag in spark.driver.extraJavaOptions or spark.executor.extraJavaOptions wins for that JVM",
    )
    class_data_sharing: bool = Field(
        True,
        description="map Spark's classes into the driver's JVM from an archive of an earlier run (JDK class data "
        "sharing, kept under $THREES_CACHE_DIR or ~/.cache/threes): a session and its first query start sooner "
        "(driver_start in benchmarks/RESULTS.md); the first run of an installation writes the archive when it exits "
        "(once). "
        "Also the executors' JVMs on a standalone master at 127.0.0.1/localhost (workers on this host): the first "
        "application records their classes, and its exit dumps an archive in the background (once)",
    )

    @model_validator(mode="after")
    def _allow_listed_conf(self) -> SparkSettings:
        from stream_app.spark_conf_safety import spark_conf_problems

        problems = spark_conf_problems(self.conf, set(self.acknowledge_code_loading))
        if problems:
            raise ValueError("; ".join(f"conf '{key}' refused: {why}" for key, why in problems))
        named = GC_FLAG.findall(self.conf.get("spark.executor.extraJavaOptions", ""))
        if self.executor_gc not in ("auto", "jvm") and named:
            raise ValueError(
                f"executor_gc '{self.executor_gc}' and conf 'spark.executor.extraJavaOptions' ({' '.join(named)}) "
                "both choose the executors' garbage collector: keep one"
            )
        return self

    def executor_java_options(self) -> str:
        """``spark.executor.extraJavaOptions`` as the executors get them: ``conf``'s, led by ``executor_gc``'s flag.

        Returns:
            The flags, space-separated (``""`` for none): ``jit_inlining``'s flags and ``conf``'s own, after
            ``executor_gc``'s collector unless they name one, or ``executor_gc`` is ``jvm`` (or ``auto`` on
            executors of more than 8g).
        """
        own = self._with_jit(self.conf.get("spark.executor.extraJavaOptions", "").strip())
        choice = self.executor_gc
        if choice == "auto":
            heap = memory_mib(self.conf.get("spark.executor.memory", "1g"))
            choice = "parallel" if heap is not None and heap <= AUTO_PARALLEL_MAX_MIB else "jvm"
        flag = EXECUTOR_GC_FLAGS[choice]
        if flag is None or GC_FLAG.search(own):
            return own
        return f"{flag} {own}".strip()

    def driver_java_options(self) -> str:
        """``spark.driver.extraJavaOptions`` as the driver's JVM gets them (when this process starts it).

        Returns:
            ``conf``'s own, led by ``jit_inlining``'s flags unless they name an inlining flag.
        """
        return self._with_jit(self.conf.get("spark.driver.extraJavaOptions", "").strip())

    def _with_jit(self, own: str) -> str:
        if self.jit_inlining == "jvm" or INLINE_FLAG.search(own):
            return own
        return f"{LEAN_INLINING} {own}".strip()

    def __repr_args__(self) -> Any:
        from stream_app.spark_conf_safety import spark_conf_secret

        for name, value in super().__repr_args__():
            if name == "conf":
                value = {k: "**********" if spark_conf_secret(k) else v for k, v in value.items()}
            yield name, value
