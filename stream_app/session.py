"""SparkSession construction: the one place the stream job's Spark settings are applied.

Spark binds to a non-loopback address unless told otherwise, so a
``local[...]`` master, or a cluster master on the loopback address (the local
stack's standalone cluster), pins the driver to 127.0.0.1; another cluster
master keeps Spark's own networking. The Kafka and Avro connectors come either
as jar files resolved beforehand (``jars``, offline) or as Maven coordinates
resolved by Spark's Ivy at start-up (``spark.jars.packages``). On a cluster
the project's own Python code is shipped to the executors as a zip
(:mod:`stream_app.pyfiles`). The driver's JVM maps Spark's classes from a class
data sharing archive of an earlier run (:mod:`stream_app.class_data_sharing`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_app.spark_settings import SparkSettings

if TYPE_CHECKING:
    from stream_app.class_data_sharing import DriverArchive

log = logging.getLogger(__name__)



def _installed_pyspark(pinned: str = "4.2.0") -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:  # pragma: no cover - pyspark is a dependency
        return pinned


SPARK_VERSION = _installed_pyspark()
"""The installed pyspark's version (pyproject.toml pins ``pyspark==4.2.0``). The Kafka and Avro connectors
must match it exactly, so they follow it: another pyspark on the path (a benchmark of two Spark
versions side by side, ``benchmarks/spark_versions.py``) gets its own."""
SPARK_PACKAGES = (
    f"org.apache.spark:spark-sql-kafka-0-10_2.13:{SPARK_VERSION}",
    f"org.apache.spark:spark-avro_2.13:{SPARK_VERSION}",
)

ONE_HOST_SHUFFLE = {"spark.shuffle.compress": "false", "spark.shuffle.spill.compress": "false"}
"""Shuffle settings of a job whose executors all run on the driver's host (``local[*]``, or a standalone
master at 127.0.0.1/localhost): shuffle blocks are written to and read from this host's disks (its page
cache), never sent over a network, so LZ4 compressing and decompressing them is CPU spent for nothing.
Measured on the local standalone cluster (2M-key snapshot bootstrap, two alternating pairs): 0.89x the
bootstrap's time and 0.87x its executors' task CPU. ``stream.spark.conf`` overrides them."""


@contextmanager
def job_description(spark: Any, text: str) -> Iterator[None]:
    """Name the Spark jobs this thread starts inside the block (Spark's ``spark.job.description``).

    The Spark UI, the history server and the event log show ``text`` on each job
    instead of a call site; the thread's previous description comes back after.

    Args:
        spark: the SparkSession.
        text: e.g. ``threes snapshot airports: bootstrap``.
    """
    context = spark.sparkContext
    previous = context.getLocalProperty("spark.job.description")
    context.setJobDescription(text)
    try:
        yield
    finally:
        context.setLocalProperty("spark.job.description", previous)  # None removes it


def is_local(master: str) -> bool:
    """Whether ``master`` runs executors inside the driver (``local``, ``local[*]``, ``local[2]``...)."""
    return master == "local" or master.startswith("local[")


def _loopback_master(master: str) -> bool:
    host = master.split("://", 1)[-1].split(":", 1)[0]
    return host in ("127.0.0.1", "localhost")


def spark_session(
    settings: SparkSettings,
    jars: Sequence[Path | str] | None = None,
    local_jars: Sequence[Path | str] | None = None,
    extra_jars: Sequence[Path | str] | None = None,
) -> Any:
    """Build (or return the running) SparkSession for the stream job.

    Args:
        settings: master, app name, driver memory and any ``spark.*`` conf.
        jars: jar files of the Kafka and Avro connectors; ``None`` resolves
            :data:`SPARK_PACKAGES` through Ivy instead (needs Maven Central).
        local_jars: jar files present at the same path on every host, appended to the
            class path of the driver and of the executors, after Spark's own jars, and
            read in place: hadoop-aws and its 560 MB AWS SDK bundle. Spark's launcher
            appends ``SPARK_DIST_CLASSPATH`` to every JVM it builds (the driver's, when
            this process starts its JVM with the first session; the executors', through
            ``spark.executorEnv``). ``spark.jars`` would copy the bundle into every
            executor of every application (a ``local:`` URI too, in Spark 4.0), and
            ``extraClassPath`` would put the bundle's unshaded slf4j 1.x before Spark's
            and silence Spark's logging.
        extra_jars: more jar files for ``spark.jars`` (the driver serves them to the executors), with
            either form of the connectors: the Java lookup component of real-time mode
            (:func:`stream_app.realtime.lookup_jar`).

    Returns:
        A :class:`pyspark.sql.SparkSession`.

    Raises:
        ImportError: on a cluster, a package of the code zip cannot be found
            (:func:`stream_app.pyfiles.build_code_zip`).
    """
    local = is_local(settings.master)
    if local or _loopback_master(settings.master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must import the project's dependencies: use this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    entries = [str(Path(j).resolve()) for j in local_jars or ()]
    builder = _with_conf(_builder(settings, local), settings, entries, jars, extra_jars)
    if not local:  # in local mode the tasks run in the driver's JVM
        executor_options = _executor_java_options(settings)
        if executor_options:
            builder = builder.config("spark.executor.extraJavaOptions", executor_options)
    archive = _driver_archive(settings, jars, local_jars) if settings.class_data_sharing else None
    # the driver's JIT inlining (``jit_inlining``) and its class data sharing archive
    options = [settings.driver_java_options(), *(archive.java_options if archive is not None else ())]
    if any(options):
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(filter(None, options)))
    spark = _get_or_create(builder, entries, archive)
    if archive is not None and archive.part is not None:
        _finish_at_exit(archive)
    spark.sparkContext.setLogLevel("WARN")
    _quiet(spark)
    if not local:
        ship_code(spark)
    log.info("spark session master=%s version=%s", settings.master, spark.version)
    return spark


def _builder(settings: SparkSettings, local: bool) -> Any:
    """The session builder with the job's own defaults (``stream.spark.conf`` is applied after them)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # PySpark 4 records the Python call site of every DataFrame/Column call for error
        # messages ("DataFrame query context"): several extra py4j round trips per call, most
        # of the planning time of a wide plan rebuilt every micro-batch. The call sites would
        # be this package's own lines; `stream.spark.conf` can turn it back on.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # every query execution (two per micro-batch) renders its physical plan for the UI's SQL tab,
        # which is off here: the one-line rendering, not the "formatted" default's numbered operators
        .config("spark.sql.ui.explainMode", "simple")
        # from_avro reads an Avro time-micros / time-millis as Spark's TIME (Spark 4.1+), which
        # expressions refuse unless the TIME type is on: hour(t), minute(t), second(t) then work on it
        .config("spark.sql.timeType.enabled", "true")
    )
    if local or _loopback_master(settings.master):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        # shuffle files that never leave this host: compressing them only costs CPU (`conf` can set them)
        for key, value in ONE_HOST_SHUFFLE.items():
            builder = builder.config(key, value)
    return builder


