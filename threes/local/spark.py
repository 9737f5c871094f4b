"""Spark's Kafka and Avro connector jars, resolved once into ``.threes/spark-jars-<spark version>``.

``spark-sql-kafka-0-10_2.13`` and ``spark-avro_2.13`` of :data:`SPARK_VERSION` (matching
the pinned ``pyspark``) with their runtime dependencies, minus the jars pyspark
already ships (see ``spark-pom.xml``). After the first resolution a
SparkSession needs no network: pass the paths as ``spark.jars``. The folder's name
carries the Spark version, so that the jars of two Spark versions (two checkouts
sharing one ``.threes``) live side by side and a pyspark upgrade never picks up the
connectors of the previous one.

Hadoop's S3A file system (``s3a://`` checkpoints) comes separately into
``.threes/spark-s3a-jars-<hadoop version>``: ``hadoop-aws`` pinned to the Hadoop version of
pyspark's own ``hadoop-client-api`` jar, and the AWS SDK v2 bundle it needs
(``spark-s3a-pom.xml``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from stream_app.session import SPARK_VERSION

from .common import HOST, Layout, LocalStackError
from .maven import copy_dependencies

logger = logging.getLogger(__name__)

__all__ = ["SPARK_VERSION", "resolve_spark_jars", "spark_jars_dir"]
HADOOP_VERSION = "3.5.0"
"""The Hadoop of pyspark 4.2.0 (``pyspark/jars/hadoop-client-api-3.5.0.jar``): hadoop-aws must match it."""


def spark_jars_dir(layout: Layout) -> Path:
    """Return the folder of the resolved jars: ``spark-jars-<SPARK_VERSION>``."""
    return layout.home / f"spark-jars-{SPARK_VERSION}"


def resolve_spark_jars(layout: Layout) -> list[Path]:
    """Return the connector jars, resolving them with Maven on first use.

    Args:
        layout: The project-local folder.

    Returns:
        Absolute jar paths, sorted by name.

    Raises:
        LocalStackError: If Maven cannot resolve them (e.g. offline on first use).
    """
    layout.create()
    target = copy_dependencies(
        layout, "spark-pom.xml", spark_jars_dir(layout), log_name=f"spark-{SPARK_VERSION}",
        properties={"spark.version": SPARK_VERSION},
    )
    jars = sorted(target.glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka") for j in jars):
        raise LocalStackError(f"{target} lacks spark-sql-kafka; delete that folder and run up again")
    return jars


def s3a_jars_dir(layout: Layout) -> Path:
    """Return the folder of hadoop-aws and the AWS SDK bundle: ``spark-s3a-jars-<HADOOP_VERSION>``.

    Named by the Hadoop version, like :func:`spark_jars_dir` by Spark's: hadoop-aws must match
    the installed pyspark's Hadoop exactly, and two checkouts may share one ``.threes``.
    """
    return layout.home / f"spark-s3a-jars-{HADOOP_VERSION}"


def pyspark_hadoop_version() -> str | None:
    """Return the Hadoop version of the installed pyspark's ``hadoop-client-api`` jar, if found."""
    try:
        import pyspark
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    return jars[0].name.removeprefix("hadoop-client-api-").removesuffix(".jar") if jars else None


def resolve_s3a_jars(layout: Layout) -> list[Path]:
    """Return hadoop-aws and its AWS SDK bundle, resolving them with Maven on first use (~560 MB).

    Args:
        layout: The project-local folder.

    Returns:
        Absolute jar paths, sorted by name.

    Raises:
        LocalStackError: If pyspark's Hadoop is not the one pinned here (hadoop-aws must
            match it exactly), or Maven cannot resolve the jars.
    """
    found = pyspark_hadoop_version()
    if found is not None and found != HADOOP_VERSION:
        raise LocalStackError(
            f"pyspark ships Hadoop {found} but spark-s3a-pom.xml pins hadoop-aws {HADOOP_VERSION}; "
            "update the pom and HADOOP_VERSION together"
        )
    layout.create()
    target = copy_dependencies(
        layout, "spark-s3a-pom.xml", s3a_jars_dir(layout), log_name=f"spark-s3a-{HADOOP_VERSION}",
        properties={"hadoop.version": HADOOP_VERSION},
    )
    jars = sorted(target.glob("*.jar"))
    if not any(j.name == f"hadoop-aws-{HADOOP_VERSION}.jar" for j in jars):
        raise LocalStackError(f"{target} lacks hadoop-aws-{HADOOP_VERSION}.jar; delete that folder and run up again")
    return jars


def local_spark_conf(jars: list[Path]) -> dict[str, str]:
    """Return Spark settings for a local session that uses ``jars`` and binds to 127.0.0.1.

    Also set the environment variable ``SPARK_LOCAL_IP=127.0.0.1`` (and
    ``PYSPARK_PYTHON`` to your interpreter) before the session starts.

    Args:
        jars: Paths from :func:`resolve_spark_jars`.

    Returns:
        ``{"spark.jars": ..., "spark.driver.host": "127.0.0.1", ...}``.
    """
    return {
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.ui.enabled": "false",
    }
