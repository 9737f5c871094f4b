"""The S3 client takes the connection's timeouts (logic only: no request is sent)."""

from __future__ import annotations

from connectors.s3.connection import S3Connection, s3_client


def test_the_client_waits_as_long_as_the_connection_says() -> None:
    default = s3_client(S3Connection(type="s3", endpoint_url="http://127.0.0.1:1")).meta.config
    assert (default.connect_timeout, default.read_timeout) == (10.0, 60.0)
    short = S3Connection(type="s3", endpoint_url="http://127.0.0.1:1", connect_timeout_s=2, request_timeout_s=5)
    config = s3_client(short).meta.config
    assert (config.connect_timeout, config.read_timeout) == (2.0, 5.0)
    assert config.retries["mode"] == "adaptive" and config.retries["total_max_attempts"] == 6  # 5 retries
