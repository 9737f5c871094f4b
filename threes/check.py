"""``threes check``: reach every system a pipeline names, without side effects.

Each check is read-only: Kafka metadata, ``SELECT 1``, Elasticsearch cluster
health, S3 ``head_bucket`` for every bucket a connector names. A failure says
what failed and what to do, in one line per system (no traceback, no client
library's log lines); it never prints a secret (:func:`connectors.redact.redact`
runs over every detail).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from connectors import clients
from connectors.config.models import ElasticsearchConnection, RdsConnection, S3Connection
from connectors.config.pipeline import PipelineBase
from connectors.exceptions import SetupError
from connectors.redact import redact

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

    try:
        options = {} if conn.url.startswith("sqlite") else {"pool_size": 1}
        engine = clients.sql_engine(conn, **options)
    except SetupError as exc:  # a driver that is not installed
        return CheckResult("rds", name, False, str(exc), "install the driver, or use another URL")
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
        # one attempt: a check says what is wrong now, the sinks retry
        health = es.options(max_retries=0).cluster.health(timeout=f"{int(conn.request_timeout_s)}s")
    except (ApiError, TransportError) as exc:
        return CheckResult(
            "elasticsearch", name, False, f"cluster health failed: {type(exc).__name__}: {_reason(exc)}",
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


def _s3(name: str, conn: S3Connection, buckets: list[str], created: frozenset[str] = frozenset()) -> list[CheckResult]:
    """``head_bucket`` each bucket; a missing one in ``created`` (a connector has ``create_bucket: true``) passes."""
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
                CheckResult("s3", f"{name}/{bucket or ''}", False, str(exc), f"check connections.{name}.endpoint_url")
            )
            continue
        results.append(CheckResult("s3", f"{name}/{bucket or ''}", True, "reachable"))
    return results


def _reason(exc: BaseException) -> str:
    """An Elasticsearch error's cause, without the client's wrapping (``ConnectionError(... caused by: ...)``)."""
    text = str(getattr(exc, "message", "") or exc)
    return text.split("caused by: ")[-1].rstrip(")") if "caused by: " in text else text


def one_line(text: str, limit: int = 400) -> str:
    """The first non-empty line of ``text``, secrets masked, at most ``limit`` characters."""
    line = next((part.strip() for part in str(text).splitlines() if part.strip()), "")
    line = redact(line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


@contextmanager
def quiet_client_logs() -> Iterator[None]:
    """Silence the clients' own loggers while checking: each failure is reported once, as one result line.

    elasticsearch-py logs every failed attempt with a traceback at WARNING; urllib3 and
    botocore log their retries.
    """
    names = ("elastic_transport", "elasticsearch", "urllib3", "botocore", "boto3", "s3transfer")
    saved = {name: logging.getLogger(name).level for name in names}
    try:
        for name in names:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


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
        r = replace(r, target=redact(r.target), detail=one_line(r.detail), hint=one_line(r.hint))
        results.append(r)
        if on_result:
            on_result(r)

    with quiet_client_logs():
        _run(pipeline, emit)
    return results


def _run(pipeline: PipelineBase, emit: Callable[[CheckResult], None]) -> None:
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
            mine = [c for c in connectors if c.connection == name and hasattr(c, "bucket")]
            buckets = sorted({c.bucket for c in mine})
            created = frozenset(c.bucket for c in mine if getattr(c, "create_bucket", False))
            for r in _s3(name, conn, buckets, created):
                emit(r)
