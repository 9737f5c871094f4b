"""``threes check``: reach every system a pipeline names, without side effects.

Each check is read-only: Kafka metadata, ``SELECT 1``, Elasticsearch cluster
health, S3 ``head_bucket`` for every bucket a connector names. A failure says
what failed and what to do; it never prints a secret.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from connectors import clients
from connectors.config.models import ElasticsearchConnection, RdsConnection, S3Connection
from connectors.config.pipeline import PipelineBase
from connectors.exceptions import SetupError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check.

    Attributes:
        system: ``kafka``, ``rds``, ``elasticsearch`` or ``s3``.
        target: what was checked (connection name, bucket...), never a secret.
        ok: whether it answered as expected.
        detail: what was seen (version, status) or what failed.
        hint: what to do about a failure.
    """

    system: str
    target: str
    ok: bool
    detail: str
    hint: str = ""


def _kafka(pipeline: PipelineBase) -> CheckResult:
    from connectors.topics import cluster_metadata

    kafka = pipeline.kafka
    try:
        # a refused login or an unverifiable certificate fails at once, not after the timeout
        md = cluster_metadata(kafka.librdkafka_config(), kafka.request_timeout_s)
    except SetupError as exc:
        message = str(exc)
        if exc.hint and message.endswith(f". {exc.hint}"):
            message = message[: -len(exc.hint) - 2]
        return CheckResult("kafka", kafka.bootstrap_servers, False, message, exc.hint or "")
    return CheckResult("kafka", kafka.bootstrap_servers, True, f"{len(md.brokers)} broker(s), {len(md.topics)} topics")


def _rds(name: str, conn: RdsConnection) -> CheckResult:
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    engine = clients.sql_engine(conn, pool_size=1) if not conn.url.startswith("sqlite") else clients.sql_engine(conn)
    try:
        with engine.connect() as c:
            c.execute(text("SELECT 1")).scalar_one()
            version = engine.dialect.server_version_info
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        return CheckResult(
            "rds", name, False, f"SELECT 1 failed: {reason}",
            f"check connections.{name}.url/password and that the database accepts connections",
        )
    finally:
        engine.dispose()
    ver = ".".join(str(v) for v in version) if version else "?"
    return CheckResult("rds", name, True, f"{engine.dialect.name} {ver}")


def _elasticsearch(name: str, conn: ElasticsearchConnection) -> CheckResult:
    from elasticsearch import ApiError, TransportError

    es = clients.elasticsearch_client(conn)
    try:
        health = es.cluster.health(timeout=f"{int(conn.request_timeout_s)}s")
    except (ApiError, TransportError) as exc:
        return CheckResult(
            "elasticsearch", name, False, f"cluster health failed: {type(exc).__name__}: {exc}",
            f"check connections.{name}.hosts and credentials; is the cluster up?",
        )
    finally:
        es.close()
    status = health["status"]
    ok = status in ("green", "yellow")
    return CheckResult(
        "elasticsearch", name, ok, f"cluster {health['cluster_name']} is {status}",
        "" if ok else "the cluster is red: some primary shards are unassigned",
    )


def _s3(name: str, conn: S3Connection, buckets: list[str]) -> list[CheckResult]:
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = clients.s3_client(conn)
    results = []
    for bucket in buckets or [None]:
        try:
            if bucket is None:
                s3.list_buckets()
            else:
                s3.head_bucket(Bucket=bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "?")
            hint = {
                "404": f"create bucket {bucket!r} first",
                "NoSuchBucket": f"create bucket {bucket!r} first",
                "403": f"check connections.{name}.access_key_id / secret_access_key and the bucket policy",
            }.get(code, f"check connections.{name}")
            results.append(CheckResult("s3", f"{name}/{bucket or ''}", False, f"S3 answered {code}", hint))
            continue
        except BotoCoreError as exc:
            results.append(
                CheckResult("s3", f"{name}/{bucket or ''}", False, str(exc), f"check connections.{name}.endpoint_url")
            )
            continue
        results.append(CheckResult("s3", f"{name}/{bucket or ''}", True, "reachable"))
    return results


def run_checks(pipeline: PipelineBase, on_result: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Check Kafka and every connection of a pipeline.

    Args:
        pipeline: a validated pipeline.
        on_result: called with each result as soon as it is known.

    Returns:
        One result per system checked (one per bucket for S3).
    """
    results: list[CheckResult] = []

    def emit(r: CheckResult) -> None:
        results.append(r)
        if on_result:
            on_result(r)

    emit(_kafka(pipeline))
    connectors = list(getattr(pipeline, "sources", [])) + [
        sink for svc in getattr(pipeline, "sync", []) for sink in svc.sinks
    ]
    for name, conn in pipeline.connections.items():
        if isinstance(conn, RdsConnection):
            emit(_rds(name, conn))
        elif isinstance(conn, ElasticsearchConnection):
            emit(_elasticsearch(name, conn))
        elif isinstance(conn, S3Connection):
            buckets = sorted({c.bucket for c in connectors if c.connection == name and hasattr(c, "bucket")})
            for r in _s3(name, conn, buckets):
                emit(r)
    return results
