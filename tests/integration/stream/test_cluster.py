"""The stream job's code on a real Spark standalone cluster (a master and two workers, separate JVMs)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from threes.local.spark import HADOOP_VERSION

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
        # hadoop-aws and the AWS SDK bundle are loaded in place (local: jars), behind Spark's own jars:
        # the executor keeps Spark's logging (the bundle's slf4j 1.x first would make it a no-op)
        stderr = (executor_dir / "stderr").read_text()
        assert not any(p.name.startswith("bundle-") for p in executor_dir.iterdir())  # not copied
        launch = stderr.splitlines()[0]  # the worker's "Spark Executor Command: ..." line
        assert f"/spark-s3a-jars-{HADOOP_VERSION}/bundle-" in launch  # its class path
        # stream.spark.executor_gc's default collector reached the executor's JVM
        assert '"-XX:+UseParallelGC"' in launch and "UseG1GC" not in launch, launch
        assert '"-XX:MaxInlineLevel=6"' in launch, launch  # stream.spark.jit_inlining's default, too
        assert "INFO Executor" in stderr, stderr[-2000:]
    assert cluster_spark.sparkContext.master.startswith("spark://127.0.0.1:")
    # every executor runs on this host: shuffle files are not compressed (stream_app.session.ONE_HOST_SHUFFLE)
    assert cluster_spark.sparkContext.getConf().get("spark.shuffle.compress") == "false"


# The semantics tests that matter, on the cluster: the same scenario bodies as on local[2], whose
# outputs are also compared with the local[2] run's when both run in one session (same_on_every_master).
# Executors in separate JVMs with their own Python workers: the partitioned engine's cached base and its
# versions, the indexed engine's worker-side index and
# the aggregation's RocksDB state store run there. (A restart from the snapshot checkpoint is part of the
# replay test; test_s3a_checkpoint.py restarts from object storage.)


@pytest.mark.parametrize("join", ["partitioned", "indexed"])
def test_tombstones_and_reinserts_on_the_cluster(cluster_spark, env, join, outputs_by_master):
    # partitioned: the base cached by the executors and versioned as bucketed Parquet by them
    enrich_job.test_deleted_reference_gives_nulls_and_a_reinsert_brings_it_back(
        cluster_spark, env, join, outputs_by_master
    )


def test_replayed_batch_gives_identical_update_records_on_the_cluster(cluster_spark, env, outputs_by_master):
    restart_and_updates.test_update_records_are_identical_when_a_batch_is_replayed(
        cluster_spark, env, outputs_by_master
    )


def _latest(records: list[dict], *fields: str) -> dict[tuple, dict]:
    """The latest update value per key (identified by the value's ``fields``), tombstones left out."""
    latest: dict[tuple, dict] = {}
    for rec in records:
        if rec["value"] is not None:
            latest[tuple(rec["value"][f] for f in fields)] = rec["value"]
    return latest


def test_a_worker_killed_mid_run_leaves_the_update_topics_as_a_failure_free_run(
    cluster_spark, env, stack, spark_cluster_master, tmp_path
):
    import os
    import signal

    from threes.local.process import PidRecord, is_alive

    from .conftest import flight

    for faa in ("EWR", "JFK", "LGA", "LAX"):
        env.put_airport(faa)
    n = 150
    env.put_flights([flight(i, ("EWR", "JFK", "LGA")[i % 3], "LAX", delay=float(i % 17)) for i in range(1, n + 1)])

    def config(suffix: str):
        updates = [
            {
                "topic": f"{env.updates}{suffix}",
                "kind": "projection",
                "key": ["flight_id"],
                "fields": ["flight_id", "origin", "dest_name", "dep_delay"],
                "version": "offset",
            },
            {
                "topic": f"{env.delays}{suffix}",
                "kind": "aggregation",
                "group_by": ["origin"],
                "event_time": "time_hour",
                "window": "1 day",
                "watermark": "1 day",
                "aggregations": {"flights": "count", "mean_delay": "mean(dep_delay)"},
            },
        ]
        events = {
            "topic": env.events,
            "value_schema": "flight.avsc",
            "starting_offsets": "earliest",
            "max_offsets_per_trigger": 25,
        }
        return env.config(
            updates=updates,
            events=events,
            enriched_topic=f"{env.enriched}{suffix}",
            checkpoint_location=str(tmp_path / f"checkpoint{suffix}"),
        )

    # the failure-free run
    reference = env.start(cluster_spark, config(".ref"), available_now=True)
    assert reference.await_termination(300)
    reference.stop()
    want_projection = _latest(env.consume(f"{env.updates}.ref", lambda rs: len(rs) >= n, timeout_s=60), "flight_id")
    want_aggregates = _latest(
        env.consume(
            f"{env.delays}.ref",
            lambda rs: sum(v["flights"] for v in _latest(rs, "origin", "window_start").values()) == n,
            timeout_s=120,
        ),
        "origin",
        "window_start",
    )
    assert len(want_projection) == n and sum(v["flights"] for v in want_aggregates.values()) == n

    # the same input, and worker 2's JVM killed (-9) once the first micro-batches are written
    job = env.start(cluster_spark, config(""))
    before = env.consume(env.updates, lambda rs: len(rs) >= 25, timeout_s=120)
    worker = PidRecord.load(stack.layout.pid_file("spark-worker-2"))
    assert worker is not None and is_alive(worker.pid)
    os.kill(worker.pid, signal.SIGKILL)
    assert len(_latest(before, "flight_id")) < n  # killed mid-run
    try:
        got_projection = _latest(
            env.consume(env.updates, lambda rs: len(_latest(rs, "flight_id")) >= n, timeout_s=300), "flight_id"
        )
        got_aggregates = _latest(
            env.consume(env.delays, lambda rs: _latest(rs, "origin", "window_start") == want_aggregates, timeout_s=300),
            "origin",
            "window_start",
        )
        assert all(q.isActive for q in job.queries)  # the job went on, on the remaining executor
        executors = cluster_spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
        assert executors == 1, f"{executors} executors: worker 2's was not lost"
    finally:
        job.stop()
        stack.up(["spark"])  # worker 2 back for whatever runs next
    assert got_projection == want_projection
    assert got_aggregates == want_aggregates
