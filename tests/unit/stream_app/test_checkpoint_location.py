"""Checkpoint locations: S3A settings mapped onto pyarrow's S3 file system; unusable locations refused."""

from __future__ import annotations

import pytest

from connectors.exceptions import ConfigError
from stream_app.checkpoint import CheckpointFs, open_checkpoint_location, s3_filesystem


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
