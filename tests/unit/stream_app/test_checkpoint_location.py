"""Checkpoint locations: S3A settings mapped onto pyarrow's S3 file system; unusable locations refused."""

from __future__ import annotations

import pytest

from kernel.exceptions import ConfigError
from stream_app.checkpoint_fs import CheckpointFs, open_checkpoint_location, s3_filesystem
from stream_app.spark_checkpoint import CHECKPOINT_MANAGER_KEY, FILE_SYSTEM_CHECKPOINT_MANAGER, checkpoint_conf


def options(fs) -> dict:
    return fs.__reduce__()[1][0]


def test_s3a_settings_configure_pyarrow_like_hadoop():
    s3a = {
        "endpoint": "127.0.0.1:18090",  # S3A's bare host:port, scheme from connection.ssl.enabled
        "connection.ssl.enabled": "false",
        "access.key": "k",
        "secret.key": "s",
        "endpoint.region": "eu-west-1",
        "bucket.special.access.key": "k2",  # per-bucket settings win, as in S3A
    }
    plain = options(s3_filesystem("ckpt", s3a))
    assert plain["endpoint_override"] == "127.0.0.1:18090" and plain["scheme"] == "http"
    assert (plain["access_key"], plain["secret_key"], plain["region"]) == ("k", "s", "eu-west-1")
    assert options(s3_filesystem("special", s3a))["access_key"] == "k2"
    full = options(s3_filesystem("b", {"endpoint": "https://s3.example:9000/", "region": "us-east-1"}))
    assert full["endpoint_override"] == "s3.example:9000" and full["scheme"] == "https"
    assert not full["access_key"]  # no keys: the AWS default chain, as in S3A
    aws = options(s3_filesystem("b", {}))
    assert aws["force_virtual_addressing"] is True and aws["endpoint_override"] == ""


def test_s3a_location_splits_into_bucket_and_key():
    fs = CheckpointFs("s3a://ckpt/jobs/flights/", {"endpoint": "http://127.0.0.1:1"})
    assert fs.root == "ckpt/jobs/flights" and fs.path("events") == "ckpt/jobs/flights/events"


def test_a_scheme_nothing_can_write_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as err:
        open_checkpoint_location("nosuchfs://bucket/cp")
    assert [p.path for p in err.value.problems] == ["stream.checkpoint_location"]
    assert "nosuchfs" in str(err.value) and "\n" not in str(err.value)


def test_a_local_location_is_probed_and_left_clean(tmp_path):
    fs = open_checkpoint_location(str(tmp_path / "cp"))
    assert fs.root == str(tmp_path / "cp") and list((tmp_path / "cp").iterdir()) == []


def test_a_local_checkpoint_gets_the_file_system_manager_and_remote_ones_keep_sparks():
    local = {CHECKPOINT_MANAGER_KEY: FILE_SYSTEM_CHECKPOINT_MANAGER}
    assert checkpoint_conf("checkpoints/flights") == local  # relative: made absolute, on the local default FS
    assert checkpoint_conf("file:///var/lib/threes/cp") == local
    assert checkpoint_conf("s3a://ckpt/jobs/flights") == {}
    assert checkpoint_conf("hdfs://nn:8020/cp") == {}
    assert checkpoint_conf("/var/lib/threes/cp", "hdfs://nn:8020") == {}  # no scheme: on the default FS


def test_a_query_checkpointed_through_the_file_system_manager_resumes_where_it_committed(spark, tmp_path):
    """Spark writes its offset and commit logs with that manager, and a restart reads them back."""
    source, cp = tmp_path / "in", tmp_path / "cp"
    source.mkdir()

    def run(name: str, rows: int) -> int:
        (source / f"{name}.json").write_text("".join(f'{{"n": {i}}}\n' for i in range(rows)))
        query = (
            spark.readStream.schema("n long").json(str(source))
            .writeStream.format("noop").option("checkpointLocation", str(cp))
            .trigger(availableNow=True).start()
        )
        query.awaitTermination(120)
        return sum(p["numInputRows"] for p in query.recentProgress)

    before = spark.conf.get(CHECKPOINT_MANAGER_KEY, None)
    for key, value in checkpoint_conf(str(cp)).items():
        spark.conf.set(key, value)
    try:
        assert run("a", 3) == 3
        assert run("b", 2) == 2  # only the new file: the first run's commit was read back
    finally:
        if before is None:
            spark.conf.unset(CHECKPOINT_MANAGER_KEY)
        else:
            spark.conf.set(CHECKPOINT_MANAGER_KEY, before)
    assert sorted(p.name for p in (cp / "commits").iterdir() if not p.name.startswith(".")) == ["0", "1"]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("file:/srv/cp", "file:///srv/cp"),  # one slash: Hadoop's short form of a local URI
        ("file:///srv/cp", "file:///srv/cp"),
        ("file:cp/flights", "cp/flights"),  # relative, like a plain relative path
        ("/srv/cp", "/srv/cp"),
        ("s3a://bucket/cp", "s3a://bucket/cp"),
    ],
)
def test_a_local_uri_has_one_form(given, expected):
    from stream_app.config import StreamJobConfig
    from stream_app.spark_checkpoint import is_local_path, spark_path

    cfg = StreamJobConfig.model_validate(
        {"events": {"topic": "e", "value_schema": "e.avsc"}, "enriched_topic": "out", "dead_letter_topic": "dlq",
         "checkpoint_location": given}
    )
    assert cfg.checkpoint_location == expected
    assert "file:" not in spark_path(cfg.checkpoint_location).removeprefix("file:")  # never a folder named "file:"
    assert is_local_path(spark_path(cfg.checkpoint_location)) == (not given.startswith("s3a"))


def test_the_file_system_manager_moved_with_spark_4_1():
    from stream_app.spark_checkpoint import file_system_checkpoint_manager

    assert file_system_checkpoint_manager("4.0.0") == (
        "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
    )
    assert file_system_checkpoint_manager("4.2.0") == (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    )


def test_a_snapshot_checkpoint_of_a_topic_created_again_since_is_not_loaded(tmp_path, caplog):
    import pyarrow as pa

    from stream_app.checkpoint import SnapshotCheckpoint

    fs = CheckpointFs(str(tmp_path))
    table = pa.table({"__lk": ["EWR"], "name": ["Newark"]})
    SnapshotCheckpoint(fs, "airports", "s1", topic_ids={"state.airports": "old-id"}).save(table, {"state.airports": {0: 1}})
    assert SnapshotCheckpoint(fs, "airports", "s1", topic_ids={"state.airports": "old-id"}).load() is not None
    assert SnapshotCheckpoint(fs, "airports", "s1").load() is not None  # ids not known: not checked
    assert SnapshotCheckpoint(fs, "airports", "s1", topic_ids={"state.airports": "new-id"}).load() is None
    assert "state.airports" in caplog.text and "deleted and created again" in caplog.text
    # a version written before topic ids were recorded is loaded (its offsets are still checked against the topics)
    SnapshotCheckpoint(fs, "airports", "s1").save(table, {"state.airports": {0: 1}})
    assert SnapshotCheckpoint(fs, "airports", "s1", topic_ids={"state.airports": "new-id"}).load() is not None