def _with_conf(builder: Any, settings: SparkSettings, local_entries: list[str],
               jars: Sequence[Path | str] | None, extra_jars: Sequence[Path | str] | None) -> Any:
    """The jars (connectors, extra ones, the executors' class path of ``local_entries``) and ``stream.spark.conf``."""
    dist_key = "spark.executorEnv.SPARK_DIST_CLASSPATH"
    if local_entries:
        builder = builder.config(dist_key, ":".join(filter(None, [settings.conf.get(dist_key), *local_entries])))
    if not jars:
        builder = builder.config("spark.jars.packages", ",".join(SPARK_PACKAGES))
    if jars or extra_jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in [*(jars or []), *(extra_jars or [])]))
    for key, value in settings.conf.items():
        if not (local_entries and key == dist_key):
            builder = builder.config(key, value)
    return builder


def _executor_java_options(settings: SparkSettings) -> str:
    """The executors' collector (``executor_gc``), JIT inlining (``jit_inlining``) and, when they run here, archive."""
    executor_options = settings.executor_java_options()
    if settings.class_data_sharing and _loopback_master(settings.master):
        executor_options = " ".join(filter(None, [executor_options, *_executor_archive_options(executor_options)]))
    return executor_options


def _get_or_create(builder: Any, local_entries: list[str], archive: Any) -> Any:
    """``builder.getOrCreate()`` with ``SPARK_DIST_CLASSPATH`` set for the driver's JVM while it starts.

    The driver's JVM (started by the first getOrCreate of this process) reads it from our
    environment; it is restored afterwards so that child processes do not inherit it.
    """
    saved = os.environ.get("SPARK_DIST_CLASSPATH")
    if local_entries:
        os.environ["SPARK_DIST_CLASSPATH"] = ":".join(filter(None, [saved, *local_entries]))
    try:
        return builder.getOrCreate()
    except BaseException:
        if archive is not None:
            archive.abandon()  # no JVM of this process trains: let another one
        raise
    finally:
        if saved is None:
            os.environ.pop("SPARK_DIST_CLASSPATH", None)
        else:
            os.environ["SPARK_DIST_CLASSPATH"] = saved


