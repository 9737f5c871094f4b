"""Settings every SparkSession of the job gets on one host (``local[*]``; the cluster's are in test_cluster.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark


def test_shuffle_files_on_one_host_are_not_compressed(spark):
    from pyspark.sql import functions as F

    conf = spark.sparkContext.getConf()
    assert conf.get("spark.shuffle.compress") == "false"
    assert conf.get("spark.shuffle.spill.compress") == "false"
    # a shuffle still runs with them: 4 partitions' sums regrouped by key
    rows = spark.range(0, 10_000, numPartitions=4).groupBy((F.col("id") % 7).alias("k")).agg(F.sum("id").alias("s"))
    assert {r.k: r.s for r in rows.collect()} == {k: sum(range(k, 10_000, 7)) for k in range(7)}


def test_the_driver_jvm_runs_with_lean_inlining(spark):
    # the flags the JVM started with (stream.spark.jit_inlining's default), not only the conf's text
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:MaxInlineLevel=6" in arguments and "-XX:InlineSmallCode=1000" in arguments, arguments
