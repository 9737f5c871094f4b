"""Checkpoints on object storage: Spark's and the snapshot's under s3a:// on the local S3 server."""

from __future__ import annotations

import pytest

from kernel.exceptions import ConfigError, SetupError

from .test_enrich_job import by_flight

pytestmark = pytest.mark.spark


@pytest.fixture
def s3a(spark, endpoints):
    """Hadoop's S3A settings for the local S3 server, on the running session (spark.hadoop.fs.s3a.* in YAML)."""
    settings = {
        "fs.s3a.endpoint": endpoints.s3_endpoint_url,
        "fs.s3a.endpoint.region": endpoints.s3_region,
        "fs.s3a.access.key": endpoints.s3_access_key_id,
        "fs.s3a.secret.key": endpoints.s3_secret_access_key,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
    }
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in settings.items():
        hadoop.set(key, value)
    return settings


# partitioned: the base's versions are bucketed Parquet written and read back by the executors through s3a
@pytest.mark.parametrize("engine", ["broadcast", "partitioned"])
def test_restart_from_an_s3a_checkpoint_in_a_fresh_working_dir(spark, s3a, env, s3, tmp_path, monkeypatch, engine):
    from .conftest import flight

    bucket = f"ckpt-{env.unique}"
    s3.create_bucket(Bucket=bucket)
    snapshot = {**env.config().model_dump()["snapshots"][0], **({"broadcast_max_rows": 1} if engine == "partitioned" else {})}
    config = env.config(checkpoint_location=f"s3a://{bucket}/jobs/flights", snapshots=[snapshot])
    for faa in ("EWR", "JFK", "LGA", "LAX", "ORD"):
        env.put_airport(faa)
    env.put_flights([flight(i, "EWR", "LAX") for i in range(1, 11)])
    (tmp_path / "host-a").mkdir()
    monkeypatch.chdir(tmp_path / "host-a")
    first = env.start(spark, config, available_now=True)
    assert first.await_termination(180)
    first.stop()
    assert first.readiness["airports"]["source"] == "topics" and first.readiness["airports"]["keys"] == 5
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="jobs/flights/")["Contents"]]
    assert any(k.startswith("jobs/flights/events/offsets/") for k in keys)  # Spark's checkpoint
    assert any(k.startswith("jobs/flights/events/commits/") for k in keys)
    assert any(k.startswith("jobs/flights/snapshots/airports/") and k.endswith("_manifest.json") for k in keys)
    assert any(k.startswith("jobs/flights/snapshot-offsets/") for k in keys)
    assert first.snapshots["airports"].mode == engine
    if engine == "partitioned":  # one Parquet file per bucket, written by the executors
        assert any(k.startswith("jobs/flights/snapshots/airports/p") and k.endswith(".parquet") for k in keys)

    # while the job is down: two snapshot changes and more events
    env.put_airport("LAX", "Los Angeles WHILE DOWN")
    env.put_airport("ORD", delete=True)
    env.put_flights([flight(i, "EWR", "LAX") for i in range(11, 16)])
    # another "host": an empty working directory, nothing local from the first run
    fresh = tmp_path / "host-b"
    fresh.mkdir()
    monkeypatch.chdir(fresh)
    second = env.start(spark, config, available_now=True)
    assert second.await_termination(180)
    restored = second.readiness["airports"]
    # the snapshot came from the s3a checkpoint; only the two records written since were read
    assert restored["source"] == "checkpoint" and restored["records"] == 2
    assert second.snapshots["airports"].mode == engine
    if engine == "broadcast":  # a partitioned snapshot counts base + overlay without a Spark job
        assert restored["keys"] == 4
    enriched = env.consume(env.enriched, lambda rs: len(rs) >= 15, timeout_s=120)
    got = by_flight(enriched)
    assert set(got) == set(range(1, 16)) and len(enriched) == 15  # Spark resumed from its s3a offsets: no re-read
    assert {got[i]["value"]["dest_name"] for i in range(11, 16)} == {"Los Angeles WHILE DOWN"}
    assert {got[i]["value"]["dest_name"] for i in range(1, 11)} == {"Los Angeles Intl"}
    assert list(fresh.iterdir()) == []  # the second run kept nothing in its working directory


def test_a_checkpoint_location_the_job_cannot_use_stops_it_at_start(spark, s3a, env):
    for faa in ("EWR", "LAX"):
        env.put_airport(faa)
    with pytest.raises(ConfigError) as unknown:
        env.start(spark, env.config(checkpoint_location="nosuchfs://bucket/cp"))
    assert len(unknown.value.problems) == 1 and unknown.value.problems[0].path == "stream.checkpoint_location"
    assert "nosuchfs" in str(unknown.value) and "\n" not in str(unknown.value)
    with pytest.raises(SetupError) as missing:
        env.start(spark, env.config(checkpoint_location=f"s3a://no-such-bucket-{env.unique}/cp"))
    assert "stream.checkpoint_location" in str(missing.value) and "\n" not in str(missing.value)
    assert all(not job.queries for job in env.jobs)  # nothing started
