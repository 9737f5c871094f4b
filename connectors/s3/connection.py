"""The ``s3`` connection: Amazon S3 or an S3-compatible server through boto3, its client and its check.

Registered in the ``threes.connections`` entry-point group as ``s3``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, SecretStr

from kernel.config.models import CheckResult, ConnectionConfig, ConnectorConfig


class S3Connection(ConnectionConfig):
    """Amazon S3 or an S3-compatible server (MinIO, s3proxy) through boto3.

    Without keys, boto3's default credential chain is used (instance role, ...).
    """

    client_loggers: ClassVar[tuple[str, ...]] = ("botocore", "boto3", "s3transfer", "urllib3")

    type: Literal["s3"]
    endpoint_url: str | None = Field(None, description="None for AWS; http://host:port otherwise")
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    path_style: bool = Field(False, description="path-style addressing (MinIO, s3proxy)")
    connect_timeout_s: float = Field(10.0, gt=0, description="seconds to open a connection")
    request_timeout_s: float = Field(
        60.0,
        gt=0,
        description="seconds to wait for the answer to one request (botocore's read_timeout); a request is "
        "tried up to 6 times (5 retries), so a server that never answers holds a call up to 6 times this long",
    )

    def local_services(self) -> tuple[str, ...]:
        """The local stack's S3-compatible server (s3proxy)."""
        return ("s3",)

    def check(self, name: str, users: Sequence[ConnectorConfig]) -> list[CheckResult]:
        """``head_bucket`` each bucket the connectors of this connection name (``list_buckets`` without one).

        A missing bucket passes when a connector that names it has ``create_bucket: true``.
        """
        mine = [c for c in users if isinstance(getattr(c, "bucket", None), str)]
        buckets = sorted({c.bucket for c in mine})  # type: ignore[attr-defined]
        created = frozenset(c.bucket for c in mine if getattr(c, "create_bucket", False))  # type: ignore[attr-defined]
        from botocore.exceptions import BotoCoreError, ClientError

        s3 = s3_client(self)
        results = []
        for bucket in buckets or [None]:
            try:
                if bucket is None:
                    s3.list_buckets()
                else:
                    s3.head_bucket(Bucket=bucket)
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "?")
                if code in ("404", "NoSuchBucket") and bucket in created:
                    results.append(CheckResult("s3", f"{name}/{bucket}", True,
                                               "missing; created at start (create_bucket: true)"))
                    continue
                hint = {
                    "404": f"create bucket {bucket!r} first",
                    "NoSuchBucket": f"create bucket {bucket!r} first",
                    "403": f"check connections.{name}.access_key_id / secret_access_key and the bucket policy",
                }.get(code, f"check connections.{name}")
                results.append(CheckResult("s3", f"{name}/{bucket or ''}", False, f"S3 answered {code}", hint))
                continue
            except BotoCoreError as exc:
                results.append(
                    CheckResult(
                        "s3", f"{name}/{bucket or ''}", False, str(exc), f"check connections.{name}.endpoint_url"
                    )
                )
                continue
            results.append(CheckResult("s3", f"{name}/{bucket or ''}", True, "reachable"))
        return results


def s3_client(conn: S3Connection) -> Any:
    """A boto3 S3 client with adaptive retries (5 retries, 6 attempts in all) and the connection's timeouts.

    Returns:
        A ``botocore`` S3 client.
    """
    import boto3
    from botocore.config import Config

    config = Config(
        region_name=conn.region,
        retries={"mode": "adaptive", "max_attempts": 5},
        s3={"addressing_style": "path" if conn.path_style else "auto"},
        connect_timeout=conn.connect_timeout_s,
        read_timeout=conn.request_timeout_s,
    )
    return boto3.client(
        "s3",
        endpoint_url=conn.endpoint_url,
        aws_access_key_id=conn.access_key_id,
        aws_secret_access_key=conn.secret_access_key.get_secret_value() if conn.secret_access_key else None,
        aws_session_token=conn.session_token.get_secret_value() if conn.session_token else None,
        config=config,
    )