def _driver_archive(
    settings: SparkSettings, jars: Sequence[Path | str] | None, local_jars: Sequence[Path | str] | None
) -> DriverArchive | None:
    """The class data sharing archive for the driver's JVM, when this process is about to start one.

    ``None`` when a JVM already runs (a second session of this process, or a driver launched by
    ``spark-submit``, whose JVM started before this code): JVM options apply only at its start.
    """
    from pyspark import SparkContext

    from stream_app.class_data_sharing import driver_archive

    if SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    extra = [str(j) for j in [*(jars or []), *(local_jars or [])]]
    extra += [e for e in os.environ.get("SPARK_DIST_CLASSPATH", "").split(":") if e]
    return driver_archive(extra, settings.driver_java_options())


def _executor_archive_options(executor_options: str) -> tuple[str, ...]:
    """JVM options that give the executors of a standalone cluster on this host Spark's classes from an archive.

    Measured on the local stack's cluster (two 1-core executors, 10M-key snapshot, one run each): a
    bootstrap 138k -> 207k keys/s, a restart to its first micro-batch 18.1 s -> 12.1 s. The first
    application of an installation records the classes its executors load; its process's exit dumps
    them into the archive in the background (:mod:`stream_app.class_data_sharing`).
    """
    from stream_app.executor_class_data_sharing import executor_archive

    shared = executor_archive(executor_options)
    return shared.java_options if shared is not None else ()


def _finish_at_exit(archive: DriverArchive) -> None:
    """Have this process's exit let the training JVM write its archive (or drop the training)."""
    import atexit

    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:  # not a JVM this process launched: nothing to wait for
        archive.abandon()
        return
    atexit.register(archive.finish, proc)


def ship_code(spark: Any) -> Path:
    """Ship the project's packages to the executors as a zip (``SparkContext.addPyFile``).

    Args:
        spark: a SparkSession on a cluster.

    Returns:
        The zip's path on the driver (its copy on an executor is under Spark's ``userFiles``
        folder of the application).

    Raises:
        ImportError: a package cannot be zipped (:func:`stream_app.pyfiles.build_code_zip`).
    """
    from stream_app.pyfiles import build_code_zip

    code = build_code_zip()
    spark.sparkContext.addPyFile(str(code))
    return code


_QUIET = {
    # warns, for every plan, that a nullable column meets a non-null Avro field; the stream job only
    # encodes rows whose required fields are set (the others are dead-lettered before encoding)
    "org.apache.spark.sql.avro.AvroSerializer": "ERROR",
}


@contextmanager
def quiet_loggers(spark: Any, names: Sequence[str]) -> Iterator[None]:
    """Turn the JVM loggers ``names`` off for the ``with`` block, then back to their levels before.

    For what Spark logs as an error while doing what the job asked, e.g. a real-time query's
    open epoch aborted by a stop. Another logging backend than log4j 2: nothing changes.
    """
    jvm = spark.sparkContext._jvm
    previous: dict[str, Any] = {}
    try:
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        for name in names:
            previous[name] = jvm.org.apache.logging.log4j.LogManager.getLogger(name).getLevel()
            configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.OFF)
    except Exception:  # another logging backend: keep its messages
        log.debug("could not turn Spark loggers %s off", list(names), exc_info=True)
    try:
        yield
    finally:
        for name, level in previous.items():
            try:
                configurator.setLevel(name, level)
            except Exception:  # the session may be gone
                log.debug("could not restore Spark logger %s", name, exc_info=True)


def _quiet(spark: Any) -> None:
    """Lower Spark loggers that warn about what the stream job does on purpose."""
    jvm = spark.sparkContext._jvm
    try:
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        for name, level in _QUIET.items():
            configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.toLevel(level))
    except Exception:  # another logging backend: keep the warnings
        log.debug("could not lower Spark loggers %s", sorted(_QUIET), exc_info=True)
