"""The stream job's code on a real Spark standalone cluster (a master and two workers, separate JVMs)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from . import test_enrich_job as enrich_job
from . import test_restart_and_updates as restart_and_updates

pytestmark = pytest.mark.spark


def test_executors_import_the_project_from_the_shipped_zip(cluster_spark):
    from pyspark.sql import functions as F

    def where_from(_: int) -> str:
        import os

        import stream_app.pyfiles

        return os.path.abspath(stream_app.pyfiles.__file__)

    rows = cluster_spark.range(0, 8, numPartitions=8).select(F.udf(where_from, "string")("id")).collect()
    paths = {row[0] for row in rows}
    assert len(rows) == 8 and paths
    for path in paths:
        # .threes/spark-worker-<n>/work/<app id>/<executor id>/threes-code-<sha>.zip/stream_app/pyfiles.py
        archive, _, inner = path.partition(".zip/")
        archive = Path(archive + ".zip")
        assert inner == "stream_app/pyfiles.py", path
        executor_dir, app_dir, work = archive.parent, archive.parents[1], archive.parents[2]
        assert archive.name.startswith("threes-code-") and app_dir.name.startswith("app-"), path
        assert work.name == "work" and work.parent.name.startswith("spark-worker-"), path
        assert executor_dir.name.isdigit(), path
        # the shipped copy is the driver's code, not an installed one
        with zipfile.ZipFile(archive) as zf:
            assert zf.read(inner) == Path(__file__).parents[3].joinpath(inner).read_bytes()
    assert cluster_spark.sparkContext.master.startswith("spark://127.0.0.1:")


# The semantics tests that matter, on the cluster: the same scenario bodies as on local[2], whose
# outputs are also compared with the local[2] run's when both run in one session (same_on_every_master).
# Executors in separate JVMs with their own Python workers: the indexed engine's worker-side index, the
# aggregation's RocksDB state store and the dead letters all run there.


def test_tombstones_and_reinserts_on_the_cluster(cluster_spark, env, outputs_by_master):
    enrich_job.test_deleted_reference_gives_nulls_and_a_reinsert_brings_it_back(
        cluster_spark, env, "indexed", outputs_by_master
    )


def test_replayed_batch_gives_identical_update_records_on_the_cluster(cluster_spark, env, outputs_by_master):
    restart_and_updates.test_update_records_are_identical_when_a_batch_is_replayed(
        cluster_spark, env, outputs_by_master
    )


def test_restart_reads_only_the_snapshot_tail_on_the_cluster(cluster_spark, env):
    restart_and_updates.test_restart_loses_no_event_and_reads_only_the_snapshot_tail(cluster_spark, env)
